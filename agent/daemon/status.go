package daemon

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"time"

	"github.com/aqfleet/aq/internal/atomicfile"
	"github.com/aqfleet/aq/internal/process"
)

// StatusFile is the daemon's status under $AQ_HOME/state: `aq status` reads
// it without calling the coordinator.
const StatusFile = "daemon.json"

// Stage is where the daemon is in its life.
type Stage string

// Stages, in order.
const (
	StageStarting   Stage = "starting"   // enrolling, first heartbeat, spool drain
	StageRecovering Stage = "recovering" // orphans of a previous run: checkpoint, push, fail
	StageRunning    Stage = "running"    // taking work
	StageDraining   Stage = "draining"   // first signal: no new work, running jobs finish
	StageAborting   Stage = "aborting"   // second signal: running jobs are stopped, checkpointed, failed retryable
	StageStopped    Stage = "stopped"
)

// Status is $AQ_HOME/state/daemon.json, rewritten atomically on every change
// and on every heartbeat. Field names are stable.
type Status struct {
	V         int       `json:"v"`
	PID       int       `json:"pid"`
	FactoryID string    `json:"factoryId"`
	Version   string    `json:"version"`
	Stage     Stage     `json:"stage"`
	StartedAt time.Time `json:"startedAt"`
	UpdatedAt time.Time `json:"updatedAt"`
	StoppedAt time.Time `json:"stoppedAt,omitzero"`
	// Slots is the seat limit the daemon advertises; Busy how many hold a
	// job now.
	Slots int `json:"slots"`
	Busy  int `json:"busy"`
	// Source is the live dispatch path: broker, poll or none.
	Source      string    `json:"source"`
	SourceSince time.Time `json:"sourceSince,omitzero"`
	Broker      *Broker   `json:"broker,omitempty"` // nil: no broker configured
	Gate        bool      `json:"gate"`             // the poll path reads the queue-state first
	// LastHeartbeat is the last heartbeat the coordinator took;
	// HeartbeatHealthy mirrors /healthz (younger than twice the interval).
	LastHeartbeat    time.Time    `json:"lastHeartbeat,omitzero"`
	HeartbeatEvery   float64      `json:"heartbeatEverySec"`
	HeartbeatHealthy bool         `json:"heartbeatHealthy"`
	MetricsAddr      string       `json:"metricsAddr,omitempty"`
	Running          []RunningJob `json:"running"`
	Recovered        []string     `json:"recovered,omitempty"` // orphans recovered at start-up
	// Error is why the daemon stopped on its own (credentials refused, ...).
	Error string `json:"error,omitempty"`
	// AbsentRoutes are the coordinator's routes found absent (today's
	// coordinator: e.g. POST /fleet/fail), each with what aq does instead
	// (docs/fleet.md).
	AbsentRoutes []AbsentRoute `json:"absentRoutes,omitempty"`
}

// AbsentRoute is a coordinator route aq found absent, and its fallback.
type AbsentRoute struct {
	Route    string `json:"route"`
	Fallback string `json:"fallback"`
}

// Broker is the broker link as the daemon saw it last.
type Broker struct {
	Healthy bool      `json:"healthy"`
	Since   time.Time `json:"since,omitzero"`
	Error   string    `json:"error,omitempty"`
	// Refused says why the broker path is off although a broker is
	// configured (the coordinator has no POST /fleet/accept): the poll
	// path takes work.
	Refused string `json:"refused,omitempty"`
}

// RunningJob is one job the daemon holds.
type RunningJob struct {
	JobID      string    `json:"jobId"`
	Repo       string    `json:"repo"`
	LeaseEpoch int64     `json:"leaseEpoch"`
	Source     string    `json:"source"` // broker | poll
	Phase      string    `json:"phase"`  // accepted | preparing (repo lock, worktree) | running (engine started)
	AcceptedAt time.Time `json:"acceptedAt"`
	EngineAt   time.Time `json:"engineStartedAt,omitzero"`
	// WaitsFor is the job of the same repo whose engine runs now: this one
	// queues behind it on the per-repo lock.
	WaitsFor string `json:"waitsFor,omitempty"`
}

// Alive reports whether the process that wrote s still runs (and has not
// said it stopped): a daemon killed with -9 leaves a status that says
// running, with a pid that is gone.
func (s *Status) Alive() bool {
	if s == nil || s.Stage == StageStopped || s.PID <= 0 {
		return false
	}
	return process.Alive(s.PID) && !before(s.StartedAt, bootTime())
}

// ReadStatus reads stateDir/daemon.json; fs.ErrNotExist when no daemon ever
// ran on this home.
func ReadStatus(stateDir string) (*Status, error) {
	b, err := os.ReadFile(filepath.Join(stateDir, StatusFile))
	if err != nil {
		return nil, err
	}
	var s Status
	if err := json.Unmarshal(b, &s); err != nil {
		return nil, fmt.Errorf("%s: %w", filepath.Join(stateDir, StatusFile), err)
	}
	return &s, nil
}

// writeStatus writes s atomically (temp file, fsync, rename).
func writeStatus(stateDir string, s *Status) error {
	if err := os.MkdirAll(stateDir, 0o700); err != nil {
		return err
	}
	return atomicfile.WriteJSON(filepath.Join(stateDir, StatusFile), s, 0o600)
}

// IsNotExist reports whether err says there is no status file.
func IsNotExist(err error) bool { return errors.Is(err, fs.ErrNotExist) }

// before reports whether t is before boot (a zero boot time: unknown, false).
func before(t, boot time.Time) bool { return !boot.IsZero() && !t.IsZero() && t.Before(boot) }
