package runner

// Delivery: pushing the job branch, opening the pull request, and the lease
// confirmation before each irreversible step.

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/aqfleet/aq/job"
	"github.com/aqfleet/aq/worktree"
)

// ship delivers the result per ship: and sets the success stage. A fenced job
// never ships.
func (ru *run) ship(ctx context.Context, prBody string) {
	j := ru.j
	if ru.out.Commit == "" { // nothing changed: nothing to ship
		ru.out.Stage = job.Shipped
		return
	}
	if j.Ship == "none" {
		ru.out.Stage = job.Testing
		return
	}
	if !ru.confirmLease(ctx, "before pushing") {
		return
	}
	ru.event(Shipping{Ship: j.Ship})
	if !ru.hasOrigin(ctx) {
		if j.Ship == "branch" {
			ru.log.Info("no origin: the job branch stays local", "branch", ru.out.Branch)
			ru.out.Stage = job.Shipped
			return
		}
		ru.fail(job.ReasonShipFailed, "ship: "+j.Ship+" needs an origin remote to push "+ru.out.Branch+" to")
		return
	}
	// A compare-and-swap against what origin had when this run looked: a
	// delivered result this run did not write is never replaced (the push
	// used to be a forced '+', and a second factory's run could overwrite
	// the first one's delivered branch).
	ref := "refs/heads/" + ru.out.Branch
	if ru.pushTogether(ctx, ref) {
		ru.delivered(ctx, prBody)
		return
	}
	// Not pushed together (no checkpoint waiting, or the atomic push was
	// refused): the checkpoint alone, then the result alone, as each would
	// have gone without the other — a refusal of either is said as it was.
	ru.flushWIP(ctx)
	if !ru.pushAllowed(ctx, "the job branch", ru.out.Commit, ru.jobOnOrigin, ru.wipOnOrigin) {
		if reason, line := ru.shipRefused(); reason != "" {
			ru.fail(reason, line)
		} else if !ru.stopped(ctx, "checking the change") {
			ru.fail(job.ReasonShipFailed, "cannot push "+ru.out.Branch+": what it adds to origin could not be checked (see the log); it is kept on this host")
		}
		return
	}
	if err := worktree.PushWithLease(ctx, ru.r.Git, ru.repoDir, "origin", ref, ref, ru.jobOnOrigin); err != nil {
		if !ru.stopped(ctx, "pushing") {
			ru.fail(job.ReasonShipFailed, "cannot push "+ru.out.Branch+" to origin (if origin's branch moved since this run looked, another run delivered it: the next attempt reports that result): "+err.Error())
		}
		return
	}
	ru.delivered(ctx, prBody)
}

// delivered records that the result is on origin and ends delivery.
func (ru *run) delivered(ctx context.Context, prBody string) {
	ru.out.Pushed = true
	// Recorded before anything else happens: a crash from here on must not
	// run the engine again (the next attempt finds the result on origin).
	ru.event(Delivered{Branch: ru.out.Branch, Commit: ru.out.Commit})
	ru.openPR(ctx, prBody)
}

// pushTogether pushes the checkpoint after the engine that waited for the
// result (pushWithResult) and the result, ref, in one `git push --atomic`:
// each ref a compare-and-swap against what origin had when this run looked,
// after the lease confirmation ship made and one change check of both. It
// reports whether both are on origin. A refused atomic push moved nothing:
// the caller pushes each alone, as without it, and says a refusal as then
// (a lease conflict on the job branch, a stale WIP ref).
func (ru *run) pushTogether(ctx context.Context, ref string) bool {
	ru.cpMu.Lock()
	defer ru.cpMu.Unlock()
	sha := ru.wipPending
	if sha == "" || ru.fencedNow(ctx) {
		return false
	}
	wip := "refs/heads/" + job.WIPBranch(ru.j.ID)
	if doubt := ru.wipInDoubt; doubt != "" || sha == ru.wipOnOrigin {
		return false // pushWIP's own way: it asks origin first
	}
	if !ru.pushAllowedTips(ctx, "the WIP checkpoint and the job branch", []string{sha, ru.out.Commit}, ru.wipOnOrigin, ru.jobOnOrigin) {
		return false
	}
	err := worktree.PushAtomicWithLease(ctx, ru.r.Git, ru.repoDir, "origin",
		worktree.Lease{Src: wip, Ref: wip, Expect: ru.wipOnOrigin}, worktree.Lease{Src: ref, Ref: ref, Expect: ru.jobOnOrigin})
	if err != nil {
		// Pushed alone next; if this one landed after all (a failure
		// reported after origin took it), pushWIP finds it there.
		ru.log.Debug("the atomic push of the checkpoint and the result was refused; pushing each alone", "err", err)
		ru.wipInDoubt = sha
		return false
	}
	ru.wipPending, ru.wipOnOrigin = "", sha
	ru.out.WIPPushed = true
	return true
}

// openPR ends delivery of a result that is on origin: ship: branch is then
// shipped; pr and merge open the pull request.
func (ru *run) openPR(ctx context.Context, prBody string) {
	j := ru.j
	if j.Ship == "branch" {
		if allowed := ru.protectedAllowed(); len(allowed) > 0 {
			ru.out.Detail = protectedNote(allowed, false)
			ru.log.Warn(ru.out.Detail)
		}
		ru.out.Stage = job.Shipped
		return
	}
	if !ru.confirmLease(ctx, "before opening the pull request") {
		return
	}
	merge := j.Ship == "merge"
	ru.settleStat(ctx) // the body says the change's size
	body := ru.prBody(prBody)
	if allowed := ru.protectedAllowed(); len(allowed) > 0 {
		// may_change let the change touch protected paths: a person looks
		// before it merges, whatever ship: says.
		note := protectedNote(allowed, merge)
		body = strings.TrimRight(body, "\n") + "\n\n---\n\n## Protected paths (aq)\n\n" + note + "\n"
		ru.out.Detail = note
		ru.log.Warn(note)
		merge = false
	}
	url, err := ru.r.Shipper.Ship(ctx, ShipRequest{
		RepoDir: ru.repoDir, Branch: ru.out.Branch, Base: j.Base,
		Title: firstNonEmpty(j.Title, "aq job "+j.ID), Body: body, Merge: merge,
	})
	// A PR that opened but whose auto-merge could not be enabled comes back
	// with its URL and an error: record the URL either way.
	ru.out.PRURL = url
	if err != nil {
		if !ru.stopped(ctx, "opening the pull request") {
			ru.fail(job.ReasonShipFailed, err.Error())
		}
		return
	}
	ru.out.Stage = job.Review
}

// protectedNote says that the change touches protected paths the
// manifest's may_change allows — and, for ship: merge, that auto-merge
// was therefore not enabled.
func protectedNote(allowed []string, merge bool) string {
	note := "the change touches protected paths its manifest's may_change allows: " + strings.Join(allowed, ", ")
	if merge {
		return note + "; ship: merge did not enable auto-merge: a person reviews and merges it"
	}
	return note + "; a person should review them before it merges"
}

// confirmLease renews a fleet lease before an irreversible step.
func (ru *run) confirmLease(ctx context.Context, when string) bool {
	if ru.stopped(ctx, when) {
		return false
	}
	if ru.o.Lease == nil {
		return true
	}
	if err := ru.o.Lease.Confirm(ctx); err != nil {
		var se *job.StopError
		if errors.As(err, &se) {
			ru.fail(se.Reason, when+": "+se.Detail)
		} else {
			ru.fail(job.ReasonLeaseLost, when+": "+err.Error())
		}
		return false
	}
	return true
}

// prBody is the engine's .aq_pr.md, or one made from the manifest; with
// verify's account (and the repair rounds it took) after it.
func (ru *run) prBody(fromEngine string) string {
	verify := ru.verifySummary()
	if strings.TrimSpace(fromEngine) != "" {
		if verify == "" {
			return fromEngine
		}
		return strings.TrimRight(fromEngine, "\n") + "\n\n---\n\n## Verify (aq)\n\n" + verify
	}
	j, in := ru.j, ru.out.Insights
	var b strings.Builder
	fmt.Fprintf(&b, "%s\n\n", firstNonEmpty(j.Title, "aq job "+j.ID))
	if a := strings.TrimSpace(j.Acceptance); a != "" {
		fmt.Fprintf(&b, "## Acceptance\n\n%s\n\n", a)
	}
	fmt.Fprintf(&b, "## Run\n\n- job: `%s` (attempt %d)\n- engine: %s %s\n", j.ID, ru.o.Attempt, in.Engine, in.EngineVersion)
	if in.Model != "" {
		fmt.Fprintf(&b, "- model: %s\n", in.Model)
	}
	fmt.Fprintf(&b, "- tokens in/out: %d/%d, cost: $%.4f, turns: %d\n", in.TokensIn, in.TokensOut, in.CostUSD, in.Turns)
	fmt.Fprintf(&b, "- change: %d files, +%d/-%d\n", in.FilesChanged, in.LinesAdded, in.LinesDeleted)
	if verify != "" {
		fmt.Fprintf(&b, "\n## Verify\n\n%s", verify)
	}
	return b.String()
}

func firstNonEmpty(s ...string) string {
	for _, v := range s {
		if strings.TrimSpace(v) != "" {
			return v
		}
	}
	return ""
}

// resultMarker is the trailer every result commit carries (commitResult);
// WIP checkpoints carry it too, but start with checkpointSubject and never
// sit on a job branch on origin.
const resultMarker, checkpointSubject = "aq-job: ", "aq checkpoint:"

// isResultOf reports whether a commit message is job id's result commit.
func isResultOf(msg, id string) bool {
	if strings.HasPrefix(msg, checkpointSubject) {
		return false
	}
	for _, line := range strings.Split(msg, "\n") {
		if strings.TrimSpace(line) == resultMarker+id {
			return true
		}
	}
	return false
}

// deliveredOnOrigin looks for the job's branch on origin. It records what
// it saw (the result push is a compare-and-swap against it) and reports
// whether the branch already carries this job's result: an earlier attempt,
// here or on another host, pushed it and died or lost its lease before its
// report settled.
func (ru *run) deliveredOnOrigin(ctx context.Context) (sha string, ok bool) {
	if !ru.hasOrigin(ctx) {
		return "", false
	}
	g, branch := ru.r.Git, job.JobBranch(ru.j.ID)
	tip, found, err := ru.lookOnOrigin(ctx, "refs/heads/"+branch)
	if err != nil || !found {
		if err != nil {
			ru.log.Warn("cannot look for the job's branch on origin", "err", err)
		}
		return "", false
	}
	ru.jobOnOrigin = tip
	if err := worktree.Fetch(ctx, g, ru.repoDir, "origin", "+refs/heads/"+branch+":refs/remotes/origin/"+branch); err != nil {
		ru.log.Warn("cannot fetch the job's branch from origin", "err", err)
		return "", false
	}
	msg, err := g.Run(ctx, ru.repoDir, "log", "-1", "--format=%B", tip)
	if err != nil || !isResultOf(string(msg), ru.j.ID) {
		return "", false
	}
	return tip, true
}

// redeliver reports a result an earlier attempt already put on origin,
// instead of running the engine again: the delivered branch is the result.
func (ru *run) redeliver(ctx context.Context, sha string) {
	ru.log.Warn("the job's result is already on origin (an earlier attempt pushed it): reporting it, not running the engine again",
		"branch", job.JobBranch(ru.j.ID), "commit", sha)
	ru.out.Branch, ru.out.Commit, ru.out.Pushed, ru.out.Redelivered = job.JobBranch(ru.j.ID), sha, true, true
	ru.event(Delivered{Branch: ru.out.Branch, Commit: sha})
	if ru.j.Ship == "none" { // never pushed by aq; someone else put it there
		ru.out.Stage = job.Testing
		return
	}
	if !ru.recheckDelivered(ctx, sha) {
		return
	}
	ru.openPR(ctx, "")
}

// lookOnOrigin says where origin's ref is (found false: origin has no such
// ref). The job's two refs on origin, aq/job/<id> and aq/wip/<id>, are
// asked in one `git ls-remote` the first time either is (#35): what origin
// said is what the run's first push of each swaps from.
func (ru *run) lookOnOrigin(ctx context.Context, ref string) (sha string, found bool, err error) {
	jobRef, wipRef := "refs/heads/"+job.JobBranch(ru.j.ID), "refs/heads/"+job.WIPBranch(ru.j.ID)
	if ref != jobRef && ref != wipRef {
		return worktree.RemoteRef(ctx, ru.r.Git, ru.repoDir, "origin", ref)
	}
	if ru.originSaw == nil {
		refs, err := worktree.ListRemoteRefs(ctx, ru.r.Git, ru.repoDir, "origin", jobRef, wipRef)
		if err != nil {
			return "", false, err
		}
		ru.originSaw = map[string]string{}
		for _, r := range refs {
			if r.Name == jobRef || r.Name == wipRef {
				ru.originSaw[r.Name] = r.SHA
			}
		}
	}
	sha, found = ru.originSaw[ref]
	return sha, found, nil
}
