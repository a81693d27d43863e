//go:build !linux

package sandbox

// unmountCacheLayer: only Linux puts the caches' layers on a tmpfs.
func unmountCacheLayer(string) {}
