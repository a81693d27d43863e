package daemon_test

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/aqfleet/aq/agent/caps"
	"github.com/aqfleet/aq/agent/dispatch"
	"github.com/aqfleet/aq/agent/fleet"
	"github.com/aqfleet/aq/demo/coord"
	"github.com/aqfleet/aq/demo/sbpeer/sbpeertest"
	"github.com/aqfleet/aq/internal/testenv"
)

// detecting makes the rig's daemon detect its host for real (the repos
// under its base), refreshing on changes of the base (the cadence is an
// hour: only the base's changes trigger here). Call before start.
func (r *rig) detecting() {
	r.o.parts = func(p *fleet.Parts) {
		p.Host = func(ctx context.Context) (*caps.Host, error) {
			return caps.Detect(ctx, caps.DetectOptions{RepoBase: r.base, Path: "/nonexistent", Tools: []string{}})
		}
	}
	r.cfg.CapsRefresh = time.Hour
}

// offers reports whether the stub's record of the factory (its last
// heartbeat) lists repo.
func (r *rig) offers(repo string) bool {
	return slices.Contains(r.factoryRecord().Repos, repo)
}

// waitOffer waits until the stub's record of the factory lists repo (or
// no longer does), and returns how many heartbeats reached the stub since
// from.
func (r *rig) waitOffer(repo string, want bool, from int64) int64 {
	r.t.Helper()
	r.waitFor("the heartbeat to carry the change of "+repo, func() bool { return r.offers(repo) == want })
	return r.heartbeats() - from
}

// A repository removed from the base while the daemon runs: the next
// heartbeat no longer offers it, and a job for it is not claimed (the poll
// path's claims offer what the host has now); cloned back, it is offered
// again and the job runs.
func TestRemovedRepoIsNotClaimed(t *testing.T) {
	t.Parallel()
	r := newRig(t, rigOptions{repos: []string{"app", "lib"}, gate: true})
	r.detecting()
	r.start()
	r.waitLive(dispatch.LivePoll)
	r.waitOffer("lib", true, 0)

	if err := os.RemoveAll(filepath.Join(r.base, "lib")); err != nil {
		t.Fatal(err)
	}
	if n := r.waitOffer("lib", false, r.heartbeats()); n > 2 {
		t.Fatalf("%d heartbeats went out before one carried the removal", n)
	}
	id := testenv.ID("lib-gone")
	r.submit(id, "lib", r.quick(id))
	claims204 := func() int64 { return r.stub.Stats().Routes[coord.RouteClaim].Status["204"] }
	before, ticks := claims204(), r.d.PollTicks()
	// The gate sees the new job (the queue-state version moved): a claim,
	// which must not take it; and a few more looks at the queue.
	r.waitFor("a claim after the job was queued", func() bool { return claims204()-before >= 1 && r.d.PollTicks()-ticks >= 3 })
	if st := r.stage(id); st != coord.StageQueued {
		t.Fatalf("the job for the removed repo is %s", st)
	}

	testenv.Git(t, r.base, "clone", "-q", r.origins["lib"], filepath.Join(r.base, "lib"))
	if n := r.waitOffer("lib", true, r.heartbeats()); n > 2 {
		t.Fatalf("%d heartbeats went out before one carried the new clone", n)
	}
	r.waitStage(id, coord.StageShipped)
	if err := r.drain(); err != nil {
		t.Fatal(err)
	}
}

// The broker path: a job's message waits in the factory's subscription
// (its one slot is busy) when its repo is removed. The heartbeat drops the
// repo; the stub's dispatcher, seeing its target no longer fits and no
// other factory does, forgets the target. The message, received at last, is
// dead-lettered (CapabilityGone) — not accepted: no lease taken, no attempt
// burned, the job still queued. The repo cloned back, the dispatcher sends
// the job again at once and it runs.
func TestRemovedRepoBrokerMessageIsDeadLettered(t *testing.T) {
	t.Parallel()
	r := newRig(t, rigOptions{repos: []string{"app", "lib"}, broker: true})
	r.detecting()
	r.start()
	r.waitLive(dispatch.LiveBroker)
	r.waitOffer("lib", true, 0)

	busy := testenv.ID("busy-app")
	r.submit(busy, "app", r.blocking(busy))
	r.waitStarted(busy) // the only slot is taken: the next message waits in the subscription
	id := testenv.ID("lib-dropped")
	r.submit(id, "lib", r.quick(id))
	r.waitFor("the dispatch of "+id, func() bool {
		r.evMu.Lock()
		defer r.evMu.Unlock()
		return slices.ContainsFunc(r.sent, func(s coord.Sent) bool { return s.JobID == id })
	})
	if err := os.RemoveAll(filepath.Join(r.base, "lib")); err != nil {
		t.Fatal(err)
	}
	r.waitOffer("lib", false, r.heartbeats())
	r.release(busy)
	dl := r.waitPeer("the message of "+id+" dead-lettered", func(e sbpeertest.Event) bool {
		return e.Event == "dead-letter" && len(e.MessageID) > len(id) && e.MessageID[:len(id)] == id
	})
	if dl.Reason != dispatch.ReasonUnfit {
		t.Fatalf("dead-letter %+v", dl)
	}
	if j, _ := r.stub.Job(id); j.Stage != coord.StageQueued || j.Attempts != 0 || j.LeaseEpoch != 0 {
		t.Fatalf("the job after its message was refused: %+v", j)
	}
	if n := r.stub.Stats().Took(coord.RouteAccept); n != 1 { // busy-app's
		t.Fatalf("%d accepts", n)
	}

	testenv.Git(t, r.base, "clone", "-q", r.origins["lib"], filepath.Join(r.base, "lib"))
	r.waitStage(id, coord.StageShipped)
	if rec := r.closedRecord(id); rec.Source != "broker" {
		t.Fatalf("record %+v", rec)
	}
	if err := r.drain(); err != nil {
		t.Fatal(err)
	}
}

// waitPeer waits for a peer event and returns it.
func (r *rig) waitPeer(what string, match func(sbpeertest.Event) bool) sbpeertest.Event {
	r.t.Helper()
	var got sbpeertest.Event
	r.waitFor(what, func() bool {
		for _, e := range r.peerEvents() {
			if match(e) {
				got = e
				return true
			}
		}
		return false
	})
	return got
}
