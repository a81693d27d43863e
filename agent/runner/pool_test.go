package runner_test

import (
	"context"
	"path/filepath"
	"strings"
	"testing"

	"github.com/aqfleet/aq/agent/runner"
	"github.com/aqfleet/aq/internal/testenv"
)

// TestNextJobStartsInAWarmWorktree: a finished job's worktree goes to the
// pool, and the next job on the repository starts in it, reset to its base:
// it sees nothing of the first job (files, ignored files, branch) and its
// result holds only its own work; the first job's branch is checked out
// nowhere.
func TestNextJobStartsInAWarmWorktree(t *testing.T) {
	testenv.Slow(t, "runs whole jobs with real git, processes and waits")
	f := newFixture(t)
	a := f.run(context.Background(), f.job("first", writeAll), runner.Options{})
	if a.Failed() || !a.Pooled || a.WarmStart {
		t.Fatalf("first job: %+v", a)
	}
	if testenv.Exists(f.wt("first")) {
		t.Errorf("the first job's worktree is still at %s", f.wt("first"))
	}
	if l := testenv.Git(t, f.repo, "worktree", "list", "--porcelain"); strings.Contains(l, "aq/job/"+f.id("first")) {
		t.Errorf("the first job's branch is still checked out:\n%s", l)
	}
	// The second job records what it found before it works.
	b := f.run(context.Background(), f.job("second", `git status --porcelain --ignored --untracked-files=all > "$MARK/status"
ls -A > "$MARK/ls"
git symbolic-ref HEAD > "$MARK/head"
echo second > second.txt
`), runner.Options{})
	if b.Failed() || !b.WarmStart || !b.Pooled {
		t.Fatalf("second job: %+v", b)
	}
	if st := testenv.ReadFile(t, f.marker("status")); st != "" {
		t.Errorf("the second job found leftovers:\n%s", st)
	}
	if ls := strings.Fields(testenv.ReadFile(t, f.marker("ls"))); strings.Join(ls, " ") != ".git .gitignore README.md docs doomed.txt keep.txt src" {
		t.Errorf("the second job found %v", ls)
	}
	if h := strings.TrimSpace(testenv.ReadFile(t, f.marker("head"))); h != "refs/heads/aq/job/"+f.id("second") {
		t.Errorf("HEAD %s", h)
	}
	files := testenv.TreeFiles(t, f.repo, b.Commit)
	if files["second.txt"] != "second" || files["new.txt"] != "" || files["keep.txt"] != "one\ntwo\nthree" || files["doomed.txt"] == "" {
		t.Errorf("the second result carries the first job's work: %v", sortedKeys(files))
	}
	if n := strings.Count(testenv.Git(t, f.repo, "worktree", "list", "--porcelain"), "worktree "); n != 2 {
		t.Errorf("%d worktrees, want the repository's and one pooled", n)
	}
}

// TestPartialCheckpointIsNotPooled: a worktree whose checkpoint left files
// out (a nested repository with no commit) stays where it ran, holding them.
func TestPartialCheckpointIsNotPooled(t *testing.T) {
	testenv.Slow(t, "runs whole jobs with real git, processes and waits")
	f := newFixture(t)
	out := f.run(context.Background(), f.job("partial", `mkdir nested && git -C nested init -q && echo only > nested/only.txt
echo x > x.txt`), runner.Options{})
	if out.Pooled {
		t.Fatalf("pooled a worktree whose checkpoint is partial: %+v", out)
	}
	if testenv.ReadFile(t, filepath.Join(f.wt("partial"), "nested", "only.txt")) != "only\n" {
		t.Error("the file the checkpoint could not record is gone")
	}
}
