package queue

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/aqfleet/aq/internal/aqerr"
	"github.com/aqfleet/aq/job"
)

func TestOpenCreatesStageDirs(t *testing.T) {
	q, _ := newQueue(t)
	for _, s := range job.Stages {
		fi, err := os.Stat(filepath.Join(q.Dir(), string(s)))
		if err != nil || !fi.IsDir() {
			t.Errorf("stage dir %s: %v", s, err)
		}
	}
	// Opening again is harmless.
	if _, err := Open(q.Dir()); err != nil {
		t.Fatalf("second Open: %v", err)
	}
}

// Tests run as root, where chmod 0500 does not stop writes. So the queue dir is
// made unusable in a way that holds for root too: a path that runs through a
// regular file (ENOTDIR), or a queue path that is itself a regular file.
func TestOpenNotWritable(t *testing.T) {
	tests := []struct {
		name string
		dir  func(base string) string
	}{
		{"parent is a regular file", func(base string) string {
			f := filepath.Join(base, "file")
			if err := os.WriteFile(f, []byte("x"), 0o644); err != nil {
				t.Fatal(err)
			}
			return filepath.Join(f, "queue")
		}},
		{"queue path is a regular file", func(base string) string {
			f := filepath.Join(base, "queue")
			if err := os.WriteFile(f, []byte("x"), 0o644); err != nil {
				t.Fatal(err)
			}
			return f
		}},
		{"a stage path is a regular file", func(base string) string {
			d := filepath.Join(base, "queue")
			if err := os.MkdirAll(d, 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(d, "inbox"), []byte("x"), 0o644); err != nil {
				t.Fatal(err)
			}
			return d
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := tt.dir(t.TempDir())
			_, err := Open(dir)
			if err == nil {
				t.Fatal("Open succeeded on an unusable dir")
			}
			var ae *aqerr.Error
			if !errors.As(err, &ae) || ae.Code != aqerr.Usage {
				t.Fatalf("err = %#v, want *aqerr.Error with Code Usage", err)
			}
			if msg := err.Error(); !containsAll(msg, dir, "permissions", "AQ_HOME") {
				t.Errorf("message %q should name %s and say how to fix it", msg, dir)
			}
		})
	}
}

func TestSubmitPlacement(t *testing.T) {
	tests := []struct {
		name    string
		shipped []string // jobs submitted and shipped first
		other   []string // jobs submitted and left in inbox
		job     *job.Job
		want    job.Stage
	}{
		{"no deps", nil, nil, mkJob("a"), job.Inbox},
		{"all: every dep shipped", []string{"d1", "d2"}, nil, mkJob("a", withDeps("all", "d1", "d2")), job.Inbox},
		{"all: one dep not shipped", []string{"d1"}, []string{"d2"}, mkJob("a", withDeps("all", "d1", "d2")), job.Blocked},
		{"all: dep does not exist", nil, nil, mkJob("a", withDeps("all", "ghost")), job.Blocked},
		{"any: one dep shipped", []string{"d1"}, []string{"d2"}, mkJob("a", withDeps("any", "d1", "d2")), job.Inbox},
		{"any: none shipped", nil, []string{"d1", "d2"}, mkJob("a", withDeps("any", "d1", "d2")), job.Blocked},
		{"empty mode means all", []string{"d1"}, []string{"d2"}, mkJob("a", withDeps("", "d1", "d2")), job.Blocked},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			q, _ := newQueue(t)
			for _, id := range tt.shipped {
				mustSubmit(t, q, mkJob(id))
				moveTo(t, q, id, job.Shipped)
			}
			for _, id := range tt.other {
				mustSubmit(t, q, mkJob(id))
			}
			st := mustSubmit(t, q, tt.job)
			if st.Stage != tt.want {
				t.Errorf("Submit placed the job in %s, want %s", st.Stage, tt.want)
			}
			if got := stageOf(t, q, "a"); got != tt.want {
				t.Errorf("manifest is in %s, want %s", got, tt.want)
			}
			disk := sidecarOnDisk(t, q, tt.want, "a")
			if disk.Stage != tt.want || disk.DepsMode == "" || len(disk.History) != 1 || disk.History[0].To != tt.want {
				t.Errorf("sidecar = %+v", disk)
			}
		})
	}
}

func TestSubmitStoresManifestAndSidecar(t *testing.T) {
	q, clk := newQueue(t)
	j := mkJob("fix-login", withPriority(job.PriorityHigh), withKey("tracker-1"), withDeps("any"), withEngine("codex"))
	raw := rawFor(j)
	st, err := q.Submit(j, raw)
	if err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile(filepath.Join(q.Dir(), "inbox", "fix-login.md"))
	if err != nil || !bytes.Equal(got, raw) {
		t.Fatalf("manifest not stored byte for byte: %q, %v", got, err)
	}
	disk := sidecarOnDisk(t, q, job.Inbox, "fix-login")
	want := State{
		ID: "fix-login", Title: j.Title, Repo: "repo1", Engine: "codex", Stage: job.Inbox, Priority: job.PriorityHigh,
		Capabilities: j.Capabilities, DepsMode: "any", IdempotencyKey: "tracker-1", Retry: j.Retry,
		CreatedAt: clk.Now(), UpdatedAt: clk.Now(),
	}
	if disk.ID != want.ID || disk.Title != want.Title || disk.Repo != want.Repo || disk.Engine != want.Engine ||
		disk.Stage != want.Stage || disk.Priority != want.Priority || !slices.Equal(disk.Capabilities, want.Capabilities) ||
		disk.DepsMode != want.DepsMode || disk.IdempotencyKey != want.IdempotencyKey || disk.Retry != want.Retry ||
		!disk.CreatedAt.Equal(want.CreatedAt) || !disk.UpdatedAt.Equal(want.UpdatedAt) || disk.Attempts != 0 {
		t.Errorf("sidecar\n got %+v\nwant %+v", disk, want)
	}
	if st.ID != disk.ID || !st.CreatedAt.Equal(disk.CreatedAt) {
		t.Errorf("Submit returned %+v, disk has %+v", st, disk)
	}
	// Only the manifest and its sidecar exist: no temp files are left.
	if f := files(t, q); !slices.Equal(f, []string{"inbox/fix-login.json", "inbox/fix-login.md"}) {
		t.Errorf("files = %v", f)
	}
}

func TestSubmitDuplicateID(t *testing.T) {
	for _, stage := range []job.Stage{job.Inbox, job.Blocked, job.Building, job.Review, job.Shipped, job.Failed, job.DeadLetter} {
		t.Run(string(stage), func(t *testing.T) {
			q, _ := newQueue(t)
			mustSubmit(t, q, mkJob("dup"))
			moveTo(t, q, "dup", stage)
			before := files(t, q)
			_, err := q.Submit(mkJob("dup", withPriority(job.PriorityCritical)), []byte("other"))
			ee, ok := errAs[*ExistsError](err)
			if !ok {
				t.Fatalf("err = %v, want *ExistsError", err)
			}
			if ee.ID != "dup" || ee.Stage != stage {
				t.Errorf("ExistsError = %+v, want stage %s", ee, stage)
			}
			if aqerr.ExitCode(err) != aqerr.Usage {
				t.Errorf("exit code = %v, want usage", aqerr.ExitCode(err))
			}
			if !containsAll(err.Error(), "dup", string(stage), "aq job requeue") {
				t.Errorf("message %q should name the stage and the fix", err)
			}
			if after := files(t, q); !slices.Equal(before, after) {
				t.Errorf("refused submission changed the disk:\n before %v\n after  %v", before, after)
			}
		})
	}
}

func TestSubmitIdempotencyKey(t *testing.T) {
	for _, stage := range []job.Stage{job.Inbox, job.Building, job.Shipped, job.DeadLetter} {
		t.Run("existing in "+string(stage), func(t *testing.T) {
			q, _ := newQueue(t)
			mustSubmit(t, q, mkJob("first", withKey("tracker-1234")))
			moveTo(t, q, "first", stage)
			mustSubmit(t, q, mkJob("unrelated", withKey("tracker-9")))
			before := files(t, q)

			_, err := q.Submit(mkJob("second", withKey("tracker-1234")), []byte("x"))
			de, ok := errAs[*DuplicateError](err)
			if !ok {
				t.Fatalf("err = %v, want *DuplicateError", err)
			}
			if de.ExistingID != "first" || de.Stage != stage || de.Key != "tracker-1234" {
				t.Errorf("DuplicateError = %+v", de)
			}
			if !strings.Contains(err.Error(), "duplicate of job first") {
				t.Errorf("message %q", err)
			}
			if after := files(t, q); !slices.Equal(before, after) {
				t.Errorf("refused submission left files behind:\n before %v\n after  %v", before, after)
			}
			// A different key is accepted.
			mustSubmit(t, q, mkJob("third", withKey("tracker-5678")))
		})
	}
}

func TestSubmitRefusesBadInput(t *testing.T) {
	long := strings.Repeat("a", 129)
	tests := []struct {
		name string
		job  *job.Job
		raw  []byte
	}{
		{"empty id", mkJob(""), []byte("x")},
		{"traversal", mkJob("../evil"), []byte("x")},
		{"slash", mkJob("a/b"), []byte("x")},
		{"dot dot inside", mkJob("a..b"), []byte("x")},
		{"leading dot", mkJob(".hidden"), []byte("x")},
		{"leading dash", mkJob("-x"), []byte("x")},
		{"space", mkJob("a b"), []byte("x")},
		{"too long", mkJob(long), []byte("x")},
		{"bad dep id", mkJob("ok", withDeps("all", "../../etc")), []byte("x")},
		{"self dep", mkJob("ok", withDeps("all", "ok")), []byte("x")},
		{"bad deps mode", mkJob("ok", withDeps("some", "x")), []byte("x")},
		{"empty manifest", mkJob("ok"), nil},
		{"nil job", nil, []byte("x")},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			q, _ := newQueue(t)
			_, err := q.Submit(tt.job, tt.raw)
			if aqerr.ExitCode(err) != aqerr.Usage {
				t.Fatalf("err = %v (code %v), want a usage error", err, aqerr.ExitCode(err))
			}
			if f := files(t, q); len(f) != 0 {
				t.Errorf("files written: %v", f)
			}
		})
	}
	// Every id-taking method validates before building a path.
	q, _ := newQueue(t)
	for name, call := range map[string]func() error{
		"Get":     func() error { _, err := q.Get("../x"); return err },
		"Update":  func() error { return q.Update("../x", func(*State) {}) },
		"Move":    func() error { return q.Move("../x", job.Inbox, nil) },
		"Finish":  func() error { return q.Finish("../x", job.Shipped, nil) },
		"Fail":    func() error { _, err := q.Fail("../x", job.ReasonCrash, "", nil); return err },
		"Requeue": func() error { return q.Requeue("../x") },
		"Waiting": func() error { _, err := q.Waiting("../x"); return err },
	} {
		if err := call(); aqerr.ExitCode(err) != aqerr.Usage || !strings.Contains(err.Error(), "../x") {
			t.Errorf("%s(../x) = %v, want a usage error naming the id", name, err)
		}
	}
}

func TestGetNotFound(t *testing.T) {
	q, _ := newQueue(t)
	_, err := q.Get("nope")
	if !errors.Is(err, ErrNotFound) || !strings.Contains(err.Error(), "nope") {
		t.Fatalf("Get = %v, want ErrNotFound naming the id", err)
	}
}
