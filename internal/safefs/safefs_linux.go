package safefs

import (
	"errors"
	"io/fs"
	"path"
	"strings"
	"sync"

	"golang.org/x/sys/unix"
)

const oPath = unix.O_PATH

// oProbe opens what is there without opening it (no FIFO waits, no device
// is touched).
const oProbe = unix.O_PATH

var openat2 struct {
	once sync.Once
	ok   bool
}

// HasOpenat2 reports whether this kernel has openat2(2) (Linux 5.6) with
// RESOLVE_BENEATH|RESOLVE_NO_SYMLINKS; without it paths are resolved by an
// O_NOFOLLOW walk.
func HasOpenat2() bool {
	openat2.once.Do(func() {
		fd, err := unix.Openat2(unix.AT_FDCWD, "/", &unix.OpenHow{
			Flags:   unix.O_PATH | unix.O_CLOEXEC,
			Resolve: unix.RESOLVE_NO_SYMLINKS,
		})
		if err == nil {
			unix.Close(fd)
			openat2.ok = true
		}
	})
	return openat2.ok
}

// beneath opens parts below the root with flags, following no symbolic
// link at any component and never leaving the tree.
func (r *Root) beneath(parts []string, flags int) (int, error) {
	if r.walk {
		return r.walkOpen(parts, flags)
	}
	rel := strings.Join(parts, "/")
	for {
		fd, err := unix.Openat2(r.fd, rel, &unix.OpenHow{
			Flags:   uint64(flags | unix.O_NOFOLLOW | unix.O_CLOEXEC),
			Resolve: unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS,
		})
		switch {
		case err == nil:
			return fd, nil
		case errors.Is(err, unix.EINTR), errors.Is(err, unix.EAGAIN):
			continue // a rename raced the lookup: try again
		case errors.Is(err, unix.ENOSYS):
			return r.walkOpen(parts, flags)
		case errors.Is(err, unix.ENOENT):
			return -1, &fs.PathError{Op: "open", Path: path.Join(r.dir, rel), Err: fs.ErrNotExist}
		case errors.Is(err, unix.EXDEV):
			return -1, &Refused{Tree: r.tree, Path: rel, Why: "outside the tree"}
		case errors.Is(err, unix.ELOOP), errors.Is(err, unix.ENOTDIR):
			// Which component? The walk names it.
			fd, werr := r.walkOpen(parts, flags)
			if werr == nil {
				why := "a symbolic link or not a directory on the way"
				var st unix.Stat_t
				if unix.Fstat(fd, &st) == nil && st.Mode&unix.S_IFMT != unix.S_IFREG {
					why = kind(modeOf(st.Mode))
				}
				unix.Close(fd)
				return -1, &Refused{Tree: r.tree, Path: rel, Why: why}
			}
			return -1, werr
		}
		return -1, &fs.PathError{Op: "open", Path: path.Join(r.dir, rel), Err: err}
	}
}
