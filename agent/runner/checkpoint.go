package runner

// Checkpoint: the WIP commit on aq/wip/<id>, taken on every exit path after
// the engine, and its compare-and-swap push while the lease is held.

import (
	"context"
	"errors"
	"fmt"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"

	"github.com/aqfleet/aq/internal/telemetry"
	"github.com/aqfleet/aq/job"
	"github.com/aqfleet/aq/worktree"
)

// wipLeaseMargin is how far from its expiry a lease must be for the WIP
// checkpoint to be pushed (the push itself is a compare-and-swap besides).
const wipLeaseMargin = 5 * time.Second

func (ru *run) checkpointMessage(why string) string {
	if ru.round > 0 {
		why += fmt.Sprintf(", repair round %d", ru.round)
	}
	return fmt.Sprintf("aq checkpoint: %s (%s)\n\naq-job: %s\naq-attempt: %d", ru.j.ID, why, ru.j.ID, ru.o.Attempt)
}

// checkpoint commits everything in the worktree to aq/wip/<id> — once per
// engine run, after the engine is dead (the attempt's first run and each
// repair round) — and pushes it to origin unless the job is fenced (a job
// without a verify command pushes it with its result instead, or alone
// before the run reports: pushWithResult, flushWIP). It runs on a context
// that cannot be cancelled, with its own time limit.
func (ru *run) checkpoint(parent context.Context) {
	if ru.wtPath == "" {
		return
	}
	if ru.out.Reason == job.ReasonDiskExceeded {
		ru.diskExceeded(parent) // no checkpoint of the oversized tree
		return
	}
	ru.cpMu.Lock()
	done := ru.cpRound == ru.round
	if !done {
		// This run's: until it is taken, no checkpoint stands for the
		// worktree (the result is then squashed from the worktree itself).
		ru.cpRound, ru.cpAfter, ru.cpPartial, ru.cpSeen = ru.round, "", false, worktree.Seen{}
	}
	ru.cpMu.Unlock()
	if done {
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(parent), 2*time.Minute)
	defer cancel()
	ctx, span := ru.step(ctx, telemetry.SpanCheckpoint, attribute.String(telemetry.AttrCheckpointKind, "final"))
	var taken string
	pushed := false
	defer func() {
		span.SetAttributes(attribute.String(telemetry.AttrCheckpoint, taken), attribute.Bool(telemetry.AttrCheckpointPush, pushed))
		if taken == "" {
			span.SetStatus(codes.Error, "checkpoint failed")
		}
		span.End()
	}()
	ru.cpMu.Lock()
	defer ru.cpMu.Unlock()
	wip := "refs/heads/" + job.WIPBranch(ru.j.ID)
	sha, seen, partial, err := ru.snapshot(ctx, wip, "after the engine", nil)
	if partial {
		ru.cpPartial = true
	}
	ru.cpSeen = seen
	if err != nil || sha == "" {
		ru.log.Error("checkpoint failed: the worktree is kept as it is", "worktree", ru.wtPath, "err", err)
		if ru.lastPeriodic != "" { // the last periodic one is what there is
			ru.out.Checkpoint = ru.lastPeriodic
			ru.out.WIPPushed = ru.wipOnOrigin == ru.lastPeriodic
		}
		return
	}
	ru.out.Checkpoint, ru.cpAfter, taken = sha, sha, sha
	if sha != seen.Head {
		ru.madeCommit(sha, seen.Parents)
	}
	ru.out.WIPPushed = false // an earlier run's push is not this one's
	ru.log.Info("checkpointed", "checkpoint", sha, "ref", job.WIPBranch(ru.j.ID))
	ru.event(Checkpointed{Checkpoint: sha})
	if ru.fencedNow(parent) || !ru.hasOrigin(ctx) {
		return
	}
	if ru.pushWithResult && ru.round == 0 {
		// Pushed with the result, in one atomic push (deliver.go), or
		// alone before the run reports (flushWIP): nothing runs between
		// here and the result's push but its commit.
		ru.wipPending = sha
		return
	}
	// A fleet job pushes its WIP only while it still holds the lease:
	// after a fence (or a lease it cannot confirm) another factory may be
	// working from origin's checkpoint, which must not move under it. As
	// for a periodic push, a renewal confirms it first: a preemption the
	// local view has not learnt yet would let the push land after the new
	// owner took the job (found by the chaos run).
	if ru.o.Lease != nil && !ru.leaseForPush(ctx) {
		ru.log.Warn("not pushing the WIP checkpoint: this factory may no longer hold the job's lease; it is kept locally")
		return
	}
	if err := ru.pushWIP(ctx, wip, sha); err != nil {
		if !errors.Is(err, errPushRefused) {
			ru.log.Warn("cannot push the WIP checkpoint to origin; it is kept locally", "err", err)
		}
		return
	}
	ru.out.WIPPushed, pushed = true, true
}

// flushWIP pushes the checkpoint after the engine that waited to go with
// the result (pushWithResult) when the result's push did not take it: on
// every way out of the run — the engine failed, there was no change, the
// result could not be committed or pushed, the run was stopped — before
// the run reports, as checkpoint would have pushed it. It runs on a context
// that cannot be cancelled, with its own time limit.
func (ru *run) flushWIP(parent context.Context) {
	ru.cpMu.Lock()
	defer ru.cpMu.Unlock()
	sha := ru.wipPending
	if sha == "" {
		return
	}
	ru.wipPending = ""
	ctx, cancel := context.WithTimeout(context.WithoutCancel(parent), 2*time.Minute)
	defer cancel()
	if ru.fencedNow(parent) || !ru.hasOrigin(ctx) {
		return
	}
	if ru.o.Lease != nil && !ru.leaseForPush(ctx) {
		ru.log.Warn("not pushing the WIP checkpoint: this factory may no longer hold the job's lease; it is kept locally")
		return
	}
	wip := "refs/heads/" + job.WIPBranch(ru.j.ID)
	if err := ru.pushWIP(ctx, wip, sha); err != nil {
		if !errors.Is(err, errPushRefused) {
			ru.log.Warn("cannot push the WIP checkpoint to origin; it is kept locally", "err", err)
		}
		return
	}
	ru.out.WIPPushed = true
}

// fencedNow reports whether the job's context says another factory owns it.
func (ru *run) fencedNow(ctx context.Context) bool {
	r, _, ok := job.StopReason(ctx)
	return ru.out.Fenced || (ok && r == job.ReasonFenced)
}

// startPeriodic takes a checkpoint every CheckpointInterval while the engine
// runs (until ctx is done or the returned stop is called, which waits for a
// checkpoint in progress and stops the worktree's watcher). It never
// disturbs the engine: the snapshot is built in aq's own index
// (worktree.Checkpointer) and never takes the worktree's index.lock. Its
// cost follows what changed since the last one (the first is a full scan).
func (ru *run) startPeriodic(ctx context.Context) (stop func()) {
	every := ru.r.Cfg.CheckpointInterval
	if every <= 0 || ru.wtPath == "" {
		return func() {}
	}
	ru.cpr = &worktree.Checkpointer{Git: ru.r.Git, Path: ru.wtPath, Watch: true}
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				ru.periodicCheckpoint(ctx)
			}
		}
	}()
	return func() {
		cancel()
		<-done
		ru.cpr.Close()
		ru.log.Debug("periodic checkpoints", "stats", fmt.Sprintf("%+v", ru.cpr.Stats))
	}
}

// periodicCheckpoint records the worktree on aq/wip/<id> and, until origin
// has it, pushes it where the final checkpoint would go: as a
// compare-and-swap, in fleet mode only while the lease is held. Nothing
// changed since the last push: no commit, no push.
func (ru *run) periodicCheckpoint(ctx context.Context) {
	ctx, span := ru.step(ctx, telemetry.SpanCheckpoint, attribute.String(telemetry.AttrCheckpointKind, "periodic"))
	var sha string
	pushed, ok := false, true
	defer func() {
		span.SetAttributes(attribute.String(telemetry.AttrCheckpoint, sha), attribute.Bool(telemetry.AttrCheckpointPush, pushed))
		if !ok {
			span.SetStatus(codes.Error, "periodic checkpoint failed")
		}
		span.End()
	}()
	ru.cpMu.Lock()
	defer ru.cpMu.Unlock()
	wip := "refs/heads/" + job.WIPBranch(ru.j.ID)
	sha, _, _, err := ru.snapshot(ctx, wip, "periodic", ru.cpr)
	if err != nil || sha == "" {
		ok = ctx.Err() != nil
		if ctx.Err() == nil {
			ru.log.Warn("periodic checkpoint failed; the next one tries again", "err", err)
		}
		return
	}
	if sha == ru.start {
		return // nothing done yet
	}
	if sha != ru.lastPeriodic {
		ru.lastPeriodic = sha
		ru.log.Info("periodic checkpoint", "checkpoint", sha)
		ru.event(Checkpointed{Checkpoint: sha})
	}
	// An unchanged tree whose last push was skipped or failed is pushed
	// now: the work must reach origin even if the engine writes no more.
	if sha == ru.wipOnOrigin || ru.fencedNow(ctx) || !ru.hasOrigin(ctx) {
		return
	}
	if ru.o.Lease != nil && !ru.leaseForPush(ctx) {
		ru.log.Warn("not pushing the periodic checkpoint: the lease may no longer be this factory's")
		return
	}
	if err := ru.pushWIP(ctx, wip, sha); err != nil {
		if ctx.Err() == nil && !errors.Is(err, errPushRefused) {
			ru.log.Warn("cannot push the periodic checkpoint; it is kept locally", "err", err)
		}
		return
	}
	pushed = true
	ru.event(CheckpointPushed{Checkpoint: sha})
}

// pushWIP pushes checkpoint sha (on wip) to origin as a compare-and-swap
// against what origin holds. Call it with cpMu held. A push that fails or
// is stopped (a periodic one, when the engine ends) may have landed all the
// same: git updates origin's ref before it reports. Its checkpoint is then
// in doubt, and the next push asks origin first; if origin holds that very
// checkpoint it is the value to swap from — without this, the final
// checkpoint's push was refused as stale and stayed on this host.
func (ru *run) pushWIP(ctx context.Context, wip, sha string) error {
	if doubt := ru.wipInDoubt; doubt != "" {
		refs, err := worktree.ListRemoteRefs(ctx, ru.r.Git, ru.repoDir, "origin", wip)
		if err == nil {
			ru.wipInDoubt = ""
			for _, r := range refs {
				if r.Name == wip && r.SHA == doubt {
					ru.log.Debug("a checkpoint push that seemed to fail had landed", "checkpoint", doubt)
					ru.wipOnOrigin = doubt
				}
			}
		}
	}
	if sha == ru.wipOnOrigin {
		return nil
	}
	if !ru.pushAllowed(ctx, "the WIP checkpoint", sha, ru.wipOnOrigin, ru.jobOnOrigin) {
		return errPushRefused
	}
	if err := worktree.PushWithLease(ctx, ru.r.Git, ru.repoDir, "origin", wip, wip, ru.wipOnOrigin); err != nil {
		ru.wipInDoubt = sha
		return err
	}
	ru.wipOnOrigin, ru.wipInDoubt = sha, ""
	return nil
}

// errPushRefused: the push was not made, what it would add was refused
// or could not be checked (pushAllowed said why).
var errPushRefused = errors.New("the push was refused by the change check")

// confirmBeforePush bounds the renewal a periodic push waits for.
const confirmBeforePush = 5 * time.Second

// leaseForPush says whether a periodic checkpoint may be pushed: the lease
// confirmed by a renewal right before (a preemption is learnt only at a
// renewal: without one, a push could land after the job went to another
// factory — found by the chaos run), or, when the coordinator does not
// answer in time, the lease held on the local view with a margin (an
// outage must not keep the work off origin). A fenced or lost lease never.
func (ru *run) leaseForPush(ctx context.Context) bool {
	cctx, cancel := context.WithTimeout(ctx, confirmBeforePush)
	err := ru.o.Lease.Confirm(cctx)
	timedOut := cctx.Err() != nil && ctx.Err() == nil
	cancel()
	var stop *job.StopError
	switch {
	case err == nil:
		return true
	case ctx.Err() != nil:
		return false
	case !timedOut && errors.As(err, &stop):
		return false // fenced (preempted) or lost
	}
	return ru.o.Lease.Held(wipLeaseMargin)
}

// snapshot checkpoints the worktree on wip, with cpr's incremental way when
// given (periodic checkpoints), else worktree.Checkpoint's exact scan (the
// checkpoint after the engine, which must not trust a watcher: what that
// scan read of HEAD, the job branch and base's tree comes back in seen,
// for the result commit right after it). A partial checkpoint (files git
// could not read were left out) is a checkpoint, with partial set.
func (ru *run) snapshot(ctx context.Context, wip, why string, cpr *worktree.Checkpointer) (sha string, seen worktree.Seen, partial bool, err error) {
	if cpr != nil {
		sha, err = cpr.Checkpoint(ctx, wip, ru.checkpointMessage(why))
	} else {
		sha, seen, err = worktree.CheckpointSeen(ctx, ru.r.Git, ru.wtPath, wip, ru.checkpointMessage(why), ru.seenNames()...)
	}
	var pe *worktree.PartialError
	if errors.As(err, &pe) {
		ru.log.Warn("checkpoint is partial: some paths could not be recorded", "why", why, "err", err)
		return pe.SHA, seen, true, nil
	}
	return sha, seen, false, err
}

// seenNames are what the result commit reads of the repository besides
// HEAD and the checkpoint's tree (commitFromCheckpoint): the job branch and
// base's tree, asked in the checkpoint's own git.
func (ru *run) seenNames() []string {
	if ru.baseSHA == "" {
		return nil
	}
	return []string{"refs/heads/" + job.JobBranch(ru.j.ID), ru.baseSHA + "^{tree}"}
}

// clearRefLocks removes the locks a dead git left on this job's own refs
// (worktree.ClearRefLocks), which would fail every checkpoint and the
// result: this run holds the job's lock, so no other aq updates them, and
// it calls this only while no checkpoint of its own runs — before the
// worktree is prepared, and after the periodic checkpoints stopped.
func (ru *run) clearRefLocks() {
	if ru.repoDir == "" {
		return
	}
	for _, ref := range worktree.ClearRefLocks(ru.repoDir, "refs/heads/"+job.WIPBranch(ru.j.ID), "refs/heads/"+job.JobBranch(ru.j.ID)) {
		ru.log.Warn("removed the lock a stopped git left on the job's ref", "ref", ref)
	}
}
