// Package coord is an in-memory coordinator stub: a TEST AND DEMO DOUBLE of
// the fleet coordinator, not the coordinator. It serves the /fleet REST calls
// of docs/contract.md with the semantics aq relies on — a compare-and-swap on each
// job's revision, a lease epoch bumped on every claim and accept, lease TTLs
// with a reaper that returns expired jobs to queued keeping their checkpoint
// (epoch bumped: the old holder is fenced), a queue-state version bumped on
// create and every stage change, enrollment and per-factory tokens, stale
// factories, requeue (fencing the holder), deps, idempotency keys, retries on
// a retryable /fleet/fail, per-route request counters at GET /fleet/_stats,
// and fault injection (a share of 503s, added latency) — so fleet mode can be
// tested, demonstrated and tried on a laptop (`aq demo coordinator`). State
// can be kept in a file (Options.StateFile) so a restarted stub resumes.
//
// It is deliberately small: one process, one mutex-guarded map, the whole
// state rewritten (fsynced) after every change. The production coordinator
// (Cosmos, change feed, Service Bus) is a separate service.
package coord

import (
	"encoding/json"
	"time"

	"github.com/aqfleet/aq/job"
)

// Stages of the coordinator's job machine (docs/contract.md, "Stage reports";
// the coordinator as built is in the coordinator team's "Gigafactory system overview").
const (
	StageQueued     = "queued"
	StageBlocked    = "blocked"
	StageAssigned   = "assigned"
	StageBuilding   = "building"
	StageReview     = "review"
	StageTesting    = "testing"
	StageShipped    = "shipped"
	StageFailed     = "failed"
	StageDeadLetter = "dead_letter"
)

// Job is the stub's job document. The fields of docs/contract.md (id, productId,
// repo, stage, capabilities, priority, leaseEpoch, checkpoint, bodyMd,
// manifestSnapshot) and what the stub needs besides.
type Job struct {
	ID               string          `json:"id"`
	ProductID        string          `json:"productId"`
	Repo             string          `json:"repo"`
	RepoURL          string          `json:"repoUrl,omitempty"`
	Base             string          `json:"base,omitempty"`
	Stage            string          `json:"stage"`
	Capabilities     []string        `json:"capabilities"`
	Engine           string          `json:"engine,omitempty"`
	Priority         int             `json:"priority"`
	LeaseEpoch       int64           `json:"leaseEpoch"`
	Checkpoint       string          `json:"checkpoint,omitempty"`
	BodyMd           string          `json:"bodyMd"`
	ManifestSnapshot json.RawMessage `json:"manifestSnapshot,omitempty"`
	IdempotencyKey   string          `json:"idempotencyKey,omitempty"`
	Deps             []string        `json:"deps,omitempty"`
	DepsMode         string          `json:"depsMode,omitempty"`
	Retry            job.Retry       `json:"retry"`
	Attempts         int             `json:"attempts"`
	NotBefore        time.Time       `json:"notBefore,omitzero"`
	Reason           string          `json:"reason,omitempty"`
	Detail           string          `json:"detail,omitempty"`
	Insights         json.RawMessage `json:"insights,omitempty"`
	// Previous is how the job's last run ended, from its /fleet/fail (or a
	// legacy PATCH to failed or queued) or the reaper: a claim hands it to
	// the next factory (docs/contract.md, "Claiming and accepting a job"), so the next attempt's
	// engine knows what went wrong. The legacy route set leaves it out of
	// claims, as today's coordinator does.
	Previous       *job.Previous `json:"previous,omitempty"`
	Branch         string        `json:"branch,omitempty"`
	PRURL          string        `json:"prUrl,omitempty"`
	Holder         string        `json:"holderFactoryId,omitempty"`
	LeaseExpiresAt time.Time     `json:"leaseExpiresAt,omitzero"`
	Rev            int64         `json:"rev"`
	CreatedAt      time.Time     `json:"createdAt"`
	UpdatedAt      time.Time     `json:"updatedAt"`

	// Waiting: queued with a NotBefore in the future; the reaper bumps the
	// queue-state version when it passes (a gated factory must see it).
	Waiting bool `json:"waiting,omitempty"`
	// Last is the last accepted report of the holder, so a report re-sent
	// after a lost answer (a spool) is idempotent rather than fenced.
	Last *LastReport `json:"last,omitempty"`
	// Spent sums the insights of every run reported (failed runs through
	// /fleet/fail included): what the job cost across its attempts.
	Spent Spend `json:"spent"`
}

// Spend is what a job's runs cost, as their reports said.
type Spend struct {
	Runs      int     `json:"runs"` // reports that carried insights
	CostUSD   float64 `json:"costUsd"`
	TokensIn  int64   `json:"tokensIn"`
	TokensOut int64   `json:"tokensOut"`
	Turns     int     `json:"turns"`
	WallMS    int64   `json:"wallMs"`
}

// record keeps a report's insights on the job and adds them to its spend.
// Callers skip re-sent reports (their spend is counted already).
func (j *Job) record(insights json.RawMessage) {
	if len(insights) == 0 || string(insights) == "null" {
		return
	}
	j.Insights = insights
	var in job.Insights
	if json.Unmarshal(insights, &in) != nil {
		return
	}
	j.Spent.Runs++
	j.Spent.CostUSD += in.CostUSD
	j.Spent.TokensIn += in.TokensIn
	j.Spent.TokensOut += in.TokensOut
	j.Spent.Turns += in.Turns
	j.Spent.WallMS += in.WallMS
}

// ended records how the job's run ended as the previous attempt the next
// claim carries: the reason and detail the factory reported, and from its
// insights the failed verify and the rounds (bounded: job.Previous.Bounded).
func (j *Job) ended(reason, detail string, insights json.RawMessage) {
	if reason == "" {
		return
	}
	var in *job.Insights
	if len(insights) > 0 && string(insights) != "null" {
		var x job.Insights
		if json.Unmarshal(insights, &x) == nil {
			in = &x
		}
	}
	j.Previous = job.PreviousOf(j.Attempts, job.Reason(reason), detail, in)
}

// LastReport identifies the last accepted holder report.
type LastReport struct {
	Kind    string `json:"kind"` // patch | fail | release
	Factory string `json:"factory"`
	Epoch   int64  `json:"epoch"`
	Stage   string `json:"stage"`
}

// held reports whether a factory holds the job's lease now.
func (j *Job) held() bool { return j.Stage == StageAssigned || j.Stage == StageBuilding }

// Factory is an enrolled factory.
type Factory struct {
	ID              string       `json:"id"`
	TokenHash       string       `json:"tokenHash"`
	Revoked         bool         `json:"revoked,omitempty"`
	Hostname        string       `json:"hostname,omitempty"`
	Capabilities    []string     `json:"capabilities"`
	Repos           []string     `json:"repos"`
	Engines         []string     `json:"engines,omitempty"`
	SeatLimit       int          `json:"seatLimit"`
	Load            float64      `json:"load"`
	Health          string       `json:"health,omitempty"`
	Running         []RunningJob `json:"running"`
	Version         string       `json:"version,omitempty"`
	EnrolledAt      time.Time    `json:"enrolledAt"`
	LastHeartbeatAt time.Time    `json:"lastHeartbeatAt,omitzero"`
	// Stale is computed when read: no heartbeat for Options.StaleAfter.
	Stale bool `json:"stale"`
	// Deregistered: the factory left cleanly (a replica that exited); it is
	// no longer listed or targeted. Its next heartbeat registers it again.
	Deregistered bool `json:"deregistered,omitempty"`
	// Pool is the pool the factory is a replica of (enroll, heartbeat): the
	// publisher targets the pool, not the replica.
	Pool string `json:"pool,omitempty"`
}

// Pool is a pool of replicas as the publisher targets it: one candidate,
// whatever number of replicas is live — zero too, or a pool scaled to zero
// would never be sent a message and never scale up.
type Pool struct {
	Name string `json:"name"`
	// Capabilities and Repos are what a replica offers: declared
	// (Options.Pools) or learnt from the pool's latest replica, kept after
	// it left.
	Capabilities []string `json:"capabilities"`
	Repos        []string `json:"repos"`
	// Seats bounds the messages outstanding for the pool (the scaler's
	// maximum replicas times their slots; default 10).
	Seats int `json:"seats"`
	// Live counts the replicas registered now.
	Live int `json:"live"`
}

// RunningJob is a heartbeat's running entry.
type RunningJob struct {
	JobID      string `json:"jobId"`
	LeaseEpoch int64  `json:"leaseEpoch"`
}

// Event is one entry of a job's audit trail (GET /fleet/jobs/:id/events):
// every state change, and every call the stub refused with 409.
type Event struct {
	Seq     int64     `json:"seq"`
	At      time.Time `json:"at"`
	JobID   string    `json:"jobId"`
	Kind    string    `json:"kind"` // submitted|claimed|accepted|stage|fail|released|reaped|expired|requeued|shipped|rejected|unblocked|due|fenced
	Factory string    `json:"factory,omitempty"`
	Epoch   int64     `json:"epoch"`
	Stage   string    `json:"stage"`
	Status  int       `json:"status,omitempty"` // for fenced: 409
	Call    string    `json:"call,omitempty"`
	Detail  string    `json:"detail,omitempty"`
}

// Stats are the per-route request counters of GET /fleet/_stats.
type Stats struct {
	Since  time.Time             `json:"since"`
	Routes map[string]RouteStats `json:"routes"`
}

// RouteStats counts one route's requests, by answer status.
type RouteStats struct {
	Requests int64            `json:"requests"`
	Status   map[string]int64 `json:"status"`
}

// Count is the number of requests on route (e.g. "POST /fleet/claim").
func (s Stats) Count(route string) int64 { return s.Routes[route].Requests }

// Took is the number of requests on route answered 200: for accept, the
// leases it gave (a factory's start-up probe of the route is answered 404).
func (s Stats) Took(route string) int64 { return s.Routes[route].Status["200"] }

// Total is the number of requests on every route but _stats.
func (s Stats) Total() int64 {
	var n int64
	for r, rs := range s.Routes {
		if r != RouteGetStats {
			n += rs.Requests
		}
	}
	return n
}

// Route names, as counted in Stats.
const (
	RouteEnroll     = "POST /fleet/factories/enroll"
	RouteHeartbeat  = "POST /fleet/factories/heartbeat"
	RouteFactories  = "GET /fleet/factories"
	RouteRevoke     = "POST /fleet/factories/{id}/token/revoke"
	RouteDeregister = "POST /fleet/factories/{id}/deregister"
	RouteQueueState = "GET /fleet/queue-state"
	RouteClaim      = "POST /fleet/claim"
	RouteAccept     = "POST /fleet/accept"
	RouteRenew      = "POST /fleet/jobs/{id}/lease/renew"
	RouteRelease    = "POST /fleet/jobs/{id}/lease/release"
	RoutePatch      = "PATCH /fleet/jobs/{id}"
	RouteFail       = "POST /fleet/fail"
	RouteSubmit     = "POST /fleet/jobs"
	RouteJobs       = "GET /fleet/jobs"
	RouteJob        = "GET /fleet/jobs/{id}"
	RouteEvents     = "GET /fleet/jobs/{id}/events"
	RouteAction     = "POST /fleet/jobs/{id}/actions/{action}"
	// RouteReplace and RouteRemove undo an operator's mistake (aq submit
	// --replace, aq job rm) on a job that is not running.
	RouteReplace  = "PUT /fleet/jobs/{id}"
	RouteRemove   = "DELETE /fleet/jobs/{id}"
	RouteGetStats = "GET /fleet/_stats"
	RouteFaults   = "POST /fleet/_faults"
)
