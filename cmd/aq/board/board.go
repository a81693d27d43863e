// Package board is `aq status --watch`: a full-screen terminal board on
// Bubble Tea and Lip Gloss. It owns the screen — the model, its updates
// and its view, all plain Go testable with messages — and nothing else:
// what it shows comes from a Source (the cli package reads the local queue,
// the daemon's status file and the coordinator), and what it does (requeue,
// reject, ship, follow a log) goes back through the Source.
package board

import (
	"context"
	"time"
)

// Snapshot is everything the board shows at one refresh.
type Snapshot struct {
	At    time.Time
	Mode  string // "local" or "fleet"
	Where string // the queue's home, or the coordinator's URL
	// Stages are the jobs per stage, in the order shown.
	Stages  []Count
	Running []Row
	// Runnable are the jobs this host's aq run would take next, in that
	// order (local mode).
	Runnable []Row
	Waiting  []Row
	Review   []Row // review and testing: the ship gate
	Failed   []Row
	// Shipped are the latest shipped jobs, the most recent first.
	Shipped []Row
	Daemon  *Daemon
	Sandbox *Sandbox
	Fleet   *Fleet
	// Notes are one-line remarks (orphans recovered, a part not readable).
	Notes []string
	// Err is why there is no data at all (the queue cannot be read).
	Err string
}

// Count is one stage's count.
type Count struct {
	Stage string
	N     int
}

// Row is one job.
type Row struct {
	ID      string
	Stage   string
	Repo    string
	Engine  string
	Phase   string // running: preparing | engine | finishing, or the coordinator's assigned/building
	Factory string // fleet: the factory running it
	Elapsed time.Duration
	// Usage, when known (HasUsage).
	HasUsage      bool
	Tokens        int64
	Cost          float64
	CostEstimated bool
	// Last is, for a running job, the engine's last event; for a waiting
	// job, why it waits; for a failed job, its reason and detail.
	Last     string
	Attempts int
}

// Daemon is this host's aq daemon.
type Daemon struct {
	FactoryID    string
	Alive        bool
	Stage        string
	Slots, Busy  int
	Source       string // broker | poll | none
	Broker       string // the broker link: healthy, or its error
	Gate         bool
	HeartbeatAge time.Duration // 0: never
	Healthy      bool
	Stopped      time.Time // when not alive: when it stopped (or was last seen)
}

// Sandbox is how this host runs engines (docs/sandbox.md).
type Sandbox struct {
	// Line is the level, the guarantees that hold and those missing.
	Line string
	// Weak: engines run below the full level (partial, none, or every job
	// refused): shown as a warning.
	Weak bool
}

// Fleet is the coordinator's view.
type Fleet struct {
	API              string
	Reachable        bool
	UnreachableSince time.Time
	Error            string
	FetchedAt        time.Time
	Factories        []Factory
	// FactoriesKnown is false when the coordinator lacks the route.
	FactoriesKnown bool
	Alerts         []string
	Missing        []string
	Requests       int
}

// Factory is one factory of the fleet.
type Factory struct {
	ID           string
	Health       string
	Stale        bool
	Running      int
	Seats        int
	Load         float64
	HeartbeatAge time.Duration // negative: never
	Jobs         []string
	Version      string
}

// Source feeds the board and carries out its actions.
type Source interface {
	// Snapshot reads everything now. It never fails: what cannot be read
	// is said in the snapshot (Err, Notes, Fleet.Error).
	Snapshot(ctx context.Context) *Snapshot
	// Act applies requeue, reject or ship to a job and says what it did.
	Act(ctx context.Context, id, action string) (string, error)
	// Follow streams a job's log for a person to emit until the job ends
	// or ctx does.
	Follow(ctx context.Context, id string, emit func(string)) error
}
