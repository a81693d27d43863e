package local

import (
	"context"
	"log/slog"
	"path/filepath"

	"go.opentelemetry.io/otel/trace"

	"github.com/aqfleet/aq/agent/caps"
	"github.com/aqfleet/aq/agent/config"
	"github.com/aqfleet/aq/agent/manifest"
	"github.com/aqfleet/aq/agent/notify"
	"github.com/aqfleet/aq/agent/queue"
	"github.com/aqfleet/aq/agent/repos"
	"github.com/aqfleet/aq/agent/runner"
	"github.com/aqfleet/aq/agent/ship"
	"github.com/aqfleet/aq/engines"
	"github.com/aqfleet/aq/internal/hostfault"
	"github.com/aqfleet/aq/internal/secrets"
	"github.com/aqfleet/aq/job"
	"github.com/aqfleet/aq/profiles"
)

// Parts are what a local agent is built from; selftest and the demo build
// agents the same way.
type Parts struct {
	Catalog *profiles.Catalog
	Engines runner.Engines
	Shipper runner.Shipper
	// Tracer records a trace per job (nil: none); Notifier is told of each
	// job's end (nil: off).
	Tracer   trace.Tracer
	Notifier *notify.Notifier
	// Queue are further options of the queue (queue.WithWait: the CLI's
	// signal-aware waits).
	Queue []queue.Option
}

// New builds the local agent from configuration: the queue under
// $AQ_HOME/queue, the runner, the profile catalog and capability detection.
func New(cfg *config.Config, log *slog.Logger, red *secrets.Redactor, parts Parts) (*Agent, error) {
	cat := parts.Catalog
	parse := func(path string) (*job.Job, error) { return manifest.ParseFile(path, cat) }
	// The queue first: an AQ_HOME that cannot be used is a usage error that
	// names it, whatever else under it (profiles) would fail next.
	q, err := queue.Open(cfg.QueueDir(), append([]queue.Option{queue.WithParser(parse)}, parts.Queue...)...)
	if err != nil {
		return nil, err
	}
	if cat == nil {
		if cat, err = profiles.Load(filepath.Join(cfg.Home, "profiles")); err != nil {
			return nil, err
		}
	}
	shipper := parts.Shipper
	if shipper == nil {
		shipper = &ship.GH{}
	}
	r, err := runner.FromConfig(cfg, runner.Parts{Engines: parts.Engines, Shipper: shipper, Log: log, Redactor: red, Tracer: parts.Tracer})
	if err != nil {
		return nil, err
	}
	return &Agent{
		Queue:        q,
		Runner:       r,
		LocksDir:     cfg.LocksDir(),
		WorktreesDir: cfg.WorktreesDir(),
		Parse:        parse,
		Catalog:      cat,
		Policy:       manifest.Policy{Engines: cfg.RunEngines(false), Sandbox: r.SandboxLevel},
		HostCheck:    func() error { return hostfault.Probe(filepath.Join(cfg.Home, "state")) },
		Host: func(ctx context.Context) (*caps.Host, error) {
			// Probes of unchanged engine binaries come from the cache:
			// `aq run --once` after `aq run --once` runs none.
			return caps.Detect(ctx, caps.DetectOptions{RepoBase: cfg.RepoBase, Clonable: repos.Clonable(cfg.RepoURLs),
				Probes: engines.NewProbeCache(runner.ProbeCachePath(cfg.Home)), Engines: cfg.RunEngines(false), EnginesListed: cfg.EnginesExplicit(),
				Sandbox: r.Sandbox, HelpTimeout: cfg.EngineProbeTimeout})
		},
		Log:      log,
		Tracer:   parts.Tracer,
		Notifier: parts.Notifier,
	}, nil
}
