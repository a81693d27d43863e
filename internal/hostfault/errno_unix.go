//go:build unix

package hostfault

import "syscall"

// faults are the errors of a file system that cannot take writes.
var faults = []error{syscall.ENOSPC, syscall.EDQUOT, syscall.EROFS, syscall.EIO}
