package queue

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aqfleet/aq/job"
)

// t0 is the injected clock's start. Tests move the clock by hand; none reads
// the wall clock.
var t0 = time.Date(2026, 3, 1, 9, 0, 0, 0, time.UTC)

// fakeClock is an injectable, goroutine-safe clock.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

// newQueue opens a queue in a fresh temp dir with a fake clock and a fixed
// owner, so tests never depend on the wall clock or the host name.
func newQueue(t testing.TB, opts ...Option) (*Queue, *fakeClock) {
	t.Helper()
	clk := &fakeClock{t: t0}
	dir := filepath.Join(t.TempDir(), "queue")
	all := append([]Option{WithClock(clk.Now), WithOwner("testhost", 4242)}, opts...)
	q, err := Open(dir, all...)
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	return q, clk
}

// reopen opens a second Queue on q's directory (another "process" view).
func reopen(t testing.TB, q *Queue, clk *fakeClock, opts ...Option) *Queue {
	t.Helper()
	all := append([]Option{WithClock(clk.Now), WithOwner("testhost", 4242)}, opts...)
	q2, err := Open(q.Dir(), all...)
	if err != nil {
		t.Fatalf("reopen: %v", err)
	}
	return q2
}

// mkJob is a valid normalised job; mods adjust it.
func mkJob(id string, mods ...func(*job.Job)) *job.Job {
	j := &job.Job{
		ID: id, Title: "job " + id, Repo: "repo1", Base: "main", Engine: "claude",
		Capabilities: []string{"os:linux", "has:git"}, Priority: job.PriorityNormal, PriorityName: "normal",
		DepsMode: "all", Retry: job.Retry{Max: 2, Backoff: job.Duration(time.Minute)}, Ship: "branch",
		Body: "do " + id,
	}
	for _, m := range mods {
		m(j)
	}
	return j
}

func withPriority(p int) func(*job.Job) { return func(j *job.Job) { j.Priority = p } }
func withDeps(mode string, deps ...string) func(*job.Job) {
	return func(j *job.Job) { j.DepsMode, j.Deps = mode, deps }
}
func withKey(k string) func(*job.Job)    { return func(j *job.Job) { j.IdempotencyKey = k } }
func withRetry(max int) func(*job.Job)   { return func(j *job.Job) { j.Retry.Max = max } }
func withEngine(e string) func(*job.Job) { return func(j *job.Job) { j.Engine = e } }
func withBackoff(d time.Duration) func(*job.Job) {
	return func(j *job.Job) { j.Retry.Backoff = job.Duration(d) }
}

// rawFor is a manifest as a user would write it, with a BOM and CRLF line
// endings, so byte-for-byte storage is actually tested.
func rawFor(j *job.Job) []byte {
	return []byte("\ufeff---\r\nid: " + j.ID + "\r\ntitle: " + j.Title + "\r\nrepo: " + j.Repo + "\r\n---\r\n# " + j.Title + "\r\n" + j.Body + "\r\n")
}

func mustSubmit(t testing.TB, q *Queue, j *job.Job) State {
	t.Helper()
	st, err := q.Submit(j, rawFor(j))
	if err != nil {
		t.Fatalf("Submit(%s): %v", j.ID, err)
	}
	return st
}

// mustNext takes the next job or fails the test.
func mustNext(t testing.TB, q *Queue) *Entry {
	t.Helper()
	e, err := q.Next(nil)
	if err != nil {
		t.Fatalf("Next: %v", err)
	}
	return e
}

// stageOf reports where the job's .md is, by looking at the disk directly.
func stageOf(t testing.TB, q *Queue, id string) job.Stage {
	t.Helper()
	var found []job.Stage
	for _, s := range job.Stages {
		if _, err := os.Lstat(filepath.Join(q.Dir(), string(s), id+".md")); err == nil {
			found = append(found, s)
		}
	}
	if len(found) != 1 {
		t.Fatalf("job %s: manifest found in %v, want exactly one stage", id, found)
	}
	return found[0]
}

// sidecarOnDisk reads <stage>/<id>.json straight from disk.
func sidecarOnDisk(t testing.TB, q *Queue, stage job.Stage, id string) State {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(q.Dir(), string(stage), id+".json"))
	if err != nil {
		t.Fatalf("read sidecar: %v", err)
	}
	var st State
	if err := json.Unmarshal(b, &st); err != nil {
		t.Fatalf("sidecar %s/%s.json: %v", stage, id, err)
	}
	return st
}

// files lists every file under the queue dir (relative paths), excluding the
// lock file, so tests can assert exactly what is on disk.
func files(t testing.TB, q *Queue) []string {
	t.Helper()
	var out []string
	err := filepath.WalkDir(q.Dir(), func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			return nil
		}
		rel, _ := filepath.Rel(q.Dir(), p)
		if rel != ".lock" {
			out = append(out, filepath.ToSlash(rel))
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	sort.Strings(out)
	return out
}

// moveTo puts a job into a stage through the public API (Next, Finish, Fail,
// Move), the way real jobs get there.
func moveTo(t testing.TB, q *Queue, id string, to job.Stage) {
	t.Helper()
	if to == job.Inbox || to == job.Blocked {
		if stageOf(t, q, id) != to {
			if err := q.Move(id, to, nil); err != nil {
				t.Fatal(err)
			}
		}
		return
	}
	if stageOf(t, q, id) != job.Building {
		e, err := q.Next(func(s State) bool { return s.ID == id })
		if err != nil {
			t.Fatalf("Next(%s): %v", id, err)
		}
		if e.State.ID != id {
			t.Fatalf("Next took %s, want %s", e.State.ID, id)
		}
	}
	var err error
	switch to {
	case job.Building:
	case job.Review, job.Testing, job.Shipped:
		err = q.Finish(id, to, nil)
	case job.Failed, job.DeadLetter:
		err = q.Move(id, to, func(s *State) { s.Reason = job.ReasonEngineFailed })
	default:
		err = fmt.Errorf("moveTo %s: unsupported", to)
	}
	if err != nil {
		t.Fatalf("moveTo(%s, %s): %v", id, to, err)
	}
}

func errAs[T error](err error) (T, bool) {
	var target T
	ok := errors.As(err, &target)
	return target, ok
}

func containsAll(s string, subs ...string) bool {
	for _, sub := range subs {
		if !strings.Contains(s, sub) {
			return false
		}
	}
	return true
}
