package worktree

import (
	"context"
	"errors"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/aqfleet/aq/internal/testenv"
)

func TestPushWithLease(t *testing.T) {
	testenv.Slow(t, "many real git repositories, worktrees and pushes")
	ctx := context.Background()
	g := Git{}
	origin, repo, run, a, b := leaseFixture(t)
	wip := "refs/heads/aq/wip/j1"

	run(repo, "update-ref", wip, a)
	if err := PushWithLease(ctx, g, repo, "origin", wip, wip, ""); err != nil {
		t.Fatalf("first push (expect absent): %v", err)
	}
	// Another factory moved it to b meanwhile; our lease (expect absent, or a)
	// still holds only for the right value.
	run(repo, "update-ref", wip, b)
	if err := PushWithLease(ctx, g, repo, "origin", wip, wip, ""); err == nil {
		t.Fatal("push expecting absence replaced an existing ref")
	}
	if err := PushWithLease(ctx, g, repo, "origin", wip, wip, b); err == nil {
		t.Fatal("push with a stale expectation replaced the ref")
	} else {
		var pe *PushError
		if !errors.As(err, &pe) {
			t.Fatalf("want a *PushError, got %T %v", err, err)
		}
	}
	if got := run(origin, "rev-parse", wip); got != a {
		t.Fatalf("origin moved to %s", got)
	}
	if err := PushWithLease(ctx, g, repo, "origin", wip, wip, a); err != nil {
		t.Fatalf("push with the right expectation: %v", err)
	}
	if got := run(origin, "rev-parse", wip); got != b {
		t.Fatalf("origin at %s, want %s", got, b)
	}
	if err := PushWithLease(ctx, g, repo, "origin", "refs/heads/main", "refs/heads/main", ""); err == nil {
		t.Fatal("force-pushed outside aq/")
	}
}

// TestPushAtomicWithLease: the WIP checkpoint and the job branch go in one
// push (#35); a stale lease on either refuses both — nothing of the push
// lands, and the refusal is a *PushError naming the stale ref.
func TestPushAtomicWithLease(t *testing.T) {
	testenv.Slow(t, "many real git repositories, worktrees and pushes")
	ctx := context.Background()
	g := Git{}
	origin, repo, run, a, b := leaseFixture(t)
	wip, jb := "refs/heads/aq/wip/j1", "refs/heads/aq/job/j1"
	remote := func(ref string) string {
		out, _ := exec.Command("git", "-C", origin, "rev-parse", "-q", "--verify", ref).Output()
		return strings.TrimSpace(string(out))
	}

	run(repo, "update-ref", wip, a)
	run(repo, "update-ref", jb, a)
	if err := PushAtomicWithLease(ctx, g, repo, "origin", Lease{wip, wip, ""}, Lease{jb, jb, ""}); err != nil {
		t.Fatalf("first push (both absent): %v", err)
	}
	if remote(wip) != a || remote(jb) != a {
		t.Fatalf("origin has wip %q, job %q; want both %s", remote(wip), remote(jb), a)
	}
	// The job branch's lease is stale (origin has a, not absent): neither
	// ref moves.
	run(repo, "update-ref", wip, b)
	run(repo, "update-ref", jb, b)
	err := PushAtomicWithLease(ctx, g, repo, "origin", Lease{wip, wip, a}, Lease{jb, jb, ""})
	var pe *PushError
	if !errors.As(err, &pe) {
		t.Fatalf("stale lease on one ref: err %v, want a *PushError", err)
	}
	if remote(wip) != a || remote(jb) != a {
		t.Fatalf("a refused atomic push moved a ref: wip %q, job %q", remote(wip), remote(jb))
	}
	stale := false
	for _, r := range pe.Rejected {
		stale = stale || (r.Dst == jb && strings.Contains(r.Summary, "stale info"))
	}
	if !stale {
		t.Fatalf("the refusal does not name the stale job branch: %+v", pe.Rejected)
	}
	if err := PushAtomicWithLease(ctx, g, repo, "origin", Lease{wip, wip, a}, Lease{jb, jb, a}); err != nil {
		t.Fatalf("push with both leases right: %v", err)
	}
	if remote(wip) != b || remote(jb) != b {
		t.Fatalf("origin has wip %q, job %q; want both %s", remote(wip), remote(jb), b)
	}
	if err := PushAtomicWithLease(ctx, g, repo, "origin", Lease{"main", "refs/heads/main", ""}); err == nil {
		t.Fatal("an atomic push outside aq/ was not refused")
	}
}

// leaseFixture is a repository (two commits on main, a then b) with a
// bare origin that has none of them, and run, which runs git in a folder.
func leaseFixture(t *testing.T) (origin, repo string, run func(dir string, args ...string) string, a, b string) {
	t.Helper()
	dir := t.TempDir()
	origin = filepath.Join(dir, "origin.git")
	repo = filepath.Join(dir, "repo")
	run = func(d string, args ...string) string {
		t.Helper()
		cmd := exec.Command("git", args...)
		cmd.Dir = d
		cmd.Env = append(cmd.Environ(), "GIT_AUTHOR_NAME=t", "GIT_AUTHOR_EMAIL=t@t", "GIT_COMMITTER_NAME=t", "GIT_COMMITTER_EMAIL=t@t")
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("git %v: %v\n%s", args, err, out)
		}
		return strings.TrimSpace(string(out))
	}
	run(dir, "init", "-q", "--bare", origin)
	run(dir, "init", "-q", "-b", "main", repo)
	run(repo, "commit", "-q", "--allow-empty", "-m", "one")
	a = run(repo, "rev-parse", "HEAD")
	run(repo, "commit", "-q", "--allow-empty", "-m", "two")
	b = run(repo, "rev-parse", "HEAD")
	run(repo, "remote", "add", "origin", origin)
	return origin, repo, run, a, b
}
