package worktree

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/aqfleet/aq/internal/safefs"
)

// Reset brings the linked worktree at path to what `git worktree add -B
// branch path start` would make, touching only the files that differ: the
// warm start of a job in a worktree an earlier job used (see Pool). start
// must be a commit (a sha is best: it is not resolved again).
//
// What it does, in order:
//
//  1. It refuses (*UncleanError) a worktree whose index is locked
//     (index.lock): some git may still run in it, and aq never takes a lock
//     from a live git.
//  2. It empties the worktree's own git directory (`git rev-parse
//     --git-dir`) of everything but HEAD, index, gitdir, commondir and a
//     split index's shared files: per-worktree config (config.worktree, so a
//     core.hooksPath or core.sparseCheckout a job set there goes with it),
//     info/sparse-checkout, a merge, rebase, cherry-pick, revert, bisect or
//     sequencer in progress (MERGE_HEAD, rebase-merge/, ...), per-worktree
//     refs (refs/worktree, refs/bisect, refs/rewritten), HEAD's reflog,
//     ORIG_HEAD, FETCH_HEAD and aq's own checkpoint index.
//  3. It clears the assume-unchanged and skip-worktree bits a job may have
//     set on index entries (read from the index file, else `git ls-files
//     -v`; then `git update-index --no-assume-unchanged` /
//     `--no-skip-worktree` on those paths only): with them git would not
//     look at, or restore, those files.
//  4. `git checkout -f -B branch start`: the branch is created or reset,
//     HEAD is attached to it, unmerged entries are dropped, and every
//     tracked file that differs from start — modified, deleted, staged,
//     replaced by an untracked file or directory — is rewritten. Files that
//     did not change keep their index stat data, so git neither reads nor
//     writes them.
//  5. `git clean -ffdx`: untracked and ignored files and directories go,
//     nested repositories included.
//  6. A split index (`git update-index --split-index`) is merged back.
//
// What it leaves alone: whatever lives in the repository's common git
// directory — refs (branches, tags, refs/stash), objects, the shared
// config, hooks/ and info/exclude. Those are the repository's own: every
// worktree of it, a fresh one included, sees the same, and the person who
// owns the clone may have changed them on purpose; a job that changes them
// changes them for everyone.
//
// Any failure is an *UncleanError: the caller discards the worktree and
// makes a new one. Reset never touches anything outside path and its own git
// directory.
func Reset(ctx context.Context, g Git, path, branch, start string) error {
	unclean := func(why string, err error) error { return &UncleanError{Path: path, Why: why, Err: err} }
	wg := g.at(path)
	admin, err := linkedGitDir(path)
	if err != nil {
		return unclean("it is not a linked worktree", err)
	}
	if _, err := RemoveSpecialFiles(path); err != nil {
		return unclean("cannot remove the FIFOs, sockets or devices a job left in it", err)
	}
	if _, err := os.Lstat(filepath.Join(admin, "index.lock")); err == nil {
		return unclean("its index is locked (index.lock): a git command may still be running in it", nil)
	}
	split, err := clearGitDir(admin)
	if err != nil {
		return unclean("cannot clear its git directory", err)
	}
	if err := clearIndexFlags(ctx, wg, path, admin, len(start)/2, split); err != nil {
		return unclean("cannot clear the index's assume-unchanged and skip-worktree bits", err)
	}
	if _, err := wg.Run(ctx, path, "checkout", "-f", "-q", "--no-recurse-submodules", "-B", branch, start, "--"); err != nil {
		return unclean("git checkout -f failed", err)
	}
	if _, err := wg.Run(ctx, path, "clean", "-ffdxq"); err != nil {
		return unclean("git clean failed", err)
	}
	if split {
		if _, err := wg.Run(ctx, path, "update-index", "--no-split-index"); err != nil {
			return unclean("cannot undo its split index", err)
		}
	}
	return nil
}

// UncleanError says a worktree could not be brought back to a fresh state
// (Reset), or not moved in or out of the pool; the caller discards it.
type UncleanError struct {
	Path string
	Why  string
	Err  error
}

func (e *UncleanError) Error() string {
	msg := fmt.Sprintf("worktree %s cannot be reused: %s", e.Path, e.Why)
	if e.Err != nil {
		msg += ": " + e.Err.Error()
	}
	return msg
}

func (e *UncleanError) Unwrap() error { return e.Err }

// linkedGitDir is the git directory of the linked worktree at path: aq's
// record of it (record.go) for a worktree of a trusted repository, else
// read from its .git file ("gitdir: <dir>"); without running git.
func linkedGitDir(path string) (string, error) {
	if abs, err := filepath.Abs(path); err == nil {
		if x, _, ok := recordedGitDir(abs); ok {
			return x, nil // aq's record, not the engine's .git file
		}
	}
	b, err := os.ReadFile(filepath.Join(path, ".git"))
	if err != nil {
		return "", err
	}
	dir, ok := strings.CutPrefix(strings.TrimSpace(string(b)), "gitdir:")
	if !ok {
		return "", errors.New(".git is not a gitdir file")
	}
	dir = strings.TrimSpace(dir)
	if !filepath.IsAbs(dir) {
		dir = filepath.Join(path, dir)
	}
	if fi, err := os.Stat(filepath.Join(dir, "commondir")); err != nil || !fi.Mode().IsRegular() {
		return "", fmt.Errorf("%s is not a linked worktree's git directory", dir)
	}
	return dir, nil
}

// keptInGitDir are the entries of a linked worktree's git directory that
// make it a worktree; everything else there is state a job left.
var keptInGitDir = map[string]bool{"HEAD": true, "index": true, "gitdir": true, "commondir": true}

// clearGitDir removes what a job may have left in a linked worktree's git
// directory; split reports whether the index is split (its shared files are
// kept: the index needs them).
func clearGitDir(admin string) (split bool, err error) {
	ents, err := os.ReadDir(admin)
	if err != nil {
		return false, err
	}
	for _, e := range ents {
		name := e.Name()
		switch {
		case keptInGitDir[name]:
		case strings.HasPrefix(name, "sharedindex."):
			split = true
		default:
			if err := os.RemoveAll(filepath.Join(admin, name)); err != nil {
				return split, err
			}
		}
	}
	return split, nil
}

// clearIndexFlags clears the assume-unchanged and skip-worktree bits of the
// index entries that have them: read from the index file in admin (the
// worktree's git directory; hashLen the object names' length in bytes),
// else — a split index, or one this reader does not take — with `git
// ls-files -v`; update-index runs only when some entry has one.
func clearIndexFlags(ctx context.Context, wg Git, path, admin string, hashLen int, split bool) error {
	if !split {
		data, err := safefs.ReadFile("git directory", admin, "index", maxIndexRead)
		if errors.Is(err, fs.ErrNotExist) {
			return nil // no index: no entry, no bit
		}
		if err == nil {
			if v, s, err := indexFlags(data, hashLen); err == nil {
				return updateIndexFlags(ctx, wg, path, bytes.NewBuffer(v), bytes.NewBuffer(s))
			}
		}
	}
	out, err := wg.run(ctx, path, nil, []string{"ls-files", "-v", "-z"})
	if err != nil {
		return err
	}
	var valid, skip bytes.Buffer
	for _, rec := range bytes.Split(out, []byte{0}) {
		if len(rec) < 3 || rec[1] != ' ' {
			continue
		}
		tag, name := rec[0], rec[2:]
		if tag >= 'a' && tag <= 'z' { // lower case: assume unchanged
			valid.Write(name)
			valid.WriteByte(0)
		}
		if tag == 'S' || tag == 's' {
			skip.Write(name)
			skip.WriteByte(0)
		}
	}
	return updateIndexFlags(ctx, wg, path, &valid, &skip)
}

// updateIndexFlags clears the assume-unchanged bit of the paths in valid
// and the skip-worktree bit of those in skip (NUL-terminated each).
func updateIndexFlags(ctx context.Context, wg Git, path string, valid, skip *bytes.Buffer) error {
	for _, u := range []struct {
		flag  string
		paths *bytes.Buffer
	}{{"--no-assume-unchanged", valid}, {"--no-skip-worktree", skip}} {
		if u.paths.Len() == 0 {
			continue
		}
		// One kind of bit per run: update-index applies only the first
		// of --no-assume-unchanged and --no-skip-worktree to a path.
		if _, err := wg.runStdin(ctx, path, bytes.NewReader(u.paths.Bytes()), "update-index", u.flag, "-z", "--stdin"); err != nil {
			return err
		}
	}
	return nil
}
