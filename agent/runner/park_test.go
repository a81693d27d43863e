package runner_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/aqfleet/aq/agent/holds"
	"github.com/aqfleet/aq/agent/runner"
	"github.com/aqfleet/aq/engines"
	"github.com/aqfleet/aq/internal/testenv"
	"github.com/aqfleet/aq/job"
)

// fakeClaude writes to dir a claude that behaves as the real 2.1.197 does
// (testenv.FakeClaude) and whose run writes work.txt in its worktree,
// counts itself in $MARK/claude-runs, prints the recorded stream fixture
// (engines/testdata/claude/<fixture>) and exits with exit.
func fakeClaude(t *testing.T, dir, fixture string, exit int) string {
	t.Helper()
	return testenv.FakeClaude{Script: "echo \"work in progress\" > work.txt\necho run >> \"$MARK/claude-runs\"",
		Stream: filepath.Join(testenv.ClaudeTestdata(t), fixture), Exit: exit}.Write(t, dir)
}

// claudeFixture is a runner whose claude is fakeClaude(fixture), at now,
// with a holds store.
func claudeFixture(t *testing.T, fixture string, now time.Time) (*fixture, *holds.Store) {
	t.Helper()
	bin := fakeClaude(t, t.TempDir(), fixture, 1)
	f := newFixture(t, &engines.Claude{Bin: bin})
	f.r.Env = append(f.r.Env, "ANTHROPIC_API_KEY=sk-ant-test-0123456789")
	f.r.Now = func() time.Time { return now }
	hs := holds.Open(filepath.Join(f.home.Dir, "engines", "holds.json"), func() time.Time { return now })
	f.r.Holds = hs
	return f, hs
}

func (f *fixture) claudeJob(name string) *job.Job {
	j := f.job(name, "")
	j.Engine, j.Script = "claude", ""
	return j
}

func (f *fixture) claudeRuns() int {
	b, _ := os.ReadFile(f.marker("claude-runs"))
	return strings.Count(string(b), "run\n")
}

// TestParkOnEngineLimit: claude's rejected rate_limit_event parks the job
// until the reset it reported — not a failure — with its work checkpointed;
// claude is held until then, so the next claude job parks at once, without
// a worktree and without running claude.
func TestParkOnEngineLimit(t *testing.T) {
	testenv.Slow(t, "runs whole jobs with real git, processes and waits")
	now := time.Date(2026, 5, 12, 3, 0, 0, 0, time.UTC)
	reset := time.Unix(1778565600, 0).UTC() // the fixture's resetsAt: 06:00 UTC
	f, hs := claudeFixture(t, "rate_limit_event.jsonl", now)

	j := f.claudeJob("limited")
	out := f.run(context.Background(), j, runner.Options{})
	if !out.IsParked() || out.Reason != job.ReasonRateLimited || out.Parked != "claude usage limit" || !out.ParkedUntil.Equal(reset) {
		t.Fatalf("outcome %+v; want parked (rate_limited) for the claude usage limit until %s", out, reset)
	}
	if !strings.Contains(out.Detail, "You've hit your limit") {
		t.Errorf("detail %q does not say what claude said", out.Detail)
	}
	if out.Checkpoint == "" || f.wip("limited") != out.Checkpoint {
		t.Fatalf("no checkpoint for the parked run: %q (aq/wip %q)", out.Checkpoint, f.wip("limited"))
	}
	if got := testenv.TreeFiles(t, f.repo, out.Checkpoint)["work.txt"]; got != "work in progress" {
		t.Errorf("the checkpoint lacks claude's work: work.txt = %q", got)
	}
	h, ok := hs.Held("claude")
	if !ok || !h.Until.Equal(reset) || h.Job != j.ID || h.Why != engines.LimitUsage {
		t.Fatalf("claude hold = %+v, %t; want held until %s by %s", h, ok, reset, j.ID)
	}

	next := f.claudeJob("next")
	out = f.run(context.Background(), next, runner.Options{})
	if !out.IsParked() || !out.ParkedUntil.Equal(reset) || !strings.Contains(out.Detail, "claude is held until 2026-05-12T06:00:00Z") || !strings.Contains(out.Detail, j.ID) {
		t.Fatalf("a claude job while claude is held: %+v; want parked until the hold ends", out)
	}
	if f.claudeRuns() != 1 {
		t.Errorf("claude ran %d times; the held engine must not run again", f.claudeRuns())
	}
	if _, err := os.Stat(f.wt("next")); err == nil {
		t.Error("a worktree was made for a job parked by a hold")
	}
	// A script job is not held.
	if out := f.run(context.Background(), f.job("other", "true\n"), runner.Options{}); out.Failed() {
		t.Errorf("a script job while claude is held: %+v", out)
	}
}

// TestParkResetBadInput: the reset the engine reported, one in the past,
// and none at all (each through the real claude adapter and a fake claude
// printing a recorded stream).
func TestParkResetBadInput(t *testing.T) {
	testenv.Slow(t, "runs whole jobs with real git, processes and waits")
	reset := time.Unix(1778565600, 0).UTC()
	for _, tc := range []struct {
		name, fixture string
		now           time.Time
		want          func(now time.Time) time.Time
		note          string
	}{
		{"past", "rate_limit_event.jsonl", reset.Add(time.Hour), func(now time.Time) time.Time { return now.Add(job.MinParkWait) }, "has passed"},
		{"none", "rate_limited.jsonl", reset, func(now time.Time) time.Time { return now.Add(job.DefaultParkWait) }, "no reset time reported"},
		{"too_far", "rate_limit_event.jsonl", reset.Add(-400 * 24 * time.Hour), func(now time.Time) time.Time { return now.Add(job.DefaultParkWait) }, "more than"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f, hs := claudeFixture(t, tc.fixture, tc.now)
			out := f.run(context.Background(), f.claudeJob("bad-"+tc.name), runner.Options{})
			if want := tc.want(tc.now); !out.IsParked() || !out.ParkedUntil.Equal(want) || !strings.Contains(out.Detail, tc.note) {
				t.Fatalf("outcome %+v; want parked until %s with a note %q", out, want, tc.note)
			}
			if h, ok := hs.Held("claude"); !ok || !h.Until.Equal(out.ParkedUntil) {
				t.Errorf("hold %+v, %t; want claude held as long as the job parks", h, ok)
			}
		})
	}
}

// TestUnauthenticatedIsNotParked: the real claude's unauthenticated output
// (recorded) is engine_unavailable, never a park and never a hold.
func TestUnauthenticatedIsNotParked(t *testing.T) {
	testenv.Slow(t, "runs whole jobs with real git, processes and waits")
	f, hs := claudeFixture(t, "real_unauthenticated.jsonl", time.Date(2026, 5, 12, 3, 0, 0, 0, time.UTC))
	out := f.run(context.Background(), f.claudeJob("unauth"), runner.Options{})
	if out.Reason != job.ReasonEngineUnavailable || out.IsParked() || !strings.Contains(out.Detail, "Not logged in") {
		t.Fatalf("outcome %+v; want engine_unavailable saying claude is not logged in", out)
	}
	if len(hs.List()) != 0 {
		t.Errorf("holds %v after an auth failure; want none", hs.List())
	}
}
