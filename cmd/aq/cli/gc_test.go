package cli

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/aqfleet/aq/cmd/aq/clitest"
	"github.com/aqfleet/aq/internal/testenv"
)

func TestGCCommand(t *testing.T) {
	testenv.Slow(t, "runs commands end to end with real git and a coordinator")
	dir := clitest.CleanEnv(t)
	if _, err := exec.LookPath("git"); err != nil {
		t.Skip("git not found")
	}
	t.Setenv("GIT_CONFIG_NOSYSTEM", "1")
	t.Setenv("GIT_CONFIG_GLOBAL", "/dev/null")
	base := filepath.Join(dir, "src")
	t.Setenv("AQ_REPO_BASE", base)
	repo := filepath.Join(base, "shop")
	origin := filepath.Join(dir, "origin.git")
	testenv.Git(t, "", "init", "-q", "-b", "main", repo)
	testenv.Git(t, repo, "commit", "-q", "--allow-empty", "-m", "init")
	testenv.Git(t, "", "init", "-q", "--bare", "-b", "main", origin)
	testenv.Git(t, repo, "remote", "add", "origin", origin)
	for _, b := range []string{"aq/job/merged", "aq/job/protected", "aq/job/open", "feature"} {
		testenv.Git(t, repo, "branch", b, "main")
	}
	testenv.Git(t, repo, "checkout", "-q", "aq/job/open")
	if err := os.WriteFile(filepath.Join(repo, "open.txt"), []byte("open\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	testenv.Git(t, repo, "add", "open.txt")
	testenv.Git(t, repo, "commit", "-q", "-m", "open work")
	testenv.Git(t, repo, "checkout", "-q", "main")
	testenv.Git(t, repo, "push", "-q", "origin", "main", "aq/job/merged", "aq/job/protected", "aq/job/open", "feature")
	// origin refuses to delete one branch (a protected branch, a hook).
	hook := filepath.Join(origin, "hooks", "update")
	if err := os.WriteFile(hook, []byte("#!/bin/sh\n[ \"$1\" = refs/heads/aq/job/protected ] && [ \"$3\" = 0000000000000000000000000000000000000000 ] && { echo protected >&2; exit 1; }\nexit 0\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	refsOf := func(dir string) string {
		return testenv.Git(t, dir, "for-each-ref", "--format=%(refname)", "refs/heads/")
	}
	before := refsOf(repo)

	// --dry-run: every action and why; nothing changes.
	out, errOut, code := runAQ(t, "gc", "--dry-run")
	if code != 0 {
		t.Fatalf("dry run: exit %d, stderr %s", code, errOut)
	}
	for _, want := range []string{
		"delete shop aq/job/merged: merged into main",
		"keep   shop aq/job/open: not merged into main",
		"delete shop origin aq/job/merged: merged into main",
		"would delete 2 job branches, 2 origin refs; keep 1 job branch, 1 origin ref",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("dry run output lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "feature") {
		t.Errorf("a branch outside aq/ is a candidate:\n%s", out)
	}
	if refsOf(repo) != before {
		t.Fatal("--dry-run changed refs")
	}
	out, _, code = runAQ(t, "gc", "--dry-run", "--json")
	var dry struct {
		DryRun  bool
		Deleted map[string]int
		Actions []map[string]any
	}
	if code != 0 || json.Unmarshal([]byte(out), &dry) != nil || !dry.DryRun || dry.Deleted["jobBranches"] != 2 || len(dry.Actions) != 6 {
		t.Fatalf("dry run --json: exit %d\n%s", code, out)
	}

	// A deletion origin refuses: the rest is done, exit 1, one line on
	// stderr.
	out, errOut, code = runAQ(t, "gc")
	if code != 1 || out != "" || !strings.HasPrefix(errOut, "aq: gc: shop origin aq/job/protected: origin refused") || strings.Count(errOut, "\n") != 1 {
		t.Fatalf("exit %d\nstdout %q\nstderr %s", code, out, errOut)
	}
	if got := refsOf(repo); strings.Contains(got, "aq/job/merged") || strings.Contains(got, "aq/job/protected") || !strings.Contains(got, "refs/heads/feature") || !strings.Contains(got, "aq/job/open") {
		t.Errorf("local refs after gc:\n%s", got)
	}
	if got := refsOf(origin); strings.Contains(got, "aq/job/merged") || !strings.Contains(got, "aq/job/protected") || !strings.Contains(got, "refs/heads/feature") {
		t.Errorf("origin refs after gc:\n%s", got)
	}

	// Fixed: quiet on success.
	if err := os.Remove(hook); err != nil {
		t.Fatal(err)
	}
	out, errOut, code = runAQ(t, "gc")
	if code != 0 || out != "" || errOut != "" {
		t.Fatalf("exit %d stdout %q stderr %q", code, out, errOut)
	}
	// Nothing left to do: --json says so; --verbose has nothing to log.
	out, _, code = runAQ(t, "gc", "--json")
	var rep struct {
		DryRun  bool
		Deleted map[string]int
		Kept    map[string]int
		Errors  []string
		Actions []any
	}
	if code != 0 || json.Unmarshal([]byte(out), &rep) != nil || rep.DryRun || rep.Errors == nil || len(rep.Errors) != 0 || rep.Actions != nil {
		t.Fatalf("--json: exit %d\n%s", code, out)
	}
	for k, n := range rep.Deleted {
		if n != 0 {
			t.Errorf("second run deleted %d %s", n, k)
		}
	}
	if rep.Kept["jobBranches"] != 1 || rep.Kept["remoteRefs"] != 1 {
		t.Errorf("kept %v", rep.Kept)
	}
	testenv.Git(t, repo, "branch", "aq/job/done", "main")
	_, errOut, code = runAQ(t, "gc", "--verbose")
	if code != 0 || !strings.Contains(errOut, "gc: deleted") || !strings.Contains(errOut, "aq/job/done") {
		t.Errorf("--verbose: exit %d stderr %q", code, errOut)
	}

	if _, errOut, code := runAQ(t, "gc", "extra"); code != 2 || !strings.HasPrefix(errOut, "aq: ") {
		t.Errorf("gc extra: exit %d %q", code, errOut)
	}
}

// TestGCPool: aq gc reads the pool's settings — AQ_WORKTREE_POOL=0 empties
// the pool, AQ_WORKTREE_POOL_MAX_AGE ages it, a bad AQ_WORKTREE_DISK_MAX is
// one line and exit 2 — and counts pooled worktrees apart.
func TestGCPool(t *testing.T) {
	testenv.Slow(t, "runs commands end to end with real git and a coordinator")
	dir := clitest.CleanEnv(t)
	t.Setenv("GIT_CONFIG_NOSYSTEM", "1")
	t.Setenv("GIT_CONFIG_GLOBAL", "/dev/null")
	base := filepath.Join(dir, "src")
	t.Setenv("AQ_REPO_BASE", base)
	repo := testenv.NewRepo(t, base, "shop", nil)
	pooled := filepath.Join(dir, "aqhome", "worktrees", ".pool", "shop", "0")
	testenv.Git(t, repo, "worktree", "add", "-q", "--detach", pooled, "main")

	out, errOut, code := runAQ(t, "gc", "--dry-run")
	if code != 0 || !strings.Contains(out, "keep   shop pooled worktree "+pooled+": warm for the next job on shop") || !strings.Contains(out, "keep 1 pooled worktree") {
		t.Fatalf("exit %d\n%s%s", code, out, errOut)
	}
	t.Setenv("AQ_WORKTREE_DISK_MAX", "lots")
	if _, errOut, code := runAQ(t, "gc"); code != 2 || !strings.Contains(errOut, "AQ_WORKTREE_DISK_MAX") || strings.Count(errOut, "\n") != 1 {
		t.Fatalf("bad disk max: exit %d %q", code, errOut)
	}
	t.Setenv("AQ_WORKTREE_DISK_MAX", "")
	t.Setenv("AQ_WORKTREE_POOL_MAX_AGE", "1ns")
	if out, _, _ := runAQ(t, "gc", "--dry-run"); !strings.Contains(out, "delete shop pooled worktree "+pooled+": no job took it") {
		t.Errorf("max age:\n%s", out)
	}
	t.Setenv("AQ_WORKTREE_POOL_MAX_AGE", "")
	t.Setenv("AQ_WORKTREE_POOL", "0")
	out, _, code = runAQ(t, "gc", "--json")
	var rep struct{ Deleted map[string]int }
	if code != 0 || json.Unmarshal([]byte(out), &rep) != nil || rep.Deleted["pooledWorktrees"] != 1 {
		t.Fatalf("pool off: exit %d\n%s", code, out)
	}
	if testenv.Exists(pooled) {
		t.Error("the pooled worktree is still there with pooling off")
	}
}
