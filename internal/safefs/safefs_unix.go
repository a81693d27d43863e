//go:build unix

package safefs

import (
	"errors"

	"io"
	"io/fs"
	"os"
	"path"
	"strings"

	"golang.org/x/sys/unix"
)

// Root is a directory handle on one trusted tree root: every path aq
// opens below it is resolved from this handle, never from a path string.
type Root struct {
	tree, dir string
	fd        int
	// walk resolves by an O_NOFOLLOW component walk even where the kernel
	// has openat2 (the tests run both ways).
	walk bool
}

// OpenRoot opens the trusted directory dir (itself not a symbolic link)
// as the root of tree.
func OpenRoot(tree, dir string) (*Root, error) {
	fd, err := unix.Open(dir, oPath|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		if errors.Is(err, unix.ELOOP) || errors.Is(err, unix.ENOTDIR) {
			return nil, &Refused{Tree: tree, Path: ".", Why: "the tree's root is not a directory (a symbolic link?)"}
		}
		return nil, &fs.PathError{Op: "open", Path: dir, Err: err}
	}
	return &Root{tree: tree, dir: dir, fd: fd, walk: !HasOpenat2()}, nil
}

// Close releases the handle.
func (r *Root) Close() error { return unix.Close(r.fd) }

// ReadFile reads rel, a regular file of at most max bytes; anything else
// is a *Refused. A missing file wraps fs.ErrNotExist.
func (r *Root) ReadFile(rel string, max int64) ([]byte, error) {
	parts, err := r.split(rel)
	if err != nil {
		return nil, err
	}
	rel = strings.Join(parts, "/")
	// First a handle that opens nothing (O_PATH): what is there?
	pfd, err := r.beneath(parts, oProbe)
	if err != nil {
		return nil, err
	}
	var st unix.Stat_t
	err = unix.Fstat(pfd, &st)
	unix.Close(pfd)
	if err != nil {
		return nil, &fs.PathError{Op: "fstat", Path: rel, Err: err}
	}
	if why := notRegular(&st, max); why != "" {
		return nil, &Refused{Tree: r.tree, Path: rel, Why: why}
	}
	// Then, a regular file of a size aq takes: open it to read, and make
	// sure it is the same file still.
	fd, err := r.beneath(parts, unix.O_RDONLY|unix.O_NONBLOCK)
	if err != nil {
		return nil, err
	}
	f := os.NewFile(uintptr(fd), path.Join(r.dir, rel))
	defer f.Close()
	var st2 unix.Stat_t
	if err := unix.Fstat(fd, &st2); err != nil {
		return nil, &fs.PathError{Op: "fstat", Path: rel, Err: err}
	}
	if why := notRegular(&st2, max); why != "" {
		return nil, &Refused{Tree: r.tree, Path: rel, Why: why}
	}
	if st2.Dev != st.Dev || st2.Ino != st.Ino {
		return nil, &Refused{Tree: r.tree, Path: rel, Why: "replaced while it was opened"}
	}
	b, err := io.ReadAll(io.LimitReader(f, max+1))
	if err != nil {
		return nil, &fs.PathError{Op: "read", Path: rel, Err: err}
	}
	if int64(len(b)) > max {
		return nil, &Refused{Tree: r.tree, Path: rel, Why: tooBig(max)}
	}
	return b, nil
}

// Check reports whether rel would be read as a regular file of at most
// max bytes: nil, a *Refused, or an error wrapping fs.ErrNotExist.
func (r *Root) Check(rel string, max int64) error {
	parts, err := r.split(rel)
	if err != nil {
		return err
	}
	pfd, err := r.beneath(parts, oProbe)
	if err != nil {
		return err
	}
	defer unix.Close(pfd)
	var st unix.Stat_t
	if err := unix.Fstat(pfd, &st); err != nil {
		return &fs.PathError{Op: "fstat", Path: rel, Err: err}
	}
	if why := notRegular(&st, max); why != "" {
		return &Refused{Tree: r.tree, Path: strings.Join(parts, "/"), Why: why}
	}
	return nil
}

func notRegular(st *unix.Stat_t, max int64) string {
	if st.Mode&unix.S_IFMT != unix.S_IFREG {
		return kind(modeOf(uint32(st.Mode)))
	}
	if max >= 0 && st.Size > max {
		return tooBig(max)
	}
	return ""
}

func modeOf(m uint32) fs.FileMode {
	switch m & unix.S_IFMT {
	case unix.S_IFLNK:
		return fs.ModeSymlink
	case unix.S_IFIFO:
		return fs.ModeNamedPipe
	case unix.S_IFSOCK:
		return fs.ModeSocket
	case unix.S_IFCHR:
		return fs.ModeDevice | fs.ModeCharDevice
	case unix.S_IFBLK:
		return fs.ModeDevice
	case unix.S_IFDIR:
		return fs.ModeDir
	case unix.S_IFREG:
		return 0
	}
	return fs.ModeIrregular
}

// WriteFile creates rel with data and perm, making its missing parent
// directories (0700) on the way; no component is followed. The file is
// created exclusively: an entry already there (a link, a FIFO, a stale
// copy) is unlinked, never followed, and the create tried once more.
func (r *Root) WriteFile(rel string, data []byte, perm fs.FileMode) error {
	parts, err := r.split(rel)
	if err != nil {
		return err
	}
	dfd, err := r.mkdirs(parts[:len(parts)-1])
	if err != nil {
		return err
	}
	if dfd != r.fd {
		defer unix.Close(dfd)
	}
	name := parts[len(parts)-1]
	rel = strings.Join(parts, "/")
	flags := unix.O_WRONLY | unix.O_CREAT | unix.O_EXCL | unix.O_NOFOLLOW | unix.O_CLOEXEC
	fd, err := unix.Openat(dfd, name, flags, uint32(perm.Perm()))
	if errors.Is(err, unix.EEXIST) {
		if uerr := unix.Unlinkat(dfd, name, 0); uerr != nil && !errors.Is(uerr, unix.ENOENT) {
			return &Refused{Tree: r.tree, Path: rel, Why: "an entry is in the way and cannot be removed: " + uerr.Error()}
		}
		fd, err = unix.Openat(dfd, name, flags, uint32(perm.Perm()))
	}
	if err != nil {
		return &fs.PathError{Op: "create", Path: path.Join(r.dir, rel), Err: err}
	}
	f := os.NewFile(uintptr(fd), path.Join(r.dir, rel))
	if err := f.Chmod(perm.Perm()); err != nil { // the umask's cut undone
		f.Close()
		return err
	}
	if _, err := f.Write(data); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// Remove removes rel (a file, a link, a FIFO — never what a link points
// to; an empty directory too). A missing entry is not an error.
func (r *Root) Remove(rel string) error {
	parts, err := r.split(rel)
	if err != nil {
		return err
	}
	dfd := r.fd
	if len(parts) > 1 {
		dfd, err = r.beneath(parts[:len(parts)-1], oPath|unix.O_DIRECTORY)
		if errors.Is(err, fs.ErrNotExist) {
			return nil
		}
		if err != nil {
			return err
		}
		defer unix.Close(dfd)
	}
	name := parts[len(parts)-1]
	err = unix.Unlinkat(dfd, name, 0)
	if errors.Is(err, unix.EISDIR) || errors.Is(err, unix.EPERM) {
		err = unix.Unlinkat(dfd, name, unix.AT_REMOVEDIR)
	}
	if err != nil && !errors.Is(err, unix.ENOENT) {
		return &fs.PathError{Op: "remove", Path: path.Join(r.dir, rel), Err: err}
	}
	return nil
}

// mkdirs makes (0700) and opens the directories parts below the root, no
// component followed; it returns the last one's descriptor (the root's
// own for none).
func (r *Root) mkdirs(parts []string) (int, error) {
	cur := r.fd
	for i, p := range parts {
		if err := unix.Mkdirat(cur, p, 0o700); err != nil && !errors.Is(err, unix.EEXIST) {
			r.closeNotRoot(cur)
			return -1, &fs.PathError{Op: "mkdir", Path: path.Join(r.dir, path.Join(parts[:i+1]...)), Err: err}
		}
		fd, err := unix.Openat(cur, p, oPath|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if err != nil {
			err = r.componentErr(cur, parts[:i+1], err)
		}
		r.closeNotRoot(cur)
		if err != nil {
			return -1, err
		}
		cur = fd
	}
	return cur, nil
}

func (r *Root) closeNotRoot(fd int) {
	if fd != r.fd {
		unix.Close(fd)
	}
}

// walkOpen opens parts below the root one component at a time, each
// directory O_NOFOLLOW|O_DIRECTORY, the last with flags|O_NOFOLLOW.
func (r *Root) walkOpen(parts []string, flags int) (int, error) {
	cur := r.fd
	for i, p := range parts[:len(parts)-1] {
		fd, err := unix.Openat(cur, p, oPath|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if err != nil {
			err = r.componentErr(cur, parts[:i+1], err)
		}
		r.closeNotRoot(cur)
		if err != nil {
			return -1, err
		}
		cur = fd
	}
	last := parts[len(parts)-1]
	fd, err := unix.Openat(cur, last, flags|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		err = r.componentErr(cur, parts, err)
	}
	r.closeNotRoot(cur)
	return fd, err
}

// componentErr turns the error of opening parts' last component from the
// directory dfd into a refusal naming what is there, or a not-exist.
func (r *Root) componentErr(dfd int, parts []string, err error) error {
	rel := strings.Join(parts, "/")
	switch {
	case errors.Is(err, unix.ENOENT):
		return &fs.PathError{Op: "open", Path: path.Join(r.dir, rel), Err: fs.ErrNotExist}
	case errors.Is(err, unix.ELOOP), errors.Is(err, unix.ENOTDIR), errors.Is(err, unix.EMLINK):
		var st unix.Stat_t
		if unix.Fstatat(dfd, parts[len(parts)-1], &st, unix.AT_SYMLINK_NOFOLLOW) == nil {
			return &Refused{Tree: r.tree, Path: rel, Why: kind(modeOf(uint32(st.Mode)))}
		}
		return &Refused{Tree: r.tree, Path: rel, Why: "a symbolic link or not a directory"}
	}
	return &fs.PathError{Op: "open", Path: path.Join(r.dir, rel), Err: err}
}

// Resolution says how paths are resolved on this host, for the factory's
// start line.
func Resolution() string {
	if HasOpenat2() {
		return "openat2(RESOLVE_BENEATH|RESOLVE_NO_SYMLINKS)"
	}
	return "an O_NOFOLLOW walk"
}
