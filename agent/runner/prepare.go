package runner

// Preparation: the pre-flight (engine, shipping tools, repo), the clone, and
// the worktree with its resume point (the WIP checkpoint, else the base).

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/aqfleet/aq/agent/holds"
	"github.com/aqfleet/aq/agent/repos"
	"github.com/aqfleet/aq/engines"
	"github.com/aqfleet/aq/internal/process"
	"github.com/aqfleet/aq/job"
	"github.com/aqfleet/aq/worktree"
)

func (ru *run) preflight(ctx context.Context) bool {
	j := ru.j
	if !ru.refuseUnsandboxed() {
		return false
	}
	eng, info, reason, detail := ru.pickEngine(ctx)
	if reason.Parks() {
		return false // pickEngine parked the run: its engine is held
	}
	if reason != "" {
		ru.fail(reason, detail)
		return false
	}
	ru.eng, ru.info = eng, info
	ru.out.Insights.Engine, ru.out.Insights.EngineVersion = eng.Name(), info.Version

	if j.Ship == "pr" || j.Ship == "merge" {
		if ru.r.Shipper == nil {
			ru.fail(job.ReasonCapabilityMismatch, "ship: "+j.Ship+" needs has:gh (the GitHub CLI), which this aq cannot use")
			return false
		}
	}
	repoDir := filepath.Join(ru.r.Cfg.RepoBase, j.Repo)
	if !worktree.IsRepo(repoDir) {
		url := j.RepoURL
		if url == "" {
			u, ok, err := ru.r.Cfg.Repos.Resolve(j.Repo)
			switch {
			case err != nil:
				ru.fail(job.ReasonRepoUnavailable, fmt.Sprintf("no git repository %s under AQ_REPO_BASE, and its clone URL is unusable: %v", repoDir, err))
				return false
			case !ok:
				ru.fail(job.ReasonRepoUnavailable, fmt.Sprintf("no git repository %s under AQ_REPO_BASE (clone it there, list it in AQ_REPO_URLS, or fix repo:)", repoDir))
				return false
			}
			url = u
		}
		ru.log.Info("cloning the repository on demand (blobless)", "repo", j.Repo, "url", url, "mirror", ru.r.Cfg.Mirror)
		start := time.Now()
		if err := repos.Clone(ctx, &ru.r.Git, url, repoDir, ru.r.Cfg.Mirror); err != nil {
			if !ru.stopped(ctx, "cloning the repo") {
				ru.fail(job.ReasonRepoUnavailable, err.Error())
			}
			return false
		}
		ru.log.Info("cloned", "repo", j.Repo, "took", time.Since(start).Round(time.Millisecond))
	}
	ru.repoDir = repoDir
	// Its worktrees' git directories are found from its registration, not
	// from a .git file an engine may have rewritten (a stale worktree of a
	// dead run is checkpointed below).
	worktree.TrustRepo(repoDir)
	if j.Ship == "pr" || j.Ship == "merge" {
		if err := ru.r.Shipper.Ready(ctx, repoDir); err != nil {
			ru.fail(job.ReasonCapabilityMismatch, err.Error())
			return false
		}
	}
	return true
}

// pickEngine resolves the manifest's engine (any = the first installed) and
// runs its pre-flight.
func (ru *run) pickEngine(ctx context.Context) (engines.Engine, engines.Info, job.Reason, string) {
	names := []string{ru.j.Engine}
	if ru.j.Engine == "" || ru.j.Engine == "any" {
		names = ru.r.Engines.Names()
	}
	spec := ru.spec()
	var (
		firstErr error
		held     *holds.Hold
	)
	for _, name := range names {
		eng, ok := ru.r.Engines.Get(name)
		if !ok {
			continue
		}
		if !ru.r.Cfg.allows(name) {
			if len(names) == 1 {
				return nil, engines.Info{}, job.ReasonCapabilityMismatch, fmt.Sprintf("engine %s is not offered by this factory (AQ_ENGINES)", name)
			}
			continue
		}
		if h, ok := ru.r.Holds.Held(name); ok {
			// Its account hit a limit that has not reset: running it would
			// only meet the limit again.
			if held == nil || h.Until.Before(held.Until) {
				held = &h
			}
			continue
		}
		spec := spec
		spec.Env = ru.engineEnv(name) // each engine's own credential
		info, err := eng.Preflight(ctx, spec)
		if err == nil {
			return eng, info, "", ""
		}
		var ue *engines.UnavailableError
		if errors.As(err, &ue) && len(names) == 1 {
			return nil, engines.Info{}, job.ReasonEngineUnavailable, err.Error()
		}
		if firstErr == nil {
			firstErr = err
		}
	}
	if held != nil {
		detail := fmt.Sprintf("%s is held until %s: its account hit its %s (met by job %s)", held.Engine, held.Until.UTC().Format(time.RFC3339), held.Why, held.Job)
		if held.Why == HoldUnreachable {
			detail = fmt.Sprintf("%s is held until %s: its API was unreachable (met by job %s)", held.Engine, held.Until.UTC().Format(time.RFC3339), held.Job)
		}
		ru.park(held.Engine+" "+held.Why, held.Until, detail)
		return nil, engines.Info{}, job.ReasonRateLimited, detail
	}
	if firstErr == nil {
		firstErr = fmt.Errorf("engine %q is not available on this host", ru.j.Engine)
	}
	var ue *engines.UnavailableError
	if errors.As(firstErr, &ue) {
		return nil, engines.Info{}, job.ReasonEngineUnavailable, firstErr.Error()
	}
	return nil, engines.Info{}, job.ReasonNoEngine, firstErr.Error()
}

// prepareWorktree makes $AQ_HOME/worktrees/<repo>/<id> on aq/job/<id>. A
// worktree left by a crashed run is checkpointed before it is replaced, so no
// file in it is lost.
func (ru *run) prepareWorktree(ctx context.Context) bool {
	j, g := ru.j, ru.r.Git
	ru.wtPath = filepath.Join(ru.r.Cfg.worktreesDir(), j.Repo, j.ID)
	wip := "refs/heads/" + job.WIPBranch(j.ID)
	ru.clearRefLocks()

	remoteWIP := "refs/remotes/origin/" + job.WIPBranch(j.ID)
	forgetRemoteWIP := false
	if ru.hasOrigin(ctx) {
		// Another host may have checkpointed this job: fetch its WIP ref
		// beside ours (never over it).
		// ls-remote first: it tells "none" from "cannot tell", and what it
		// says is the value a later WIP push must still find there.
		sha, ok, err := ru.lookOnOrigin(ctx, wip)
		switch {
		case err != nil:
			ru.log.Warn("cannot look for a WIP checkpoint on origin", "err", err)
		case ok:
			ru.wipOnOrigin = sha
			if err := worktree.Fetch(ctx, g, ru.repoDir, "origin", "+"+wip+":"+remoteWIP); err != nil {
				ru.log.Warn("cannot fetch the WIP checkpoint from origin", "err", err)
			}
		default:
			// None on origin: forget a stale copy from an earlier run —
			// once the refs are read below, and only when there is one.
			forgetRemoteWIP = true
		}
		if ru.r.Cfg.FetchBase {
			if err := worktree.Fetch(ctx, g, ru.repoDir, "origin", "+refs/heads/"+j.Base+":refs/remotes/origin/"+j.Base); err != nil && ctx.Err() == nil {
				ru.log.Warn("cannot fetch base from origin; using the local copy", "base", j.Base, "err", err)
			}
		}
	}
	if ctx.Err() != nil {
		ru.stopped(ctx, "preparing the worktree")
		return false
	}
	// The base's candidates and the WIP refs, in one git (#35); a stale
	// remote-tracking WIP ref is deleted only when there is one.
	refs := append(ru.baseCandidates(ctx), wip, remoteWIP)
	if at, err := worktree.ResolveRefs(ctx, g, ru.repoDir, refs...); err == nil {
		ru.refsAt = map[string]string{}
		for _, r := range refs {
			ru.refsAt[r] = at[r] // "": not there
		}
	}
	if sha, asked := ru.refsAt[remoteWIP]; forgetRemoteWIP && (sha != "" || !asked) {
		_, _ = g.Run(ctx, ru.repoDir, "update-ref", "-d", remoteWIP)
		if asked {
			ru.refsAt[remoteWIP] = ""
		}
	}
	baseRef, ok := ru.resolveBase(ctx)
	if !ok {
		return false
	}
	pool := ru.r.Cfg.pool(j.Repo)

	if st, err := os.Lstat(ru.wtPath); err == nil && st.IsDir() { // aq's own folder: never a link it would follow
		// A run of this job died here (its aq was killed): its engine may
		// still be running and writing. Stop whatever carries the job's tag
		// first, so the checkpoint below is final and nothing keeps writing
		// into a worktree that is about to be replaced.
		if n, err := process.StopScoped(ctx, j.ID, Scope(ru.r.Cfg.Home), ru.r.Cfg.Grace); err != nil && !errors.Is(err, errors.ErrUnsupported) {
			ru.log.Warn("cannot stop the processes of an earlier run of this job", "err", err)
		} else if n > 0 {
			ru.log.Warn("stopped processes left running by an earlier run of this job", "count", n)
		}
		ru.refsAt = nil // the checkpoint below moves the local WIP ref
		sha, err := worktree.Checkpoint(ctx, g, ru.wtPath, wip, ru.checkpointMessage("stale worktree"))
		var partial *worktree.PartialError
		switch {
		case errors.As(err, &partial):
			ru.log.Warn("checkpointed a stale worktree, but for files git cannot read, before replacing it", "checkpoint", partial.SHA, "err", err)
		case err != nil:
			// Its files may be the only copy of work no checkpoint has:
			// never remove it unrecorded.
			if !ru.stopped(ctx, "checkpointing the worktree of an earlier run") {
				ru.fail(job.ReasonCrash, "cannot checkpoint the worktree an earlier run left at "+ru.wtPath+" (it is kept as it is): "+err.Error())
			}
			return false
		default:
			ru.log.Info("checkpointed a stale worktree before replacing it", "checkpoint", sha)
		}
		// Recorded: it can be reset like any pooled worktree (or, when the
		// pool is off or full, removed).
		if pooled, err := pool.Put(ctx, g, ru.repoDir, ru.wtPath); err != nil || pooled == "" {
			if err != nil {
				ru.log.Debug("the stale worktree cannot be pooled; removing it", "err", err)
			}
			if err := worktree.Remove(ctx, g, ru.repoDir, ru.wtPath); err != nil {
				ru.fail(job.ReasonRepoUnavailable, "cannot remove the stale worktree "+ru.wtPath+": "+err.Error())
				return false
			}
		}
	}

	start, mb := baseRef, baseRef
	if sha := ru.resumePoint(ctx, wip, remoteWIP); sha != "" {
		start = sha
		ru.out.Checkpoint, ru.resumedFrom = sha, sha
		ru.log.Info("resuming from WIP checkpoint", "checkpoint", sha)
		// The base commit the result is squashed onto: where base and the
		// start point meet (base itself when starting from base).
		if m, ok, err := worktree.MergeBase(ctx, g, ru.repoDir, start, baseRef); err == nil && ok {
			mb = m
		}
	}
	ru.baseSHA, ru.start = mb, start
	res, err := pool.Checkout(ctx, g, ru.repoDir, ru.wtPath, job.JobBranch(j.ID), start)
	for _, d := range res.Discarded {
		ru.log.Warn("discarded a pooled worktree that could not be made clean", "err", d)
	}
	if err != nil {
		if !ru.stopped(ctx, "creating the worktree") {
			ru.fail(job.ReasonRepoUnavailable, "cannot create the worktree: "+err.Error())
		}
		_ = worktree.Remove(context.WithoutCancel(ctx), g, ru.repoDir, ru.wtPath)
		return false
	}
	if res.Reused {
		ru.log.Debug("reset a pooled worktree for the job", "worktree", ru.wtPath)
	}
	ru.out.Worktree, ru.out.WarmStart = ru.wtPath, res.Reused
	return true
}

// release gives the job's worktree back to the pool once the job is over:
// only when the checkpoint after the engine recorded all of it (a failed or
// partial checkpoint leaves it where it is, for gc, which checkpoints what
// it holds first), and only when no process still works in it: the process
// layer has stopped every process carrying the job's tag after the engine
// and after verify; one that lost the tag but has its working directory in
// the worktree keeps it out of the pool (Linux; elsewhere the tag sweep is
// the only guard).
func (ru *run) release(parent context.Context) {
	// A worktree that stays where it ran has its index brought to the
	// result (commitFromCheckpoint left it for here); a pooled one is
	// reset by the next job's checkout.
	pooled := false
	defer func() {
		if !pooled {
			ru.syncIndex(parent)
		}
	}()
	pool := ru.r.Cfg.pool(ru.j.Repo)
	if pool.Size <= 0 || ru.cpAfter == "" || ru.cpPartial {
		return
	}
	if reason, _ := ru.shipRefused(); reason != "" {
		// What it holds was refused: it stays where it ran, for a person.
		ru.log.Info("not pooling the worktree: its change was refused; it stays for an operator", "worktree", ru.wtPath, "reason", reason)
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(parent), time.Minute)
	defer cancel()
	if pids, err := process.WorkingIn(ru.wtPath); err == nil && len(pids) > 0 {
		ru.log.Warn("not pooling the worktree: processes still work in it; aq gc removes it once they are gone", "pids", pids)
		return
	}
	dest, err := pool.Put(ctx, ru.r.Git, ru.repoDir, ru.wtPath)
	switch {
	case err != nil && dest == "":
		ru.log.Info("the worktree stays where it is: git cannot move it to the pool", "err", err)
	case err != nil:
		ru.log.Warn("pooled the worktree", "worktree", dest, "err", err)
		ru.out.Pooled, pooled = true, true
	case dest != "":
		ru.log.Debug("pooled the worktree", "worktree", dest)
		ru.out.Pooled, pooled = true, true
	}
}

// resumePoint picks the checkpoint to start from: the one the coordinator
// recorded when it is known here — or origin's WIP ref when that descends
// from it (a periodic checkpoint pushed after the last one the coordinator
// took: the host that pushed it may have been lost before its PATCH went
// out; found by the chaos harness's work-lost invariant); else whichever of
// the local and origin WIP refs contains the other; else origin's (the
// latest owner's). The local ref is never moved here, so a diverged local
// checkpoint stays reachable (the next checkpoint takes it as a second
// parent).
func (ru *run) resumePoint(ctx context.Context, localRef, remoteRef string) string {
	g := ru.r.Git
	if h := ru.o.Checkpoint; h != "" {
		if sha, ok, _ := worktree.ResolveRef(ctx, g, ru.repoDir, h+"^{commit}"); ok {
			if ru.hasOrigin(ctx) {
				if remote, rok, _ := worktree.ResolveRef(ctx, g, ru.repoDir, remoteRef); rok && remote != sha {
					if newer, err := worktree.IsAncestor(ctx, g, ru.repoDir, sha, remote); err == nil && newer {
						return remote
					}
				}
			}
			return sha
		}
		ru.log.Warn("the recorded checkpoint is not in this repository; using the WIP refs", "checkpoint", h)
	}
	local, lok, _ := ru.resolve(ctx, localRef)
	var remote string
	var rok bool
	if ru.hasOrigin(ctx) {
		remote, rok, _ = ru.resolve(ctx, remoteRef)
	}
	switch {
	case !lok && !rok:
		return ""
	case !rok || local == remote:
		return local
	case !lok:
		return remote
	}
	if anc, err := worktree.IsAncestor(ctx, g, ru.repoDir, remote, local); err == nil && anc {
		return local
	}
	return remote
}

// resolveBase finds the commit of the job's base branch.
func (ru *run) resolveBase(ctx context.Context) (string, bool) {
	base := ru.j.Base
	for _, ref := range ru.baseCandidates(ctx) {
		if sha, ok, _ := ru.resolve(ctx, ref); ok {
			return sha, true
		}
	}
	ru.fail(job.ReasonRepoUnavailable, fmt.Sprintf("base branch %q does not exist in %s (create it or fix base:)", base, ru.repoDir))
	return "", false
}

// baseCandidates are the refs the job's base may be, the first found wins.
func (ru *run) baseCandidates(ctx context.Context) []string {
	base := ru.j.Base
	cands := []string{"refs/heads/" + base}
	if ru.hasOrigin(ctx) {
		cands = append(cands, "refs/remotes/origin/"+base)
		if ru.r.Cfg.FetchBase {
			cands[0], cands[1] = cands[1], cands[0]
		}
	}
	return cands
}

// resolve is worktree.ResolveRef of a full ref in the repository, from
// what prepareWorktree read of it in one git when it did.
func (ru *run) resolve(ctx context.Context, ref string) (string, bool, error) {
	if sha, asked := ru.refsAt[ref]; asked {
		return sha, sha != "", nil
	}
	return worktree.ResolveRef(ctx, ru.r.Git, ru.repoDir, ref)
}

// hasOrigin reports whether the repository has an origin remote; asked once
// per run.
func (ru *run) hasOrigin(ctx context.Context) bool {
	ru.originOnce.Do(func() { ru.origin = worktree.HasRemote(ctx, ru.r.Git, ru.repoDir, "origin") })
	return ru.origin
}
