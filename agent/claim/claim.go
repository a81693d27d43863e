// Package claim is a job a coordinator has leased to this factory — its
// document and its lease, in the coordinator contract's wire format
// (docs/contract.md, "Claiming and accepting a job") — as POST /fleet/claim and POST /fleet/accept
// answer it. It is a package of its own so that dispatch, which carries a
// job accepted from the broker to the daemon's handler, names its type
// without importing the fleet client (agent/fleet, which calls it Claim too).
package claim

import (
	"encoding/json"
	"time"

	"github.com/aqfleet/aq/job"
)

// Job is the coordinator's job document: at least these fields.
type Job struct {
	ID           string   `json:"id"`
	ProductID    string   `json:"productId,omitempty"`
	Repo         string   `json:"repo"`
	Stage        string   `json:"stage"`
	Capabilities []string `json:"capabilities"`
	Priority     int      `json:"priority"`
	LeaseEpoch   int64    `json:"leaseEpoch"`
	Checkpoint   string   `json:"checkpoint,omitempty"`
	// BodyMd is the verbatim manifest file; aq parses and validates it as it
	// would a local one.
	BodyMd           string          `json:"bodyMd"`
	ManifestSnapshot json.RawMessage `json:"manifestSnapshot,omitempty"`
	// Attempts counts the runs started, this one included (optional in the
	// contract; 0 is read as 1).
	Attempts int `json:"attempts,omitempty"`
	// Previous is how the job's previous attempt ended, as the coordinator
	// recorded it from that attempt's /fleet/fail (reason, detail, the
	// failed verify's tail from its insights) or its reaper (lease_lost):
	// the engine is told (optional in the contract; docs/fleet.md). It is
	// text for a prompt, bounded before use (job.Previous.Bounded).
	Previous *job.Previous `json:"previous,omitempty"`
}

// Claim is a job this factory holds a lease on, from POST /fleet/claim or
// POST /fleet/accept.
type Claim struct {
	Job            Job       `json:"job"`
	LeaseEpoch     int64     `json:"leaseEpoch"`
	LeaseExpiresAt time.Time `json:"leaseExpiresAt"`
	// TTL is the lease's time to live in seconds, when the coordinator
	// sends it (optional): the factory times the lease from it on its own
	// clock. Without it, the time left is leaseExpiresAt minus the
	// answer's Date header (docs/fleet.md#leases).
	TTL float64 `json:"ttl,omitempty"`

	// Source is how the job came: "poll" (claim) or "broker" (accept).
	Source string `json:"-"`
	// Asked is the job id an accept asked for ("" for a claim): the
	// answer must be that job (manifest.Admit).
	Asked string `json:"-"`
	// LocalExpiry is when the lease ends on this host's monotonic clock:
	// the time the coordinator granted (TTL, or LeaseExpiresAt minus the
	// answer's Date) counted from when the request was sent, whatever the
	// two clocks read.
	LocalExpiry time.Time `json:"-"`
}

// Attempt is the run number of this claim (1 for the first).
func (c *Claim) Attempt() int {
	if c.Job.Attempts > 0 {
		return c.Job.Attempts
	}
	return 1
}
