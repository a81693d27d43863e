package worktree

import (
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"sort"
	"strings"
	"testing"

	"github.com/aqfleet/aq/internal/testenv"
)

// engineEdits makes the kinds of change an engine leaves behind: a modified
// file, a deleted file, new files (with a space and non-ASCII in their names,
// in a new folder), and ignored build output.
func engineEdits(tb testing.TB, wt string) {
	tb.Helper()
	testenv.WriteFile(tb, filepath.Join(wt, "src", "main.go"), "package main\n\nfunc main() { println(\"hi\") }\n")
	if err := os.Remove(filepath.Join(wt, "src", "old.go")); err != nil {
		tb.Fatal(err)
	}
	testenv.WriteFile(tb, filepath.Join(wt, "notes with space.md"), "draft\n")
	testenv.WriteFile(tb, filepath.Join(wt, "dökümanlar", "日本語.txt"), "unicode\n")
	testenv.WriteFile(tb, filepath.Join(wt, "pkg", "new", "new.go"), "package new\n")
	testenv.WriteFile(tb, filepath.Join(wt, "debug.log"), "ignored\n")
	testenv.WriteFile(tb, filepath.Join(wt, "build", "out.bin"), "ignored\n")
}

// Checkpoint records modified, deleted and untracked files (not ignored
// ones) on the WIP ref, and leaves the worktree exactly as it was: HEAD,
// branch, index bytes, status and every file.
func TestCheckpointCapturesEverythingTouchesNothing(t *testing.T) {
	testenv.Slow(t, "many real git repositories, worktrees and pushes")
	t.Parallel()
	ctx := ctxT(t)
	repo := newRepo(t)
	wt := addWorktree(t, repo, "c1", "main")
	head := testenv.Git(t, wt, "rev-parse", "HEAD")
	testenv.Git(t, wt, "add", "README.md") // something staged too: the real index differs from HEAD
	engineEdits(t, wt)
	testenv.WriteFile(t, filepath.Join(wt, "README.md"), "# edited after staging\n")
	before := snapshot(t, wt)

	sha, err := Checkpoint(ctx, Git{}, wt, "aq/wip/c1", "aq: checkpoint c1")
	if err != nil {
		t.Fatal(err)
	}
	assertSameState(t, "worktree", before, snapshot(t, wt))

	if got := testenv.Git(t, repo, "rev-parse", "refs/heads/aq/wip/c1"); got != sha {
		t.Fatalf("ref = %s, want %s", got, sha)
	}
	files := lsTree(t, repo, sha)
	want := []string{".gitignore", "README.md", "dökümanlar/日本語.txt", "notes with space.md", "pkg/new/new.go", "src/main.go"}
	sort.Strings(want)
	if !reflect.DeepEqual(files, want) {
		t.Errorf("checkpoint files = %q\nwant %q (old.go deleted, *.log and build/ ignored)", files, want)
	}
	if got := testenv.Git(t, repo, "show", sha+":src/main.go"); !strings.Contains(got, "println") {
		t.Errorf("modified file in checkpoint = %q", got)
	}
	if got := testenv.Git(t, repo, "show", sha+":README.md"); got != "# edited after staging" {
		t.Errorf("README in checkpoint = %q, want the worktree's content, not the staged one", got)
	}
	stat := testenv.Git(t, repo, "-c", "core.quotepath=off", "show", "--stat", "--format=%s", sha)
	for _, s := range []string{"aq: checkpoint c1", "src/old.go", "notes with space.md", "日本語.txt", "6 files changed"} {
		if !strings.Contains(stat, s) {
			t.Errorf("git show --stat lacks %q:\n%s", s, stat)
		}
	}
	if p := parents(t, repo, sha); !reflect.DeepEqual(p, []string{head}) {
		t.Errorf("parents = %v, want [HEAD %s]", p, head)
	}
	// No temporary index is left in the worktree's git dir.
	gitDir := testenv.Git(t, wt, "rev-parse", "--absolute-git-dir")
	if m, _ := filepath.Glob(filepath.Join(gitDir, "aq-checkpoint-*")); len(m) != 0 {
		t.Errorf("temporary files left: %v", m)
	}
}

// Nothing changed: no commit. A clean worktree's checkpoint is HEAD itself,
// and checkpointing an unchanged state twice returns the same commit.
func TestCheckpointNothingChanged(t *testing.T) {
	testenv.Slow(t, "many real git repositories, worktrees and pushes")
	t.Parallel()
	ctx := ctxT(t)
	repo := newRepo(t)
	wt := addWorktree(t, repo, "c2", "main")
	head := testenv.Git(t, wt, "rev-parse", "HEAD")
	objects := func() string { return testenv.Git(t, repo, "rev-list", "--all", "--count") }
	n0 := objects()

	sha, err := Checkpoint(ctx, Git{}, wt, "aq/wip/c2", "wip")
	if err != nil || sha != head {
		t.Fatalf("clean checkpoint = %s %v, want HEAD %s", sha, err, head)
	}
	testenv.WriteFile(t, filepath.Join(wt, "ignored.log"), "only ignored output\n")
	if sha, _ = Checkpoint(ctx, Git{}, wt, "aq/wip/c2", "wip"); sha != head {
		t.Errorf("checkpoint with only ignored files = %s, want HEAD", sha)
	}
	if objects() != n0 {
		t.Errorf("commits %s -> %s: a clean checkpoint made a commit", n0, objects())
	}

	testenv.WriteFile(t, filepath.Join(wt, "a.txt"), "a\n")
	first, err := Checkpoint(ctx, Git{}, wt, "aq/wip/c2", "wip")
	if err != nil || first == head {
		t.Fatal(first, err)
	}
	again, err := Checkpoint(ctx, Git{}, wt, "aq/wip/c2", "wip")
	if err != nil || again != first {
		t.Errorf("unchanged second checkpoint = %s %v, want %s", again, err, first)
	}
}

// A killed engine's index.lock in the worktree's git dir blocks `git add`
// there, but not Checkpoint (it never uses the real index), and the lock is
// left alone.
func TestCheckpointWithStaleIndexLock(t *testing.T) {
	testenv.Slow(t, "many real git repositories, worktrees and pushes")
	t.Parallel()
	ctx := ctxT(t)
	repo := newRepo(t)
	wt := addWorktree(t, repo, "c3", "main")
	lockFile := filepath.Join(testenv.Git(t, wt, "rev-parse", "--absolute-git-dir"), "index.lock")
	testenv.WriteFile(t, lockFile, "half-written index from a killed engine")
	engineEdits(t, wt)
	if _, err := testenv.GitErr(wt, "add", "-A"); err == nil {
		t.Fatal("git add succeeded despite index.lock: the test does not reproduce the problem")
	}
	before := snapshot(t, wt)

	sha, err := Checkpoint(ctx, Git{}, wt, "aq/wip/c3", "wip")
	if err != nil {
		t.Fatalf("Checkpoint with a stale index.lock: %v", err)
	}
	if !strings.Contains(strings.Join(lsTree(t, repo, sha), "\n"), "notes with space.md") {
		t.Error("checkpoint lacks the untracked file")
	}
	assertSameState(t, "worktree", before, snapshot(t, wt))
	if _, err := os.Stat(lockFile); err != nil {
		t.Errorf("Checkpoint removed the lock: %v", err)
	}
}

// The parent rule: first parent HEAD; an existing ref that HEAD does not
// contain becomes the second parent, so no checkpoint is ever unreachable.
func TestCheckpointParentRule(t *testing.T) {
	testenv.Slow(t, "many real git repositories, worktrees and pushes")
	t.Parallel()
	ctx := ctxT(t)
	repo := newRepo(t)
	wt := addWorktree(t, repo, "p", "main")
	base := testenv.Git(t, wt, "rev-parse", "HEAD")
	cp := func() string {
		t.Helper()
		sha, err := Checkpoint(ctx, Git{}, wt, "aq/wip/p", "wip")
		if err != nil {
			t.Fatal(err)
		}
		return sha
	}

	testenv.WriteFile(t, filepath.Join(wt, "one.txt"), "1\n")
	c1 := cp()
	if p := parents(t, repo, c1); !reflect.DeepEqual(p, []string{base}) {
		t.Errorf("c1 parents = %v, want [base]", p)
	}

	testenv.WriteFile(t, filepath.Join(wt, "two.txt"), "2\n")
	c2 := cp()
	if p := parents(t, repo, c2); !reflect.DeepEqual(p, []string{base, c1}) {
		t.Errorf("c2 parents = %v, want [base c1]", p)
	}
	if got := testenv.Git(t, repo, "diff", "--name-only", c2+"^1", c2); got != "one.txt\ntwo.txt" {
		t.Errorf("diff first-parent..c2 = %q, want all uncommitted work", got)
	}

	// The engine commits some of it itself: HEAD moves to e, which does not
	// contain c2; the next checkpoint keeps c2 as second parent.
	testenv.Git(t, wt, "add", "one.txt")
	testenv.Git(t, wt, "commit", "-q", "-m", "engine commit")
	e := testenv.Git(t, wt, "rev-parse", "HEAD")
	testenv.WriteFile(t, filepath.Join(wt, "three.txt"), "3\n")
	c3 := cp()
	if p := parents(t, repo, c3); !reflect.DeepEqual(p, []string{e, c2}) {
		t.Errorf("c3 parents = %v, want [e c2]", p)
	}

	// The worktree was reset to clean base (a restart that did not resume):
	// the ref is not dropped back to base, a commit keeps c3 reachable.
	testenv.Git(t, wt, "reset", "-q", "--hard", base)
	testenv.Git(t, wt, "clean", "-fdq")
	c4 := cp()
	if p := parents(t, repo, c4); !reflect.DeepEqual(p, []string{base, c3}) {
		t.Errorf("clean-worktree c4 parents = %v, want [base c3]", p)
	}
	if ok, _ := IsAncestor(ctx, Git{}, repo, c1, "aq/wip/p"); !ok {
		t.Error("c1 no longer reachable from the WIP ref")
	}

	// Resumed from the checkpoint: HEAD is the ref, so the next checkpoint
	// has HEAD as its only parent.
	if err := Remove(ctx, Git{}, repo, wt); err != nil {
		t.Fatal(err)
	}
	wt2 := filepath.Join(t.TempDir(), "p2")
	if err := Add(ctx, Git{}, repo, wt2, "aq/job/p", "aq/wip/p"); err != nil {
		t.Fatal(err)
	}
	testenv.WriteFile(t, filepath.Join(wt2, "four.txt"), "4\n")
	c5, err := Checkpoint(ctx, Git{}, wt2, "aq/wip/p", "wip")
	if err != nil {
		t.Fatal(err)
	}
	if p := parents(t, repo, c5); !reflect.DeepEqual(p, []string{c4}) {
		t.Errorf("resumed c5 parents = %v, want [c4]", p)
	}
}

func TestCheckpointDetachedAndUnborn(t *testing.T) {
	testenv.Slow(t, "many real git repositories, worktrees and pushes")
	t.Parallel()
	ctx := ctxT(t)
	repo := newRepo(t)
	det := filepath.Join(t.TempDir(), "det")
	testenv.Git(t, repo, "worktree", "add", "-q", "--detach", det, "main")
	testenv.WriteFile(t, filepath.Join(det, "d.txt"), "d\n")
	before := snapshot(t, det)
	sha, err := Checkpoint(ctx, Git{}, det, "refs/heads/aq/wip/det", "wip")
	if err != nil {
		t.Fatal(err)
	}
	assertSameState(t, "detached worktree", before, snapshot(t, det))
	if before.Branch != "" {
		t.Errorf("detached worktree has branch %q", before.Branch)
	}
	if !strings.Contains(strings.Join(lsTree(t, repo, sha), " "), "d.txt") {
		t.Error("detached checkpoint lacks d.txt")
	}

	unborn := filepath.Join(t.TempDir(), "unborn")
	testenv.Git(t, "", "init", "-q", "-b", "main", unborn)
	if sha, err := Checkpoint(ctx, Git{}, unborn, "aq/wip/u", "wip"); err != nil || sha != "" {
		t.Errorf("empty unborn checkpoint = %q %v, want nothing", sha, err)
	}
	testenv.WriteFile(t, filepath.Join(unborn, "first.txt"), "first\n")
	sha, err = Checkpoint(ctx, Git{}, unborn, "aq/wip/u", "wip")
	if err != nil {
		t.Fatal(err)
	}
	if p := parents(t, unborn, sha); len(p) != 0 {
		t.Errorf("unborn checkpoint parents = %v, want a root commit", p)
	}
	if got := lsTree(t, unborn, sha); !reflect.DeepEqual(got, []string{"first.txt"}) {
		t.Errorf("unborn checkpoint files = %v", got)
	}
	if _, err := testenv.GitErr(unborn, "rev-parse", "-q", "--verify", "HEAD"); err == nil {
		t.Error("checkpoint gave the unborn branch a commit")
	}
}

// An engine that ran `git init` in a subfolder makes `git add -A` fail; the
// checkpoint still records every other file and says what it left out.
func TestCheckpointPartial(t *testing.T) {
	testenv.Slow(t, "many real git repositories, worktrees and pushes")
	t.Parallel()
	repo := newRepo(t)
	wt := addWorktree(t, repo, "part", "main")
	testenv.WriteFile(t, filepath.Join(wt, "saved.txt"), "saved\n")
	testenv.Git(t, "", "init", "-q", filepath.Join(wt, "scaffold"))
	testenv.WriteFile(t, filepath.Join(wt, "scaffold", "x.txt"), "x\n")

	sha, err := Checkpoint(ctxT(t), Git{}, wt, "aq/wip/part", "wip")
	var pe *PartialError
	if !errors.As(err, &pe) || pe.SHA != sha || sha == "" {
		t.Fatalf("Checkpoint = %q, %T %v; want a sha and a *PartialError", sha, err, err)
	}
	if !strings.Contains(strings.Join(lsTree(t, repo, sha), " "), "saved.txt") {
		t.Error("partial checkpoint lacks saved.txt")
	}
	if got := testenv.Git(t, repo, "rev-parse", "aq/wip/part"); got != sha {
		t.Error("partial checkpoint not recorded on the ref")
	}
}

// A tracked file that matches .gitignore is still recorded, not dropped as if
// deleted (a temporary index built from nothing would drop it).
func TestCheckpointKeepsTrackedIgnoredFiles(t *testing.T) {
	testenv.Slow(t, "many real git repositories, worktrees and pushes")
	t.Parallel()
	repo := newRepo(t)
	testenv.WriteFile(t, filepath.Join(repo, "keep.log"), "tracked despite *.log\n")
	testenv.Git(t, repo, "add", "-f", "keep.log")
	testenv.Git(t, repo, "commit", "-q", "-m", "tracked log")
	wt := addWorktree(t, repo, "ti", "main")
	testenv.WriteFile(t, filepath.Join(wt, "keep.log"), "changed\n")
	testenv.WriteFile(t, filepath.Join(wt, "x.txt"), "x\n")
	// Without a usable index to copy, Checkpoint seeds from HEAD.
	idx := testenv.Git(t, wt, "rev-parse", "--git-path", "index")
	if err := os.Remove(idx); err != nil {
		t.Fatal(err)
	}
	sha, err := Checkpoint(ctxT(t), Git{}, wt, "aq/wip/ti", "wip")
	if err != nil {
		t.Fatal(err)
	}
	if got := testenv.Git(t, repo, "show", sha+":keep.log"); got != "changed" {
		t.Errorf("tracked ignored file in checkpoint = %q", got)
	}
}

// In a sparse checkout, files outside the sparse patterns are absent from
// disk but not deleted: the checkpoint keeps them (git add leaves paths
// outside the patterns alone, and the copied index keeps their entries).
func TestCheckpointSparseCheckout(t *testing.T) {
	testenv.Slow(t, "many real git repositories, worktrees and pushes")
	t.Parallel()
	repo := newRepo(t)
	wt := addWorktree(t, repo, "sp", "main")
	testenv.Git(t, wt, "sparse-checkout", "set", "--no-cone", "/src/")
	if _, err := os.Stat(filepath.Join(wt, "README.md")); !os.IsNotExist(err) {
		t.Skipf("sparse-checkout did not remove README.md: %v", err)
	}
	testenv.WriteFile(t, filepath.Join(wt, "src", "extra.go"), "package main\n")
	sha, err := Checkpoint(ctxT(t), Git{}, wt, "aq/wip/sp", "wip")
	if err != nil {
		t.Fatal(err)
	}
	files := strings.Join(lsTree(t, repo, sha), " ")
	for _, f := range []string{"README.md", ".gitignore", "src/extra.go", "src/main.go"} {
		if !strings.Contains(files, f) {
			t.Errorf("sparse checkpoint lacks %s: %s", f, files)
		}
	}
}

// A file rewritten with the same size right after git last wrote the index
// can have the very stat data the index recorded; git then relies on its
// racy-entry check (file mtime not older than the index's). The temporary
// index keeps the real index's mtime, so the checkpoint still sees the change.
func TestCheckpointRacilyCleanFile(t *testing.T) {
	testenv.Slow(t, "many real git repositories, worktrees and pushes")
	t.Parallel()
	repo := newRepo(t)
	wt := addWorktree(t, repo, "racy", "main")
	testenv.Git(t, wt, "config", "core.trustctime", "false") // ctime would give the change away
	f := filepath.Join(wt, "racy.txt")
	testenv.WriteFile(t, f, "aaaa\n")
	testenv.Git(t, wt, "add", "racy.txt")
	fi, err := os.Stat(f)
	if err != nil {
		t.Fatal(err)
	}
	// Same size, same inode, same mtime as staged; only the content differs.
	rewrite, err := os.OpenFile(f, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	rewrite.WriteString("bbbb\n")
	rewrite.Close()
	mtime := fi.ModTime()
	if err := os.Chtimes(f, mtime, mtime); err != nil {
		t.Fatal(err)
	}
	// The index was written in that same instant.
	idx := testenv.Git(t, wt, "rev-parse", "--git-path", "index")
	if err := os.Chtimes(idx, mtime, mtime); err != nil {
		t.Fatal(err)
	}

	sha, err := Checkpoint(ctxT(t), Git{}, wt, "aq/wip/racy", "wip")
	if err != nil {
		t.Fatal(err)
	}
	if got := testenv.Git(t, repo, "show", sha+":racy.txt"); got != "bbbb" {
		t.Errorf("checkpoint recorded %q, the staged content, not the file's", got)
	}
}

// CheckpointSeen answers, from the checkpoint's own git, what a caller
// reads right after it (#35): HEAD, the checkpoint's tree, and each name
// asked for ("" for one that is not there) — each as git itself says.
func TestCheckpointSeen(t *testing.T) {
	t.Parallel()
	ctx := ctxT(t)
	repo := newRepo(t)
	wt := addWorktree(t, repo, "seen", "main")
	base := testenv.Git(t, repo, "rev-parse", "main")
	engineEdits(t, wt)
	names := []string{"refs/heads/aq/job/seen", base + "^{tree}", "refs/heads/aq/job/none"}
	sha, seen, err := CheckpointSeen(ctx, Git{}, wt, "aq/wip/seen", "aq: checkpoint", names...)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{
		names[0]: testenv.Git(t, repo, "rev-parse", names[0]),
		names[1]: testenv.Git(t, repo, "rev-parse", names[1]),
		names[2]: "",
	}
	if seen.Head != testenv.Git(t, wt, "rev-parse", "HEAD") || seen.Tree != testenv.Git(t, repo, "rev-parse", sha+"^{tree}") || !reflect.DeepEqual(seen.Names, want) {
		t.Errorf("seen = %+v\nwant HEAD %s, tree of %s, names %v", seen, base, sha, want)
	}
	// Unchanged since: the same checkpoint, the same tree.
	again, seen2, err := CheckpointSeen(ctx, Git{}, wt, "aq/wip/seen", "aq: checkpoint", names...)
	if err != nil || again != sha || seen2.Tree != seen.Tree {
		t.Errorf("again: %s %+v %v; want %s with tree %s", again, seen2, err, sha, seen.Tree)
	}
	if _, _, err := CheckpointSeen(ctx, Git{}, wt, "aq/wip/seen", "m", "HEAD\nrefs/heads/main"); err == nil {
		t.Error("a name of two lines was taken")
	}
}
