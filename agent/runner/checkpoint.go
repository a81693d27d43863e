package runner

// Checkpoint: the WIP commit on aq/wip/<id>, taken on every exit path after
// the engine, and its compare-and-swap push while the lease is held.

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/aqfleet/aq/job"
	"github.com/aqfleet/aq/worktree"
)

// wipLeaseMargin is how far from its expiry a lease must be for the WIP
// checkpoint to be pushed (the push itself is a compare-and-swap besides).
const wipLeaseMargin = 5 * time.Second

func (ru *run) checkpointMessage(why string) string {
	return fmt.Sprintf("aq checkpoint: %s (%s)\n\naq-job: %s\naq-attempt: %d", ru.j.ID, why, ru.j.ID, ru.o.Attempt)
}

// checkpoint commits everything in the worktree to aq/wip/<id> — once, after
// the engine is dead — and pushes it to origin unless the job is fenced. It
// runs on a context that cannot be cancelled, with its own time limit.
func (ru *run) checkpoint(parent context.Context) {
	if ru.wtPath == "" {
		return
	}
	ru.cpOnce.Do(func() {
		ctx, cancel := context.WithTimeout(context.WithoutCancel(parent), 2*time.Minute)
		defer cancel()
		wip := "refs/heads/" + job.WIPBranch(ru.j.ID)
		sha, err := worktree.Checkpoint(ctx, ru.r.Git, ru.wtPath, wip, ru.checkpointMessage("after the engine"))
		var partial *worktree.PartialError
		if errors.As(err, &partial) {
			ru.log.Warn("checkpoint is partial: some paths could not be recorded", "err", err)
			sha, err, ru.cpPartial = partial.SHA, nil, true
		}
		if err != nil || sha == "" {
			ru.log.Error("checkpoint failed: the worktree is kept as it is", "worktree", ru.wtPath, "err", err)
			return
		}
		ru.out.Checkpoint, ru.cpAfter = sha, sha
		ru.log.Info("checkpointed", "checkpoint", sha, "ref", job.WIPBranch(ru.j.ID))
		ru.event(Event{Kind: "checkpoint", Checkpoint: sha})
		if ru.fencedNow(parent) || !ru.hasOrigin(ctx) {
			return
		}
		// A fleet job pushes its WIP only while it still holds the lease:
		// after a fence (or a lease it cannot confirm) another factory may be
		// working from origin's checkpoint, which must not move under it.
		if ru.o.Lease != nil && !ru.o.Lease.Held(wipLeaseMargin) {
			ru.log.Warn("not pushing the WIP checkpoint: this factory may no longer hold the job's lease; it is kept locally")
			return
		}
		if err := worktree.PushWithLease(ctx, ru.r.Git, ru.repoDir, "origin", wip, wip, ru.wipOnOrigin); err != nil {
			ru.log.Warn("cannot push the WIP checkpoint to origin; it is kept locally", "err", err)
			return
		}
		ru.wipOnOrigin = sha
		ru.out.WIPPushed = true
	})
}

// fencedNow reports whether the job's context says another factory owns it.
func (ru *run) fencedNow(ctx context.Context) bool {
	r, _, ok := job.StopReason(ctx)
	return ru.out.Fenced || (ok && r == job.ReasonFenced)
}
