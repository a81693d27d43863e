package fleet

import (
	"time"

	"github.com/aqfleet/aq/agent/claim"
	"github.com/aqfleet/aq/job"
)

// The wire format of docs/contract.md, as aq sends and reads it. Field names are the
// contract's; unknown fields in answers are ignored.

// Job is the coordinator's job document, and Claim a job this factory holds
// a lease on (POST /fleet/claim, POST /fleet/accept): agent/claim, so that
// dispatch carries a claim to the daemon typed, without importing this
// package.
type (
	Job   = claim.Job
	Claim = claim.Claim
)

// EnrollRequest is POST /fleet/factories/enroll.
type EnrollRequest struct {
	FactoryID    string   `json:"factoryId"`
	Hostname     string   `json:"hostname"`
	Capabilities []string `json:"capabilities"`
	Repos        []string `json:"repos"`
	Engines      []string `json:"engines"`
	SeatLimit    int      `json:"seatLimit"`
	Version      string   `json:"version"`
	Pool         string   `json:"pool,omitempty"` // AQ_FACTORY_POOL
}

// Enrollment is enroll's answer.
type Enrollment struct {
	FactoryID string `json:"factoryId"`
	Token     string `json:"token"`
}

// RunningJob is one entry of a heartbeat's running list.
type RunningJob struct {
	JobID      string `json:"jobId"`
	LeaseEpoch int64  `json:"leaseEpoch"`
}

// HeartbeatRequest is POST /fleet/factories/heartbeat.
type HeartbeatRequest struct {
	FactoryID    string       `json:"factoryId"`
	Capabilities []string     `json:"capabilities"`
	Repos        []string     `json:"repos"`
	Load         float64      `json:"load"` // running jobs / seat limit
	SeatLimit    int          `json:"seatLimit"`
	Health       string       `json:"health"` // ok | degraded
	Running      []RunningJob `json:"running"`
	Version      string       `json:"version"`
	// Pool is the pool this factory is a replica of (AQ_FACTORY_POOL): the
	// coordinator may target the pool, which any replica takes.
	Pool string `json:"pool,omitempty"`
}

// QueueState is GET /fleet/queue-state.
type QueueState struct {
	ProductID string `json:"productId"`
	Version   int64  `json:"version"`
}

// ClaimRequest is POST /fleet/claim.
type ClaimRequest struct {
	FactoryID    string   `json:"factoryId"`
	Capabilities []string `json:"capabilities"`
	Repos        []string `json:"repos"`
	DryRun       bool     `json:"dryRun,omitempty"`
}

// AcceptRequest is POST /fleet/accept.
type AcceptRequest struct {
	JobID     string `json:"jobId"`
	FactoryID string `json:"factoryId"`
}

// LeaseRequest is the body of lease renew and release.
type LeaseRequest struct {
	FactoryID  string `json:"factoryId"`
	LeaseEpoch int64  `json:"leaseEpoch"`
}

// Lease is renew's answer.
type Lease struct {
	ExpiresAt time.Time `json:"leaseExpiresAt"`
	// TTL: see Claim.TTL.
	TTL float64 `json:"ttl,omitempty"`
	// LocalExpiry: see Claim.LocalExpiry.
	LocalExpiry time.Time `json:"-"`
}

// PatchRequest is PATCH /fleet/jobs/:id: a fenced stage report.
type PatchRequest struct {
	Stage      string        `json:"stage"` // the coordinator's stage name (job.Stage.FleetName)
	LeaseEpoch int64         `json:"leaseEpoch"`
	Checkpoint string        `json:"checkpoint,omitempty"`
	Reason     job.Reason    `json:"reason,omitempty"`
	Insights   *job.Insights `json:"insights,omitempty"`
	Branch     string        `json:"branch,omitempty"`
	PRURL      string        `json:"prUrl,omitempty"`
	// Detail says what went wrong, in words (a failure reported without
	// /fleet/fail: failPatch).
	Detail string `json:"detail,omitempty"`
	// NotBefore (a parked run reported without /fleet/fail: failPatch) is
	// when the job may be handed out again; a coordinator that does not
	// know it ignores it and hands the job out at once (the next factory
	// parks it again).
	NotBefore time.Time `json:"notBefore,omitzero"`
}

// Terminal reports whether the patch ends this factory's run of the job.
func (p *PatchRequest) Terminal() bool {
	switch job.StageFromFleet(p.Stage) {
	case job.Review, job.Testing, job.Shipped, job.Failed, job.DeadLetter:
		return true
	}
	return false
}

// FailRequest is POST /fleet/fail: a failure that releases the lease at once.
type FailRequest struct {
	JobID      string     `json:"jobId"`
	FactoryID  string     `json:"factoryId"`
	LeaseEpoch int64      `json:"leaseEpoch"`
	Reason     job.Reason `json:"reason"`
	// Retryable: the failure may pass on another attempt (every reason but
	// the permanent ones); the coordinator applies the job's retry policy.
	Retryable  bool   `json:"retryable"`
	Checkpoint string `json:"checkpoint,omitempty"`
	Detail     string `json:"detail,omitempty"`
	// Insights are the failed run's usage (tokens, cost, turns, wall), so
	// the coordinator's budgets count the spend of failures too, not only
	// that of successes. Nil for a failure no run measured (an orphan).
	Insights *job.Insights `json:"insights,omitempty"`
	// NotBefore (reason rate_limited: the engine's account hit a rate or
	// usage limit, or ran out of credit) is when the limit resets: the
	// coordinator must not hand the job out before it, and must not count
	// the run as an attempt. Another factory, on another account, may take
	// it at once only if the coordinator knows the accounts differ; the
	// stub simply waits.
	NotBefore time.Time `json:"notBefore,omitzero"`
}

// FailAnswer is /fleet/fail's answer: where the job went.
type FailAnswer struct {
	Stage string `json:"stage"`
}

// SubmitRequest is POST /fleet/jobs.
type SubmitRequest struct {
	// Manifest is the normalised job (what `aq validate --json` prints).
	Manifest *job.Job `json:"manifest"`
	// BodyMd is the verbatim manifest file.
	BodyMd         string `json:"bodyMd"`
	IdempotencyKey string `json:"idempotencyKey,omitempty"`
}

// SubmitAnswer is POST /fleet/jobs's answer.
type SubmitAnswer struct {
	JobID string `json:"jobId"`
	// Stage is where the job went (queued or blocked); optional.
	Stage string `json:"stage,omitempty"`
	// Duplicate: the idempotency key matched an existing job, which is the
	// one returned (optional).
	Duplicate bool `json:"duplicate,omitempty"`
}

// ReplaceAnswer is PUT /fleet/jobs/:id's answer.
type ReplaceAnswer struct {
	JobID string `json:"jobId"`
	// Stage is where the job went (queued or blocked).
	Stage string `json:"stage,omitempty"`
	// Replaced is the stage the job was in (optional).
	Replaced string `json:"replaced,omitempty"`
}

// RemoveAnswer is DELETE /fleet/jobs/:id's answer.
type RemoveAnswer struct {
	JobID string `json:"jobId"`
	// Stage is the stage the job was in (optional).
	Stage string `json:"stage,omitempty"`
	// Dependents are the jobs not shipped that name it in their deps
	// (optional): they now wait for a job that is not there.
	Dependents []string `json:"dependents,omitempty"`
}

// errorBody is the error answer aq reads (both spellings are common).
type errorBody struct {
	Error   string `json:"error"`
	Message string `json:"message"`
}
