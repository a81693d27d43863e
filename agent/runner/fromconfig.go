package runner

import (
	"log/slog"
	"path/filepath"

	"go.opentelemetry.io/otel/trace"

	"github.com/aqfleet/aq/agent/config"
	"github.com/aqfleet/aq/agent/holds"
	"github.com/aqfleet/aq/agent/repos"
	"github.com/aqfleet/aq/engines"
	"github.com/aqfleet/aq/internal/aqerr"
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
	// Tracer records the runs' steps (nil: none).
	Tracer trace.Tracer
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
	eng := p.Engines
	if eng == nil {
		eng = engines.DefaultWith(engines.NewProbeCache(ProbeCachePath(cfg.Home)))
	}
	return &Runner{
		Cfg: Config{
			Home: cfg.Home, RepoBase: cfg.RepoBase, Grace: cfg.KillGrace,
			PermissionMode: cfg.ClaudePermissionMode, Prices: prices, FetchBase: p.FetchBase,
			Supervisor: cfg.Supervisor, CheckpointInterval: cfg.CheckpointInterval,
			Repos: rr, Mirror: cfg.RepoMirror, ClaudeTelemetry: cfg.ClaudeTelemetry,
			PoolSize: max(cfg.WorktreePool, 0), VerifyRounds: cfg.VerifyRounds,
		},
		Engines:  eng,
		Shipper:  p.Shipper,
		Log:      p.Log,
		Redactor: p.Redactor,
		Tracer:   p.Tracer,
		Holds:    holds.Open(HoldsPath(cfg.Home), nil),
	}, nil
}

// HoldsPath is the file of the engines held until their limit resets
// (agent/holds), shared by every aq process of the home.
func HoldsPath(home string) string { return filepath.Join(home, "engines", "holds.json") }

// ProbeCachePath is the cache of the engines' --version and --help probes
// (engines.ProbeCache), shared by every aq process of the home.
func ProbeCachePath(home string) string { return filepath.Join(home, "engines", "probes.json") }
