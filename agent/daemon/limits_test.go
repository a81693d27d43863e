package daemon_test

import (
	"strings"
	"testing"
	"time"

	"github.com/aqfleet/aq/agent/daemon"
	"github.com/aqfleet/aq/demo/coord"
	"github.com/aqfleet/aq/internal/testenv"
)

// withLimits builds r's daemon with limits.
func (r *rig) withLimits(l daemon.Limits) {
	r.t.Helper()
	r.limits = l
	r.build()
}

// An idle factory drains and exits 0 after --idle-timeout; a running job
// keeps it up however long it runs, and the clock starts again after it.
func TestIdleTimeoutExits(t *testing.T) {
	t.Parallel()
	r := newRig(t, rigOptions{})
	r.withLimits(daemon.Limits{IdleTimeout: 1500 * time.Millisecond})
	r.start()
	id := testenv.ID("idle")
	r.submit(id, "app", r.blocking(id))
	r.waitStarted(id)
	// Held well past the idle timeout: a running job is not idleness.
	time.Sleep(3 * time.Second)
	if st := r.status(); st == nil || st.Stage != "running" {
		t.Fatalf("the daemon left while a job ran: %+v", st)
	}
	r.release(id)
	if err := r.wait(); err != nil {
		t.Fatalf("Run = %v, want nil (exit 0) after the idle timeout", err)
	}
	if r.stage(id) != coord.StageShipped {
		t.Fatalf("the job ended %s", r.stage(id))
	}
	if !strings.Contains(r.logs.String(), "limit=idle-timeout") {
		t.Fatalf("no idle-timeout line in the log:\n%s", r.logs)
	}
}

// --max-jobs N: after N jobs started the daemon drains — they finish and
// are reported, nothing more is taken — and exits 0.
func TestMaxJobsDrains(t *testing.T) {
	t.Parallel()
	r := newRig(t, rigOptions{})
	r.withLimits(daemon.Limits{MaxJobs: 1})
	r.start()
	first, second := testenv.ID("max-1"), testenv.ID("max-2")
	r.submit(first, "app", r.blocking(first))
	r.waitStarted(first)
	r.submit(second, "app", r.quick(second))
	r.release(first)
	if err := r.wait(); err != nil {
		t.Fatalf("Run = %v, want nil", err)
	}
	if r.stage(first) != coord.StageShipped || r.stage(second) != coord.StageQueued {
		t.Fatalf("stages %s, %s: want the first shipped, the second left queued", r.stage(first), r.stage(second))
	}
}

// --max-uptime: the daemon drains when it has been up that long; the job it
// runs then finishes and is reported.
func TestMaxUptimeDrains(t *testing.T) {
	t.Parallel()
	r := newRig(t, rigOptions{})
	r.withLimits(daemon.Limits{MaxUptime: 2 * time.Second})
	r.start()
	id := testenv.ID("uptime")
	r.submit(id, "app", r.blocking(id))
	r.waitStarted(id)
	r.waitFor("the drain at max-uptime", func() bool { st := r.status(); return st != nil && st.Stage == "draining" })
	r.release(id)
	if err := r.wait(); err != nil {
		t.Fatalf("Run = %v", err)
	}
	if r.stage(id) != coord.StageShipped {
		t.Fatalf("the running job ended %s", r.stage(id))
	}
}

// Negative limits are configuration errors.
func TestLimitsRefused(t *testing.T) {
	t.Parallel()
	for _, l := range []daemon.Limits{{IdleTimeout: -time.Second}, {MaxJobs: -1}, {MaxUptime: -time.Minute}} {
		r := newRig(t, rigOptions{})
		_, err := daemon.New(daemon.Options{Config: r.cfg, Limits: l})
		if err == nil || !strings.Contains(err.Error(), "negative") {
			t.Errorf("%+v: err %v, want a negative-limit error", l, err)
		}
	}
}

// A factory that stops cleanly leaves the fleet: a last heartbeat with
// health "offline", then deregister — the stub no longer lists it (so
// replicas that come and go do not pile up as stale factories); a later
// start registers it again with its first heartbeat.
func TestCleanExitDeregisters(t *testing.T) {
	t.Parallel()
	eachRouteSet(t, func(t *testing.T, routes string) {
		r := newRig(t, rigOptions{routes: routes})
		r.withLimits(daemon.Limits{MaxUptime: time.Second})
		r.start()
		r.waitHeartbeats(1)
		if err := r.wait(); err != nil {
			t.Fatal(err)
		}
		var f *coord.Factory
		for _, x := range r.stub.AllFactories() {
			if x.ID == "fa" {
				f = &x
			}
		}
		// Legacy (no deregister route): the offline heartbeat only, the
		// factory stays listed (stale later); the absence is no error.
		legacy := routes == coord.RoutesLegacy
		if f == nil || f.Deregistered == legacy || f.Health != "offline" || len(f.Running) != 0 {
			t.Fatalf("the factory after a clean exit: %+v", f)
		}
		listed := false
		for _, x := range r.stub.Factories() {
			listed = listed || x.ID == "fa"
		}
		if listed != legacy {
			t.Fatalf("listed %t after a clean exit", listed)
		}
		if n := r.stub.Stats().Count(coord.RouteDeregister) + r.stub.Stats().Routes["unmatched"].Requests; n != 1 {
			t.Fatalf("%d deregister calls, want 1", n)
		}
		if strings.Contains(r.logs.String(), "cannot deregister") {
			t.Fatalf("the missing route was taken for an error:\n%s", r.logs)
		}
		// Back again: the first heartbeat registers it.
		r.d = nil
		r.start()
		r.waitFor("fa listed again", func() bool {
			for _, x := range r.stub.Factories() {
				if x.ID == "fa" {
					return true
				}
			}
			return false
		})
	})
}
