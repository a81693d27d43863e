package worktree

import (
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/aqfleet/aq/internal/testenv"
)

func TestCommitAll(t *testing.T) {
	testenv.Slow(t, "many real git repositories, worktrees and pushes")
	t.Parallel()
	ctx := ctxT(t)
	repo := newRepo(t)
	wt := addWorktree(t, repo, "ca", "main")
	base := testenv.Git(t, wt, "rev-parse", "HEAD")

	sha, changed, err := CommitAll(ctx, Git{}, wt, "nothing")
	if err != nil || changed || sha != base {
		t.Fatalf("CommitAll on a clean worktree = %s %v %v, want HEAD, unchanged", sha, changed, err)
	}
	testenv.WriteFile(t, filepath.Join(wt, "build", "x.o"), "ignored\n")
	if _, changed, _ := CommitAll(ctx, Git{}, wt, "nothing"); changed {
		t.Error("ignored files made a commit")
	}

	engineEdits(t, wt)
	sha, changed, err = CommitAll(ctx, Git{}, wt, "job: done\n\nbody line")
	if err != nil || !changed {
		t.Fatal(sha, changed, err)
	}
	if got := testenv.Git(t, wt, "rev-parse", "HEAD"); got != sha {
		t.Errorf("HEAD %s, CommitAll said %s", got, sha)
	}
	if p := parents(t, wt, sha); !reflect.DeepEqual(p, []string{base}) {
		t.Errorf("parents = %v, want base", p)
	}
	if got := testenv.Git(t, wt, "log", "-1", "--format=%B", sha); got != "job: done\n\nbody line" {
		t.Errorf("message = %q", got)
	}
	if dirty, err := Dirty(ctx, Git{}, wt); dirty || err != nil {
		t.Errorf("Dirty after CommitAll = %v %v", dirty, err)
	}
	if files := strings.Join(lsTree(t, wt, sha), " "); strings.Contains(files, "old.go") || strings.Contains(files, ".log") || !strings.Contains(files, "日本語.txt") {
		t.Errorf("committed files: %s", files)
	}
	if got := testenv.Git(t, wt, "symbolic-ref", "--short", "HEAD"); got != "aq/job/ca" {
		t.Errorf("branch = %s", got)
	}
}

// A job resumed from WIP checkpoints, with commits of its own, ships as
// base + exactly one commit holding the worktree's final state.
func TestSquashOnto(t *testing.T) {
	testenv.Slow(t, "many real git repositories, worktrees and pushes")
	t.Parallel()
	ctx := ctxT(t)
	repo := newRepo(t)
	base := testenv.Git(t, repo, "rev-parse", "main")
	wt := addWorktree(t, repo, "sq", "main")
	testenv.WriteFile(t, filepath.Join(wt, "a.txt"), "a\n")
	if _, err := Checkpoint(ctx, Git{}, wt, "aq/wip/sq", "wip 1"); err != nil {
		t.Fatal(err)
	}
	testenv.WriteFile(t, filepath.Join(wt, "b.txt"), "b\n")
	if _, err := Checkpoint(ctx, Git{}, wt, "aq/wip/sq", "wip 2"); err != nil {
		t.Fatal(err)
	}
	if err := Remove(ctx, Git{}, repo, wt); err != nil {
		t.Fatal(err)
	}
	wt = filepath.Join(t.TempDir(), "sq")
	if err := Add(ctx, Git{}, repo, wt, "aq/job/sq", "aq/wip/sq"); err != nil {
		t.Fatal(err)
	}
	testenv.Git(t, wt, "commit", "-q", "--allow-empty", "-m", "engine's own commit")
	testenv.WriteFile(t, filepath.Join(wt, "c.txt"), "c\n")
	if _, _, err := CommitAll(ctx, Git{}, wt, "more"); err != nil {
		t.Fatal(err)
	}
	testenv.WriteFile(t, filepath.Join(wt, "d.txt"), "uncommitted\n")
	if n := testenv.Git(t, wt, "rev-list", "--count", base+"..HEAD"); n == "1" {
		t.Fatalf("setup: expected several commits over base, got %s", n)
	}

	sha, changed, err := SquashOnto(ctx, Git{}, wt, base, "job sq")
	if err != nil || !changed {
		t.Fatal(sha, changed, err)
	}
	if n := testenv.Git(t, wt, "rev-list", "--count", base+"..HEAD"); n != "1" {
		t.Errorf("commits over base = %s, want 1", n)
	}
	if p := parents(t, wt, sha); !reflect.DeepEqual(p, []string{base}) {
		t.Errorf("parents = %v, want [base]", p)
	}
	if got := testenv.Git(t, wt, "diff", "--name-only", base, sha); got != "a.txt\nb.txt\nc.txt\nd.txt" {
		t.Errorf("squashed change = %q", got)
	}
	if dirty, _ := Dirty(ctx, Git{}, wt); dirty {
		t.Error("worktree dirty after SquashOnto")
	}

	// A base that is not an ancestor would revert its changes: refused,
	// nothing moved.
	testenv.Git(t, repo, "commit", "-q", "--allow-empty", "-m", "main moved on")
	moved := testenv.Git(t, repo, "rev-parse", "main")
	if _, _, err := SquashOnto(ctx, Git{}, wt, moved, "bad"); err == nil {
		t.Error("SquashOnto onto a non-ancestor succeeded")
	}
	if got := testenv.Git(t, wt, "rev-parse", "HEAD"); got != sha {
		t.Error("a refused SquashOnto moved the branch")
	}
	if _, _, err := SquashOnto(ctx, Git{}, wt, "no-such-ref", "bad"); !errors.Is(err, ErrNoRef) {
		t.Errorf("missing base: %v", err)
	}

	// Nothing left over base: the branch is base, no commit.
	wt2 := addWorktree(t, repo, "sq2", base)
	testenv.WriteFile(t, filepath.Join(wt2, "tmp.txt"), "t\n")
	if _, _, err := CommitAll(ctx, Git{}, wt2, "add"); err != nil {
		t.Fatal(err)
	}
	os.Remove(filepath.Join(wt2, "tmp.txt"))
	sha, changed, err = SquashOnto(ctx, Git{}, wt2, base, "empty")
	if err != nil || changed || sha != base || testenv.Git(t, wt2, "rev-parse", "HEAD") != base {
		t.Errorf("net-empty SquashOnto = %s %v %v, want base unchanged", sha, changed, err)
	}
}

func TestDiffStat(t *testing.T) {
	testenv.Slow(t, "many real git repositories, worktrees and pushes")
	t.Parallel()
	ctx := ctxT(t)
	repo := newRepo(t)
	base := testenv.Git(t, repo, "rev-parse", "HEAD")
	testenv.WriteFile(t, filepath.Join(repo, "src", "main.go"), "package main\n\nfunc main() { run() }\n") // +1 -1
	os.Remove(filepath.Join(repo, "src", "old.go"))                                                        // -2
	testenv.WriteFile(t, filepath.Join(repo, "new file.txt"), "1\n2\n3\n")                                 // +3
	testenv.WriteFile(t, filepath.Join(repo, "logo.png"), "\x89PNG\x00\x01\x02binary")                     // binary
	testenv.Git(t, repo, "add", "-A")
	testenv.Git(t, repo, "commit", "-q", "-m", "change")

	files, added, deleted, err := DiffStat(ctx, Git{}, repo, base, "HEAD")
	if err != nil {
		t.Fatal(err)
	}
	if files != 4 || added != 4 || deleted != 3 {
		t.Errorf("DiffStat = %d files +%d -%d, want 4 files +4 -3", files, added, deleted)
	}
	if f, a, d, err := DiffStat(ctx, Git{}, repo, "HEAD", "HEAD"); f != 0 || a != 0 || d != 0 || err != nil {
		t.Errorf("empty DiffStat = %d %d %d %v", f, a, d, err)
	}
	if _, _, _, err := DiffStat(ctx, Git{}, repo, "nope", "HEAD"); err == nil {
		t.Error("DiffStat from a missing ref: no error")
	}
	if _, _, _, err := parseNumstat([]byte("x\ty\tz\x00")); err == nil {
		t.Error("parseNumstat accepted garbage")
	}
}

func TestDirty(t *testing.T) {
	testenv.Slow(t, "many real git repositories, worktrees and pushes")
	t.Parallel()
	ctx := ctxT(t)
	repo := newRepo(t)
	wt := addWorktree(t, repo, "d", "main")
	check := func(want bool, what string) {
		t.Helper()
		if got, err := Dirty(ctx, Git{}, wt); got != want || err != nil {
			t.Errorf("%s: Dirty = %v %v, want %v", what, got, err, want)
		}
	}
	check(false, "clean")
	testenv.WriteFile(t, filepath.Join(wt, "x.log"), "ignored\n")
	check(false, "ignored file")
	testenv.WriteFile(t, filepath.Join(wt, "x.txt"), "untracked\n")
	check(true, "untracked file")
	os.Remove(filepath.Join(wt, "x.txt"))
	os.Remove(filepath.Join(wt, "README.md"))
	check(true, "deleted file")
	if _, err := Dirty(ctx, Git{}, t.TempDir()); !errors.Is(err, ErrNotRepo) {
		t.Errorf("Dirty of a plain folder = %v", err)
	}
}

func TestPushAndRemoteRefs(t *testing.T) {
	testenv.Slow(t, "many real git repositories, worktrees and pushes")
	t.Parallel()
	ctx := ctxT(t)
	repo, origin := newRepoWithOrigin(t)
	wt := addWorktree(t, repo, "pu", "main")
	testenv.WriteFile(t, filepath.Join(wt, "w.txt"), "wip\n")
	cp, err := Checkpoint(ctx, Git{}, wt, "aq/wip/pu", "wip")
	if err != nil {
		t.Fatal(err)
	}
	job, _, err := CommitAll(ctx, Git{}, wt, "job")
	if err != nil {
		t.Fatal(err)
	}

	if err := Push(ctx, Git{}, repo, "origin", "refs/heads/aq/job/pu:refs/heads/aq/job/pu", "+refs/heads/aq/wip/pu:refs/heads/aq/wip/pu"); err != nil {
		t.Fatal(err)
	}
	ls := testenv.Git(t, repo, "ls-remote", "origin")
	for _, want := range []string{job + "\trefs/heads/aq/job/pu", cp + "\trefs/heads/aq/wip/pu"} {
		if !strings.Contains(ls, want) {
			t.Errorf("ls-remote lacks %q:\n%s", want, ls)
		}
	}
	if sha, ok, err := RemoteRef(ctx, Git{}, repo, "origin", "aq/wip/pu"); sha != cp || !ok || err != nil {
		t.Errorf("RemoteRef = %s %v %v", sha, ok, err)
	}
	if _, ok, err := RemoteRef(ctx, Git{}, repo, "origin", "aq/wip/none"); ok || err != nil {
		t.Errorf("RemoteRef(missing) = %v %v", ok, err)
	}

	// Forcing is allowed only in aq's namespace, and refused before git runs.
	mainBefore := testenv.Git(t, origin, "rev-parse", "main")
	for _, rs := range []string{"+refs/heads/aq/job/pu:refs/heads/main", "+HEAD:main", ":refs/heads/main", "--force", ""} {
		if err := Push(ctx, Git{}, repo, "origin", rs); err == nil {
			t.Errorf("Push(%q) allowed", rs)
		}
	}
	if testenv.Git(t, origin, "rev-parse", "main") != mainBefore {
		t.Fatal("origin main changed")
	}

	// A rewritten job branch pushed without force is a *PushError naming the ref.
	testenv.Git(t, wt, "commit", "-q", "--amend", "-m", "rewritten")
	err = Push(ctx, Git{}, repo, "origin", "refs/heads/aq/job/pu:refs/heads/aq/job/pu")
	var pe *PushError
	var ge *GitError
	if !errors.As(err, &pe) || len(pe.Rejected) != 1 || pe.Rejected[0].Dst != "refs/heads/aq/job/pu" || !errors.As(err, &ge) {
		t.Fatalf("non-fast-forward push = %T %v, want *PushError wrapping *GitError", err, err)
	}
	if strings.ContainsAny(err.Error(), "\n") || !strings.Contains(err.Error(), "non-fast-forward") {
		t.Errorf("PushError message = %q", err)
	}
	// A WIP ref may be force-pushed (it is aq's, and checkpoints are rewritten).
	testenv.WriteFile(t, filepath.Join(wt, "w2.txt"), "more\n")
	cp2, _ := Checkpoint(ctx, Git{}, wt, "aq/wip/pu", "wip")
	if err := Push(ctx, Git{}, repo, "origin", "+refs/heads/aq/wip/pu:refs/heads/aq/wip/pu"); err != nil {
		t.Fatal(err)
	}

	// Another host fetches the checkpoint into a remote-tracking ref.
	other := filepath.Join(t.TempDir(), "other")
	testenv.Git(t, "", "clone", "-q", origin, other)
	if err := Fetch(ctx, Git{}, other, "origin", "+refs/heads/aq/wip/pu:refs/remotes/origin/aq/wip/pu"); err != nil {
		t.Fatal(err)
	}
	if sha, ok, _ := ResolveRef(ctx, Git{}, other, "origin/aq/wip/pu"); !ok || sha != cp2 {
		t.Errorf("fetched wip = %s %v, want %s", sha, ok, cp2)
	}

}
