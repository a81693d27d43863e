//go:build unix

package worktree

import (
	"net"
	"os"
	"path/filepath"
	"testing"

	"github.com/aqfleet/aq/internal/testenv"
	"golang.org/x/sys/unix"
)

// TestRewrittenDotGitDoesNotRedirectGit: an engine rewrites its
// worktree's .git file to point at another repository; aq's checkpoint and
// commit still go to the worktree's own repository (aq's record: the
// repository's registration of the worktree), and the other repository
// gets nothing. Before record.go both went to the other repository: only
// GIT_WORK_TREE was pinned, and git found its repository from .git.
func TestRewrittenDotGitDoesNotRedirectGit(t *testing.T) {
	testenv.Slow(t, "many real git repositories, worktrees and pushes")
	ctx := ctxT(t)
	repo := newRepo(t)
	other := testenv.NewRepo(t, t.TempDir(), "other", map[string]string{"x.txt": "x\n"})
	otherHead := testenv.Git(t, other, "rev-parse", "HEAD")
	wt := filepath.Join(t.TempDir(), "wt")
	if err := Add(ctx, Git{}, repo, wt, "aq/job/j1", "main"); err != nil {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(wt, "work.txt"), []byte("work\n"), 0o644)
	os.WriteFile(filepath.Join(wt, ".git"), []byte("gitdir: "+filepath.Join(other, ".git")+"\n"), 0o644)

	cp, err := Checkpoint(ctx, Git{}, wt, "aq/wip/j1", "checkpoint")
	if err != nil {
		t.Fatal(err)
	}
	if got, _ := testenv.GitErr(repo, "rev-parse", "refs/heads/aq/wip/j1"); got != cp || cp == "" {
		t.Errorf("aq/wip/j1 in the job's repository = %q, checkpoint %q", got, cp)
	}
	sha, changed, err := CommitAll(ctx, Git{}, wt, "result")
	if err != nil || !changed {
		t.Fatalf("CommitAll: %v changed=%v", err, changed)
	}
	if got := testenv.Git(t, repo, "rev-parse", "refs/heads/aq/job/j1"); got != sha {
		t.Errorf("aq/job/j1 = %s, the commit %s went elsewhere", got, sha)
	}
	if files := testenv.TreeFiles(t, repo, sha); files["work.txt"] != "work" {
		t.Errorf("the result lacks the work: %v", files)
	}
	if got := testenv.Git(t, other, "rev-parse", "HEAD"); got != otherHead {
		t.Errorf("the other repository's HEAD moved: %s → %s", otherHead, got)
	}
	if refs := testenv.Git(t, other, "for-each-ref", "--format=%(refname)"); refs != "refs/heads/main" {
		t.Errorf("the other repository got refs: %s", refs)
	}
	if dirs := GitDirsOf(wt); len(dirs) != 2 || dirs[0] != filepath.Join(repo, ".git") {
		t.Errorf("GitDirsOf = %v", dirs)
	}
	// Put back for every git after aq's: once, then nothing to do.
	if restored, err := RestoreDotGit(wt); !restored || err != nil {
		t.Errorf("RestoreDotGit = %v, %v", restored, err)
	}
	if got := testenv.Git(t, wt, "rev-parse", "--git-common-dir"); got != filepath.Join(repo, ".git") {
		t.Errorf("a plain git in the worktree finds %s", got)
	}
	if restored, err := RestoreDotGit(wt); restored || err != nil {
		t.Errorf("RestoreDotGit again = %v, %v", restored, err)
	}
}

// TestFIFOsDoNotWedgeGit: a FIFO named .gitignore (git opens it, and would
// wait forever for a writer) and FIFOs and a socket elsewhere are removed
// before aq's git runs: the checkpoint, Dirty and the result commit
// return, and what was removed is said. Without special.go the checkpoint's
// git add blocked until its context ended.
func TestFIFOsDoNotWedgeGit(t *testing.T) {
	testenv.Slow(t, "many real git repositories, worktrees and pushes")
	ctx := ctxT(t)
	repo := newRepo(t)
	wt := addWorktree(t, repo, "j1", "main")
	os.Remove(filepath.Join(wt, ".gitignore"))
	os.MkdirAll(filepath.Join(wt, "src", "deep"), 0o755)
	for _, p := range []string{".gitignore", "src/deep/.gitattributes", "fifo"} {
		if err := unix.Mkfifo(filepath.Join(wt, p), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	l, err := net.Listen("unix", filepath.Join(wt, "sock"))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	os.WriteFile(filepath.Join(wt, "work.txt"), []byte("work\n"), 0o644)
	removed, err := RemoveSpecialFiles(wt)
	if err != nil || len(removed) != 4 {
		t.Errorf("removed %v, %v; want the 3 FIFOs and the socket", removed, err)
	}
	for _, p := range []string{".gitignore", "src/deep/.gitattributes"} {
		unix.Mkfifo(filepath.Join(wt, p), 0o644) // again, for the calls below
	}
	if _, err := Checkpoint(ctx, Git{}, wt, "aq/wip/j1", "checkpoint"); err != nil {
		t.Fatalf("Checkpoint: %v", err)
	}
	unix.Mkfifo(filepath.Join(wt, ".gitignore"), 0o644)
	if dirty, err := Dirty(ctx, Git{}, wt); err != nil || !dirty {
		t.Errorf("Dirty = %v, %v", dirty, err)
	}
	if _, err := os.Lstat(filepath.Join(wt, ".gitignore")); err == nil {
		t.Error("the FIFO .gitignore is still there")
	}
}

// TestPoolNeverKeepsAFIFO: a FIFO that git clean cannot see is not
// carried into the pool with its worktree (without special.go, the next
// job that took the worktree got it).
func TestPoolNeverKeepsAFIFO(t *testing.T) {
	testenv.Slow(t, "many real git repositories, worktrees and pushes")
	ctx := ctxT(t)
	repo := newRepo(t)
	wt := addWorktree(t, repo, "j1", "main")
	if err := unix.Mkfifo(filepath.Join(wt, "planted"), 0o644); err != nil {
		t.Fatal(err)
	}
	p := Pool{Dir: PoolDir(filepath.Join(t.TempDir(), "worktrees"), "repo"), Size: 2}
	dest, err := p.Put(ctx, Git{}, repo, wt)
	if err != nil || dest == "" {
		t.Fatalf("Put: %q %v", dest, err)
	}
	if _, err := os.Lstat(filepath.Join(dest, "planted")); err == nil {
		t.Error("the FIFO went into the pool")
	}
}
