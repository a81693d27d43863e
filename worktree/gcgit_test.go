package worktree

import (
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"sort"
	"strings"
	"testing"

	"github.com/aqfleet/aq/internal/testenv"
)

// commitOn commits files on branch in repo's main checkout (switching to it
// and back) and returns the commit.
func commitOn(tb testing.TB, repo, branch, msg string, files map[string]string) string {
	tb.Helper()
	cur := testenv.Git(tb, repo, "symbolic-ref", "--short", "HEAD")
	testenv.Git(tb, repo, "checkout", "-q", branch)
	for p, c := range files {
		testenv.WriteFile(tb, filepath.Join(repo, p), c)
	}
	testenv.Git(tb, repo, "add", "-A")
	testenv.Git(tb, repo, "commit", "-q", "-m", msg)
	sha := testenv.Git(tb, repo, "rev-parse", "HEAD")
	testenv.Git(tb, repo, "checkout", "-q", cur)
	return sha
}

// writePackedRefs adds refs to repo's packed-refs file (creating thousands
// of loose refs costs seconds on some file systems; this costs nothing).
func writePackedRefs(tb testing.TB, repo string, refs []Ref) {
	tb.Helper()
	testenv.Git(tb, repo, "pack-refs", "--all")
	path := filepath.Join(repo, ".git", "packed-refs")
	var b strings.Builder
	b.WriteString("# pack-refs with: peeled fully-peeled \n")
	if old, err := os.ReadFile(path); err == nil {
		for _, line := range strings.Split(string(old), "\n") {
			if line != "" && !strings.HasPrefix(line, "#") {
				b.WriteString(line + "\n")
			}
		}
	}
	for _, r := range refs {
		b.WriteString(r.SHA + " " + r.Name + "\n")
	}
	if err := os.WriteFile(path, []byte(b.String()), 0o644); err != nil {
		tb.Fatal(err)
	}
}

func TestListRefInfoAndMergedInto(t *testing.T) {
	testenv.Slow(t, "many real git repositories, worktrees and pushes")
	t.Parallel()
	ctx := ctxT(t)
	repo := newRepo(t)
	testenv.Git(t, repo, "branch", "aq/job/merged", "main")
	testenv.Git(t, repo, "branch", "aq/job/open", "main")
	open := commitOn(t, repo, "aq/job/open", "open work", map[string]string{"a.txt": "a\n"})
	testenv.Git(t, repo, "branch", "other", "main")

	refs, err := ListRefInfo(ctx, Git{}, repo, "refs/heads/aq/")
	if err != nil {
		t.Fatal(err)
	}
	if len(refs) != 2 || refs[0].Name != "refs/heads/aq/job/merged" || refs[1].SHA != open || refs[1].Time.IsZero() {
		t.Fatalf("refs = %+v", refs)
	}
	merged, err := MergedInto(ctx, Git{}, repo, "main", "refs/heads/aq/")
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(merged, map[string]bool{"refs/heads/aq/job/merged": true}) {
		t.Fatalf("merged = %v", merged)
	}
	times, err := CommitTimes(ctx, Git{}, repo, []string{open, strings.Repeat("e", 40)})
	if err != nil || len(times) != 1 || times[open].IsZero() {
		t.Fatalf("CommitTimes = %v, %v; want only the present commit", times, err)
	}
}

// Local deletes are compare-and-swap, refuse checked-out branches and refs
// outside aq/, tell moved and vanished refs apart, and batch.
func TestDeleteRefs(t *testing.T) {
	testenv.Slow(t, "many real git repositories, worktrees and pushes")
	t.Parallel()
	ctx := ctxT(t)
	repo := newRepo(t)
	base := testenv.Git(t, repo, "rev-parse", "main")
	for _, b := range []string{"aq/job/ok", "aq/job/moved", "aq/wip/gone", "aq/job/out"} {
		testenv.Git(t, repo, "branch", b, "main")
	}
	addWorktree(t, repo, "out", "main") // checks out aq/job/out
	moved := commitOn(t, repo, "aq/job/moved", "moved", map[string]string{"m.txt": "m\n"})
	testenv.Git(t, repo, "branch", "-D", "aq/wip/gone")

	res, err := DeleteRefs(ctx, Git{}, repo, []Ref{
		{Name: "refs/heads/aq/job/ok", SHA: base},
		{Name: "refs/heads/aq/job/moved", SHA: base},
		{Name: "refs/heads/aq/wip/gone", SHA: base},
		{Name: "refs/heads/aq/job/out", SHA: base},
		{Name: "refs/heads/main", SHA: base},
	})
	if err != nil {
		t.Fatal(err)
	}
	want := []RefOutcome{RefDeleted, RefChanged, RefGone, RefCheckedOut, RefFailed}
	for i, r := range res {
		if r.Outcome != want[i] {
			t.Errorf("%s: %s (%v), want %s", r.Ref.Name, r.Outcome, r.Err, want[i])
		}
	}
	if res[1].Now != moved {
		t.Errorf("moved ref reported at %s, want %s", res[1].Now, moved)
	}
	if got := testenv.Git(t, repo, "for-each-ref", "--format=%(refname)"); !strings.Contains(got, "refs/heads/aq/job/moved") ||
		!strings.Contains(got, "refs/heads/aq/job/out") || !strings.Contains(got, "refs/heads/main") || strings.Contains(got, "aq/job/ok") {
		t.Errorf("refs after delete:\n%s", got)
	}

	// Many refs: more than one transaction, all deleted.
	var many []Ref
	for i := range 2*refBatch + 7 {
		many = append(many, Ref{Name: fmt.Sprintf("refs/heads/aq/wip/n%04d", i), SHA: base})
	}
	writePackedRefs(t, repo, many)
	res, err = DeleteRefs(ctx, Git{}, repo, many)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range res {
		if r.Outcome != RefDeleted {
			t.Fatalf("%s: %s %v", r.Ref.Name, r.Outcome, r.Err)
		}
	}
	if got := testenv.Git(t, repo, "for-each-ref", "refs/heads/aq/wip/"); got != "" {
		t.Fatalf("left over: %s", got)
	}
}

// Remote deletes use one lease per ref: a ref another clone moved is kept,
// one already gone is reported gone, a ref outside aq/ is never sent.
func TestDeleteRemoteRefs(t *testing.T) {
	testenv.Slow(t, "many real git repositories, worktrees and pushes")
	t.Parallel()
	ctx := ctxT(t)
	repo, origin := newRepoWithOrigin(t)
	base := testenv.Git(t, repo, "rev-parse", "main")
	for _, b := range []string{"aq/job/ok", "aq/wip/moved", "aq/wip/gone"} {
		testenv.Git(t, repo, "branch", b, "main")
		testenv.Git(t, repo, "push", "-q", "origin", b)
	}
	// Another factory moves aq/wip/moved on origin; aq/wip/gone is deleted.
	other := filepath.Join(t.TempDir(), "other")
	testenv.Git(t, "", "clone", "-q", origin, other)
	moved := commitOn(t, other, "main", "elsewhere", map[string]string{"x.txt": "x\n"})
	testenv.Git(t, other, "push", "-q", "origin", "+"+moved+":refs/heads/aq/wip/moved", ":refs/heads/aq/wip/gone")

	res, err := DeleteRemoteRefs(ctx, Git{}, repo, "origin", []Ref{
		{Name: "refs/heads/aq/job/ok", SHA: base},
		{Name: "refs/heads/aq/wip/moved", SHA: base},
		{Name: "refs/heads/aq/wip/gone", SHA: base},
		{Name: "refs/heads/main", SHA: base},
	})
	if err != nil {
		t.Fatal(err)
	}
	want := []RefOutcome{RefDeleted, RefChanged, RefGone, RefFailed}
	for i, r := range res {
		if r.Outcome != want[i] {
			t.Errorf("%s: %s (%v), want %s", r.Ref.Name, r.Outcome, r.Err, want[i])
		}
	}
	if res[1].Now != moved {
		t.Errorf("moved: now %s, want %s", res[1].Now, moved)
	}
	refs := testenv.Git(t, origin, "for-each-ref", "--format=%(refname)")
	if !strings.Contains(refs, "refs/heads/main") || !strings.Contains(refs, "refs/heads/aq/wip/moved") || strings.Contains(refs, "aq/job/ok") {
		t.Errorf("origin refs:\n%s", refs)
	}
	// The push also dropped the remote-tracking ref of what it deleted.
	if _, err := testenv.GitErr(repo, "rev-parse", "--verify", "-q", "refs/remotes/origin/aq/job/ok"); err == nil {
		t.Error("refs/remotes/origin/aq/job/ok survived the delete")
	}

	// A server that cannot push atomically still gets its refs deleted.
	testenv.Git(t, origin, "config", "receive.advertiseAtomic", "false")
	var two []Ref
	for _, b := range []string{"aq/job/a1", "aq/job/a2"} {
		testenv.Git(t, repo, "branch", b, "main")
		testenv.Git(t, repo, "push", "-q", "origin", b)
		two = append(two, Ref{Name: "refs/heads/" + b, SHA: base})
	}
	res, err = DeleteRemoteRefs(ctx, Git{}, repo, "origin", two)
	if err != nil || res[0].Outcome != RefDeleted || res[1].Outcome != RefDeleted {
		t.Fatalf("without atomic pushes: %+v %v", res, err)
	}
}

// Which job branches SquashMerged finds merged by content, and how.
func TestSquashMerged(t *testing.T) {
	testenv.Slow(t, "many real git repositories, worktrees and pushes")
	t.Parallel()
	ctx := ctxT(t)
	repo := newRepo(t)
	branch := func(name string, commits ...map[string]string) string {
		testenv.Git(t, repo, "branch", name, "main")
		var sha string
		for i, files := range commits {
			sha = commitOn(t, repo, name, fmt.Sprintf("%s %d", name, i), files)
		}
		return sha
	}
	squash := func(name string) {
		testenv.Git(t, repo, "merge", "-q", "--squash", name)
		testenv.Git(t, repo, "commit", "-q", "-m", "squash "+name)
	}
	// One commit, squash-merged, then base moved on (GitHub's squash merge).
	one := branch("aq/job/one", map[string]string{"one.txt": "one\n", "README.md": "# repo\nedited by one\n"})
	squash("aq/job/one")
	commitOn(t, repo, "main", "later", map[string]string{"later.txt": "later\n"})
	// Two commits, squash-merged: no single commit carries the change, but
	// merging the branch would change nothing.
	two := branch("aq/job/two", map[string]string{"two.txt": "2a\n"}, map[string]string{"two.txt": "2b\n", "two2.txt": "x\n"})
	squash("aq/job/two")
	// One commit, squash-merged, then its lines edited further on base:
	// merging would conflict, but the squash commit's patch is in base.
	edited := branch("aq/job/edited", map[string]string{"src/main.go": "package main\n\nfunc main() { println(1) }\n"})
	squash("aq/job/edited")
	commitOn(t, repo, "main", "edit", map[string]string{"src/main.go": "package main\n\nfunc main() { println(2) }\n"})
	// One commit, squash-merged after base changed the same file elsewhere:
	// not the same blobs, but the same patch (git patch-id).
	long := func(first, last string) string {
		var b strings.Builder
		b.WriteString(first + "\n")
		for i := range 20 {
			fmt.Fprintf(&b, "line %d\n", i)
		}
		b.WriteString(last + "\n")
		return b.String()
	}
	commitOn(t, repo, "main", "long file", map[string]string{"long.txt": long("top", "bottom")})
	ctxChange := branch("aq/job/context", map[string]string{"long.txt": long("TOP", "bottom")})
	commitOn(t, repo, "main", "edit the other end", map[string]string{"long.txt": long("top", "BOTTOM")})
	squash("aq/job/context")
	// Not merged at all.
	open := branch("aq/job/open", map[string]string{"open.txt": "open\n"})
	// Partly merged: two commits, only the second cherry-picked.
	partFirst := branch("aq/job/part", map[string]string{"p1.txt": "p1\n"})
	_ = partFirst
	part := commitOn(t, repo, "aq/job/part", "part 2", map[string]string{"p2.txt": "p2\n"})
	testenv.Git(t, repo, "cherry-pick", part)

	tip := testenv.Git(t, repo, "rev-parse", "main")
	cands := []string{one, two, edited, open, part, ctxChange}
	got, err := SquashMerged(ctx, Git{}, repo, []string{tip}, cands, SquashOptions{})
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{one: SquashPatchID, two: SquashMergeTree, edited: SquashPatchID, ctxChange: SquashPatchID}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("SquashMerged = %v, want %v (one %s two %s edited %s open %s part %s)", got, want, one[:7], two[:7], edited[:7], open[:7], part[:7])
	}

	// A window too short to reach the candidates' parents: patch ids are not
	// trusted, only merge-tree decides (edited conflicts, so it is kept).
	got, err = SquashMerged(ctx, Git{}, repo, []string{tip}, cands, SquashOptions{Window: 1, Workers: 2})
	if err != nil {
		t.Fatal(err)
	}
	var keys []string
	for k, v := range got {
		keys = append(keys, k[:7]+"="+v)
	}
	sort.Strings(keys)
	want2 := []string{one[:7] + "=" + SquashMergeTree, two[:7] + "=" + SquashMergeTree, ctxChange[:7] + "=" + SquashMergeTree}
	sort.Strings(want2)
	if !reflect.DeepEqual(keys, want2) {
		t.Fatalf("with a 1-commit window: %v, want %v", keys, want2)
	}
}
