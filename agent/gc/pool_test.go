package gc

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/aqfleet/aq/agent/gc/plan"
	"github.com/aqfleet/aq/internal/testenv"
	"github.com/aqfleet/aq/worktree"
)

// pooledAt puts a worktree of a finished job into repo's pool and dates its
// pooling ago.
func (f *factory) pooledAt(repo, id string, ago time.Duration) string {
	t := f.t
	ctx := ctxT(t)
	wt := f.runJob(repo, id, time.Now(), map[string]string{id + ".txt": id}, true)
	pool := worktree.Pool{Dir: worktree.PoolDir(f.worktreesDir(), repo), Size: 10}
	dest, err := pool.Put(ctx, worktree.Git{}, f.repoDir(repo), wt)
	if err != nil || dest == "" {
		t.Fatalf("put %s: %q %v", id, dest, err)
	}
	at := time.Now().Add(-ago)
	if err := os.Chtimes(dest, at, at); err != nil {
		t.Fatal(err)
	}
	return dest
}

func actionFor(t *testing.T, rep *Report, path string) Action {
	t.Helper()
	for _, a := range rep.Actions {
		if a.Name == path {
			return a
		}
	}
	t.Fatalf("no action for %s in %+v", path, rep.Actions)
	return Action{}
}

// TestGCTrimsThePool: gc removes the pooled worktrees no job took for
// AQ_WORKTREE_POOL_MAX_AGE, those beyond the pool's size (oldest first) and
// folders set aside in the pool; it keeps the rest warm, and keeps all of
// them while a job holds the repository's lock.
func TestGCTrimsThePool(t *testing.T) {
	testenv.Slow(t, "builds and collects many real worktrees")
	f := newFactory(t)
	f.newRepo("app")
	old := f.pooledAt("app", "j-old", 100*time.Hour)
	older := f.pooledAt("app", "j-2h", 2*time.Hour)
	newest := f.pooledAt("app", "j-1h", time.Hour)
	aside := filepath.Join(worktree.PoolDir(f.worktreesDir(), "app"), ".discard-123", "w")
	testenv.WriteFile(t, filepath.Join(aside, "junk.txt"), "x\n")
	policy := func(g *GC) {
		g.Cfg.Policy.PoolMaxAge, g.Cfg.Policy.PoolSize = 72*time.Hour, 1
	}

	// A job runs in app: nothing in its pool is touched.
	t.Run("repo locked", func(t *testing.T) {
		holdInOtherProcess(t, f.locksDir(), "app")
		rep, err := f.gc(policy).Run(ctxT(t), false)
		if err != nil {
			t.Fatal(err)
		}
		if rep.Deleted.Pooled != 0 || rep.Kept.Pooled != 4 {
			t.Fatalf("while the repo lock is held: deleted %+v kept %+v", rep.Deleted, rep.Kept)
		}
	})

	dry, err := f.gc(policy).Run(ctxT(t), true)
	if err != nil {
		t.Fatal(err)
	}
	for path, rule := range map[string]plan.Rule{old: plan.RulePoolAge, older: plan.RulePoolFull, newest: plan.RulePooled, filepath.Dir(aside): plan.RuleSetAside} {
		if a := actionFor(t, dry, path); a.Rule != rule {
			t.Errorf("%s: rule %s (%s), want %s", path, a.Rule, a.Reason, rule)
		}
	}
	rep, err := f.gc(policy).Run(ctxT(t), false)
	if err != nil || len(rep.Errors) > 0 {
		t.Fatalf("%v %v", err, rep.Errors)
	}
	for _, a := range rep.Actions {
		t.Logf("%s %s %s: %s %s", a.Result, a.Rule, a.Label(), a.Reason, a.Detail)
	}
	if rep.Deleted.Pooled != 3 || rep.Kept.Pooled != 1 {
		t.Errorf("deleted %+v kept %+v", rep.Deleted, rep.Kept)
	}
	for _, p := range []string{old, older, filepath.Dir(aside)} {
		if testenv.Exists(p) {
			t.Errorf("%s is still there", p)
		}
	}
	if !testenv.Exists(newest) {
		t.Error("the newest pooled worktree went")
	}
	list := testenv.Git(t, f.repoDir("app"), "worktree", "list", "--porcelain")
	if strings.Count(list, "worktree ") != 2 {
		t.Errorf("registered worktrees:\n%s", list)
	}
	// The pooled worktrees' job branches were not checked out: merged ones
	// can go in the same run.
	again, _ := f.gc(policy).Run(ctxT(t), false)
	if again.Deleted.Total() != 0 {
		t.Errorf("a second run deleted %+v", again.Deleted)
	}
}

// TestGCDiskCeiling: over AQ_WORKTREE_DISK_MAX, pooled worktrees go, oldest
// first, and a running job's worktree stays whatever it weighs.
func TestGCDiskCeiling(t *testing.T) {
	testenv.Slow(t, "builds and collects many real worktrees")
	f := newFactory(t)
	f.newRepo("app")
	f.newRepo("lib")
	a := f.pooledAt("app", "a1", 3*time.Hour)
	b := f.pooledAt("lib", "b1", 2*time.Hour)
	c := f.pooledAt("app", "c1", time.Hour)
	running := f.runJob("lib", "run1", time.Now(), map[string]string{"big.bin": strings.Repeat("x", 1<<20)}, false)
	holdInOtherProcess(t, f.locksDir(), "jobs/run1")
	size, err := worktree.DiskUsage(c)
	if err != nil {
		t.Fatal(err)
	}
	runSize, _ := worktree.DiskUsage(running)
	// Room for the running job and one pooled worktree.
	limit := runSize + size + size/2
	rep, err := f.gc(func(g *GC) { g.Cfg.Policy.DiskMax = limit }).Run(ctxT(t), false)
	if err != nil || len(rep.Errors) > 0 {
		t.Fatalf("%v %v", err, rep.Errors)
	}
	for _, a := range rep.Actions {
		t.Logf("%s %s %s: %s %s", a.Result, a.Rule, a.Label(), a.Reason, a.Detail)
	}
	t.Logf("disk %+v", rep.Disk)
	if testenv.Exists(a) || testenv.Exists(b) || !testenv.Exists(c) || !testenv.Exists(running) {
		t.Errorf("after gc: oldest %v, middle %v, newest %v, running %v; want only the newest pooled and the running one",
			testenv.Exists(a), testenv.Exists(b), testenv.Exists(c), testenv.Exists(running))
	}
	if rep.Disk == nil || rep.Disk.After > limit || rep.Disk.Used <= limit {
		t.Errorf("disk plan %+v, limit %d", rep.Disk, limit)
	}
	// A ceiling below the running job alone empties the pool and says so.
	rep, _ = f.gc(func(g *GC) { g.Cfg.Policy.DiskMax = 1 }).Run(ctxT(t), false)
	if testenv.Exists(c) || !testenv.Exists(running) {
		t.Error("the pool should be empty and the running job's worktree kept")
	}
	if len(rep.Warnings) == 0 || !strings.Contains(strings.Join(rep.Warnings, "\n"), "AQ_WORKTREE_DISK_MAX") {
		t.Errorf("no warning that the ceiling cannot be met: %v", rep.Warnings)
	}
}

// TestGCPooledTakenSincePlan: a pooled worktree a job took (or used)
// between the plan and its removal is kept.
func TestGCPooledTakenSincePlan(t *testing.T) {
	testenv.Slow(t, "builds and collects many real worktrees")
	f := newFactory(t)
	dir := f.newRepo("app")
	taken := f.pooledAt("app", "t1", 100*time.Hour)
	reused := f.pooledAt("app", "t2", 100*time.Hour)
	g := f.gc(func(g *GC) { g.Cfg.Policy.PoolMaxAge = time.Hour })
	snap, err := g.Gather(ctxT(t))
	if err != nil {
		t.Fatal(err)
	}
	decided := plan.Plan(time.Now(), snap.State, g.Cfg.Policy)
	// Meanwhile a job takes one, and another goes out and comes back.
	jobPath := f.wtPath("app", "new-job")
	os.MkdirAll(filepath.Dir(jobPath), 0o755)
	testenv.Git(t, dir, "worktree", "move", taken, jobPath)
	now := time.Now()
	os.Chtimes(reused, now, now)
	rep := g.Execute(ctxT(t), snap, decided)
	if rep.Deleted.Pooled != 0 {
		t.Errorf("deleted %+v; want nothing: %+v", rep.Deleted, rep.Actions)
	}
	if !testenv.Exists(jobPath) || !testenv.Exists(reused) {
		t.Error("a worktree in use was removed")
	}
}
