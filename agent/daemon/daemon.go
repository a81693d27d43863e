// Package daemon is `aq daemon`: the long-running fleet factory (DESIGN §10a,
// §11). It owns the loops of a factory and their lifetimes:
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
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"sync"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/azcore"
	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"
	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus/admin"
	"github.com/gofrs/flock"
	"github.com/hashicorp/go-cleanhttp"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

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
	Kind   string // taken | pipeline | engine | done
	Source string // broker | poll
	At     time.Time
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
	parts.Pipeline = &instrumented{inner: pipe, d: d}
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

func (d *Daemon) brokerConfig() dispatch.Config {
	c := d.cfg
	return dispatch.Config{FactoryID: c.FactoryID, Pool: c.FactoryPool, Namespace: c.SBNamespace, ConnectionString: c.SBConnectionString,
		Topic: c.SBTopic, Subscription: c.SBSubscription, Sessions: c.SBSessions}
}

// sourceOptions are the dispatch source's options for this factory id.
func (d *Daemon) sourceOptions(factoryID string) dispatch.SourceOptions {
	so := dispatch.SourceOptions{
		Poll:         pollPath{d},
		Handler:      d.runJob,
		Slots:        d.slots,
		ConnectGrace: d.o.ConnectGrace,
		Fatal: func(err error) bool {
			if fleet.IsAuth(err) {
				d.fail(err)
				return true
			}
			return false
		},
		OnSwitch: d.switched,
		Logger:   d.o.Log,
	}
	if bc := d.brokerConfig(); bc.Enabled() && !d.brokerRefused() {
		bc.FactoryID = factoryID
		t := d.o.Broker
		so.Broker = &dispatch.Options{
			Config: bc, Acceptor: acceptor{d}, Metrics: d.m, Logger: d.o.Log,
			OnHealth: d.brokerHealth, Credential: t.Credential, TLSConfig: t.TLSConfig, Backoff: t.Backoff, SDKRetry: t.SDKRetry,
			Unfit: d.unfit,
		}
	}
	return so
}

// unfit says why a broker message's job can no longer run here (a
// declared capability, or its repo, that this factory no longer offers):
// the message is dead-lettered rather than accepted — accepting would take
// a lease on a job that must fail here (repo_unavailable: an attempt
// burned), abandoning would bring it back to this subscription until the
// broker's max delivery count dead-letters it anyway. The job stays queued;
// the heartbeat with the new offer goes out now, so the coordinator
// re-dispatches it to a factory that fits (docs/fleet.md).
func (d *Daemon) unfit(ctx context.Context, m dispatch.Message) string {
	why := d.agent.Caps.Unfit(ctx, m.Caps, m.Repo)
	if why != "" {
		d.agent.Heartbeat.Kick()
	}
	return why
}

// acceptor is the broker path's POST /fleet/accept.
type acceptor struct{ d *Daemon }

func (a acceptor) Accept(ctx context.Context, jobID string) (dispatch.Accepted, error) {
	cl, err := a.d.agent.Client.Accept(ctx, jobID)
	if fleet.IsRouteAbsent(err) {
		// The coordinator has no accept (the start-up probe could not tell):
		// no message can ever be accepted, so the broker path goes off and
		// the poll path claims; this message is abandoned (redelivered,
		// then dead-lettered), its job stays queued for the claim.
		a.d.offBroker(err)
		return dispatch.Accepted{}, err
	}
	if err != nil {
		return dispatch.Accepted{}, err
	}
	a.d.take(cl)
	return dispatch.Accepted{Job: cl, LeaseEpoch: cl.LeaseEpoch, LeaseExpiresAt: cl.LeaseExpiresAt}, nil
}

// pollPath is the fleet Poller as the dispatch source drives it.
type pollPath struct{ d *Daemon }

func (pp pollPath) Tick(ctx context.Context) (dispatch.Accepted, bool, error) {
	cl, err := pp.d.agent.Poller.Tick(ctx)
	if cl == nil {
		return dispatch.Accepted{}, false, err
	}
	// Recorded before the next tick: its repo is busy from now on, so the
	// next claim does not advertise it.
	pp.d.take(cl)
	return dispatch.Accepted{Job: cl, LeaseEpoch: cl.LeaseEpoch, LeaseExpiresAt: cl.LeaseExpiresAt}, true, nil
}

func (pp pollPath) Wait() time.Duration { return pp.d.agent.Poller.Wait() }

// take records a job this factory now holds (its repo is busy from here).
func (d *Daemon) take(c *fleet.Claim) {
	now := time.Now().UTC()
	id := c.Job.ID
	d.mu.Lock()
	d.running[id] = &RunningJob{JobID: id, Repo: c.Job.Repo, LeaseEpoch: c.LeaseEpoch, Source: c.Source, Phase: "accepted", AcceptedAt: now}
	d.mu.Unlock()
	d.event(JobEvent{JobID: id, Kind: "taken", Source: c.Source, At: now})
	d.kickStatus()
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

// checkAccept refuses the broker path, before it opens, when the
// coordinator has no POST /fleet/accept (today's coordinator): a delivered
// message could not be accepted, so the poll path takes work instead. The
// client says so in one line when it learns it; the status file keeps it.
// A probe that cannot tell (the coordinator unreachable) leaves the broker
// path on: an accept that then fails abandons its message for redelivery.
func (d *Daemon) checkAccept(ctx context.Context) {
	if d.broker == nil {
		return
	}
	ok, err := d.agent.Client.Probe(ctx, fleet.RouteAccept)
	if err != nil {
		d.log.Debug("cannot tell whether the coordinator has POST /fleet/accept; the broker path stays on", "err", err)
		return
	}
	if !ok {
		d.mu.Lock()
		d.broker.Refused = "the coordinator has no POST /fleet/accept: broker deliveries cannot be accepted; jobs are claimed over the poll path"
		d.mu.Unlock()
		d.kickStatus()
	}
}

// offBroker turns the broker path off while the daemon runs (see acceptor).
func (d *Daemon) offBroker(why error) {
	d.mu.Lock()
	if d.broker != nil && d.broker.Refused == "" {
		d.broker.Refused = "the coordinator has no POST /fleet/accept: broker deliveries cannot be accepted; jobs are claimed over the poll path"
	}
	src := d.source
	d.mu.Unlock()
	if src != nil {
		src.OffBroker(why)
	}
	d.kickStatus()
}

// BrokerRefused reports whether a broker is configured but its path was
// turned off: the coordinator has no POST /fleet/accept.
func (d *Daemon) BrokerRefused() bool { return d.brokerRefused() }

// brokerRefused reports whether checkAccept turned the broker path off.
func (d *Daemon) brokerRefused() bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.broker != nil && d.broker.Refused != ""
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

// idleRepos are the repos the poll path offers: this host's repos minus the
// ones a running job holds (a claim for them would wait on the repo lock).
func (d *Daemon) idleRepos() []string {
	_, repos := d.agent.Client.Offer()
	d.mu.Lock()
	busy := map[string]bool{}
	for _, r := range d.running {
		busy[r.Repo] = true
	}
	d.mu.Unlock()
	out := repos[:0]
	for _, r := range repos {
		if !busy[r] {
			out = append(out, r)
		}
	}
	return out
}

// runJob is the Handler of both dispatch paths: it runs one job holding a
// slot (the source's) and the job's flock.
func (d *Daemon) runJob(_ context.Context, a dispatch.Accepted) {
	c, ok := a.Job.(*fleet.Claim)
	if !ok || c == nil {
		d.log.Error("dispatch handed over something that is not a claim", "type", fmt.Sprintf("%T", a.Job))
		return
	}
	id := c.Job.ID
	defer d.agent.LockJob(id)()
	d.mu.Lock()
	_, taken := d.running[id]
	d.mu.Unlock()
	if !taken {
		d.take(c)
	}

	ctx := d.jobsCtx
	started := d.dispatchCtx.Err() == nil
	if !started {
		// Taken as the drain began (a claim or an accept already under way):
		// not started, so not run — a cancelled context makes the job runner
		// give the lease back at once, with no attempt counted.
		d.log.Info("draining: giving back a job that had not started", "job", id, "repo", c.Job.Repo, "epoch", c.LeaseEpoch)
		var cancel context.CancelFunc
		ctx, cancel = context.WithCancel(ctx)
		cancel()
	} else {
		d.jobStarted()
		d.m.started.Inc()
	}
	res := d.agent.Jobs.Run(ctx, c)
	d.m.jobDone(res)
	d.ended(id, started, res)
	if started && d.o.OnResult != nil {
		d.o.OnResult(res)
	}

	d.mu.Lock()
	delete(d.running, id)
	d.lastBusy = time.Now()
	d.mu.Unlock()
	d.event(JobEvent{JobID: id, Kind: "done", Source: c.Source, At: time.Now()})
	d.kickStatus()
	if res.Err != nil && fleet.IsAuth(res.Err) {
		d.fail(res.Err)
	}
}

// ended counts a job that started here once its report settled, and has
// the worktrees' disk measured again.
func (d *Daemon) ended(id string, started bool, res *fleet.Result) {
	if !started {
		return
	}
	d.mu.Lock()
	var took time.Duration
	if rj := d.running[id]; rj != nil {
		took = time.Since(rj.AcceptedAt)
	}
	d.mu.Unlock()
	d.m.jobEnded(res, took)
	d.disk.Kick()
}

// watchGauges starts the gauges measured on a cadence, while /metrics is
// served: the worktrees' disk, and the broker's depth.
func (d *Daemon) watchGauges(ctx context.Context, wg *sync.WaitGroup) {
	if d.cfg.MetricsAddr == "" {
		return
	}
	wg.Go(func() { d.disk.run(ctx) })
	if d.depth == nil {
		return
	}
	var r depthReader
	if d.o.Broker.Admin != nil {
		r = d.o.Broker.Admin
	} else {
		dr, why, err := newDepthReader(d.brokerConfig(), d.o.Broker.Credential)
		switch {
		case err != nil:
			d.log.Warn("the broker depth gauges are off: "+err.Error(), "fix", "set AQ_BROKER_DEPTH_INTERVAL=0 to silence this")
			return
		case dr == nil:
			d.log.Info("the broker depth gauges are off: " + why)
			return
		}
		r = dr
	}
	wg.Go(func() { watchDepth(ctx, r, d.depth, d.cfg.BrokerDepthInterval, d.m.depthErrors.Inc, d.log) })
}

// event records a job's step.
func (d *Daemon) event(e JobEvent) {
	d.mu.Lock()
	rj := d.running[e.JobID]
	if rj != nil {
		switch e.Kind {
		case "pipeline":
			rj.Phase = "preparing"
		case "engine":
			rj.Phase, rj.EngineAt = "running", e.At.UTC()
			d.m.toEngine.WithLabelValues(rj.Source).Observe(e.At.Sub(rj.AcceptedAt).Seconds())
			d.m.startup.WithLabelValues(rj.Source).Observe(e.At.Sub(rj.AcceptedAt).Seconds())
		}
		if e.Source == "" {
			e.Source = rj.Source
		}
	}
	d.mu.Unlock()
	if d.o.OnJobEvent != nil {
		d.o.OnJobEvent(e)
	}
	if e.Kind == "engine" {
		d.kickStatus()
	}
}

// instrumented wraps the pipeline to see when a job reaches the runner and
// when its engine starts (the runner's "started" event, after the repo lock
// and the worktree).
type instrumented struct {
	inner fleet.Pipeline
	d     *Daemon
}

func (p *instrumented) Run(ctx context.Context, j *job.Job, o runner.Options) runner.Outcome {
	p.d.event(JobEvent{JobID: j.ID, Kind: "pipeline", At: time.Now()})
	user := o.OnEvent
	o.OnEvent = func(e runner.Event) {
		if e.Kind == "started" {
			p.d.event(JobEvent{JobID: j.ID, Kind: "engine", At: time.Now()})
		}
		if user != nil {
			user(e)
		}
	}
	return p.inner.Run(ctx, j, o)
}

// switched is the source's hand-off report.
func (d *Daemon) switched(live string, why error) {
	d.mu.Lock()
	d.sourceSince = time.Now().UTC()
	d.mu.Unlock()
	if live != dispatch.LiveNone {
		d.m.switches.WithLabelValues(live).Inc()
	}
	d.kickStatus()
}

// brokerHealth is the receiver's report, for the status; a missing
// subscription stops a replica that has not started a job
// (RequireSubscription).
func (d *Daemon) brokerHealth(h dispatch.Health) {
	d.mu.Lock()
	if d.broker != nil {
		d.broker.Healthy, d.broker.Since, d.broker.Error = h.Healthy, h.Since.UTC(), errString(h.Err)
	}
	idle := d.started == 0
	d.mu.Unlock()
	d.kickStatus()
	if !h.Healthy && d.o.RequireSubscription && idle && dispatch.IsMissingSubscription(h.Err) {
		d.fail(aqerr.Wrap(aqerr.Usage, h.Err, h.Err.Error(), "a replica receives from its pool's subscription; nothing was taken or run"))
	}
}

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
	for _, r := range d.agent.Client.AbsentRoutes() {
		st.AbsentRoutes = append(st.AbsentRoutes, AbsentRoute{Route: r, Fallback: fleet.Fallbacks[r]})
	}
	for _, r := range d.running {
		rj := *r
		if rj.Phase != "running" {
			// Queued behind the same-repo job whose engine runs (it holds
			// the repo lock).
			for _, o := range d.running {
				if o.Repo == rj.Repo && o.Phase == "running" {
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

// serveMetrics listens on AQ_METRICS_ADDR and serves /metrics and /healthz
// until ctx is done.
func (d *Daemon) serveMetrics(ctx context.Context, wg *sync.WaitGroup) error {
	addr := d.cfg.MetricsAddr
	if addr == "" {
		return nil
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return aqerr.Wrap(aqerr.Usage, err, fmt.Sprintf("AQ_METRICS_ADDR=%s: cannot listen: %v", addr, err), "pick a free host:port, or unset AQ_METRICS_ADDR")
	}
	d.mu.Lock()
	d.metricsAddr = ln.Addr().String()
	d.mu.Unlock()
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(d.m.reg, promhttp.HandlerOpts{Registry: d.m.reg}))
	mux.HandleFunc("/healthz", d.healthz)
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	wg.Add(2)
	go func() {
		defer wg.Done()
		_ = srv.Serve(ln)
	}()
	go func() {
		defer wg.Done()
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
	}()
	d.log.Info("serving /metrics and /healthz", "addr", d.metricsAddr)
	return nil
}

// healthz answers 200 while the last heartbeat the coordinator took is
// younger than twice the heartbeat interval, else 503.
func (d *Daemon) healthz(w http.ResponseWriter, r *http.Request) {
	hb := d.agent.Heartbeat
	now := time.Now()
	ok := hb.Healthy(now)
	body := map[string]any{"healthy": ok, "stage": d.Stage(), "source": d.Live(), "heartbeatEverySec": d.cfg.Heartbeat.Seconds()}
	if t := hb.LastOK(); !t.IsZero() {
		body["lastHeartbeat"] = t.UTC()
		body["heartbeatAgeSec"] = now.Sub(t).Seconds()
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	if ok {
		w.WriteHeader(http.StatusOK)
	} else {
		w.WriteHeader(http.StatusServiceUnavailable)
	}
	_ = json.NewEncoder(w).Encode(body)
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}
