//go:build unix

package sandbox

import (
	"strconv"
	"syscall"

	"golang.org/x/sys/unix"
)

// signalName is the conventional name of sig ("SIGTERM").
func signalName(sig syscall.Signal) string {
	if n := unix.SignalName(sig); n != "" {
		return n
	}
	return "SIG" + strconv.Itoa(int(sig))
}
