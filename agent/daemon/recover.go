package daemon

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	"github.com/aqfleet/aq/agent/fleet"
	"github.com/aqfleet/aq/agent/jobstate"
	"github.com/aqfleet/aq/agent/runner"
	"github.com/aqfleet/aq/internal/abandon"
	"github.com/aqfleet/aq/internal/process"
	"github.com/aqfleet/aq/internal/shipcheck"
	"github.com/aqfleet/aq/job"
	"github.com/aqfleet/aq/worktree"
)

// recoverBudget bounds the recovery of one orphan (kill ladder, checkpoint,
// push, report).
const recoverBudget = 3 * time.Minute

// recover finds the jobs a previous aq on this home was running when it died
// (their records still say running, their job lock is free and their aq
// process is gone) and, one by one, before any new work: kills what still
// carries the job's tag, checkpoints the worktree, pushes the WIP ref with a
// compare-and-swap if the coordinator confirms this factory still holds the
// lease (a renewal at the recorded epoch), and reports /fleet/fail
// (crash, retryable) at the recorded epoch so the lease frees at once. A 409
// on the renewal means the coordinator moved on (reaped or requeued): the
// checkpoint stays local and nothing is reported.
func (d *Daemon) recover(ctx context.Context) {
	recs, errs := d.agent.Jobs.Records.List()
	for _, err := range errs {
		d.log.Warn("a job record cannot be read; it is left as it is", "err", err)
	}
	for _, r := range recs {
		if !r.Running() {
			continue
		}
		if why := d.alive(r); why != "" {
			d.log.Info("a job record says running and its aq may still run it; left alone", "job", r.ID, "why", why)
			continue
		}
		if ctx.Err() != nil {
			return
		}
		d.recoverOne(ctx, r)
		if d.fatalErr() != nil {
			return
		}
	}
}

// alive says why record r may belong to a live aq ("" when it is an orphan).
func (d *Daemon) alive(r jobstate.Record) string {
	held, err := worktree.Held(d.cfg.LocksDir(), worktree.JobLockName(r.ID))
	switch {
	case err != nil:
		return "cannot probe the job's lock: " + err.Error()
	case held:
		return "its job lock is held"
	case r.PID > 0 && r.PID != os.Getpid() && process.Alive(r.PID) && !before(r.StartedAt, bootTime()):
		// An older `aq run` (which took no job lock), or a reused pid: when unsure,
		// never steal a live job; the coordinator's reaper frees a dead one.
		return fmt.Sprintf("its aq process (pid %d) is alive", r.PID)
	}
	return ""
}

func (d *Daemon) recoverOne(parent context.Context, r jobstate.Record) {
	cfg := d.cfg
	lock, ok, err := worktree.TryLockJob(cfg.LocksDir(), r.ID)
	if err != nil || !ok {
		return // taken meanwhile
	}
	defer lock.Unlock()
	ctx, cancel := context.WithTimeout(context.WithoutCancel(parent), recoverBudget)
	defer cancel()
	log := d.log.With("job", r.ID, "repo", r.Repo, "epoch", r.LeaseEpoch)
	log.Warn("recovering an orphaned job: the aq that ran it is gone", "pid", r.PID, "startedAt", r.StartedAt)

	// 1. Whatever still carries the job's tag (the engine outlives aq in its
	// own process group) is stopped, so the checkpoint is final.
	if n, err := process.StopScoped(ctx, r.ID, runner.Scope(cfg.Home), cfg.KillGrace); err != nil && !errors.Is(err, errors.ErrUnsupported) {
		log.Warn("cannot stop the orphan's processes", "err", err)
	} else if n > 0 {
		log.Warn("stopped the orphan's processes", "count", n)
	}

	// 2. Checkpoint the worktree.
	git := worktree.Git{}
	wipRef := "refs/heads/" + job.WIPBranch(r.ID)
	wt := filepath.Join(cfg.WorktreesDir(), r.Repo, r.ID)
	repoDir := filepath.Join(cfg.RepoBase, r.Repo)
	sha := ""
	if _, err := os.Stat(wt); err == nil {
		s, err := worktree.Checkpoint(ctx, git, wt, wipRef, fmt.Sprintf("aq checkpoint: %s (recovered after aq died)\n\naq-job: %s", r.ID, r.ID))
		var partial *worktree.PartialError
		if errors.As(err, &partial) {
			s, err = partial.SHA, nil
		}
		if err != nil {
			log.Error("cannot checkpoint the orphan's worktree; it is kept as it is", "worktree", wt, "err", err)
		} else {
			sha = s
			log.Info("checkpointed the orphan's worktree", "checkpoint", sha)
		}
	}

	// 3. Does this factory still hold the lease? Only then may origin's WIP
	// ref move (another factory may be working from it otherwise).
	lease, fenced := d.confirmLease(ctx, log, r)
	if fleet.IsAuth(d.fatalErr()) {
		return
	}
	held := lease != nil
	if held {
		// Hold the lease from here until the report settles: a report the
		// coordinator is slow to take (503s, a restart) must not outlive
		// it, or the reaper, not the fail, frees it (found by the chaos
		// harness).
		lease.Start(ctx)
		defer lease.End()
	}

	// 4. Push the WIP ref: a compare-and-swap against what origin has now.
	pushed := false
	refused := ""
	if held && sha != "" && worktree.HasRemote(ctx, git, repoDir, "origin") {
		cur, _, err := worktree.RemoteRef(ctx, git, repoDir, "origin", wipRef)
		if err == nil {
			// Checked like every push (docs/sandbox.md, "What ships is
			// checked"). The job's may_change is not known here: a
			// protected path keeps the checkpoint local too, and the next
			// attempt's run checks it with its manifest.
			var res *shipcheck.Result
			res, err = runner.PushCheck{Git: git, Redactor: d.o.Redactor, Shipper: d.o.Parts.Shipper, Protected: cfg.ProtectedPaths}.
				Check(ctx, repoDir, r.Engine, nil, sha, cur)
			switch {
			case err != nil:
				err = fmt.Errorf("cannot check what it adds to origin: %w", err)
			case len(res.Secrets) > 0:
				refused = "it holds a secret this factory holds: " + res.SecretLine()
			case len(res.Protected) > 0:
				refused = "it touches protected paths: " + res.ProtectedLine()
			}
		}
		if err == nil && refused != "" {
			log.Error("not pushing the orphan's WIP checkpoint: "+refused+"; it is kept on this host", "checkpoint", sha)
		} else if err == nil {
			err = worktree.PushWithLease(ctx, git, repoDir, "origin", wipRef, wipRef, cur)
		}
		switch {
		case refused != "":
		case err != nil:
			log.Warn("cannot push the orphan's WIP checkpoint; it is kept locally", "err", err)
		default:
			pushed = true
			log.Info("pushed the orphan's WIP checkpoint", "ref", job.WIPBranch(r.ID), "checkpoint", sha)
		}
	}

	// 5. Report: the lease frees at once, the job is retried elsewhere — as
	// interrupted when its aq gave up on a step after a stop signal
	// (internal/abandon), else as a crash.
	reason, recDetail := job.ReasonCrash, "aq died while the job ran; recovered at start-up"
	abandoned, ok := abandon.Take(cfg.Home, r.ID, r.PID)
	if ok {
		reason, recDetail = job.ReasonInterrupted, abandoned+"; recovered at start-up"
	}
	result := "fenced"
	stage := job.Failed
	if !fenced {
		cp := ""
		if pushed {
			cp = sha
		}
		detail := fmt.Sprintf("the aq process that ran the job (pid %d) died; recovered at the next start", r.PID)
		if abandoned != "" {
			detail = abandoned + "; recovered at the next start"
		}
		if refused != "" {
			detail += "; its checkpoint was not pushed (" + refused + ")"
		}
		if r.Delivered != "" {
			// The next attempt finds the result on origin and reports it
			// without running the engine (runner: deliveredOnOrigin).
			detail += fmt.Sprintf("; its result %.10s was already on origin (%s): the next attempt reports it, the engine does not run again", r.Delivered, r.Branch)
		}
		dl := d.agent.Reporter.Send(ctx, fleet.FailReport(fleet.FailRequest{
			JobID: r.ID, FactoryID: d.agent.Client.FactoryID(), LeaseEpoch: r.LeaseEpoch, Reason: reason, Retryable: true,
			Checkpoint: cp, Detail: detail,
		}))
		result = dl.String()
		fenced = dl.Fenced
		if dl.Delivered && dl.Stage != "" {
			stage = job.StageFromFleet(dl.Stage)
			result = "reported:" + dl.Stage
		}
		if fleet.IsAuth(dl.Err) {
			d.fail(dl.Err)
		}
		log.Warn("orphan reported", "stage", stage, "reason", reason, "report", dl.String())
	} else {
		log.Warn("orphan not reported: the coordinator has moved on (409); its checkpoint stays local", "stage", stage, "checkpoint", sha)
	}
	if _, err := d.agent.Jobs.Records.Update(r.ID, func(rec *jobstate.Record) {
		rec.Stage, rec.Reason, rec.Fenced, rec.EndedAt = stage, reason, fenced, time.Now().UTC()
		rec.Detail = recDetail
		if sha != "" {
			rec.Checkpoint = sha
		}
	}); err != nil {
		log.Error("cannot close the job record", "err", err)
	}
	d.m.orphans.WithLabelValues(result).Inc()
	d.mu.Lock()
	d.recovered = append(d.recovered, r.ID)
	d.mu.Unlock()
}

// confirmLease renews r's lease at its recorded epoch: held when the
// coordinator takes it, fenced on 409/404. Anything else (the coordinator is
// unreachable) is neither: the WIP ref stays local and the report is
// spooled.
func (d *Daemon) confirmLease(ctx context.Context, log *slog.Logger, r jobstate.Record) (lease *fleet.JobLease, fenced bool) {
	cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	le, err := d.agent.Client.Renew(cctx, r.ID, r.LeaseEpoch)
	switch {
	case err == nil:
		cl := &fleet.Claim{Job: fleet.Job{ID: r.ID, Repo: r.Repo}, LeaseEpoch: r.LeaseEpoch, LeaseExpiresAt: le.ExpiresAt, LocalExpiry: le.LocalExpiry}
		// Nothing runs under this lease any more: were it lost, there is no
		// job to stop (the report that follows is fenced or not on its own).
		return fleet.NewJobLease(d.agent.Client, cl, d.cfg.LeaseRenew, func(error) {}, nil, log), false
	case fleet.IsFenced(err), errors.Is(err, fleet.ErrGone):
		log.Info("the orphan's lease is no longer this factory's", "err", err)
		return nil, true
	case fleet.IsAuth(err):
		d.fail(err)
		return nil, false
	}
	log.Warn("cannot confirm the orphan's lease; its WIP stays local", "err", err)
	return nil, false
}
