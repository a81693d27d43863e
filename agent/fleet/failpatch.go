package fleet

import (
	"context"
	"time"

	"github.com/aqfleet/aq/job"
)

// A coordinator without POST /fleet/fail (today's: docs/contract.md, "Without
// a route: fallbacks") still frees a failed job's lease at once: aq reports the failure with
// the fenced PATCH it has, then gives the lease back with lease/release.

// failPatch is the fenced PATCH that reports f without /fleet/fail: every
// field of FailRequest a PATCH carries, one line each. FailRequest's other
// fields are in failOnly; a test holds that each field is in one or the
// other, so a field added to FailRequest is carried here (one line) or
// listed there on purpose.
func failPatch(f FailRequest, stage string) PatchRequest {
	p := PatchRequest{Stage: stage}
	p.LeaseEpoch = f.LeaseEpoch
	p.Reason = f.Reason
	p.Checkpoint = f.Checkpoint
	p.Detail = f.Detail
	p.Insights = f.Insights
	p.NotBefore = f.NotBefore
	return p
}

// failOnly are FailRequest's fields (by JSON name) the fallback PATCH does
// not carry, and why.
var failOnly = map[string]string{
	"jobId":     "the PATCH's path names the job",
	"factoryId": "the token names the factory",
	"retryable": "the PATCH's stage says it: queued (retried) or failed",
}

// FailStage is the stage a fallback PATCH reports for f: queued when the
// failure may pass and the job has retries left (!exhausted), so the
// coordinator hands it out again; failed otherwise.
func FailStage(f FailRequest, exhausted bool) string {
	if !f.Retryable || f.Reason.Permanent() || exhausted {
		return job.Failed.FleetName()
	}
	return job.Inbox.FleetName()
}

// failByPatch reports f with a fenced PATCH (FailStage), then releases the
// lease. A PATCH refused with 409 is fenced: nothing more is sent (the
// lease is no longer ours to release). A release that does not go through
// within its budget is logged, not an error: the stage is reported, and the
// lease frees when it expires (the reaper) — the report must not be sent
// twice for it.
func (c *Client) failByPatch(ctx context.Context, f FailRequest, exhausted bool, budget time.Duration) (string, error) {
	stage := FailStage(f, exhausted)
	j, err := c.patch(ctx, f.JobID, failPatch(f, stage), budget)
	if err != nil {
		return "", err
	}
	if j != nil && j.Stage != "" {
		stage = j.Stage
	}
	rb := max(c.o.Budgets.Release, min(budget, c.o.Budgets.Report))
	rctx, cancel := context.WithTimeout(ctx, rb+time.Second)
	defer cancel()
	if err := c.release(rctx, f.JobID, f.LeaseEpoch, rb); err != nil {
		c.o.Log.Warn("failure reported (fenced PATCH), but the lease was not released; it frees when it expires", "job", f.JobID, "epoch", f.LeaseEpoch, "stage", stage, "err", err)
	}
	return stage, nil
}
