package fleet

import (
	"context"
	"log/slog"
	"os"
	"strings"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/aqfleet/aq/agent/jobstate"
	"github.com/aqfleet/aq/agent/lifecycle"
	"github.com/aqfleet/aq/agent/manifest"
	"github.com/aqfleet/aq/agent/notify"
	"github.com/aqfleet/aq/agent/runner"
	"github.com/aqfleet/aq/internal/brief"
	"github.com/aqfleet/aq/job"
	"github.com/aqfleet/aq/profiles"
)

// JobRunner takes one claimed job end to end, through the lifecycle both
// modes share (agent/lifecycle), recording it as claimedJob does: in
// jobstate, in heartbeats, with the coordinator — building (fenced), the
// lease held while the pipeline runs, and the final report, a fenced PATCH
// with the success stage or /fleet/fail so the lease frees at once, through
// the Reporter (which spools what the coordinator cannot take). After a 409
// it sends nothing more for the job: no success, no fail, and the runner has
// already refused to push or open a PR (split-brain guard).
type JobRunner struct {
	Client   *Client
	Pipeline lifecycle.Pipeline
	Reporter *Reporter
	Records  *jobstate.Store
	Running  *Running
	Catalog  *profiles.Catalog
	// Policy is what this factory runs (AQ_ENGINES): every job is admitted
	// under it before anything touches the file system or git
	// (manifest.Admit). The zero Policy allows every engine.
	Policy manifest.Policy
	// HostCheck, when set, says whether this host can run a job: it is
	// asked before the job starts and after a run that failed, and its
	// error (hostfault: $AQ_HOME full, read-only or failing) makes the job
	// fail host_unavailable — the host's fault, not the job's: the
	// coordinator gives it to another factory.
	HostCheck func() error
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
	// LeaseHooks are the jobs' leases' seams for tests (nil: none).
	LeaseHooks *LeaseHooks
	// OnEvent, if set, sees each running job's events (the daemon's job
	// phases).
	OnEvent func(jobID string, e runner.Event)
	// LiveLogs, when set, streams the engine's output to the coordinator
	// while the pipeline runs (livelog.go).
	LiveLogs *LiveLogs
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
	// ReportRefused says why the coordinator refused a report of the job
	// for good (its building report, which stops the job before its
	// engine, or its terminal report): the coordinator does not have what
	// it said; it is kept in $AQ_HOME/spool/dead. `aq run` exits 6.
	ReportRefused string `json:"reportRefused,omitempty"`
	// Err is a refusal of this factory's credentials seen while the job ran
	// (the fleet path must stop).
	Err error `json:"-"`
}

// Run runs the job of claim c through its lifecycle (agent/lifecycle: one
// trace from the claim to the final report, the notifier told how it ended;
// the steps of this mode are claimedJob's methods, below in their order).
// It always returns a Result.
func (r *JobRunner) Run(ctx context.Context, c *Claim) *Result {
	// Admission first: the coordinator's id names files and branches, its
	// manifest says what runs — nothing happens before both are checked
	// (manifest.Admit), so a refused job never enters the lifecycle.
	j, refused := manifest.Admit(manifest.Wire{ID: c.Job.ID, Repo: c.Job.Repo, Asked: c.Asked, BodyMd: c.Job.BodyMd}, r.Catalog, r.Policy)
	if refused != nil {
		return r.refuse(ctx, c, refused)
	}
	log := r.log().With("job", c.Job.ID, "repo", c.Job.Repo, "epoch", c.LeaseEpoch)
	cj := &claimedJob{r: r, c: c, j: j, log: log,
		res: &Result{JobID: c.Job.ID, Attempt: c.Attempt(), LeaseEpoch: c.LeaseEpoch, Source: c.Source, Stage: job.Building}}
	lc := lifecycle.Lifecycle{Pipeline: r.Pipeline, Tracer: r.Tracer, Notifier: r.Notifier, OnEvent: r.OnEvent}
	end := lc.Run(ctx, lifecycle.Job{ID: c.Job.ID, Repo: c.Job.Repo, Attempt: c.Attempt(), Checkpoint: c.Job.Checkpoint,
		Previous: r.previous(c, log), Mode: "fleet", Source: c.Source, Epoch: c.LeaseEpoch, Log: log}, cj)
	cj.res.Outcome = end.Outcome
	return cj.res
}

// previous is how the claimed job's previous attempt ended, for its
// engine (read before the job's record is rewritten for this run): the
// claim's previous (the coordinator's record, bounded); without one, this
// factory's own record when that attempt ran here (a record closed at an
// earlier lease epoch, not fenced); else nil — the runner then says only
// that the job resumes from a checkpoint, if it does.
func (r *JobRunner) previous(c *Claim, log *slog.Logger) *job.Previous {
	if p := c.Job.Previous; p != nil {
		return p.Bounded()
	}
	if r.Records == nil || c.Attempt() <= 1 {
		return nil
	}
	rec, err := r.Records.Get(c.Job.ID)
	if err != nil || rec.Running() || rec.Fenced || rec.Reason == "" || rec.Reason == job.ReasonFenced || rec.LeaseEpoch >= c.LeaseEpoch {
		return nil
	}
	log.Debug("the coordinator sent no previous attempt; using this factory's record of it", "reason", rec.Reason, "epoch", rec.LeaseEpoch)
	return job.PreviousOf(c.Attempt()-1, rec.Reason, rec.Detail, rec.Insights)
}

// claimedJob records one claimed job's life with the coordinator (reports,
// through the Reporter and its spool) and in its jobstate record: the
// fleet's lifecycle.Recorder.
type claimedJob struct {
	r     *JobRunner
	c     *Claim
	j     *job.Job // the admitted manifest
	log   *slog.Logger
	res   *Result
	lease *JobLease
	stop  context.CancelCauseFunc
	live  *LogStream // the run's live log, from Start to Report
}

var _ lifecycle.Recorder = (*claimedJob)(nil)

// Begin records the job (building) and lists it in heartbeats; then it
// holds the lease from now until the final report settles (lifecycle:
// Lease.End), renewing on its own context, so a stopped job's report
// still holds it. When aq is stopping before the job started, it gives the
// lease back instead (no attempt counted).
func (cj *claimedJob) Begin(ctx context.Context, stop context.CancelCauseFunc) (lifecycle.Lease, *lifecycle.End) {
	r, c, id := cj.r, cj.c, cj.c.Job.ID
	cj.log.Info("job claimed", "stage", job.Building, "source", c.Source, "attempt", cj.res.Attempt)
	r.record(cj.log, id, func(rec *jobstate.Record) {
		*rec = jobstate.Record{ID: id, Repo: c.Job.Repo, Stage: job.Building, LeaseEpoch: c.LeaseEpoch, Checkpoint: c.Job.Checkpoint,
			Source: c.Source, PID: os.Getpid(), StartedAt: r.now().UTC()}
	})
	if r.Running != nil {
		r.Running.Add(id, c.LeaseEpoch)
	}
	if ctx.Err() != nil {
		cj.release(ctx)
		return nil, &lifecycle.End{Outcome: cj.res.Outcome, Settled: cj.settled()}
	}
	cj.stop = stop
	cj.lease = NewJobLease(r.Client, c, r.LeaseRenew, stop, r.clock(), cj.log)
	cj.lease.Failed = r.RenewFailed
	cj.lease.Hooks = r.LeaseHooks
	cj.lease.Start(context.WithoutCancel(ctx))
	return cj.lease, nil
}

// release gives back the lease of a job that never started here.
func (cj *claimedJob) release(ctx context.Context) {
	r, res := cj.r, cj.res
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), r.Client.Budgets().Release+time.Second)
	defer cancel()
	res.Outcome = runner.Outcome{Stage: job.Failed, Reason: job.ReasonInterrupted, Detail: "aq was stopped before the job started"}
	res.Stage, res.Report = job.Inbox, "released"
	if err := r.Client.Release(rctx, cj.c.Job.ID, cj.c.LeaseEpoch); err != nil {
		// The reaper frees it when the lease expires.
		res.Stage, res.Report = job.Building, "none"
		cj.log.Warn("cannot release the lease; the coordinator's reaper will", "err", err)
	} else {
		cj.log.Info("lease released: the job never started here", "stage", job.Inbox)
	}
	r.record(cj.log, cj.c.Job.ID, func(rec *jobstate.Record) {
		rec.Stage, rec.Reason, rec.Detail, rec.EndedAt = res.Stage, res.Outcome.Reason, res.Outcome.Detail, r.now().UTC()
	})
}

// Parse is the job's manifest, as admission parsed and checked it before
// the job began (JobRunner.Run); it is recorded.
func (cj *claimedJob) Parse() (*job.Job, error) {
	j := cj.j
	cj.r.record(cj.log, cj.c.Job.ID, func(rec *jobstate.Record) { rec.Repo, rec.Base, rec.Engine = j.Repo, j.Base, j.Engine })
	return j, nil
}

// Start reports assigned → building, fenced: a 409 here means the job is
// already someone else's, before any work.
func (cj *claimedJob) Start(ctx context.Context, _ *job.Job) *runner.Outcome {
	if err := cj.r.hostFault(); err != nil {
		cj.log.Error("this host cannot run the job: released for another factory", "reason", job.ReasonHostUnavailable, "err", err)
		return &runner.Outcome{Stage: job.Failed, Reason: job.ReasonHostUnavailable, Detail: brief.Head(err.Error()) + "; the job did not start"}
	}
	d := cj.r.Reporter.Send(ctx, PatchReport(cj.c.Job.ID, PatchRequest{Stage: job.Building.FleetName(), LeaseEpoch: cj.c.LeaseEpoch}))
	switch {
	case d.Fenced:
		_ = cj.lease.Fence("the coordinator refused the building report (409)") // the lease's state now; the outcome says the same
		return &runner.Outcome{Stage: job.Failed, Reason: job.ReasonFenced, Detail: "fenced before the job started", Fenced: true}
	case IsAuth(d.Err):
		cj.res.Err = d.Err
		cj.stop(job.Stop(job.ReasonInterrupted, "the coordinator refused this factory's credentials"))
	case d.Rejected:
		// The coordinator will not take this job's reports: running it would
		// spend an engine run on a result nobody records.
		cj.res.ReportRefused = reportRefusal(d)
		cj.log.Error("the coordinator refused the building report; the job is stopped before its engine", "err", d.Err)
		return &runner.Outcome{Stage: job.Failed, Reason: job.ReasonReportRefused,
			Detail: "the coordinator refused the building report (" + brief.Head(errText(d.Err)) + "): the job was stopped before its engine"}
	}
	// The engine's output goes to the coordinator while the pipeline runs;
	// a chunk refused 409 fences the run at once.
	cj.live = cj.r.LiveLogs.Start(context.WithoutCancel(ctx), cj.c, cj.lease, cj.log)
	return nil
}

// Event records what the coordinator and a restarted aq need of the run:
// its checkpoints, and its delivered result.
func (cj *claimedJob) Event(ctx context.Context, e runner.Event) {
	id := cj.c.Job.ID
	switch e := e.(type) {
	case runner.Checkpointed:
		cj.r.record(cj.log, id, func(rec *jobstate.Record) { rec.Checkpoint = e.Checkpoint })
	case runner.CheckpointPushed:
		// Recorded with the coordinator, so its reaper and a preemption keep
		// it: the next owner resumes from it. A coordinator that cannot take
		// it now gets it from the spool.
		cj.r.Reporter.Send(ctx, PatchReport(id, PatchRequest{Stage: job.Building.FleetName(), LeaseEpoch: cj.c.LeaseEpoch, Checkpoint: e.Checkpoint}))
	case runner.Delivered: // durably, before the report: a crash from here on must not run the engine again
		cj.r.record(cj.log, id, func(rec *jobstate.Record) { rec.Branch, rec.Delivered = e.Branch, e.Commit })
	}
}

// Report sends the final report — a fenced PATCH with the success stage,
// or /fleet/fail so the lease frees at once; nothing for a fenced job —
// through the Reporter, and closes the job's record. j is nil when the
// manifest did not parse (no retry policy: a coordinator without
// /fleet/fail is told the job is exhausted).
func (cj *claimedJob) Report(ctx context.Context, k lifecycle.Kind, j *job.Job, out *runner.Outcome) lifecycle.Settled {
	r, c, res, log := cj.r, cj.c, cj.res, cj.log
	// The live log's last chunks and its end go before the report, so that
	// whoever sees the job end has seen its output; a fenced run sends
	// nothing more.
	cj.live.Close(ctx, k != lifecycle.Fenced)
	rctx, cancel := r.reportContext(ctx)
	defer cancel()
	var d Delivery
	switch k {
	case lifecycle.Fenced:
		res.Fenced, res.Stage, res.Report = true, job.Failed, "none"
		log.Warn("job fenced: another factory owns it; nothing is reported or shipped", "stage", job.Failed, "reason", job.ReasonFenced, "checkpoint", out.Checkpoint)
	case lifecycle.Parked:
		// The engine's account hit a limit: release the lease with the
		// reset, so the job waits (on this factory or another) without a
		// retry spent. A coordinator without /fleet/fail gets the same
		// through the route fallback (PATCH queued + release).
		d = r.Reporter.Send(rctx, FailReport(FailRequest{
			JobID: c.Job.ID, FactoryID: r.Client.FactoryID(), LeaseEpoch: c.LeaseEpoch, Reason: out.Reason,
			Retryable: true, Checkpoint: onOrigin(out), Detail: out.Detail, NotBefore: out.ParkedUntil,
		}))
		res.Stage = job.Inbox
		if d.Delivered && d.Stage != "" {
			res.Stage = job.StageFromFleet(d.Stage)
		}
		log.Warn("job parked: lease released until the engine's limit resets", "parked", out.Parked, "until", out.ParkedUntil.Format(time.RFC3339),
			"detail", out.Detail, "stage", res.Stage, "report", d.String(), "checkpoint", out.Checkpoint)
	case lifecycle.Failed:
		// A run that failed on a host that cannot write $AQ_HOME failed
		// for the host's sake (an engine's "I/O error", a checkpoint that
		// could not be written): the host's fault, not the job's.
		if out.Reason != job.ReasonHostUnavailable {
			if err := r.hostFault(); err != nil {
				log.Error("the run failed on a host that cannot write $AQ_HOME: host_unavailable", "run", out.Reason, "err", err)
				out.Detail = brief.Head(err.Error()) + "; the run ended " + string(out.Reason) + ": " + out.Detail
				out.Reason = job.ReasonHostUnavailable
			}
		}
		// Also for lease_lost: the fail carries our epoch, so it is fenced
		// (409) if the coordinator reaped the lease, and frees the lease at
		// once if it did not.
		in := out.Insights
		rep := FailReport(FailRequest{
			JobID: c.Job.ID, FactoryID: r.Client.FactoryID(), LeaseEpoch: c.LeaseEpoch, Reason: out.Reason,
			Retryable: !out.Reason.Permanent(), Checkpoint: onOrigin(out), Detail: out.Detail, Insights: &in,
		})
		// For a coordinator without /fleet/fail, which leaves the retry
		// decision to the factory (failpatch.go).
		rep.Exhausted = j == nil || !job.Retryable(out.Reason, c.Attempt(), j.Retry)
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
	if d.Rejected {
		res.ReportRefused = reportRefusal(d)
		log.Error("the coordinator refused the job's terminal report: it does not have the job's outcome", "report", "rejected", "err", d.Err)
	}
	r.record(log, c.Job.ID, func(rec *jobstate.Record) { endRecord(rec, res, out, r.now()) })
	return cj.settled()
}

// onOrigin is the checkpoint a failure's report names: the run's own when
// it was pushed, else the one origin had (an earlier attempt's, or a
// periodic one this run pushed before its lease was lost), else none. The
// WIP of a run whose lease was lost stays on this host (docs/fleet.md,
// "Lease lost"): naming it would send the next factory after a commit it
// cannot fetch.
func onOrigin(out *runner.Outcome) string {
	if out.WIPPushed {
		return out.Checkpoint
	}
	return out.OriginCheckpoint
}

// settled is the job's end as far as the lifecycle needs it.
func (cj *claimedJob) settled() lifecycle.Settled {
	res := cj.res
	return lifecycle.Settled{Stage: res.Stage, Known: res.Report == "delivered", Fenced: res.Fenced, Report: res.Report,
		Silent: res.Report == "released" || res.Report == "none", Err: res.Err}
}

// Close runs once the lease ended: a refusal of this factory's credentials
// a renewal saw is the run's error, the job's logs go up as artifacts, and
// heartbeats no longer list it.
func (cj *claimedJob) Close(ctx context.Context, _ *lifecycle.End) {
	if cj.lease != nil && cj.res.Err == nil {
		cj.res.Err = cj.lease.AuthErr()
	}
	cj.r.upload(ctx, cj.log, cj.c, cj.res)
	if cj.r.Running != nil {
		cj.r.Running.Remove(cj.c.Job.ID)
	}
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
	rec.ReportRefused = res.ReportRefused
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

// refuse fails a job that did not pass admission, before anything touched
// the file system or git: /fleet/fail with the refusal's reason (not
// retryable for invalid_job and invalid_manifest; capability_mismatch may
// pass on another factory), which frees the lease at once. An id that is not
// a valid job id gets no record here (it would name a file). The notifier
// hears of it (a refused job ends, usually for good); no trace is started
// for a job that never began.
func (r *JobRunner) refuse(ctx context.Context, c *Claim, ref *manifest.Refusal) *Result {
	id := c.Job.ID
	log := r.log().With("job", job.Show(id), "epoch", c.LeaseEpoch)
	detail := brief.Head(ref.Msg)
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
	res.Fenced = d.Fenced
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
	if !d.Fenced {
		final := res.Stage == job.Failed || res.Stage == job.DeadLetter || ref.Reason.Permanent()
		r.Notifier.Notify(notify.End{JobID: id, Repo: c.Job.Repo, Attempt: res.Attempt, Stage: res.Stage, Reason: ref.Reason,
			Detail: detail, Final: final, Mode: "fleet"})
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

// hostFault is HostCheck's verdict (nil without one).
func (r *JobRunner) hostFault() error {
	if r.HostCheck == nil {
		return nil
	}
	return r.HostCheck()
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
