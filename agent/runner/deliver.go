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
	if !ru.hasOrigin(ctx) {
		if j.Ship == "branch" {
			ru.log.Info("no origin: the job branch stays local", "branch", ru.out.Branch)
			ru.out.Stage = job.Shipped
			return
		}
		ru.fail(job.ReasonShipFailed, "ship: "+j.Ship+" needs an origin remote to push "+ru.out.Branch+" to")
		return
	}
	ref := "refs/heads/" + ru.out.Branch
	if err := worktree.Push(ctx, ru.r.Git, ru.repoDir, "origin", "+"+ref+":"+ref); err != nil {
		if !ru.stopped(ctx, "pushing") {
			ru.fail(job.ReasonShipFailed, "cannot push "+ru.out.Branch+" to origin: "+err.Error())
		}
		return
	}
	ru.out.Pushed = true
	if j.Ship == "branch" {
		ru.out.Stage = job.Shipped
		return
	}
	if !ru.confirmLease(ctx, "before opening the pull request") {
		return
	}
	url, err := ru.r.Shipper.Ship(ctx, ShipRequest{
		RepoDir: ru.repoDir, Branch: ru.out.Branch, Base: j.Base,
		Title: firstNonEmpty(j.Title, "aq job "+j.ID), Body: ru.prBody(prBody), Merge: j.Ship == "merge",
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

// prBody is the engine's .aq_pr.md, or one made from the manifest.
func (ru *run) prBody(fromEngine string) string {
	if strings.TrimSpace(fromEngine) != "" {
		return fromEngine
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
