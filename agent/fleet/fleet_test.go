package fleet

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aqfleet/aq/agent/config"
	"github.com/aqfleet/aq/agent/jobstate"
	"github.com/aqfleet/aq/demo/coord"
	"github.com/aqfleet/aq/demo/coord/coordtest"
	"github.com/aqfleet/aq/internal/testenv"
	"github.com/aqfleet/aq/job"
	"github.com/aqfleet/aq/worktree"
)

// Job ids are unique per test binary run: the runner kills every process
// tagged with a job's id when the job ends, host-wide, so two test binaries
// running jobs of the same id at once would kill each other's engines.
var (
	idOne       = testenv.ID("one")
	idTwo       = testenv.ID("two")
	idVictim    = testenv.ID("victim")
	idIsland    = testenv.ID("island")
	idFlaky     = testenv.ID("flaky")
	idBroken    = testenv.ID("broken")
	idDurable   = testenv.ID("durable")
	idSteady    = testenv.ID("steady")
	idFresh     = testenv.ID("fresh")
	idSecretive = testenv.ID("secretive")
	idAlpha     = testenv.ID("alpha")
	idBeta      = testenv.ID("beta")
	idUnstarted = testenv.ID("unstarted")
	idStormA    = testenv.ID("storm-a")
	idStormB    = testenv.ID("storm-b")
	idStormC    = testenv.ID("storm-c")
	idStormD    = testenv.ID("storm-d")
	idRefused   = testenv.ID("refused")
	idLocked    = testenv.ID("locked")
)

// TestRunOnceEndToEnd: enroll, heartbeat, claim, building, run through the
// real pipeline (real git, a script engine), push the job branch, report the
// success stage; one job, one claim.
func TestRunOnceEndToEnd(t *testing.T) {
	testenv.Slow(t, "runs fleet jobs against a coordinator with real git")
	t.Parallel()
	eachRouteSet(t, func(t *testing.T, rs routeSet) {
		s := startStub(t, rs.opts(coord.Options{}))
		w := newWorld(t, "app")
		s.submit(t, idOne, "app", "script: echo one > one.txt\nship: branch")
		s.submit(t, idTwo, "app", "script: echo two > two.txt\nship: branch")
		f := newFactory(t, s, w, "f1")

		res, err := f.runOnce(t, ctxT(t))
		if err != nil {
			t.Fatal(err)
		}
		if res.Outcome.Failed() || res.Stage != job.Shipped || res.Report != "delivered" || res.LeaseEpoch != 1 {
			t.Fatalf("result %+v", res)
		}
		j, _ := s.Job(res.JobID)
		if j.Stage != coord.StageShipped || j.Holder != "" || j.Branch != "aq/job/"+res.JobID || j.Checkpoint == "" || len(j.Insights) == 0 {
			t.Fatalf("stub job %+v", j)
		}
		if got := kinds(s.Events(res.JobID)); !slices.Equal(got, []string{"submitted", "claimed", "stage:building", "stage:shipped"}) {
			t.Fatalf("events %v", got)
		}
		refs := testenv.RemoteRefs(t, w.origins["app"], "refs/heads/aq/job/")
		if _, ok := refs["refs/heads/aq/job/"+res.JobID]; !ok || len(refs) != 1 {
			t.Fatalf("origin job refs %v", refs)
		}
		// --once: exactly one claim, and the other job is still queued.
		st := s.Stats()
		if n := st.Count(coord.RouteClaim); n != 1 {
			t.Fatalf("%d claims, want 1", n)
		}
		if n := st.Count(coord.RouteEnroll); n != 1 {
			t.Fatalf("%d enrolls", n)
		}
		if n := st.Count(coord.RouteHeartbeat); n < 1 {
			t.Fatalf("no heartbeat")
		}
		other := idTwo
		if res.JobID == idTwo {
			other = idOne
		}
		if j, _ := s.Job(other); j.Stage != coord.StageQueued {
			t.Fatalf("the other job is %s", j.Stage)
		}
		// The factory's own record.
		recs, _ := jobstate.Open(filepath.Join(f.Home, "state", "jobs"))
		rec, err := recs.Get(res.JobID)
		if err != nil || rec.Stage != job.Shipped || rec.LeaseEpoch != 1 || rec.Running() || rec.Source != "poll" || rec.Branch == "" {
			t.Fatalf("record %+v %v", rec, err)
		}
		// The factory heartbeats what it runs: seen by the stub.
		fs := s.Factories()
		if len(fs) != 1 || fs[0].ID != "f1" || fs[0].Stale {
			t.Fatalf("factories %+v", fs)
		}
	})
}

// TestClaimRaceExactlyOneWins: factories claiming at once never get the
// same job; every job goes to exactly one of them.
func TestClaimRaceExactlyOneWins(t *testing.T) {
	testenv.Slow(t, "runs fleet jobs against a coordinator with real git")
	t.Parallel()
	s := startStub(t, coord.Options{Latency: 2 * time.Millisecond})
	const jobs = 12
	for i := range jobs {
		s.submit(t, testenv.ID(fmt.Sprintf("race-%02d", i)), "app", "script: true")
	}
	w := newWorld(t, "app")
	var clients []*Client
	for i := range 4 {
		f := newFactory(t, s, w, fmt.Sprintf("racer-%d", i))
		c := f.Agent.Client
		c.SetOffer([]string{"os:linux", "engine:script"}, []string{"app"})
		if _, err := EnsureEnrolled(ctxT(t), c, EnrollOptions{Path: f.Cfg.CredentialsFile(), EnvToken: s.EnrollToken(), Request: EnrollRequest{FactoryID: f.ID}}); err != nil {
			t.Fatal(err)
		}
		clients = append(clients, c)
	}
	var mu sync.Mutex
	won := map[string][]string{} // job → factories that got it
	var wg sync.WaitGroup
	start := make(chan struct{})
	for _, c := range clients {
		for range 2 { // two goroutines per factory
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				for {
					cl, err := c.Claim(context.Background(), false)
					if err != nil {
						t.Error(err)
						return
					}
					if cl == nil {
						return
					}
					mu.Lock()
					won[cl.Job.ID] = append(won[cl.Job.ID], c.FactoryID())
					mu.Unlock()
				}
			}()
		}
	}
	close(start)
	wg.Wait()
	if len(won) != jobs {
		t.Fatalf("%d jobs claimed, want %d", len(won), jobs)
	}
	for id, fs := range won {
		if len(fs) != 1 {
			t.Errorf("job %s claimed by %v", id, fs)
		}
		j, _ := s.Job(id)
		if j.LeaseEpoch != 1 || j.Holder != fs[0] || j.Stage != coord.StageAssigned {
			t.Errorf("job %s: epoch %d holder %s stage %s", id, j.LeaseEpoch, j.Holder, j.Stage)
		}
	}
}

// TestRequeuedWhileRunningIsFenced: an operator requeues a job while it
// runs; the old holder's next renewal is refused (409), its engine is
// stopped and its work checkpointed locally, and it pushes nothing, opens no
// PR and sends no report after the 409.
func TestRequeuedWhileRunningIsFenced(t *testing.T) {
	t.Parallel()
	testenv.Slow(t, "runs fleet jobs through outages, partitions or retry budgets")
	eachRouteSet(t, func(t *testing.T, rs routeSet) {
		s := startStub(t, rs.opts(coord.Options{LeaseTTL: 30 * time.Second}))
		w := newWorld(t, "app")
		script, started, _ := w.waitScript(idVictim)
		s.submit(t, idVictim, "app", "script: "+script+"\nship: branch")
		f := newFactory(t, s, w, "old-holder")

		done := make(chan *Result, 1)
		go func() {
			res, err := f.runOnce(t, ctxT(t))
			if err != nil {
				t.Error(err)
			}
			done <- res
		}()
		testenv.WaitFor(t, time.Minute, "the engine to start", func() bool { return testenv.Exists(started) })
		if _, err := s.Action(idVictim, "requeue"); err != nil {
			t.Fatal(err)
		}
		res := <-done
		if !res.Fenced || res.Outcome.Reason != job.ReasonFenced || res.Report != "none" {
			t.Fatalf("result %+v", res)
		}
		// No push of the job branch (and no WIP push: fenced) from the old holder.
		if refs := testenv.RemoteRefs(t, w.origins["app"], "refs/heads/aq/"); len(refs) != 0 {
			t.Fatalf("the fenced factory pushed %v", refs)
		}
		// Its work is checkpointed locally.
		repo := filepath.Join(f.Base, "app")
		wip := testenv.Git(t, repo, "rev-parse", "--verify", "refs/heads/aq/wip/"+idVictim)
		if wip == "" || res.Outcome.Checkpoint != wip {
			t.Fatalf("local WIP %q, outcome checkpoint %q", wip, res.Outcome.Checkpoint)
		}
		// After the first 409 the old holder sent nothing more for the job.
		evs := s.Events(idVictim)
		first := -1
		for i, e := range evs {
			if e.Kind == "fenced" && e.Factory == "old-holder" {
				first = i
				break
			}
		}
		if first < 0 {
			t.Fatalf("no 409 recorded: %v", kinds(evs))
		}
		for _, e := range evs[first+1:] {
			if e.Factory == "old-holder" {
				t.Fatalf("the fenced factory called again after the 409: %+v (all: %v)", e, kinds(evs))
			}
		}
		j, _ := s.Job(idVictim)
		if j.Stage != coord.StageQueued || j.LeaseEpoch != 2 || j.Branch != "" {
			t.Fatalf("stub job %+v", j)
		}
		rec, _ := f.Agent.Jobs.Records.Get(idVictim)
		if !rec.Fenced || rec.Reason != job.ReasonFenced {
			t.Fatalf("record %+v", rec)
		}
	})
}

// TestLeaseExpiryWhilePartitioned: the factory loses the network (a
// blackholed route); it cannot renew, so when the lease's expiry is near it
// stops the engine (lease_lost) and checkpoints; the stub's reaper requeues
// the job with the epoch bumped and the checkpoint kept. When the network
// returns, the factory's spooled fail is refused (409) and dropped.
func TestLeaseExpiryWhilePartitioned(t *testing.T) {
	t.Parallel()
	testenv.Slow(t, "runs fleet jobs through outages, partitions or retry budgets")
	eachRouteSet(t, func(t *testing.T, rs routeSet) {
		s := startStub(t, rs.opts(coord.Options{LeaseTTL: 3 * time.Second, ReapEvery: 50 * time.Millisecond}))
		p, err := coord.NewPartition(s.Addr)
		if err != nil {
			t.Fatal(err)
		}
		defer p.Close()
		w := newWorld(t, "app")
		script, started, _ := w.waitScript(idIsland)
		s.submit(t, idIsland, "app", "script: "+script+"\nship: branch")
		f := newFactory(t, s, w, "islander", func(c *config.Config, _ *Parts) {
			c.FleetAPI = "http://" + p.Addr() + "/api"
		}, func(_ *config.Config, parts *Parts) {
			parts.Budgets.PerTry = 300 * time.Millisecond
		})
		done := make(chan *Result, 1)
		go func() {
			res, _ := f.runOnce(t, ctxT(t))
			done <- res
		}()
		testenv.WaitFor(t, time.Minute, "the engine to start", func() bool { return testenv.Exists(started) })
		p.Blackhole()
		res := <-done
		if res.Outcome.Reason != job.ReasonLeaseLost || res.Report != "spooled" || res.Stage != job.Failed {
			t.Fatalf("result %+v", res)
		}
		// Nothing pushed as a result; the engine's work is checkpointed.
		if refs := testenv.RemoteRefs(t, w.origins["app"], "refs/heads/aq/job/"); len(refs) != 0 {
			t.Fatalf("pushed %v", refs)
		}
		if res.Outcome.Checkpoint == "" {
			t.Fatal("no checkpoint")
		}
		testenv.WaitFor(t, time.Minute, "the reaper", func() bool { j, _ := s.Job(idIsland); return j.Stage == coord.StageQueued })
		j, _ := s.Job(idIsland)
		if j.LeaseEpoch != 2 || j.Holder != "" || j.Reason != string(job.ReasonLeaseLost) {
			t.Fatalf("reaped job %+v", j)
		}
		// The network comes back: the spooled fail carries the old epoch and is
		// fenced; the spool empties and the record says so.
		p.Heal()
		r, err := f.Agent.Reporter.Drain(ctxT(t))
		if err != nil || r.Fenced != 1 || r.Delivered != 0 {
			t.Fatalf("drain %+v %v", r, err)
		}
		if f.Agent.Reporter.Spool.Depth() != 0 || len(f.Agent.Reporter.Spool.Dead()) != 0 {
			t.Fatal("spool not empty")
		}
		rec, _ := f.Agent.Jobs.Records.Get(idIsland)
		if !rec.Fenced {
			t.Fatalf("record %+v", rec)
		}
		if j2, _ := s.Job(idIsland); j2.Stage != coord.StageQueued || j2.LeaseEpoch != 2 {
			t.Fatalf("the late fail changed the job: %+v", j2)
		}
	})
}

// TestFailFreesLeaseImmediately: a failed job is reported with /fleet/fail
// and its lease is free the moment the call returns — no reaper involved
// (its TTL is an hour, the reaper never runs) — so another factory can claim
// it at once. Against today's coordinator (legacy: no /fleet/fail) the
// failure goes out as a fenced PATCH (queued: a retry is left; then failed:
// none) followed by lease/release: the lease is just as free, nothing is
// parked in spool/dead, and each factory tried /fleet/fail once.
func TestFailFreesLeaseImmediately(t *testing.T) {
	testenv.Slow(t, "runs fleet jobs against a coordinator with real git")
	t.Parallel()
	eachRouteSet(t, func(t *testing.T, rs routeSet) {
		s := startStub(t, rs.opts(coord.Options{LeaseTTL: time.Hour, ReapEvery: time.Hour, MaxBackoff: time.Millisecond}))
		w := newWorld(t, "app")
		s.submit(t, idFlaky, "app", "script: exit 3\nretry: { max: 1 }")
		f1 := newFactory(t, s, w, "first")
		res, err := f1.runOnce(t, ctxT(t))
		if err != nil {
			t.Fatal(err)
		}
		if res.Outcome.Reason != job.ReasonEngineFailed || res.Report != "delivered" || res.Stage != job.Inbox {
			t.Fatalf("result %+v", res)
		}
		j, _ := s.Job(idFlaky)
		if j.Stage != coord.StageQueued || j.Holder != "" || !j.LeaseExpiresAt.IsZero() || j.Attempts != 1 {
			t.Fatalf("after fail: %+v", j)
		}
		// Another factory takes it right away (epoch 2), fails it again: retries
		// exhausted → dead_letter.
		time.Sleep(5 * time.Millisecond) // the 1 ms backoff cap
		f2 := newFactory(t, s, w, "second")
		res2, err := f2.runOnce(t, ctxT(t))
		if err != nil {
			t.Fatal(err)
		}
		// Full: the coordinator applies the policy (dead_letter). Legacy:
		// aq does, and PATCHes failed.
		if res2.LeaseEpoch != 2 || res2.Attempt != 2 || res2.Stage != pick(rs, job.DeadLetter, job.Failed) || res2.Report != "delivered" {
			t.Fatalf("second run %+v", res2)
		}
		if j, _ := s.Job(idFlaky); j.Holder != "" || !j.LeaseExpiresAt.IsZero() {
			t.Fatalf("after the second fail the lease is held: %+v", j)
		}
		if n := s.Reap(time.Now()); n != 0 {
			t.Fatalf("the reaper found %d leases to reap", n)
		}
		for _, f := range []*factory{f1, f2} {
			if d := f.Agent.Reporter.Spool.Dead(); len(d) != 0 || f.Agent.Reporter.Spool.Depth() != 0 {
				t.Fatalf("%s: spool/dead %v, depth %d", f.ID, d, f.Agent.Reporter.Spool.Depth())
			}
		}
		want := []string{"submitted", "claimed", "stage:building", "fail:queued", "claimed", "stage:building", "fail:dead_letter"}
		if rs.legacy() {
			want = []string{"submitted", "claimed", "stage:building", "stage:queued", "released", "claimed", "stage:building", "stage:failed", "released"}
			st := s.Stats()
			// Once per factory each: /fleet/fail and the live log's route.
			if n := st.Routes["unmatched"].Status["404"]; n != 2+2 {
				t.Fatalf("%d requests to routes the stub lacks, want /fleet/fail and the live log once per factory (4)", n)
			}
			if f1.Agent.Client.Has(RouteFail) || !strings.Contains(f1.Logs.String(), "the coordinator has no POST /fleet/fail route") {
				t.Fatalf("the absence was not learnt or not said:\n%s", f1.Logs)
			}
		}
		if got := kinds(s.Events(idFlaky)); !slices.Equal(got, want) {
			t.Fatalf("events %v, want %v", got, want)
		}
	})
}

// TestLegacyFencedFailPatchSendsNothingMore: against today's coordinator, a
// failure whose fallback PATCH is refused (409: an operator requeued the job
// meanwhile) is fenced — no lease/release follows, nothing is parked.
func TestLegacyFencedFailPatchSendsNothingMore(t *testing.T) {
	testenv.Slow(t, "runs fleet jobs against a coordinator with real git")
	t.Parallel()
	s := startStub(t, coord.Options{Routes: coord.RoutesLegacy, LeaseTTL: time.Hour})
	w := newWorld(t, "app")
	id := testenv.ID("requeued-failure")
	s.submit(t, id, "app", "script: true")
	f := newFactory(t, s, w, "late")
	c := f.Agent.Client
	c.SetOffer([]string{"os:linux", "engine:script"}, []string{"app"})
	if _, err := EnsureEnrolled(ctxT(t), c, EnrollOptions{Path: f.Cfg.CredentialsFile(), EnvToken: s.EnrollToken(), Request: EnrollRequest{FactoryID: "late"}}); err != nil {
		t.Fatal(err)
	}
	cl, err := c.Claim(ctxT(t), false)
	if err != nil || cl == nil {
		t.Fatal(cl, err)
	}
	if _, err := s.Action(id, "requeue"); err != nil {
		t.Fatal(err)
	}
	s.ResetStats()
	d := f.Agent.Reporter.Send(ctxT(t), FailReport(FailRequest{JobID: id, LeaseEpoch: cl.LeaseEpoch, Reason: job.ReasonEngineFailed, Retryable: true}))
	if !d.Fenced {
		t.Fatalf("delivery %+v", d)
	}
	st := s.Stats()
	if st.Count(coord.RoutePatch) != 1 || st.Count(coord.RouteRelease) != 0 || st.Total() != 2 {
		t.Fatalf("after the 409 more was sent: %s", statsText(st))
	}
	if len(f.Agent.Reporter.Spool.Dead()) != 0 || f.Agent.Reporter.Spool.Depth() != 0 {
		t.Fatal("the fenced report was kept")
	}
	if j, _ := s.Job(id); j.Stage != coord.StageQueued || j.LeaseEpoch != 2 || j.Holder != "" {
		t.Fatalf("job %+v", j)
	}
}

// TestGateOffWithoutQueueState: a coordinator without GET
// /fleet/queue-state (older than the gate) — the gated poll path reads it
// once, learns it is absent, and claims on every tick from then on (the
// plain poll with backoff), saying so once.
func TestGateOffWithoutQueueState(t *testing.T) {
	testenv.Slow(t, "runs fleet jobs against a coordinator with real git")
	t.Parallel()
	s := startStub(t, coord.Options{Routes: coord.RoutesLegacy, Without: []string{coord.RouteQueueState}})
	w := newWorld(t, "app")
	f := newFactory(t, s, w, "ungated")
	c := f.Agent.Client
	if _, err := EnsureEnrolled(ctxT(t), c, EnrollOptions{Path: f.Cfg.CredentialsFile(), EnvToken: s.EnrollToken(), Request: EnrollRequest{FactoryID: "ungated"}}); err != nil {
		t.Fatal(err)
	}
	c.SetOffer([]string{"os:linux", "engine:script"}, []string{"app"})
	p := &Poller{Client: c, Base: time.Second, Gate: true, Log: f.Agent.Log}
	s.ResetStats()
	for range 5 {
		if cl, err := p.Tick(ctxT(t)); cl != nil || err != nil {
			t.Fatal(cl, err)
		}
	}
	st := s.Stats()
	if st.Count(coord.RouteQueueState) != 1 || st.Count(coord.RouteClaim) != 5 {
		t.Fatalf("queue-state tried %d times (want 1), claims %d (want 5)", st.Count(coord.RouteQueueState), st.Count(coord.RouteClaim))
	}
	if n := strings.Count(f.Logs.String(), "the coordinator has no GET /fleet/queue-state route"); n != 1 {
		t.Fatalf("said %d times:\n%s", n, f.Logs)
	}
	s.submit(t, idFresh+"-ungated", "app", "script: true")
	if cl, err := p.Tick(ctxT(t)); err != nil || cl == nil {
		t.Fatalf("the plain poll did not claim the new job: %v %v", cl, err)
	}
	if p.idle = 100; p.Wait() < 6*time.Second {
		t.Fatalf("no idle backoff: %v", p.Wait())
	}
}

func statsText(st coord.Stats) string {
	var b strings.Builder
	for r, rs := range st.Routes {
		fmt.Fprintf(&b, "%s: %d %v; ", r, rs.Requests, rs.Status)
	}
	return b.String()
}

// TestInvalidManifestFailsWithoutRetry: the bodyMd is parsed and validated
// locally like a local manifest; an invalid one fails as invalid_manifest,
// not retryable.
func TestInvalidManifestFailsWithoutRetry(t *testing.T) {
	testenv.Slow(t, "runs fleet jobs against a coordinator with real git")
	t.Parallel()
	eachRouteSet(t, func(t *testing.T, rs routeSet) {
		s := startStub(t, rs.opts(coord.Options{}))
		w := newWorld(t, "app")
		bad := "---\nid: broken\nrepo: app\nengine: script\nscript: true\nnosuchkey: 1\n---\n# broken\n"
		c := s.operator(t)
		if _, err := c.Submit(ctxT(t), &job.Job{ID: idBroken, Repo: "app", Engine: "script", Capabilities: []string{}}, []byte(bad)); err != nil {
			t.Fatal(err)
		}
		f := newFactory(t, s, w, "f1")
		res, err := f.runOnce(t, ctxT(t))
		if err != nil {
			t.Fatal(err)
		}
		if res.Outcome.Reason != job.ReasonInvalidManifest || !strings.Contains(res.Outcome.Detail, "nosuchkey") || res.Stage != job.Failed {
			t.Fatalf("result %+v", res)
		}
		if j, _ := s.Job(idBroken); j.Stage != coord.StageFailed {
			t.Fatalf("stub stage %s", j.Stage)
		}
	})
}

// TestStubKilledMidJobSpoolDeliversInOrder: the coordinator refuses the
// building report (503s), then dies while the job runs; the job finishes
// and its reports wait in the spool. aq exits; the stub restarts from its
// state file; the next aq start delivers both reports, in order.
func TestStubKilledMidJobSpoolDeliversInOrder(t *testing.T) {
	t.Parallel()
	testenv.Slow(t, "runs fleet jobs through outages, partitions or retry budgets")
	stateFile := filepath.Join(t.TempDir(), "coord.json")
	opts := coord.Options{StateFile: stateFile, LeaseTTL: time.Minute, FailRate: 1, FaultRoutes: []string{coord.RoutePatch}}
	st := startStub(t, opts)
	addr := st.Addr
	w := newWorld(t, "app")
	script, started, goFile := w.waitScript(idDurable)
	st.submit(t, idDurable, "app", "script: "+script+"\nship: none")
	f := newFactory(t, st, w, "survivor")

	done := make(chan *Result, 1)
	go func() {
		res, _ := f.runOnce(t, ctxT(t))
		done <- res
	}()
	testenv.WaitFor(t, time.Minute, "the engine to start", func() bool { return testenv.Exists(started) })
	st.Kill() // the stub dies mid-job
	testenv.WriteFile(t, goFile, "go")
	res := <-done
	if res.Outcome.Failed() || res.Stage != job.Testing || res.Report != "spooled" {
		t.Fatalf("result %+v", res)
	}
	reps, _ := f.Agent.Reporter.Spool.Pending()
	if len(reps) != 2 || reps[0].Patch.Stage != "building" || reps[1].Patch.Stage != "testing" {
		t.Fatalf("spool %+v", reps)
	}

	// The stub comes back with its state (no more faults); a new aq starts.
	opts.FailRate = 0
	s2 := coordtest.StartOn(t, addr, opts, nil)
	if j, _ := s2.Job(idDurable); j.Stage != coord.StageAssigned || j.Holder != "survivor" {
		t.Fatalf("restored job %+v", j)
	}
	f.rebuild(t)
	res2, err := f.runOnce(t, ctxT(t))
	if !errors.Is(err, ErrNoJob) || res2 != nil {
		t.Fatalf("second start: %v %+v", err, res2)
	}
	if d := f.Agent.Reporter.Spool.Depth(); d != 0 {
		t.Fatalf("%d reports left", d)
	}
	j, _ := s2.Job(idDurable)
	if j.Stage != coord.StageTesting || j.Checkpoint == "" {
		t.Fatalf("stub job %+v", j)
	}
	var order []string
	for _, e := range s2.Events(idDurable) {
		if e.Kind == "stage" {
			order = append(order, e.Stage)
		}
	}
	if !slices.Equal(order, []string{"building", "testing"}) {
		t.Fatalf("reports arrived as %v", order)
	}
}

// Test503Storm: a third of all requests fail with 503; the client retries
// within its budgets and every job still ends where it should, with every
// report delivered.
func Test503Storm(t *testing.T) {
	t.Parallel()
	testenv.Slow(t, "runs fleet jobs through outages, partitions or retry budgets")
	eachRouteSet(t, func(t *testing.T, rs routeSet) {
		s := startStub(t, rs.opts(coord.Options{FailRate: 0.3, Seed: 42}))
		w := newWorld(t, "app")
		ids := []string{idStormA, idStormB, idStormC, idStormD}
		for _, id := range ids {
			s.SetFaults(0, 0)
			s.submit(t, id, "app", fmt.Sprintf("script: echo %s > %s.txt\nship: branch", id, id))
		}
		s.SetFaults(0.3, 0)
		f := newFactory(t, s, w, "stormy", func(_ *config.Config, p *Parts) {
			p.Budgets.Report, p.Budgets.FinalReport, p.Budgets.Drain = 5*time.Second, 10*time.Second, 5*time.Second
		})
		var results []*Result
		err := f.Agent.Run(ctxT(t), RunOptions{Drain: true}, func(r *Result) { results = append(results, r) })
		if err != nil {
			t.Fatal(err)
		}
		if len(results) != len(ids) {
			t.Fatalf("%d results", len(results))
		}
		for _, r := range results {
			if r.Outcome.Failed() || r.Report != "delivered" {
				t.Errorf("%s: %+v", r.JobID, r)
			}
		}
		for _, id := range ids {
			if j, _ := s.Job(id); j.Stage != coord.StageShipped || j.LeaseEpoch != 1 {
				t.Errorf("%s: %s epoch %d", id, j.Stage, j.LeaseEpoch)
			}
		}
		st := s.Stats()
		var n503 int64
		for _, rs := range st.Routes {
			n503 += rs.Status["503"]
		}
		if n503 == 0 {
			t.Fatal("no 503 was injected")
		}
		if f.Agent.Reporter.Spool.Depth() != 0 {
			t.Fatal("reports left in the spool")
		}
	})
}

// TestRenewalFailingAfterSuccessesIsRetried: renewals succeed, then fail for
// a while (503s), then succeed again, all before the expiry is near: the job
// is not stopped and completes.
func TestRenewalFailingAfterSuccessesIsRetried(t *testing.T) {
	testenv.Slow(t, "runs fleet jobs against a coordinator with real git")
	t.Parallel()
	s := startStub(t, coord.Options{LeaseTTL: 4 * time.Second})
	w := newWorld(t, "app")
	script, started, goFile := w.waitScript(idSteady)
	s.submit(t, idSteady, "app", "script: "+script+"\nship: branch")
	f := newFactory(t, s, w, "steadfast", func(c *config.Config, _ *Parts) { c.LeaseRenew = 100 * time.Millisecond })
	done := make(chan *Result, 1)
	go func() {
		res, _ := f.runOnce(t, ctxT(t))
		done <- res
	}()
	testenv.WaitFor(t, time.Minute, "the engine to start", func() bool { return testenv.Exists(started) })
	testenv.WaitFor(t, time.Minute, "renewals", func() bool { return s.Stats().Routes[coord.RouteRenew].Status["200"] >= 3 })
	s.SetFaults(1, 0, coord.RouteRenew)
	testenv.WaitFor(t, time.Minute, "failed renewals", func() bool { return s.Stats().Routes[coord.RouteRenew].Status["503"] >= 3 })
	s.SetFaults(0, 0)
	before := s.Stats().Routes[coord.RouteRenew].Status["200"]
	testenv.WaitFor(t, time.Minute, "renewals after the failures", func() bool { return s.Stats().Routes[coord.RouteRenew].Status["200"] > before+1 })
	testenv.WriteFile(t, goFile, "go")
	res := <-done
	if res.Outcome.Failed() || res.Stage != job.Shipped || res.Report != "delivered" {
		t.Fatalf("result %+v\n%s", res, f.Logs)
	}
}

// TestHeartbeat401Stops: a factory whose token is revoked is stopped by its
// heartbeat with a clear *AuthError, at start and while idle.
func TestHeartbeat401Stops(t *testing.T) {
	testenv.Slow(t, "runs fleet jobs against a coordinator with real git")
	t.Parallel()
	s := startStub(t, coord.Options{})
	w := newWorld(t, "app")
	f := newFactory(t, s, w, "revoked", func(c *config.Config, _ *Parts) { c.Heartbeat = 50 * time.Millisecond; c.Poll = 20 * time.Millisecond })

	// While idle on the poll path.
	errc := make(chan error, 1)
	go func() { errc <- f.Agent.Run(ctxT(t), RunOptions{}, nil) }()
	testenv.WaitFor(t, time.Minute, "the first heartbeat", func() bool { return s.Stats().Count(coord.RouteHeartbeat) >= 1 })
	if err := s.RevokeFactory("revoked"); err != nil {
		t.Fatal(err)
	}
	err := <-errc
	var ae *AuthError
	if !errors.As(err, &ae) || ae.Status != 401 || !strings.Contains(ae.Fix(), "AQ_FLEET_TOKEN") {
		t.Fatalf("want a 401 AuthError, got %v", err)
	}
	// At start: the first heartbeat refuses, nothing is claimed.
	claims := s.Stats().Count(coord.RouteClaim)
	f.rebuild(t)
	_, err = f.runOnce(t, ctxT(t))
	if !errors.As(err, &ae) {
		t.Fatalf("want an AuthError at start, got %v", err)
	}
	if s.Stats().Count(coord.RouteClaim) != claims {
		t.Fatal("claimed with a refused token")
	}
}

// TestGateMakesNoClaimWhileVersionUnchanged: with the gate, an idle factory
// reads the queue-state and makes no claim until the version moves.
func TestGateMakesNoClaimWhileVersionUnchanged(t *testing.T) {
	testenv.Slow(t, "runs fleet jobs against a coordinator with real git")
	t.Parallel()
	eachRouteSet(t, func(t *testing.T, rs routeSet) {
		s := startStub(t, rs.opts(coord.Options{}))
		w := newWorld(t, "app")
		f := newFactory(t, s, w, "gated")
		c := f.Agent.Client
		if _, err := EnsureEnrolled(ctxT(t), c, EnrollOptions{Path: f.Cfg.CredentialsFile(), EnvToken: s.EnrollToken(), Request: EnrollRequest{FactoryID: "gated"}}); err != nil {
			t.Fatal(err)
		}
		c.SetOffer([]string{"os:linux", "engine:script"}, []string{"app"})
		p := &Poller{Client: c, Base: time.Second, Gate: true}
		s.ResetStats()
		for range 20 {
			cl, err := p.Tick(ctxT(t))
			if cl != nil || err != nil {
				t.Fatal(cl, err)
			}
		}
		st := s.Stats()
		if st.Count(coord.RouteQueueState) != 20 || st.Count(coord.RouteClaim) != 1 {
			t.Fatalf("queue-state %d (want 20), claims %d (want 1: the first tick)", st.Count(coord.RouteQueueState), st.Count(coord.RouteClaim))
		}
		// A new job moves the version: the next tick claims it.
		s.submit(t, idFresh, "app", "script: true")
		cl, err := p.Tick(ctxT(t))
		if err != nil || cl == nil || cl.Job.ID != idFresh {
			t.Fatalf("after submit: %v %v", cl, err)
		}
		if n := s.Stats().Count(coord.RouteClaim); n != 2 {
			t.Fatalf("%d claims", n)
		}
		// Idle backoff: waits grow (with jitter) up to 8× the base.
		p.idle = 100
		if d := p.Wait(); d < 6*time.Second || d > 10*time.Second {
			t.Fatalf("idle wait %v", d)
		}
		p.idle = 0
		if d := p.Wait(); d > 1200*time.Millisecond {
			t.Fatalf("busy wait %v", d)
		}
	})
}

// TestEnrollmentCredentials: the first start enrolls and writes the factory
// token 0600; the second start reuses it (no enroll call), even when
// AQ_FLEET_TOKEN is no longer valid; a credentials file others can read is
// refused.
func TestEnrollmentCredentials(t *testing.T) {
	testenv.Slow(t, "runs fleet jobs against a coordinator with real git")
	t.Parallel()
	s := startStub(t, coord.Options{})
	w := newWorld(t, "app")
	f := newFactory(t, s, w, "fresh-factory")
	path := f.Cfg.CredentialsFile()
	c := f.Agent.Client
	creds, err := EnsureEnrolled(ctxT(t), c, EnrollOptions{Path: path, EnvToken: s.EnrollToken(), Request: EnrollRequest{FactoryID: "fresh-factory"}})
	if err != nil {
		t.Fatal(err)
	}
	st, err := os.Stat(path)
	if err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("credentials mode %v %v", st.Mode(), err)
	}
	if creds.Token == s.EnrollToken() || !strings.HasPrefix(creds.Token, "aqf_") || creds.FactoryID != "fresh-factory" || creds.API != s.API || creds.EnrolledAt.IsZero() {
		t.Fatalf("creds %+v", creds)
	}
	if err := c.Heartbeat(ctxT(t), HeartbeatRequest{}); err != nil {
		t.Fatal(err)
	}
	// Second start: the stored token wins over AQ_FLEET_TOKEN.
	f.rebuild(t)
	c2 := f.Agent.Client
	creds2, err := EnsureEnrolled(ctxT(t), c2, EnrollOptions{Path: path, EnvToken: "not-a-valid-token-anymore"})
	if err != nil || creds2.Token != creds.Token {
		t.Fatalf("second start: %+v %v", creds2, err)
	}
	if n := s.Stats().Count(coord.RouteEnroll); n != 1 {
		t.Fatalf("%d enroll calls", n)
	}
	if err := c2.Heartbeat(ctxT(t), HeartbeatRequest{}); err != nil {
		t.Fatal(err)
	}
	// A leaky file is refused.
	os.Chmod(path, 0o644)
	var ce *CredentialsError
	if _, err := LoadCredentials(path); !errors.As(err, &ce) || !strings.Contains(ce.Fix, "chmod 600") {
		t.Fatalf("want a CredentialsError, got %v", err)
	}
	// No credentials and no token: a clear error.
	if _, err := EnsureEnrolled(ctxT(t), c2, EnrollOptions{Path: filepath.Join(t.TempDir(), "none")}); !errors.As(err, &ce) {
		t.Fatalf("want a CredentialsError, got %v", err)
	}
	if _, err := LoadCredentials(filepath.Join(t.TempDir(), "none")); !errors.Is(err, fs.ErrNotExist) {
		t.Fatal(err)
	}
}

// TestSecretsNeverLeak: neither the enrollment token nor the factory token
// reaches aq's logs (captured raw, without a redactor), the engine's
// environment, its argv, the job log, the records or the spool.
func TestSecretsNeverLeak(t *testing.T) {
	testenv.Slow(t, "runs fleet jobs against a coordinator with real git")
	s := startStub(t, coord.Options{FailRate: 0.2, Seed: 7})
	w := newWorld(t, "app")
	dump := filepath.Join(w.dir, "engine-env.txt")
	// The engine writes its environment and argv to a file and to its
	// stdout (the job log under $AQ_HOME/logs).
	script := w.script("dump", fmt.Sprintf("env > %q\necho \"$0 $*\" >> %q\nenv\necho done > done.txt\n", dump, dump))
	s.SetFaults(0, 0)
	s.submit(t, idSecretive, "app", "script: "+script+" --flag\nship: branch")
	s.SetFaults(0.2, 0)
	f := newFactory(t, s, w, "discreet")
	t.Setenv("AQ_FLEET_TOKEN", s.EnrollToken()) // as an operator sets it: it must not reach the engine
	res, err := f.runOnce(t, ctxT(t))
	if err != nil || res.Outcome.Failed() {
		t.Fatalf("%+v %v", res, err)
	}
	creds, err := LoadCredentials(f.Cfg.CredentialsFile())
	if err != nil {
		t.Fatal(err)
	}
	secretsList := []string{s.EnrollToken(), creds.Token}
	check := func(what, text string) {
		for _, sec := range secretsList {
			if strings.Contains(text, sec) {
				t.Errorf("a token leaked into %s", what)
			}
		}
	}
	check("aq's log", f.Logs.String())
	check("the engine's environment or argv", testenv.ReadFile(t, dump))
	sawEnv := false
	filepath.WalkDir(f.Home, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || p == f.Cfg.CredentialsFile() || strings.Contains(p, string(filepath.Separator)+"worktrees"+string(filepath.Separator)) {
			return nil
		}
		b, _ := os.ReadFile(p)
		check(p, string(b))
		sawEnv = sawEnv || strings.Contains(string(b), "PATH=")
		return nil
	})
	if !sawEnv {
		t.Fatal("the engine's environment is in no file under AQ_HOME: the job log was not checked")
	}
	if !strings.Contains(f.Logs.String(), "job done") {
		t.Fatal("the log capture saw nothing")
	}
}

// TestShadowAgreeAndDiverge: shadow mode asks with dryRun (nothing is
// leased) and counts AGREE and DIVERGE.
func TestShadowAgreeAndDiverge(t *testing.T) {
	testenv.Slow(t, "runs fleet jobs against a coordinator with real git")
	t.Parallel()
	s := startStub(t, coord.Options{})
	w := newWorld(t, "app")
	s.submit(t, idAlpha, "app", "script: true\npriority: high")
	s.submit(t, idBeta, "app", "script: true")
	f := newFactory(t, s, w, "shadowy")
	c := f.Agent.Client
	c.SetOffer([]string{"os:linux", "engine:script"}, []string{"app"})
	logs := &testenv.SyncBuffer{}
	sh := &Shadow{Client: c, Path: ShadowFile(filepath.Join(f.Home, "state")), Log: newTestLogger(logs),
		Prepare: func(ctx context.Context) error {
			_, err := EnsureEnrolled(ctx, c, EnrollOptions{Path: f.Cfg.CredentialsFile(), EnvToken: s.EnrollToken(), Request: EnrollRequest{FactoryID: "shadowy"}})
			return err
		}}
	pick, ok := sh.Ask(ctxT(t))
	if !ok || pick != idAlpha {
		t.Fatalf("fleet pick %q %v", pick, ok)
	}
	sh.Compare(idAlpha, pick)
	sh.Compare(idBeta, pick)
	sh.Compare("", None) // both idle: not counted
	cnt, err := LoadShadowCounts(sh.Path)
	if err != nil || cnt.Agree != 1 || cnt.Diverge != 1 || cnt.LastDiverge.Local != idBeta || cnt.LastDiverge.Fleet != idAlpha {
		t.Fatalf("counts %+v %v", cnt, err)
	}
	if !strings.Contains(logs.String(), "shadow: AGREE") || !strings.Contains(logs.String(), "shadow: DIVERGE local="+idBeta+" fleet="+idAlpha) {
		t.Fatalf("logs %s", logs)
	}
	// Nothing was leased.
	if j, _ := s.Job(idAlpha); j.Stage != coord.StageQueued || j.LeaseEpoch != 0 {
		t.Fatalf("dry run leased the job: %+v", j)
	}
}

// TestStoppedBeforeStartReleasesLease: a claim handed to a runner whose
// context is already cancelled is released (not failed): the job goes back
// to queued at once, no attempt counted.
func TestStoppedBeforeStartReleasesLease(t *testing.T) {
	testenv.Slow(t, "runs fleet jobs against a coordinator with real git")
	t.Parallel()
	eachRouteSet(t, func(t *testing.T, rs routeSet) {
		s := startStub(t, rs.opts(coord.Options{LeaseTTL: time.Hour}))
		w := newWorld(t, "app")
		s.submit(t, idUnstarted, "app", "script: true")
		f := newFactory(t, s, w, "stopping")
		c := f.Agent.Client
		c.SetOffer([]string{"os:linux", "engine:script"}, []string{"app"})
		if _, err := EnsureEnrolled(ctxT(t), c, EnrollOptions{Path: f.Cfg.CredentialsFile(), EnvToken: s.EnrollToken(), Request: EnrollRequest{FactoryID: "stopping"}}); err != nil {
			t.Fatal(err)
		}
		cl, err := c.Claim(ctxT(t), false)
		if err != nil || cl == nil {
			t.Fatal(cl, err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		res := f.Agent.Jobs.Run(ctx, cl)
		if res.Report != "released" || res.Outcome.Reason != job.ReasonInterrupted || res.Stage != job.Inbox {
			t.Fatalf("result %+v", res)
		}
		if j, _ := s.Job(idUnstarted); j.Stage != coord.StageQueued || j.Holder != "" || j.Attempts != 0 {
			t.Fatalf("stub job %+v", j)
		}
	})
}

// TestLeaseHeldWhileTheFinalReportIsRetried: found by the chaos harness. The
// coordinator refuses reports (503 on /fleet/fail) for longer than the lease's
// time to live while every other call works: the job's final report is
// retried meanwhile, and the lease must stay held — renewed — until it gets
// through. Before the fix the renewer stopped when the pipeline did, the
// lease lapsed under a live, connected factory, the reaper handed the job on,
// and the fail came back 409: the failed job's lease was freed by the reaper,
// not by its /fleet/fail.
func TestLeaseHeldWhileTheFinalReportIsRetried(t *testing.T) {
	t.Parallel()
	testenv.Slow(t, "runs fleet jobs through outages, partitions or retry budgets")
	// The factory counts its lease from the coordinator's Date header less a
	// second (the header's resolution), then stops a second before that: the
	// lease must outlast both.
	ttl := 3 * time.Second
	s := startStub(t, coord.Options{LeaseTTL: ttl, ReapEvery: 20 * time.Millisecond, MaxBackoff: time.Millisecond})
	w := newWorld(t, "app")
	s.submit(t, idRefused, "app", "script: exit 3\nretry: { max: 2 }")
	s.SetFaults(1, 0, coord.RouteFail) // every fail refused, until the reaper would have acted twice over
	go func() {
		for s.Stats().Routes[coord.RouteFail].Status["503"] == 0 {
			time.Sleep(10 * time.Millisecond)
		}
		time.Sleep(2 * ttl)
		s.SetFaults(0, 0)
	}()
	f := newFactory(t, s, w, "patient", func(_ *config.Config, p *Parts) {
		p.Budgets.FinalReport = time.Minute
	})
	res, err := f.runOnce(t, ctxT(t))
	if err != nil {
		t.Fatal(err)
	}
	if res.Outcome.Reason != job.ReasonEngineFailed || res.Report != "delivered" || res.Fenced || res.Stage != job.Inbox {
		t.Fatalf("result %+v (the lease lapsed while the report was retried?)\n%s", res, f.Logs.String())
	}
	j, _ := s.Job(idRefused)
	if j.LeaseEpoch != 1 || j.Stage != coord.StageQueued || j.Reason != string(job.ReasonEngineFailed) {
		t.Fatalf("job %+v", j)
	}
	if k := kinds(s.Events(idRefused)); slices.Contains(k, "reaped") {
		t.Fatalf("the reaper took the lease while its report was retried: %v", k)
	}
	if s.Stats().Routes[coord.RouteFail].Status["503"] == 0 {
		t.Fatal("no fail was refused")
	}
}

// TestRunOnceHoldsTheJobLock: `aq run` in fleet mode holds the job's flock
// while it runs the job, as `aq daemon` does, so a daemon starting on the
// same AQ_HOME sees the job as in flight (not an orphan), and gc leaves its
// worktree alone; the lock is free again when the job is done.
func TestRunOnceHoldsTheJobLock(t *testing.T) {
	testenv.Slow(t, "runs fleet jobs against a coordinator with real git")
	t.Parallel()
	s := startStub(t, coord.Options{})
	w := newWorld(t, "app")
	script, started, goFile := w.waitScript(idLocked)
	s.submit(t, idLocked, "app", "script: "+script+"\nship: branch")
	f := newFactory(t, s, w, "locker")
	done := make(chan *Result, 1)
	go func() {
		res, _ := f.runOnce(t, ctxT(t))
		done <- res
	}()
	testenv.WaitFor(t, time.Minute, "the engine to start", func() bool { return testenv.Exists(started) })
	held, err := worktree.Held(f.Cfg.LocksDir(), worktree.JobLockName(idLocked))
	if err != nil || !held {
		t.Fatalf("the job's lock is not held while the job runs (held=%v, err=%v)", held, err)
	}
	testenv.WriteFile(t, goFile, "go")
	if res := <-done; res == nil || res.Stage != job.Shipped {
		t.Fatalf("result %+v", res)
	}
	if held, err := worktree.Held(f.Cfg.LocksDir(), worktree.JobLockName(idLocked)); err != nil || held {
		t.Fatalf("the job's lock is still held after the job (held=%v, err=%v)", held, err)
	}
}
