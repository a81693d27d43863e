//go:build unix && !linux

package safefs

import "golang.org/x/sys/unix"

// oPath: no O_PATH here; a directory is opened for reading, and the file
// itself O_NONBLOCK (a FIFO's open does not wait).
const (
	oPath  = unix.O_RDONLY
	oProbe = unix.O_RDONLY | unix.O_NONBLOCK
)

// HasOpenat2 is false: only Linux has openat2.
func HasOpenat2() bool { return false }

func (r *Root) beneath(parts []string, flags int) (int, error) {
	return r.walkOpen(parts, flags)
}
