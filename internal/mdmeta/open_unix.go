//go:build unix

package mdmeta

import (
	"os"
	"syscall"
)

// openNonBlocking opens path with O_NONBLOCK, so that opening a FIFO with
// no writer returns at once instead of waiting (a regular file ignores the
// flag).
func openNonBlocking(path string) (*os.File, error) {
	return os.OpenFile(path, os.O_RDONLY|syscall.O_NONBLOCK, 0)
}
