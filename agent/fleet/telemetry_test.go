package fleet

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aqfleet/aq/agent/config"
	"github.com/aqfleet/aq/agent/notify"
	"github.com/aqfleet/aq/agent/notify/notifytest"
	"github.com/aqfleet/aq/demo/coord"
	"github.com/aqfleet/aq/demo/coord/coordtest"
	"github.com/aqfleet/aq/internal/telemetry"
	"github.com/aqfleet/aq/internal/telemetry/otlptest"
	"github.com/aqfleet/aq/internal/testenv"
	"github.com/aqfleet/aq/job"
)

var (
	idTraced   = testenv.ID("traced")
	idNotified = testenv.ID("notified")
	idDoomed   = testenv.ID("doomed")
	idPatient  = testenv.ID("patient")
)

// startStubBehind is startStub with the stub behind wrap (a fault of the
// test's own in front of it).
func startStubBehind(t testing.TB, o coord.Options, wrap func(http.Handler) http.Handler) *stub {
	t.Helper()
	return &stub{coordtest.StartBehind(t, o, wrap)}
}

// failFinalPatches answers 503 to the first n terminal PATCHes of a job (a
// coordinator that is briefly down when the final report goes out).
func failFinalPatches(n int32) func(http.Handler) http.Handler {
	var left atomic.Int32
	left.Store(n)
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.Method == http.MethodPatch {
				b, _ := io.ReadAll(r.Body)
				r.Body = io.NopCloser(bytes.NewReader(b))
				if !strings.Contains(string(b), `"stage":"building"`) && left.Add(-1) >= 0 {
					http.Error(w, `{"error":"down for a moment"}`, http.StatusServiceUnavailable)
					return
				}
			}
			next.ServeHTTP(w, r)
		})
	}
}

func tracing(t *testing.T, rcv *otlptest.Receiver) *telemetry.Tracing {
	t.Helper()
	tr, err := telemetry.Setup(context.Background(), telemetry.Options{
		Getenv: func(k string) string {
			if k == "OTEL_EXPORTER_OTLP_ENDPOINT" {
				return rcv.URL()
			}
			return ""
		},
		FactoryID: "tracer",
	})
	if err != nil || !tr.Enabled() {
		t.Fatalf("tracing: %v", err)
	}
	t.Cleanup(func() { _ = tr.Shutdown(context.Background()) })
	return tr
}

// TestFleetJobTrace: a fleet job through the real pipeline against the
// coordinator stub records one trace — the root from the claim to the final
// report with the lease's renewals as events, a child per step, the final
// report's retries as events on its span — and the engine ran with a
// TRACEPARENT naming its span in that trace.
func TestFleetJobTrace(t *testing.T) {
	testenv.Slow(t, "runs fleet jobs against a coordinator with real git")
	t.Parallel()
	rcv := otlptest.Start(t)
	s := startStubBehind(t, coord.Options{}, failFinalPatches(2))
	w := newWorld(t, "app")
	tp := filepath.Join(w.dir, "traceparent")
	script, started, goFile := w.waitScript(idTraced)
	wrapped := w.script("traced-wrap", fmt.Sprintf("echo \"$TRACEPARENT\" > %q\n%s\n", tp, script))
	s.submit(t, idTraced, "app", "script: "+wrapped+"\nship: branch")
	tr := tracing(t, rcv)
	f := newFactory(t, s, w, "tracer", func(_ *config.Config, p *Parts) { p.Tracer = tr.Tracer() })

	done := make(chan *Result, 1)
	go func() {
		res, err := f.runOnce(t, ctxT(t))
		if err != nil {
			t.Error(err)
		}
		done <- res
	}()
	testenv.WaitFor(t, time.Minute, "the engine to start", func() bool { return testenv.Exists(started) })
	testenv.WaitFor(t, time.Minute, "two lease renewals", func() bool { return s.Stats().Routes[coord.RouteRenew].Status["200"] >= 2 })
	testenv.WriteFile(t, goFile, "")
	res := <-done
	if res == nil || res.Stage != job.Shipped || res.Report != "delivered" {
		t.Fatalf("result %+v", res)
	}
	if err := tr.ForceFlush(context.Background()); err != nil {
		t.Fatal(err)
	}
	root, ok := rcv.Root(telemetry.SpanJob, telemetry.AttrJobID, idTraced)
	if !ok {
		t.Fatalf("no root span among %d", len(rcv.Spans()))
	}
	for k, want := range map[string]any{"aq.mode": "fleet", "aq.job.source": "poll", "aq.lease.epoch": int64(1), "aq.job.repo": "app",
		"aq.job.stage": "shipped", "aq.job.outcome": "succeeded", "aq.report.delivery": "delivered", "aq.engine": "script"} {
		if root.Attrs[k] != want {
			t.Errorf("root %s = %v, want %v", k, root.Attrs[k], want)
		}
	}
	if n := strings.Count(strings.Join(root.EventNames(), " "), telemetry.EventLeaseRenew); n < 2 {
		t.Errorf("root events %v: want at least 2 lease renewals", root.EventNames())
	}
	trace := rcv.Trace(root.TraceID)
	kids := otlptest.Children(trace, root.SpanID)
	if got, want := otlptest.Names(kids), []string{"preflight", "worktree", "engine", "checkpoint", "commit", "ship", "report"}; !slices.Equal(got, want) {
		t.Fatalf("steps %v, want %v", got, want)
	}
	report := kids[len(kids)-1]
	retries := 0
	for _, e := range report.Events {
		if e.Name == telemetry.EventRetry && e.Attrs[telemetry.AttrCall] == "PATCH /fleet/jobs/:id" {
			retries++
		}
	}
	if retries != 2 || report.Error || report.Attrs["aq.report.delivery"] != "delivered" {
		t.Fatalf("report span: %d retries, events %v, attrs %v", retries, report.EventNames(), report.Attrs)
	}
	engine := kids[2]
	got := strings.TrimSpace(testenv.ReadFile(t, tp))
	if want := fmt.Sprintf("00-%s-%s-01", root.TraceID, engine.SpanID); got != want {
		t.Fatalf("the engine's TRACEPARENT %q, want %q", got, want)
	}
	if root.Resource["aq.factory.id"] != "tracer" {
		t.Errorf("resource %v", root.Resource)
	}
}

// TestFleetNotifications: in fleet mode a shipped job and a job that fails
// for good (no retries left: the coordinator dead-letters it) each notify
// once, after their reports, with the documented fields.
func TestFleetNotifications(t *testing.T) {
	testenv.Slow(t, "runs fleet jobs against a coordinator with real git")
	t.Parallel()
	rcv := notifytest.Start(t)
	s := startStub(t, coord.Options{})
	w := newWorld(t, "app")
	s.submit(t, idNotified, "app", "title: Ship the thing\nscript: echo one > one.txt\nship: branch\npriority: high")
	s.submit(t, idDoomed, "app", "script: exit 3\nretry: { max: 0 }")
	n := notify.Start(context.Background(), notify.Options{URL: rcv.URL(), Factory: "notifier", MinWait: 5 * time.Millisecond, MaxWait: 20 * time.Millisecond})
	f := newFactory(t, s, w, "notifier", func(_ *config.Config, p *Parts) { p.Notifier = n })
	if err := f.Agent.Run(ctxT(t), RunOptions{Drain: true}, nil); err != nil {
		t.Fatal(err)
	}
	n.Close(time.Minute) // a deadlock guard
	evs := rcv.Events(t)
	if len(evs) != 2 {
		t.Fatalf("%d notifications: %v", len(evs), evs)
	}
	byJob := map[string]map[string]any{}
	for _, e := range evs {
		byJob[e["jobId"].(string)] = e
	}
	ok := byJob[idNotified]
	for k, want := range map[string]any{"version": 1.0, "event": "job.shipped", "title": "Ship the thing", "repo": "app", "stage": "shipped",
		"branch": "aq/job/" + idNotified, "factory": "notifier", "mode": "fleet", "attempt": 1.0} {
		if ok[k] != want {
			t.Errorf("shipped: %s = %v, want %v", k, ok[k], want)
		}
	}
	bad := byJob[idDoomed]
	for k, want := range map[string]any{"event": "job.failed", "stage": "dead_letter", "reason": "engine_failed", "mode": "fleet"} {
		if bad[k] != want {
			t.Errorf("failed: %s = %v, want %v", k, bad[k], want)
		}
	}
	if in, _ := bad["insights"].(map[string]any); in["engine"] != "script" {
		t.Errorf("failed: insights %v", bad["insights"])
	}
}

// TestHangingReceiverDoesNotDelayReport: a webhook receiver that never
// answers does not hold the job: the final report reaches the coordinator
// and the run returns while the notification is still in flight.
func TestHangingReceiverDoesNotDelayReport(t *testing.T) {
	testenv.Slow(t, "runs fleet jobs against a coordinator with real git")
	t.Parallel()
	rcv := notifytest.Start(t)
	rcv.Hold()
	s := startStub(t, coord.Options{})
	w := newWorld(t, "app")
	s.submit(t, idPatient, "app", "script: echo x > x.txt\nship: branch")
	s.submit(t, idOne, "app", "script: echo y > y.txt\nship: branch")
	n := notify.Start(context.Background(), notify.Options{URL: rcv.URL(), Factory: "patient", Timeout: time.Hour})
	f := newFactory(t, s, w, "patient", func(_ *config.Config, p *Parts) { p.Notifier = n })
	res, err := f.runOnce(t, ctxT(t))
	if err != nil || res.Report != "delivered" {
		t.Fatalf("%+v %v", res, err)
	}
	<-rcv.Arrived // the notification went out and hangs
	// A second job runs and reports while the first notification hangs.
	res2, err := f.runOnce(t, ctxT(t))
	if err != nil || res2.Report != "delivered" {
		t.Fatalf("%+v %v", res2, err)
	}
	for _, id := range []string{res.JobID, res2.JobID} {
		if j, _ := s.Job(id); j.Stage != coord.StageShipped {
			t.Fatalf("job %s is %s", id, j.Stage)
		}
	}
	if rcv.Answered() != 0 || rcv.Requests() != 1 {
		t.Fatalf("answered %d of %d: the receiver was to hang", rcv.Answered(), rcv.Requests())
	}
	n.Close(10 * time.Millisecond)
	if n.Sent() != 0 || n.Failed() != 2 {
		t.Fatalf("sent %d failed %d", n.Sent(), n.Failed())
	}
}
