package worktree

import (
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/aqfleet/aq/internal/safefs"
)

// ClearRefLocks removes the lock files git left for refs (full names under
// refs/heads/aq/) in the repository at repoDir, and returns the refs whose
// lock it removed. A git that dies while it updates a ref leaves
// <ref>.lock behind — killed with its host, or signalled in the instant
// after it made the lock and before it set the handler that removes it
// (git's tempfile.c activates the cleanup after the open) — and every
// later update of that ref fails on it ("Unable to create '….lock': File
// exists") until someone removes it: the job's next checkpoint, and aq gc
// (found by the chaos run, seed 140406565973930). Call it only where no
// git can be updating those refs: the job's runner, which holds the job's
// lock and has stopped its own checkpoints. The lock is removed through
// the safe helper: a link on the way is never followed.
func ClearRefLocks(repoDir string, refs ...string) []string {
	return clearRefLocks(repoDir, 0, refs)
}

// staleRefLock is how old a ref's lock must be before aq gc takes it for
// one a dead git left: a live git holds a ref's lock for milliseconds.
const staleRefLock = time.Minute

func clearRefLocks(repoDir string, olderThan time.Duration, refs []string) []string {
	_, common, _ := gitDirs(repoDir)
	if common == "" {
		return nil
	}
	var removed []string
	for _, ref := range refs {
		if !strings.HasPrefix(ref, aqRefPrefix) || strings.Contains(ref, "..") {
			continue
		}
		rel := ref + ".lock"
		fi, err := os.Lstat(filepath.Join(common, filepath.FromSlash(rel)))
		if err != nil || !fi.Mode().IsRegular() || time.Since(fi.ModTime()) < olderThan {
			continue
		}
		if safefs.Remove(common, common, rel) == nil {
			removed = append(removed, ref)
		}
	}
	return removed
}
