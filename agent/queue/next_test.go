package queue

import (
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/aqfleet/aq/internal/aqerr"
	"github.com/aqfleet/aq/job"
)

func TestNextOrder(t *testing.T) {
	type sub struct {
		id   string
		prio int
		age  time.Duration // submitted this long after t0
	}
	tests := []struct {
		name string
		jobs []sub
		want []string
	}{
		{"named priorities", []sub{{"low", job.PriorityLow, 0}, {"normal", job.PriorityNormal, 1}, {"critical", job.PriorityCritical, 2}, {"high", job.PriorityHigh, 3}},
			[]string{"critical", "high", "normal", "low"}},
		{"same priority: oldest first", []sub{{"c", 200, 3 * time.Second}, {"a", 200, 1 * time.Second}, {"b", 200, 2 * time.Second}},
			[]string{"a", "b", "c"}},
		{"integers between names", []sub{{"n", job.PriorityNormal, 0}, {"x250", 250, 1}, {"x999", 999, 2}, {"x0", 0, 3}},
			[]string{"x999", "x250", "n", "x0"}},
		{"priority beats age", []sub{{"old-low", job.PriorityLow, 0}, {"new-high", job.PriorityHigh, time.Hour}},
			[]string{"new-high", "old-low"}},
		{"same priority and age: id", []sub{{"b", 200, 0}, {"c", 200, 0}, {"a", 200, 0}},
			[]string{"a", "b", "c"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			q, clk := newQueue(t)
			var at time.Duration
			for _, s := range tt.jobs {
				clk.Advance(s.age - at)
				at = s.age
				mustSubmit(t, q, mkJob(s.id, withPriority(s.prio)))
			}
			var got []string
			for range tt.jobs {
				got = append(got, mustNext(t, q).State.ID)
			}
			if !slices.Equal(got, tt.want) {
				t.Errorf("order = %v, want %v", got, tt.want)
			}
			if _, err := q.Next(nil); !errors.Is(err, ErrNoJob) {
				t.Errorf("Next on an empty inbox = %v, want ErrNoJob", err)
			}
		})
	}
}

func TestNextMarksTheRun(t *testing.T) {
	q, clk := newQueue(t)
	mustSubmit(t, q, mkJob("a"))
	clk.Advance(time.Minute)
	e := mustNext(t, q)
	st := e.State
	if st.Stage != job.Building || st.Attempts != 1 || !st.StartedAt.Equal(clk.Now()) || st.Host != "testhost" || st.PID != 4242 {
		t.Errorf("state after Next = %+v", st)
	}
	if stageOf(t, q, "a") != job.Building || !strings.HasSuffix(e.ManifestPath, "/building/a.md") {
		t.Errorf("manifest path %s", e.ManifestPath)
	}
	disk := sidecarOnDisk(t, q, job.Building, "a")
	if disk.Attempts != 1 || len(disk.History) != 2 || disk.History[1].From != job.Inbox || disk.History[1].To != job.Building {
		t.Errorf("sidecar on disk = %+v", disk)
	}
	if f := files(t, q); !slices.Equal(f, []string{"building/a.json", "building/a.md"}) {
		t.Errorf("files = %v (the inbox sidecar must be gone)", f)
	}
}

func TestNextEmptyIsNoJob(t *testing.T) {
	q, _ := newQueue(t)
	_, err := q.Next(nil)
	if !errors.Is(err, ErrNoJob) {
		t.Fatalf("err = %v", err)
	}
	if aqerr.ExitCode(err) != aqerr.NoJob {
		t.Errorf("exit code = %v, want %v", aqerr.ExitCode(err), aqerr.NoJob)
	}
}

func TestNextAccept(t *testing.T) {
	q, _ := newQueue(t)
	mustSubmit(t, q, mkJob("needs-devin", withEngine("devin"), withPriority(job.PriorityCritical)))
	mustSubmit(t, q, mkJob("claude-job", withEngine("claude")))
	var seen []string
	e, err := q.Next(func(s State) bool {
		seen = append(seen, s.ID)
		return s.Engine == "claude"
	})
	if err != nil || e.State.ID != "claude-job" {
		t.Fatalf("Next = %+v, %v", e, err)
	}
	if !slices.Equal(seen, []string{"needs-devin", "claude-job"}) {
		t.Errorf("accept saw %v, want best first", seen)
	}
	if stageOf(t, q, "needs-devin") != job.Inbox {
		t.Error("a refused job must stay in the inbox")
	}
	if _, err := q.Next(func(State) bool { return false }); !errors.Is(err, ErrNoJob) {
		t.Errorf("nothing accepted: err = %v", err)
	}
}

func TestNextRespectsNotBefore(t *testing.T) {
	q, clk := newQueue(t)
	mustSubmit(t, q, mkJob("a", withBackoff(time.Minute)))
	mustNext(t, q)
	to, err := q.Fail("a", job.ReasonEngineFailed, "exit 1", nil)
	if err != nil || to != job.Inbox {
		t.Fatalf("Fail = %s, %v", to, err)
	}
	st, _ := q.Get("a")
	if want := t0.Add(time.Minute); !st.State.NotBefore.Equal(want) {
		t.Fatalf("NotBefore = %v, want %v", st.State.NotBefore, want)
	}
	mustSubmit(t, q, mkJob("b", withPriority(job.PriorityLow)))
	// "a" is better but must wait: "b" goes first.
	if e := mustNext(t, q); e.State.ID != "b" {
		t.Fatalf("took %s during a's backoff", e.State.ID)
	}
	clk.Advance(59 * time.Second)
	if _, err := q.Next(nil); !errors.Is(err, ErrNoJob) {
		t.Fatalf("1s before NotBefore: %v", err)
	}
	clk.Advance(time.Second)
	e := mustNext(t, q)
	if e.State.ID != "a" || e.State.Attempts != 2 || !e.State.NotBefore.IsZero() {
		t.Errorf("at NotBefore: %+v", e.State)
	}
}

func TestDepsPromotion(t *testing.T) {
	tests := []struct {
		name          string
		mode          string
		ship          []string // shipped one by one
		runnableAfter int      // how many of ship must ship before the job runs
	}{
		{"all waits for every dep", "all", []string{"d1", "d2"}, 2},
		{"any runs after the first", "any", []string{"d2", "d1"}, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			q, _ := newQueue(t)
			mustSubmit(t, q, mkJob("d1"))
			mustSubmit(t, q, mkJob("d2"))
			mustSubmit(t, q, mkJob("child", withDeps(tt.mode, "d1", "d2"), withPriority(job.PriorityCritical)))
			if stageOf(t, q, "child") != job.Blocked {
				t.Fatal("child should start blocked")
			}
			for i, dep := range tt.ship {
				moveTo(t, q, dep, job.Shipped)
				wantRunnable := i+1 >= tt.runnableAfter
				_, err := q.Next(func(s State) bool { return s.ID == "child" })
				if wantRunnable != (err == nil) {
					t.Fatalf("after shipping %v: Next(child) err = %v, want runnable=%v", tt.ship[:i+1], err, wantRunnable)
				}
				if !wantRunnable && stageOf(t, q, "child") != job.Blocked {
					t.Fatalf("child left blocked too early")
				}
				if wantRunnable {
					st := sidecarOnDisk(t, q, job.Building, "child")
					var sawPromotion bool
					for _, tr := range st.History {
						sawPromotion = sawPromotion || (tr.From == job.Blocked && tr.To == job.Inbox)
					}
					if !sawPromotion {
						t.Errorf("history lacks the promotion: %+v", st.History)
					}
					return
				}
			}
		})
	}
}

func TestFinishShippedPromotesAtOnce(t *testing.T) {
	q, _ := newQueue(t)
	mustSubmit(t, q, mkJob("dep"))
	mustSubmit(t, q, mkJob("child", withDeps("all", "dep")))
	moveTo(t, q, "dep", job.Shipped)
	if got := stageOf(t, q, "child"); got != job.Inbox {
		t.Errorf("child is in %s right after its dep shipped, want inbox", got)
	}
}

func TestWaiting(t *testing.T) {
	q, _ := newQueue(t)
	mustSubmit(t, q, mkJob("dead"))
	moveTo(t, q, "dead", job.DeadLetter)
	mustSubmit(t, q, mkJob("running"))
	moveTo(t, q, "running", job.Building)
	mustSubmit(t, q, mkJob("done"))
	moveTo(t, q, "done", job.Shipped)
	mustSubmit(t, q, mkJob("child", withDeps("all", "dead", "running", "done", "ghost")))
	mustSubmit(t, q, mkJob("anychild", withDeps("any", "dead", "ghost")))
	mustSubmit(t, q, mkJob("hopeful", withDeps("all", "running")))

	// Next never promotes them: a dead-lettered or missing dep keeps them blocked.
	for i := 0; i < 2; i++ {
		if _, err := q.Next(nil); !errors.Is(err, ErrNoJob) {
			t.Fatalf("Next = %v", err)
		}
	}
	for _, id := range []string{"child", "anychild", "hopeful"} {
		if stageOf(t, q, id) != job.Blocked {
			t.Errorf("%s left blocked", id)
		}
	}

	w, err := q.Waiting("child")
	if err != nil {
		t.Fatal(err)
	}
	if w.Ready || !w.Stuck || w.Stage != job.Blocked || w.DepsMode != "all" {
		t.Errorf("Waiting(child) = %+v", w)
	}
	byID := map[string]DepState{}
	for _, d := range w.Deps {
		byID[d.ID] = d
	}
	checks := []struct {
		id      string
		stage   job.Stage
		problem string
	}{
		{"dead", job.DeadLetter, "dead-lettered"},
		{"running", job.Building, ""},
		{"done", job.Shipped, ""},
		{"ghost", "", "no such job"},
	}
	for _, c := range checks {
		d := byID[c.id]
		if d.Stage != c.stage || (c.problem == "") != (d.Problem == "") || !strings.Contains(d.Problem, c.problem) {
			t.Errorf("dep %s = %+v, want stage %q problem ~%q", c.id, d, c.stage, c.problem)
		}
	}
	if !containsAll(w.Why, "dead (dead_letter", "ghost", "aq job requeue dead") {
		t.Errorf("Why = %q", w.Why)
	}

	if w, _ := q.Waiting("anychild"); !w.Stuck || w.Ready {
		t.Errorf("anychild with only dead/missing deps: %+v", w)
	}
	if w, _ := q.Waiting("hopeful"); w.Stuck || w.Ready || !strings.Contains(w.Why, "running (building)") {
		t.Errorf("hopeful: %+v", w)
	}
	if w, _ := q.Waiting("done"); !w.Ready {
		t.Errorf("a job without deps is ready: %+v", w)
	}
}
