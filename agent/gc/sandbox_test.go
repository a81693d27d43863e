package gc

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/aqfleet/aq/agent/gc/plan"
	"github.com/aqfleet/aq/agent/queue"
	"github.com/aqfleet/aq/internal/testenv"
	"github.com/aqfleet/aq/job"
	"github.com/aqfleet/aq/worktree"
)

// TestGCSandboxDirs: the sandbox directories a crash left behind
// ($AQ_HOME/sandbox/<id>, with a copy of an engine's login and a directory
// the engine made unreadable) go once their job is neither in flight nor
// waiting for its recovery; the one of a job whose lock another process
// holds stays (even a job this host has no record of), as does the one of
// a job recorded building, and a directory not named after a job. A second
// run deletes nothing.
func TestGCSandboxDirs(t *testing.T) {
	testenv.Slow(t, "builds and collects many real worktrees")
	f := newFactory(t)
	f.newRepo("app")
	clk := &clock{t: time.Now().Add(-time.Hour)}
	q, err := queue.Open(filepath.Join(f.home, "queue"), queue.WithClock(clk.Now), queue.WithOwner("testhost", 4242))
	if err != nil {
		t.Fatal(err)
	}
	l := &localJobs{t: t, q: q, clk: clk}
	l.submit("queued", "app")
	l.submit("orphaned", "app")
	l.take("orphaned") // building, its process gone
	l.run("failed", "app", time.Now().Add(-time.Minute), job.Failed)
	sbDir := filepath.Join(f.home, "sandbox")
	dirs := map[string]string{}
	for _, id := range []string{"queued", "orphaned", "failed", "unknown", "held-unknown", ".not-a-job"} {
		d := filepath.Join(sbDir, id)
		testenv.WriteFile(t, filepath.Join(d, "home", ".claude", ".credentials.json"), `{"token":"secret"}`)
		locked := filepath.Join(d, "home", "locked")
		testenv.WriteFile(t, filepath.Join(locked, "x"), "x")
		if err := os.Chmod(locked, 0); err != nil {
			t.Fatal(err)
		}
		dirs[id] = d
	}
	testenv.WriteFile(t, filepath.Join(sbDir, "stray-file"), "not a directory")
	holdInOtherProcess(t, f.locksDir(), worktree.JobLockName("held-unknown"))

	g := f.gc(func(g *GC) { g.Queue = q; g.Cfg.SandboxDir = sbDir })
	rep, err := g.Run(ctxT(t), false)
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Errors) != 0 {
		t.Fatalf("errors: %v", rep.Errors)
	}
	gone := map[string]bool{"queued": true, "failed": true, "unknown": true}
	for id, d := range dirs {
		if testenv.Exists(d) == gone[id] {
			t.Errorf("%s: exists %v, want %v", id, testenv.Exists(d), !gone[id])
		}
	}
	if !testenv.Exists(filepath.Join(sbDir, "stray-file")) {
		t.Error("a file that is not a sandbox directory was removed")
	}
	if rep.Deleted.Sandboxes != 3 || rep.Kept.Sandboxes != 3 {
		t.Fatalf("deleted %d, kept %d sandbox directories; want 3 and 3", rep.Deleted.Sandboxes, rep.Kept.Sandboxes)
	}
	rules := map[string]plan.Rule{}
	for _, a := range rep.Actions {
		if a.Kind == plan.KindSandbox {
			rules[a.Job] = a.Rule
		}
	}
	for id, want := range map[string]plan.Rule{"orphaned": plan.RuleOrphaned, "held-unknown": plan.RuleInFlight, ".not-a-job": plan.RuleNotJobRef, "queued": plan.RuleStale} {
		if rules[id] != want {
			t.Errorf("%s: rule %s, want %s", id, rules[id], want)
		}
	}

	again, err := g.Run(ctxT(t), false)
	if err != nil {
		t.Fatal(err)
	}
	if again.Deleted.Total() != 0 || len(again.Errors) != 0 {
		t.Fatalf("the second run: deleted %+v, errors %v", again.Deleted, again.Errors)
	}
}

// TestGCSandboxJobStartsAfterThePlan: a job that takes its lock between
// the plan and the deletion keeps its sandbox directory.
func TestGCSandboxJobStartsAfterThePlan(t *testing.T) {
	f := newFactory(t)
	sbDir := filepath.Join(f.home, "sandbox")
	d := filepath.Join(sbDir, "late")
	testenv.WriteFile(t, filepath.Join(d, "home", "x"), "x")
	g := f.gc(func(g *GC) { g.Cfg.SandboxDir = sbDir })
	snap, err := g.Gather(ctxT(t))
	if err != nil {
		t.Fatal(err)
	}
	decided := plan.Plan(time.Now(), snap.State, g.Cfg.Policy)
	if n := len(decided.Deletes()); n != 1 {
		t.Fatalf("planned %d deletions, want 1", n)
	}
	holdInOtherProcess(t, f.locksDir(), worktree.JobLockName("late"))
	rep := g.Execute(ctxT(t), snap, decided)
	if !testenv.Exists(d) || rep.Deleted.Sandboxes != 0 || rep.Actions[0].Detail != "job late started since the plan" {
		t.Fatalf("exists %v, deleted %d, %q", testenv.Exists(d), rep.Deleted.Sandboxes, rep.Actions[0].Detail)
	}
}

// TestGCStaleCgroups: gc hands its liveness check to the job cgroups'
// collector (sandbox.RemoveStaleCgroups; its real-cgroup test is in
// internal/sandbox), counts what it removed, and reports its error as
// gc's; a dry run removes nothing.
func TestGCStaleCgroups(t *testing.T) {
	testenv.Slow(t, "builds and collects many real worktrees")
	f := newFactory(t)
	f.newRepo("app")
	calls := 0
	g := f.gc(func(g *GC) {
		g.Alive = func(pid int) bool { return pid == 7 }
		g.StaleCgroups = func(alive func(int) bool) ([]string, error) {
			calls++
			if !alive(7) || alive(8) {
				t.Error("gc's liveness check was not handed over")
			}
			return []string{"/cg/memory/aq-job-8-1", "/cg/pids/aq-job-8-1"}, errors.New("remove /cg/memory/aq-job-9-1: device or resource busy")
		}
	})
	if rep, err := g.Run(ctxT(t), true); err != nil || calls != 0 || rep.Deleted.Cgroups != 0 {
		t.Fatalf("dry run: %v, %d calls, %d deleted", err, calls, rep.Deleted.Cgroups)
	}
	rep, err := g.Run(ctxT(t), false)
	if err != nil {
		t.Fatal(err)
	}
	if calls != 1 || rep.Deleted.Cgroups != 2 || len(rep.Errors) != 1 || !strings.Contains(rep.Errors[0], "job cgroups: remove /cg/memory/aq-job-9-1") {
		t.Errorf("%d calls, deleted %d, errors %q", calls, rep.Deleted.Cgroups, rep.Errors)
	}
}
