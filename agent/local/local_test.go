package local_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aqfleet/aq/agent/local"
	"github.com/aqfleet/aq/agent/queue"
	"github.com/aqfleet/aq/agent/runner"
	"github.com/aqfleet/aq/internal/abandon"
	"github.com/aqfleet/aq/internal/process"
	"github.com/aqfleet/aq/internal/testenv"
	"github.com/aqfleet/aq/job"
	"github.com/aqfleet/aq/worktree"
)

// clock is an injectable clock for retry backoffs.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) Now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.t }

func (c *clock) Advance(d time.Duration) { c.mu.Lock(); c.t = c.t.Add(d); c.mu.Unlock() }

// withClock swaps the agent's queue for one on the same directory that reads
// the given clock.
func withClock(t *testing.T, a *local.Agent, c *clock) {
	t.Helper()
	q, err := queue.Open(a.Queue.Dir(), queue.WithParser(a.Parse), queue.WithClock(c.Now))
	if err != nil {
		t.Fatal(err)
	}
	a.Queue = q
}

// state is the sidecar of the job a test calls name (its id is testenv.ID(name)).
func state(t *testing.T, a *local.Agent, name string) queue.State {
	t.Helper()
	e, err := a.Queue.Get(testenv.ID(name))
	if err != nil {
		t.Fatal(err)
	}
	return e.State
}

// markEnv points scripts' $MARK at a directory of the test's (aq passes its
// own environment to the engine).
func markEnv(t *testing.T) string {
	mark := t.TempDir()
	t.Setenv("MARK", mark)
	return mark
}

// TestRunOneRecordsOutcome: a job runs through the queue: building while it
// runs, then its success stage, with insights, branch and checkpoint in the
// sidecar and one attempt counted.
func TestRunOneRecordsOutcome(t *testing.T) {
	testenv.Slow(t, "runs whole local jobs")
	h := testenv.NewHome(t)
	h.Repo(t, "app", nil)
	a := newAgent(t, h)
	submit(t, a, "one", "repo: app\nengine: script\nship: branch\nscript: |\n  echo hi > hi.txt\n  echo ::aq-usage tokens_in=3 tokens_out=4 cost_usd=0.5 turns=1")
	res, err := a.RunOne(context.Background())
	if err != nil || res.Stage != job.Shipped {
		t.Fatalf("RunOne: %v %+v", err, res)
	}
	st := state(t, a, "one")
	if st.Stage != job.Shipped || st.Attempts != 1 || st.Branch != "aq/job/"+testenv.ID("one") || st.Checkpoint == "" || st.Reason != "" {
		t.Errorf("sidecar: %+v", st)
	}
	if in := st.Insights; in == nil || in.Engine != "script" || in.TokensIn != 3 || in.TokensOut != 4 || in.CostUSD != 0.5 || in.FilesChanged != 1 || in.LinesAdded != 1 {
		t.Errorf("insights: %+v", st.Insights)
	}
	if _, err := a.RunOne(context.Background()); !errors.Is(err, queue.ErrNoJob) {
		t.Errorf("second RunOne: %v, want ErrNoJob", err)
	}
	noTagged(t, testenv.ID("one"))
}

// TestRetryBackoffThenDeadLetter: a failing job is retried retry.max times,
// each after its backoff (NotBefore), then dead-lettered; infrastructure
// failures get extra tries and at least 30s of backoff.
func TestRetryBackoffThenDeadLetter(t *testing.T) {
	testenv.Slow(t, "runs whole local jobs")
	h := testenv.NewHome(t)
	h.Repo(t, "app", nil)
	a := newAgent(t, h)
	c := &clock{t: time.Now().UTC()}
	withClock(t, a, c)
	ctx := context.Background()
	submit(t, a, "flaky", "repo: app\nengine: script\nscript: exit 3\nretry: {max: 1, backoff: 10m}")

	res, err := a.RunOne(ctx)
	if err != nil || res.Stage != job.Inbox || res.Outcome.Reason != job.ReasonEngineFailed {
		t.Fatalf("attempt 1: %v %+v", err, res)
	}
	st := state(t, a, "flaky")
	if st.Reason != job.ReasonEngineFailed || st.Attempts != 1 || !st.NotBefore.Equal(c.Now().Round(0).Add(10*time.Minute)) {
		t.Fatalf("after attempt 1: reason %q attempts %d notBefore %v (now %v)", st.Reason, st.Attempts, st.NotBefore, c.Now())
	}
	if _, err := a.RunOne(ctx); !errors.Is(err, queue.ErrNoJob) {
		t.Fatalf("during the backoff: %v, want ErrNoJob", err)
	}
	c.Advance(10*time.Minute + time.Second)
	res, err = a.RunOne(ctx)
	if err != nil || res.Stage != job.DeadLetter || res.Attempt != 2 {
		t.Fatalf("attempt 2: %v %+v, want dead_letter", err, res)
	}
	st = state(t, a, "flaky")
	if st.Stage != job.DeadLetter || st.Reason != job.ReasonEngineFailed || st.Attempts != 2 || st.Checkpoint == "" {
		t.Errorf("dead letter: %+v", st)
	}

	// engine_unavailable is not the task's fault: with retry.max 0 it still
	// returns to the inbox, 30s at least.
	submit(t, a, "authless", "repo: app\nengine: script\nscript: echo ::aq-unavailable login expired")
	res, err = a.RunOne(ctx)
	if err != nil || res.Stage != job.Inbox {
		t.Fatalf("unavailable: %v %+v", err, res)
	}
	st = state(t, a, "authless")
	if st.Reason != job.ReasonEngineUnavailable || st.NotBefore.Sub(c.Now()) < 30*time.Second {
		t.Errorf("unavailable: reason %q notBefore in %v", st.Reason, st.NotBefore.Sub(c.Now()))
	}
}

// TestManifestEditedInQueue: a queued manifest edited into an invalid one
// fails the job with invalid_manifest when it is taken; nothing is deleted.
func TestManifestEditedInQueue(t *testing.T) {
	h := testenv.NewHome(t)
	h.Repo(t, "app", nil)
	a := newAgent(t, h)
	submit(t, a, "edited", "repo: app\nengine: script\nscript: echo hi > hi.txt")
	id := testenv.ID("edited")
	md := filepath.Join(h.Queue("inbox"), id+".md")
	testenv.WriteFile(t, md, "---\nid: "+id+"\nrepo: app\nengine: script\nscript: true\nreop: typo\n---\n# edited\n")
	res, err := a.RunOne(context.Background())
	if err != nil || res.Stage != job.Failed || res.Outcome.Reason != job.ReasonInvalidManifest {
		t.Fatalf("%v %+v", err, res)
	}
	st := state(t, a, "edited")
	if st.Stage != job.Failed || st.Reason != job.ReasonInvalidManifest || !strings.Contains(st.Detail, "reop") {
		t.Errorf("sidecar: %+v", st)
	}
	if b := testenv.ReadFile(t, filepath.Join(h.Queue("failed"), id+".md")); !strings.Contains(b, "reop: typo") {
		t.Errorf("the manifest was not kept as edited: %q", b)
	}
	if testenv.Exists(h.Worktree("app", id)) {
		t.Error("a worktree was made for an invalid manifest")
	}
}

// TestCorruptSidecar: a sidecar that is not JSON moves its job to failed with
// invalid_manifest; the file is kept as .corrupt and the manifest as it was.
func TestCorruptSidecar(t *testing.T) {
	testenv.Slow(t, "runs whole local jobs")
	h := testenv.NewHome(t)
	h.Repo(t, "app", nil)
	a := newAgent(t, h)
	submit(t, a, "garbled", "repo: app\nengine: script\nscript: echo hi > hi.txt")
	id := testenv.ID("garbled")
	md := testenv.ReadFile(t, filepath.Join(h.Queue("inbox"), id+".md"))
	testenv.WriteFile(t, filepath.Join(h.Queue("inbox"), id+".json"), "{not json")
	if _, err := a.RunOne(context.Background()); !errors.Is(err, queue.ErrNoJob) {
		t.Fatalf("RunOne: %v, want ErrNoJob (the only job is unreadable)", err)
	}
	st := state(t, a, "garbled")
	if st.Stage != job.Failed || st.Reason != job.ReasonInvalidManifest {
		t.Errorf("sidecar: %+v", st)
	}
	if got := testenv.ReadFile(t, filepath.Join(h.Queue("failed"), id+".json.corrupt")); got != "{not json" {
		t.Errorf("corrupt sidecar kept as %q", got)
	}
	if got := testenv.ReadFile(t, filepath.Join(h.Queue("failed"), id+".md")); got != md {
		t.Error("the manifest changed")
	}
}

// TestRecoverOrphan: a job left in building by a dead aq, its engine still
// running: Recover stops the engine first, then checkpoints its worktree (so
// no write is lost), and requeues the job; the next run starts from there.
func TestRecoverOrphan(t *testing.T) {
	testenv.Slow(t, "runs whole local jobs")
	h := testenv.NewHome(t)
	h.Repo(t, "app", nil)
	mark := markEnv(t)
	a := newAgent(t, h)
	submit(t, a, "orphan", "repo: app\nengine: script\nship: none\nscript: |\n  test -f progress && cp progress \"$MARK/seen\"")
	// The dead aq: another process took the job (its job lock died with it)
	// and made the worktree; its engine is still writing.
	dead, err := queue.Open(a.Queue.Dir(), queue.WithOwner("deadhost", 999999))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := dead.Next(nil); err != nil {
		t.Fatal(err)
	}
	id := testenv.ID("orphan")
	wt := h.Worktree("app", id)
	repo := filepath.Join(h.RepoBase, "app")
	if err := worktree.Add(context.Background(), worktree.Git{}, repo, wt, "aq/job/"+id, "main"); err != nil {
		t.Fatal(err)
	}
	testenv.WriteFile(t, filepath.Join(wt, "first.txt"), "written before aq died\n")
	engine := startTagged(t, id, runner.Scope(a.Runner.Cfg.Home), wt, `i=0; while :; do i=$((i+1)); echo $i > p.tmp && mv p.tmp progress && echo $i >> "$MARK/written"; sleep 0.005; done`)
	testenv.WaitFor(t, time.Minute, "the orphan engine to write", func() bool { return testenv.Exists(filepath.Join(mark, "written")) })

	ids, err := a.Recover(context.Background())
	if err != nil || len(ids) != 1 || ids[0] != id {
		t.Fatalf("Recover: %v %v", ids, err)
	}
	if process.Alive(engine) {
		t.Fatal("the orphan's engine is still running after Recover")
	}
	noTagged(t, id)
	st := state(t, a, "orphan")
	if st.Stage != job.Inbox || st.Reason != job.ReasonCrash || st.Attempts != 1 || st.Checkpoint == "" {
		t.Fatalf("after Recover: %+v", st)
	}
	wip := testenv.TreeFiles(t, repo, st.Checkpoint)
	written := strings.Fields(testenv.ReadFile(t, filepath.Join(mark, "written")))
	last, _ := strconv.Atoi(written[len(written)-1])
	if wip["first.txt"] != "written before aq died" {
		t.Errorf("checkpoint files: %v", wip)
	}
	// The engine may die between moving progress into place and logging
	// it, so the checkpoint may be one ahead of the log, never behind.
	if cp, _ := strconv.Atoi(wip["progress"]); cp < last || cp > last+1 {
		t.Errorf("the engine's last logged write was progress=%d, the checkpoint has %q: a write was lost", last, wip["progress"])
	}
	if now := strings.TrimSpace(testenv.ReadFile(t, filepath.Join(wt, "progress"))); now != wip["progress"] {
		t.Errorf("progress changed after the checkpoint: %s, checkpoint %s", now, wip["progress"])
	}
	// A second Recover finds nothing: the job is no longer in building.
	if ids, err := a.Recover(context.Background()); err != nil || len(ids) != 0 {
		t.Errorf("second Recover: %v %v", ids, err)
	}

	res, err := a.RunOne(context.Background())
	if err != nil || res.Outcome.Failed() || res.Attempt != 2 {
		t.Fatalf("re-run: %v %+v", err, res)
	}
	if got := testenv.ReadFile(t, filepath.Join(mark, "seen")); strings.TrimSpace(got) != wip["progress"] {
		t.Errorf("the re-run started from progress=%q, want the checkpoint's %s", got, wip["progress"])
	}
}

// TestRunnableExplainsWhy: a job this host can never run stays queued, and
// Runnable says why.
func TestRunnableExplainsWhy(t *testing.T) {
	testenv.Slow(t, "runs whole local jobs")
	h := testenv.NewHome(t)
	h.Repo(t, "app", nil)
	a := newAgent(t, h)
	submit(t, a, "picky", "repo: app\nengine: script\nscript: true\ncapabilities: [has:nonexistent-tool]")
	if _, err := a.RunOne(context.Background()); !errors.Is(err, queue.ErrNoJob) {
		t.Fatalf("RunOne: %v, want ErrNoJob", err)
	}
	host, err := a.HostCaps(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	ok, why := local.Runnable(host, state(t, a, "picky"))
	if ok || !strings.Contains(why, "has:nonexistent-tool") {
		t.Errorf("Runnable: %v %q", ok, why)
	}
	if st := state(t, a, "picky"); st.Stage != job.Inbox || st.Attempts != 0 {
		t.Errorf("the job moved: %+v", st)
	}
}

func noTagged(t *testing.T, id string) {
	t.Helper()
	if pids, err := process.FindTagged(id); err != nil || len(pids) > 0 {
		t.Errorf("processes tagged %s alive: %v %v", id, pids, err)
	}
}

// startTagged starts sh -c script in dir as an engine of job id would run:
// own process group, tagged. The test's cleanup kills the group.
func startTagged(t *testing.T, id, scope, dir, script string) int {
	t.Helper()
	cmd := exec.Command("/bin/sh", "-c", script)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), process.TagEnv+"="+id, process.ScopeEnv+"="+scope)
	process.SetGroup(cmd)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	pid := cmd.Process.Pid
	go cmd.Wait()
	t.Cleanup(func() { _ = process.KillGroup(pid) })
	return pid
}

// TestRecoverAbandoned: a job whose aq gave up on a blocked step after a
// stop signal (cmd/aq/cli, stop.go) was marked by it (internal/abandon):
// Recover fails it interrupted, saying what was abandoned, not crash; a
// mark another process left is not taken for it.
func TestRecoverAbandoned(t *testing.T) {
	testenv.Slow(t, "runs whole local jobs")
	for _, c := range []struct {
		name   string
		markBy int
		want   job.Reason
	}{
		{"marked by its aq", 999999, job.ReasonInterrupted},
		{"marked by another aq", 999998, job.ReasonCrash},
	} {
		t.Run(c.name, func(t *testing.T) {
			h := testenv.NewHome(t)
			h.Repo(t, "app", nil)
			a := newAgent(t, h)
			submit(t, a, "abandoned", "repo: app\nengine: script\nship: none\nscript: true")
			dead, err := queue.Open(a.Queue.Dir(), queue.WithOwner("deadhost", 999999))
			if err != nil {
				t.Fatal(err)
			}
			if _, err := dead.Next(nil); err != nil {
				t.Fatal(err)
			}
			id := testenv.ID("abandoned")
			testenv.WriteFile(t, filepath.Join(abandon.Dir(a.Runner.Cfg.Home), id),
				fmt.Sprintf(`{"pid":%d,"why":"aq run was stopped by SIGTERM and abandoned the step it was in after AQ_STOP_BOUND (1s)"}`, c.markBy))
			if ids, err := a.Recover(context.Background()); err != nil || len(ids) != 1 {
				t.Fatalf("Recover: %v %v", ids, err)
			}
			st := state(t, a, "abandoned")
			if st.Stage != job.Inbox || st.Reason != c.want {
				t.Fatalf("after Recover: %s %s %q, want inbox %s", st.Stage, st.Reason, st.Detail, c.want)
			}
			if c.want == job.ReasonInterrupted && !strings.Contains(st.Detail, "abandoned the step it was in after AQ_STOP_BOUND") {
				t.Errorf("detail %q does not say what was abandoned", st.Detail)
			}
			if testenv.Exists(filepath.Join(abandon.Dir(a.Runner.Cfg.Home), id)) {
				t.Error("the mark outlived the recovery")
			}
		})
	}
}
