package fleet

import (
	"context"
	"log/slog"
	"os"
	"strings"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/aqfleet/aq/agent/jobstate"
	"github.com/aqfleet/aq/agent/manifest"
	"github.com/aqfleet/aq/agent/notify"
	"github.com/aqfleet/aq/agent/runner"
	"github.com/aqfleet/aq/internal/telemetry"
	"github.com/aqfleet/aq/job"
	"github.com/aqfleet/aq/profiles"
)

// Pipeline runs one job (runner.Runner); the JobRunner's only use of it.
type Pipeline interface {
	Run(ctx context.Context, j *job.Job, o runner.Options) runner.Outcome
}

var _ Pipeline = (*runner.Runner)(nil)

// JobRunner takes one claimed job end to end: it parses the job's verbatim
// manifest (validated as a local one would be), records it in jobstate,
// makes it visible to heartbeats, reports building (fenced), holds the lease
// while the pipeline runs, and sends the final report — a fenced PATCH with
// the success stage, or /fleet/fail so the lease frees at once — through the
// Reporter (which spools what the coordinator cannot take). After a 409 it
// sends nothing more for the job: no success, no fail, and the runner has
// already refused to push or open a PR (split-brain guard).
type JobRunner struct {
	Client   *Client
	Pipeline Pipeline
	Reporter *Reporter
	Records  *jobstate.Store
	Running  *Running
	Catalog  *profiles.Catalog
	// Policy is what this factory runs (AQ_ENGINES): every job is admitted
	// under it before anything touches the file system or git
	// (manifest.Admit). The zero Policy allows every engine.
	Policy manifest.Policy
	// LeaseRenew is the renewal cadence (AQ_FLEET_LEASE_RENEW_SEC).
	LeaseRenew time.Duration
	Clock      Clock
	Log        *slog.Logger
	// RenewFailed, when set, is called for each failed lease renewal
	// (aq_lease_renew_failures_total); a renewal refused because the final
	// report ended the lease is not one.
	RenewFailed func()
	// Tracer records one trace per job: a root span from the claim to the
	// final report (internal/telemetry); nil: none.
	Tracer trace.Tracer
	// Notifier is told of each job's end once its report settled (nil: off).
	Notifier *notify.Notifier
	// Artifacts, when set, uploads the job's logs after each terminal
	// report (never before it, never holding it up).
	Artifacts *Artifacts
}

// Result is one fleet job as this factory ran it. Field names are stable
// (`aq run --json` prints it).
type Result struct {
	JobID      string         `json:"jobId"`
	Attempt    int            `json:"attempt"`
	LeaseEpoch int64          `json:"leaseEpoch"`
	Source     string         `json:"source"`
	Stage      job.Stage      `json:"stage"` // where the job went, as far as this factory knows
	Outcome    runner.Outcome `json:"outcome"`
	Fenced     bool           `json:"fenced,omitempty"`
	// Report is what became of the final report: delivered, spooled,
	// fenced, rejected, released (the job never started: lease given back)
	// or none (fenced before it).
	Report string `json:"report"`
	// Refused: the job did not pass admission (manifest.Admit); nothing of
	// it ran here.
	Refused bool `json:"refused,omitempty"`
	// Err is a refusal of this factory's credentials seen while the job ran
	// (the fleet path must stop).
	Err error `json:"-"`

	parsed *job.Job // the job's manifest, once parsed
}

// Run runs the job of claim c in its trace (one per job, from the claim to
// the final report) and tells the notifier how it ended. It always returns
// a Result.
func (r *JobRunner) Run(ctx context.Context, c *Claim) *Result {
	ctx, span := telemetry.StartJob(ctx, r.tracer(), telemetry.JobStart{ID: c.Job.ID, Repo: c.Job.Repo, Attempt: c.Attempt(),
		Mode: "fleet", Source: c.Source, Epoch: c.LeaseEpoch})
	res := r.run(ctx, c)
	r.ended(ctx, span, c, res)
	return res
}

// run runs the job of claim c.
func (r *JobRunner) run(ctx context.Context, c *Claim) *Result {
	// Admission first: the coordinator's id names files and branches, its
	// manifest says what runs — nothing happens before both are checked.
	j, refused := manifest.Admit(manifest.Wire{ID: c.Job.ID, Repo: c.Job.Repo, Asked: c.Asked, BodyMd: c.Job.BodyMd}, r.Catalog, r.Policy)
	if refused != nil {
		return r.refuse(ctx, c, refused)
	}
	id := c.Job.ID
	log := r.log().With("job", id, "repo", c.Job.Repo, "epoch", c.LeaseEpoch)
	res := &Result{JobID: id, Attempt: c.Attempt(), LeaseEpoch: c.LeaseEpoch, Source: c.Source, Stage: job.Building}
	log.Info("job claimed", "stage", job.Building, "source", c.Source, "attempt", res.Attempt)

	r.record(log, id, func(rec *jobstate.Record) {
		*rec = jobstate.Record{ID: id, Repo: c.Job.Repo, Stage: job.Building, LeaseEpoch: c.LeaseEpoch, Checkpoint: c.Job.Checkpoint,
			Source: c.Source, PID: os.Getpid(), StartedAt: r.now().UTC()}
	})
	if r.Running != nil {
		r.Running.Add(id, c.LeaseEpoch)
		defer r.Running.Remove(id)
	}
	if ctx.Err() != nil {
		// aq is stopping before the job started: give the lease back (no
		// attempt counted) rather than fail it.
		r.release(ctx, log, c, res)
		return res
	}

	jobCtx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	lease := NewJobLease(r.Client, c, r.LeaseRenew, cancel, r.clock(), log)
	lease.Failed = r.RenewFailed
	// The renewer runs from now until the final report is settled: the lease
	// is held while the report is out, so that a report the coordinator is
	// slow to take (503s, a restart) cannot outlive it — were it to lapse,
	// the reaper would hand the finished job to another factory, and a
	// failed job's lease would wait for the reaper instead of being freed
	// by its /fleet/fail. It renews on its own context (a stopped job's
	// report still holds the lease), and ends the moment the report settles
	// (JobLease.End: a renewal refused after the terminal report is no loss).
	lease.Start(context.WithoutCancel(jobCtx))
	policy := &j.Retry
	end := func() {
		r.finish(ctx, log, c, lease, res, policy)
		lease.End()
		if res.Err == nil {
			res.Err = lease.AuthErr()
		}
		r.upload(ctx, log, c, res)
	}

	r.record(log, id, func(rec *jobstate.Record) { rec.Repo, rec.Base, rec.Engine = j.Repo, j.Base, j.Engine })
	res.parsed = j

	// assigned → building, fenced: a 409 here means the job is already
	// someone else's, before any work.
	d := r.Reporter.Send(jobCtx, PatchReport(id, PatchRequest{Stage: job.Building.FleetName(), LeaseEpoch: c.LeaseEpoch}))
	switch {
	case d.Fenced:
		lease.Fence("the coordinator refused the building report (409)")
		res.Outcome = runner.Outcome{Stage: job.Failed, Reason: job.ReasonFenced, Detail: "fenced before the job started", Fenced: true}
		end()
		return res
	case IsAuth(d.Err):
		res.Err = d.Err
		cancel(job.Stop(job.ReasonInterrupted, "the coordinator refused this factory's credentials"))
	}

	res.Outcome = r.Pipeline.Run(jobCtx, j, runner.Options{
		Attempt: res.Attempt, Checkpoint: c.Job.Checkpoint, Lease: lease,
		OnEvent: func(e runner.Event) {
			switch e.Kind {
			case "checkpoint":
				r.record(log, id, func(rec *jobstate.Record) { rec.Checkpoint = e.Checkpoint })
			case "checkpoint-pushed":
				// Recorded with the coordinator, so its reaper and a
				// preemption keep it: the next owner resumes from it. A
				// coordinator that cannot take it now gets it from the spool.
				r.Reporter.Send(jobCtx, PatchReport(id, PatchRequest{Stage: job.Building.FleetName(), LeaseEpoch: c.LeaseEpoch, Checkpoint: e.Checkpoint}))
			case "delivered": // durably, before the report: a crash from here on must not run the engine again
				r.record(log, id, func(rec *jobstate.Record) { rec.Branch, rec.Delivered = e.Branch, e.Commit })
			}
		},
	})
	end()
	return res
}

// release gives back the lease of a job that never started here.
func (r *JobRunner) release(ctx context.Context, log *slog.Logger, c *Claim, res *Result) {
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), r.Client.Budgets().Release+time.Second)
	defer cancel()
	res.Outcome = runner.Outcome{Stage: job.Failed, Reason: job.ReasonInterrupted, Detail: "aq was stopped before the job started"}
	res.Stage, res.Report = job.Inbox, "released"
	if err := r.Client.Release(rctx, c.Job.ID, c.LeaseEpoch); err != nil {
		// The reaper frees it when the lease expires.
		res.Stage, res.Report = job.Building, "none"
		log.Warn("cannot release the lease; the coordinator's reaper will", "err", err)
	} else {
		log.Info("lease released: the job never started here", "stage", job.Inbox)
	}
	r.record(log, c.Job.ID, func(rec *jobstate.Record) {
		rec.Stage, rec.Reason, rec.Detail, rec.EndedAt = res.Stage, res.Outcome.Reason, res.Outcome.Detail, r.now().UTC()
	})
}

// finish sends the final report (unless fenced) and records the end.
// policy is the job's retry policy (nil: the manifest did not parse).
func (r *JobRunner) finish(ctx context.Context, log *slog.Logger, c *Claim, lease *JobLease, res *Result, policy *job.Retry) {
	out := &res.Outcome
	if lease.Fenced() && out.Reason != job.ReasonFenced {
		// Fenced after the pipeline's last check: whatever it did, it must
		// not be reported as this factory's result.
		log.Warn("the lease was fenced while the job finished; not reporting its outcome", "outcome", out.Stage, "reason", out.Reason)
		out.Stage, out.Reason, out.Fenced = job.Failed, job.ReasonFenced, true
		if out.Detail == "" {
			out.Detail = "fenced while the job finished"
		}
	}
	rctx, cancel := r.reportContext(ctx)
	defer cancel()
	rctx, rspan := telemetry.Step(rctx, r.tracer(), telemetry.SpanReport)
	defer func() { endReport(rspan, res) }()
	lease.Reporting()
	var d Delivery
	switch {
	case out.Reason == job.ReasonFenced:
		res.Fenced, res.Stage, res.Report = true, job.Failed, "none"
		log.Warn("job fenced: another factory owns it; nothing is reported or shipped", "stage", job.Failed, "reason", job.ReasonFenced, "checkpoint", out.Checkpoint)
	case out.IsParked():
		// The engine's account hit a limit: release the lease with the
		// reset, so the job waits (on this factory or another) without a
		// retry spent. A coordinator without /fleet/fail gets the same
		// through the route fallback (PATCH queued + release).
		d = r.Reporter.Send(rctx, FailReport(FailRequest{
			JobID: c.Job.ID, FactoryID: r.Client.FactoryID(), LeaseEpoch: c.LeaseEpoch, Reason: out.Reason,
			Retryable: true, Checkpoint: out.Checkpoint, Detail: out.Detail, NotBefore: out.ParkedUntil,
		}))
		res.Stage = job.Inbox
		if d.Delivered && d.Stage != "" {
			res.Stage = job.StageFromFleet(d.Stage)
		}
		log.Warn("job parked: lease released until the engine's limit resets", "parked", out.Parked, "until", out.ParkedUntil.Format(time.RFC3339),
			"detail", out.Detail, "stage", res.Stage, "report", d.String(), "checkpoint", out.Checkpoint)
	case out.Failed():
		// Also for lease_lost: the fail carries our epoch, so it is fenced
		// (409) if the coordinator reaped the lease, and frees the lease at
		// once if it did not.
		in := out.Insights
		rep := FailReport(FailRequest{
			JobID: c.Job.ID, FactoryID: r.Client.FactoryID(), LeaseEpoch: c.LeaseEpoch, Reason: out.Reason,
			Retryable: !out.Reason.Permanent(), Checkpoint: out.Checkpoint, Detail: out.Detail, Insights: &in,
		})
		// For a coordinator without /fleet/fail, which leaves the retry
		// decision to the factory (failpatch.go).
		rep.Exhausted = policy == nil || !job.Retryable(out.Reason, c.Attempt(), *policy)
		d = r.Reporter.Send(rctx, rep)
		res.Stage = job.Failed
		if d.Delivered && d.Stage != "" {
			res.Stage = job.StageFromFleet(d.Stage)
		}
		log.Warn("job failed", "reason", out.Reason, "detail", out.Detail, "stage", res.Stage, "report", d.String(), "checkpoint", out.Checkpoint)
	default:
		in := out.Insights
		d = r.Reporter.Send(rctx, PatchReport(c.Job.ID, PatchRequest{
			Stage: out.Stage.FleetName(), LeaseEpoch: c.LeaseEpoch, Checkpoint: out.Checkpoint,
			Insights: &in, Branch: out.Branch, PRURL: out.PRURL,
		}))
		res.Stage = out.Stage
		log.Info("job done", "stage", out.Stage, "branch", out.Branch, "pr", out.PRURL, "report", d.String(), "checkpoint", out.Checkpoint)
	}
	if res.Report == "" {
		res.Report = d.String()
	}
	if d.Fenced {
		res.Fenced = true
		res.Stage = job.Failed
		if !out.Failed() {
			out.Stage, out.Reason, out.Fenced = job.Failed, job.ReasonFenced, true
			out.Detail = "the coordinator refused the final report (409): another factory owns the job"
		}
	}
	if res.Err == nil && IsAuth(d.Err) {
		res.Err = d.Err
	}
	r.record(log, c.Job.ID, func(rec *jobstate.Record) { endRecord(rec, res, out, r.now()) })
}

// endRecord closes a job's record with its run's end. A fence the spool's
// drain learnt first (a spooled report re-sent by the background drain and
// answered 409, the job's later reports dropped) stays: the record must say
// why no report of this run reached the coordinator — found by the chaos
// run, where the final report's Send saw only "spooled".
func endRecord(rec *jobstate.Record, res *Result, out *runner.Outcome, now time.Time) {
	fenced := rec.Fenced || res.Fenced
	rec.Stage, rec.Reason, rec.Detail = res.Stage, out.Reason, out.Detail
	if fenced && !res.Fenced {
		rec.Detail = strings.TrimSpace(out.Detail + "; fenced when a spooled report was re-sent: another factory owns the job")
	}
	rec.Fenced = fenced
	if out.Checkpoint != "" {
		rec.Checkpoint = out.Checkpoint
	}
	rec.Branch, rec.PR = out.Branch, out.PRURL
	in := out.Insights
	rec.Insights = &in
	rec.EndedAt = now.UTC()
}

// upload sends the job's logs as artifacts once its terminal report is
// settled: tried within the upload budget when the report went through,
// spooled at once when the report itself was spooled (the coordinator is
// away), not at all for a fenced job (this factory reports nothing for it).
func (r *JobRunner) upload(ctx context.Context, log *slog.Logger, c *Claim, res *Result) {
	if r.Artifacts == nil {
		return
	}
	switch res.Report {
	case "delivered", "spooled", "rejected":
	default:
		return
	}
	actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), r.Artifacts.uploadBudget()+time.Second)
	defer cancel()
	ds := r.Artifacts.Upload(actx, c.Job.ID, c.LeaseEpoch, res.Attempt, res.Report == "spooled")
	for name, d := range ds {
		log.Debug("artifact", "name", name, "upload", d.String())
	}
}

// reportContext is the final report's context: it outlives the job's (a
// stopped aq still reports), bounded by the report's own budget; when aq is
// being stopped, the short drain budget applies, and the spool keeps the
// rest.
func (r *JobRunner) reportContext(ctx context.Context) (context.Context, context.CancelFunc) {
	b := r.Client.Budgets()
	limit := b.FinalReport
	if ctx.Err() != nil && b.Drain < limit {
		limit = b.Drain
	}
	return context.WithTimeout(context.WithoutCancel(ctx), limit+time.Second)
}

// ended closes the job's trace and tells the notifier where the job went:
// a failure is for good when the coordinator said so (failed, dead_letter)
// or, its answer unknown (spooled), when the job's retry policy says so.
func (r *JobRunner) ended(ctx context.Context, span trace.Span, c *Claim, res *Result) {
	o := res.Outcome
	telemetry.EndJob(span, telemetry.JobEnd{Stage: res.Stage, Reason: o.Reason, Fenced: res.Fenced, Insights: o.Insights,
		Branch: o.Branch, PRURL: o.PRURL, Report: res.Report})
	if res.Report == "released" || res.Report == "none" {
		return // never started here, or fenced: nothing of this factory's to announce
	}
	var title string
	final := res.Stage == job.Failed || res.Stage == job.DeadLetter
	if j := res.parsed; j != nil {
		title = j.Title
		if res.Report != "delivered" && o.Failed() {
			final = !job.Retryable(o.Reason, res.Attempt, j.Retry)
		}
	}
	r.Notifier.Notify(notify.End{JobID: res.JobID, Title: title, Repo: c.Job.Repo, Attempt: res.Attempt, Stage: res.Stage, Reason: o.Reason,
		Detail: o.Detail, Fenced: res.Fenced, Final: final, Branch: o.Branch, PRURL: o.PRURL, Insights: o.Insights, Mode: "fleet",
		TraceID: telemetry.TraceID(ctx)})
}

// endReport ends the final report's span with what became of it.
func endReport(span trace.Span, res *Result) {
	span.SetAttributes(attribute.String(telemetry.AttrReport, res.Report))
	if res.Report != "delivered" && res.Report != "none" {
		span.SetStatus(codes.Error, "report "+res.Report) // spooled, rejected, fenced: not taken now
	}
	span.End()
}

func (r *JobRunner) tracer() trace.Tracer {
	if r.Tracer != nil {
		return r.Tracer
	}
	return telemetry.Off().Tracer()
}

// refuse fails a job that did not pass admission, before anything touched
// the file system or git: /fleet/fail with the refusal's reason (not
// retryable for invalid_job and invalid_manifest; capability_mismatch may
// pass on another factory), which frees the lease at once. An id that is not
// a valid job id gets no record here (it would name a file).
func (r *JobRunner) refuse(ctx context.Context, c *Claim, ref *manifest.Refusal) *Result {
	id := c.Job.ID
	log := r.log().With("job", job.Show(id), "epoch", c.LeaseEpoch)
	detail := oneLine(ref.Msg)
	res := &Result{JobID: id, Attempt: c.Attempt(), LeaseEpoch: c.LeaseEpoch, Source: c.Source, Stage: job.Failed, Refused: true,
		Outcome: runner.Outcome{Stage: job.Failed, Reason: ref.Reason, Detail: detail}}
	log.Error("job refused before anything ran", "reason", ref.Reason, "why", detail)
	rctx, cancel := r.reportContext(ctx)
	defer cancel()
	rep := FailReport(FailRequest{JobID: id, FactoryID: r.Client.FactoryID(), LeaseEpoch: c.LeaseEpoch, Reason: ref.Reason,
		Retryable: !ref.Reason.Permanent(), Detail: detail})
	rep.Exhausted = ref.Reason.Permanent()
	d := r.Reporter.Send(rctx, rep)
	res.Report = d.String()
	if d.Delivered && d.Stage != "" {
		res.Stage = job.StageFromFleet(d.Stage)
	}
	if d.Fenced {
		res.Fenced = true
	}
	if IsAuth(d.Err) {
		res.Err = d.Err
	}
	if job.ValidID(id) {
		r.record(log, id, func(rec *jobstate.Record) {
			*rec = jobstate.Record{ID: id, Repo: c.Job.Repo, Stage: res.Stage, Reason: ref.Reason, Detail: detail, LeaseEpoch: c.LeaseEpoch,
				Source: c.Source, Fenced: res.Fenced, StartedAt: r.now().UTC(), EndedAt: r.now().UTC()}
			if res.Report == "rejected" {
				rec.ReportRefused = reportRefusal(d)
			}
		})
	}
	return res
}

func (r *JobRunner) record(log *slog.Logger, id string, fn func(*jobstate.Record)) {
	if r.Records == nil {
		return
	}
	if _, err := r.Records.Update(id, fn); err != nil {
		log.Error("cannot write the job record", "err", err)
	}
}

func (r *JobRunner) now() time.Time { return r.clock().Now() }

func (r *JobRunner) clock() Clock {
	if r.Clock != nil {
		return r.Clock
	}
	return RealClock{}
}

func (r *JobRunner) log() *slog.Logger {
	if r.Log != nil {
		return r.Log
	}
	return slog.New(slog.DiscardHandler)
}

func oneLine(s string) string {
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		return s[:i] + " …"
	}
	return s
}
