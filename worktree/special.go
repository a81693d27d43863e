package worktree

// Files that are not files. An engine can leave a FIFO, a socket or a
// device in its worktree; git opens some files it meets (.gitignore,
// .gitattributes) without O_NONBLOCK, so a FIFO named .gitignore hangs
// `git status` and `git add --all` for good, and `git clean -fdx` neither
// lists nor removes one, so it would survive the pool into the next job.
// aq removes them before it runs git in a worktree that an engine wrote,
// and before it pools one.

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
)

// SpecialFile is a non-regular file RemoveSpecialFiles removed: its path
// relative to the worktree, and what it was ("a FIFO").
type SpecialFile struct{ Path, Kind string }

// RemoveSpecialFiles removes every FIFO, socket and device below the
// worktree at path (its .git entry aside; no link is followed) and
// returns what it removed.
func RemoveSpecialFiles(path string) ([]SpecialFile, error) {
	var removed []SpecialFile
	var errs []error
	err := filepath.WalkDir(path, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			if p == path {
				return err
			}
			return nil // gone meanwhile, or unreadable: git will say
		}
		if p == path {
			return nil
		}
		if filepath.Dir(p) == path && d.Name() == ".git" {
			if d.IsDir() {
				return fs.SkipDir
			}
			return nil
		}
		kind := specialKind(d.Type())
		if kind == "" {
			return nil
		}
		if err := os.Remove(p); err != nil && !errors.Is(err, fs.ErrNotExist) {
			errs = append(errs, err)
			return nil
		}
		rel, _ := filepath.Rel(path, p)
		removed = append(removed, SpecialFile{Path: filepath.ToSlash(rel), Kind: kind})
		return nil
	})
	if err != nil {
		errs = append(errs, err)
	}
	return removed, errors.Join(errs...)
}

func specialKind(t fs.FileMode) string {
	switch {
	case t&fs.ModeNamedPipe != 0:
		return "a FIFO"
	case t&fs.ModeSocket != 0:
		return "a socket"
	case t&fs.ModeDevice != 0:
		return "a device"
	case t&fs.ModeIrregular != 0:
		return "not a regular file"
	}
	return ""
}
