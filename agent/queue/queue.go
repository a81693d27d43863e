package queue

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"time"

	"github.com/gofrs/flock"

	"github.com/aqfleet/aq/internal/aqerr"
	"github.com/aqfleet/aq/internal/lockwait"
	"github.com/aqfleet/aq/job"
)

// Queue is a local folder queue. It is safe for concurrent use by many
// goroutines, and by many processes that open the same directory.
type Queue struct {
	dir   string
	now   func() time.Time
	parse func(path string) (*job.Job, error)
	host  string
	pid   int
	token string // identifies this Queue in the lock file (see sidecarCache)

	// mu serialises this process's mutations; lock (an flock on <dir>/.lock)
	// excludes other processes and other Queue values on the same directory.
	mu    sync.Mutex
	lock  *flock.Flock
	cache sidecarCache

	// waitCtx ends a wait for the queue's lock (WithWait); notice is told
	// what it waits for after a second.
	waitCtx context.Context
	notice  func(msg string)
}

// Option configures a Queue.
type Option func(*Queue)

// WithClock sets the clock (default time.Now). Tests inject a fake one.
func WithClock(now func() time.Time) Option { return func(q *Queue) { q.now = now } }

// WithParser sets how a manifest found without any sidecar (a file dropped
// into a stage folder by hand) is read: normally manifest.ParseFile with the
// profile catalog. Without a parser such a job gets minimal fields (its id as
// title, engine any, normal priority, no deps, no retries). A parse error
// moves the job to failed with reason invalid_manifest.
func WithParser(parse func(path string) (*job.Job, error)) Option {
	return func(q *Queue) { q.parse = parse }
}

// WithWait makes every wait for the queue's lock end with ctx (an
// interrupted wait is a *lockwait.Interrupted error: nothing was changed)
// and, after a second, tell notice what it waits for and which process holds
// the lock. Without it a wait lasts until the lock is free.
func WithWait(ctx context.Context, notice func(msg string)) Option {
	return func(q *Queue) { q.waitCtx, q.notice = ctx, notice }
}

// WithOwner sets the host name and process id recorded on jobs this Queue
// takes (default: os.Hostname and os.Getpid). Finish and Fail only act on jobs
// this owner took.
func WithOwner(host string, pid int) Option {
	return func(q *Queue) { q.host, q.pid = host, pid }
}

// Open opens (creating if needed) the queue under dir. A directory that cannot
// be created or written is a usage error that names it.
func Open(dir string, opts ...Option) (*Queue, error) {
	if strings.TrimSpace(dir) == "" {
		return nil, aqerr.Usagef("set AQ_HOME to a writable directory", "the local queue directory is not set")
	}
	abs, err := filepath.Abs(dir)
	if err != nil {
		return nil, notUsable(dir, err)
	}
	host, _ := os.Hostname()
	q := &Queue{dir: abs, now: time.Now, host: host, pid: os.Getpid()}
	for _, o := range opts {
		o(q)
	}
	for _, s := range job.Stages {
		if err := os.MkdirAll(filepath.Join(abs, string(s)), 0o755); err != nil {
			return nil, notUsable(abs, err)
		}
	}
	// MkdirAll succeeds on existing directories, writable or not: prove we can
	// create a file, and create the lock file while at it.
	lockPath := filepath.Join(abs, ".lock")
	f, err := os.OpenFile(lockPath, os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return nil, notUsable(abs, err)
	}
	f.Close()
	probe, err := os.CreateTemp(abs, ".probe-*")
	if err != nil {
		return nil, notUsable(abs, err)
	}
	probe.Close()
	os.Remove(probe.Name())
	var tok [16]byte
	if _, err := rand.Read(tok[:]); err != nil {
		return nil, err
	}
	q.token = hex.EncodeToString(tok[:])
	q.lock = flock.New(lockPath)
	return q, nil
}

func notUsable(dir string, err error) error {
	cause := err
	var pe *fs.PathError
	if errors.As(err, &pe) {
		cause = pe.Err
	}
	return aqerr.Wrap(aqerr.Usage, err,
		fmt.Sprintf("cannot use %s as the local queue: %v", dir, cause),
		"check the directory's permissions and owner, or set AQ_HOME to a writable directory")
}

// Dir is the queue's directory (absolute).
func (q *Queue) Dir() string { return q.dir }

// clock is now in UTC without a monotonic reading, as it is stored.
func (q *Queue) clock() time.Time { return q.now().UTC().Round(0) }

// locked runs fn holding the queue-wide lock.
func (q *Queue) locked(fn func() error) error {
	q.mu.Lock()
	defer q.mu.Unlock()
	if err := lockwait.Lock(q.ctx(), q.lock, lockwait.Options{What: q.lockName(), Notice: q.notice}); err != nil {
		if lockwait.IsInterrupted(err) {
			return err
		}
		return fmt.Errorf("lock the local queue %s: %w", q.lock.Path(), err)
	}
	defer q.lock.Unlock()
	q.claimCache()
	return fn()
}

// sharedLocked runs fn holding a shared lock: no mutation runs meanwhile. It
// uses its own file descriptor, so it also excludes this process's writers.
func (q *Queue) sharedLocked(fn func() error) error {
	l := flock.New(q.lock.Path(), flock.SetFlag(os.O_RDONLY))
	if err := lockwait.Lock(q.ctx(), l, lockwait.Options{What: q.lockName(), Shared: true, Notice: q.notice}); err != nil {
		if lockwait.IsInterrupted(err) {
			return err
		}
		return fmt.Errorf("lock the local queue %s: %w", q.lock.Path(), err)
	}
	defer l.Unlock()
	return fn()
}

func (q *Queue) ctx() context.Context {
	if q.waitCtx != nil {
		return q.waitCtx
	}
	return context.Background()
}

func (q *Queue) lockName() string { return "the local queue's lock (" + q.lock.Path() + ")" }

func (q *Queue) md(stage job.Stage, id string) string {
	return filepath.Join(q.dir, string(stage), id+".md")
}

func (q *Queue) sidecar(stage job.Stage, id string) string {
	return filepath.Join(q.dir, string(stage), id+".json")
}

// rel is path relative to the queue dir, for messages.
func (q *Queue) rel(path string) string {
	if r, err := filepath.Rel(q.dir, path); err == nil {
		return r
	}
	return path
}

var idPattern = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$`) })

func validID(id string) bool { return idPattern().MatchString(id) && !strings.Contains(id, "..") }

// checkID refuses an id that could not be a file name in a stage folder. It is
// called before any path is built from an id.
func checkID(id string) error {
	if validID(id) {
		return nil
	}
	return aqerr.Usagef("use 1 to 128 letters, digits, '.', '_' or '-', starting with a letter or digit, without '..'",
		"job id %q is not valid", id)
}

func knownStage(s job.Stage) bool {
	for _, k := range job.Stages {
		if k == s {
			return true
		}
	}
	return false
}

// Errors. Match them with errors.Is and errors.As; every error meant for a
// person is also an *aqerr.Error with an exit code.
var (
	// ErrNoJob: Next found no runnable job. It maps to exit code 3.
	ErrNoJob error = &aqerr.Error{Code: aqerr.NoJob, What: "no runnable job in the local queue"}
	// ErrNotFound: no job has the id.
	ErrNotFound = errors.New("job not found")
	// ErrNotOwner: Finish or Fail on a job that another process took.
	ErrNotOwner = errors.New("job is not owned by this process")
)

// ExistsError: Submit of an id that a job in the queue already has.
type ExistsError struct {
	ID    string
	Stage job.Stage
}

func (e *ExistsError) Error() string {
	return fmt.Sprintf("job %s already exists (in %s)", e.ID, e.Stage)
}

// DuplicateError: Submit of a job whose idempotencyKey an existing job has.
type DuplicateError struct {
	ID         string // the refused job
	Key        string
	ExistingID string
	Stage      job.Stage // the existing job's stage
}

func (e *DuplicateError) Error() string {
	return fmt.Sprintf("duplicate of job %s (idempotencyKey %q, in %s)", e.ExistingID, e.Key, e.Stage)
}

// StageError: the job is not in a stage the operation accepts.
type StageError struct {
	ID    string
	Op    string
	Stage job.Stage
	Want  []job.Stage
}

func (e *StageError) Error() string {
	want := make([]string, len(e.Want))
	for i, s := range e.Want {
		want[i] = string(s)
	}
	return fmt.Sprintf("cannot %s job %s: it is in %s, not %s", e.Op, e.ID, e.Stage, strings.Join(want, " or "))
}

func notFound(id string) error {
	return aqerr.Wrap(aqerr.Usage, ErrNotFound, fmt.Sprintf("no job %s in the local queue", id),
		"see `aq status` for the jobs there are")
}
