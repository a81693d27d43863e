package queue

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/aqfleet/aq/job"
)

// testParser stands in for manifest.ParseFile: it reads "id:" and "deps:"
// lines, and refuses a file that says BROKEN.
func testParser(path string) (*job.Job, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	if bytes.Contains(b, []byte("BROKEN")) {
		return nil, fmt.Errorf("%s:3: unknown key %q", path, "retyr")
	}
	id := strings.TrimSuffix(filepath.Base(path), ".md")
	if m := regexp.MustCompile(`(?m)^id: (\S+)`).FindSubmatch(b); m != nil {
		id = string(m[1])
	}
	j := mkJob(id)
	j.Title = "parsed " + id
	if m := regexp.MustCompile(`(?m)^deps: (\S+)`).FindSubmatch(b); m != nil {
		j.Deps = strings.Split(string(m[1]), ",")
	}
	return j, nil
}

func writeFile(t *testing.T, q *Queue, rel string, data string) {
	t.Helper()
	if err := os.WriteFile(filepath.Join(q.Dir(), rel), []byte(data), 0o644); err != nil {
		t.Fatal(err)
	}
}

func readFile(t *testing.T, q *Queue, rel string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(q.Dir(), rel))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestCorruptSidecar(t *testing.T) {
	contents := []struct {
		name string
		data string
	}{
		{"garbage", "{{{ not json"},
		{"empty", ""},
		{"truncated", `{"id":"a","stage":"inbox","attem`},
		{"wrong id", `{"id":"someone-else","stage":"inbox","priority":200,"history":[]}`},
	}
	stages := []struct {
		stage   job.Stage
		trigger func(q *Queue) error // a locked operation that meets the corruption
	}{
		{job.Inbox, func(q *Queue) error {
			e, err := q.Next(nil) // must still hand out the healthy job
			if err == nil && e.State.ID != "healthy" {
				err = fmt.Errorf("Next took %s", e.State.ID)
			}
			return err
		}},
		{job.Building, func(q *Queue) error { _, err := q.Recover(func(State) bool { return true }, nil); return err }},
		{job.Shipped, func(q *Queue) error { _, err := q.Submit(mkJob("new", withKey("k")), []byte("x")); return err }},
	}
	for _, c := range contents {
		for _, s := range stages {
			t.Run(c.name+"/"+string(s.stage), func(t *testing.T) {
				q, _ := newQueue(t, WithParser(testParser))
				mustSubmit(t, q, mkJob("a"))
				moveTo(t, q, "a", s.stage)
				mustSubmit(t, q, mkJob("healthy"))
				raw := readFile(t, q, string(s.stage)+"/a.md")
				writeFile(t, q, string(s.stage)+"/a.json", c.data)

				// Reads keep working and show the problem.
				list, err := q.List()
				if err != nil || len(list) != 2 {
					t.Fatalf("List = %d entries, %v", len(list), err)
				}
				e, err := q.Get("a")
				if err != nil || e.State.Stage != s.stage || e.State.Reason != job.ReasonInvalidManifest {
					t.Fatalf("Get = %+v, %v", e, err)
				}

				if err := s.trigger(q); err != nil {
					t.Fatalf("locked operation: %v", err)
				}
				if got := readFile(t, q, "failed/a.md"); !bytes.Equal(got, raw) {
					t.Errorf("manifest changed: %q", got)
				}
				if got := readFile(t, q, "failed/a.json.corrupt"); string(got) != c.data {
					t.Errorf("corrupt sidecar not kept as is: %q", got)
				}
				st := sidecarOnDisk(t, q, job.Failed, "a")
				if st.ID != "a" || st.Stage != job.Failed || st.Reason != job.ReasonInvalidManifest ||
					!containsAll(st.Detail, "a.json", "a.json.corrupt", "aq job requeue a") {
					t.Errorf("fresh sidecar = %+v", st)
				}
				for _, f := range files(t, q) {
					if strings.HasPrefix(f, string(s.stage)+"/a.") {
						t.Errorf("left in %s: %s", s.stage, f)
					}
				}
				// The job can be run again; the parser restored its fields.
				if err := q.Requeue("a"); err != nil {
					t.Fatal(err)
				}
				if e, _ := q.Get("a"); e.State.Title != "parsed a" || e.State.Stage != job.Inbox {
					t.Errorf("after requeue: %+v", e.State)
				}
			})
		}
	}
}

// A second corruption of the same job never overwrites the first .corrupt file.
func TestCorruptTwiceKeepsBoth(t *testing.T) {
	q, _ := newQueue(t)
	mustSubmit(t, q, mkJob("a"))
	for i, junk := range []string{"junk-1", "junk-2"} {
		if i > 0 {
			if err := q.Requeue("a"); err != nil {
				t.Fatal(err)
			}
		}
		writeFile(t, q, "inbox/a.json", junk)
		if _, err := q.Next(nil); !errors.Is(err, ErrNoJob) {
			t.Fatalf("Next = %v", err)
		}
	}
	var corrupt []string
	for _, f := range files(t, q) {
		if strings.Contains(f, ".corrupt") {
			corrupt = append(corrupt, string(readFile(t, q, f)))
		}
	}
	slices.Sort(corrupt)
	if !slices.Equal(corrupt, []string{"junk-1", "junk-2"}) {
		t.Errorf("corrupt files hold %v", corrupt)
	}
}

// Crashes between the steps of a move, and files put in by hand, are
// reconciled: the .md's stage is the truth and nothing is deleted but
// sidecars that are provably superseded.
func TestReconcile(t *testing.T) {
	recoverAll := func(q *Queue) error { _, err := q.Recover(func(State) bool { return true }, nil); return err }
	tests := []struct {
		name    string
		parser  bool
		setup   func(t *testing.T, q *Queue)
		id      string
		before  func(t *testing.T, e *Entry) // what lock-free reads show before repair
		trigger func(q *Queue) error
		stage   job.Stage // where the job is after the repair
		after   func(t *testing.T, q *Queue)
	}{
		{
			name: "rename done, sidecar still in the old stage",
			setup: func(t *testing.T, q *Queue) {
				mustSubmit(t, q, mkJob("a"))
				mustNext(t, q)
				// A Fail crashed right after renaming building/a.md to inbox/.
				if err := os.Rename(filepath.Join(q.Dir(), "building/a.md"), filepath.Join(q.Dir(), "inbox/a.md")); err != nil {
					t.Fatal(err)
				}
			},
			id: "a",
			before: func(t *testing.T, e *Entry) {
				if e.State.Stage != job.Inbox || e.State.Attempts != 1 {
					t.Errorf("read = %+v", e.State)
				}
			},
			trigger: recoverAll,
			stage:   job.Inbox,
			after: func(t *testing.T, q *Queue) {
				if f := files(t, q); !slices.Equal(f, []string{"inbox/a.json", "inbox/a.md"}) {
					t.Errorf("files = %v", f)
				}
				st := sidecarOnDisk(t, q, job.Inbox, "a")
				last := st.History[len(st.History)-1]
				if st.Attempts != 1 || last.From != job.Building || last.To != job.Inbox || !strings.Contains(last.Detail, "interrupted") {
					t.Errorf("adopted sidecar = %+v", st)
				}
			},
		},
		{
			name: "new sidecar written, old one not yet removed",
			setup: func(t *testing.T, q *Queue) {
				mustSubmit(t, q, mkJob("a"))
				old := readFile(t, q, "inbox/a.json")
				mustNext(t, q)
				writeFile(t, q, "inbox/a.json", string(old))
			},
			id: "a",
			before: func(t *testing.T, e *Entry) {
				if e.State.Stage != job.Building || e.State.Attempts != 1 {
					t.Errorf("read = %+v", e.State)
				}
			},
			trigger: recoverAll, // every job counts as in flight: only repairs happen
			stage:   job.Building,
			after: func(t *testing.T, q *Queue) {
				if f := files(t, q); !slices.Equal(f, []string{"building/a.json", "building/a.md"}) {
					t.Errorf("files = %v", f)
				}
			},
		},
		{
			name:   "manifest dropped into the inbox by hand",
			parser: true,
			setup: func(t *testing.T, q *Queue) {
				writeFile(t, q, "inbox/hand.md", "---\nid: hand\n---\nbody\n")
			},
			id: "hand",
			before: func(t *testing.T, e *Entry) {
				if e.State.Title != "parsed hand" || e.State.Stage != job.Inbox {
					t.Errorf("read = %+v", e.State)
				}
			},
			trigger: func(q *Queue) error { _, err := q.Next(nil); return err },
			stage:   job.Building,
			after: func(t *testing.T, q *Queue) {
				st := sidecarOnDisk(t, q, job.Building, "hand")
				if st.Title != "parsed hand" || st.Attempts != 1 || st.Engine != "claude" {
					t.Errorf("synthesised = %+v", st)
				}
			},
		},
		{
			name:   "hand-dropped manifest whose deps have not shipped",
			parser: true,
			setup: func(t *testing.T, q *Queue) {
				mustSubmit(t, q, mkJob("base"))
				moveTo(t, q, "base", job.Building)
				writeFile(t, q, "inbox/hand.md", "---\nid: hand\ndeps: base\n---\n")
			},
			id:      "hand",
			trigger: func(q *Queue) error { _, err := q.Next(nil); return ignoreNoJob(err) },
			stage:   job.Blocked,
		},
		{
			name: "manifest without sidecar and no parser",
			setup: func(t *testing.T, q *Queue) {
				writeFile(t, q, "inbox/bare.md", "anything")
			},
			id: "bare",
			before: func(t *testing.T, e *Entry) {
				if e.State.Title != "bare" || e.State.Engine != "any" {
					t.Errorf("read = %+v", e.State)
				}
			},
			trigger: recoverAll,
			stage:   job.Inbox,
			after: func(t *testing.T, q *Queue) {
				st := sidecarOnDisk(t, q, job.Inbox, "bare")
				if st.Priority != job.PriorityNormal || st.DepsMode != "all" || len(st.History) != 1 {
					t.Errorf("minimal sidecar = %+v", st)
				}
			},
		},
		{
			name:   "manifest the parser refuses",
			parser: true,
			setup: func(t *testing.T, q *Queue) {
				writeFile(t, q, "inbox/bad.md", "---\nBROKEN\n---\n")
			},
			id: "bad",
			before: func(t *testing.T, e *Entry) {
				if e.State.Reason != job.ReasonInvalidManifest || !strings.Contains(e.State.Detail, "retyr") {
					t.Errorf("read = %+v", e.State)
				}
			},
			trigger: func(q *Queue) error { _, err := q.Next(nil); return ignoreNoJob(err) },
			stage:   job.Failed,
			after: func(t *testing.T, q *Queue) {
				if got := readFile(t, q, "failed/bad.md"); string(got) != "---\nBROKEN\n---\n" {
					t.Errorf("manifest changed: %q", got)
				}
				st := sidecarOnDisk(t, q, job.Failed, "bad")
				if st.Reason != job.ReasonInvalidManifest || !strings.Contains(st.Detail, "retyr") {
					t.Errorf("sidecar = %+v", st)
				}
			},
		},
		{
			name:   "manifest id differs from its file name",
			parser: true,
			setup: func(t *testing.T, q *Queue) {
				writeFile(t, q, "inbox/file-name.md", "---\nid: other-id\n---\n")
			},
			id:      "file-name",
			trigger: recoverAll,
			stage:   job.Failed,
			after: func(t *testing.T, q *Queue) {
				if st := sidecarOnDisk(t, q, job.Failed, "file-name"); !containsAll(st.Detail, "other-id", "file-name.md") {
					t.Errorf("detail = %q", st.Detail)
				}
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var opts []Option
			if tt.parser {
				opts = append(opts, WithParser(testParser))
			}
			q, _ := newQueue(t, opts...)
			tt.setup(t, q)
			// Lock-free reads: the job is there once, at its manifest's stage.
			e, err := q.Get(tt.id)
			if err != nil {
				t.Fatalf("Get before repair: %v", err)
			}
			if tt.before != nil {
				tt.before(t, e)
			}
			list, err := q.List()
			if err != nil {
				t.Fatal(err)
			}
			n := 0
			for _, le := range list {
				if le.State.ID == tt.id {
					n++
					if le.State.Stage != e.State.Stage {
						t.Errorf("List says %s, Get says %s", le.State.Stage, e.State.Stage)
					}
				}
			}
			if n != 1 {
				t.Errorf("List shows %s %d times", tt.id, n)
			}
			if err := tt.trigger(q); err != nil {
				t.Fatalf("trigger: %v", err)
			}
			if got := stageOf(t, q, tt.id); got != tt.stage {
				t.Errorf("after repair the job is in %s, want %s", got, tt.stage)
			}
			if st := sidecarOnDisk(t, q, tt.stage, tt.id); st.Stage != tt.stage || st.ID != tt.id {
				t.Errorf("sidecar after repair = %+v", st)
			}
			if tt.after != nil {
				tt.after(t, q)
			}
		})
	}
}

// Leftovers with no manifest anywhere: a sidecar from a Submit that crashed
// before its manifest landed, and temp files from an interrupted write. They
// are not jobs; the next full repair removes them.
func TestReconcileLeftovers(t *testing.T) {
	q, _ := newQueue(t)
	mustSubmit(t, q, mkJob("real"))
	b, _ := json.Marshal(State{ID: "ghost", Stage: job.Inbox})
	writeFile(t, q, "inbox/ghost.json", string(b))
	writeFile(t, q, "inbox/.real.json.tmp12345", "partial")
	writeFile(t, q, "shipped/broken.json", "{{") // unreadable and unclaimed: kept, never deleted

	if _, err := q.Get("ghost"); !errors.Is(err, ErrNotFound) {
		t.Errorf("Get(ghost) = %v, want ErrNotFound", err)
	}
	list, err := q.List()
	if err != nil || len(list) != 1 || list[0].State.ID != "real" {
		t.Fatalf("List = %+v, %v", list, err)
	}
	if _, err := q.Recover(func(State) bool { return true }, nil); err != nil {
		t.Fatal(err)
	}
	if f := files(t, q); !slices.Equal(f, []string{"inbox/real.json", "inbox/real.md", "shipped/broken.json"}) {
		t.Errorf("files = %v", f)
	}
}

func ignoreNoJob(err error) error {
	if errors.Is(err, ErrNoJob) {
		return nil
	}
	return err
}
