package daemon_test

import (
	"fmt"
	"path/filepath"
	"runtime"
	"slices"
	"testing"
	"time"

	"github.com/aqfleet/aq/agent/daemon"
	"github.com/aqfleet/aq/agent/dispatch"
	"github.com/aqfleet/aq/demo/coord"
	"github.com/aqfleet/aq/demo/sbpeer/sbpeertest"
	"github.com/aqfleet/aq/internal/testenv"
)

// Without a broker the poll path (gated) takes work; the status file says
// so; a drain ends Run with nil and the file says stopped.
func TestPollPathRunsJobThenDrains(t *testing.T) {
	t.Parallel()
	eachRouteSet(t, func(t *testing.T, routes string) {
		r := newRig(t, rigOptions{routes: routes, gate: true})
		r.start()
		r.waitLive(dispatch.LivePoll)
		id := testenv.ID("poll-job")
		r.submit(id, "app", r.quick(id))
		r.waitStage(id, coord.StageShipped)
		if rec := r.closedRecord(id); rec.Source != "poll" {
			t.Fatalf("record %+v", rec)
		}
		st := r.status()
		if st.Stage != daemon.StageRunning || st.Source != dispatch.LivePoll || st.Slots != 1 || st.LastHeartbeat.IsZero() || !st.Alive() || st.Broker != nil || !st.Gate {
			t.Fatalf("status %s", dumpJSON(st))
		}
		if err := r.drain(); err != nil {
			t.Fatalf("Run: %v", err)
		}
		if st := r.status(); st.Stage != daemon.StageStopped || st.Alive() || st.StoppedAt.IsZero() {
			t.Fatalf("status after the drain %s", dumpJSON(st))
		}
		if r.runs(id) != 1 {
			t.Fatalf("%d runs", r.runs(id))
		}
	})
}

// Stub + broker + aq: the stub publishes a targeted message, the daemon
// accepts the job, completes the message at once (complete-on-claim) and
// runs it. No claim and no queue-state read is ever made.
func TestBrokerMessageAcceptCompleteRun(t *testing.T) {
	t.Parallel()
	r := newRig(t, rigOptions{broker: true, gate: true})
	r.start()
	r.waitLive(dispatch.LiveBroker)
	id := testenv.ID("broker-job")
	r.submit(id, "app", r.quick(id))
	r.waitStage(id, coord.StageShipped)
	if rec := r.record(id); rec.Source != "broker" {
		t.Fatalf("record %+v", rec)
	}
	evs := r.peerEvents()
	want := id + ":0" // MessageID jobId:epoch (the first dispatch: epoch 0)
	if n := count(evs, "deliver", id); n != 1 {
		t.Fatalf("%d deliveries of %s", n, id)
	}
	complete := sbpeertest.Filter(evs, func(e sbpeertest.Event) bool {
		return e.Event == "disposition" && e.MessageID == want && e.Outcome == "complete"
	})
	if len(complete) != 1 {
		t.Fatalf("the message %s was not completed once:\n%s", want, dumpJSON(evs))
	}
	// complete-on-claim: the message was settled before the engine started.
	if eng := r.jobEvents(id, "engine"); len(eng) != 1 || !complete[0].T.Before(eng[0].At) {
		t.Fatalf("complete at %v, engine at %+v", complete[0].T, eng)
	}
	st := r.stub.Stats()
	if st.Took(coord.RouteAccept) != 1 || st.Count(coord.RouteClaim) != 0 || st.Count(coord.RouteQueueState) != 0 || st.Count(coord.RouteJobs) != 0 {
		t.Fatalf("stub counters %s", dumpJSON(st))
	}
	if k := r.kinds(id); !slices.Contains(k, "accepted") || slices.Contains(k, "claimed") {
		t.Fatalf("audit %v", k)
	}
	if s := r.status(); s.Source != dispatch.LiveBroker || s.Broker == nil || !s.Broker.Healthy {
		t.Fatalf("status %s", dumpJSON(s))
	}
	if err := r.drain(); err != nil {
		t.Fatal(err)
	}
}

// No goroutine outlives the daemon: after Run returns (jobs run, metrics
// served, a broker link open), the goroutine count is back to what it was
// before Run — on the broker path and on the poll path.
func TestNoGoroutineOutlivesRun(t *testing.T) {
	for _, broker := range []bool{true, false} {
		t.Run(map[bool]string{true: "broker", false: "poll"}[broker], func(t *testing.T) {
			r := newRig(t, rigOptions{broker: broker, noPublisher: true, metrics: true, slots: 2})
			var send func(id string)
			if broker {
				send = r.testSender() // connected before the baseline
			}
			baseline := runtime.NumGoroutine()
			r.start()
			want := dispatch.LivePoll
			if broker {
				want = dispatch.LiveBroker
			}
			r.waitLive(want)
			id := testenv.ID("gr-job-" + want)
			r.submit(id, "app", r.quick(id))
			if broker {
				send(id)
			}
			r.waitStage(id, coord.StageShipped)
			if code, _ := r.get("/metrics"); code != 200 {
				t.Fatalf("/metrics %d", code)
			}
			if code, _ := r.get("/healthz"); code != 200 {
				t.Fatalf("/healthz %d", code)
			}
			if err := r.drain(); err != nil {
				t.Fatal(err)
			}
			var n int
			deadline := time.Now().Add(guard)
			for n = runtime.NumGoroutine(); n > baseline && time.Now().Before(deadline); n = runtime.NumGoroutine() {
				time.Sleep(20 * time.Millisecond)
			}
			if n > baseline {
				buf := make([]byte, 1<<20)
				t.Fatalf("%d goroutines, baseline %d:\n%s", n, baseline, buf[:runtime.Stack(buf, true)])
			}
		})
	}
}

// The broker dies while a job runs: the poll path takes over at once (the
// receiver, waiting on its free slot, sees the link fail), so the next job
// arrives by polling; the running job finishes and reports; the broker comes
// back and takes over again — polling stops, the job after that arrives by
// the broker. (With every slot busy the receiver is not receiving, so an
// outage is noticed when a slot frees — the moment work could be taken.)
func TestBrokerOutageHandOffAndBack(t *testing.T) {
	t.Parallel()
	r := newRig(t, rigOptions{broker: true, gate: true, slots: 2, repos: []string{"app", "lib"}})
	r.start()
	r.waitLive(dispatch.LiveBroker)

	j1 := testenv.ID("outage-1")
	r.submit(j1, "app", r.blocking(j1))
	r.waitStarted(j1)
	if r.record(j1).Source != "broker" {
		t.Fatalf("j1 came by %q", r.record(j1).Source)
	}
	r.peer.Kill()
	r.waitLive(dispatch.LivePoll)
	r.waitFor("the status file to say poll", func() bool {
		s := r.status()
		return s.Source == dispatch.LivePoll && s.Broker != nil && !s.Broker.Healthy && s.Broker.Error != ""
	})

	j2 := testenv.ID("outage-2")
	r.submit(j2, "lib", r.quick(j2))
	r.waitStage(j2, coord.StageShipped)
	if src := r.record(j2).Source; src != "poll" {
		t.Fatalf("j2 came by %q, want poll", src)
	}
	r.release(j1)
	r.waitStage(j1, coord.StageShipped) // the running job finished and reported

	if err := r.peer.Restart(); err != nil {
		t.Fatal(err)
	}
	r.waitLive(dispatch.LiveBroker)
	r.waitHeartbeats(1) // a poll tick in flight at the switch has ended
	claims, reads, ticks := r.stub.Stats().Count(coord.RouteClaim), r.stub.Stats().Count(coord.RouteQueueState), r.d.PollTicks()

	j3 := testenv.ID("outage-3")
	r.submit(j3, "app", r.quick(j3))
	r.waitStage(j3, coord.StageShipped)
	if src := r.record(j3).Source; src != "broker" {
		t.Fatalf("j3 came by %q, want broker", src)
	}
	r.waitHeartbeats(3)
	st := r.stub.Stats()
	if st.Count(coord.RouteClaim) != claims || st.Count(coord.RouteQueueState) != reads || r.d.PollTicks() != ticks {
		t.Fatalf("polling went on after the broker came back: claims %d→%d, queue-state %d→%d, ticks %d→%d",
			claims, st.Count(coord.RouteClaim), reads, st.Count(coord.RouteQueueState), ticks, r.d.PollTicks())
	}
	if code := r.d.Live(); code != dispatch.LiveBroker {
		t.Fatalf("live %s", code)
	}
	if err := r.drain(); err != nil {
		t.Fatal(err)
	}
}

// An idle factory on a healthy broker asks the coordinator nothing but
// heartbeats: no claim, no queue-state read, no job list — over several
// heartbeat intervals (the poll path's tick is 50 ms here: it would show).
func TestIdleOnBrokerOnlyHeartbeats(t *testing.T) {
	t.Parallel()
	r := newRig(t, rigOptions{broker: true, gate: true})
	r.start()
	r.waitLive(dispatch.LiveBroker)
	r.waitHeartbeats(4)
	st := r.stub.Stats()
	for route, rs := range st.Routes {
		switch route {
		case coord.RouteHeartbeat, coord.RouteEnroll:
		case coord.RouteAccept:
			if rs.Requests != 1 || rs.Status["404"] != 1 {
				t.Errorf("idle on the broker path: accept %+v, want only the start-up probe (404: no such job)", rs)
			}
		default:
			t.Errorf("idle on the broker path: %d × %s", rs.Requests, route)
		}
	}
	if r.d.PollTicks() != 0 {
		t.Errorf("%d poll ticks", r.d.PollTicks())
	}
	if t.Failed() {
		t.Fatalf("stub counters %s", dumpJSON(st))
	}
	if err := r.drain(); err != nil {
		t.Fatal(err)
	}
}

// The same job published twice under its MessageID collapses in the broker
// (one delivery); a stale dispatch of it under another generation is
// delivered, answered 409 by the coordinator and completed. One run.
func TestDuplicatePublishRunsOnce(t *testing.T) {
	t.Parallel()
	r := newRig(t, rigOptions{broker: true, noPublisher: true})
	send := r.testSender()
	id := testenv.ID("dup")
	r.submit(id, "app", r.quick(id))
	send(id)
	send(id) // the same dispatch again (a publisher restart): collapsed
	r.start()
	r.waitLive(dispatch.LiveBroker)
	r.waitStage(id, coord.StageShipped)
	stale := r.testSenderWithID()
	stale(id, dispatch.DispatchMessageID(id, 0, 1)) // another generation of the same job
	r.waitFor("the stale message settled", func() bool {
		return len(sbpeertest.Filter(r.peerEvents(), func(e sbpeertest.Event) bool {
			return e.Event == "disposition" && e.MessageID == dispatch.DispatchMessageID(id, 0, 1)
		})) == 1
	})
	evs := r.peerEvents()
	if n := count(evs, "duplicate", id); n != 1 {
		t.Fatalf("%d duplicates logged, want 1", n)
	}
	if n := count(evs, "deliver", id); n != 2 {
		t.Fatalf("%d deliveries, want 2 (the dispatch once, the stale generation once)", n)
	}
	if r.runs(id) != 1 {
		t.Fatalf("the job ran %d times", r.runs(id))
	}
	st := r.stub.Stats().Routes[coord.RouteAccept]
	if st.Requests != 3 || st.Status["200"] != 1 || st.Status["409"] != 1 || st.Status["404"] != 1 { // 404: the start-up probe
		t.Fatalf("accepts %+v", st)
	}
	if err := r.drain(); err != nil {
		t.Fatal(err)
	}
}

// With one slot the outage is noticed when the running job ends and frees
// it: the next job then arrives by polling.
func TestBrokerOutageOneSlotNextJobPolls(t *testing.T) {
	t.Parallel()
	r := newRig(t, rigOptions{broker: true, gate: true})
	r.start()
	r.waitLive(dispatch.LiveBroker)
	j1 := testenv.ID("outage1-1")
	r.submit(j1, "app", r.blocking(j1))
	r.waitStarted(j1)
	r.peer.Kill()
	r.release(j1)
	r.waitStage(j1, coord.StageShipped)
	j2 := testenv.ID("outage1-2")
	r.submit(j2, "app", r.quick(j2))
	r.waitStage(j2, coord.StageShipped)
	if a, b := r.record(j1).Source, r.record(j2).Source; a != "broker" || b != "poll" {
		t.Fatalf("sources %s, %s", a, b)
	}
	if err := r.drain(); err != nil {
		t.Fatal(err)
	}
}

// repoScript is a job script that flags any overlap with another job of the
// same repo (mkdir is atomic), then blocks until released.
func (r *rig) repoScript(id, repo string) string {
	inuse, overlap := filepath.Join(r.dir, repo+".inuse"), filepath.Join(r.dir, "overlap-"+repo)
	return r.script(id, fmt.Sprintf(`mkdir %q 2>/dev/null || touch %q
touch %q
echo run >> %q
while [ ! -f %q ]; do sleep 0.02; done
echo "work of %s" > result.txt
rmdir %q 2>/dev/null
`, inuse, overlap, r.path(id, "started"), r.path(id, "runs"), r.path(id, "go"), id, inuse))
}

// Three slots, jobs on two repos: different repos run in parallel, same-repo
// jobs one after another; never more jobs than slots.
func TestSlotsSerializeSameRepo(t *testing.T) {
	t.Parallel()
	for _, broker := range []bool{false, true} {
		t.Run(map[bool]string{true: "broker", false: "poll"}[broker], func(t *testing.T) {
			r := newRig(t, rigOptions{broker: broker, slots: 3, repos: []string{"app", "lib"}})
			tag := map[bool]string{true: "b", false: "p"}[broker]
			a1, a2, b1, b2 := testenv.ID("a1"+tag), testenv.ID("a2"+tag), testenv.ID("b1"+tag), testenv.ID("b2"+tag)
			r.submit(a1, "app", r.repoScript(a1, "app"))
			r.submit(a2, "app", r.repoScript(a2, "app"))
			r.submit(b1, "lib", r.repoScript(b1, "lib"))
			r.start()
			if broker {
				// All three are delivered at once (three slots): which of
				// a1 and a2 takes the repo lock first is a race.
				r.waitFor("a1 or a2 to start", func() bool {
					return testenv.Exists(r.path(a1, "started")) || testenv.Exists(r.path(a2, "started"))
				})
				if testenv.Exists(r.path(a2, "started")) {
					a1, a2 = a2, a1
				}
			}
			r.waitStarted(a1)
			r.waitStarted(b1) // a1 and b1 run at once: different repos in parallel
			if broker {
				// a2 was accepted (a slot is free) and waits on the repo lock.
				r.waitFor("a2 accepted", func() bool { return len(r.jobEvents(a2, "pipeline")) == 1 })
				r.waitFor("the status to show a2 waiting for a1", func() bool {
					st := r.status()
					for _, j := range st.Running {
						if j.JobID == a2 && j.WaitsFor == a1 && j.Phase == "preparing" {
							return st.Busy == 3 && len(st.Running) == 3
						}
					}
					return false
				})
				// Every slot is taken: a fourth job's message waits in the
				// subscription, undelivered.
				r.submit(b2, "lib", r.repoScript(b2, "lib"))
				r.waitFor("b2 published", func() bool {
					r.evMu.Lock()
					defer r.evMu.Unlock()
					for _, s := range r.sent {
						if s.JobID == b2 {
							return true
						}
					}
					return false
				})
				r.waitHeartbeats(2)
				if n := count(r.peerEvents(), "deliver", b2); n != 0 || r.stage(b2) != coord.StageQueued {
					t.Fatalf("b2 delivered %d times with no free slot (stage %s)", n, r.stage(b2))
				}
			} else {
				// The poll path advertises only idle repos: a2 is not even
				// claimed while a1 holds app.
				r.waitHeartbeats(2)
				if st := r.stage(a2); st != coord.StageQueued {
					t.Fatalf("a2 is %s while a1 holds its repo", st)
				}
				r.submit(b2, "lib", r.repoScript(b2, "lib"))
			}
			if testenv.Exists(r.path(a2, "started")) {
				t.Fatal("a2 started while a1 ran on the same repo")
			}
			if f := r.factoryRecord(); f.SeatLimit != 3 {
				t.Fatalf("advertised seat limit %d", f.SeatLimit)
			}
			r.release(a1)
			r.waitStarted(a2)
			r.release(b1)
			r.release(a2)
			r.release(b2)
			for _, id := range []string{a1, a2, b1, b2} {
				r.waitStage(id, coord.StageShipped)
				if n := r.runs(id); n != 1 {
					t.Fatalf("%s ran %d times", id, n)
				}
			}
			for _, repo := range []string{"app", "lib"} {
				if testenv.Exists(filepath.Join(r.dir, "overlap-"+repo)) {
					t.Fatalf("two jobs of %s overlapped", repo)
				}
			}
			if err := r.drain(); err != nil {
				t.Fatal(err)
			}
		})
	}
}
