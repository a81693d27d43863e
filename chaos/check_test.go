//go:build linux

package chaos

import (
	"strings"
	"testing"
	"time"

	"github.com/aqfleet/aq/agent/jobstate"
	"github.com/aqfleet/aq/demo/coord"
)

// The checks are the harness's claims: they are tested on made-up histories
// that break each invariant once, so a green run means something.

var t0 = time.Date(2026, 6, 1, 10, 0, 0, 0, time.UTC)

func at(sec float64) time.Time { return t0.Add(time.Duration(sec * float64(time.Second))) }

// history is one job (j1) claimed by f1 and shipped, with its pushes: every
// check passes on it.
func history() *Input {
	in := &Input{
		Jobs:      []JobSpec{{ID: "j1", Repo: "r1", Plan: PlanOK}},
		Converged: true,
		LeaseTTL:  10 * time.Second,
		State: &coord.Snapshot{
			Jobs: map[string]*coord.Job{"j1": {ID: "j1", Stage: coord.StageShipped, LeaseEpoch: 1, Attempts: 1}},
			Events: map[string][]coord.Event{"j1": {
				{Seq: 1, At: at(0), JobID: "j1", Kind: "submitted", Stage: coord.StageQueued},
				{Seq: 2, At: at(1), JobID: "j1", Kind: "claimed", Factory: "f1", Epoch: 1, Stage: coord.StageAssigned},
				{Seq: 3, At: at(1.1), JobID: "j1", Kind: "stage", Factory: "f1", Epoch: 1, Stage: coord.StageBuilding},
				{Seq: 4, At: at(3), JobID: "j1", Kind: "stage", Factory: "f1", Epoch: 1, Stage: coord.StageShipped},
			}},
		},
		Calls: []coord.Call{
			{At: at(1), Route: coord.RouteClaim, JobID: "j1", Factory: "f1", Epoch: 1, JobEpoch: 1, Stage: coord.StageAssigned, Attempts: 1, Status: 200},
			{At: at(1.1), Route: coord.RoutePatch, JobID: "j1", Factory: "f1", Epoch: 1, JobEpoch: 1, Holder: "f1", Stage: coord.StageBuilding, Status: 200},
			{At: at(2), Route: coord.RouteRenew, JobID: "j1", Factory: "f1", Epoch: 1, JobEpoch: 1, Holder: "f1", Stage: coord.StageBuilding, Status: 200},
			{At: at(3), Route: coord.RoutePatch, JobID: "j1", Factory: "f1", Epoch: 1, JobEpoch: 1, Holder: "f1", Stage: coord.StageShipped, Status: 200},
		},
		Pushes: []Push{
			{T: at(2.5), Factory: "f1", Phase: "run", Repo: "r1", Old: zeros, New: "aaaa", Ref: "refs/heads/aq/wip/j1"},
			{T: at(2.8), Factory: "f1", Phase: "run", Repo: "r1", Old: zeros, New: "bbbb", Ref: "refs/heads/aq/job/j1"},
		},
		CheckpointInterval: time.Second,
		Runs:               []EngineRun{{Job: "j1", N: 1, Factory: "f1", Start: at(1.2), Part1: at(2), Alive: at(2.6), Done: at(2.7)}},
		OriginJobTips:      map[string]Commit{"j1": {SHA: "bbbbbbbbbbbb", Message: "chaos job j1\n\naq-job: j1\naq-engine: script\naq-attempt: 1\n"}},
		Factories: []FactoryData{{ID: "f1", Records: map[string]jobstate.Record{
			"j1": {ID: "j1", Repo: "r1", Stage: "shipped", LeaseEpoch: 1, StartedAt: at(1), EndedAt: at(3)},
		}, Delivered: []Delivered{{Job: "j1", Epoch: 1, Report: "building"}, {Job: "j1", Epoch: 1, Report: "shipped"}}}},
		GC: []GCResult{{Factory: "f1", Deleted: []DeletedRef{{Where: "f1", Repo: "r1", Ref: "refs/heads/aq/wip/j1", SHA: "aaaa", OnlyFrom: []string{"aaaa"}}},
			Lost: map[string][]string{"f1/r1": {"aaaa"}}}},
	}
	return in
}

const zeros = "0000000000000000000000000000000000000000"

func checkNamed(t *testing.T, rep *Report, name string) CheckResult {
	t.Helper()
	for _, c := range rep.Checks {
		if c.Name == name {
			return c
		}
	}
	t.Fatalf("no check %q", name)
	return CheckResult{}
}

// wantOnly asserts that exactly the named check fails, with a violation
// that mentions what.
func wantOnly(t *testing.T, in *Input, name, what string) {
	t.Helper()
	rep := Check(in)
	for _, c := range rep.Checks {
		if c.Name == name {
			if c.OK {
				t.Errorf("%s passed; want it to fail (%s)", name, what)
			} else if !strings.Contains(strings.Join(c.Violations, "\n"), what) {
				t.Errorf("%s failed with %q; want a violation mentioning %q", name, c.Violations, what)
			}
			continue
		}
		if !c.OK {
			t.Errorf("%s failed too: %v", c.Name, c.Violations)
		}
	}
}

func TestCheckCleanHistory(t *testing.T) {
	rep := Check(history())
	if !rep.OK() {
		t.Fatalf("a clean history fails: %v", rep.Failed())
	}
	if rep.LeaseEnds["report"] != 1 || len(rep.Superseded) != 0 {
		t.Errorf("lease ends %v, superseded %v", rep.LeaseEnds, rep.Superseded)
	}
}

func TestCheckStaleWriteAccepted(t *testing.T) {
	in := history()
	// The reaper took the lease (epoch 2), then f1 re-sent an old report
	// and the stub said 200.
	in.Calls = append(in.Calls, coord.Call{At: at(4), Route: coord.RoutePatch, JobID: "j1", Factory: "f1", Epoch: 1, JobEpoch: 2, Stage: coord.StageBuilding, Status: 200, Resend: true})
	wantOnly(t, in, "no stale write accepted", "epoch 1 accepted while the job was at epoch 2")
}

// A live log chunk of a fenced run (its epoch reaped) must be refused.
func TestCheckStaleLogChunkAccepted(t *testing.T) {
	in := history()
	in.Calls = append(in.Calls, coord.Call{At: at(4), Route: coord.RouteLogAppend, JobID: "j1", Factory: "f1", Epoch: 1, JobEpoch: 2, Stage: coord.StageAssigned, Status: 200})
	wantOnly(t, in, "no stale write accepted", "POST /fleet/jobs/{id}/log j1 by f1 at 10:00:04.000: epoch 1 accepted while the job was at epoch 2")
}

func TestCheckWriteFromNonHolder(t *testing.T) {
	in := history()
	in.Calls = append(in.Calls, coord.Call{At: at(2.1), Route: coord.RouteRenew, JobID: "j1", Factory: "f2", Epoch: 1, JobEpoch: 1, Holder: "f1", Status: 200})
	wantOnly(t, in, "no stale write accepted", `accepted while "f1" held the lease`)
}

func TestCheckReapMustBeExplained(t *testing.T) {
	// f1 held epoch 1, renewed at 2 s, and was reaped at 13 s; f2 then ran
	// and shipped the job at epoch 2.
	in := history()
	in.State.Jobs["j1"].LeaseEpoch, in.State.Jobs["j1"].Attempts = 2, 2
	in.State.Events["j1"] = []coord.Event{
		{Seq: 1, At: at(0), Kind: "submitted", Stage: coord.StageQueued},
		{Seq: 2, At: at(1), Kind: "claimed", Factory: "f1", Epoch: 1, Stage: coord.StageAssigned},
		{Seq: 3, At: at(13), Kind: "reaped", Factory: "f1", Epoch: 2, Stage: coord.StageQueued},
		{Seq: 4, At: at(14), Kind: "claimed", Factory: "f2", Epoch: 2, Stage: coord.StageAssigned},
		{Seq: 5, At: at(16), Kind: "stage", Factory: "f2", Epoch: 2, Stage: coord.StageShipped},
	}
	in.Calls = []coord.Call{
		{At: at(1), Route: coord.RouteClaim, JobID: "j1", Factory: "f1", Epoch: 1, JobEpoch: 1, Attempts: 1, Status: 200},
		{At: at(2), Route: coord.RouteRenew, JobID: "j1", Factory: "f1", Epoch: 1, JobEpoch: 1, Holder: "f1", Status: 200},
		{At: at(14), Route: coord.RouteClaim, JobID: "j1", Factory: "f2", Epoch: 2, JobEpoch: 2, Attempts: 2, Status: 200},
		{At: at(16), Route: coord.RoutePatch, JobID: "j1", Factory: "f2", Epoch: 2, JobEpoch: 2, Holder: "f2", Stage: coord.StageShipped, Status: 200},
	}
	in.Pushes = []Push{{T: at(15), Factory: "f2", Phase: "run", Repo: "r1", Old: zeros, New: "bbbb", Ref: "refs/heads/aq/job/j1"}}
	in.OriginJobTips["j1"] = Commit{SHA: "bbbbbbbbbbbb", Message: "aq-job: j1\naq-attempt: 2\n"}
	in.Factories = nil
	wantOnly(t, in, "leases freed without the reaper", "reaped at 10:00:13.000 from f1")

	// The same reap while f1 was cut off is the zombie case: explained.
	in.Faults = []FaultRecord{{Fault: Fault{Kind: KindPartition, Target: 0}, Start: at(2.5), End: at(20)}}
	rep := Check(in)
	if !rep.OK() {
		t.Fatalf("an explained reap fails: %v", rep.Failed())
	}
	if len(rep.Reaps) != 1 || !strings.Contains(rep.Reaps[0].Explained, "partition of f1") {
		t.Errorf("reaps %+v", rep.Reaps)
	}
	if len(rep.Zombies) != 1 || rep.Zombies[0].Reaped != 1 {
		t.Errorf("zombies %+v", rep.Zombies)
	}
	// A fault that hit f1 when it had not renewed for 4 s explains nothing:
	// f1 had stopped renewing by itself (the chaos run that found the
	// receiver bug: an accept answered, the job held back by a hanging
	// settlement, the factory killed 6 s later).
	in.Faults[0].Start = at(6)
	if c := checkNamed(t, Check(in), "leases freed without the reaper"); c.OK {
		t.Error("a kill 4 s after the last renewal explained the lapse")
	}
	in.Faults[0].Start = at(2.5)

	// A fault on another factory explains nothing.
	in.Faults[0].Target = 1
	if c := checkNamed(t, Check(in), "leases freed without the reaper"); c.OK {
		t.Error("a partition of f2 explained a reap of f1's lease")
	}

	// A window of 503s explains the lapse only if it refused f1's
	// renewals of that lease: a holder that stopped renewing (its run over,
	// its report still being retried) let the lease lapse by itself.
	in.Faults = []FaultRecord{{Fault: Fault{Kind: KindErrors, Target: -1, Rate: 0.5}, Start: at(2.5), End: at(12)}}
	if c := checkNamed(t, Check(in), "leases freed without the reaper"); c.OK {
		t.Error("a 503 window explained a lapse with no refused renewal")
	}
	in.Requests = []Request{{At: at(4), Method: "POST", Path: "/fleet/jobs/j1/lease/renew", Job: "j1", Factory: "f1", Epoch: 1, Status: 503}}
	if rep := Check(in); !rep.OK() || !strings.Contains(rep.Reaps[0].Explained, "1 of f1's renewals refused 503") {
		t.Errorf("a lapse after refused renewals is not explained: %v %+v", rep.Failed(), rep.Reaps)
	}
}

func TestCheckPushWithoutLease(t *testing.T) {
	in := history()
	// f1 pushes the job branch after its lease ended (a zombie).
	in.Pushes = append(in.Pushes, Push{T: at(5), Factory: "f1", Phase: "run", Repo: "r1", Old: "bbbb", New: "cccc", Ref: "refs/heads/aq/job/j1"})
	wantOnly(t, in, "pushes only under a lease", `refs/heads/aq/job/j1 by "f1"`)
}

func TestCheckZombieOverwroteTheBranch(t *testing.T) {
	in := history()
	in.OriginJobTips["j1"] = Commit{SHA: "cccccccccccc", Message: "aq-job: j1\naq-attempt: 3\n"}
	wantOnly(t, in, "shipped at most once", "the accepted run was attempt 1 of f1")
}

func TestCheckTwoSuccessReports(t *testing.T) {
	in := history()
	in.Calls = append(in.Calls, coord.Call{At: at(3.5), Route: coord.RoutePatch, JobID: "j1", Factory: "f1", Epoch: 1, JobEpoch: 1, Holder: "f1", Stage: coord.StageShipped, Status: 200})
	rep := Check(in)
	if c := checkNamed(t, rep, "shipped at most once"); c.OK || !strings.Contains(strings.Join(c.Violations, " "), "2 success reports accepted") {
		t.Errorf("two accepted success reports: %+v", c)
	}
}

func TestCheckNotTerminal(t *testing.T) {
	in := history()
	in.State.Jobs["j1"].Stage = coord.StageQueued
	if c := checkNamed(t, Check(in), "terminal exactly once"); c.OK {
		t.Error("a queued job passed")
	}
	in = history()
	in.State.Events["j1"] = append(in.State.Events["j1"], coord.Event{Seq: 5, At: at(4), Kind: "stage", Factory: "f1", Epoch: 1, Stage: coord.StageShipped})
	if c := checkNamed(t, Check(in), "terminal exactly once"); c.OK {
		t.Error("a job that entered shipped twice passed")
	}
}

func TestCheckReportLost(t *testing.T) {
	in := history()
	in.Factories[0].Spool = []string{"00000000000000000007-j1.json"}
	wantOnly(t, in, "no report lost", "spool still holds")

	in = history()
	in.Factories[0].Delivered = append(in.Factories[0].Delivered, Delivered{Job: "j1", Epoch: 1, Report: "fail:crash"})
	wantOnly(t, in, "no report lost", "logged fail:crash of j1 at epoch 1 delivered")

	in = history()
	r := in.Factories[0].Records["j1"]
	r.EndedAt = time.Time{}
	in.Factories[0].Records["j1"] = r
	wantOnly(t, in, "no report lost", "still says running")
}

func TestCheckGCDeletedUnmergedWork(t *testing.T) {
	in := history()
	in.State.Jobs["j1"].Stage = coord.StageDeadLetter
	in.State.Events["j1"][3].Stage = coord.StageDeadLetter
	in.Calls[3] = coord.Call{At: at(3), Route: coord.RouteFail, JobID: "j1", Factory: "f1", Epoch: 1, JobEpoch: 1, Holder: "f1", Stage: coord.StageDeadLetter, Reason: "engine_failed", Status: 200}
	in.Pushes = in.Pushes[:1]
	delete(in.OriginJobTips, "j1")
	in.Jobs[0].Plan = PlanAlways
	in.Factories[0].Records["j1"] = jobstate.Record{ID: "j1", Stage: "dead_letter", Reason: "engine_failed", LeaseEpoch: 1, EndedAt: at(3)}
	in.Factories[0].Delivered[1].Report = "fail:engine_failed"
	wantOnly(t, in, "gc: nothing left, nothing unmerged lost", "a WIP ref of a job that is dead_letter")

	// A commit that disappears with no deleted ref to explain it.
	in = history()
	in.GC[0].Lost["f1/r1"] = append(in.GC[0].Lost["f1/r1"], "dddd")
	wantOnly(t, in, "gc: nothing left, nothing unmerged lost", "commit dddd became unreachable")

	in = history()
	in.GC[0].WorktreeDirs = []string{"r1/j1"}
	wantOnly(t, in, "gc: nothing left, nothing unmerged lost", "worktree left")
}

func TestCheckEngineAlive(t *testing.T) {
	in := history()
	in.Alive = []string{"4242 j1"}
	wantOnly(t, in, "no engine left alive", "4242 j1")
}

func TestCheckOutcomesFitThePlans(t *testing.T) {
	in := history()
	in.Problems = []string{"factory f2 exited -1 terminated after sigterm (want 0)"}
	wantOnly(t, in, "no crash, outcomes fit the plans", "f2 exited -1")

	in = history()
	in.Jobs[0].Plan = PlanAlways // an engine that always fails cannot have shipped
	wantOnly(t, in, "no crash, outcomes fit the plans", "j1 (always fails) shipped")

	in = history()
	in.Jobs[0].Plan = PlanInvalid // an invalid manifest ends failed, invalid_manifest
	wantOnly(t, in, "no crash, outcomes fit the plans", "j1 (invalid manifest) ended shipped")
}

func TestScheduleIsSeededAndFactoryFaultsDoNotOverlap(t *testing.T) {
	cfg := Full(42)
	a, b := Schedule(cfg), Schedule(cfg)
	if len(a) != len(b) {
		t.Fatal("same seed, different schedules")
	}
	for i := range a {
		if a[i] != b[i] {
			t.Fatalf("same seed, fault %d differs: %+v vs %+v", i, a[i], b[i])
		}
	}
	c := cfg.Faults
	if want := c.Kill9 + c.Term + c.Abort + c.PeerRestart + c.StubRestart + c.Errors + c.ReportErrors + c.Partition + c.HostLost + c.Preempt + c.Kill9Sandboxed; len(a) != want {
		t.Errorf("%d faults, want %d", len(a), want)
	}
	if d := Schedule(Full(43)); len(d) == len(a) && d[0] == a[0] && d[1] == a[1] {
		t.Error("another seed gave the same schedule")
	}
	busy := map[int]time.Duration{}
	for _, f := range a {
		if f.Kind == KindPartition && f.Down <= cfg.LeaseTTL {
			t.Errorf("a partition of %s does not outlast the lease TTL %s", f.Down, cfg.LeaseTTL)
		}
		if !f.factoryFault() {
			continue
		}
		if f.At < busy[f.Target] {
			t.Errorf("fault %+v starts while factory %d is still down (until %s)", f, f.Target, busy[f.Target])
		}
		busy[f.Target] = f.At + f.Down
	}
}

func TestLoadIsSeeded(t *testing.T) {
	cfg := Full(7)
	a, b := Load(cfg, "tok"), Load(cfg, "tok")
	plans := map[string]int{}
	for i := range a {
		if a[i] != b[i] {
			t.Fatalf("same seed, job %d differs", i)
		}
		plans[a[i].Plan]++
		if !strings.HasPrefix(a[i].ID, "cj-tok-") {
			t.Errorf("id %s", a[i].ID)
		}
	}
	for _, p := range []string{PlanOK, PlanFail, PlanAlways, PlanHang, PlanInvalid} {
		if plans[p] == 0 {
			t.Errorf("no job of plan %s in %d jobs", p, len(a))
		}
	}
	stragglers := 0
	for _, j := range a {
		if j.Straggler {
			stragglers++
		}
	}
	if stragglers < len(a)/8 || stragglers > len(a)/2 {
		t.Errorf("%d of %d jobs daemonise a straggler, want about a quarter", stragglers, len(a))
	}
}

// The load outlasts every fault that must land mid-job, for any seed: the
// reduced run once cut off an idle factory because the overlap rules had
// pushed its partition past the last submission.
func TestLoadOutlastsMidJobFaults(t *testing.T) {
	for seed := uint64(1); seed <= 200; seed++ {
		for _, cfg := range []Config{Reduced(seed), Full(seed)} {
			sched := Schedule(cfg)
			cfg.SubmitSpan = LoadSpan(cfg, sched)
			last := time.Duration(0)
			for _, j := range Load(cfg, "tok") {
				last = max(last, j.SubmitAt)
			}
			for _, f := range sched {
				if f.factoryFault() && last < f.At+10*time.Second {
					t.Fatalf("%s seed %d: %s at %s, last submission at %s", cfg.Name, seed, f.Kind, f.At, last)
				}
			}
		}
	}
}

// A host lost (or a kill -9, or a preemption) after the engine wrote part
// one, more than one checkpoint interval earlier: the next run must start
// from it.
func TestCheckWorkLost(t *testing.T) {
	in := history()
	in.Faults = []FaultRecord{{Fault: Fault{Kind: KindHostLost, Target: 0}, Start: at(6), End: at(9)}}
	in.Runs = append(in.Runs,
		EngineRun{Job: "j2", N: 1, Factory: "f1", Start: at(1), Part1: at(2), Alive: at(6)},
		EngineRun{Job: "j2", N: 2, Factory: "f2", Start: at(20), Part1: at(21), Alive: at(23), Done: at(23)})
	wantOnly(t, in, "work lost ≤ one checkpoint interval", "run 2 resumed without it")

	// Part one written within the interval before the loss may be lost.
	in.Runs[1].Part1 = at(5.5)
	if c := checkNamed(t, Check(in), "work lost ≤ one checkpoint interval"); !c.OK {
		t.Errorf("work younger than one interval counted as lost: %v", c.Violations)
	}
	// And work the next run found is not lost.
	in.Runs[1].Part1 = at(2)
	in.Runs[2].Found1 = 1
	if c := checkNamed(t, Check(in), "work lost ≤ one checkpoint interval"); !c.OK {
		t.Errorf("resumed work counted as lost: %v", c.Violations)
	}
}

// An engine that lives on after its aq was killed -9.
func TestCheckEngineOutlivesItsAQ(t *testing.T) {
	in := history()
	in.Faults = []FaultRecord{{Fault: Fault{Kind: KindKill9, Target: 0}, Start: at(5), End: at(7)}}
	in.Runs = append(in.Runs, EngineRun{Job: "j2", N: 1, Factory: "f1", Start: at(1), Alive: at(9)})
	wantOnly(t, in, "no engine or straggler outlives its aq", "j2 run 1 on f1 lived 4s after its aq was killed (kill9)")
}

// A straggler — a process an engine daemonised, its tag dropped, its
// process group left — that lives on after its aq was killed -9 under the
// sandboxed engine (its engine ended with aq: the supervisor's sweep by
// tag cannot find the straggler; only the sandbox ends it), and one that
// outlives its run however the run ended. What a sandbox that ends both
// with the run leaves passes.
func TestCheckStragglerOutlivesItsAQ(t *testing.T) {
	kill := FaultRecord{Fault: Fault{Kind: KindKill9Sandboxed, Target: 0}, Start: at(5), End: at(7), Job: "j2/1"}
	in := history()
	in.Faults = []FaultRecord{kill}
	in.Runs = append(in.Runs, EngineRun{Job: "j2", N: 1, Factory: "f1", Start: at(1), Alive: at(5.1), Straggler: at(60)})
	wantOnly(t, in, "no engine or straggler outlives its aq", "the straggler of j2 run 1 on f1 lived 55s after its aq was killed (kill9-sandboxed)")

	in = history()
	in.Runs[0].Straggler = at(40) // j1's run ended at 2.7, with no fault
	wantOnly(t, in, "no engine or straggler outlives its aq", "the straggler of j1 run 1 on f1 lived 37.3s after its run")

	// A run killed before its first heartbeat: its start is its last sign
	// (found by the first sandboxed chaos run, which read a zero time).
	in = history()
	in.Runs = append(in.Runs, EngineRun{Job: "j2", N: 1, Factory: "f2", Start: at(4), Straggler: at(9)})
	wantOnly(t, in, "no engine or straggler outlives its aq", "the straggler of j2 run 1 on f2 lived 5s after its run")

	in = history()
	in.Faults = []FaultRecord{kill}
	in.Runs[0].Straggler = at(2.75)
	in.Runs = append(in.Runs, EngineRun{Job: "j2", N: 1, Factory: "f1", Start: at(1), Alive: at(5.1), Straggler: at(5.15)})
	rep := Check(in)
	if c := checkNamed(t, rep, "no engine or straggler outlives its aq"); !c.OK || !strings.Contains(c.Summary, "1 engines running at a kill -9 (1 with a straggler up)") || !strings.Contains(c.Summary, "2 stragglers in all") {
		t.Fatalf("stragglers that ended with their aq and their run: %v %s", c.Violations, c.Summary)
	}
}

// An engine started again after the job's result was on origin.
func TestCheckEngineRerunAfterDelivery(t *testing.T) {
	in := history()
	in.Runs = append(in.Runs, EngineRun{Job: "j1", N: 2, Factory: "f2", Start: at(4), Alive: at(6), Done: at(6)})
	wantOnly(t, in, "no engine re-run for a delivered result", "run 2 started on f2 1.2s after")
}

// A result pushed by an earlier attempt that was lost before its report,
// and reported by the next attempt without running the engine, is the
// accepted run's result.
func TestCheckRedeliveredResult(t *testing.T) {
	in := history()
	in.OriginJobTips["j1"] = Commit{SHA: "aaaabbbbcccc", Message: "chaos job j1\n\naq-job: j1\naq-engine: script\naq-attempt: 0\n"}
	wantOnly(t, in, "shipped at most once", "but the accepted run was attempt 1 of f1")
	rec := in.Factories[0].Records["j1"]
	rec.Delivered = "aaaabbbbcccc"
	in.Factories[0].Records["j1"] = rec
	if rep := Check(in); !rep.OK() || len(rep.Redelivered) != 1 {
		t.Fatalf("a redelivered result: failed %v, redelivered %v", rep.Failed(), rep.Redelivered)
	}
}

// A push that lands just after a requeue revoked the pusher's lease, before
// anyone else holds the job, was in flight; later, or after a new owner
// took the job, it is a push without a lease.
func TestCheckPushInFlightAtARequeue(t *testing.T) {
	in := history()
	in.State.Events["j1"] = append(in.State.Events["j1"][:3],
		coord.Event{Seq: 4, At: at(2), JobID: "j1", Kind: "requeued", Factory: "f1", Epoch: 2, Stage: coord.StageQueued},
		coord.Event{Seq: 5, At: at(5), JobID: "j1", Kind: "claimed", Factory: "f2", Epoch: 3, Stage: coord.StageAssigned})
	in.Calls = in.Calls[:3] // f1's run never reported: its lease ended by the requeue
	in.Pushes = []Push{{T: at(2.1), Factory: "f1", Phase: "run", Repo: "r1", Old: zeros, New: "aaaa", Ref: "refs/heads/aq/wip/j1"}}
	rep := Check(in)
	if c := checkNamed(t, rep, "pushes only under a lease"); !c.OK || len(rep.InFlight) != 1 {
		t.Fatalf("a push 100 ms after the requeue: %v, in flight %v", c.Violations, rep.InFlight)
	}
	in.Pushes[0].T = at(4)
	if c := checkNamed(t, Check(in), "pushes only under a lease"); c.OK {
		t.Fatal("a push 2 s after the requeue passed")
	}
}
