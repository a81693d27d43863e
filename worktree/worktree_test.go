package worktree

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/aqfleet/aq/internal/testenv"
)

// Add makes a real linked worktree: `git worktree list` shows it on the job
// branch, at the base commit, with the base's files.
func TestAddCreatesListedWorktree(t *testing.T) {
	testenv.Slow(t, "many real git repositories, worktrees and pushes")
	t.Parallel()
	ctx := ctxT(t)
	repo := newRepo(t)
	base := testenv.Git(t, repo, "rev-parse", "main")
	wt := filepath.Join(t.TempDir(), "deep", "worktrees", "repo", "j1") // parents do not exist yet

	if err := Add(ctx, Git{}, repo, wt, "aq/job/j1", "main"); err != nil {
		t.Fatal(err)
	}
	list := testenv.Git(t, repo, "worktree", "list", "--porcelain")
	if !strings.Contains(list, "worktree "+wt+"\nHEAD "+base+"\nbranch refs/heads/aq/job/j1") {
		t.Fatalf("git worktree list does not show %s on aq/job/j1 at %s:\n%s", wt, base, list)
	}
	if got := testenv.ReadFile(t, filepath.Join(wt, "src", "main.go")); !strings.Contains(got, "func main") {
		t.Errorf("worktree file = %q", got)
	}
	if got := testenv.Git(t, wt, "symbolic-ref", "HEAD"); got != "refs/heads/aq/job/j1" {
		t.Errorf("worktree HEAD = %s", got)
	}

	entries, err := List(ctx, Git{}, repo)
	if err != nil {
		t.Fatal(err)
	}
	if len(entries) != 2 || entries[0].Path != repo || entries[0].Branch != "main" ||
		entries[1].Path != wt || entries[1].Branch != "aq/job/j1" || entries[1].HEAD != base || entries[1].Prunable {
		t.Errorf("List = %+v", entries)
	}
	if !IsRepo(wt) {
		t.Error("IsRepo(linked worktree) = false")
	}
}

// A resumed job starts from its WIP checkpoint, untracked files included.
func TestAddFromWIPRef(t *testing.T) {
	testenv.Slow(t, "many real git repositories, worktrees and pushes")
	t.Parallel()
	ctx := ctxT(t)
	repo := newRepo(t)
	wt := addWorktree(t, repo, "j2", "main")
	testenv.WriteFile(t, filepath.Join(wt, "new file.txt"), "engine output\n")
	testenv.WriteFile(t, filepath.Join(wt, "README.md"), "# edited\n")
	cp, err := Checkpoint(ctx, Git{}, wt, "aq/wip/j2", "wip")
	if err != nil {
		t.Fatal(err)
	}
	if err := Remove(ctx, Git{}, repo, wt); err != nil {
		t.Fatal(err)
	}

	wt2 := filepath.Join(t.TempDir(), "again", "j2")
	if err := Add(ctx, Git{}, repo, wt2, "aq/job/j2", "aq/wip/j2"); err != nil {
		t.Fatal(err)
	}
	if got := testenv.Git(t, wt2, "rev-parse", "HEAD"); got != cp {
		t.Errorf("resumed HEAD = %s, want checkpoint %s", got, cp)
	}
	if got := testenv.ReadFile(t, filepath.Join(wt2, "new file.txt")); got != "engine output\n" {
		t.Errorf("untracked file after resume = %q", got)
	}
	if got := testenv.ReadFile(t, filepath.Join(wt2, "README.md")); got != "# edited\n" {
		t.Errorf("modified file after resume = %q", got)
	}
}

func TestAddMissingBaseNamesTheBranch(t *testing.T) {
	testenv.Slow(t, "many real git repositories, worktrees and pushes")
	t.Parallel()
	repo := newRepo(t)
	wt := filepath.Join(t.TempDir(), "wt")
	err := Add(ctxT(t), Git{}, repo, wt, "aq/job/x", "develop")
	var re *RepoError
	if !errors.As(err, &re) || !errors.Is(err, ErrNoRef) || re.Ref != "develop" {
		t.Fatalf("err = %T %v, want *RepoError matching ErrNoRef for develop", err, err)
	}
	if !strings.Contains(err.Error(), `"develop"`) {
		t.Errorf("message %q does not name the branch", err)
	}
	if _, err := os.Stat(wt); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("worktree dir created for a failed Add: %v", err)
	}
	if ok, _ := BranchExists(ctxT(t), Git{}, repo, "aq/job/x"); ok {
		t.Error("branch created for a failed Add")
	}
}

// A missing repo dir, a plain folder, and a plain folder inside another
// repository are all "not a repository" — the last must never be taken for
// the enclosing repository.
func TestAddRepoUnavailable(t *testing.T) {
	testenv.Slow(t, "many real git repositories, worktrees and pushes")
	t.Parallel()
	ctx := ctxT(t)
	outer := newRepo(t)
	inside := filepath.Join(outer, "src") // a folder of a repository, not one itself
	plain := t.TempDir()
	cases := map[string]string{
		"missing":       filepath.Join(t.TempDir(), "nope"),
		"plain folder":  plain,
		"inside a repo": inside,
	}
	for name, dir := range cases {
		err := Add(ctx, Git{}, dir, filepath.Join(t.TempDir(), "wt"), "aq/job/x", "main")
		var re *RepoError
		if !errors.As(err, &re) || !errors.Is(err, ErrNotRepo) || re.Dir != dir {
			t.Errorf("%s: err = %T %v, want *RepoError matching ErrNotRepo", name, err, err)
		}
		if IsRepo(dir) {
			t.Errorf("%s: IsRepo = true", name)
		}
		if _, err := Checkpoint(ctx, Git{}, dir, "aq/wip/x", "wip"); !errors.Is(err, ErrNotRepo) {
			t.Errorf("%s: Checkpoint err = %v, want ErrNotRepo", name, err)
		}
	}
	if strings.Contains(testenv.Git(t, outer, "for-each-ref"), "aq/") {
		t.Error("a checkpoint of a folder inside a repository wrote to the enclosing repository")
	}
	if err := Add(ctx, Git{}, cases["missing"], filepath.Join(t.TempDir(), "wt"), "aq/job/x", "main"); !strings.Contains(err.Error(), "does not exist") {
		t.Errorf("missing repo message = %q", err)
	}

	bare := filepath.Join(t.TempDir(), "bare.git")
	testenv.Git(t, "", "init", "-q", "--bare", bare)
	if !IsRepo(outer) || !IsRepo(bare) {
		t.Error("IsRepo false for a checkout or a bare repository")
	}
}

func TestAddRefusesExistingPath(t *testing.T) {
	t.Parallel()
	repo := newRepo(t)
	wt := filepath.Join(t.TempDir(), "wt")
	testenv.WriteFile(t, filepath.Join(wt, "precious.txt"), "do not lose me\n")
	err := Add(ctxT(t), Git{}, repo, wt, "aq/job/x", "main")
	var pe *PathExistsError
	if !errors.As(err, &pe) || !errors.Is(err, fs.ErrExist) || pe.Path != wt {
		t.Fatalf("err = %T %v, want *PathExistsError", err, err)
	}
	if got := testenv.ReadFile(t, filepath.Join(wt, "precious.txt")); got != "do not lose me\n" {
		t.Error("existing directory was touched")
	}
}

// aq works only in its own worktree: the main checkout's uncommitted changes
// (modified, staged, untracked), its index, HEAD and branch survive a whole
// job — Add, Checkpoint, CommitAll, SquashOnto, Remove.
func TestMainCheckoutLeftUntouched(t *testing.T) {
	testenv.Slow(t, "many real git repositories, worktrees and pushes")
	t.Parallel()
	ctx := ctxT(t)
	repo := newRepo(t)
	base := testenv.Git(t, repo, "rev-parse", "HEAD")
	testenv.WriteFile(t, filepath.Join(repo, "README.md"), "# my local edit\n")
	testenv.WriteFile(t, filepath.Join(repo, "staged.txt"), "staged\n")
	testenv.Git(t, repo, "add", "staged.txt")
	testenv.WriteFile(t, filepath.Join(repo, "scratch.txt"), "untracked notes\n")
	before := snapshot(t, repo)

	wt := addWorktree(t, repo, "j3", "main")
	testenv.WriteFile(t, filepath.Join(wt, "feature.go"), "package feature\n")
	if _, err := Checkpoint(ctx, Git{}, wt, "aq/wip/j3", "wip"); err != nil {
		t.Fatal(err)
	}
	if _, _, err := CommitAll(ctx, Git{}, wt, "engine work"); err != nil {
		t.Fatal(err)
	}
	if _, _, err := SquashOnto(ctx, Git{}, wt, base, "job j3"); err != nil {
		t.Fatal(err)
	}
	if err := Remove(ctx, Git{}, repo, wt); err != nil {
		t.Fatal(err)
	}
	assertSameState(t, "main checkout", before, snapshot(t, repo))
}

func TestRemove(t *testing.T) {
	testenv.Slow(t, "many real git repositories, worktrees and pushes")
	t.Parallel()
	ctx := ctxT(t)
	repo := newRepo(t)

	wt := addWorktree(t, repo, "r1", "main")
	testenv.WriteFile(t, filepath.Join(wt, "junk.log"), "ignored\n")
	testenv.WriteFile(t, filepath.Join(wt, "untracked.txt"), "x\n")
	if err := Remove(ctx, Git{}, repo, wt); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(wt); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("worktree dir still there: %v", err)
	}
	if strings.Contains(testenv.Git(t, repo, "worktree", "list", "--porcelain"), wt) {
		t.Error("worktree still registered")
	}
	if ok, _ := BranchExists(ctx, Git{}, repo, "aq/job/r1"); !ok {
		t.Error("Remove deleted the job branch")
	}

	// Deleted by hand: List says prunable, Remove just unregisters it, and a
	// new Add of the same job is not blocked by the stale registration.
	wt2 := addWorktree(t, repo, "r2", "main")
	if err := os.RemoveAll(wt2); err != nil {
		t.Fatal(err)
	}
	entries, err := List(ctx, Git{}, repo)
	if err != nil {
		t.Fatal(err)
	}
	if len(entries) != 2 || !entries[1].Prunable {
		t.Errorf("List after manual delete = %+v, want the worktree prunable", entries)
	}
	if err := Remove(ctx, Git{}, repo, wt2); err != nil {
		t.Errorf("Remove of a worktree deleted by hand: %v", err)
	}
	if entries, _ := List(ctx, Git{}, repo); len(entries) != 1 {
		t.Errorf("List after Remove = %+v", entries)
	}

	wt3 := addWorktree(t, repo, "r3", "main")
	os.RemoveAll(wt3)
	if err := Add(ctx, Git{}, repo, wt3, "aq/job/r3", "main"); err != nil {
		t.Errorf("Add over a worktree deleted by hand: %v", err)
	}

	// A directory that is not a worktree is never deleted.
	plain := filepath.Join(t.TempDir(), "plain")
	testenv.WriteFile(t, filepath.Join(plain, "keep.txt"), "keep\n")
	if err := Remove(ctx, Git{}, repo, plain); err == nil {
		t.Error("Remove of a plain directory succeeded")
	}
	if testenv.ReadFile(t, filepath.Join(plain, "keep.txt")) != "keep\n" {
		t.Error("plain directory touched")
	}
}

func TestListDetachedAndLocked(t *testing.T) {
	testenv.Slow(t, "many real git repositories, worktrees and pushes")
	t.Parallel()
	repo := newRepo(t)
	dir := t.TempDir()
	testenv.Git(t, repo, "worktree", "add", "-q", "--detach", filepath.Join(dir, "det"), "main")
	testenv.Git(t, repo, "worktree", "add", "-q", "-b", "side", filepath.Join(dir, "locked"), "main")
	testenv.Git(t, repo, "worktree", "lock", "--reason", "on a USB disk", filepath.Join(dir, "locked"))
	entries, err := List(ctxT(t), Git{}, repo)
	if err != nil {
		t.Fatal(err)
	}
	if len(entries) != 3 || !entries[1].Detached || entries[1].Branch != "" || entries[1].HEAD == "" ||
		!entries[2].Locked || entries[2].Branch != "side" {
		t.Errorf("List = %+v", entries)
	}
	// A locked worktree is not removed.
	if err := Remove(ctxT(t), Git{}, repo, filepath.Join(dir, "locked")); err == nil {
		t.Error("Remove of a locked worktree succeeded")
	}
}

func TestParseWorktreeList(t *testing.T) {
	t.Parallel()
	out := "worktree /r\x00HEAD 1111\x00branch refs/heads/main\x00\x00" +
		"worktree /r.git\x00bare\x00\x00" +
		"worktree /w/new line\x00HEAD 0000000000000000000000000000000000000000\x00branch refs/heads/aq/job/u\x00prunable gitdir file points to non-existent location\x00\x00"
	got := parseWorktreeList([]byte(out))
	want := []Entry{
		{Path: "/r", HEAD: "1111", Branch: "main"},
		{Path: "/r.git", Bare: true},
		{Path: "/w/new line", Branch: "aq/job/u", Prunable: true},
	}
	if len(got) != len(want) {
		t.Fatalf("got %+v", got)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("entry %d = %+v, want %+v", i, got[i], want[i])
		}
	}
}

func TestResolveRefAndFriends(t *testing.T) {
	testenv.Slow(t, "many real git repositories, worktrees and pushes")
	t.Parallel()
	ctx := ctxT(t)
	repo, _ := newRepoWithOrigin(t)
	head := testenv.Git(t, repo, "rev-parse", "HEAD")

	for _, ref := range []string{"main", "refs/heads/main", "HEAD", head, head[:10]} {
		if sha, ok, err := ResolveRef(ctx, Git{}, repo, ref); err != nil || !ok || sha != head {
			t.Errorf("ResolveRef(%s) = %s %v %v", ref, sha, ok, err)
		}
	}
	for _, ref := range []string{"develop", "refs/heads/aq/wip/none", "--all", "-q"} {
		if sha, ok, err := ResolveRef(ctx, Git{}, repo, ref); err != nil || ok || sha != "" {
			t.Errorf("ResolveRef(%s) = %q %v %v, want not found", ref, sha, ok, err)
		}
	}
	if _, _, err := ResolveRef(ctx, Git{}, t.TempDir(), "main"); err == nil {
		t.Error("ResolveRef in a plain folder: no error")
	}

	if ok, err := BranchExists(ctx, Git{}, repo, "main"); !ok || err != nil {
		t.Errorf("BranchExists(main) = %v %v", ok, err)
	}
	if ok, err := BranchExists(ctx, Git{}, repo, "nope"); ok || err != nil {
		t.Errorf("BranchExists(nope) = %v %v", ok, err)
	}
	if !HasRemote(ctx, Git{}, repo, "origin") || HasRemote(ctx, Git{}, repo, "upstream") || HasRemote(ctx, Git{}, t.TempDir(), "origin") {
		t.Error("HasRemote wrong")
	}

	testenv.Git(t, repo, "commit", "-q", "--allow-empty", "-m", "two")
	if ok, err := IsAncestor(ctx, Git{}, repo, head, "HEAD"); !ok || err != nil {
		t.Errorf("IsAncestor(first, HEAD) = %v %v", ok, err)
	}
	if ok, err := IsAncestor(ctx, Git{}, repo, "HEAD", head); ok || err != nil {
		t.Errorf("IsAncestor(HEAD, first) = %v %v", ok, err)
	}
	if mb, ok, err := MergeBase(ctx, Git{}, repo, "HEAD", head); !ok || err != nil || mb != head {
		t.Errorf("MergeBase = %s %v %v", mb, ok, err)
	}
}
