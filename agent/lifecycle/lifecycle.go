// Package lifecycle is one job's life from the moment a mode holds it — a
// job taken from the local folder queue, a claim from the fleet's
// coordinator — to its recorded end. Both modes run it; what differs, the
// store a mode records into, is behind Recorder (the queue's files locally;
// the coordinator's reports, the spool and the job records in fleet mode).
//
// A job's life, in order (Lifecycle.Run):
//
//  1. its trace starts (one per job: internal/telemetry);
//  2. the mode begins it (Recorder.Begin): the fleet records the job, lists
//     it in heartbeats and starts holding its lease — or gives the lease
//     back when aq is stopping before the job started;
//  3. its manifest is parsed (Recorder.Parse); one that is not valid fails
//     the job invalid_manifest;
//  4. the mode starts it (Recorder.Start): the fleet reports building,
//     fenced — a 409 ends the job there;
//  5. the pipeline (agent/runner) runs it; each of its events goes to the
//     recorder (Recorder.Event), then to the observer (Lifecycle.OnEvent);
//  6. the one decision (Decide): fenced, parked, failed or done — a lease
//     fenced while the pipeline finished makes it fenced whatever the run did;
//  7. the terminal report (Recorder.Report) goes out on the context the
//     lease gives for it (Lease.Reporting): renewals take turns with its
//     attempts and stop once one may have been taken;
//  8. the lease ends (Lease.End) — only now, once the report has settled,
//     so a report the coordinator is slow to take cannot outlive it;
//  9. the mode closes the job (Recorder.Close: the fleet uploads its logs);
//  10. the trace ends, and the notifier hears where the job went.
//
// docs/architecture.md traces a job through the packages around it.
package lifecycle

import (
	"context"
	"log/slog"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/aqfleet/aq/agent/notify"
	"github.com/aqfleet/aq/agent/runner"
	"github.com/aqfleet/aq/internal/telemetry"
	"github.com/aqfleet/aq/job"
)

// Pipeline runs one job (runner.Runner).
type Pipeline interface {
	Run(ctx context.Context, j *job.Job, o runner.Options) runner.Outcome
}

var _ Pipeline = (*runner.Runner)(nil)

// Lease is a mode's hold on a running job: the fleet's lease (fleet.JobLease);
// a local job has none (its job lock is held by the caller).
type Lease interface {
	runner.Lease
	// Fenced reports whether the coordinator said another factory owns the
	// job.
	Fenced() bool
	// Reporting says the terminal report is about to go out, on the context
	// it returns: renewals take turns with the report's attempts on the
	// wire and stop once one of them may have been taken.
	Reporting(ctx context.Context) context.Context
	// End says the terminal report settled: renewals stop, and End waits
	// for the renewer.
	End()
}

// Recorder is where a mode records one job's life; each job gets its own.
// Its methods are called in the order of the package comment, each at most
// once but Event, on one goroutine at a time.
type Recorder interface {
	// Begin is called first, with the job's context and its cancel (for a
	// lease that is lost): it returns the mode's lease (nil: none), or the
	// job's end when it must not start (the fleet gives back the lease of a
	// job aq is stopping before it started).
	Begin(ctx context.Context, stop context.CancelCauseFunc) (Lease, *End)
	// Parse reads the job's manifest (profiles applied), logging what is
	// wrong with it; the error's text is the failure's detail.
	Parse() (*job.Job, error)
	// Start is told the job is about to run; a non-nil Outcome ends it
	// there, before the pipeline (the fleet's building report fenced).
	Start(ctx context.Context, j *job.Job) *runner.Outcome
	// Event records one of the running job's events.
	Event(ctx context.Context, e runner.Event)
	// Report records the job's end as decided (k): the terminal report.
	// j is the parsed manifest, nil when it did not parse. It may rewrite
	// out when the store says otherwise (the fleet's report answered 409:
	// fenced).
	Report(ctx context.Context, k Kind, j *job.Job, out *runner.Outcome) Settled
	// Close is called last, with the job's end, once the lease ended.
	Close(ctx context.Context, e *End)
}

// Kind is where a run's outcome sends the job.
type Kind int

// Kinds, as Decide returns them.
const (
	// Done: the run succeeded (review, testing or shipped).
	Done Kind = iota
	// Failed: the run failed; the store's retry policy says what next.
	Failed
	// Parked: the engine's account hit a limit; the job waits for its reset
	// without an attempt spent.
	Parked
	// Fenced: another factory owns the job; nothing of this run's is
	// reported.
	Fenced
)

var kindNames = [...]string{Done: "done", Failed: "failed", Parked: "parked", Fenced: "fenced"}

func (k Kind) String() string { return kindNames[k] }

// Decide is the one decision of a job's end: where its run's outcome sends
// it.
func Decide(o runner.Outcome) Kind {
	switch {
	case o.Reason == job.ReasonFenced:
		return Fenced
	case o.IsParked():
		return Parked
	case o.Failed():
		return Failed
	}
	return Done
}

// Settled is what a recorder made of a job's end.
type Settled struct {
	// Stage is where the job went, as far as this factory knows.
	Stage job.Stage
	// Known says Stage is the store's word (the queue's; the coordinator's
	// answer to the report). Otherwise (a fleet report spooled or refused)
	// the job's retry policy says whether a failure is final.
	Known bool
	// Fenced: the job turned out to be another factory's.
	Fenced bool
	// Report is what became of a fleet job's terminal report (the values of
	// fleet.Result.Report); "" locally, where Err says whether the queue
	// took the end.
	Report string
	// Silent: nothing of this factory's to announce (the job never started
	// here, or it was fenced).
	Silent bool
	Err    error
}

// End is a job's end as the lifecycle saw it.
type End struct {
	Outcome runner.Outcome
	Settled
	// Job is the job's parsed manifest (nil: it did not parse, or the job
	// never started).
	Job *job.Job
}

// Job is what the lifecycle knows of a job before its manifest is parsed.
type Job struct {
	ID, Repo string
	Attempt  int
	// Checkpoint is the WIP commit the run resumes from ("" = none).
	Checkpoint string
	// Previous is how the job's previous attempt ended, as the mode knows
	// it (nil: unknown); the pipeline tells the engine.
	Previous *job.Previous
	// Mode is "local" or "fleet"; Source ("poll", "broker", "job") and
	// Epoch are a fleet claim's (traces).
	Mode, Source string
	Epoch        int64
	// Log is the mode's logger for the job (with its attributes).
	Log *slog.Logger
}

// Lifecycle runs jobs' lives. Its fields are set once; Run may be called
// concurrently for different jobs.
type Lifecycle struct {
	Pipeline Pipeline
	// Tracer records one trace per job; nil: none.
	Tracer trace.Tracer
	// Notifier is told of each job's end once it is recorded (nil: off).
	Notifier *notify.Notifier
	// OnEvent, if set, sees each running job's events after its recorder
	// (the CLI's progress line, the daemon's job phases).
	OnEvent func(jobID string, e runner.Event)
}

// Run runs one job's life (see the package comment) and returns its end.
func (l *Lifecycle) Run(ctx context.Context, jb Job, rec Recorder) *End {
	if jb.Log == nil {
		jb.Log = slog.New(slog.DiscardHandler)
	}
	ctx, span := telemetry.StartJob(ctx, l.tracer(), telemetry.JobStart{ID: jb.ID, Repo: jb.Repo, Attempt: jb.Attempt,
		Mode: jb.Mode, Source: jb.Source, Epoch: jb.Epoch})
	end := l.run(ctx, jb, rec)
	rec.Close(ctx, end)
	l.ended(ctx, span, jb, end)
	return end
}

func (l *Lifecycle) run(ctx context.Context, jb Job, rec Recorder) *End {
	jobCtx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	lease, gone := rec.Begin(jobCtx, cancel)
	if gone != nil {
		return gone
	}
	end := &End{}
	j, err := rec.Parse()
	switch {
	case err != nil:
		end.Outcome = runner.Outcome{Stage: job.Failed, Reason: job.ReasonInvalidManifest, Detail: err.Error()}
	default:
		end.Job = j
		if stop := rec.Start(jobCtx, j); stop != nil {
			end.Outcome = *stop
			break
		}
		o := runner.Options{Attempt: jb.Attempt, Checkpoint: jb.Checkpoint, Previous: jb.Previous, OnEvent: func(e runner.Event) {
			rec.Event(jobCtx, e)
			if l.OnEvent != nil {
				l.OnEvent(jb.ID, e)
			}
		}}
		if lease != nil {
			o.Lease = lease
		}
		end.Outcome = l.Pipeline.Run(jobCtx, j, o)
	}
	l.report(ctx, jb, rec, lease, end)
	return end
}

// report decides where the job goes and has the recorder report it; the
// lease is held until the report settled, renewing only between the
// report's attempts (Lease.Reporting), and ends after it.
func (l *Lifecycle) report(ctx context.Context, jb Job, rec Recorder, lease Lease, end *End) {
	out := &end.Outcome
	if lease != nil && lease.Fenced() && out.Reason != job.ReasonFenced {
		// Fenced after the pipeline's last check: whatever it did, it must
		// not be reported as this factory's result.
		jb.Log.Warn("the lease was fenced while the job finished; not reporting its outcome", "outcome", out.Stage, "reason", out.Reason)
		out.Stage, out.Reason, out.Fenced = job.Failed, job.ReasonFenced, true
		if out.Detail == "" {
			out.Detail = "fenced while the job finished"
		}
	}
	rctx, span := telemetry.Step(ctx, l.tracer(), telemetry.SpanReport)
	if lease != nil {
		rctx = lease.Reporting(rctx)
	}
	end.Settled = rec.Report(rctx, Decide(*out), end.Job, out)
	endReport(span, end.Settled)
	if lease != nil {
		lease.End()
	}
}

// ended closes the job's trace and tells the notifier where the job went:
// a failure is for good when the store said so (failed, dead_letter) or,
// its answer unknown (a fleet report spooled), when the job's retry policy
// says so.
func (l *Lifecycle) ended(ctx context.Context, span trace.Span, jb Job, e *End) {
	o := e.Outcome
	telemetry.EndJob(span, telemetry.JobEnd{Stage: e.Stage, Reason: o.Reason, Fenced: e.Fenced, Insights: o.Insights,
		Branch: o.Branch, PRURL: o.PRURL, Report: e.Report})
	if e.Silent {
		return
	}
	var title string
	final := e.Stage == job.Failed || e.Stage == job.DeadLetter
	if e.Job != nil {
		title = e.Job.Title
		if !e.Known && o.Failed() {
			final = !job.Retryable(o.Reason, jb.Attempt, e.Job.Retry)
		}
	}
	l.Notifier.Notify(notify.End{JobID: jb.ID, Title: title, Repo: jb.Repo, Attempt: jb.Attempt, Stage: e.Stage, Reason: o.Reason,
		Detail: o.Detail, Fenced: e.Fenced, Final: final, Branch: o.Branch, PRURL: o.PRURL, Insights: o.Insights, Mode: jb.Mode,
		TraceID: telemetry.TraceID(ctx)})
}

// endReport ends the report's span: with what became of a fleet report
// (an error unless delivered, or none sent), or with whether the local
// queue took the end.
func endReport(span trace.Span, s Settled) {
	if s.Report == "" {
		var reason job.Reason
		if s.Err != nil {
			reason = job.ReasonCrash
		}
		telemetry.EndStep(span, reason)
		return
	}
	span.SetAttributes(attribute.String(telemetry.AttrReport, s.Report))
	if s.Report != "delivered" && s.Report != "none" {
		span.SetStatus(codes.Error, "report "+s.Report) // spooled, rejected, fenced: not taken now
	}
	span.End()
}

func (l *Lifecycle) tracer() trace.Tracer {
	if l.Tracer != nil {
		return l.Tracer
	}
	return telemetry.Off().Tracer()
}
