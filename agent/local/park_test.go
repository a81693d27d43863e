package local_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/aqfleet/aq/agent/holds"
	"github.com/aqfleet/aq/agent/queue"
	"github.com/aqfleet/aq/agent/runner"
	"github.com/aqfleet/aq/internal/testenv"
	"github.com/aqfleet/aq/job"
)

// fakeClaudeOnPath puts a claude on PATH that answers --version and --help
// as the real 2.1.197 does (testenv.FakeClaude) and whose every run writes a
// file and ends in the recorded rejected rate_limit_event (resets 06:00 UTC
// on 2026-05-12).
func fakeClaudeOnPath(t *testing.T) {
	t.Helper()
	bin := t.TempDir()
	testenv.FakeClaude{Script: "echo wip > wip.txt", Stream: filepath.Join(testenv.ClaudeTestdata(t), "rate_limit_event.jsonl"), Exit: 1}.Write(t, bin)
	t.Setenv("PATH", bin+string(os.PathListSeparator)+os.Getenv("PATH"))
	t.Setenv("ANTHROPIC_API_KEY", "sk-ant-test-0123456789")
}

// TestRunOneParks: a job its engine's limit stopped goes back to the inbox
// with the queue's not-before at the reset claude reported, no attempt
// counted, its work checkpointed; while claude is held, other claude jobs
// are not taken (other engines' are); once the limit has reset the parked
// job runs again.
func TestRunOneParks(t *testing.T) {
	testenv.Slow(t, "runs whole local jobs")
	fakeClaudeOnPath(t)
	markEnv(t)
	h := testenv.NewHome(t)
	h.Repo(t, "app", nil)
	a := newAgent(t, h)
	clk := &clock{t: time.Date(2026, 5, 12, 2, 59, 57, 0, time.UTC)}
	withClock(t, a, clk)
	a.Runner.Now = clk.Now
	a.Runner.Holds = holds.Open(runner.HoldsPath(h.Dir), clk.Now)
	reset := time.Date(2026, 5, 12, 6, 0, 0, 0, time.UTC)

	for _, j := range [][2]string{ // oldest first
		{"limited", "repo: app\nengine: claude\nship: branch"},
		{"second", "repo: app\nengine: claude\nship: branch"},
		{"free", "repo: app\nengine: script\nship: branch\nscript: echo ok > ok.txt"},
	} {
		submit(t, a, j[0], j[1])
		clk.Advance(time.Second)
	}

	res, err := a.RunOne(context.Background())
	if err != nil || res.JobID != testenv.ID("limited") || res.Stage != job.Inbox || !res.Outcome.IsParked() {
		t.Fatalf("RunOne: %v %+v; want limited parked in the inbox", err, res)
	}
	st := state(t, a, "limited")
	if st.Stage != job.Inbox || st.Attempts != 0 || st.Parks != 1 || st.Parked != "claude usage limit" || !st.NotBefore.Equal(reset) ||
		st.Reason != job.ReasonRateLimited || st.Checkpoint == "" {
		t.Fatalf("sidecar of the parked job: %+v", st)
	}

	// claude is held: the other claude job waits, the script job runs.
	res, err = a.RunOne(context.Background())
	if err != nil || res.JobID != testenv.ID("free") || res.Outcome.Failed() {
		t.Fatalf("RunOne while claude is held: %v %+v; want the script job", err, res)
	}
	if _, err := a.RunOne(context.Background()); !errors.Is(err, queue.ErrNoJob) {
		t.Fatalf("RunOne with only held claude jobs left: %v, want ErrNoJob", err)
	}
	if st := state(t, a, "second"); st.Stage != job.Inbox || st.Attempts != 0 {
		t.Errorf("the held engine's other job moved: %+v", st)
	}

	// The limit resets: the parked job (the oldest) runs again, resumes from
	// its checkpoint, and (this claude is always limited) parks again — the
	// reset it reports has now passed, so for the minimum wait.
	clk.Advance(3*time.Hour + time.Second)
	res, err = a.RunOne(context.Background())
	if err != nil || res.JobID != testenv.ID("limited") || !res.Outcome.IsParked() {
		t.Fatalf("RunOne after the reset: %v %+v", err, res)
	}
	st = state(t, a, "limited")
	if st.Attempts != 0 || st.Parks != 2 || !st.NotBefore.Equal(clk.Now().Add(job.MinParkWait)) {
		t.Errorf("after the second park: attempts %d, parks %d, not before %s; want 0, 2, %s", st.Attempts, st.Parks, st.NotBefore, clk.Now().Add(job.MinParkWait))
	}
}
