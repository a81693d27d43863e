package queue

import (
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/aqfleet/aq/internal/aqerr"
	"github.com/aqfleet/aq/job"
)

// runAndFail takes the job attempts times and fails every run with reason;
// every run but the last must go back to the inbox. It returns the stage the
// last Fail chose.
func runAndFail(t *testing.T, q *Queue, clk *fakeClock, id string, attempts int, reason job.Reason) job.Stage {
	t.Helper()
	for i := 1; i <= attempts; i++ {
		clk.Advance(24 * time.Hour) // past any backoff
		e, err := q.Next(func(s State) bool { return s.ID == id })
		if err != nil {
			t.Fatalf("attempt %d: Next: %v", i, err)
		}
		if e.State.Attempts != i {
			t.Fatalf("attempt %d: Attempts = %d", i, e.State.Attempts)
		}
		to, err := q.Fail(id, reason, "run "+string(rune('0'+i)), nil)
		if err != nil {
			t.Fatalf("attempt %d: Fail: %v", i, err)
		}
		if i < attempts {
			if to != job.Inbox {
				t.Fatalf("attempt %d went to %s, want inbox", i, to)
			}
		} else {
			return to
		}
	}
	return ""
}

func TestFail(t *testing.T) {
	tests := []struct {
		name     string
		max      int
		backoff  time.Duration
		attempts int // runs, the last one failing with reason
		reason   job.Reason
		want     job.Stage
		wait     time.Duration // NotBefore - now, when want is inbox
	}{
		{"task failure, retries left", 2, time.Minute, 1, job.ReasonEngineFailed, job.Inbox, time.Minute},
		{"second failure backs off twice as long", 2, time.Minute, 2, job.ReasonVerifyFailed, job.Inbox, 2 * time.Minute},
		{"retries exhausted", 2, time.Minute, 3, job.ReasonTimeout, job.DeadLetter, 0},
		{"no retries", 0, time.Minute, 1, job.ReasonBudgetExceeded, job.DeadLetter, 0},
		{"permanent: invalid manifest", 5, time.Minute, 1, job.ReasonInvalidManifest, job.Failed, 0},
		{"permanent: fenced", 5, time.Minute, 1, job.ReasonFenced, job.Failed, 0},
		{"infrastructure with no retries left still retries", 0, time.Second, 1, job.ReasonEngineUnavailable, job.Inbox, 30 * time.Second},
		{"infrastructure: last extra try", 0, time.Minute, 1 + job.InfraRetries - 1, job.ReasonCrash, job.Inbox, 4 * time.Minute},
		{"infrastructure: extra tries exhausted", 0, time.Minute, 1 + job.InfraRetries, job.ReasonLeaseLost, job.DeadLetter, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			q, clk := newQueue(t)
			mustSubmit(t, q, mkJob("a", withRetry(tt.max), withBackoff(tt.backoff)))
			got := runAndFail(t, q, clk, "a", tt.attempts, tt.reason)
			if got != tt.want {
				t.Fatalf("Fail went to %s, want %s", got, tt.want)
			}
			if stageOf(t, q, "a") != tt.want {
				t.Fatalf("manifest not in %s", tt.want)
			}
			st := sidecarOnDisk(t, q, tt.want, "a")
			if st.Reason != tt.reason || st.Detail == "" || !st.EndedAt.Equal(clk.Now()) || st.Attempts != tt.attempts {
				t.Errorf("sidecar = %+v", st)
			}
			if wait := st.NotBefore.Sub(clk.Now()); tt.want == job.Inbox && wait != tt.wait {
				t.Errorf("backoff = %v, want %v", wait, tt.wait)
			} else if tt.want != job.Inbox && !st.NotBefore.IsZero() {
				t.Errorf("NotBefore set outside the inbox: %v", st.NotBefore)
			}
			last := st.History[len(st.History)-1]
			if last.From != job.Building || last.To != tt.want || last.Reason != tt.reason {
				t.Errorf("last transition = %+v", last)
			}
		})
	}
}

// An infrastructure failure (expired login) must not burn the task's retries
// but must stop eventually: retry.max + InfraRetries + 1 runs in all.
func TestFailInfrastructureGetsExtraTries(t *testing.T) {
	q, clk := newQueue(t)
	mustSubmit(t, q, mkJob("a", withRetry(1)))
	runs := 0
	for {
		clk.Advance(24 * time.Hour)
		if _, err := q.Next(nil); err != nil {
			t.Fatalf("run %d: %v", runs+1, err)
		}
		runs++
		to, err := q.Fail("a", job.ReasonEngineUnavailable, "usage limit", nil)
		if err != nil {
			t.Fatal(err)
		}
		if to == job.DeadLetter {
			break
		}
		if runs > 20 {
			t.Fatal("never dead-lettered")
		}
	}
	if want := 1 + 1 + job.InfraRetries; runs != want {
		t.Errorf("runs = %d, want %d", runs, want)
	}
}

func TestFailAppliesFnAndGuardsOwnership(t *testing.T) {
	q, clk := newQueue(t)
	mustSubmit(t, q, mkJob("a"))
	mustNext(t, q)
	other := reopen(t, q, clk, WithOwner("otherhost", 1))
	if _, err := other.Fail("a", job.ReasonCrash, "", nil); !errors.Is(err, ErrNotOwner) {
		t.Errorf("Fail by another process = %v, want ErrNotOwner", err)
	}
	if err := other.Finish("a", job.Shipped, nil); !errors.Is(err, ErrNotOwner) {
		t.Errorf("Finish by another process = %v, want ErrNotOwner", err)
	}
	if _, err := q.Fail("a", "bogus", "", nil); err == nil {
		t.Error("Fail accepted an unknown reason")
	}
	ins := &job.Insights{Engine: "claude", TokensIn: 10}
	to, err := q.Fail("a", job.ReasonVerifyFailed, "make test: exit 2", func(s *State) {
		s.Checkpoint = "abc123"
		s.Insights = ins
		s.Reason = "overwritten-by-queue"
	})
	if err != nil || to != job.Inbox {
		t.Fatalf("Fail = %s, %v", to, err)
	}
	st := sidecarOnDisk(t, q, job.Inbox, "a")
	if st.Checkpoint != "abc123" || st.Insights == nil || st.Insights.TokensIn != 10 || st.Reason != job.ReasonVerifyFailed || st.Detail != "make test: exit 2" {
		t.Errorf("sidecar = %+v", st)
	}
	// Failing again is refused: the job is no longer building.
	_, err = q.Fail("a", job.ReasonVerifyFailed, "", nil)
	if se, ok := errAs[*StageError](err); !ok || se.Stage != job.Inbox {
		t.Errorf("second Fail = %v, want *StageError in inbox", err)
	}
	// The next attempt is told how this one ended, with its failed verify;
	// one the operator requeued is not (it starts over).
	clk.Advance(time.Hour)
	e := mustNext(t, q)
	if p := e.State.Previous; p == nil || p.Attempt != 1 || p.Reason != job.ReasonVerifyFailed || p.Detail != "make test: exit 2" {
		t.Errorf("previous = %+v", p)
	}
	if _, err := q.Fail("a", job.ReasonVerifyFailed, "again", func(s *State) {
		s.Insights = &job.Insights{RepairRounds: 2, Verify: &job.VerifyResult{Command: "make test", ExitCode: 2, Tail: "FAIL x"}}
	}); err != nil {
		t.Fatal(err)
	}
	clk.Advance(time.Hour)
	if p := mustNext(t, q).State.Previous; p == nil || p.Attempt != 2 || p.RepairRounds != 2 || p.Verify == nil || p.Verify.Tail != "FAIL x" {
		t.Errorf("previous with its verify = %+v", p)
	}
}

func TestFinish(t *testing.T) {
	for _, to := range []job.Stage{job.Review, job.Testing, job.Shipped} {
		t.Run(string(to), func(t *testing.T) {
			q, clk := newQueue(t)
			mustSubmit(t, q, mkJob("a"))
			mustNext(t, q)
			clk.Advance(time.Minute)
			err := q.Finish("a", to, func(s *State) {
				s.Branch, s.PR = "aq/job/a", "https://example.invalid/pr/1"
			})
			if err != nil {
				t.Fatal(err)
			}
			st := sidecarOnDisk(t, q, to, "a")
			if st.Stage != to || !st.EndedAt.Equal(clk.Now()) || st.Branch != "aq/job/a" || st.PR == "" || st.Reason != "" {
				t.Errorf("sidecar = %+v", st)
			}
			// A second Finish is refused, not applied twice.
			if err := q.Finish("a", to, nil); err == nil {
				t.Error("second Finish succeeded")
			}
		})
	}
	q, _ := newQueue(t)
	mustSubmit(t, q, mkJob("a"))
	if err := q.Finish("a", job.Shipped, nil); err == nil {
		t.Error("Finish of an inbox job succeeded")
	}
	mustNext(t, q)
	if err := q.Finish("a", job.Failed, nil); err == nil {
		t.Error("Finish to failed succeeded (use Fail)")
	}
}

func TestUpdateAndMove(t *testing.T) {
	q, clk := newQueue(t)
	mustSubmit(t, q, mkJob("a"))
	mustNext(t, q)
	clk.Advance(time.Second)
	if err := q.Update("a", func(s *State) { s.Checkpoint = "c0ffee" }); err != nil {
		t.Fatal(err)
	}
	st := sidecarOnDisk(t, q, job.Building, "a")
	if st.Checkpoint != "c0ffee" || !st.UpdatedAt.Equal(clk.Now()) || len(st.History) != 2 {
		t.Errorf("after Update: %+v", st)
	}
	if err := q.Update("a", func(s *State) { s.Stage = job.Shipped }); err == nil {
		t.Error("Update changed the stage")
	}
	if err := q.Update("a", func(s *State) { s.ID = "b" }); err == nil {
		t.Error("Update changed the id")
	}
	if err := q.Move("a", job.Building, nil); err != nil {
		t.Errorf("Move to the current stage: %v", err)
	}
	if err := q.Move("a", "nowhere", nil); aqerr.ExitCode(err) != aqerr.Usage {
		t.Errorf("Move to an unknown stage = %v", err)
	}
	if err := q.Move("a", job.Review, func(s *State) { s.PR = "pr-1" }); err != nil {
		t.Fatal(err)
	}
	if err := q.Move("a", job.Building, nil); err == nil {
		t.Error("Move into building succeeded (only Next may start a job)")
	}
	st = sidecarOnDisk(t, q, job.Review, "a")
	if st.PR != "pr-1" || st.History[len(st.History)-1].From != job.Building {
		t.Errorf("after Move: %+v", st)
	}
	if f := files(t, q); !slices.Equal(f, []string{"review/a.json", "review/a.md"}) {
		t.Errorf("files = %v", f)
	}
}

func TestRequeue(t *testing.T) {
	for _, from := range []job.Stage{job.Failed, job.DeadLetter, job.Review, job.Testing} {
		t.Run(string(from), func(t *testing.T) {
			q, _ := newQueue(t)
			mustSubmit(t, q, mkJob("a", withDeps("all")))
			moveTo(t, q, "a", from)
			if err := q.Requeue("a"); err != nil {
				t.Fatal(err)
			}
			st := sidecarOnDisk(t, q, job.Inbox, "a")
			if st.Attempts != 1 || !st.NotBefore.IsZero() || st.Reason != "" {
				t.Errorf("after requeue: %+v", st)
			}
			if e := mustNext(t, q); e.State.Attempts != 2 {
				t.Errorf("next run attempts = %d", e.State.Attempts)
			}
		})
	}
	t.Run("inbox job in backoff runs now", func(t *testing.T) {
		q, _ := newQueue(t)
		mustSubmit(t, q, mkJob("a"))
		mustNext(t, q)
		if _, err := q.Fail("a", job.ReasonEngineFailed, "x", nil); err != nil {
			t.Fatal(err)
		}
		if err := q.Requeue("a"); err != nil {
			t.Fatal(err)
		}
		mustNext(t, q)
	})
	t.Run("dep not shipped goes to blocked", func(t *testing.T) {
		q, _ := newQueue(t)
		mustSubmit(t, q, mkJob("dep"))
		mustSubmit(t, q, mkJob("a"))
		moveTo(t, q, "a", job.Failed)
		if err := q.Update("a", func(s *State) { s.Deps = []string{"dep"} }); err != nil {
			t.Fatal(err)
		}
		if err := q.Requeue("a"); err != nil {
			t.Fatal(err)
		}
		if stageOf(t, q, "a") != job.Blocked {
			t.Error("requeued job with an unshipped dep should wait in blocked")
		}
	})
	for _, from := range []job.Stage{job.Building, job.Shipped, job.Blocked} {
		t.Run("refused from "+string(from), func(t *testing.T) {
			q, _ := newQueue(t)
			mustSubmit(t, q, mkJob("a"))
			moveTo(t, q, "a", from)
			err := q.Requeue("a")
			if aqerr.ExitCode(err) != aqerr.Usage || !containsAll(err.Error(), "a", string(from)) {
				t.Errorf("Requeue from %s = %v", from, err)
			}
			if stageOf(t, q, "a") != from {
				t.Error("refused requeue moved the job")
			}
		})
	}
}
