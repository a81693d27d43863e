package daemon

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/aqfleet/aq/agent/caps"
	"github.com/aqfleet/aq/agent/dispatch"
	"github.com/aqfleet/aq/agent/fleet"
	"github.com/aqfleet/aq/internal/atomicfile"
	"github.com/aqfleet/aq/internal/process"
	"github.com/aqfleet/aq/internal/safefs"
	"github.com/aqfleet/aq/internal/version"
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
	// Sandbox is how the daemon runs engines (AQ_SANDBOX and the host's
	// probe: the level, the guarantees that hold and those missing), as
	// it offers it (sandbox:<level>); nil before its host is detected.
	Sandbox *caps.Sandbox `json:"sandbox,omitempty"`
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
	Phase      string    `json:"phase"`  // accepted | preparing (repo lock, worktree) | running (engine started) | repair k/n (a repair round after a failed verify)
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

// maxStatusBytes bounds the status file's read: what writeStatus writes is
// a few KiB.
const maxStatusBytes = 1 << 20

// ReadStatus reads stateDir/daemon.json; fs.ErrNotExist when no daemon ever
// ran on this home.
func ReadStatus(stateDir string) (*Status, error) {
	// Through the safe helper: a link, FIFO or device in its place is
	// refused, not followed, and a read never blocks (docs/sandbox.md).
	b, err := safefs.ReadFile("state", stateDir, StatusFile, maxStatusBytes)
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

func (d *Daemon) kickStatus() {
	select {
	case d.kick <- struct{}{}:
	default:
	}
}

// statusLoop rewrites the status file on every change and at the heartbeat
// cadence until ctx is done.
func (d *Daemon) statusLoop(ctx context.Context) {
	every := d.cfg.Heartbeat
	if every <= 0 {
		every = 30 * time.Second
	}
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		d.writeStatus(nil)
		select {
		case <-ctx.Done():
			return
		case <-d.kick:
		case <-t.C:
		}
	}
}

// snapshot is the status as of now.
func (d *Daemon) snapshot(runErr error) *Status {
	hb := d.agent.Heartbeat
	now := time.Now().UTC()
	d.mu.Lock()
	defer d.mu.Unlock()
	st := &Status{
		V: 1, PID: os.Getpid(), FactoryID: d.factoryID, Version: version.Get().Version, Stage: d.stage,
		StartedAt: d.startedAt, UpdatedAt: now, Slots: d.cfg.Slots, Busy: len(d.running),
		Source: dispatch.LiveNone, SourceSince: d.sourceSince, Gate: d.cfg.FleetGate && d.agent.Client.Has(fleet.RouteQueueState),
		LastHeartbeat: hb.LastOK().UTC(), HeartbeatEvery: d.cfg.Heartbeat.Seconds(), HeartbeatHealthy: hb.Healthy(time.Now()),
		MetricsAddr: d.metricsAddr, Running: []RunningJob{}, Recovered: d.recovered,
	}
	if d.source != nil {
		st.Source = d.source.Live()
	}
	if d.broker != nil {
		b := *d.broker
		st.Broker = &b
	}
	if d.agent.Caps != nil {
		if h := d.agent.Caps.Host(); h != nil {
			st.Sandbox = h.Sandbox
		}
	}
	for _, r := range d.agent.Client.AbsentRoutes() {
		st.AbsentRoutes = append(st.AbsentRoutes, AbsentRoute{Route: r, Fallback: fleet.Fallbacks[r]})
	}
	for _, r := range d.running {
		rj := *r
		if !pastTheLock(rj.Phase) {
			// Queued behind the same-repo job whose engine runs (it holds
			// the repo lock).
			for _, o := range d.running {
				if o.Repo == rj.Repo && pastTheLock(o.Phase) {
					rj.WaitsFor = o.JobID
				}
			}
		}
		st.Running = append(st.Running, rj)
	}
	sort.Slice(st.Running, func(i, j int) bool { return st.Running[i].AcceptedAt.Before(st.Running[j].AcceptedAt) })
	if d.stage == StageStopped {
		st.StoppedAt, st.Source = now, dispatch.LiveNone
	}
	if err := runErr; err != nil {
		st.Error = err.Error()
	} else if d.fatal != nil {
		st.Error = d.fatal.Error()
	}
	return st
}

func (d *Daemon) writeStatus(runErr error) {
	st := d.snapshot(runErr)
	d.statusMu.Lock() // the loop and Run's last write
	defer d.statusMu.Unlock()
	if err := writeStatus(d.cfg.StateDir(), st); err != nil {
		d.log.Warn("cannot write the status file", "err", err)
	}
}

// pastTheLock reports whether a job in phase holds its repo's lock: its
// engine runs (the first run, or a repair round).
func pastTheLock(phase string) bool { return phase == "running" || strings.HasPrefix(phase, "repair ") }
