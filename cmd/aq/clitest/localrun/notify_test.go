//go:build unix && !unit

package localrun

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/aqfleet/aq/agent/notify/notifytest"
	"github.com/aqfleet/aq/cmd/aq/clitest"
	"github.com/aqfleet/aq/internal/testenv"
)

// TestRunNotifies: `aq run --drain` with AQ_NOTIFY_URL posts one
// notification per notable job end, after the job is recorded, with the
// documented fields: a shipped job, a job that failed for good (dead
// letter), a pull request awaiting review, and a job stopped at its budget.
// A job that will be retried says nothing. The URL (with its token) is in
// no log line and `aq config` masks it.
func TestRunNotifies(t *testing.T) {
	t.Parallel() // its own home, repos and processes: it runs beside the others
	h := clitest.BinHome(t)
	clitest.FakeGH(t, h)
	repo := h.Repo(t, "app", nil)
	testenv.AddOrigin(t, repo)
	rcv := notifytest.Start(t)
	h.Env = append(h.Env, "AQ_NOTIFY_URL="+rcv.URL(), "AQ_FACTORY_ID=laptop-1")
	h.Submit(t, "n-ship", clitest.ScriptJob("app", "echo a > a.txt", "title: Ship it", "ship: branch"))
	h.Submit(t, "n-dead", clitest.ScriptJob("app", "exit 3", "retry: { max: 0 }"))
	h.Submit(t, "n-pr", clitest.ScriptJob("app", "echo b > b.txt", "ship: pr"))
	h.Submit(t, "n-budget", clitest.ScriptJob("app", "echo '::aq-usage tokens_in=10 tokens_out=5 cost_usd=0.75 turns=1'\nsleep 5", "budget: { usd: 0.5 }", "retry: { max: 0 }"))
	h.Submit(t, "n-retry", clitest.ScriptJob("app", "exit 3", "retry: { max: 1, backoff: 1h }"))
	r := h.Run(t, "run", "--drain")
	if r.Code != 1 { // jobs failed
		t.Fatalf("aq run --drain: %s", r)
	}
	evs := rcv.Events(t)
	byJob := map[string]map[string]any{}
	for _, e := range evs {
		id, _ := e["jobId"].(string)
		if byJob[id] != nil {
			t.Errorf("job %s notified twice", id)
		}
		byJob[id] = e
	}
	if len(evs) != 4 {
		t.Fatalf("%d notifications, want 4: %v", len(evs), evs)
	}
	want := map[string]map[string]any{
		"n-ship":   {"event": "job.shipped", "stage": "shipped", "title": "Ship it", "branch": "aq/job/" + testenv.ID("n-ship")},
		"n-dead":   {"event": "job.failed", "stage": "dead_letter", "reason": "engine_failed"},
		"n-pr":     {"event": "job.needs_person", "need": "review", "stage": "review", "prUrl": "https://github.com/acme/app/pull/7"},
		"n-budget": {"event": "job.needs_person", "need": "budget", "stage": "dead_letter", "reason": "budget_exceeded"},
	}
	for name, fields := range want {
		e := byJob[testenv.ID(name)]
		if e == nil {
			t.Errorf("no notification for %s", name)
			continue
		}
		fields["version"], fields["repo"], fields["factory"], fields["mode"], fields["attempt"] = 1.0, "app", "laptop-1", "local", 1.0
		fields["id"] = testenv.ID(name) + ":1:" + fields["event"].(string)
		for k, v := range fields {
			if e[k] != v {
				t.Errorf("%s: %s = %v, want %v", name, k, e[k], v)
			}
		}
		if _, ok := e["insights"].(map[string]any); !ok {
			t.Errorf("%s: no insights", name)
		}
		if ts, _ := e["time"].(string); ts == "" {
			t.Errorf("%s: no time", name)
		}
	}
	if in := byJob[testenv.ID("n-budget")]["insights"].(map[string]any); in["costUsd"] != 0.75 {
		t.Errorf("budget insights %v", in)
	}
	if strings.Contains(r.Stderr, "notify-secret-token") {
		t.Fatal("the notify URL's token is in aq's log")
	}
	if c := h.Run(t, "config"); !strings.Contains(c.Stdout, "notify_url") || strings.Contains(c.Stdout, "notify-secret-token") {
		t.Fatalf("aq config: %s", c)
	}
}

// A bad AQ_NOTIFY_URL (or --notify-url-file content): one line, exit 2,
// nothing taken, and the value is not quoted.
func TestRunBadNotifyURL(t *testing.T) {
	t.Parallel() // its own home, repos and processes: it runs beside the others
	h := clitest.BinHome(t)
	h.Repo(t, "app", nil)
	h.Submit(t, "kept", clitest.ScriptJob("app", "echo x > x.txt", "ship: branch"))
	bad := filepath.Join(t.TempDir(), "url")
	if err := os.WriteFile(bad, []byte("hooks.example.com/T0/tok-in-url\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{{"run", "--once"}, {"run", "--once", "--notify-url-file", bad}} {
		hh := *h
		if len(args) == 2 {
			hh.Env = append(append([]string{}, h.Env...), "AQ_NOTIFY_URL=ftp://hooks.example.com/T0/tok-in-url")
		}
		r := hh.Run(t, args...)
		line := strings.TrimSpace(r.Stderr)
		if r.Code != 2 || strings.Contains(line, "\n") || !strings.Contains(line, "http(s) URL") || strings.Contains(line, "tok-in-url") {
			t.Errorf("%v: %s", args, r)
		}
	}
	if v := show(t, h, "kept"); v.Stage != "inbox" {
		t.Fatalf("a job moved: %+v", v)
	}
}
