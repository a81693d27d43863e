//go:build !unit

package jobs

import (
	"encoding/json"
	"slices"
	"strings"
	"testing"

	"github.com/aqfleet/aq/cmd/aq/clitest"
	"github.com/aqfleet/aq/internal/testenv"
	"github.com/aqfleet/aq/job"
)

// TestJobCommands: show, logs, requeue, ship and reject on real jobs, and a
// usage error (exit 2, one line) for an unknown or invalid id.
func TestJobCommands(t *testing.T) {
	t.Parallel() // its own home, repos and processes: it runs beside the others
	h := clitest.BinHome(t)
	h.Repo(t, "app", nil)
	built, flop := testenv.ID("built"), testenv.ID("flop")
	h.Submit(t, "built", clitest.ScriptJob("app", "echo hello from built\necho warn >&2\necho x > x.txt", "ship: none"))
	h.Submit(t, "flop", clitest.ScriptJob("app", "exit 2"))
	if r := h.Run(t, "run", "--drain"); r.Code != 1 {
		t.Fatalf("drain: %s", r)
	}

	// show
	v := show(t, h, "built")
	if v.Stage != job.Testing || v.Branch != "aq/job/"+built || v.Checkpoint == "" || v.Insights == nil || v.Insights.FilesChanged != 1 {
		t.Errorf("show --json: %+v", v.State)
	}
	// The job's worktree went back to the pool: it has none any more.
	if v.Worktree != "" || testenv.Exists(h.Worktree("app", built)) || !testenv.Exists(v.Manifest) || !testenv.Exists(v.Logs) {
		t.Errorf("paths: manifest %s logs %s worktree %q", v.Manifest, v.Logs, v.Worktree)
	}
	text := h.Run(t, "job", "show", built)
	for _, s := range []string{"stage", "testing", "aq/job/" + built, "history:", "inbox → building", "went back to the worktree pool"} {
		if !strings.Contains(text.Stdout, s) {
			t.Errorf("job show lacks %q:\n%s", s, text.Stdout)
		}
	}

	// logs
	logs := h.Run(t, "job", "logs", built)
	if logs.Code != 0 || !strings.Contains(logs.Stdout, "hello from built") || !strings.Contains(logs.Stdout, "warn") || !strings.Contains(logs.Stdout, "=== aq job "+built+" attempt 1") {
		t.Errorf("job logs: %s", logs)
	}
	if r := h.Run(t, "job", "logs", "--stream", "stderr", built); r.Code != 0 || strings.Contains(r.Stdout, "hello from built") || !strings.Contains(r.Stdout, "warn") {
		t.Errorf("job logs --stream stderr: %s", r)
	}
	if r := h.Run(t, "job", "logs", "--stream", "bogus", built); r.Code != 2 {
		t.Errorf("bad stream: %s", r)
	}
	// --json: one record per log line, each naming its stream; with -f,
	// one per engine event and stage change.
	recs := logRecords(t, h.Run(t, "job", "logs", "--json", built))
	if !hasRecord(recs, func(r logRecord) bool { return r.Stream == "stdout" && r.Text == "hello from built" }) ||
		!hasRecord(recs, func(r logRecord) bool { return r.Stream == "stderr" && r.Text == "warn" }) ||
		!hasRecord(recs, func(r logRecord) bool {
			return r.Job == built && strings.HasPrefix(r.Text, "=== aq job "+built+" attempt 1")
		}) {
		t.Errorf("job logs --json: %+v", recs)
	}
	recs = logRecords(t, h.Run(t, "job", "logs", "-f", "--json", built))
	if !hasRecord(recs, func(r logRecord) bool { return r.Kind == "event" && strings.Contains(r.Text, "inbox → building") }) ||
		!hasRecord(recs, func(r logRecord) bool { return r.Kind == "text" && r.Text == "hello from built" }) {
		t.Errorf("job logs -f --json: %+v", recs)
	}
	if r := h.Run(t, "job", "logs", "-f", "--raw", "--json", built); r.Code != 2 {
		t.Errorf("--raw with --json: %s", r)
	}
	// The help lists the flags logs reads: its own, the coordinator's
	// (fleet mode) and the global ones — no repository flags.
	help := h.Run(t, "job", "logs", "--help").Stdout
	for _, want := range []string{"--json", "--stream", "--fleet-api", "--home"} {
		if !strings.Contains(help, want) {
			t.Errorf("job logs --help lacks %s:\n%s", want, help)
		}
	}
	for _, unread := range []string{"Repository flags", "--repo-base", "--heartbeat-sec", "--worktree-pool"} {
		if strings.Contains(help, unread) {
			t.Errorf("job logs --help lists %s, which it does not read:\n%s", unread, help)
		}
	}

	// ship: testing → shipped, once.
	if r := h.Run(t, "job", "ship", built); r.Code != 0 || !strings.Contains(r.Stdout, "shipped "+built) {
		t.Errorf("job ship: %s", r)
	}
	if v := show(t, h, "built"); v.Stage != job.Shipped {
		t.Errorf("after ship: %s", v.Stage)
	}
	if r := h.Run(t, "job", "ship", built); r.Code != 2 {
		t.Errorf("shipping twice: %s", r)
	}

	// requeue: dead_letter → inbox, reason cleared, attempts kept.
	if v := show(t, h, "flop"); v.Stage != job.DeadLetter {
		t.Fatalf("flop: %s", v.Stage)
	}
	if r := h.Run(t, "job", "requeue", flop); r.Code != 0 || !strings.Contains(r.Stdout, "requeued "+flop) {
		t.Errorf("requeue: %s", r)
	}
	if v := show(t, h, "flop"); v.Stage != job.Inbox || v.Reason != "" || v.Attempts != 1 {
		t.Errorf("after requeue: %s %q attempts %d", v.Stage, v.Reason, v.Attempts)
	}
	if r := h.Run(t, "job", "requeue", built); r.Code != 2 {
		t.Errorf("requeue of a shipped job: %s", r)
	}

	// reject: inbox → failed (rejected), nothing deleted.
	if r := h.Run(t, "job", "reject", "--why", "not needed", flop); r.Code != 0 || !strings.Contains(r.Stdout, "rejected "+flop) {
		t.Errorf("reject: %s", r)
	}
	if v := show(t, h, "flop"); v.Stage != job.Failed || v.Reason != job.ReasonRejected || v.Detail != "not needed" || !testenv.Exists(v.Manifest) {
		t.Errorf("after reject: %s %s %q", v.Stage, v.Reason, v.Detail)
	}
	if r := h.Run(t, "run", "--once"); r.Code != 3 {
		t.Errorf("a rejected job ran: %s", r)
	}

	// Unknown and invalid ids.
	for _, args := range [][]string{
		{"job", "show", "nosuch"}, {"job", "logs", "nosuch"}, {"job", "requeue", "nosuch"},
		{"job", "ship", "nosuch"}, {"job", "reject", "nosuch"}, {"job", "show", "../etc"},
	} {
		r := h.Run(t, args...)
		lines := strings.Split(strings.TrimRight(r.Stderr, "\n"), "\n")
		if r.Code != 2 || len(lines) != 1 || !strings.HasPrefix(lines[0], "aq: ") {
			t.Errorf("aq %v: want exit 2 and one line: %s", args, r)
		}
	}
}

// logRecord is one line of `aq job logs --json`, decoded by its JSON
// names (the binary's output, not cli's type).
type logRecord struct {
	Job    string `json:"job"`
	Stream string `json:"stream"`
	Kind   string `json:"kind"`
	Text   string `json:"text"`
}

// logRecords decodes `aq job logs --json`: one JSON object per line.
func logRecords(t *testing.T, r testenv.Result) []logRecord {
	t.Helper()
	if r.Code != 0 {
		t.Fatalf("job logs --json: %s", r)
	}
	var out []logRecord
	for _, l := range strings.Split(strings.TrimRight(r.Stdout, "\n"), "\n") {
		var rec logRecord
		if err := json.Unmarshal([]byte(l), &rec); err != nil {
			t.Fatalf("not one JSON object per line: %q: %v", l, err)
		}
		out = append(out, rec)
	}
	return out
}

func hasRecord(recs []logRecord, ok func(logRecord) bool) bool {
	return slices.ContainsFunc(recs, ok)
}
