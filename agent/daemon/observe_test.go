package daemon_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/azcore"
	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"
	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus/admin"

	"github.com/aqfleet/aq/agent/config"
	"github.com/aqfleet/aq/agent/dispatch"
	"github.com/aqfleet/aq/agent/fleet"
	"github.com/aqfleet/aq/demo/coord"
	"github.com/aqfleet/aq/internal/testenv"
)

// usage is a script that reports usage and writes result.txt, then exits
// with code.
func (r *rig) usage(id, code string) string {
	return r.script(id, "echo '::aq-usage tokens_in=1200 tokens_out=300 tokens_cached=50 cost_usd=0.25 turns=2'\necho done > result.txt\nexit "+code+"\n")
}

// The job series under the names buildkite-agent and ARC use: started,
// ended by result, failures by reason, startup and duration histograms, the
// engines' spend (failed runs included), renewal errors under both names,
// the worktrees' disk; the old names still served, marked deprecated.
func TestJobMetricsNewNames(t *testing.T) {
	t.Parallel()
	r := newRig(t, rigOptions{metrics: true})
	r.start()
	ok, bad := testenv.ID("m-ok"), testenv.ID("m-bad")
	r.submit(ok, "app", r.usage(ok, "0"))
	r.waitStage(ok, coord.StageShipped)
	r.closedRecord(ok)
	r.submit(bad, "app", r.usage(bad, "3")+"\nretry: { max: 0 }")
	r.waitStage(bad, coord.StageDeadLetter)
	r.closedRecord(bad)
	var body string
	r.waitFor("both jobs counted and the disk measured", func() bool {
		_, body = r.get("/metrics")
		return metric(body, "aq_jobs_ended_total", `result="failed"`) == 1 && metric(body, "aq_worktree_disk_bytes", "") > 0
	})
	for _, c := range []struct {
		name, labels string
		want         float64
	}{
		{"aq_jobs_started_total", "", 2},
		{"aq_jobs_ended_total", `result="succeeded"`, 1},
		{"aq_jobs_ended_total", `result="failed"`, 1},
		{"aq_jobs_ended_total", `result="fenced"`, 0},
		{"aq_jobs_ended_total", `result="interrupted"`, 0},
		{"aq_jobs_failed_total", `reason="engine_failed"`, 1},
		{"aq_job_startup_duration_seconds_count", `source="poll"`, 2},
		{"aq_job_duration_seconds_count", `result="succeeded"`, 1},
		{"aq_job_duration_seconds_count", `result="failed"`, 1},
		{"aq_engine_cost_usd_total", `engine="script"`, 0.5},
		{"aq_engine_tokens_total", `engine="script",kind="input"`, 2400},
		{"aq_engine_tokens_total", `engine="script",kind="output"`, 600},
		{"aq_engine_tokens_total", `engine="script",kind="cached"`, 100},
		{"aq_lease_renew_errors_total", "", 0},
		{"aq_jobs_running", "", 0},
		// The deprecated names, still served.
		{"aq_jobs_total", `reason="none",result="shipped"`, 1},
		{"aq_jobs_total", `reason="engine_failed",result="dead_letter"`, 1},
		{"aq_job_start_seconds_count", `source="poll"`, 2},
		{"aq_lease_renew_failures_total", "", 0},
	} {
		if got := metric(body, c.name, c.labels); got != c.want {
			t.Errorf("%s{%s} = %v, want %v", c.name, c.labels, got, c.want)
		}
	}
	for _, old := range []string{"aq_jobs_total", "aq_job_start_seconds", "aq_lease_renew_failures_total"} {
		if !strings.Contains(body, "# HELP "+old+" Deprecated") {
			t.Errorf("%s is not marked deprecated in its HELP", old)
		}
	}
	if metric(body, "aq_broker_subscription_active_messages", `subscription="fa",topic="fleet-dispatch"`) != -1 {
		t.Error("broker depth gauges without a broker")
	}
	if t.Failed() {
		t.Logf("metrics:\n%s", body)
	}
	if err := r.drain(); err != nil {
		t.Fatal(err)
	}
}

// Failed renewals count under the new name and the deprecated one alike.
func TestRenewErrorsBothNames(t *testing.T) {
	t.Parallel()
	r := newRig(t, rigOptions{metrics: true, parts: func(p *fleet.Parts) { p.Budgets.Renew = 300 * time.Millisecond }})
	r.start()
	id := testenv.ID("renew-errs")
	r.submit(id, "app", r.blocking(id))
	r.waitStarted(id)
	r.stub.SetFaults(1, 0, coord.RouteRenew)
	r.waitFor("two failed renewals", func() bool {
		_, body := r.get("/metrics")
		return metric(body, "aq_lease_renew_errors_total", "") >= 2
	})
	r.stub.SetFaults(0, 0)
	r.release(id)
	r.waitStage(id, coord.StageShipped)
	r.closedRecord(id)
	_, body := r.get("/metrics")
	if n, old := metric(body, "aq_lease_renew_errors_total", ""), metric(body, "aq_lease_renew_failures_total", ""); n != old || n < 2 {
		t.Fatalf("renew errors %v, deprecated %v", n, old)
	}
	if err := r.drain(); err != nil {
		t.Fatal(err)
	}
}

func peerAdmin(t *testing.T, r *rig, keyName string) *admin.Client {
	t.Helper()
	ac, err := admin.NewClientFromConnectionString(r.peer.AdminConnectionStringFor(keyName),
		&admin.ClientOptions{ClientOptions: azcore.ClientOptions{Transport: r.peer.AdminHTTPClient()}})
	if err != nil {
		t.Fatal(err)
	}
	return ac
}

// The broker depth gauges follow the subscription, read through the real
// SDK's management client from the local peer: dispatches waiting while the
// one slot is busy show as active messages; once the slot frees, the
// receiver dead-letters the malformed one (the dead-letter gauge) and runs
// the other.
func TestBrokerDepthGauges(t *testing.T) {
	t.Parallel()
	r := newRig(t, rigOptions{broker: true, metrics: true, noPublisher: true, peerAdmin: true,
		config: func(c *config.Config) { c.BrokerDepthInterval = 50 * time.Millisecond }})
	r.admin = peerAdmin(t, r, "sbpeer")
	r.start()
	r.waitLive(dispatch.LiveBroker)
	send := r.testSender()
	gauges := func() (active, dead float64) {
		_, body := r.get("/metrics")
		return metric(body, "aq_broker_subscription_active_messages", `subscription="fa",topic="fleet-dispatch"`),
			metric(body, "aq_broker_subscription_dead_letter_messages", `subscription="fa",topic="fleet-dispatch"`)
	}
	r.waitFor("the gauges at zero", func() bool { a, d := gauges(); return a == 0 && d == 0 })

	busy, next := testenv.ID("depth-busy"), testenv.ID("depth-next")
	r.submit(busy, "app", r.blocking(busy))
	send(busy)
	r.waitStarted(busy) // the one slot is taken: the receiver takes no message now
	r.submit(next, "app", r.quick(next))
	c, err := azservicebus.NewClientFromConnectionString(r.peer.ConnectionString(), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(context.Background())
	snd, err := c.NewSender(topic, nil)
	if err != nil {
		t.Fatal(err)
	}
	mid := "malformed-1"
	if err := snd.SendMessage(context.Background(), &azservicebus.Message{MessageID: &mid, Body: []byte("not a dispatch"),
		ApplicationProperties: map[string]any{"targetFactoryId": "fa"}}, nil); err != nil {
		t.Fatal(err)
	}
	send(next)
	r.waitFor("two messages waiting", func() bool { a, d := gauges(); return a == 2 && d == 0 })

	r.release(busy)
	r.waitStage(next, coord.StageShipped)
	r.waitFor("the malformed one dead-lettered, none waiting", func() bool { a, d := gauges(); return a == 0 && d == 1 })
	_, body := r.get("/metrics")
	if metric(body, "aq_broker_depth_read_errors_total", "") != 0 {
		t.Fatalf("read errors:\n%s", body)
	}
	if err := r.drain(); err != nil {
		t.Fatal(err)
	}
}

// A credential without Manage rights: the read is refused (401); aq says so
// once, the gauges are absent (unknown, not a stale zero), and the daemon
// goes on: a job arrives from the broker and ships.
func TestBrokerDepthRefused(t *testing.T) {
	t.Parallel()
	r := newRig(t, rigOptions{broker: true, metrics: true, peerAdmin: true,
		config: func(c *config.Config) { c.BrokerDepthInterval = 50 * time.Millisecond }})
	r.admin = peerAdmin(t, r, "listen")
	r.start()
	r.waitLive(dispatch.LiveBroker)
	r.waitFor("three refused reads", func() bool {
		_, body := r.get("/metrics")
		return metric(body, "aq_broker_depth_read_errors_total", "") >= 3
	})
	_, body := r.get("/metrics")
	if metric(body, "aq_broker_subscription_active_messages", `subscription="fa",topic="fleet-dispatch"`) != -1 ||
		metric(body, "aq_broker_subscription_dead_letter_messages", `subscription="fa",topic="fleet-dispatch"`) != -1 {
		t.Fatalf("depth gauges present while the reads are refused:\n%s", body)
	}
	id := testenv.ID("depth-refused")
	r.submit(id, "app", r.quick(id))
	r.waitStage(id, coord.StageShipped)
	if code, _ := r.get("/healthz"); code != 200 {
		t.Fatalf("healthz %d", code)
	}
	logs := r.logs.String()
	if n := strings.Count(logs, "cannot read the subscription's depth"); n != 1 || !strings.Contains(logs, "needs Manage rights") {
		t.Fatalf("%d warnings:\n%s", n, logs)
	}
	if strings.Contains(logs, "c2JwZWVyLWxvY2FsLWtleQ==") {
		t.Fatal("the key is in the log")
	}
	if err := r.drain(); err != nil {
		t.Fatal(err)
	}
}
