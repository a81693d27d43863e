//go:build !linux

package sandbox

// HostMemory is the host's memory in bytes: unknown (0) where there are no
// cgroups to hold a default limit with.
func HostMemory() int64 { return 0 }
