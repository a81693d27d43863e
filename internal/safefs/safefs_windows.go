package safefs

import (
	"errors"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
)

// Root is one trusted tree root. Windows has no openat: every component
// below the root is checked with Lstat — a symbolic link, a junction or
// any other reparse point is refused — and the file opened is checked to
// be the one checked (os.SameFile).
type Root struct {
	tree, dir string
}

// OpenRoot takes the trusted directory dir as the root of tree.
func OpenRoot(tree, dir string) (*Root, error) {
	st, err := os.Lstat(dir)
	if err != nil {
		return nil, err
	}
	if !st.IsDir() {
		return nil, &Refused{Tree: tree, Path: ".", Why: "the tree's root is not a directory (a link?)"}
	}
	return &Root{tree: tree, dir: dir}, nil
}

// Close does nothing here (no handle is held).
func (r *Root) Close() error { return nil }

// HasOpenat2 is false: only Linux has openat2.
func HasOpenat2() bool { return false }

// Resolution says how paths are resolved on this host.
func Resolution() string { return "a component walk refusing reparse points" }

// walk checks every component of parts; it returns the last one's Lstat.
func (r *Root) walk(parts []string, dirsOnly bool) (fs.FileInfo, error) {
	p := r.dir
	var st fs.FileInfo
	for i, c := range parts {
		p = filepath.Join(p, c)
		var err error
		st, err = os.Lstat(p)
		rel := strings.Join(parts[:i+1], "/")
		if err != nil {
			return nil, err
		}
		last := i == len(parts)-1
		if !st.IsDir() && (!last || dirsOnly) || st.Mode()&(fs.ModeSymlink|fs.ModeIrregular) != 0 {
			return nil, &Refused{Tree: r.tree, Path: rel, Why: kind(st.Mode())}
		}
	}
	return st, nil
}

func (r *Root) check(parts []string, max int64) (fs.FileInfo, error) {
	st, err := r.walk(parts, false)
	if err != nil {
		return nil, err
	}
	rel := strings.Join(parts, "/")
	if !st.Mode().IsRegular() {
		return nil, &Refused{Tree: r.tree, Path: rel, Why: kind(st.Mode())}
	}
	if max >= 0 && st.Size() > max {
		return nil, &Refused{Tree: r.tree, Path: rel, Why: tooBig(max)}
	}
	return st, nil
}

// Check reports whether rel would be read as a regular file of at most max bytes.
func (r *Root) Check(rel string, max int64) error {
	parts, err := r.split(rel)
	if err != nil {
		return err
	}
	_, err = r.check(parts, max)
	return err
}

// ReadFile reads rel, a regular file of at most max bytes.
func (r *Root) ReadFile(rel string, max int64) ([]byte, error) {
	parts, err := r.split(rel)
	if err != nil {
		return nil, err
	}
	st, err := r.check(parts, max)
	if err != nil {
		return nil, err
	}
	f, err := os.Open(filepath.Join(r.dir, filepath.Join(parts...)))
	if err != nil {
		return nil, err
	}
	defer f.Close()
	st2, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if !os.SameFile(st, st2) {
		return nil, &Refused{Tree: r.tree, Path: strings.Join(parts, "/"), Why: "replaced while it was opened"}
	}
	b, err := io.ReadAll(io.LimitReader(f, max+1))
	if err != nil {
		return nil, err
	}
	if int64(len(b)) > max {
		return nil, &Refused{Tree: r.tree, Path: strings.Join(parts, "/"), Why: tooBig(max)}
	}
	return b, nil
}

// WriteFile creates rel exclusively with data (an entry in the way is
// removed, never followed, and the create tried once more).
func (r *Root) WriteFile(rel string, data []byte, perm fs.FileMode) error {
	parts, err := r.split(rel)
	if err != nil {
		return err
	}
	for i := range parts[:len(parts)-1] {
		p := filepath.Join(r.dir, filepath.Join(parts[:i+1]...))
		if err := os.Mkdir(p, 0o700); err != nil && !errors.Is(err, fs.ErrExist) {
			return err
		}
		if _, err := r.walk(parts[:i+1], true); err != nil {
			return err
		}
	}
	p := filepath.Join(r.dir, filepath.Join(parts...))
	f, err := os.OpenFile(p, os.O_WRONLY|os.O_CREATE|os.O_EXCL, perm)
	if errors.Is(err, fs.ErrExist) {
		if rerr := os.Remove(p); rerr != nil && !errors.Is(rerr, fs.ErrNotExist) {
			return &Refused{Tree: r.tree, Path: strings.Join(parts, "/"), Why: "an entry is in the way and cannot be removed: " + rerr.Error()}
		}
		f, err = os.OpenFile(p, os.O_WRONLY|os.O_CREATE|os.O_EXCL, perm)
	}
	if err != nil {
		return err
	}
	if _, err := f.Write(data); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// Remove removes rel, never what a link points to. A missing entry is not
// an error.
func (r *Root) Remove(rel string) error {
	parts, err := r.split(rel)
	if err != nil {
		return err
	}
	if len(parts) > 1 {
		if _, err := r.walk(parts[:len(parts)-1], true); err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				return nil
			}
			return err
		}
	}
	err = os.Remove(filepath.Join(r.dir, filepath.Join(parts...)))
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	return err
}
