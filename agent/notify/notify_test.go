package notify_test

import (
	"context"
	"log/slog"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/aqfleet/aq/agent/notify"
	"github.com/aqfleet/aq/agent/notify/notifytest"
	"github.com/aqfleet/aq/internal/secrets"
	"github.com/aqfleet/aq/internal/testenv"
	"github.com/aqfleet/aq/job"
)

func TestMain(m *testing.M) { os.Exit(testenv.Main(m)) }

func TestFor(t *testing.T) {
	for _, c := range []struct {
		name string
		end  notify.End
		kind notify.Kind
		need string
	}{
		{"shipped", notify.End{Stage: job.Shipped}, notify.Shipped, ""},
		{"review (PR open)", notify.End{Stage: job.Review, PRURL: "https://github.com/a/b/pull/1"}, notify.NeedsPerson, notify.NeedReview},
		{"testing (verified branch)", notify.End{Stage: job.Testing}, notify.NeedsPerson, notify.NeedReview},
		{"dead letter", notify.End{Stage: job.DeadLetter, Reason: job.ReasonVerifyFailed, Final: true}, notify.Failed, ""},
		{"permanent", notify.End{Stage: job.Failed, Reason: job.ReasonInvalidManifest, Final: true}, notify.Failed, ""},
		{"retried", notify.End{Stage: job.Inbox, Reason: job.ReasonVerifyFailed}, "", ""},
		{"budget, retried", notify.End{Stage: job.Inbox, Reason: job.ReasonBudgetExceeded}, notify.NeedsPerson, notify.NeedBudget},
		{"budget, for good", notify.End{Stage: job.DeadLetter, Reason: job.ReasonBudgetExceeded, Final: true}, notify.NeedsPerson, notify.NeedBudget},
		{"fenced", notify.End{Stage: job.Failed, Reason: job.ReasonFenced, Fenced: true, Final: true}, "", ""},
		{"lease lost", notify.End{Stage: job.Failed, Reason: job.ReasonLeaseLost, Final: true}, "", ""},
		{"interrupted", notify.End{Stage: job.Inbox, Reason: job.ReasonInterrupted, Final: true}, "", ""},
		{"still building", notify.End{Stage: job.Building}, "", ""},
	} {
		kind, need, ok := notify.For(c.end)
		if kind != c.kind || need != c.need || ok != (c.kind != "") {
			t.Errorf("%s: got %q %q %v, want %q %q", c.name, kind, need, ok, c.kind, c.need)
		}
	}
}

func quick(url string, log *slog.Logger) notify.Options {
	return notify.Options{URL: url, Factory: "f1", Log: log, MinWait: 5 * time.Millisecond, MaxWait: 20 * time.Millisecond,
		Redactor: secrets.NewRedactor(nil, "sk-secret-value")}
}

// A receiver that answers 500 twice, then 200, gets the event on the third
// try, the same delivery id each time; the payload has the documented fields.
func TestRetriedUntilTaken(t *testing.T) {
	rcv := notifytest.Start(t)
	rcv.Answer(func(n int) int {
		if n <= 2 {
			return http.StatusInternalServerError
		}
		return http.StatusOK
	})
	n := notify.Start(context.Background(), quick(rcv.URL(), nil))
	n.Notify(notify.End{JobID: "j1", Title: "Fix it", Repo: "app", Attempt: 2, Stage: job.DeadLetter, Reason: job.ReasonVerifyFailed,
		Detail: "verify failed: sk-secret-value leaked", Final: true, Branch: "aq/job/j1", Mode: "local", TraceID: "0af7651916cd43dd8448eb211c80319c",
		Insights: job.Insights{Engine: "script", CostUSD: 0.25, TokensIn: 10}})
	n.Close(time.Minute) // a deadlock guard: the three tries are quick
	if rcv.Requests() != 3 || n.Sent() != 1 || n.Failed() != 0 {
		t.Fatalf("%d requests, sent %d failed %d", rcv.Requests(), n.Sent(), n.Failed())
	}
	ids := map[string]bool{}
	for _, h := range rcv.Headers() {
		ids[h.Get("X-Aq-Delivery")] = true
		if h.Get("Content-Type") != "application/json" || h.Get("X-Aq-Event") != "job.failed" {
			t.Errorf("headers %v", h)
		}
	}
	if len(ids) != 1 || !ids["j1:2:job.failed"] {
		t.Errorf("delivery ids %v", ids)
	}
	m := rcv.Events(t)[2]
	for k, want := range map[string]any{"version": 1.0, "event": "job.failed", "id": "j1:2:job.failed", "jobId": "j1", "title": "Fix it", "repo": "app",
		"stage": "dead_letter", "reason": "verify_failed", "attempt": 2.0, "branch": "aq/job/j1", "factory": "f1", "mode": "local",
		"traceId": "0af7651916cd43dd8448eb211c80319c"} {
		if m[k] != want {
			t.Errorf("%s = %v, want %v", k, m[k], want)
		}
	}
	if d, _ := m["detail"].(string); strings.Contains(d, "sk-secret-value") || !strings.Contains(d, "***") {
		t.Errorf("detail not masked: %q", d)
	}
	if in, _ := m["insights"].(map[string]any); in["costUsd"] != 0.25 || in["engine"] != "script" {
		t.Errorf("insights %v", m["insights"])
	}
	if ts, _ := m["time"].(string); ts == "" {
		t.Error("no time")
	}
}

// A 4xx is the receiver's final word: not retried; the URL (with its
// token) is never logged.
func TestRefusedNotRetried(t *testing.T) {
	rcv := notifytest.Start(t)
	rcv.Answer(func(int) int { return http.StatusForbidden })
	logs := &testenv.SyncBuffer{}
	n := notify.Start(context.Background(), quick(rcv.URL(), slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))))
	n.Notify(notify.End{JobID: "j", Repo: "app", Stage: job.Shipped})
	n.Close(time.Minute)
	if rcv.Requests() != 1 || n.Failed() != 1 {
		t.Fatalf("%d requests, failed %d", rcv.Requests(), n.Failed())
	}
	if !strings.Contains(logs.String(), "refused by the receiver") || strings.Contains(logs.String(), "notify-secret-token") {
		t.Fatalf("logs:\n%s", logs)
	}
}

// A receiver that is down: the retries end, the failure is logged without
// the URL.
func TestDownReceiver(t *testing.T) {
	url := "http://127.0.0.1:1/hook/tok-in-path" // nothing listens on port 1
	logs := &testenv.SyncBuffer{}
	o := quick(url, slog.New(slog.NewTextHandler(logs, nil)))
	o.Retries = 2
	n := notify.Start(context.Background(), o)
	n.Notify(notify.End{JobID: "j", Repo: "app", Stage: job.Shipped})
	n.Close(time.Minute)
	if n.Failed() != 1 || n.Sent() != 0 {
		t.Fatalf("sent %d failed %d", n.Sent(), n.Failed())
	}
	if !strings.Contains(logs.String(), "notification not delivered") || strings.Contains(logs.String(), "tok-in-path") {
		t.Fatalf("logs:\n%s", logs)
	}
}

// A receiver that hangs: Notify returns at once (the caller — a job's end —
// never waits), later events queue behind it, a full queue drops with a
// warning, and Close gives up after its limit with one warning for what was
// left.
func TestHangingReceiverBlocksNothing(t *testing.T) {
	rcv := notifytest.Start(t)
	rcv.Hold()
	logs := &testenv.SyncBuffer{}
	o := quick(rcv.URL(), slog.New(slog.NewTextHandler(logs, nil)))
	o.Queue = 2
	o.Timeout = time.Hour // only Close ends the hang
	n := notify.Start(context.Background(), o)
	n.Notify(notify.End{JobID: "a", Repo: "app", Stage: job.Shipped})
	<-rcv.Arrived // the first is in flight, held by the receiver
	for _, id := range []string{"b", "c", "d"} {
		n.Notify(notify.End{JobID: id, Repo: "app", Stage: job.Shipped}) // two queue, one is dropped
	}
	if n.Dropped() != 1 {
		t.Fatalf("dropped %d, want 1", n.Dropped())
	}
	n.Close(50 * time.Millisecond)
	if n.Sent() != 0 || n.Failed() != 3 || rcv.Requests() != 1 {
		t.Fatalf("sent %d failed %d requests %d", n.Sent(), n.Failed(), rcv.Requests())
	}
	if !strings.Contains(logs.String(), "notification dropped") || strings.Count(logs.String(), "notifications not sent") != 1 {
		t.Fatalf("logs:\n%s", logs)
	}
	n.Notify(notify.End{JobID: "late", Repo: "app", Stage: job.Shipped}) // after Close: refused, no panic
	var nilN *notify.Notifier
	nilN.Notify(notify.End{JobID: "x", Stage: job.Shipped})
	nilN.Close(time.Second)
}
