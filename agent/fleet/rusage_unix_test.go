//go:build unix

package fleet

import (
	"syscall"
	"time"
)

// rusage is this process's CPU time (user and system) so far.
func rusage() time.Duration {
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) != nil {
		return -1
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
