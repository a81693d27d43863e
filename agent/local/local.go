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
	"sync"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/aqfleet/aq/agent/caps"
	"github.com/aqfleet/aq/agent/holds"
	"github.com/aqfleet/aq/agent/manifest"
	"github.com/aqfleet/aq/agent/notify"
	"github.com/aqfleet/aq/agent/queue"
	"github.com/aqfleet/aq/agent/runner"
	"github.com/aqfleet/aq/internal/process"
	"github.com/aqfleet/aq/internal/telemetry"
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
	Log    *slog.Logger
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

func (a *Agent) onEvent(id string) func(runner.Event) {
	if a.OnEvent == nil {
		return nil
	}
	return func(e runner.Event) { a.OnEvent(id, e) }
}

// Recover returns jobs whose aq process died to the queue, after
// checkpointing their worktrees (no file the engine wrote is lost).
func (a *Agent) Recover(ctx context.Context) ([]string, error) {
	return a.Queue.Recover(a.inFlight, func(s queue.State) (string, error) {
		return a.checkpointOrphan(ctx, s)
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
	switch s.Engine {
	case "claude", "codex", "devin":
		reqs = append(reqs, "engine:"+s.Engine)
	}
	return reqs
}

// Runnable reports whether this host can run the job, and if not, why.
func Runnable(h *caps.Host, s queue.State) (bool, string) {
	missing := caps.Match(Requirements(s), h)
	if s.Engine == "any" || s.Engine == "" {
		found := false
		for _, e := range h.Engines {
			if e.Name != caps.ScriptEngine && e.Refused == "" {
				found = true
			}
		}
		if !found {
			missing = append(missing, caps.Missing{Token: "engine:any", Reason: "no coding engine (claude, codex, devin) is installed"})
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
	switch s.Engine {
	case "claude", "codex", "devin":
		hold, ok := active[s.Engine]
		return hold, ok
	case "", "any":
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
	ctx, span := telemetry.StartJob(ctx, a.tracer(), telemetry.JobStart{ID: st.ID, Repo: st.Repo, Attempt: st.Attempts, Mode: "local"})
	var title string
	defer func() { a.ended(ctx, span, st.Repo, title, res) }()

	j, err := a.Parse(entry.ManifestPath)
	if err != nil {
		stage, ferr := a.Queue.Fail(st.ID, job.ReasonInvalidManifest, oneLine(err.Error()), nil)
		log.Error("manifest no longer valid", "err", err, "stage", stage)
		return &Result{JobID: st.ID, Attempt: st.Attempts, Stage: stage, Outcome: runner.Outcome{Stage: job.Failed, Reason: job.ReasonInvalidManifest, Detail: err.Error()}}, ferr
	}
	if ref := manifest.Check(j, a.Policy); ref != nil {
		stage, ferr := a.Queue.Fail(st.ID, ref.Reason, ref.Msg, nil)
		log.Error("job refused before anything ran", "reason", ref.Reason, "why", ref.Msg, "stage", stage)
		return &Result{JobID: st.ID, Attempt: st.Attempts, Stage: stage, Outcome: runner.Outcome{Stage: job.Failed, Reason: ref.Reason, Detail: ref.Msg}}, ferr
	}
	title = j.Title
	out := a.Runner.Run(ctx, j, runner.Options{Attempt: st.Attempts, Checkpoint: st.Checkpoint, OnEvent: a.onEvent(st.ID)})
	res = &Result{JobID: st.ID, Attempt: st.Attempts, Outcome: out}
	_, report := telemetry.Step(ctx, a.tracer(), telemetry.SpanReport)
	defer func() { telemetry.EndStep(report, errReason(err)) }()
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
	if out.IsParked() {
		res.Stage, err = job.Inbox, a.Queue.Park(st.ID, out.Reason, out.Parked, out.Detail, out.ParkedUntil, record)
		log.Warn("job parked", "stage", job.Inbox, "parked", out.Parked, "until", out.ParkedUntil.Format(time.RFC3339), "detail", out.Detail, "checkpoint", out.Checkpoint)
		return res, err
	}
	if out.Failed() {
		res.Stage, err = a.Queue.Fail(st.ID, out.Reason, out.Detail, record)
		log.Warn("job failed", "stage", res.Stage, "reason", out.Reason, "detail", out.Detail, "checkpoint", out.Checkpoint)
		return res, err
	}
	res.Stage = out.Stage
	err = a.Queue.Finish(st.ID, out.Stage, record)
	log.Info("job done", "stage", out.Stage, "branch", out.Branch, "files", out.Insights.FilesChanged, "checkpoint", out.Checkpoint)
	return res, err
}

// ended closes the job's trace and tells the notifier (after the queue
// recorded where the job went).
func (a *Agent) ended(ctx context.Context, span trace.Span, repo, title string, res *Result) {
	if res == nil {
		telemetry.EndJob(span, telemetry.JobEnd{Stage: job.Failed, Reason: job.ReasonCrash})
		return
	}
	o := res.Outcome
	telemetry.EndJob(span, telemetry.JobEnd{Stage: res.Stage, Reason: o.Reason, Fenced: o.Fenced, Insights: o.Insights, Branch: o.Branch, PRURL: o.PRURL})
	a.Notifier.Notify(notify.End{JobID: res.JobID, Title: title, Repo: repo, Attempt: res.Attempt, Stage: res.Stage, Reason: o.Reason,
		Detail: o.Detail, Fenced: o.Fenced, Final: res.Stage == job.Failed || res.Stage == job.DeadLetter, Branch: o.Branch, PRURL: o.PRURL,
		Insights: o.Insights, Mode: "local", TraceID: telemetry.TraceID(ctx)})
}

func (a *Agent) tracer() trace.Tracer {
	if a.Tracer != nil {
		return a.Tracer
	}
	return telemetry.Off().Tracer()
}

// errReason marks a report span whose queue write failed.
func errReason(err error) job.Reason {
	if err != nil {
		return job.ReasonCrash
	}
	return ""
}

func oneLine(s string) string {
	for i, r := range s {
		if r == '\n' {
			return s[:i] + " …"
		}
	}
	return s
}
