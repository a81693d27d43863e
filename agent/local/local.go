// Package local is aq's embedded default: it takes jobs from the folder queue
// under $AQ_HOME/queue, runs them through the runner one at a time, and
// records each outcome back in the queue. It also recovers jobs whose aq
// process died, checkpointing their worktrees first.
package local

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/aqfleet/aq/agent/caps"
	"github.com/aqfleet/aq/agent/holds"
	"github.com/aqfleet/aq/agent/lifecycle"
	"github.com/aqfleet/aq/agent/manifest"
	"github.com/aqfleet/aq/agent/notify"
	"github.com/aqfleet/aq/agent/queue"
	"github.com/aqfleet/aq/agent/runner"
	"github.com/aqfleet/aq/engines"
	"github.com/aqfleet/aq/internal/abandon"
	"github.com/aqfleet/aq/internal/brief"
	"github.com/aqfleet/aq/internal/process"
	"github.com/aqfleet/aq/job"
	"github.com/aqfleet/aq/profiles"
	"github.com/aqfleet/aq/worktree"
)

// Agent runs local jobs.
type Agent struct {
	Queue    *queue.Queue
	Runner   *runner.Runner
	LocksDir string
	// WorktreesDir is $AQ_HOME/worktrees, where orphaned worktrees are found.
	WorktreesDir string
	// Parse reads a queued manifest (with profiles applied).
	Parse func(path string) (*job.Job, error)
	// Catalog is the profile catalog Parse applies (manifest.Parse of bytes
	// already read takes it).
	Catalog *profiles.Catalog
	// Host detects this host's capabilities; called once per Agent.
	Host func(ctx context.Context) (*caps.Host, error)
	// Policy is what this factory runs (AQ_ENGINES): a taken job is
	// admitted under it (manifest.Check) before anything is prepared. The
	// zero Policy allows every engine.
	Policy manifest.Policy
	// HostCheck, when set, says whether this host can run a job ($AQ_HOME
	// takes writes: hostfault): asked before a job starts and after a run
	// that failed; its error makes the job fail host_unavailable (back to
	// the inbox, the host's fault, not the job's).
	HostCheck func() error
	Log       *slog.Logger
	// OnEvent, if set, receives each running job's progress (started, usage,
	// checkpoint).
	OnEvent func(jobID string, e runner.Event)
	// Tracer records one trace per job (internal/telemetry); nil: none.
	Tracer trace.Tracer
	// Notifier is told of each job's end once it is recorded (nil: off).
	Notifier *notify.Notifier

	hostOnce sync.Once
	host     *caps.Host
	hostErr  error
}

// Result is one job run by RunOne.
type Result struct {
	JobID   string         `json:"jobId"`
	Attempt int            `json:"attempt"`
	Stage   job.Stage      `json:"stage"` // where the job went
	Outcome runner.Outcome `json:"outcome"`
}

// Recover returns jobs whose aq process died to the queue, after
// checkpointing their worktrees (no file the engine wrote is lost); a job
// its aq abandoned after a stop signal fails interrupted, not crash.
func (a *Agent) Recover(ctx context.Context) ([]string, error) {
	return a.Queue.Recover(a.inFlight, func(s queue.State) (queue.Orphan, error) {
		sha, err := a.checkpointOrphan(ctx, s)
		why, _ := abandon.Take(a.Runner.Cfg.Home, s.ID, s.PID)
		return queue.Orphan{Checkpoint: sha, Abandoned: why}, err
	})
}

// inFlight reports whether a live process holds the job's lock.
func (a *Agent) inFlight(s queue.State) bool {
	held, err := worktree.Held(a.LocksDir, worktree.JobLockName(s.ID))
	return err != nil || held // when unsure, treat it as running: never steal a live job
}

func (a *Agent) checkpointOrphan(ctx context.Context, s queue.State) (string, error) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Minute)
	defer cancel()
	// aq died, its engine may not have: a process group of its own outlives
	// aq. Stop everything carrying the job's tag before the checkpoint, so
	// the checkpoint is final and no engine keeps writing into a worktree
	// the re-run replaces (or runs beside the re-run's engine).
	if n, err := process.StopScoped(ctx, s.ID, runner.Scope(a.Runner.Cfg.Home), a.Runner.Cfg.Grace); err != nil && !errors.Is(err, errors.ErrUnsupported) {
		return "", fmt.Errorf("cannot stop the orphaned engine of job %s: %w", s.ID, err)
	} else if n > 0 {
		a.log().Warn("stopped the processes of an orphaned job", "job", s.ID, "count", n)
	}
	wt := filepath.Join(a.WorktreesDir, s.Repo, s.ID)
	if _, err := os.Stat(wt); err != nil {
		return "", nil // no worktree was made: nothing to save
	}
	// The dead engine may have rewritten the worktree's .git: the
	// checkpoint goes to the job's repository by its registration.
	worktree.TrustRepo(filepath.Join(a.Runner.Cfg.RepoBase, s.Repo))
	ref := "refs/heads/" + job.WIPBranch(s.ID)
	sha, err := worktree.Checkpoint(ctx, a.Runner.Git, wt, ref, fmt.Sprintf("aq checkpoint: %s (recovered after aq died)\n\naq-job: %s\naq-attempt: %d", s.ID, s.ID, s.Attempts))
	var partial *worktree.PartialError
	if errors.As(err, &partial) {
		sha, err = partial.SHA, nil
	}
	if err != nil {
		return "", err
	}
	a.log().Info("checkpointed an orphaned job", "job", s.ID, "checkpoint", sha)
	return sha, nil
}

func (a *Agent) log() *slog.Logger {
	if a.Log != nil {
		return a.Log
	}
	return slog.New(slog.DiscardHandler)
}

// HostCaps returns this host's capabilities, detected once.
func (a *Agent) HostCaps(ctx context.Context) (*caps.Host, error) {
	a.hostOnce.Do(func() {
		a.host, a.hostErr = a.Host(ctx)
		caps.LogEngines(a.log(), a.host)
	})
	return a.host, a.hostErr
}

// Requirements are a job's capabilities plus the engine it names (a job for
// codex waits on a host without codex rather than failing). The repo is not
// one: locally, a missing repo is the job's failure (repo_unavailable).
func Requirements(s queue.State) []string {
	reqs := append([]string(nil), s.Capabilities...)
	if slices.Contains(engines.Coding(), s.Engine) {
		reqs = append(reqs, "engine:"+s.Engine)
	}
	return reqs
}

// Runnable reports whether this host can run the job, and if not, why.
func Runnable(h *caps.Host, s queue.State) (bool, string) {
	missing := caps.Match(Requirements(s), h)
	if s.Engine == engines.Any || s.Engine == "" {
		found := false
		for _, e := range h.Engines {
			if e.Name != caps.ScriptEngine && e.Refused == "" {
				found = true
			}
		}
		if !found {
			missing = append(missing, caps.Missing{Token: "engine:any", Reason: "no coding engine (" + strings.Join(engines.Coding(), ", ") + ") is installed"})
		}
	}
	if len(missing) == 0 {
		return true, ""
	}
	return false, caps.Explain(missing)
}

// HeldFor reports the hold that keeps job s from running now: its engine's
// (held until its limit resets), or for `engine: any` the earliest of the
// holds when every coding engine h has is held. active is holds.Store.Active.
func HeldFor(h *caps.Host, active map[string]holds.Hold, s queue.State) (holds.Hold, bool) {
	if len(active) == 0 {
		return holds.Hold{}, false
	}
	switch {
	case slices.Contains(engines.Coding(), s.Engine):
		hold, ok := active[s.Engine]
		return hold, ok
	case s.Engine == "" || s.Engine == engines.Any:
		var first *holds.Hold
		for _, e := range h.Engines {
			if e.Name == caps.ScriptEngine || e.Refused != "" {
				continue
			}
			hold, ok := active[e.Name]
			if !ok {
				return holds.Hold{}, false // a coding engine that is free
			}
			if first == nil || hold.Until.Before(first.Until) {
				first = &hold
			}
		}
		if first != nil {
			return *first, true
		}
	}
	return holds.Hold{}, false
}

// RunOne takes the best runnable job and runs it. It returns queue.ErrNoJob
// when nothing can run now.
func (a *Agent) RunOne(ctx context.Context) (res *Result, err error) {
	host, err := a.HostCaps(ctx)
	if err != nil {
		return nil, err
	}
	var jobLock *worktree.Lock
	active, _ := a.Runner.Holds.Active()
	entry, err := a.Queue.Next(func(s queue.State) bool {
		if ok, _ := Runnable(host, s); !ok {
			return false
		}
		if _, held := HeldFor(host, active, s); held {
			return false // its engine's limit has not reset: it would only park
		}
		// Take the job's lock before the queue moves it to building, so that
		// no other aq can mistake it for an orphan in between.
		l, ok, err := worktree.TryLockJob(a.LocksDir, s.ID)
		if err != nil || !ok {
			return false
		}
		jobLock = l
		return true
	})
	if err != nil {
		if jobLock != nil {
			jobLock.Unlock()
		}
		return nil, err
	}
	defer jobLock.Unlock()
	st := entry.State
	log := a.log().With("job", st.ID, "repo", st.Repo)
	log.Info("job taken", "stage", job.Building, "attempt", st.Attempts)
	lc := lifecycle.Lifecycle{Pipeline: a.Runner, Tracer: a.Tracer, Notifier: a.Notifier, OnEvent: a.OnEvent}
	end := lc.Run(ctx, lifecycle.Job{ID: st.ID, Repo: st.Repo, Attempt: st.Attempts, Checkpoint: st.Checkpoint, Previous: st.Previous, Mode: "local", Log: log},
		&queuedJob{a: a, st: st, path: entry.ManifestPath, log: log})
	return &Result{JobID: st.ID, Attempt: st.Attempts, Stage: end.Stage, Outcome: end.Outcome}, end.Err
}

// queuedJob records one queued job's life in the queue (its state sidecar
// and the folder it is in): the local mode's lifecycle.Recorder. A local
// job has no lease (the caller holds its job lock) and nothing to announce
// before its end.
type queuedJob struct {
	a    *Agent
	st   queue.State
	path string
	log  *slog.Logger
}

var _ lifecycle.Recorder = (*queuedJob)(nil)

func (q *queuedJob) Begin(context.Context, context.CancelCauseFunc) (lifecycle.Lease, *lifecycle.End) {
	return nil, nil
}

func (q *queuedJob) Parse() (*job.Job, error) { return q.a.Parse(q.path) }

// Start admits the job under the factory's policy (manifest.Check: its
// engine is one this factory runs) before anything is prepared; a refusal
// fails it there.
func (q *queuedJob) Start(_ context.Context, j *job.Job) *runner.Outcome {
	if q.a.HostCheck != nil {
		if err := q.a.HostCheck(); err != nil {
			q.log.Error("this host cannot run the job: back to the inbox", "reason", job.ReasonHostUnavailable, "err", err)
			return &runner.Outcome{Stage: job.Failed, Reason: job.ReasonHostUnavailable, Detail: brief.Head(err.Error()) + "; the job did not start"}
		}
	}
	if ref := manifest.Check(j, q.a.Policy); ref != nil {
		q.log.Error("job refused before anything ran", "reason", ref.Reason, "why", ref.Msg)
		return &runner.Outcome{Stage: job.Failed, Reason: ref.Reason, Detail: ref.Msg}
	}
	return nil
}

func (q *queuedJob) Event(context.Context, runner.Event) {}

// Report moves the job to where its end sends it — back to the inbox until
// its engine's limit resets (parked), failed (the queue's retry policy
// decides: the inbox again, or failed, or dead_letter), or the success
// stage — recording the run's checkpoint, branch, PR and insights. A
// manifest that did not parse fails the job with its first line.
func (q *queuedJob) Report(_ context.Context, k lifecycle.Kind, j *job.Job, out *runner.Outcome) lifecycle.Settled {
	id, log := q.st.ID, q.log
	s := lifecycle.Settled{Known: true, Fenced: out.Fenced}
	if j == nil {
		s.Stage, s.Err = q.a.Queue.Fail(id, job.ReasonInvalidManifest, brief.Head(out.Detail), nil)
		log.Error("manifest no longer valid", "err", out.Detail, "stage", s.Stage)
		return s
	}
	record := func(s *queue.State) {
		in := out.Insights
		s.Insights = &in
		if out.Checkpoint != "" {
			s.Checkpoint = out.Checkpoint
		}
		if out.Branch != "" {
			s.Branch = out.Branch
		}
		if out.PRURL != "" {
			s.PR = out.PRURL
		}
		if !out.Failed() {
			s.Reason, s.Detail = "", out.Detail
		}
	}
	switch k {
	case lifecycle.Parked:
		s.Stage, s.Err = job.Inbox, q.a.Queue.Park(id, out.Reason, out.Parked, out.Detail, out.ParkedUntil, record)
		log.Warn("job parked", "stage", job.Inbox, "parked", out.Parked, "until", out.ParkedUntil.Format(time.RFC3339), "detail", out.Detail, "checkpoint", out.Checkpoint)
	case lifecycle.Failed, lifecycle.Fenced:
		if k == lifecycle.Failed && out.Reason != job.ReasonHostUnavailable && q.a.HostCheck != nil {
			// A run that failed on a host that cannot write $AQ_HOME (an
			// engine's "I/O error"): the host's fault, not the job's.
			if err := q.a.HostCheck(); err != nil {
				log.Error("the run failed on a host that cannot write $AQ_HOME: host_unavailable", "run", out.Reason, "err", err)
				out.Detail = brief.Head(err.Error()) + "; the run ended " + string(out.Reason) + ": " + out.Detail
				out.Reason = job.ReasonHostUnavailable
			}
		}
		s.Stage, s.Err = q.a.Queue.Fail(id, out.Reason, out.Detail, record)
		log.Warn("job failed", "stage", s.Stage, "reason", out.Reason, "detail", out.Detail, "checkpoint", out.Checkpoint)
	default:
		s.Stage, s.Err = out.Stage, q.a.Queue.Finish(id, out.Stage, record)
		log.Info("job done", "stage", out.Stage, "branch", out.Branch, "files", out.Insights.FilesChanged, "checkpoint", out.Checkpoint)
	}
	return s
}

func (q *queuedJob) Close(context.Context, *lifecycle.End) {}
