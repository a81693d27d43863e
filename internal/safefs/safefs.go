// Package safefs is how aq reads and writes in the trees an engine may
// write: a job's worktree, its home, its state/ and tmp/ directories, the
// engine's output paths. A file there is untrusted (docs/sandbox.md, "What
// aq reads from the engine's trees"): it may be a symbolic link to a host
// file the engine cannot see, a FIFO that blocks a reader forever, a device
// or a huge file. So every path is resolved below a directory handle of its
// tree's root without following a symbolic link at any component
// (openat2(RESOLVE_BENEATH|RESOLVE_NO_SYMLINKS) on Linux, an O_NOFOLLOW walk
// elsewhere and where the kernel lacks openat2), opened O_PATH and checked
// with fstat — a regular file, or it is refused — and only then opened for
// reading, O_NONBLOCK, and read up to a cap. Writes create their file
// exclusively: an entry already there is unlinked (never followed) and the
// create tried once more.
//
// Refuse, don't sanitize: a refused file is a *Refused error that says
// what was found; aq never follows it "carefully".
package safefs

import (
	"errors"
	"fmt"
	"io/fs"
	"path"
	"strings"
)

// Caps: the most aq reads of each kind of file an engine could have
// written.
const (
	// MaxPRBody caps .aq_pr.md.
	MaxPRBody = 64 << 10
	// MaxLogin caps a login file (the copy-in and the write-back).
	MaxLogin = 64 << 10
	// MaxTrajectory caps an engine's exported trajectory (devin's).
	MaxTrajectory = 8 << 20
)

// Refused is a file aq would not read or write: Tree is the trusted root's
// name ("worktree", "home", "state", "tmp"), Path the file relative to it,
// Why what was found there ("a symbolic link", "a FIFO", "larger than the
// 64 KiB cap").
type Refused struct {
	Tree, Path, Why string
}

func (e *Refused) Error() string {
	return fmt.Sprintf("%s/%s refused: %s", e.Tree, e.Path, e.Why)
}

// AsRefused reports whether err is (or wraps) a refusal, and returns it.
func AsRefused(err error) (*Refused, bool) {
	var r *Refused
	ok := errors.As(err, &r)
	return r, ok
}

// ReadFile reads rel below the trusted directory dir (named tree in a
// refusal), at most max bytes: the one-call form of OpenRoot, ReadFile and
// Close. A missing file is an error that wraps fs.ErrNotExist.
func ReadFile(tree, dir, rel string, max int64) ([]byte, error) {
	r, err := OpenRoot(tree, dir)
	if err != nil {
		return nil, err
	}
	defer r.Close()
	return r.ReadFile(rel, max)
}

// WriteFile creates rel below dir with data and perm, exclusively (Root.WriteFile).
func WriteFile(tree, dir, rel string, data []byte, perm fs.FileMode) error {
	r, err := OpenRoot(tree, dir)
	if err != nil {
		return err
	}
	defer r.Close()
	return r.WriteFile(rel, data, perm)
}

// Remove removes rel below dir, never following a link (Root.Remove). A
// missing entry is not an error.
func Remove(tree, dir, rel string) error {
	r, err := OpenRoot(tree, dir)
	if err != nil {
		return err
	}
	defer r.Close()
	return r.Remove(rel)
}

// Tree is the trusted root's name.
func (r *Root) Tree() string { return r.tree }

// Dir is the trusted root's path.
func (r *Root) Dir() string { return r.dir }

// split checks rel (slash or OS separators; relative, no "..", not empty)
// and returns its components.
func (r *Root) split(rel string) ([]string, error) {
	rel = strings.ReplaceAll(rel, `\`, "/")
	clean := path.Clean(rel)
	if rel == "" || clean == "." || path.IsAbs(clean) || clean == ".." || strings.HasPrefix(clean, "../") || strings.Contains(rel, "\x00") {
		return nil, &Refused{Tree: r.tree, Path: rel, Why: "not a path below the tree"}
	}
	return strings.Split(clean, "/"), nil
}

// kind names what a non-regular mode is, for a refusal.
func kind(m fs.FileMode) string {
	switch {
	case m&fs.ModeSymlink != 0:
		return "a symbolic link"
	case m&fs.ModeNamedPipe != 0:
		return "a FIFO"
	case m&fs.ModeSocket != 0:
		return "a socket"
	case m&fs.ModeDevice != 0:
		return "a device"
	case m.IsDir():
		return "a directory"
	case m.IsRegular():
		return "a regular file"
	}
	return "not a regular file"
}

func tooBig(max int64) string {
	switch {
	case max >= 1<<20 && max%(1<<20) == 0:
		return fmt.Sprintf("larger than the %d MiB cap", max>>20)
	case max >= 1<<10 && max%(1<<10) == 0:
		return fmt.Sprintf("larger than the %d KiB cap", max>>10)
	}
	return fmt.Sprintf("larger than the %d-byte cap", max)
}
