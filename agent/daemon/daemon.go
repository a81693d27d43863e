// Package daemon is `aq daemon`: the long-running fleet factory (docs/daemon.md;
// its metrics in docs/observability.md). It owns the loops of a factory and their lifetimes:
//
//   - the fleet session (agent/fleet): enrollment, the first heartbeat, the
//     spool drain at start, then the heartbeat loop and the spool-drain loop;
//   - start-up recovery of a previous run's orphans (checkpoint, WIP push
//     under a confirmed lease, /fleet/fail retryable) before any new work;
//   - the dispatch source (agent/dispatch): the Service Bus receiver as the
//     primary path and the poll path while the broker is unhealthy, both
//     taking a slot before they take work;
//   - one job runner per slot (fleet.JobRunner: lease renewal, reports), each
//     holding the job's flock while it runs;
//   - the status file ($AQ_HOME/state/daemon.json), /metrics and /healthz.
//
// Every goroutine is owned by a context and a WaitGroup and none outlives
// Run. Stopping has three stages: Drain (no new work; running jobs finish
// and are reported), Abort (running jobs are stopped through the kill ladder,
// checkpointed with their WIP pushed, and failed as retryable so their leases
// free at once), and — in the command, on a third signal — returning at once.
package daemon

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/azcore"
	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"
	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus/admin"
	"github.com/gofrs/flock"
	"github.com/hashicorp/go-cleanhttp"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/aqfleet/aq/agent/config"
	"github.com/aqfleet/aq/agent/dispatch"
	"github.com/aqfleet/aq/agent/fleet"
	"github.com/aqfleet/aq/agent/runner"
	"github.com/aqfleet/aq/internal/aqerr"
	"github.com/aqfleet/aq/internal/logging"
	"github.com/aqfleet/aq/internal/secrets"
	"github.com/aqfleet/aq/internal/version"
	"github.com/aqfleet/aq/job"
)

// Options configure a Daemon.
type Options struct {
	Config   *config.Config
	Log      *slog.Logger
	Redactor *secrets.Redactor
	// Parts are handed to the fleet agent; zero values are the production
	// choices (tests and benchmarks inject engines, budgets, a host).
	Parts fleet.Parts
	// Broker tunes the Service Bus receiver (tests); zero: its defaults.
	Broker BrokerTuning
	// ConnectGrace is how long the poll path waits at start for the broker's
	// first health report (default 10 s).
	ConnectGrace time.Duration
	// DrainTimeout overrides Config.DrainTimeout when set.
	DrainTimeout time.Duration
	// Limits end the daemon on its own (idle, jobs started, uptime).
	Limits Limits
	// OnJobEvent, if set, sees each job's progress: "taken" (accepted or
	// claimed), "pipeline" (handed to the runner: repo lock and worktree
	// next), "engine" (the engine starts), "done". Tests and the dispatch
	// benchmark time dispatch with it.
	OnJobEvent func(JobEvent)
	// RequireSubscription stops the daemon (Run returns a usage error: exit
	// 2) when the broker says its subscription does not exist before any job
	// started: a replica a scaler starts for its subscription's messages
	// cannot be right without it. A long-running daemon instead logs it and
	// keeps to the poll path until the subscription appears.
	RequireSubscription bool
	// OnResult, if set, is called with each job's result once it is
	// reported (not for a job given back at a drain before it started):
	// `aq run` in fleet mode with a broker prints and counts them.
	OnResult func(*fleet.Result)
}

// BrokerTuning are the receiver's knobs that do not come from configuration.
type BrokerTuning struct {
	Backoff    dispatch.Backoff
	SDKRetry   *azservicebus.RetryOptions
	TLSConfig  *tls.Config
	Credential azcore.TokenCredential
	// Admin reads the subscription's depth (nil: an admin client built from
	// the namespace or connection string); tests point it at the local
	// peer's management endpoint.
	Admin *admin.Client
}

// JobEvent is one step of a job in the daemon.
type JobEvent struct {
	JobID  string
	Kind   string // taken | pipeline | engine | repair | done
	Source string // broker | poll
	At     time.Time
	// Round and Rounds are a repair round's (Kind repair): round k of n.
	Round, Rounds int
}

// Daemon is one `aq daemon`. Build it with New, run it with Run (once).
type Daemon struct {
	o     Options
	cfg   *config.Config
	log   *slog.Logger
	agent *fleet.Agent
	hc    *http.Client
	slots *dispatch.Semaphore
	m     *metrics
	disk  *diskGauge   // aq_worktree_disk_bytes
	depth *brokerDepth // the broker depth gauges; nil when not read

	kick     chan struct{} // the status writer's
	statusMu sync.Mutex

	mu          sync.Mutex
	stage       Stage
	pending     Stage // a stop asked for before Run made its contexts
	startedAt   time.Time
	started     int       // jobs started (Limits.MaxJobs)
	lastBusy    time.Time // a job ran or arrived (Limits.IdleTimeout)
	running     map[string]*RunningJob
	recovered   []string
	fatal       error
	source      *dispatch.Source
	sourceSince time.Time
	broker      *Broker
	metricsAddr string
	drainTimer  *time.Timer
	factoryID   string

	dispatchCtx    context.Context
	dispatchCancel context.CancelFunc
	jobsCancel     context.CancelCauseFunc
	jobsCtx        context.Context
}

// New builds the daemon of o.Config: the fleet agent (its runner wrapped to
// report progress), the slots, the metrics. It dials nothing and refuses a
// configuration it cannot run (exit 2).
func New(o Options) (*Daemon, error) {
	cfg := o.Config
	if cfg == nil {
		return nil, errors.New("daemon: no configuration")
	}
	if err := o.Limits.Check(); err != nil {
		return nil, aqerr.Usagef("use 0 for no limit", "%v", err)
	}
	switch {
	case !cfg.Fleet:
		return nil, aqerr.Usagef("set AQ_FLEET=1 and AQ_FLEET_API (for the local queue use aq run)", "aq daemon runs a fleet factory, but fleet mode is off")
	case !cfg.FleetRoute:
		return nil, aqerr.Usagef("unset AQ_FLEET_ROUTE=0, or run the local queue with aq run", "AQ_FLEET_ROUTE=0 routes work to the local queue; aq daemon takes it from the fleet")
	case cfg.FleetShadow:
		return nil, aqerr.Usagef("unset AQ_FLEET_SHADOW, or use aq run for shadow mode", "aq daemon does not run in shadow mode")
	case cfg.FleetAPI == "":
		return nil, aqerr.Usagef("set AQ_FLEET_API to the coordinator's URL (aq demo coordinator prints one)", "fleet mode (AQ_FLEET=1) needs AQ_FLEET_API")
	}
	if o.Log == nil {
		o.Log = logging.Discard()
	}
	if o.Redactor == nil {
		o.Redactor = secrets.NewRedactor(nil)
	}
	if o.DrainTimeout == 0 {
		o.DrainTimeout = cfg.DrainTimeout
	}
	d := &Daemon{o: o, cfg: cfg, log: o.Log.With("component", "daemon"), stage: StageStarting,
		running: map[string]*RunningJob{}, kick: make(chan struct{}, 1), factoryID: cfg.FactoryID}
	d.slots = dispatch.NewSemaphore(cfg.Slots)

	parts := o.Parts
	d.hc = parts.HTTP
	if d.hc == nil {
		d.hc = cleanhttp.DefaultPooledClient()
		parts.HTTP = d.hc
	}
	pipe := parts.Pipeline
	if pipe == nil {
		r, err := runner.FromConfig(cfg, runner.Parts{Engines: parts.Engines, Shipper: parts.Shipper, Log: o.Log, Redactor: o.Redactor, FetchBase: true, Tracer: parts.Tracer})
		if err != nil {
			return nil, err
		}
		pipe = r
	}
	parts.Pipeline = pipe
	a, err := fleet.New(cfg, o.Log, o.Redactor, parts)
	if err != nil {
		return nil, err
	}
	d.agent = a
	if cfg.SBConnectionString != "" {
		o.Redactor.Add(dispatch.ConnectionStringSecrets(cfg.SBConnectionString)...)
	}
	d.disk = newDiskGauge(cfg.WorktreesDir())
	var depth prometheus.Collector
	if bc := d.brokerConfig(); bc.Enabled() && cfg.MetricsAddr != "" && cfg.BrokerDepthInterval > 0 {
		d.depth = newBrokerDepth(bc.Topic, bc.Subscription)
		depth = d.depth
	}
	d.m = newMetrics(gauges{
		running: func() float64 { return float64(a.Running.Len()) },
		disk:    d.disk.value,
		depth:   depth,
		slots:   func() float64 { return float64(cfg.Slots) },
		spool:   func() float64 { return float64(a.Reporter.Spool.Depth()) },
		source: func(s string) float64 {
			if d.Live() == s {
				return 1
			}
			return 0
		},
		lastBeat: func() float64 {
			if t := a.Heartbeat.LastOK(); !t.IsZero() {
				return float64(t.UnixNano()) / 1e9
			}
			return 0
		},
		healthy: func() float64 {
			if a.Heartbeat.Healthy(time.Now()) {
				return 1
			}
			return 0
		},
		connected: func() float64 {
			d.mu.Lock()
			defer d.mu.Unlock()
			if d.broker != nil && d.broker.Healthy {
				return 1
			}
			return 0
		},
	})
	a.Jobs.RenewFailed = d.m.renewFailed
	a.Jobs.OnEvent = d.jobEvent
	a.Client.Observe(func(r fleet.CallResult) {
		d.m.observe(r)
		if r.Call == "POST /fleet/factories/heartbeat" {
			d.kickStatus()
		}
	})
	if d.brokerConfig().Enabled() {
		// Refuse what the receiver would refuse, now, before anything dials.
		if _, err := dispatch.NewSource(d.sourceOptions(cfg.FactoryID)); err != nil {
			return nil, err
		}
		d.broker = &Broker{}
	}
	return d, nil
}

// Agent is the fleet agent the daemon runs (tests look inside).
func (d *Daemon) Agent() *fleet.Agent { return d.agent }

// Stage is where the daemon is.
func (d *Daemon) Stage() Stage {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.stage
}

// Live is the dispatch path work comes from now (dispatch.LiveBroker,
// LivePoll or LiveNone).
func (d *Daemon) Live() string {
	d.mu.Lock()
	src := d.source
	d.mu.Unlock()
	if src == nil {
		return dispatch.LiveNone
	}
	return src.Live()
}

// PollTicks counts the poll path's looks at the queue (0 before dispatch).
func (d *Daemon) PollTicks() int64 {
	d.mu.Lock()
	src := d.source
	d.mu.Unlock()
	if src == nil {
		return 0
	}
	return src.PollTicks()
}

// MetricsAddr is the address /metrics and /healthz are served on ("" when
// off), once Run has bound it.
func (d *Daemon) MetricsAddr() string {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.metricsAddr
}

// Drain is the first stop: no new work; running jobs finish and are
// reported, then Run returns. With a drain timeout, Abort follows when it
// passes. Safe to call at any time, more than once.
func (d *Daemon) Drain() {
	d.mu.Lock()
	switch d.stage {
	case StageDraining, StageAborting, StageStopped:
		d.mu.Unlock()
		return
	}
	d.stage = StageDraining
	cancel := d.dispatchCancel
	if cancel == nil {
		d.pending = StageDraining
	}
	n := len(d.running)
	if to := d.o.DrainTimeout; to > 0 && d.drainTimer == nil {
		d.drainTimer = time.AfterFunc(to, func() {
			d.log.Warn("drain timeout passed: stopping the running jobs", "drain_timeout", to)
			d.Abort()
		})
	}
	d.mu.Unlock()
	d.log.Info("draining: taking no new work; running jobs finish and are reported", "running", n, "drain_timeout", d.o.DrainTimeout)
	if cancel != nil {
		cancel()
	}
	d.kickStatus()
}

// Abort is the second stop: no new work, and every running job is stopped
// through the kill ladder, checkpointed (its WIP ref pushed while the lease
// is held) and failed as retryable (interrupted), so its lease frees at once;
// then Run returns. Safe to call at any time, more than once.
func (d *Daemon) Abort() {
	d.abort(job.Stop(job.ReasonInterrupted, "aq daemon was stopped before the job finished"))
}

func (d *Daemon) abort(cause error) {
	d.mu.Lock()
	if d.stage == StageAborting || d.stage == StageStopped {
		d.mu.Unlock()
		return
	}
	d.stage = StageAborting
	if d.drainTimer != nil {
		d.drainTimer.Stop()
	}
	dc, jc := d.dispatchCancel, d.jobsCancel
	if dc == nil {
		d.pending = StageAborting
	}
	n := len(d.running)
	d.mu.Unlock()
	d.log.Warn("stopping: running jobs are cancelled, checkpointed and failed as retryable", "running", n)
	if dc != nil {
		dc()
		jc(cause)
	}
	d.kickStatus()
}

// fail stops the daemon on its own: the coordinator refused this factory's
// credentials. Running jobs are stopped (their reports cannot be delivered
// now: they wait in the spool) and Run returns err.
func (d *Daemon) fail(err error) {
	d.mu.Lock()
	first := d.fatal == nil
	if first {
		d.fatal = err
	}
	d.mu.Unlock()
	if first {
		d.log.Error("stopping: "+err.Error(), "err", err)
		why := "the coordinator refused this factory's credentials"
		if dispatch.IsMissingSubscription(err) {
			why = "its Service Bus subscription does not exist"
		}
		d.abort(job.Stop(job.ReasonInterrupted, "aq daemon stopped: "+why))
	}
}

// Run runs the daemon until it is stopped: ctx being done counts as Drain.
// It returns nil after a drain or an abort, the *fleet.AuthError when the
// coordinator refused the credentials (at start or later), and a start-up
// error otherwise (configuration: exit 2).
func (d *Daemon) Run(ctx context.Context) (err error) {
	d.mu.Lock()
	d.startedAt = time.Now().UTC()
	d.lastBusy = d.startedAt
	life, lifeCancel := context.WithCancel(context.WithoutCancel(ctx))
	d.jobsCtx, d.jobsCancel = context.WithCancelCause(life)
	dctx, dcancel := context.WithCancel(life)
	d.dispatchCtx, d.dispatchCancel = dctx, dcancel
	switch d.pending {
	case StageDraining:
		dcancel()
	case StageAborting:
		dcancel()
		d.jobsCancel(job.Stop(job.ReasonInterrupted, "aq daemon was stopped before the job finished"))
	}
	d.mu.Unlock()
	defer lifeCancel()

	release, err := d.lockHome()
	if err != nil {
		return err
	}
	defer release()

	var wg sync.WaitGroup // the daemon's own loops
	defer func() {
		lifeCancel()
		wg.Wait()
		d.mu.Lock()
		if d.drainTimer != nil {
			d.drainTimer.Stop()
		}
		d.stage = StageStopped
		d.mu.Unlock()
		d.writeStatus(err)
		d.hc.CloseIdleConnections()
		d.log.Info("aq daemon stopped", "err", errString(err))
	}()

	stopDrain := context.AfterFunc(ctx, d.Drain)
	defer stopDrain()
	d.watchLimits(life, &wg)

	if err := d.serveMetrics(life, &wg); err != nil {
		return err
	}
	d.watchGauges(life, &wg)
	wg.Add(1)
	go func() {
		defer wg.Done()
		d.statusLoop(life)
	}()

	// Start: enroll, first heartbeat, spool drain; heartbeats from here
	// until the very end (running jobs need them during a drain).
	d.log.Info("aq daemon starting", "factory", d.cfg.FactoryID, "slots", d.cfg.Slots, "broker", d.broker != nil,
		"gate", d.cfg.FleetGate, "version", version.Get().Version)
	startCtx, startCancel := context.WithCancel(life)
	stopStart := context.AfterFunc(dctx, startCancel) // a stop during start-up ends it
	sess, err := d.agent.Start(startCtx)
	stopStart()
	if err != nil {
		startCancel()
		if dctx.Err() != nil && !fleet.IsAuth(err) {
			return nil // stopped while starting
		}
		return err
	}
	defer func() {
		sess.Stop()
		startCancel()
	}()
	d.mu.Lock()
	d.factoryID = sess.Creds.FactoryID
	if d.factoryID == "" {
		d.factoryID = d.agent.Client.FactoryID()
	}
	d.mu.Unlock()
	wg.Add(1)
	go func() {
		defer wg.Done()
		select {
		case <-sess.Context().Done():
			if e := sess.Err(); e != nil {
				d.fail(e)
			}
		case <-life.Done():
		}
	}()

	// Orphans of a previous run, before any new work.
	d.setStage(StageRecovering)
	d.recover(d.jobsCtx) // a second stop ends it between orphans
	if e := d.fatalErr(); e != nil {
		return e
	}

	d.checkAccept(dctx)
	d.agent.Poller.Repos = d.idleRepos
	src, err := dispatch.NewSource(d.sourceOptions(d.factoryID))
	if err != nil {
		return err
	}
	d.mu.Lock()
	d.source = src
	d.mu.Unlock()
	d.setStage(StageRunning)
	d.log.Info("aq daemon running", "factory", d.factoryID, "slots", d.cfg.Slots)
	serr := src.Run(dctx) // returns once every running job has finished and reported
	if e := d.fatalErr(); e != nil {
		return e
	}
	if serr == nil {
		sess.Stop() // no heartbeat may follow the last one
		d.leave(life)
	}
	return serr
}

// leave tells the coordinator this factory is going: a last heartbeat with
// health "offline", then deregister (a coordinator without the route is
// fine), so short-lived replicas do not pile up as stale factories. Best
// effort, bounded: the exit does not wait on a coordinator that is away.
func (d *Daemon) leave(parent context.Context) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(parent), 5*time.Second)
	defer cancel()
	if err := d.agent.Heartbeat.Offline(ctx); err != nil {
		d.log.Warn("cannot send the offline heartbeat", "err", err)
	}
	if err := d.agent.Client.Deregister(ctx); err != nil {
		d.log.Warn("cannot deregister from the coordinator; it will count this factory stale", "err", err)
		return
	}
	d.log.Info("left the fleet: offline heartbeat sent, deregistered")
}

func (d *Daemon) fatalErr() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.fatal
}

func (d *Daemon) setStage(s Stage) {
	d.mu.Lock()
	if d.stage == StageStarting || d.stage == StageRecovering || d.stage == StageRunning {
		d.stage = s
	}
	d.mu.Unlock()
	d.kickStatus()
}

// lockHome takes $AQ_HOME/locks/daemon.lock: one daemon per aq home.
func (d *Daemon) lockHome() (func(), error) {
	dir := d.cfg.LocksDir()
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	fl := flock.New(filepath.Join(dir, "daemon.lock"), flock.SetPermissions(0o600))
	ok, err := fl.TryLock()
	if err != nil {
		return nil, fmt.Errorf("lock %s: %w", fl.Path(), err)
	}
	if !ok {
		who := ""
		if st, err := ReadStatus(d.cfg.StateDir()); err == nil && st.Alive() {
			who = fmt.Sprintf(" (pid %d)", st.PID)
		}
		return nil, aqerr.Usagef("stop it first, or give this daemon its own AQ_HOME", "another aq daemon runs on %s%s", d.cfg.Home, who)
	}
	return func() { _ = fl.Unlock() }, nil
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}
