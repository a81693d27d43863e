package runner

import (
	"log/slog"
	"os"
	"path/filepath"
	"runtime"

	"go.opentelemetry.io/otel/trace"

	"github.com/aqfleet/aq/agent/config"
	"github.com/aqfleet/aq/agent/holds"
	"github.com/aqfleet/aq/agent/repos"
	"github.com/aqfleet/aq/engines"
	"github.com/aqfleet/aq/internal/aqerr"
	"github.com/aqfleet/aq/internal/safefs"
	"github.com/aqfleet/aq/internal/sandbox"
	"github.com/aqfleet/aq/internal/secrets"
)

// Parts are a runner's dependencies that do not come from configuration.
type Parts struct {
	Engines  Engines // nil: engines.Default()
	Shipper  Shipper
	Log      *slog.Logger
	Redactor *secrets.Redactor
	// FetchBase: fleet mode starts from origin/<base> (see Config).
	FetchBase bool
	// Fleet: the runner runs fleet jobs (AQ_ENGINES' default leaves
	// script out).
	Fleet bool
	// Tracer records the runs' steps (nil: none).
	Tracer trace.Tracer
	// Egress starts sandboxed jobs' egress proxies (nil: EgressProxies
	// from the configuration's AQ_SANDBOX_NET and AQ_SANDBOX_ENGINE_HOSTS).
	Egress Egress
}

// FromConfig builds the runner local and fleet mode share: its paths, kill
// grace, claude permission mode and the codex price table (built-in, merged
// with AQ_PRICE_TABLE when set) come from cfg.
func FromConfig(cfg *config.Config, p Parts) (*Runner, error) {
	prices, err := engines.LoadPrices(cfg.PriceTable)
	if err != nil {
		return nil, aqerr.Wrap(aqerr.Usage, err, "AQ_PRICE_TABLE: "+err.Error(), "fix the file or unset AQ_PRICE_TABLE to use the built-in prices")
	}
	rr, warnings, err := repos.Parse(cfg.RepoURLs)
	if err != nil {
		return nil, aqerr.Wrap(aqerr.Usage, err, err.Error(), "set AQ_REPO_URLS to a URL template with {repo} or to a file of `name url` lines")
	}
	for _, w := range warnings {
		if p.Log != nil {
			p.Log.Warn(w)
		}
	}
	// A malformed base URL would send every job of its engine nowhere:
	// one line naming the setting, before anything runs.
	if err := engines.CheckBaseURLs(os.Environ()); err != nil {
		return nil, aqerr.Wrap(aqerr.Usage, err, err.Error(), "")
	}
	if p.Egress == nil {
		p.Egress = EgressProxies{Rules: cfg.SandboxNet, EngineHosts: cfg.SandboxEngineHosts, Log: p.Log}
	}
	eng := p.Engines
	if eng == nil {
		eng = engines.DefaultProbing(engines.NewProbeCache(ProbeCachePath(cfg.Home)), cfg.EngineProbeTimeout)
	}
	return &Runner{
		Cfg: Config{
			Home: cfg.Home, RepoBase: cfg.RepoBase, Grace: cfg.KillGrace,
			PermissionMode: cfg.ClaudePermissionMode, CodexSandbox: cfg.CodexSandbox, Prices: prices, FetchBase: p.FetchBase,
			Supervisor: cfg.Supervisor, CheckpointInterval: cfg.CheckpointInterval,
			Repos: rr, Mirror: cfg.RepoMirror, ClaudeTelemetry: cfg.ClaudeTelemetry,
			PoolSize: max(cfg.WorktreePool, 0), VerifyRounds: cfg.VerifyRounds, SandboxWritable: cfg.SandboxWritable,
			Engines: cfg.RunEngines(p.Fleet), EngineEnv: cfg.EngineEnv, LogMax: cfg.LogMax,
			JobDiskMax: cfg.JobDiskMax, DiskReserve: cfg.DiskReserve, ProtectedPaths: cfg.ProtectedPaths,
		},
		Sandbox:  OpenSandbox(cfg, p.Log),
		Egress:   p.Egress,
		Engines:  eng,
		Shipper:  p.Shipper,
		Log:      p.Log,
		Redactor: p.Redactor,
		Tracer:   p.Tracer,
		Holds:    holds.Open(HoldsPath(cfg.Home), nil),
	}, nil
}

// OpenSandbox is this aq's sandbox (AQ_SANDBOX; the aq binary is the
// sandbox's init). It probes the host when the first job needs it —
// commands that run no job never pay for the probe, and a trial sandbox
// that started is remembered for the boot in $AQ_HOME/state/sandbox-trial
// (sandbox.Options.TrialCache) — and then says once,
// in log, how engines run: what is missing under auto, that they are
// unsandboxed under off, that jobs are refused under on where the host
// cannot sandbox fully.
func OpenSandbox(cfg *config.Config, log *slog.Logger) *sandbox.Host {
	return sandbox.OpenLazy(sandbox.Options{
		Init: cfg.Supervisor, Mode: cfg.Sandbox,
		Limits:     sandbox.Limits{MemoryBytes: cfg.SandboxMemory, Pids: cfg.SandboxPids},
		TrialCache: filepath.Join(cfg.StateDir(), "sandbox-trial"),
	}, func(sb *sandbox.Host) {
		if log == nil {
			return
		}
		line, warn := sb.StartLine()
		switch {
		case line == "":
			log.Info("engines run in a full sandbox", "mechanism", sb.Report().Mechanism)
		case cfg.Supervisor == "" && sb.Mode() == sandbox.ModeAuto:
			log.Debug(line) // aq's packages in-process (tests): no init to sandbox with
		case warn:
			log.Warn(line)
		default:
			log.Info(line)
		}
		if !safefs.HasOpenat2() && runtime.GOOS == "linux" {
			// Said once, as the level is: files the engine left are still
			// read safely, one component at a time (docs/sandbox.md).
			log.Info("this kernel has no openat2: aq reads what engines leave by an O_NOFOLLOW walk (docs/sandbox.md, \"What aq reads from the engine's trees\")")
		}
	})
}

// HoldsPath is the file of the engines held until their limit resets
// (agent/holds), shared by every aq process of the home.
func HoldsPath(home string) string { return filepath.Join(home, "engines", "holds.json") }

// ProbeCachePath is the cache of the engines' --version and --help probes
// (engines.ProbeCache), shared by every aq process of the home.
func ProbeCachePath(home string) string { return filepath.Join(home, "engines", "probes.json") }
