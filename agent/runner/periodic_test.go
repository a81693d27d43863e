package runner_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aqfleet/aq/agent/runner"
	"github.com/aqfleet/aq/internal/testenv"
	"github.com/aqfleet/aq/job"
)

// stepScript writes step-N.txt every 100 ms, logs each step outside the
// worktree ($MARK/steps), and holds the worktree's index.lock the whole
// time, as an engine running git would; it lets go of the lock at the end.
// It stops after $STEPS steps, or when the test makes $MARK/stop.
const stepScript = `lock="$(git rev-parse --git-path index.lock)"
echo engine > "$lock"
i=0
while [ $i -lt "${STEPS:-12}" ] && [ ! -e "$MARK/stop" ]; do
  i=$((i+1))
  echo $i > step-$i.txt
  echo $i >> "$MARK/steps"
  sleep 0.1
done
[ "$(cat "$lock")" = engine ] || { echo "index.lock changed under the engine" >&2; exit 3; }
rm -f "$lock"
`

type eventLog struct {
	mu  sync.Mutex
	evs []runner.Event
}

func (l *eventLog) add(e runner.Event) { l.mu.Lock(); l.evs = append(l.evs, e); l.mu.Unlock() }

// kinds are the checkpoints of the events taken ("checkpoint") or
// pushed ("checkpoint-pushed"), in order.
func (l *eventLog) kinds(kind string) []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []string
	for _, e := range l.evs {
		switch e := e.(type) {
		case runner.Checkpointed:
			if kind == "checkpoint" {
				out = append(out, e.Checkpoint)
			}
		case runner.CheckpointPushed:
			if kind == "checkpoint-pushed" {
				out = append(out, e.Checkpoint)
			}
		}
	}
	return out
}

// While the engine runs, its work is checkpointed every interval and pushed
// to origin's aq/wip/<id>, without touching the worktree's index.lock (the
// engine holds it throughout and checks it is still its own).
func TestPeriodicCheckpointsWhileTheEngineRuns(t *testing.T) {
	testenv.Slow(t, "runs whole jobs with real git, processes and waits")
	t.Parallel() // its own fixture (home, repository, origin): it waits on intervals, not on the CPU
	f := newFixture(t)
	f.r.Cfg.CheckpointInterval = 250 * time.Millisecond
	origin := testenv.AddOrigin(t, f.repo)
	// The engine steps until two periodic checkpoints reached origin, however
	// long that takes on a loaded machine.
	j := f.job("periodic", "STEPS=100000\n"+stepScript)
	var log eventLog
	done := make(chan runner.Outcome, 1)
	go func() { done <- f.run(context.Background(), j, runner.Options{Attempt: 1, OnEvent: log.add}) }()
	testenv.WaitFor(t, 2*time.Minute, "two pushed periodic checkpoints", func() bool { return len(log.kinds("checkpoint-pushed")) >= 2 })
	testenv.WriteFile(t, f.marker("stop"), "")
	out := <-done
	if out.Failed() {
		t.Fatalf("%+v", out)
	}
	periodic, pushed := log.kinds("checkpoint"), log.kinds("checkpoint-pushed")
	// The last "checkpoint" event is the final one, after the engine.
	if len(periodic) < 3 || len(pushed) < 2 {
		t.Fatalf("%d checkpoints (%d pushed), want two periodic ones pushed and the final one", len(periodic)-1, len(pushed))
	}
	seen := map[string]bool{}
	for _, sha := range periodic[:len(periodic)-1] {
		if seen[sha] {
			t.Errorf("checkpoint %s reported twice: an unchanged tree must make no new checkpoint", sha)
		}
		seen[sha] = true
	}
	// Each pushed checkpoint holds more steps than the one before.
	last := 0
	for _, sha := range pushed {
		n := 0
		for name := range testenv.TreeFiles(t, origin, sha) {
			if strings.HasPrefix(name, "step-") {
				n++
			}
		}
		if n <= last {
			t.Errorf("pushed checkpoint %s has %d steps, the one before %d", sha, n, last)
		}
		last = n
	}
	if got := testenv.RemoteRefs(t, origin, "refs/heads/aq/wip/")["refs/heads/aq/wip/"+j.ID]; got != out.Checkpoint {
		t.Errorf("origin's aq/wip = %s, want the final checkpoint %s", got, out.Checkpoint)
	}
}

// TestFinalPushAfterAStoppedPeriodicPush: the engine ends while a periodic
// checkpoint's push is in flight. That push is stopped after origin took
// it (git updates the ref before it reports; here origin's post-receive hook
// holds the report back), so aq does not know it landed — and the final
// checkpoint's push, a compare-and-swap against what aq last knew, was
// refused as stale: the final checkpoint stayed on this host, origin kept
// the older one. aq now asks origin about a push in doubt first.
func TestFinalPushAfterAStoppedPeriodicPush(t *testing.T) {
	t.Parallel() // its own fixture (home, repository, origin): it waits on intervals, not on the CPU
	testenv.Slow(t, "waits out git's WaitDelay after the stopped push")
	f := newFixture(t)
	f.r.Cfg.CheckpointInterval = 100 * time.Millisecond
	origin := testenv.AddOrigin(t, f.repo)
	sig := t.TempDir()
	landed, release := filepath.Join(sig, "landed"), filepath.Join(sig, "release")
	// The first push that reaches origin is held after its ref update until
	// the test ends; later ones pass.
	testenv.WriteFile(t, filepath.Join(origin, "hooks", "post-receive"), "#!/bin/sh\ncat >/dev/null\n"+
		"if [ ! -e '"+landed+"' ]; then : > '"+landed+"'; while [ ! -e '"+release+"' ]; do sleep 0.05; done; fi\n")
	if err := os.Chmod(filepath.Join(origin, "hooks", "post-receive"), 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { testenv.WriteFile(t, release, "") })
	j := f.job("push-in-doubt", "echo one > one.txt\nwhile [ ! -e '"+landed+"' ]; do sleep 0.05; done\necho two > two.txt\n")
	out := f.run(context.Background(), j, runner.Options{Attempt: 1})
	if out.Failed() {
		t.Fatalf("%+v", out)
	}
	got := testenv.RemoteRefs(t, origin, "refs/heads/aq/wip/")["refs/heads/aq/wip/"+j.ID]
	if !out.WIPPushed || got != out.Checkpoint {
		t.Fatalf("origin's aq/wip = %s, want the final checkpoint %s (pushed: %v)", got, out.Checkpoint, out.WIPPushed)
	}
	if files := testenv.TreeFiles(t, origin, got); files["two.txt"] != "two" {
		t.Fatalf("origin's checkpoint lacks the engine's last file: %v", files)
	}
}

// An engine that changes nothing between two intervals costs no commit and
// no push.
func TestPeriodicCheckpointUnchangedIsFree(t *testing.T) {
	testenv.Slow(t, "runs whole jobs with real git, processes and waits")
	t.Parallel() // its own fixture (home, repository, origin): it waits on intervals, not on the CPU
	f := newFixture(t)
	f.r.Cfg.CheckpointInterval = 100 * time.Millisecond
	testenv.AddOrigin(t, f.repo)
	// One change, then nothing until the test saw it pushed — and a second
	// more of ticks (10 intervals) on an unchanged tree.
	j := f.job("periodic-idle", "echo once > once.txt\nwhile [ ! -e \"$MARK/stop\" ]; do sleep 0.05; done\nsleep 1\n")
	var log eventLog
	done := make(chan runner.Outcome, 1)
	go func() { done <- f.run(context.Background(), j, runner.Options{Attempt: 1, OnEvent: log.add}) }()
	testenv.WaitFor(t, 2*time.Minute, "the periodic checkpoint pushed", func() bool { return len(log.kinds("checkpoint-pushed")) >= 1 })
	testenv.WriteFile(t, f.marker("stop"), "")
	if out := <-done; out.Failed() {
		t.Fatalf("%+v", out)
	}
	// One periodic checkpoint for the one change, then the final one (the
	// same commit: nothing changed after).
	cps := log.kinds("checkpoint")
	if len(cps) != 2 || cps[0] != cps[1] || len(log.kinds("checkpoint-pushed")) != 1 {
		t.Fatalf("checkpoints %v pushed %v; want one periodic checkpoint, pushed once, and the same final one", cps, log.kinds("checkpoint-pushed"))
	}
}

// A preemption (the lease taken away: the run is fenced and pushes nothing
// more) loses at most the work since the last periodic checkpoint: the next
// owner resumes from origin's aq/wip/<id>, which is the last checkpoint
// pushed before the lease went, holding every step the engine had made when
// it was taken. (How much work one interval is on a given machine is the
// chaos harness's invariant "work lost ≤ one checkpoint interval", measured
// against the clock of a whole run; a step count here would assume the
// checkpoint keeps pace with the engine on a loaded machine.)
func TestPreemptionLosesAtMostOneInterval(t *testing.T) {
	testenv.Slow(t, "runs whole jobs with real git, processes and waits")
	t.Parallel() // its own fixture (home, repository, origin): it waits on intervals, not on the CPU
	const interval, step = 300 * time.Millisecond, 100 * time.Millisecond
	f := newFixture(t)
	f.r.Cfg.CheckpointInterval = interval
	origin := testenv.AddOrigin(t, f.repo)
	j := f.job("preempted", "STEPS=1000\n"+stepScript)
	lease := &atomicLease{}
	lease.held.Store(true)
	ctx, cancel := context.WithCancelCause(context.Background())
	var log eventLog
	done := make(chan runner.Outcome, 1)
	go func() { done <- f.run(ctx, j, runner.Options{Attempt: 1, Lease: lease, OnEvent: log.add}) }()
	testenv.WaitFor(t, time.Minute, "a few pushed checkpoints", func() bool { return len(log.kinds("checkpoint-pushed")) >= 3 })
	// The coordinator requeues the job with its epoch bumped: the next
	// renewal says fenced.
	lease.held.Store(false)
	cancel(job.Stop(job.ReasonFenced, "preempted: the coordinator requeued the job"))
	out := <-done
	if !out.Fenced || out.WIPPushed {
		t.Fatalf("outcome %+v, want fenced without a final push", out)
	}
	written := strings.Fields(testenv.ReadFile(t, f.marker("steps")))
	done1, _ := strconv.Atoi(written[len(written)-1])
	tip := testenv.RemoteRefs(t, origin, "refs/heads/aq/wip/")["refs/heads/aq/wip/"+j.ID]
	kept, files := 0, testenv.TreeFiles(t, origin, tip)
	for name := range files {
		if strings.HasPrefix(name, "step-") {
			kept++
		}
	}
	t.Logf("preemption: the engine had done %d steps, origin's checkpoint holds %d: %d lost (one interval is %d steps at full speed)", done1, kept, done1-kept, int(interval/step))
	pushed := log.kinds("checkpoint-pushed")
	if last := pushed[len(pushed)-1]; tip != last {
		t.Fatalf("origin's aq/wip is %s, want the last checkpoint pushed before the preemption, %s (pushed: %v)", tip, last, pushed)
	}
	if kept == 0 || kept > done1 {
		t.Fatalf("origin's checkpoint holds %d steps of the engine's %d", kept, done1)
	}
	// Every step the engine logged before the pushed checkpoint's are in it:
	// the checkpoint is a prefix of the work, nothing in the middle lost.
	for i := 1; i <= kept; i++ {
		if _, ok := files[fmt.Sprintf("step-%d.txt", i)]; !ok {
			t.Fatalf("origin's checkpoint holds %d steps but not step %d", kept, i)
		}
	}
}

// atomicLease is a lease the test takes away while the run reads it.
type atomicLease struct{ held atomic.Bool }

func (l *atomicLease) Confirm(context.Context) error {
	if !l.held.Load() {
		return job.Stop(job.ReasonFenced, "test: preempted")
	}
	return nil
}
func (l *atomicLease) Held(time.Duration) bool { return l.held.Load() }

// The coordinator may know an older checkpoint than origin's WIP ref: a
// periodic checkpoint pushed after the last one it recorded (the host that
// pushed it was lost before its PATCH went out). The next run resumes from
// origin's, which descends from the recorded one.
func TestResumeFromANewerPushedCheckpoint(t *testing.T) {
	testenv.Slow(t, "runs whole jobs with real git, processes and waits")
	t.Parallel() // its own fixture (home, repository, origin): it waits on intervals, not on the CPU
	f := newFixture(t)
	origin := testenv.AddOrigin(t, f.repo)
	j := f.job("newer", "echo one > one.txt\nexit 1\n")
	first := f.run(context.Background(), j, runner.Options{Attempt: 1})
	if !first.Failed() || !first.WIPPushed {
		t.Fatalf("first attempt: %+v", first)
	}
	recorded := first.Checkpoint
	// A later periodic checkpoint of that run, on origin only.
	other := t.TempDir()
	testenv.Git(t, other, "clone", "-q", origin, ".")
	testenv.Git(t, other, "checkout", "-q", "aq/wip/"+j.ID)
	testenv.WriteFile(t, filepath.Join(other, "two.txt"), "two\n")
	testenv.Git(t, other, "add", "two.txt")
	testenv.Git(t, other, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "aq checkpoint: periodic")
	testenv.Git(t, other, "push", "-q", "origin", "aq/wip/"+j.ID)
	newer := testenv.Git(t, other, "rev-parse", "HEAD")

	j.Script = "test -f one.txt && test -f two.txt && echo resumed > \"$MARK/resumed\"\necho three > three.txt\n"
	second := f.run(context.Background(), j, runner.Options{Attempt: 2, Checkpoint: recorded})
	if second.Failed() || !testenv.Exists(f.marker("resumed")) {
		t.Fatalf("the second attempt did not resume from origin's newer checkpoint %s (recorded %s): %+v", newer, recorded, second)
	}
}

// flakyLease is held only after its first refusals: a lease whose expiry was
// too near for a push at the first interval (a renewal late under load).
type flakyLease struct{ refusals atomic.Int32 }

func (l *flakyLease) Confirm(context.Context) error {
	return errors.New("test: the coordinator did not answer") // the local view decides
}
func (l *flakyLease) Held(time.Duration) bool { return l.refusals.Add(-1) < 0 }

// A checkpoint whose push was skipped (the lease could not be confirmed at
// that instant) is pushed at a later interval even though the engine wrote
// nothing since: found by the scale-to-zero act, where an engine that had
// made its change and then waited never had its work on origin.
func TestPeriodicCheckpointPushIsRetried(t *testing.T) {
	testenv.Slow(t, "runs whole jobs with real git, processes and waits")
	t.Parallel() // its own fixture (home, repository, origin): it waits on intervals, not on the CPU
	f := newFixture(t)
	f.r.Cfg.CheckpointInterval = 100 * time.Millisecond
	testenv.AddOrigin(t, f.repo)
	// The engine makes its change, then waits (a deadlock guard of a
	// minute, not a speed requirement) for the push the test is about: on
	// a loaded machine the three refused intervals and the push's checks
	// can take longer than any fixed sleep.
	j := f.job("periodic-retry", "echo once > once.txt\ni=0; while [ ! -f \"$MARK/pushed\" ] && [ $i -lt 600 ]; do sleep 0.1; i=$((i+1)); done\n")
	lease := &flakyLease{}
	lease.refusals.Store(3)
	var log eventLog
	onEvent := func(e runner.Event) {
		log.add(e)
		if _, ok := e.(runner.CheckpointPushed); ok {
			os.WriteFile(f.marker("pushed"), nil, 0o600)
		}
	}
	if out := f.run(context.Background(), j, runner.Options{Attempt: 1, Lease: lease, OnEvent: onEvent}); out.Failed() {
		t.Fatalf("%+v", out)
	}
	cps, pushed := log.kinds("checkpoint"), log.kinds("checkpoint-pushed")
	if len(cps) != 2 || len(pushed) != 1 || pushed[0] != cps[0] {
		t.Fatalf("checkpoints %v pushed while the engine ran %v; want the one change pushed once the lease was confirmed", cps, pushed)
	}
}

// laggingLease is a lease the coordinator took away (a preemption) that the
// local view still holds: Held says yes until a renewal tells.
type laggingLease struct{ confirms atomic.Int32 }

func (l *laggingLease) Confirm(context.Context) error {
	l.confirms.Add(1)
	return job.Stop(job.ReasonFenced, "test: the coordinator requeued the job")
}
func (l *laggingLease) Held(time.Duration) bool { return l.confirms.Load() == 0 }

// A periodic checkpoint is pushed only after a renewal confirmed the lease:
// a preemption is learnt at a renewal, and a push made on the local view
// alone could land after the job went to another factory (found by the
// chaos run: a WIP push a few ms after the new owner took the job).
func TestPeriodicPushConfirmsTheLease(t *testing.T) {
	testenv.Slow(t, "runs whole jobs with real git, processes and waits")
	t.Parallel() // its own fixture (home, repository, origin): it waits on intervals, not on the CPU
	f := newFixture(t)
	f.r.Cfg.CheckpointInterval = 100 * time.Millisecond
	origin := testenv.AddOrigin(t, f.repo)
	j := f.job("periodic-preempted", "echo once > once.txt\nsleep 1\n")
	lease := &laggingLease{}
	var log eventLog
	f.run(context.Background(), j, runner.Options{Attempt: 1, Lease: lease, OnEvent: log.add})
	if n := lease.confirms.Load(); n == 0 {
		t.Fatal("no renewal confirmed the lease before a periodic push")
	}
	if pushed := log.kinds("checkpoint-pushed"); len(pushed) != 0 {
		t.Fatalf("pushed %v on a lease the coordinator had taken away", pushed)
	}
	if got := testenv.RemoteRefs(t, origin, "refs/heads/aq/wip/")["refs/heads/aq/wip/"+j.ID]; got != "" {
		t.Fatalf("origin's aq/wip/%s = %s: a preempted run's checkpoint reached origin", j.ID, got)
	}
}

// The checkpoint after the engine is pushed only after a renewal confirmed
// the lease too: an engine that ended right after a preemption it had not
// learnt of yet (its next renewal was due) pushed its final WIP checkpoint
// on the local view alone, after the new owner took the job (found by the
// chaos run: a WIP push 0.9 s after the requeue, 0.7 s after the other
// factory's claim).
func TestFinalPushConfirmsTheLease(t *testing.T) {
	testenv.Slow(t, "runs whole jobs with real git, processes and waits")
	t.Parallel() // its own fixture (home, repository, origin): it waits on intervals, not on the CPU
	f := newFixture(t)
	origin := testenv.AddOrigin(t, f.repo)
	j := f.job("final-preempted", "echo once > once.txt\nexit 1\n")
	lease := &laggingLease{}
	var log eventLog
	out := f.run(context.Background(), j, runner.Options{Attempt: 1, Lease: lease, OnEvent: log.add})
	if out.Checkpoint == "" {
		t.Fatalf("no checkpoint after the engine: %+v", out)
	}
	if n := lease.confirms.Load(); n == 0 {
		t.Fatal("no renewal confirmed the lease before the final push")
	}
	if pushed := log.kinds("checkpoint-pushed"); len(pushed) != 0 || out.WIPPushed {
		t.Fatalf("pushed %v on a lease the coordinator had taken away", pushed)
	}
	if got := testenv.RemoteRefs(t, origin, "refs/heads/aq/wip/")["refs/heads/aq/wip/"+j.ID]; got != "" {
		t.Fatalf("origin's aq/wip/%s = %s: a preempted run's checkpoint reached origin", j.ID, got)
	}
}
