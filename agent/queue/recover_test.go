package queue

import (
	"errors"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/aqfleet/aq/job"
)

func TestRecover(t *testing.T) {
	q, clk := newQueue(t)
	for _, id := range []string{"alive", "orphan", "nockpt", "ckptfails", "exhausted", "abandoned"} {
		mustSubmit(t, q, mkJob(id, withRetry(1)))
	}
	mustSubmit(t, q, mkJob("waiting")) // stays in the inbox: Recover must not touch it
	for range 6 {
		e, err := q.Next(func(s State) bool { return s.ID != "waiting" })
		if err != nil {
			t.Fatal(err)
		}
		_ = e
	}
	// "exhausted" has used every try, counting the infrastructure extras.
	if err := q.Update("exhausted", func(s *State) { s.Attempts = 1 + 1 + job.InfraRetries }); err != nil {
		t.Fatal(err)
	}
	before := map[string]int{}
	for _, id := range []string{"orphan", "nockpt", "ckptfails", "exhausted", "abandoned"} {
		e, _ := q.Get(id)
		before[id] = e.State.Attempts
	}

	clk.Advance(time.Hour)
	var checkpointed []string
	ids, err := q.Recover(
		func(s State) bool { return s.ID == "alive" },
		func(s State) (Orphan, error) {
			checkpointed = append(checkpointed, s.ID)
			switch s.ID {
			case "ckptfails":
				return Orphan{}, errors.New("git commit: disk full")
			case "nockpt":
				return Orphan{}, nil // nothing to commit
			case "abandoned":
				return Orphan{Checkpoint: "sha-abandoned", Abandoned: "aq run was stopped by SIGTERM and abandoned its step"}, nil
			}
			return Orphan{Checkpoint: "sha-" + s.ID}, nil
		})
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"abandoned", "ckptfails", "exhausted", "nockpt", "orphan"}; !slices.Equal(ids, want) {
		t.Errorf("recovered %v, want %v", ids, want)
	}
	slices.Sort(checkpointed)
	if want := []string{"abandoned", "ckptfails", "exhausted", "nockpt", "orphan"}; !slices.Equal(checkpointed, want) {
		t.Errorf("checkpointed %v, want %v (in-flight jobs are never checkpointed)", checkpointed, want)
	}
	if stageOf(t, q, "alive") != job.Building {
		t.Error("an in-flight job was moved")
	}
	if stageOf(t, q, "waiting") != job.Inbox {
		t.Error("an inbox job was moved")
	}

	orphan := sidecarOnDisk(t, q, job.Inbox, "orphan")
	if orphan.Checkpoint != "sha-orphan" || orphan.Reason != job.ReasonCrash || orphan.Attempts != before["orphan"] ||
		orphan.Attempts != 1 || !orphan.NotBefore.IsZero() || !orphan.EndedAt.Equal(clk.Now()) {
		t.Errorf("orphan = %+v", orphan)
	}
	if last := orphan.History[len(orphan.History)-1]; last.From != job.Building || last.To != job.Inbox || last.Reason != job.ReasonCrash {
		t.Errorf("orphan transition = %+v", last)
	}
	if st := sidecarOnDisk(t, q, job.Inbox, "nockpt"); st.Checkpoint != "" || st.Reason != job.ReasonCrash {
		t.Errorf("nockpt = %+v", st)
	}
	ck := sidecarOnDisk(t, q, job.Inbox, "ckptfails")
	if !strings.Contains(ck.Detail, "disk full") || ck.Reason != job.ReasonCrash {
		t.Errorf("a checkpoint failure must be recorded and must not stop recovery: %+v", ck)
	}
	if st := sidecarOnDisk(t, q, job.DeadLetter, "exhausted"); st.Checkpoint != "sha-exhausted" || st.Reason != job.ReasonCrash {
		t.Errorf("exhausted = %+v", st)
	}
	// A job its aq abandoned after a stop signal (internal/abandon) fails
	// interrupted, saying what was abandoned, not crash.
	if st := sidecarOnDisk(t, q, job.Inbox, "abandoned"); st.Reason != job.ReasonInterrupted || st.Checkpoint != "sha-abandoned" ||
		!strings.Contains(st.Detail, "recovered: aq run was stopped by SIGTERM and abandoned its step; checkpoint sha-abandoned") {
		t.Errorf("abandoned = %+v", st)
	}

	// The recovered job runs again: attempts+1 compared to before the crash.
	e, err := q.Next(func(s State) bool { return s.ID == "orphan" })
	if err != nil || e.State.Attempts != 2 || e.State.Checkpoint != "sha-orphan" {
		t.Fatalf("rerun = %+v, %v", e, err)
	}
	// ... told how the crashed run ended.
	if p := e.State.Previous; p == nil || p.Attempt != 1 || p.Reason != job.ReasonCrash || !strings.Contains(p.Detail, "is gone; checkpoint sha-orphan") {
		t.Errorf("the rerun's previous attempt = %+v", p)
	}
	if p := sidecarOnDisk(t, q, job.Building, "orphan").Previous; p == nil || p.Reason != job.ReasonCrash {
		t.Errorf("the building sidecar's previous = %+v", p)
	}
	// A second Recover with nothing orphaned does nothing.
	ids, err = q.Recover(func(State) bool { return true }, nil)
	if err != nil || len(ids) != 0 {
		t.Errorf("second Recover = %v, %v", ids, err)
	}
	if _, err := q.Recover(nil, nil); err == nil {
		t.Error("Recover without an in-flight check must refuse")
	}
}

// The sidecar cache must never hide another process's write. Here the other
// writer keeps the file's inode, size and mtime (the worst case: inode reuse
// within one timestamp tick), so only the lock-file token can tell.
func TestCacheNeverHidesAnotherWriter(t *testing.T) {
	q, clk := newQueue(t)
	mustSubmit(t, q, mkJob("a"))
	if _, err := q.Next(func(State) bool { return false }); !errors.Is(err, ErrNoJob) {
		t.Fatal(err) // q has now read (and cached) inbox/a.json
	}
	path := q.Dir() + "/inbox/a.json"
	info, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	old, _ := os.ReadFile(path)
	changed := strings.Replace(string(old), `"priority": 200`, `"priority": 201`, 1)
	if changed == string(old) {
		t.Fatal("fixture: priority not found")
	}

	// Another process takes the lock (and, say, rewrote the file).
	other := reopen(t, q, clk)
	if _, err := other.Next(func(State) bool { return false }); !errors.Is(err, ErrNoJob) {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(changed), 0o644); err != nil { // same inode, same size
		t.Fatal(err)
	}
	if err := os.Chtimes(path, info.ModTime(), info.ModTime()); err != nil {
		t.Fatal(err)
	}
	var seen int
	if err := q.Update("a", func(s *State) { seen = s.Priority }); err != nil {
		t.Fatal(err)
	}
	if seen != 201 {
		t.Errorf("q saw priority %d from its cache, want 201 written by the other process", seen)
	}
}
