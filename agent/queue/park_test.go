package queue

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/aqfleet/aq/job"
)

// TestPark: a parked job goes back to the inbox, waits until the time it
// was parked until (the queue's not-before), is not charged an attempt
// however often it parks, and keeps what its run recorded.
func TestPark(t *testing.T) {
	q, clk := newQueue(t)
	mustSubmit(t, q, mkJob("a", func(j *job.Job) { j.Retry = job.Retry{Max: 0} })) // no retries at all
	until := t0.Add(5 * time.Hour)
	for i := 1; i <= 3; i++ {
		e := mustNext(t, q)
		if e.State.Attempts != 1 || e.State.Parked != "" {
			t.Fatalf("park %d: taken with attempts %d, parked %q; want attempt 1, not parked", i, e.State.Attempts, e.State.Parked)
		}
		err := q.Park("a", job.ReasonRateLimited, "claude usage limit", "claude usage limit: You've hit your limit", until,
			func(s *State) { s.Checkpoint = "c0ffee" })
		if err != nil {
			t.Fatal(err)
		}
		st := sidecarOnDisk(t, q, job.Inbox, "a")
		if st.Attempts != 0 || st.Parks != i || st.Parked != "claude usage limit" || !st.NotBefore.Equal(until) ||
			st.Reason != job.ReasonRateLimited || st.Checkpoint != "c0ffee" {
			t.Fatalf("park %d: %+v", i, st)
		}
		last := st.History[len(st.History)-1]
		if last.To != job.Inbox || last.Reason != job.ReasonRateLimited || !strings.Contains(last.Detail, "parked until "+until.Format(time.RFC3339)) {
			t.Errorf("park %d: history %+v", i, last)
		}
		// Not before its time.
		if _, err := q.Next(nil); !errors.Is(err, ErrNoJob) {
			t.Fatalf("park %d: a parked job was taken before its time: %v", i, err)
		}
		clk.Advance(5*time.Hour - time.Second)
		if _, err := q.Next(nil); !errors.Is(err, ErrNoJob) {
			t.Fatalf("park %d: taken a second early: %v", i, err)
		}
		clk.Advance(time.Second)
		until = until.Add(5 * time.Hour)
	}
	// After three parks, a real failure still has its one try: it dead-letters
	// only as a job with retry.max 0 would after its first failed run.
	mustNext(t, q)
	if to, err := q.Fail("a", job.ReasonEngineFailed, "the task failed", nil); err != nil || to != job.DeadLetter {
		t.Errorf("Fail after parks = %s, %v; want dead_letter after its one attempt", to, err)
	}
	if st := sidecarOnDisk(t, q, job.DeadLetter, "a"); st.Attempts != 1 || st.Parks != 3 {
		t.Errorf("after the failure: attempts %d, parks %d; want 1 and 3", st.Attempts, st.Parks)
	}
}

// TestParkRequeuedByHand: an operator's requeue of a parked job makes it
// runnable at once and clears what it waited for.
func TestParkRequeuedByHand(t *testing.T) {
	q, _ := newQueue(t)
	mustSubmit(t, q, mkJob("a"))
	mustNext(t, q)
	if err := q.Park("a", job.ReasonRateLimited, "codex usage limit", "codex usage limit", t0.Add(48*time.Hour), nil); err != nil {
		t.Fatal(err)
	}
	if err := q.Requeue("a"); err != nil {
		t.Fatal(err)
	}
	st := sidecarOnDisk(t, q, job.Inbox, "a")
	if !st.NotBefore.IsZero() || st.Parked != "" || st.Reason != "" || st.Parks != 1 {
		t.Errorf("after requeue: %+v", st)
	}
	if e := mustNext(t, q); e.State.Attempts != 1 {
		t.Errorf("the requeued job ran as attempt %d, want 1 (parking took none)", e.State.Attempts)
	}
}

// TestParkBadInput: Park is for parking reasons only, with a time, by the
// process running the job; Fail refuses a parking reason.
func TestParkBadInput(t *testing.T) {
	q, _ := newQueue(t)
	mustSubmit(t, q, mkJob("a"))
	if err := q.Park("a", job.ReasonRateLimited, "x", "x", t0.Add(time.Hour), nil); err == nil {
		t.Error("parked a job that is not building")
	}
	mustNext(t, q)
	if err := q.Park("a", job.ReasonEngineUnavailable, "x", "x", t0.Add(time.Hour), nil); err == nil {
		t.Error("parked with engine_unavailable")
	}
	if err := q.Park("a", job.ReasonRateLimited, "x", "x", time.Time{}, nil); err == nil {
		t.Error("parked with no time")
	}
	if _, err := q.Fail("a", job.ReasonRateLimited, "x", nil); err == nil || !strings.Contains(err.Error(), "use Park") {
		t.Errorf("Fail with rate_limited = %v, want a refusal naming Park", err)
	}
	other := reopen(t, q, &fakeClock{t: t0})
	other.host = "otherhost"
	if err := other.Park("a", job.ReasonRateLimited, "x", "x", t0.Add(time.Hour), nil); !errors.Is(err, ErrNotOwner) {
		t.Errorf("another process parked the job: %v", err)
	}
	if stageOf(t, q, "a") != job.Building {
		t.Error("a refused park moved the job")
	}
}
