package worktree

import (
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/aqfleet/aq/internal/testenv"
)

// TestDeleteRefsTakesADeadGitsLock: aq gc meets the lock a dead git left on
// a ref it deletes (the chaos run, seed 140406565973930): one older than a
// live git ever holds it is removed and the ref deleted; a fresh one is
// left to its git, and the ref kept, said as a failure.
func TestDeleteRefsTakesADeadGitsLock(t *testing.T) {
	ctx := ctxT(t)
	repo := newRepo(t)
	base := testenv.Git(t, repo, "rev-parse", "main")
	for _, b := range []string{"aq/wip/stale", "aq/wip/fresh"} {
		testenv.Git(t, repo, "branch", b, "main")
	}
	lock := func(b string) string { return filepath.Join(repo, ".git", "refs", "heads", b+".lock") }
	testenv.WriteFile(t, lock("aq/wip/stale"), "")
	testenv.WriteFile(t, lock("aq/wip/fresh"), "")
	old := time.Now().Add(-2 * staleRefLock)
	if err := os.Chtimes(lock("aq/wip/stale"), old, old); err != nil {
		t.Fatal(err)
	}
	res, err := DeleteRefs(ctx, Git{}, repo, []Ref{
		{Name: "refs/heads/aq/wip/stale", SHA: base},
		{Name: "refs/heads/aq/wip/fresh", SHA: base},
	})
	if err != nil {
		t.Fatal(err)
	}
	if res[0].Outcome != RefDeleted || res[1].Outcome != RefFailed {
		t.Fatalf("outcomes %s (%v), %s (%v); want the stale lock's ref deleted, the fresh one's failed", res[0].Outcome, res[0].Err, res[1].Outcome, res[1].Err)
	}
	if testenv.Exists(lock("aq/wip/stale")) || !testenv.Exists(lock("aq/wip/fresh")) {
		t.Error("gc removed the wrong lock")
	}
}

// TestClearRefLocks removes the locks of the refs named, of aq's refs
// only, and never through a link.
func TestClearRefLocks(t *testing.T) {
	repo := newRepo(t)
	heads := filepath.Join(repo, ".git", "refs", "heads")
	testenv.WriteFile(t, filepath.Join(heads, "aq", "wip", "a.lock"), "")
	testenv.WriteFile(t, filepath.Join(heads, "main.lock"), "")
	outside := t.TempDir()
	testenv.WriteFile(t, filepath.Join(outside, "b.lock"), "")
	if err := os.Symlink(outside, filepath.Join(heads, "aq", "job")); err != nil {
		t.Fatal(err)
	}
	got := ClearRefLocks(repo, "refs/heads/aq/wip/a", "refs/heads/main", "refs/heads/aq/job/b", "refs/heads/aq/wip/none")
	if !slices.Equal(got, []string{"refs/heads/aq/wip/a"}) {
		t.Errorf("removed %v, want only aq/wip/a's lock", got)
	}
	if testenv.Exists(filepath.Join(heads, "aq", "wip", "a.lock")) {
		t.Error("aq/wip/a.lock is still there")
	}
	if !testenv.Exists(filepath.Join(heads, "main.lock")) || !testenv.Exists(filepath.Join(outside, "b.lock")) {
		t.Error("a lock that is not aq's, or one behind a link, was removed")
	}
}
