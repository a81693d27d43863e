//go:build unix && !linux

package process

import (
	"errors"
	"syscall"
)

// Alive reports whether a process with this pid exists (signal 0; EPERM
// means it exists and belongs to someone else). A zombie counts as alive
// here: without /proc there is no cheap way to tell.
func Alive(pid int) bool {
	if pid <= 0 {
		return false
	}
	err := syscall.Kill(pid, 0)
	return err == nil || errors.Is(err, syscall.EPERM)
}
