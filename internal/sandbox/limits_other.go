//go:build !linux

package sandbox

// HostMemory is the host's memory in bytes: unknown (0) where there are no
// cgroups to hold a default limit with.
func HostMemory() int64 { return 0 }

// RemoveStaleCgroups: no cgroups here.
func RemoveStaleCgroups(func(pid int) bool) ([]string, error) { return nil, nil }
