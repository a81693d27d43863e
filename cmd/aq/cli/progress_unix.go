//go:build unix

package cli

import (
	"os"
	"os/signal"
	"syscall"
)

// notifyResize sends on ch when the terminal is resized (SIGWINCH); the
// returned func stops it.
func notifyResize(ch chan os.Signal) func() {
	signal.Notify(ch, syscall.SIGWINCH)
	return func() { signal.Stop(ch) }
}
