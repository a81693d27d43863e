package gc

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aqfleet/aq/agent/gc/plan"
	"github.com/aqfleet/aq/agent/jobstate"
	"github.com/aqfleet/aq/agent/queue"
	"github.com/aqfleet/aq/internal/testenv"
	"github.com/aqfleet/aq/job"
	"github.com/aqfleet/aq/worktree"
)

// clock is the queue's injected clock: jobs end when the test says.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) Now() time.Time      { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *clock) Set(t time.Time)     { c.mu.Lock(); c.t = t; c.mu.Unlock() }
func (c *clock) Add(d time.Duration) { c.Set(c.Now().Add(d)) }

// localJobs drives the real local queue through a job's life.
type localJobs struct {
	t   *testing.T
	q   *queue.Queue
	clk *clock
}

func (l *localJobs) submit(id, repo string) {
	l.t.Helper()
	j := &job.Job{ID: id, Title: id, Repo: repo, Base: "main", Engine: "script", Priority: job.PriorityNormal,
		PriorityName: "normal", DepsMode: "all", Ship: "pr", Body: "do " + id}
	if _, err := l.q.Submit(j, []byte("---\nrepo: "+repo+"\n---\n# "+id+"\n")); err != nil {
		l.t.Fatal(err)
	}
}

// take starts job id (it goes to building).
func (l *localJobs) take(id string) {
	l.t.Helper()
	if _, err := l.q.Next(func(s queue.State) bool { return s.ID == id }); err != nil {
		l.t.Fatal(err)
	}
}

// run takes job id at start and ends it at end in stage (review, shipped,
// ...) or, for failed/dead_letter, with a failure.
func (l *localJobs) run(id, repo string, end time.Time, stage job.Stage) {
	l.t.Helper()
	l.clk.Set(end.Add(-time.Hour))
	l.submit(id, repo)
	l.take(id)
	l.clk.Set(end)
	var err error
	switch stage {
	case job.Failed:
		_, err = l.q.Fail(id, job.ReasonFenced, "fenced", nil)
	case job.DeadLetter:
		_, err = l.q.Fail(id, job.ReasonVerifyFailed, "verify failed", nil)
	case job.Shipped:
		err = l.q.Finish(id, job.Review, func(s *queue.State) { s.PR = "https://github.com/acme/" + repo + "/pull/1" })
		if err == nil {
			err = l.q.Move(id, job.Shipped, nil)
		}
	default:
		err = l.q.Finish(id, stage, nil)
	}
	if err != nil {
		l.t.Fatal(err)
	}
}

// The cases, in real repositories with a bare origin, run twice.
func TestGCEveryCase(t *testing.T) {
	testenv.Slow(t, "builds and collects many real worktrees")
	t.Parallel()
	ctx := ctxT(t)
	f := newFactory(t)
	now := time.Now().UTC().Truncate(time.Second)
	daysAgo := func(n int) time.Time { return now.Add(-time.Duration(n) * 24 * time.Hour) }

	clk := &clock{t: daysAgo(60)}
	q, err := queue.Open(filepath.Join(f.home, "queue"), queue.WithClock(clk.Now), queue.WithOwner("testhost", 4242))
	if err != nil {
		t.Fatal(err)
	}
	lj := &localJobs{t: t, q: q, clk: clk}
	recs, err := jobstate.Open(filepath.Join(f.home, "state", "jobs"))
	if err != nil {
		t.Fatal(err)
	}

	web := f.newRepo("webapp")
	api := f.newRepo("api")

	// Merged job branch: the PR was merged on origin with a merge commit.
	f.runJob("webapp", "merged", daysAgo(5), map[string]string{"merged.txt": "merged\n"}, true)
	f.push("webapp", "aq/job/merged", "aq/wip/merged")
	lj.run("merged", "webapp", daysAgo(5), job.Review)
	f.onOrigin("webapp", func(c string) { testenv.Git(t, c, "merge", "-q", "--no-ff", "-m", "Merge PR", "origin/aq/job/merged") })

	// Unmerged job branch: its PR is still open.
	f.runJob("webapp", "unmerged", daysAgo(4), map[string]string{"unmerged.txt": "open\n"}, true)
	f.push("webapp", "aq/job/unmerged")
	lj.run("unmerged", "webapp", daysAgo(4), job.Review)

	// Job branch merged by squash (ship: merge, GitHub's default for bots),
	// then main moved on.
	f.runJob("webapp", "squashed", daysAgo(3), map[string]string{"squashed.txt": "squash me\n", "src/app.go": "package app\n\nfunc A() int { return 2 }\n"}, true)
	f.push("webapp", "aq/job/squashed", "aq/wip/squashed")
	lj.run("squashed", "webapp", daysAgo(3), job.Review)
	f.onOrigin("webapp", func(c string) {
		testenv.Git(t, c, "merge", "-q", "--squash", "origin/aq/job/squashed")
		testenv.Git(t, c, "commit", "-q", "-m", "Squashed job (#2)")
		testenv.WriteFile(t, filepath.Join(c, "later.txt"), "later\n")
		testenv.Git(t, c, "add", "-A")
		testenv.Git(t, c, "commit", "-q", "-m", "later work")
	})

	// WIP of a shipped job (ship: branch; its branch stays unmerged).
	f.runJob("webapp", "shipped", daysAgo(2), map[string]string{"shipped.txt": "shipped\n"}, true)
	f.push("webapp", "aq/job/shipped", "aq/wip/shipped")
	lj.run("shipped", "webapp", daysAgo(2), job.Shipped)

	// WIP of a recently failed job; its worktree still holds the (already
	// checkpointed) work.
	f.runJob("webapp", "failed-recent", daysAgo(2), map[string]string{"half.txt": "half done\n"}, false)
	lj.run("failed-recent", "webapp", daysAgo(2), job.DeadLetter)

	// WIP of a job that failed long ago (its worktree was removed then).
	wt := f.runJob("webapp", "failed-old", daysAgo(30), map[string]string{"old.txt": "old attempt\n"}, false)
	if err := worktree.Remove(ctx, worktree.Git{}, web, wt); err != nil {
		t.Fatal(err)
	}
	f.push("webapp", "aq/wip/failed-old")
	lj.run("failed-old", "webapp", daysAgo(30), job.Failed)

	// A job that runs: another process holds its job lock. Its branch is
	// still at main (merged, by ancestry) — it must not matter.
	f.runJob("webapp", "running", now, map[string]string{"wip.txt": "in progress\n"}, false)
	lj.submit("running", "webapp")
	lj.take("running")
	holder := holdInOtherProcess(t, f.locksDir(), worktree.JobLockName("running"))

	// A worktree with uncommitted files whose job is dead: files written
	// after its last checkpoint.
	wt = f.runJob("webapp", "dead-dirty", daysAgo(30), map[string]string{"dd.txt": "checkpointed\n"}, false)
	lj.run("dead-dirty", "webapp", daysAgo(30), job.DeadLetter)
	testenv.WriteFile(t, filepath.Join(wt, "unsaved.txt"), "never checkpointed\n")
	testenv.WriteFile(t, filepath.Join(wt, "dd.txt"), "changed after the checkpoint\n")

	// Fleet jobs, from the factory's records: one shipped (WIP on origin
	// too), one orphaned (its process is gone), one whose process lives.
	f.runJob("webapp", "fleet-shipped", daysAgo(1), map[string]string{"fs.txt": "fs\n"}, false)
	wt = f.wtPath("webapp", "fleet-shipped")
	if err := worktree.Remove(ctx, worktree.Git{}, web, wt); err != nil {
		t.Fatal(err)
	}
	f.push("webapp", "aq/wip/fleet-shipped")
	f.runJob("webapp", "fleet-orphan", now, map[string]string{"fo.txt": "fo\n"}, false)
	f.runJob("webapp", "fleet-live", now, map[string]string{"fl.txt": "fl\n"}, false)
	dead := exec.Command("true")
	if err := dead.Run(); err != nil {
		t.Fatal(err)
	}
	for _, r := range []jobstate.Record{
		{ID: "fleet-shipped", Repo: "webapp", Base: "main", Stage: job.Shipped, StartedAt: daysAgo(1).Add(-time.Hour), EndedAt: daysAgo(1)},
		{ID: "fleet-orphan", Repo: "webapp", Base: "main", Stage: job.Building, PID: dead.Process.Pid, StartedAt: now},
		{ID: "fleet-live", Repo: "webapp", Base: "main", Stage: job.Building, PID: holder, StartedAt: now},
	} {
		if err := recs.Put(r); err != nil {
			t.Fatal(err)
		}
	}

	// Refs that are not aq's, merged or not, and a WIP ref of a job no
	// record knows.
	testenv.Git(t, web, "branch", "feature/x", "main")
	f.push("webapp", "feature/x")
	testenv.Git(t, web, "branch", "aqx/not-ours", "main")
	testenv.Git(t, web, "update-ref", "refs/heads/aq/wip/mystery", testenv.Git(t, web, "rev-parse", "aq/wip/failed-recent"))

	// A second repository whose repo lock another process holds: a job runs
	// there, so none of its worktrees is touched; its refs still are.
	f.runJob("api", "docs", daysAgo(2), map[string]string{"docs.md": "docs\n"}, true)
	lj.run("docs", "api", daysAgo(2), job.Shipped)
	holdInOtherProcess(t, f.locksDir(), worktree.RepoLockName("api"))

	// A stale worktree whose directory was deleted by hand (last: making a
	// worktree prunes the registrations of missing ones).
	wt = f.runJob("webapp", "hand-deleted", daysAgo(3), map[string]string{"x.txt": "x\n"}, false)
	if err := os.RemoveAll(wt); err != nil {
		t.Fatal(err)
	}
	lj.run("hand-deleted", "webapp", daysAgo(3), job.DeadLetter)

	webBefore, originBefore, apiBefore := testenv.RemoteRefs(t, web, "refs/"), testenv.RemoteRefs(t, f.originDir("webapp"), "refs/"), testenv.RemoteRefs(t, api, "refs/")
	g := f.gc(func(g *GC) { g.Queue, g.Records = q, recs })

	// A dry run changes nothing and announces what the run will do.
	dry, err := g.Run(ctx, true)
	if err != nil {
		t.Fatal(err)
	}
	// (It fetched origin's main into refs/remotes/origin/main, as git fetch
	// would; no branch changed.)
	if got := testenv.RemoteRefs(t, web, "refs/"); !equalMaps(heads(got), heads(webBefore)) {
		t.Fatal("--dry-run changed refs")
	}

	rep, err := g.Run(ctx, false)
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Errors) != 0 {
		t.Fatalf("errors: %v", rep.Errors)
	}
	if dry.Deleted.Total() != rep.Deleted.Total()+1 { // the dirty WIP ref moved when checkpointed
		t.Errorf("dry run would delete %+v, the run deleted %+v", dry.Deleted, rep.Deleted)
	}

	webAfter, originAfter, apiAfter := testenv.RemoteRefs(t, web, "refs/"), testenv.RemoteRefs(t, f.originDir("webapp"), "refs/"), testenv.RemoteRefs(t, api, "refs/")
	gone := func(m map[string]string, names ...string) {
		t.Helper()
		for _, n := range names {
			if _, ok := m["refs/heads/"+n]; ok {
				t.Errorf("%s should have been deleted", n)
			}
		}
	}
	same := func(before, after map[string]string, names ...string) {
		t.Helper()
		for _, n := range names {
			full := "refs/heads/" + n
			if before[full] == "" || after[full] != before[full] {
				t.Errorf("%s should be kept as it was (%q -> %q)", n, before[full], after[full])
			}
		}
	}
	gone(webAfter, "aq/job/merged", "aq/wip/merged", "aq/job/squashed", "aq/wip/squashed", "aq/wip/shipped",
		"aq/wip/failed-old", "aq/job/hand-deleted", "aq/job/dead-dirty", "aq/job/failed-old", "aq/wip/fleet-shipped",
		"aq/job/failed-recent", "aq/job/fleet-shipped")
	same(webBefore, webAfter, "main", "feature/x", "aqx/not-ours", "aq/job/unmerged", "aq/wip/unmerged", "aq/job/shipped",
		"aq/wip/failed-recent", "aq/job/running", "aq/wip/running", "aq/wip/mystery", "aq/wip/hand-deleted",
		"aq/job/fleet-orphan", "aq/wip/fleet-orphan", "aq/job/fleet-live", "aq/wip/fleet-live")
	gone(originAfter, "aq/job/merged", "aq/wip/merged", "aq/job/squashed", "aq/wip/squashed", "aq/wip/shipped",
		"aq/wip/failed-old", "aq/wip/fleet-shipped")
	same(originBefore, originAfter, "main", "feature/x", "aq/job/unmerged", "aq/job/shipped")
	gone(apiAfter, "aq/wip/docs")
	same(apiBefore, apiAfter, "main", "aq/job/docs")

	// The dead job's unsaved files were checkpointed before its worktree
	// went: the WIP ref moved (so its planned deletion did not happen).
	if webAfter["refs/heads/aq/wip/dead-dirty"] == webBefore["refs/heads/aq/wip/dead-dirty"] {
		t.Error("aq/wip/dead-dirty was not checkpointed (or was deleted)")
	}
	for p, want := range map[string]string{"unsaved.txt": "never checkpointed\n", "dd.txt": "changed after the checkpoint\n"} {
		if got := testenv.Git(t, web, "show", "aq/wip/dead-dirty:"+p); got+"\n" != want {
			t.Errorf("aq/wip/dead-dirty:%s = %q, want %q", p, got, want)
		}
	}
	if rep.Checkpointed < 1 {
		t.Errorf("checkpointed = %d", rep.Checkpointed)
	}

	// Worktrees: the running, orphaned, live-fleet and api ones stay; the
	// rest are gone, and git no longer lists them.
	list := testenv.Git(t, web, "worktree", "list", "--porcelain")
	for _, id := range []string{"running", "fleet-orphan", "fleet-live"} {
		if _, err := os.Stat(f.wtPath("webapp", id)); err != nil || !strings.Contains(list, f.wtPath("webapp", id)) {
			t.Errorf("worktree %s should be kept: %v", id, err)
		}
	}
	for _, id := range []string{"merged", "unmerged", "squashed", "shipped", "failed-recent", "hand-deleted", "dead-dirty"} {
		if _, err := os.Stat(f.wtPath("webapp", id)); err == nil || strings.Contains(list, f.wtPath("webapp", id)) {
			t.Errorf("worktree %s should be gone (stat err %v)\n%s", id, err, list)
		}
	}
	if _, err := os.Stat(f.wtPath("api", "docs")); err != nil {
		t.Error("a worktree of a repository whose lock is held was removed")
	}

	// Job branches: merged, squashed, and five that never left main
	// (hand-deleted, dead-dirty, failed-old, failed-recent, fleet-shipped);
	// WIP refs: merged, squashed, shipped, failed-old, fleet-shipped, api's
	// docs; worktrees: all seven not running; origin: the five WIP and two
	// job branches above.
	want := Counts{JobBranches: 7, WIPRefs: 6, Worktrees: 7, RemoteRefs: 7}
	if rep.Deleted != want {
		t.Errorf("deleted %+v, want %+v", rep.Deleted, want)
		for _, a := range rep.Actions {
			t.Logf("%s %s %s: %s (%s)", a.Result, a.Repo, a.Label(), a.Reason, a.Detail)
		}
	}

	// A second run right after deletes nothing.
	rep2, err := g.Run(ctx, false)
	if err != nil {
		t.Fatal(err)
	}
	if rep2.Deleted.Total() != 0 || len(rep2.Errors) != 0 {
		for _, a := range rep2.Actions {
			if a.Result != Kept {
				t.Logf("%s %s: %s (%s)", a.Result, a.Label(), a.Reason, a.Detail)
			}
		}
		t.Fatalf("second run: deleted %+v errors %v", rep2.Deleted, rep2.Errors)
	}
	if rep2.Kept.Total() != rep.Kept.Total() {
		t.Errorf("second run kept %+v, first kept %+v", rep2.Kept, rep.Kept)
	}
}

func heads(m map[string]string) map[string]string {
	out := map[string]string{}
	for k, v := range m {
		if strings.HasPrefix(k, "refs/heads/") {
			out[k] = v
		}
	}
	return out
}

func equalMaps(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}

// Between the plan and the act, a job starts, a ref moves and another job
// takes a repository's lock: none of them is hurt.
func TestExecuteRechecksAtTheMomentOfDeletion(t *testing.T) {
	testenv.Slow(t, "builds and collects many real worktrees")
	t.Parallel()
	ctx := ctxT(t)
	f := newFactory(t)
	now := time.Now().UTC()
	recs, err := jobstate.Open(filepath.Join(f.home, "state", "jobs"))
	if err != nil {
		t.Fatal(err)
	}
	a := f.newRepo("a")
	f.newRepo("b")
	for _, id := range []string{"starts", "moves", "plain"} {
		f.runJob("a", id, now.Add(-48*time.Hour), map[string]string{id + ".txt": id + "\n"}, false)
		f.push("a", "aq/wip/"+id)
		if err := recs.Put(jobstate.Record{ID: id, Repo: "a", Stage: job.Shipped, EndedAt: now.Add(-47 * time.Hour)}); err != nil {
			t.Fatal(err)
		}
	}
	f.runJob("b", "other", now.Add(-48*time.Hour), map[string]string{"o.txt": "o\n"}, false)
	if err := recs.Put(jobstate.Record{ID: "other", Repo: "b", Stage: job.Shipped, EndedAt: now.Add(-47 * time.Hour)}); err != nil {
		t.Fatal(err)
	}

	g := f.gc(func(g *GC) { g.Records = recs })
	snap, err := g.Gather(ctx)
	if err != nil {
		t.Fatal(err)
	}
	decided := plan.Plan(time.Now(), snap.State, g.Cfg.Policy)
	// The plan deletes everything; the act must not.
	planned := map[string]bool{}
	for _, d := range decided.Deletes() {
		planned[d.Where+" "+d.Name] = true
	}
	for _, want := range []string{"local refs/heads/aq/wip/starts", "origin refs/heads/aq/wip/starts", "local refs/heads/aq/job/starts",
		"local " + f.wtPath("a", "starts"), "local refs/heads/aq/wip/moves", "origin refs/heads/aq/wip/moves", "local " + f.wtPath("b", "other")} {
		if !planned[want] {
			t.Fatalf("the plan does not delete %s: %v", want, planned)
		}
	}

	// Job "starts" starts: its lock is taken in another process.
	holdInOtherProcess(t, f.locksDir(), worktree.JobLockName("starts"))
	// Another factory checkpoints "moves" to origin; locally it moves too.
	moved := testenv.Git(t, a, "commit-tree", "-p", "aq/wip/moves", "-m", "later", "aq/wip/moves^{tree}")
	testenv.Git(t, a, "update-ref", "refs/heads/aq/wip/moves", moved)
	testenv.Git(t, a, "push", "-q", "origin", "+refs/heads/aq/wip/moves:refs/heads/aq/wip/moves")
	// A job starts in repository b.
	holdInOtherProcess(t, f.locksDir(), worktree.RepoLockName("b"))

	rep := g.Execute(ctx, snap, decided)
	if len(rep.Errors) != 0 {
		t.Fatalf("errors: %v", rep.Errors)
	}
	after := testenv.RemoteRefs(t, a, "refs/")
	origin := testenv.RemoteRefs(t, f.originDir("a"), "refs/")
	for _, ref := range []string{"refs/heads/aq/wip/starts", "refs/heads/aq/job/starts"} {
		if after[ref] == "" {
			t.Errorf("%s of the job that started was deleted", ref)
		}
	}
	if origin["refs/heads/aq/wip/starts"] == "" {
		t.Error("origin's WIP ref of the job that started was deleted")
	}
	if _, err := os.Stat(f.wtPath("a", "starts")); err != nil {
		t.Error("the worktree of the job that started was removed")
	}
	if after["refs/heads/aq/wip/moves"] != moved || origin["refs/heads/aq/wip/moves"] != moved {
		t.Errorf("the moved WIP ref was deleted: local %q origin %q", after["refs/heads/aq/wip/moves"], origin["refs/heads/aq/wip/moves"])
	}
	if after["refs/heads/aq/wip/plain"] != "" || origin["refs/heads/aq/wip/plain"] != "" {
		t.Error("the plain WIP ref was not deleted")
	}
	if _, err := os.Stat(f.wtPath("b", "other")); err != nil {
		t.Error("a worktree was removed in a repository whose lock a job took after the plan")
	}
	var details []string
	for _, x := range rep.Actions {
		if x.Action == plan.Delete && x.Result == Kept {
			details = append(details, x.Label()+": "+x.Detail)
		}
	}
	if len(details) < 5 {
		t.Errorf("planned deletions kept with a reason: %q", details)
	}
}

// --offline leaves origin alone; worktrees of a repository that is gone are
// reported and kept; a job whose repository was never cloned here is no
// warning.
func TestGCOfflineAndGoneRepository(t *testing.T) {
	testenv.Slow(t, "builds and collects many real worktrees")
	t.Parallel()
	ctx := ctxT(t)
	f := newFactory(t)
	repo := f.newRepo("x")
	testenv.Git(t, repo, "branch", "aq/job/a", "main")
	f.push("x", "aq/job/a")
	ghost := f.wtPath("ghost", "j1")
	testenv.WriteFile(t, filepath.Join(ghost, "file.txt"), "work\n")
	recs, err := jobstate.Open(filepath.Join(f.home, "state", "jobs"))
	if err != nil {
		t.Fatal(err)
	}
	if err := recs.Put(jobstate.Record{ID: "elsewhere", Repo: "never-cloned", Stage: job.Shipped, EndedAt: time.Now()}); err != nil {
		t.Fatal(err)
	}

	rep, err := f.gc(func(g *GC) { g.Cfg.Offline = true; g.Records = recs }).Run(ctx, false)
	if err != nil || len(rep.Errors) != 0 {
		t.Fatal(err, rep.Errors)
	}
	if rep.Deleted != (Counts{JobBranches: 1}) {
		t.Errorf("deleted %+v", rep.Deleted)
	}
	if testenv.RemoteRefs(t, f.originDir("x"), "refs/")["refs/heads/aq/job/a"] == "" {
		t.Error("--offline deleted a ref on origin")
	}
	if _, err := os.Stat(filepath.Join(ghost, "file.txt")); err != nil {
		t.Error("a worktree of a repository that is gone was touched")
	}
	if len(rep.Warnings) != 1 || !strings.Contains(rep.Warnings[0], "ghost") {
		t.Errorf("warnings %q", rep.Warnings)
	}
}

func TestStatusAndMerge(t *testing.T) {
	t.Parallel()
	for stage, want := range map[job.Stage]plan.JobStatus{
		job.Inbox: plan.JobQueued, "queued": plan.JobQueued, job.Blocked: plan.JobQueued,
		job.Building: plan.JobBuilding, "assigned": plan.JobBuilding, job.Review: plan.JobAwaiting,
		job.Testing: plan.JobAwaiting, job.Shipped: plan.JobShipped, job.Failed: plan.JobFailed,
		job.DeadLetter: plan.JobFailed, "something-new": plan.JobQueued,
	} {
		if got := status(stage); got != want {
			t.Errorf("status(%s) = %s, want %s", stage, got, want)
		}
	}
	t1, t2 := time.Unix(100, 0), time.Unix(200, 0)
	got := merge(plan.JobState{Status: plan.JobShipped, EndedAt: t2, Base: "main"},
		plan.JobState{Status: plan.JobQueued, EndedAt: t1, InFlight: true, Repo: "r"})
	if got.Status != plan.JobQueued || !got.InFlight || !got.EndedAt.Equal(t2) || got.Base != "main" || got.Repo != "r" {
		t.Errorf("merge = %+v: want the cautious status, in flight, the later end, both fields", got)
	}
	if r := recordState(jobstate.Record{Stage: job.Shipped}); r.Status != plan.JobBuilding {
		t.Errorf("a record with no end is running: %+v", r)
	}
}
