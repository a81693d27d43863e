//go:build !unit

package jobs

import (
	"path/filepath"
	"strings"
	"testing"

	"github.com/aqfleet/aq/cmd/aq/cli"
	"github.com/aqfleet/aq/cmd/aq/clitest"
	"github.com/aqfleet/aq/internal/testenv"
	"github.com/aqfleet/aq/job"
)

// TestStatusBoard: `aq status --json` shows counts per stage, the running
// job with its pid and age (not mistaken for an orphan), blocked jobs and
// why, inbox jobs this host cannot run and why, and failed jobs.
func TestStatusBoard(t *testing.T) {
	t.Parallel() // its own home, repos and processes: it runs beside the others
	h, mark := clitest.MarkedHome(t)
	h.Repo(t, "app", nil)
	h.Repo(t, "other", nil)
	h.Submit(t, "broken", clitest.ScriptJob("app", "exit 2"))
	if r := h.Run(t, "run", "--once"); r.Code != 1 {
		t.Fatalf("broken: %s", r)
	}
	h.Submit(t, "long", clitest.ScriptJob("app", `touch "$MARK/started"
while [ ! -e "$MARK/go" ]; do sleep 0.02; done
echo done > done.txt`, "ship: branch", "priority: critical"))
	h.Submit(t, "child", clitest.ScriptJob("other", "echo child > c.txt", "deps: ["+testenv.ID("long")+"]"))
	h.Submit(t, "picky", clitest.ScriptJob("other", "true", "capabilities: [has:nonexistent-tool]"))

	aq := clitest.Start(t, h, "run", "--once")
	aq.WaitMark(mark, "started")
	b := board(t, h)

	want := map[job.Stage]int{job.Inbox: 1, job.Blocked: 1, job.Building: 1, job.DeadLetter: 1}
	for _, st := range job.Stages {
		if b.Counts[st] != want[st] {
			t.Errorf("count of %s = %d, want %d (all: %v)", st, b.Counts[st], want[st], b.Counts)
		}
	}
	if len(b.Recovered) != 0 {
		t.Errorf("status recovered a job that is running: %v", b.Recovered)
	}
	if len(b.Running) != 1 {
		t.Fatalf("running: %+v", b.Running)
	}
	r := b.Running[0]
	if r.ID != testenv.ID("long") || r.PID != aq.PID || r.Repo != "app" || r.Engine != "script" || r.Attempt != 1 || r.AgeSec < 0 || r.StartedAt.IsZero() || r.Host == "" {
		t.Errorf("running job %+v (aq pid %d)", r, aq.PID)
	}
	why := map[string]cli.WaitingJob{}
	for _, w := range b.Waiting {
		why[w.ID] = w
	}
	if w := why[testenv.ID("child")]; w.Stage != job.Blocked || !strings.Contains(w.Why, testenv.ID("long")) {
		t.Errorf("blocked child: %+v", w)
	}
	if w := why[testenv.ID("picky")]; w.Stage != job.Inbox || !strings.Contains(w.Why, "has:nonexistent-tool") || !strings.Contains(w.Why, "cannot run") {
		t.Errorf("picky: %+v", w)
	}
	if len(b.Failed) != 1 || b.Failed[0].ID != testenv.ID("broken") || b.Failed[0].Reason != job.ReasonEngineFailed || b.Failed[0].Attempts != 1 {
		t.Errorf("failed: %+v", b.Failed)
	}
	if len(b.Runnable) != 0 {
		t.Errorf("runnable while nothing can run: %+v", b.Runnable)
	}
	everyQueuedJobListed(t, b)
	if b.Home != h.Dir {
		t.Errorf("home %q", b.Home)
	}
	// broken's worktree went to app's pool, and long took it.
	if len(b.Pools) != 0 {
		t.Errorf("pools while long runs in the only warm worktree: %+v", b.Pools)
	}

	text := h.Run(t, "status")
	for _, s := range []string{"running:", "long", "waiting:", "has:nonexistent-tool", "failed:", "broken"} {
		if !strings.Contains(text.Stdout, s) {
			t.Errorf("aq status lacks %q:\n%s", s, text.Stdout)
		}
	}

	testenv.WriteFile(t, filepath.Join(mark, "go"), "")
	if r := aq.Wait(); r.Code != 0 {
		t.Fatalf("long: %s", r)
	}
	// long shipped: child is runnable now; picky still waits.
	b = board(t, h)
	if len(b.Pools) != 1 || b.Pools[0] != (cli.PoolStatus{Repo: "app", Worktrees: 1}) {
		t.Errorf("pools after long: %+v", b.Pools)
	}
	if text := h.Run(t, "status"); !strings.Contains(text.Stdout, "warm worktrees (the next job on the repository resets one): app 1") {
		t.Errorf("aq status does not show the pool:\n%s", text.Stdout)
	}
	if b.Counts[job.Shipped] != 1 || b.Counts[job.Blocked] != 0 || b.Counts[job.Inbox] != 2 || len(b.Running) != 0 {
		t.Errorf("after long shipped: %v running %v", b.Counts, b.Running)
	}
	if len(b.Waiting) != 1 || b.Waiting[0].ID != testenv.ID("picky") {
		t.Errorf("waiting after long shipped: %+v", b.Waiting)
	}
	// The board hides no job a person looks for: child, runnable now, is
	// listed (it used to be only a count), and so is long, shipped.
	if len(b.Runnable) != 1 || b.Runnable[0].ID != testenv.ID("child") || b.Runnable[0].Repo != "other" || b.Runnable[0].Engine != "script" {
		t.Errorf("runnable after long shipped: %+v", b.Runnable)
	}
	if len(b.Shipped) != 1 || b.Shipped[0].ID != testenv.ID("long") || b.Shipped[0].Branch != "aq/job/"+testenv.ID("long") || b.Shipped[0].EndedAt.IsZero() {
		t.Errorf("shipped: %+v", b.Shipped)
	}
	everyQueuedJobListed(t, b)
	text = h.Run(t, "status")
	for _, want := range []string{"runnable (`aq run` takes them in this order):\n  " + testenv.ID("child") + " (inbox): repo other, engine script",
		"shipped:\n  " + testenv.ID("long") + " aq/job/" + testenv.ID("long")} {
		if !strings.Contains(text.Stdout, want) {
			t.Errorf("aq status lacks %q:\n%s", want, text.Stdout)
		}
	}
	if r := h.Run(t, "run", "--once"); r.Code != 0 || !strings.Contains(r.Stdout, "child") {
		t.Errorf("child: %s", r)
	}
	if r := h.Run(t, "run", "--once"); r.Code != 3 {
		t.Errorf("picky must not run here: %s", r)
	}
}

// everyQueuedJobListed: each job in the inbox or blocked is on the board,
// as runnable or as waiting with a reason.
func everyQueuedJobListed(t *testing.T, b cli.Board) {
	t.Helper()
	if got, want := len(b.Runnable)+len(b.Waiting), b.Counts[job.Inbox]+b.Counts[job.Blocked]; got != want {
		t.Errorf("%d inbox and blocked jobs, %d listed (runnable %+v, waiting %+v)", want, got, b.Runnable, b.Waiting)
	}
	for _, w := range b.Waiting {
		if w.Why == "" {
			t.Errorf("waiting job %s without a reason", w.ID)
		}
	}
}
