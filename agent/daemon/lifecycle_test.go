package daemon_test

import (
	"errors"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/aqfleet/aq/agent/config"
	"github.com/aqfleet/aq/agent/dispatch"
	"github.com/aqfleet/aq/agent/fleet"
	"github.com/aqfleet/aq/demo/coord"
	"github.com/aqfleet/aq/internal/testenv"
	"github.com/aqfleet/aq/job"
)

// metric reads one sample of the Prometheus text format ("" labels: the
// bare name); -1 when absent.
func metric(body, name, labels string) float64 {
	re := regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(name) + `(\{[^}]*\})? (\S+)$`)
	for _, m := range re.FindAllStringSubmatch(body, -1) {
		if labels == "" && m[1] == "" || labels != "" && m[1] == "{"+labels+"}" {
			v, _ := strconv.ParseFloat(m[2], 64)
			return v
		}
	}
	return -1
}

// /healthz is 200 while the last heartbeat is younger than twice its
// interval: 503 once the coordinator stops taking heartbeats, 200 again
// after it takes one. The status file and the metrics say the same.
func TestHealthzFollowsHeartbeats(t *testing.T) {
	t.Parallel()
	r := newRig(t, rigOptions{metrics: true})
	r.start()
	r.waitFor("/healthz 200", func() bool { c, _ := r.get("/healthz"); return c == 200 })
	r.stub.SetFaults(1, 0, coord.RouteHeartbeat) // every heartbeat answered 503
	r.waitFor("/healthz 503", func() bool { c, _ := r.get("/healthz"); return c == 503 })
	_, body := r.get("/metrics")
	if metric(body, "aq_healthy", "") != 0 || metric(body, "aq_heartbeat_failures_total", "") < 1 {
		t.Fatalf("metrics while unhealthy:\n%s", body)
	}
	r.waitFor("the status file to say unhealthy", func() bool { return !r.status().HeartbeatHealthy })
	if code, _ := r.get("/healthz"); code != 503 {
		t.Fatal("healthy again without a heartbeat")
	}
	r.stub.SetFaults(0, 0)
	r.waitFor("/healthz 200 again", func() bool { c, _ := r.get("/healthz"); return c == 200 })
	_, body = r.get("/metrics")
	if metric(body, "aq_healthy", "") != 1 {
		t.Fatalf("aq_healthy after recovery:\n%s", body)
	}
	if err := r.drain(); err != nil {
		t.Fatal(err)
	}
}

// The series of docs/observability.md ("Metrics") are exported, with what happened: a job from the
// broker (accepted, lag observed), a stale message answered 409 (a conflict),
// the live source.
func TestMetricsSeries(t *testing.T) {
	t.Parallel()
	r := newRig(t, rigOptions{broker: true, metrics: true, gate: true})
	r.start()
	r.waitLive(dispatch.LiveBroker)
	id := testenv.ID("metrics-job")
	r.submit(id, "app", r.quick(id))
	r.waitStage(id, coord.StageShipped)
	r.testSender()
	r.testSenderWithID()(id, dispatch.DispatchMessageID(id, 0, 7)) // stale: 409
	var body string
	// The message outcome, the claim result and the 409 are counted by
	// different layers (receiver, daemon, client): wait for all three.
	r.waitFor("the conflict counted", func() bool {
		_, body = r.get("/metrics")
		return metric(body, "aq_dispatch_messages_total", `outcome="conflict"`) == 1 &&
			metric(body, "aq_claims_total", `result="conflict",source="broker"`) == 1 &&
			metric(body, "aq_conflicts_total", `call="POST /fleet/accept"`) == 1
	})
	for _, c := range []struct {
		name, labels string
		want         float64 // -2: present, any value
	}{
		{"aq_jobs_total", `reason="none",result="shipped"`, 1},
		{"aq_claims_total", `result="leased",source="broker"`, 1},
		{"aq_claims_total", `result="conflict",source="broker"`, 1},
		{"aq_conflicts_total", `call="POST /fleet/accept"`, 1},
		{"aq_dispatch_messages_total", `outcome="accepted"`, 1},
		{"aq_dispatch_lag_seconds_count", "", 1},
		{"aq_job_start_seconds_count", `source="broker"`, 1},
		{"aq_dispatch_source", `source="broker"`, 1},
		{"aq_dispatch_source", `source="poll"`, 0},
		{"aq_dispatch_source_switches_total", `to="broker"`, 1},
		{"aq_broker_connected", "", 1},
		{"aq_jobs_running", "", 0},
		{"aq_slots", "", 1},
		{"aq_spool_depth", "", 0},
		{"aq_lease_renew_failures_total", "", 0},
		{"aq_heartbeat_failures_total", "", 0},
		{"aq_gate_reads_total", "", 0},
		{"aq_healthy", "", 1},
		{"aq_heartbeat_last_success_timestamp_seconds", "", -2},
		{"process_resident_memory_bytes", "", -2},
		{"go_goroutines", "", -2},
	} {
		got := metric(body, c.name, c.labels)
		if (c.want == -2 && got < 0) || (c.want != -2 && got != c.want) {
			t.Errorf("%s{%s} = %v, want %v", c.name, c.labels, got, c.want)
		}
	}
	if t.Failed() {
		t.Logf("metrics:\n%s", body)
	}
	if err := r.drain(); err != nil {
		t.Fatal(err)
	}
}

// A renewal that fails after earlier successes is retried, not fatal: the
// job finishes and ships.
func TestRenewalFailuresAreRetried(t *testing.T) {
	t.Parallel()
	r := newRig(t, rigOptions{metrics: true, parts: func(p *fleet.Parts) { p.Budgets.Renew = 300 * time.Millisecond }})
	r.start()
	id := testenv.ID("renew")
	r.submit(id, "app", r.blocking(id))
	r.waitStarted(id)
	r.waitFor("two renewals", func() bool { return r.stub.Stats().Routes[coord.RouteRenew].Status["200"] >= 2 })
	r.stub.SetFaults(1, 0, coord.RouteRenew)
	r.waitFor("two failed renewals", func() bool {
		_, body := r.get("/metrics")
		return metric(body, "aq_lease_renew_failures_total", "") >= 2
	})
	r.stub.SetFaults(0, 0)
	r.waitFor("a renewal after the failures", func() bool {
		return r.stub.Stats().Routes[coord.RouteRenew].Status["200"] >= 3
	})
	r.release(id)
	r.waitStage(id, coord.StageShipped)
	if rec := r.closedRecord(id); rec.Reason != "" || rec.Stage != job.Shipped {
		t.Fatalf("record %+v", rec)
	}
	if err := r.drain(); err != nil {
		t.Fatal(err)
	}
}

// A heartbeat answered 401 stops the daemon: Run returns the auth error
// (exit 5 in the command), the status file says why.
func TestHeartbeat401Stops(t *testing.T) {
	t.Parallel()
	r := newRig(t, rigOptions{})
	r.start()
	r.waitLive(dispatch.LivePoll)
	if err := r.stub.RevokeFactory("fa"); err != nil {
		t.Fatal(err)
	}
	err := r.wait()
	var ae *fleet.AuthError
	if !errors.As(err, &ae) || ae.Status != 401 {
		t.Fatalf("Run = %v, want the 401", err)
	}
	if st := r.status(); st.Stage != "stopped" || !strings.Contains(st.Error, "refused this factory's credentials") {
		t.Fatalf("status %s", dumpJSON(st))
	}
}

// First stop: no new work, the running job finishes and is reported; a job
// submitted meanwhile is never claimed.
func TestDrainLetsRunningJobFinish(t *testing.T) {
	t.Parallel()
	eachRouteSet(t, func(t *testing.T, routes string) {
		r := newRig(t, rigOptions{routes: routes})
		r.start()
		id := testenv.ID("drain")
		r.submit(id, "app", r.blocking(id))
		r.waitStarted(id)
		claims := r.stub.Stats().Count(coord.RouteClaim)
		r.d.Drain()
		r.waitFor("draining in the status file", func() bool { return r.status().Stage == "draining" })
		later := testenv.ID("drain-later")
		r.submit(later, "app", r.quick(later))
		r.release(id)
		if err := r.wait(); err != nil {
			t.Fatal(err)
		}
		if r.stage(id) != coord.StageShipped || r.stage(later) != coord.StageQueued {
			t.Fatalf("stages %s, %s", r.stage(id), r.stage(later))
		}
		if n := r.stub.Stats().Count(coord.RouteClaim); n != claims {
			t.Fatalf("%d claims after the drain began", n-claims)
		}
	})
}

// Second stop: the running job is stopped through the kill ladder,
// checkpointed with its WIP ref pushed, failed as retryable: the stub shows
// the lease released at once (queued, no holder).
func TestAbortCheckpointsAndFails(t *testing.T) {
	t.Parallel()
	eachRouteSet(t, func(t *testing.T, routes string) {
		for _, viaTimeout := range []bool{false, true} {
			t.Run(map[bool]string{false: "two-stops", true: "drain-timeout"}[viaTimeout], func(t *testing.T) {
				r := newRig(t, rigOptions{routes: routes, config: func(c *config.Config) {
					if viaTimeout {
						c.DrainTimeout = 300 * time.Millisecond
					}
				}})
				r.start()
				id := testenv.ID("abort")
				r.submit(id, "app", r.blocking(id))
				r.waitStarted(id)
				r.d.Drain()
				if !viaTimeout {
					r.d.Abort()
				}
				if err := r.wait(); err != nil {
					t.Fatal(err)
				}
				j, _ := r.stub.Job(id)
				if j.Stage != coord.StageQueued || j.Holder != "" || j.Reason != string(job.ReasonInterrupted) {
					t.Fatalf("stub job %+v", j)
				}
				if k, want := r.kinds(id), failKinds(routes, coord.StageQueued); !slices.Equal(k[len(k)-len(want):], want) {
					t.Fatalf("audit %v, want it to end %v", k, want)
				}
				wip := testenv.RemoteRefs(t, r.origins["app"], "refs/heads/aq/wip/")
				sha := wip["refs/heads/aq/wip/"+id]
				if sha == "" || j.Checkpoint != sha {
					t.Fatalf("WIP on origin %v, coordinator checkpoint %q", wip, j.Checkpoint)
				}
				if files := testenv.TreeFiles(t, r.origins["app"], sha); !strings.Contains(files["wip.txt"], "wip of "+id) {
					t.Fatalf("the checkpoint lacks the engine's file: %v", files)
				}
				if rec := r.record(id); rec.Reason != job.ReasonInterrupted || rec.Running() {
					t.Fatalf("record %+v", rec)
				}
			})
		}
	})
}

// Credentials refused at start (the stored token was revoked): Run returns
// the auth error before any work.
func TestStartRefused(t *testing.T) {
	t.Parallel()
	r := newRig(t, rigOptions{})
	r.start()
	r.waitLive(dispatch.LivePoll)
	if err := r.drain(); err != nil {
		t.Fatal(err)
	}
	if err := r.stub.RevokeFactory("fa"); err != nil {
		t.Fatal(err)
	}
	claims := r.stub.Stats().Count(coord.RouteClaim)
	r.d = nil // a new daemon on the same home: it loads the revoked token
	r.start()
	var ae *fleet.AuthError
	if err := r.wait(); !errors.As(err, &ae) {
		t.Fatalf("Run = %v, want the auth error", err)
	}
	if n := r.stub.Stats().Count(coord.RouteClaim); n != claims {
		t.Fatalf("%d claims after the refusal", n-claims)
	}
}
