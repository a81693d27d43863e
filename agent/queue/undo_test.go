package queue

import (
	"bytes"
	"errors"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/aqfleet/aq/internal/aqerr"
	"github.com/aqfleet/aq/job"
)

// TestReplace: a dead-lettered job whose manifest named the wrong repo gets
// the fixed manifest, byte for byte, and the fields that come from it; it
// is runnable again, keeps its history and attempts, and the replacement
// is in the history.
func TestReplace(t *testing.T) {
	q, clk := newQueue(t)
	typo := mkJob("a", withRetry(0), func(j *job.Job) { j.Repo = "webap" })
	mustSubmit(t, q, typo)
	if to := runAndFail(t, q, clk, "a", 1, job.ReasonRepoUnavailable); to != job.DeadLetter {
		t.Fatalf("the typo went to %s", to)
	}
	if err := q.Update("a", func(s *State) { s.Checkpoint = "abc123" }); err != nil {
		t.Fatal(err)
	}
	before, _ := q.Get("a")

	fixed := mkJob("a", withPriority(job.PriorityHigh), withEngine("codex"), func(j *job.Job) {
		j.Repo, j.Title, j.Source = "webapp", "fixed title", "jobs/a.md"
	})
	raw := append(rawFor(fixed), "the fixed one\n"...)
	clk.Advance(time.Minute)
	st, from, err := q.Replace(fixed, raw)
	if err != nil {
		t.Fatalf("Replace: %v", err)
	}
	if from != job.DeadLetter || st.Stage != job.Inbox || stageOf(t, q, "a") != job.Inbox {
		t.Fatalf("from %s to %s (on disk %s)", from, st.Stage, stageOf(t, q, "a"))
	}
	if st.Repo != "webapp" || st.Engine != "codex" || st.Priority != job.PriorityHigh || st.Title != "fixed title" {
		t.Errorf("fields from the new manifest: %+v", st)
	}
	if st.Reason != "" || st.Detail != "" || !st.NotBefore.IsZero() {
		t.Errorf("the failure is cleared: reason %q detail %q notBefore %v", st.Reason, st.Detail, st.NotBefore)
	}
	if st.Attempts != 1 || !st.CreatedAt.Equal(before.State.CreatedAt) || st.Checkpoint != "" {
		t.Errorf("attempts %d, created %v (was %v), checkpoint %q (another repo: dropped)", st.Attempts, st.CreatedAt, before.State.CreatedAt, st.Checkpoint)
	}
	if n := len(before.State.History); len(st.History) != n+1 || !slices.Equal(st.History[:n], before.State.History) {
		t.Fatalf("history not kept and extended by one:\n%+v\nwas\n%+v", st.History, before.State.History)
	}
	if last := st.History[len(st.History)-1]; last.From != job.DeadLetter || last.To != job.Inbox || last.Detail != "replaced by a new manifest (a.md)" {
		t.Errorf("the replacement's transition: %+v", last)
	}
	e, _ := q.Get("a")
	if b, _ := os.ReadFile(e.ManifestPath); !bytes.Equal(b, raw) {
		t.Errorf("manifest not stored byte for byte:\n%q\nwant\n%q", b, raw)
	}
	// Runnable now: Next takes it, as the new manifest's job.
	if e := mustNext(t, q); e.State.ID != "a" || e.State.Repo != "webapp" || e.State.Attempts != 2 {
		t.Errorf("Next after Replace: %+v", e.State)
	}
}

// TestReplaceStages: inbox, blocked, failed and dead_letter can be
// replaced (blocked again when the new deps have not shipped); building,
// review, testing and shipped cannot, and a refusal changes nothing.
func TestReplaceStages(t *testing.T) {
	tests := []struct {
		name  string
		setup func(t *testing.T, q *Queue, clk *fakeClock)
		with  []func(*job.Job) // the new manifest
		want  job.Stage        // "" refused
		isErr func(error) bool
	}{
		{"inbox", func(*testing.T, *Queue, *fakeClock) {}, nil, job.Inbox, nil},
		{"inbox to blocked", func(*testing.T, *Queue, *fakeClock) {}, []func(*job.Job){withDeps("all", "other")}, job.Blocked, nil},
		{"blocked to inbox", func(t *testing.T, q *Queue, _ *fakeClock) {
			moveTo(t, q, "a", job.Blocked)
		}, nil, job.Inbox, nil},
		{"failed", func(t *testing.T, q *Queue, clk *fakeClock) {
			runAndFail(t, q, clk, "a", 1, job.ReasonInvalidManifest)
		}, nil, job.Inbox, nil},
		{"building", func(t *testing.T, q *Queue, _ *fakeClock) { mustNext(t, q) }, nil, "",
			func(err error) bool {
				return errors.Is(err, ErrRunning) && strings.Contains(err.Error(), "it is running on testhost (pid 4242)")
			}},
		{"review", func(t *testing.T, q *Queue, _ *fakeClock) {
			mustNext(t, q)
			if err := q.Finish("a", job.Review, nil); err != nil {
				t.Fatal(err)
			}
		}, nil, "", func(err error) bool { var se *StageError; return errors.As(err, &se) && se.Stage == job.Review }},
		{"shipped", func(t *testing.T, q *Queue, _ *fakeClock) {
			mustNext(t, q)
			if err := q.Finish("a", job.Shipped, nil); err != nil {
				t.Fatal(err)
			}
		}, nil, "", func(err error) bool { var se *StageError; return errors.As(err, &se) && se.Stage == job.Shipped }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			q, clk := newQueue(t)
			old := mkJob("a", withRetry(0))
			mustSubmit(t, q, old)
			tt.setup(t, q, clk)
			before, _ := q.Get("a")
			oldRaw, _ := os.ReadFile(before.ManifestPath)
			nj := mkJob("a", append([]func(*job.Job){func(j *job.Job) { j.Title = "new" }}, tt.with...)...)
			st, _, err := q.Replace(nj, append(rawFor(nj), "new\n"...))
			if tt.want != "" {
				if err != nil || st.Stage != tt.want || stageOf(t, q, "a") != tt.want {
					t.Fatalf("Replace: %v, stage %s (on disk %s), want %s", err, st.Stage, stageOf(t, q, "a"), tt.want)
				}
				return
			}
			var ae *aqerr.Error
			if err == nil || !tt.isErr(err) || !errors.As(err, &ae) || ae.Code != aqerr.Usage || strings.ContainsAny(err.Error(), "\n") {
				t.Fatalf("Replace of a job in %s: %v", before.State.Stage, err)
			}
			after, _ := q.Get("a")
			raw, _ := os.ReadFile(after.ManifestPath)
			if after.State.Stage != before.State.Stage || after.State.Title != before.State.Title || !bytes.Equal(raw, oldRaw) || len(after.State.History) != len(before.State.History) {
				t.Errorf("a refused Replace changed the job: %+v", after.State)
			}
		})
	}
}

// TestReplaceRefusals: an unknown id, and an idempotencyKey another job
// holds (its own it may keep).
func TestReplaceRefusals(t *testing.T) {
	q, _ := newQueue(t)
	mustSubmit(t, q, mkJob("a", withKey("k-a")))
	mustSubmit(t, q, mkJob("b", withKey("k-b")))
	if _, _, err := q.Replace(mkJob("nope"), []byte("x")); !errors.Is(err, ErrNotFound) {
		t.Errorf("unknown id: %v", err)
	}
	var de *DuplicateError
	if _, _, err := q.Replace(mkJob("a", withKey("k-b")), []byte("x")); !errors.As(err, &de) || de.ExistingID != "b" {
		t.Errorf("another job's key: %v", err)
	}
	if _, _, err := q.Replace(mkJob("a", withKey("k-a")), []byte("x")); err != nil {
		t.Errorf("its own key: %v", err)
	}
	if _, _, err := q.Replace(mkJob("a", withDeps("all", "a")), []byte("x")); err == nil {
		t.Error("a job that depends on itself was accepted")
	}
}

// TestRemove: a job that is not running is removed, manifest and sidecar;
// the jobs that wait for it are named; a running job and an unknown id are
// refused, and a removed id can be submitted again.
func TestRemove(t *testing.T) {
	q, clk := newQueue(t)
	mustSubmit(t, q, mkJob("a", withRetry(0)))
	mustSubmit(t, q, mkJob("child", withDeps("all", "a")))
	mustSubmit(t, q, mkJob("run"))
	runAndFail(t, q, clk, "a", 1, job.ReasonEngineFailed)
	if _, err := q.Next(func(s State) bool { return s.ID == "run" }); err != nil {
		t.Fatal(err)
	}

	st, deps, err := q.Remove("a")
	if err != nil || st.Stage != job.DeadLetter || !slices.Equal(deps, []string{"child"}) {
		t.Fatalf("Remove: %v, was in %s, dependents %v", err, st.Stage, deps)
	}
	for _, s := range job.Stages {
		for _, f := range []string{q.md(s, "a"), q.sidecar(s, "a")} {
			if _, err := os.Lstat(f); err == nil {
				t.Errorf("%s is still there", q.rel(f))
			}
		}
	}
	if _, err := q.Get("a"); !errors.Is(err, ErrNotFound) {
		t.Errorf("Get after Remove: %v", err)
	}
	if _, _, err := q.Remove("a"); !errors.Is(err, ErrNotFound) {
		t.Errorf("Remove twice: %v", err)
	}
	if _, _, err := q.Remove("run"); !errors.Is(err, ErrRunning) || stageOf(t, q, "run") != job.Building {
		t.Errorf("Remove of a running job: %v (now in %s)", err, stageOf(t, q, "run"))
	}
	if _, _, err := q.Remove("../x"); err == nil {
		t.Error("an invalid id was accepted")
	}
	if st := mustSubmit(t, q, mkJob("a")); st.Stage != job.Inbox || st.Attempts != 0 || len(st.History) != 1 {
		t.Errorf("submitted again after Remove: %+v", st)
	}
}
