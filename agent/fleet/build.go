package fleet

import (
	"context"
	"log/slog"
	"net/http"
	"path/filepath"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/aqfleet/aq/agent/caps"
	"github.com/aqfleet/aq/agent/config"
	"github.com/aqfleet/aq/agent/holds"
	"github.com/aqfleet/aq/agent/jobstate"
	"github.com/aqfleet/aq/agent/lifecycle"
	"github.com/aqfleet/aq/agent/manifest"
	"github.com/aqfleet/aq/agent/notify"
	"github.com/aqfleet/aq/agent/repos"
	"github.com/aqfleet/aq/agent/runner"
	"github.com/aqfleet/aq/agent/ship"
	"github.com/aqfleet/aq/engines"
	"github.com/aqfleet/aq/internal/hostfault"
	"github.com/aqfleet/aq/internal/sandbox"
	"github.com/aqfleet/aq/internal/secrets"
	"github.com/aqfleet/aq/internal/version"
	"github.com/aqfleet/aq/profiles"
)

// Parts are what a fleet agent is built from besides configuration; zero
// values mean the production choice. Tests and the demo inject here.
type Parts struct {
	Catalog  *profiles.Catalog
	Engines  runner.Engines
	Shipper  runner.Shipper
	Budgets  *Budgets
	Clock    Clock
	HTTP     *http.Client
	Host     func(ctx context.Context) (*caps.Host, error)
	Pipeline lifecycle.Pipeline // default: a runner.Runner from configuration
	// SafetyInterval of the gated poll path (0: DefaultSafetyInterval).
	SafetyInterval time.Duration
	// Tracer records a trace per job (nil: none); Notifier is told of each
	// job's end (nil: off).
	Tracer   trace.Tracer
	Notifier *notify.Notifier
	// LiveLogEvery and LiveLogBacklog tune the live log (0: the defaults,
	// a flush a second and a 1 MiB backlog).
	LiveLogEvery   time.Duration
	LiveLogBacklog int64
}

// DetectHost is the production detection of cfg's host: caps.Detect over
// the repo base and the clonable repos, with the engines' probes cached in
// runner.ProbeCachePath (an unchanged binary is not run again: a refresh,
// or the next `aq run --once`), and the engines' sandbox (sb, the
// runner's: offered as sandbox:<level>; nil offers none).
func DetectHost(cfg *config.Config, sb *sandbox.Host) func(ctx context.Context) (*caps.Host, error) {
	probes := engines.NewProbeCache(runner.ProbeCachePath(cfg.Home))
	return func(ctx context.Context) (*caps.Host, error) {
		return caps.Detect(ctx, caps.DetectOptions{RepoBase: cfg.RepoBase, Clonable: repos.Clonable(cfg.RepoURLs), Probes: probes,
			Engines: cfg.RunEngines(true), EnginesListed: cfg.EnginesExplicit(), Sandbox: sb, HelpTimeout: cfg.EngineProbeTimeout})
	}
}

// NewClientFromConfig builds the coordinator client of cfg (no network I/O).
func NewClientFromConfig(cfg *config.Config, log *slog.Logger, red *secrets.Redactor, budgets *Budgets, hc *http.Client) (*Client, error) {
	b := DefaultBudgets(cfg.Heartbeat)
	if budgets != nil {
		b = *budgets
	}
	return NewClient(ClientOptions{API: cfg.FleetAPI, Token: cfg.FleetToken, ProductID: cfg.ProductID, FactoryID: cfg.FactoryID,
		Budgets: b, HTTP: hc, Redactor: red, Log: log, Holds: holds.Open(runner.HoldsPath(cfg.Home), nil)})
}

// New builds the fleet agent of cfg: the client, the runner (fetching base
// from origin: a factory's checkouts may be stale), jobstate records under
// $AQ_HOME/state/jobs, the spool under $AQ_HOME/spool, heartbeats and the
// poll path. Nothing is dialled until Start.
func New(cfg *config.Config, log *slog.Logger, red *secrets.Redactor, parts Parts) (*Agent, error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	c, err := NewClientFromConfig(cfg, log, red, parts.Budgets, parts.HTTP)
	if err != nil {
		return nil, err
	}
	cat := parts.Catalog
	if cat == nil {
		if cat, err = profiles.Load(filepath.Join(cfg.Home, "profiles")); err != nil {
			return nil, err
		}
	}
	records, err := jobstate.Open(filepath.Join(cfg.StateDir(), "jobs"))
	if err != nil {
		return nil, err
	}
	spool, err := OpenSpool(cfg.SpoolDir())
	if err != nil {
		return nil, err
	}
	artSpool, err := OpenSpool(filepath.Join(cfg.SpoolDir(), "artifacts"))
	if err != nil {
		return nil, err
	}
	pipe := parts.Pipeline
	if pipe == nil {
		shipper := parts.Shipper
		if shipper == nil {
			shipper = &ship.GH{}
		}
		r, err := runner.FromConfig(cfg, runner.Parts{Engines: parts.Engines, Shipper: shipper, Log: log, Redactor: red, FetchBase: true, Fleet: true, Tracer: parts.Tracer})
		if err != nil {
			return nil, err
		}
		pipe = r
	}
	// The runner's sandbox is offered (sandbox:<level>) and admits the
	// jobs that require one (manifest.Policy.Sandbox); a pipeline that is
	// not a runner (tests) has neither.
	policy := manifest.Policy{Fleet: true, Engines: cfg.RunEngines(true)}
	var sb *sandbox.Host
	if r, ok := pipe.(*runner.Runner); ok {
		sb, policy.Sandbox = r.Sandbox, r.SandboxLevel
	}
	host := parts.Host
	if host == nil {
		host = DetectHost(cfg, sb)
	}
	clock := parts.Clock
	if clock == nil {
		clock = RealClock{}
	}
	running := &Running{}
	// $AQ_HOME takes writes (hostfault): checked before a claim, before a
	// job starts and after a run that failed.
	hostCheck := func() error { return hostfault.Probe(cfg.StateDir()) }
	rep := &Reporter{Client: c, Spool: spool, Records: records, Log: log, Clock: clock}
	hb := &Heartbeater{Client: c, Interval: cfg.Heartbeat, Running: running, SeatLimit: cfg.Slots,
		Version: version.Get().Version, Pool: cfg.FactoryPool, Clock: clock, Log: log}
	refresh := &Refresher{Client: c, Detect: host, RepoBase: cfg.RepoBase, Every: cfg.CapsRefresh, Clock: clock, Log: log, Changed: hb.Kick}
	hb.Refresher = refresh
	arts := &Artifacts{Reporter: &Reporter{Client: c, Spool: artSpool, Log: log, Clock: clock}, LogsDir: cfg.LogsDir(), Redactor: red, Log: log}
	return &Agent{
		Client:    c,
		Heartbeat: hb,
		Caps:      refresh,
		Poller: &Poller{Client: c, Base: cfg.Poll, Gate: cfg.FleetGate, SafetyInterval: parts.SafetyInterval, Clock: clock, Log: log,
			Refresher: refresh, Ready: hostCheck},
		Reporter:  rep,
		Artifacts: arts,
		Jobs: &JobRunner{Client: c, Pipeline: pipe, Reporter: rep, Records: records, Running: running, Catalog: cat,
			Policy:     policy,
			HostCheck:  hostCheck,
			LeaseRenew: cfg.LeaseRenew, Clock: clock, Log: log, Tracer: parts.Tracer, Notifier: parts.Notifier, Artifacts: arts,
			LiveLogs: &LiveLogs{Client: c, LogsDir: cfg.LogsDir(), Redactor: red, Every: parts.LiveLogEvery, Backlog: parts.LiveLogBacklog, Log: log}},
		Running:  running,
		Host:     host,
		Enroll:   EnrollOptions{Path: cfg.CredentialsFile(), EnvToken: cfg.FleetToken, Log: log},
		LocksDir: cfg.LocksDir(),
		Log:      log,
	}, nil
}
