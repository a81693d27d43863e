package caps

import (
	"errors"
	"io/fs"
	"os"
	"time"
)

// BaseStamp is what a cheap look at the repo base sees: its modification
// time and size. A directory's mtime moves when an entry directly below it is
// created, removed or renamed — a new clone, a removed checkout, a rename —
// so a refresher compares stamps each heartbeat (one stat) and re-detects
// only when the stamp moved (or its cadence is due: a change inside a repo,
// e.g. a .git removed, or a file system whose mtime is coarse, is left to
// the cadence).
type BaseStamp struct {
	ModTime time.Time
	Size    int64
	Exists  bool
}

// StatBase stamps the repo base (a missing base is a stamp too: its
// creation is a change).
func StatBase(base string) (BaseStamp, error) {
	if base == "" {
		return BaseStamp{}, nil
	}
	fi, err := os.Stat(base)
	if errors.Is(err, fs.ErrNotExist) {
		return BaseStamp{}, nil
	}
	if err != nil {
		return BaseStamp{}, err
	}
	return BaseStamp{ModTime: fi.ModTime(), Size: fi.Size(), Exists: true}, nil
}

// statBase is StatBase for the benchmarks.
func statBase(base string) (BaseStamp, error) { return StatBase(base) }

// IsGitCheckout reports whether dir is a repository as detection counts
// one (a .git directory, or a gitdir link to one that exists).
func IsGitCheckout(dir string) bool { return isGitCheckout(dir) }
