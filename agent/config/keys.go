package config

import (
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/aqfleet/aq/internal/egress"
	"github.com/aqfleet/aq/internal/sandbox"
	"github.com/aqfleet/aq/internal/shipcheck"
)

// Key is one configuration setting: its file key, its environment names (the
// first is canonical, the rest are legacy agent-queue.sh names), its flag, its
// default and how its raw text becomes a typed field of Config.
type Key struct {
	Name    string   // key in config.yaml and in `aq config`
	Env     []string // environment names, canonical first
	Flag    string   // flag name without dashes
	Default string   // raw default; "" means unset
	Usage   string
	// Secret keys are shown as *** and never accepted on the command line:
	// their flag takes the path of a file that holds the value (FlagIsFile).
	Secret     bool
	FlagIsFile bool
	// Type is the flag's type in help and the first check of a flag's value:
	// "bool" (a bare --flag means true), "int", "duration", or "" (text).
	Type string
	// Group says which commands offer the key as a flag (Groups).
	Group Group
	// set parses raw and stores it in c; it returns a message that says what
	// is wrong and what is allowed (the caller adds where the value came from).
	set func(c *Config, raw string) error
}

// Keys is every configuration key aq knows. Order is the order `aq config`
// prints. A test holds that each has a flag and an environment binding.
var Keys = []Key{
	{Name: "config", Group: GroupGlobal, Env: []string{"AQ_CONFIG"}, Flag: "config", Usage: "config file (default $AQ_HOME/config.yaml, else ${XDG_CONFIG_HOME:-~/.config}/aq/config.yaml)",
		set: func(c *Config, raw string) error { c.ConfigFile = expandHome(raw); return nil }},
	{Name: "home", Group: GroupGlobal, Env: []string{"AQ_HOME"}, Flag: "home", Default: "~/.aq", Usage: "aq's state: queue, worktrees, locks, logs, spool, credentials",
		set: setPath(func(c *Config) *string { return &c.Home })},
	{Name: "repo_base", Group: GroupRepo, Env: []string{"AQ_REPO_BASE", "AQ_FLEET_REPO_BASE"}, Flag: "repo-base", Default: "~/src", Usage: "folder whose git repositories are repo:<name>",
		set: setPath(func(c *Config) *string { return &c.RepoBase })},
	{Name: "repo_urls", Group: GroupRepo, Env: []string{"AQ_REPO_URLS"}, Flag: "repo-urls", Usage: "clone URLs for repos not under the repo base: a template with {repo}, or a file of 'name url' lines (docs/ondemand.md)",
		set: func(c *Config, raw string) error { c.RepoURLs = strings.TrimSpace(raw); return nil }},
	{Name: "repo_mirror", Group: GroupRepo, Env: []string{"AQ_REPO_MIRROR"}, Flag: "repo-mirror", Usage: "read-only folder of mirrors (<name>.git) an on-demand clone borrows objects from",
		set: setPath(func(c *Config) *string { return &c.RepoMirror })},
	{Name: "fleet", Group: GroupFleet, Env: []string{"AQ_FLEET"}, Flag: "fleet", Default: "0", Type: "bool", Usage: "fleet mode: take jobs from the coordinator",
		set: setBool(func(c *Config) *bool { return &c.Fleet })},
	{Name: "fleet_api", Group: GroupFleet, Env: []string{"AQ_FLEET_API"}, Flag: "fleet-api", Usage: "coordinator base URL, e.g. https://host/api",
		set: setURL(func(c *Config) *string { return &c.FleetAPI })},
	{Name: "fleet_token", Group: GroupFleet, Env: []string{"AQ_FLEET_TOKEN"}, Flag: "fleet-token-file", Secret: true, FlagIsFile: true, Usage: "file holding the factory bearer token (or the enrollment token on first start)",
		set: func(c *Config, raw string) error { c.FleetToken = strings.TrimSpace(raw); return nil }},
	{Name: "product_id", Group: GroupFleet, Env: []string{"AQ_PRODUCT_ID"}, Flag: "product-id", Usage: "x-product-id header: a tag for billing and visibility, not a routing key",
		set: setID(func(c *Config) *string { return &c.ProductID })},
	{Name: "factory_id", Group: GroupFleet, Env: []string{"AQ_FACTORY_ID"}, Flag: "factory-id", Usage: "this factory's id (default: the host name)",
		set: setID(func(c *Config) *string { return &c.FactoryID })},
	{Name: "factory_pool", Group: GroupFleet, Env: []string{"AQ_FACTORY_POOL"}, Flag: "factory-pool", Usage: "the pool this factory is a replica of: it receives from the pool's subscription and takes messages targeted at the pool (docs/ondemand.md)",
		set: setID(func(c *Config) *string { return &c.FactoryPool })},
	{Name: "fleet_route", Group: GroupFleet, Env: []string{"AQ_FLEET_ROUTE"}, Flag: "fleet-route", Default: "1", Type: "bool", Usage: "0: fleet off, run the local queue (fallback)",
		set: setBool(func(c *Config) *bool { return &c.FleetRoute })},
	{Name: "fleet_shadow", Group: GroupFleet, Env: []string{"AQ_FLEET_SHADOW"}, Flag: "fleet-shadow", Default: "0", Type: "bool", Usage: "compare the local pick with the fleet's pick without side effects",
		set: setBool(func(c *Config) *bool { return &c.FleetShadow })},
	{Name: "fleet_gate", Group: GroupFleet, Env: []string{"AQ_FLEET_GATE"}, Flag: "fleet-gate", Default: "0", Type: "bool", Usage: "poll path claims only when GET /fleet/queue-state's version changed",
		set: setBool(func(c *Config) *bool { return &c.FleetGate })},
	{Name: "heartbeat_sec", Group: GroupFleet, Type: "int", Env: []string{"AQ_HEARTBEAT_SEC"}, Flag: "heartbeat-sec", Default: "30", Usage: "heartbeat cadence in seconds; must stay below the coordinator's 90 s stale window",
		set: setSeconds(func(c *Config) *time.Duration { return &c.Heartbeat }, 1, 89, "the coordinator marks a factory stale after 90 s without a heartbeat")},
	{Name: "lease_renew_sec", Group: GroupFleet, Type: "int", Env: []string{"AQ_FLEET_LEASE_RENEW_SEC"}, Flag: "lease-renew-sec", Default: "30", Usage: "lease renewal cadence in seconds while a job runs",
		set: setSeconds(func(c *Config) *time.Duration { return &c.LeaseRenew }, 1, 300, "a lease must be renewed several times per lease TTL")},
	{Name: "caps_refresh", Group: GroupFleet, Type: "duration", Env: []string{"AQ_CAPS_REFRESH"}, Flag: "caps-refresh", Default: "5m", Usage: "re-detect engines, versions, tools and the repos under the repo base this often (and at once when the repo base changes); the next heartbeat carries a change (0: off)",
		set: func(c *Config, raw string) error {
			d, err := time.ParseDuration(strings.TrimSpace(raw))
			switch {
			case err != nil:
				return fmt.Errorf("is not a duration (use Go syntax such as 5m or 30s; 0 turns it off)")
			case d != 0 && d < time.Second:
				return fmt.Errorf("is too short (use 0 to turn it off, or at least 1s)")
			case d < 0:
				return fmt.Errorf("is negative (use 0 to turn it off)")
			}
			c.CapsRefresh = d
			return nil
		}},
	{Name: "poll_seconds", Group: GroupFleet, Type: "int", Env: []string{"AQ_POLL_SECONDS", "POLL_SECONDS"}, Flag: "poll-seconds", Default: "15", Usage: "poll-path base interval in seconds; idle backoff with jitter up to 8x",
		set: setSeconds(func(c *Config) *time.Duration { return &c.Poll }, 1, 3600, "")},
	{Name: "sb_namespace", Group: GroupBroker, Env: []string{"AQ_SB_NAMESPACE"}, Flag: "sb-namespace", Usage: "fully-qualified Service Bus namespace; set => broker delivery with managed identity",
		set: setHost(func(c *Config) *string { return &c.SBNamespace })},
	{Name: "sb_connection_string", Group: GroupBroker, Env: []string{"AQ_SB_CONNECTION_STRING"}, Flag: "sb-connection-string-file", Secret: true, FlagIsFile: true, Usage: "file holding a Service Bus connection string (dev/emulator only)",
		set: func(c *Config, raw string) error { c.SBConnectionString = strings.TrimSpace(raw); return nil }},
	{Name: "sb_topic", Group: GroupBroker, Env: []string{"AQ_SB_TOPIC"}, Flag: "sb-topic", Default: "fleet-dispatch", Usage: "Service Bus topic",
		set: setID(func(c *Config) *string { return &c.SBTopic })},
	{Name: "sb_subscription", Group: GroupBroker, Env: []string{"AQ_SB_SUBSCRIPTION"}, Flag: "sb-subscription", Usage: "this factory's subscription (default: the pool, else the factory id)",
		set: setID(func(c *Config) *string { return &c.SBSubscription })},
	{Name: "sb_sessions", Group: GroupBroker, Env: []string{"AQ_SB_SESSIONS"}, Flag: "sb-sessions", Default: "0", Type: "bool", Usage: "Service Bus sessions keyed by repo: one job of a repo at a time across the factories sharing the subscription, which must require sessions (docs/servicebus.md)",
		set: setBool(func(c *Config) *bool { return &c.SBSessions })},
	{Name: "metrics_addr", Group: GroupDaemon, Env: []string{"AQ_METRICS_ADDR"}, Flag: "metrics-addr", Usage: "address for Prometheus /metrics and /healthz, e.g. 127.0.0.1:9464 (off when empty)",
		set: setHostPort(func(c *Config) *string { return &c.MetricsAddr })},
	{Name: "gc_wip_retention", Group: GroupGC, Type: "duration", Env: []string{"AQ_GC_WIP_RETENTION"}, Flag: "gc-wip-retention", Default: "336h", Usage: "how long WIP refs of failed jobs are kept",
		set: setDuration(func(c *Config) *time.Duration { return &c.GCWIPRetention }, 0)},
	{Name: "worktree_pool", Group: GroupRepo, Type: "int", Env: []string{"AQ_WORKTREE_POOL"}, Flag: "worktree-pool", Usage: "finished jobs' worktrees kept per repository for the next job, which resets one instead of checking out every file (default: slots; 0: none)",
		set: setOptionalInt(func(c *Config) *int { return &c.WorktreePool }, 0, 64)},
	{Name: "worktree_pool_max_age", Group: GroupGC, Type: "duration", Env: []string{"AQ_WORKTREE_POOL_MAX_AGE"}, Flag: "worktree-pool-max-age", Default: "72h", Usage: "aq gc removes a pooled worktree no job has taken for this long",
		set: setDuration(func(c *Config) *time.Duration { return &c.WorktreePoolMaxAge }, 0)},
	{Name: "worktree_disk_max", Group: GroupGC, Env: []string{"AQ_WORKTREE_DISK_MAX"}, Flag: "worktree-disk-max", Usage: "disk aq's worktrees may use, e.g. 50GiB; over it, aq gc removes pooled worktrees, oldest first (unset or 0: no ceiling)",
		set: setBytes(func(c *Config) *int64 { return &c.WorktreeDiskMax })},
	{Name: "slots", Group: GroupDaemon, Type: "int", Env: []string{"AQ_SLOTS"}, Flag: "slots", Default: "1", Usage: "jobs the daemon runs at once (never two on one repo)",
		set: setInt(func(c *Config) *int { return &c.Slots }, 1, 64)},
	{Name: "drain_timeout", Group: GroupDaemon, Type: "duration", Env: []string{"AQ_DRAIN_TIMEOUT"}, Flag: "drain-timeout", Default: "0s", Usage: "aq daemon: after the first SIGTERM, let running jobs finish for this long, then cancel and checkpoint them as on a second signal (0: wait for them)",
		set: setDuration(func(c *Config) *time.Duration { return &c.DrainTimeout }, 0)},
	{Name: "kill_grace", Group: GroupEngine, Type: "duration", Env: []string{"AQ_KILL_GRACE"}, Flag: "kill-grace", Default: "3s", Usage: "grace between the steps of the kill ladder (SIGINT, SIGTERM, SIGKILL)",
		set: setDuration(func(c *Config) *time.Duration { return &c.KillGrace }, 100*time.Millisecond)},
	{Name: "engine_probe_timeout", Group: GroupEngine, Type: "duration", Env: []string{"AQ_ENGINE_PROBE_TIMEOUT"}, Flag: "engine-probe-timeout", Default: "60s", Usage: "bounds each engine CLI's --version and --help probe (cached per binary, one process probing a binary at a time); one that times out leaves the engine's version and flags unknown: it is still offered and run with its full flag set, and probed again later",
		set: setDuration(func(c *Config) *time.Duration { return &c.EngineProbeTimeout }, time.Second)},
	{Name: "checkpoint_interval", Group: GroupEngine, Type: "duration", Env: []string{"AQ_CHECKPOINT_INTERVAL"}, Flag: "checkpoint-interval", Default: "5m", Usage: "while an engine runs, checkpoint its worktree this often (pushed to origin's aq/wip/<id> while the lease is held; 0: only when it stops)",
		set: setDuration(func(c *Config) *time.Duration { return &c.CheckpointInterval }, 0)},
	{Name: "sandbox", Group: GroupEngine, Env: []string{"AQ_SANDBOX"}, Flag: "sandbox", Default: "auto", Usage: "run each job's engine and verify in a sandbox of its own: auto (the best this host offers, said once at start), on (refuse jobs, retryable elsewhere, where the full sandbox cannot run), off (docs/sandbox.md)",
		set: setSandbox},
	{Name: "sandbox_memory", Group: GroupEngine, Env: []string{"AQ_SANDBOX_MEMORY"}, Flag: "sandbox-memory", Usage: "memory a job's sandbox may use, e.g. 8GiB; reaching it is reason out_of_memory (held by cgroup v2 delegated to aq, or cgroup v1 aq may write; unset: the host's memory divided by the slots; 0: no limit)",
		set: setSandboxMemory},
	{Name: "sandbox_pids", Group: GroupEngine, Type: "int", Env: []string{"AQ_SANDBOX_PIDS"}, Flag: "sandbox-pids", Default: "4096", Usage: "processes (and threads) a job's sandbox may run at once (held by cgroup v2 delegated to aq, or cgroup v1 aq may write; 0: no limit)",
		set: setSandboxPids},
	{Name: "log_max", Group: GroupEngine, Env: []string{"AQ_LOG_MAX"}, Flag: "log-max", Default: "32MiB", Usage: "what one engine or verify run may store in each job log (stdout, stderr, verify), e.g. 32MiB: past it the head and the tail are kept with a gap record between (at least 1MiB)",
		set: setLogMax},
	{Name: "job_disk_max", Group: GroupEngine, Env: []string{"AQ_JOB_DISK_MAX"}, Flag: "job-disk-max", Usage: "what a job's run may add to the disk (its worktree's growth, its home, tmp and cache overlays), e.g. 10GiB, when its manifest sets no budget.disk; past it the job fails disk_exceeded (unset or 0: none but AQ_DISK_RESERVE)",
		set: setDiskSize(func(c *Config) *int64 { return &c.JobDiskMax }, "10GiB")},
	{Name: "disk_reserve", Group: GroupEngine, Env: []string{"AQ_DISK_RESERVE"}, Flag: "disk-reserve", Default: "2GiB", Usage: "free space no job may take $AQ_HOME's file system below, shared by every slot: a job's run that does fails disk_exceeded (0: none)",
		set: setDiskSize(func(c *Config) *int64 { return &c.DiskReserve }, "2GiB")},
	{Name: "sandbox_writable", Group: GroupEngine, Env: []string{"AQ_SANDBOX_WRITABLE"}, Flag: "sandbox-writable", Usage: "host directories every job's engine may also write, comma-separated absolute paths (a shared build cache such as ~/.ccache; shared by every job: docs/sandbox.md); never $AQ_HOME, the repo base or the home, nor in or above them",
		set: setSandboxWritable},
	{Name: "protected_paths", Group: GroupEngine, Env: []string{"AQ_PROTECTED_PATHS"}, Flag: "protected-paths", Usage: "paths a job's change may not touch unless its manifest's may_change names them, comma-separated doublestar globs relative to the repository's root; replaces the default (.github/workflows/**, .github/actions/**, .gitlab-ci.yml, .circleci/**, .buildkite/**, CODEOWNERS at the root, .github/ and docs/, .aq/**: docs/sandbox.md)",
		set: setProtectedPaths},
	{Name: "verify_rounds", Group: GroupEngine, Type: "int", Env: []string{"AQ_VERIFY_ROUNDS"}, Flag: "verify-rounds", Default: "2", Usage: "repair rounds after a failed verify: the engine runs again in the same worktree with the failure in hand, for jobs whose manifest and profile set no verify_rounds (0: off; docs/manifest.md)",
		set: setInt(func(c *Config) *int { return &c.VerifyRounds }, 0, 10)},
	{Name: "claude_permission_mode", Group: GroupEngine, Env: []string{"AQ_CLAUDE_PERMISSION_MODE"}, Flag: "claude-permission-mode", Usage: "claude --permission-mode: default|acceptEdits|plan|bypassPermissions|dontAsk (unset: bypassPermissions inside aq's sandbox, acceptEdits outside it); devin follows it (bypass or normal)",
		set: setOptionalEnum(func(c *Config) *string { return &c.ClaudePermissionMode }, "default", "acceptEdits", "plan", "bypassPermissions", "dontAsk")},
	{Name: "codex_sandbox", Group: GroupEngine, Env: []string{"AQ_CODEX_SANDBOX"}, Flag: "codex-sandbox", Usage: "codex --sandbox: read-only|workspace-write|danger-full-access (unset: danger-full-access inside aq's sandbox, which stands in for codex's own, workspace-write outside it)",
		set: setOptionalEnum(func(c *Config) *string { return &c.CodexSandbox }, "read-only", "workspace-write", "danger-full-access")},
	{Name: "sandbox_net", Group: GroupEngine, Env: []string{"AQ_SANDBOX_NET"}, Flag: "sandbox-net", Usage: "what a sandboxed engine may reach besides its own API, through the job's egress proxy: comma list of host, *.domain, host:port, an address or range, * (any public host), or a set such as @registries (docs/sandbox.md)",
		set: func(c *Config, raw string) error {
			r, err := egress.ParseRules(raw)
			if err != nil {
				return err
			}
			c.SandboxNet = r
			return nil
		}},
	{Name: "sandbox_engine_hosts", Group: GroupEngine, Env: []string{"AQ_SANDBOX_ENGINE_HOSTS"}, Flag: "sandbox-engine-hosts", Usage: "replace engines' built-in API endpoints in the egress proxy: engine=host host;engine=host, e.g. claude=llm-gateway.example.com:443 (docs/sandbox.md)",
		set: func(c *Config, raw string) error {
			h, err := egress.ParseEngineHosts(raw)
			if err != nil {
				return err
			}
			c.SandboxEngineHosts = h
			return nil
		}},
	{Name: "claude_telemetry", Group: GroupEngine, Type: "bool", Env: []string{"AQ_CLAUDE_TELEMETRY"}, Flag: "claude-telemetry", Default: "0", Usage: "switch Claude Code's own OpenTelemetry export on (CLAUDE_CODE_ENABLE_TELEMETRY=1 and the OTEL_* it needs) to OTEL_EXPORTER_OTLP_ENDPOINT (docs/observability.md)",
		set: setBool(func(c *Config) *bool { return &c.ClaudeTelemetry })},
	{Name: "engines", Group: GroupEngine, Env: []string{"AQ_ENGINES"}, Flag: "engines", Usage: "the engines this factory may run and offer, of claude, codex, devin, script, or all (default: every coding engine found, and script outside fleet mode; script in fleet mode runs code from whoever can submit a job: docs/fleet.md)",
		set: setEngines},
	{Name: "engine_env", Group: GroupEngine, Env: []string{"AQ_ENGINE_ENV"}, Flag: "engine-env", Usage: "names of further environment variables an engine gets, comma-separated (its environment is otherwise built from a documented base: docs/engines.md#the-engines-environment)",
		set: setEngineEnv},
	{Name: "price_table", Group: GroupEngine, Env: []string{"AQ_PRICE_TABLE"}, Flag: "price-table", Usage: "JSON file of per-model token prices (overrides the built-in table)",
		set: setPath(func(c *Config) *string { return &c.PriceTable })},
	{Name: "notify_url", Group: GroupObserve, Env: []string{"AQ_NOTIFY_URL"}, Flag: "notify-url-file", Secret: true, FlagIsFile: true, Usage: "file holding the http(s) URL that gets a JSON POST when a job ships, fails for good or needs a person (docs/observability.md)",
		set: setNotifyURL},
	{Name: "broker_depth_interval", Group: GroupObserve, Type: "duration", Env: []string{"AQ_BROKER_DEPTH_INTERVAL"}, Flag: "broker-depth-interval", Default: "60s", Usage: "with a broker and AQ_METRICS_ADDR, read the subscription's active and dead-letter message counts this often (at least 10s; 0: off)",
		set: setDepthInterval},
	{Name: "log_format", Group: GroupGlobal, Env: []string{"AQ_LOG_FORMAT"}, Flag: "log-format", Default: "text", Usage: "log format: text|json",
		set: setEnum(func(c *Config) *string { return &c.LogFormat }, "text", "json")},
	{Name: "log_level", Group: GroupGlobal, Env: []string{"AQ_LOG_LEVEL"}, Flag: "log-level", Default: "info", Usage: "log level: debug|info|warn|error",
		set: setEnum(func(c *Config) *string { return &c.LogLevel }, "debug", "info", "warn", "error")},
}

// Lookup returns the key with this name.
func Lookup(name string) (Key, bool) {
	for _, k := range Keys {
		if k.Name == name {
			return k, true
		}
	}
	return Key{}, false
}

func setPath(field func(*Config) *string) func(*Config, string) error {
	return func(c *Config, raw string) error {
		raw = strings.TrimSpace(raw)
		if raw == "" {
			*field(c) = ""
			return nil
		}
		p := expandHome(raw)
		if strings.ContainsRune(p, 0) {
			return fmt.Errorf("is not a valid path")
		}
		abs, err := filepath.Abs(p)
		if err != nil {
			return fmt.Errorf("is not a valid path: %v", err)
		}
		*field(c) = abs
		return nil
	}
}

var boolWords = map[string]bool{"1": true, "true": true, "yes": true, "on": true, "0": false, "false": false, "no": false, "off": false, "": false}

func setBool(field func(*Config) *bool) func(*Config, string) error {
	return func(c *Config, raw string) error {
		b, ok := boolWords[strings.ToLower(strings.TrimSpace(raw))]
		if !ok {
			return fmt.Errorf("is not a boolean (use 1 or 0)")
		}
		*field(c) = b
		return nil
	}
}

func setInt(field func(*Config) *int, min, max int) func(*Config, string) error {
	return func(c *Config, raw string) error {
		n, err := strconv.Atoi(strings.TrimSpace(raw))
		if err != nil {
			return fmt.Errorf("is not a whole number (use an integer from %d to %d)", min, max)
		}
		if n < min || n > max {
			return fmt.Errorf("is out of range (use an integer from %d to %d)", min, max)
		}
		*field(c) = n
		return nil
	}
}

func setSeconds(field func(*Config) *time.Duration, min, max int, why string) func(*Config, string) error {
	return func(c *Config, raw string) error {
		n, err := strconv.Atoi(strings.TrimSpace(raw))
		if err != nil {
			return fmt.Errorf("is not a whole number of seconds (use an integer from %d to %d)", min, max)
		}
		if n < min || n > max {
			msg := fmt.Sprintf("is out of range (use %d to %d seconds", min, max)
			if why != "" {
				msg += "; " + why
			}
			return fmt.Errorf("%s)", msg)
		}
		*field(c) = time.Duration(n) * time.Second
		return nil
	}
}

// setOptionalInt is setInt that takes "" as unset (-1), for a default
// derived from other keys.
func setOptionalInt(field func(*Config) *int, min, max int) func(*Config, string) error {
	set := setInt(field, min, max)
	return func(c *Config, raw string) error {
		if strings.TrimSpace(raw) == "" {
			*field(c) = -1
			return nil
		}
		return set(c, raw)
	}
}

// byteUnits are the suffixes setBytes takes, longest first.
var byteUnits = []struct {
	suffix string
	n      int64
}{
	{"KiB", 1 << 10}, {"MiB", 1 << 20}, {"GiB", 1 << 30}, {"TiB", 1 << 40},
	{"KB", 1e3}, {"MB", 1e6}, {"GB", 1e9}, {"TB", 1e12},
	{"K", 1 << 10}, {"M", 1 << 20}, {"G", 1 << 30}, {"T", 1 << 40}, {"B", 1},
}

// setBytes reads a size: a whole number of bytes, or one with a unit (50GiB,
// 500MB, 2G = 2GiB). "" and 0 mean none.
func setBytes(field func(*Config) *int64) func(*Config, string) error {
	return func(c *Config, raw string) error {
		raw = strings.TrimSpace(raw)
		if raw == "" {
			*field(c) = 0
			return nil
		}
		num, mult := raw, int64(1)
		for _, u := range byteUnits {
			if n, ok := strings.CutSuffix(raw, u.suffix); ok {
				num, mult = strings.TrimSpace(n), u.n
				break
			}
		}
		n, err := strconv.ParseInt(num, 10, 64)
		if err != nil || n < 0 || (n > 0 && n > (1<<62)/mult) {
			return fmt.Errorf("is not a size (use bytes or a unit: 500MB, 50GiB, 2T)")
		}
		*field(c) = n * mult
		return nil
	}
}

func setDuration(field func(*Config) *time.Duration, min time.Duration) func(*Config, string) error {
	return func(c *Config, raw string) error {
		d, err := time.ParseDuration(strings.TrimSpace(raw))
		if err != nil {
			return fmt.Errorf("is not a duration (use Go syntax such as 90s, 45m or 336h)")
		}
		if d < min {
			return fmt.Errorf("is too short (use at least %s)", min)
		}
		*field(c) = d
		return nil
	}
}

func setEnum(field func(*Config) *string, allowed ...string) func(*Config, string) error {
	return func(c *Config, raw string) error {
		raw = strings.TrimSpace(raw)
		for _, a := range allowed {
			if raw == a {
				*field(c) = raw
				return nil
			}
		}
		return fmt.Errorf("is not one of %s", strings.Join(allowed, "|"))
	}
}

// setOptionalEnum is setEnum that also takes "" (unset: a default the
// runner derives).
func setOptionalEnum(field func(*Config) *string, allowed ...string) func(*Config, string) error {
	set := setEnum(field, allowed...)
	return func(c *Config, raw string) error {
		if strings.TrimSpace(raw) == "" {
			*field(c) = ""
			return nil
		}
		return set(c, raw)
	}
}

func setSandbox(c *Config, raw string) error {
	m, err := sandbox.ParseMode(raw)
	if err != nil {
		return err
	}
	c.Sandbox = m
	return nil
}

// minSandboxMemory keeps a typo (8M for 8G) from killing every engine at
// start.
const minSandboxMemory = 64 << 20

func setSandboxMemory(c *Config, raw string) error {
	if strings.TrimSpace(raw) == "" {
		c.SandboxMemory = -1 // derived: the host's memory divided by the slots
		return nil
	}
	if err := setBytes(func(c *Config) *int64 { return &c.SandboxMemory })(c, raw); err != nil {
		return fmt.Errorf("is not a size (use bytes or a unit: 8GiB, 512MiB; 0: no limit)")
	}
	if c.SandboxMemory > 0 && c.SandboxMemory < minSandboxMemory {
		return fmt.Errorf("is too small for an engine (use at least 64MiB, e.g. 8GiB; 0: no limit)")
	}
	return nil
}

// setDiskSize reads a disk size (AQ_JOB_DISK_MAX, AQ_DISK_RESERVE): bytes
// or a unit, never negative; "" and 0 are none.
func setDiskSize(field func(*Config) *int64, example string) func(*Config, string) error {
	return func(c *Config, raw string) error {
		if err := setBytes(field)(c, raw); err != nil {
			return fmt.Errorf("is not a size (use bytes or a unit, e.g. %s; 0: none)", example)
		}
		return nil
	}
}

// minLogMax keeps a log's head and tail big enough to read.
const minLogMax = 1 << 20

func setLogMax(c *Config, raw string) error {
	if err := setBytes(func(c *Config) *int64 { return &c.LogMax })(c, raw); err != nil {
		return fmt.Errorf("is not a size (use bytes or a unit: 32MiB, 1GiB)")
	}
	if c.LogMax < minLogMax {
		return fmt.Errorf("is too small to keep a log's head and tail (use at least 1MiB, e.g. 32MiB)")
	}
	return nil
}

// setProtectedPaths reads AQ_PROTECTED_PATHS: globs relative to the
// repository's root (shipcheck.CheckGlob). Unset or empty, the default
// list (nil); set, it replaces it; set to commas alone (","), it protects
// nothing.
func setProtectedPaths(c *Config, raw string) error {
	if strings.TrimSpace(raw) == "" {
		c.ProtectedPaths = nil // unset: the default list
		return nil
	}
	globs, err := shipcheck.ParseGlobs(raw)
	if err != nil {
		return fmt.Errorf("entry %w", err)
	}
	if globs == nil {
		globs = []string{}
	}
	c.ProtectedPaths = globs
	return nil
}

func setSandboxPids(c *Config, raw string) error {
	if strings.TrimSpace(raw) == "" {
		c.SandboxPids = 0
		return nil
	}
	n, err := strconv.Atoi(strings.TrimSpace(raw))
	switch {
	case err != nil:
		return fmt.Errorf("is not a whole number (use e.g. 4096; 0: no limit)")
	case n < 0:
		return fmt.Errorf("is negative (use e.g. 4096; 0: no limit)")
	case n > 0 && n < 32:
		return fmt.Errorf("is too few for an engine and its tools (use at least 32, e.g. 4096; 0: no limit)")
	}
	c.SandboxPids = n
	return nil
}

// setSandboxWritable reads AQ_SANDBOX_WRITABLE: absolute directories
// (a leading ~/ is the home), none of them /, and none that is, holds or
// lies in $AQ_HOME, the repo base or the mirror folder (other jobs'
// worktrees, logs, the factory's credentials, other repositories), nor
// that is or holds the home (the user's keys). Those keys come before it.
func setSandboxWritable(c *Config, raw string) error {
	c.SandboxWritable = nil
	for _, e := range strings.Split(raw, ",") {
		e = strings.TrimSpace(e)
		if e == "" {
			continue
		}
		p := filepath.Clean(expandHome(e))
		if !filepath.IsAbs(p) || strings.ContainsRune(p, 0) {
			return fmt.Errorf("entry %q is not an absolute path (use e.g. /var/cache/ccache,~/.cache/sccache)", e)
		}
		if p == "/" {
			return fmt.Errorf("entry %q would let every engine write the whole host (name the directories it may write)", e)
		}
		for _, t := range []struct{ what, dir string }{{"AQ_HOME", c.Home}, {"the repo base", c.RepoBase}, {"the mirror folder", c.RepoMirror}} {
			if t.dir != "" && (within(p, t.dir) || within(t.dir, p)) {
				return fmt.Errorf("entry %q overlaps %s %s, which no engine may write (name a directory outside it)", e, t.what, t.dir)
			}
		}
		if home, err := os.UserHomeDir(); err == nil && home != "/" && within(home, p) {
			return fmt.Errorf("entry %q holds the home %s (name a directory inside it, e.g. ~/.ccache)", e, home)
		}
		if !slices.Contains(c.SandboxWritable, p) {
			c.SandboxWritable = append(c.SandboxWritable, p)
		}
	}
	return nil
}

// within reports whether path is dir or below it (both clean).
func within(path, dir string) bool {
	return path == dir || strings.HasPrefix(path, strings.TrimSuffix(dir, "/")+"/")
}

// idPattern is the id rule of docs/manifest.md ("Keys": id); config ids (factory, product, topic) obey
// it too, since they end up in paths, headers and broker filters.
var idPattern = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$`) })

func setID(field func(*Config) *string) func(*Config, string) error {
	return func(c *Config, raw string) error {
		raw = strings.TrimSpace(raw)
		if raw != "" && !ValidID(raw) {
			return errors.New(idRule)
		}
		*field(c) = raw
		return nil
	}
}

const idRule = "is not a valid id (letters, digits, '.', '_' and '-', starting with a letter or digit, at most 128)"

// ValidID reports whether s is a valid id (a factory, pool, subscription):
// letters, digits, '.', '_' and '-', starting with a letter or digit, at
// most 128, no "..".
func ValidID(s string) bool { return idPattern().MatchString(s) && !strings.Contains(s, "..") }

func setURL(field func(*Config) *string) func(*Config, string) error {
	return func(c *Config, raw string) error {
		raw = strings.TrimSpace(raw)
		if raw == "" {
			*field(c) = ""
			return nil
		}
		u, err := url.Parse(raw)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return fmt.Errorf("is not an http(s) URL (use e.g. https://host/api)")
		}
		if u.User != nil {
			return fmt.Errorf("must not carry credentials (put the token in AQ_FLEET_TOKEN)")
		}
		*field(c) = strings.TrimRight(raw, "/")
		return nil
	}
}

// setNotifyURL checks AQ_NOTIFY_URL: an http(s) URL with a host. The value
// is a secret (a webhook's token often sits in its path or query): the
// message never quotes it.
func setNotifyURL(c *Config, raw string) error {
	raw = strings.TrimSpace(raw)
	if raw == "" {
		c.NotifyURL = ""
		return nil
	}
	u, err := url.Parse(raw)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return fmt.Errorf("is not an http(s) URL (use e.g. https://hooks.example.com/aq)")
	}
	c.NotifyURL = raw
	return nil
}

// minDepthInterval keeps the management API's reads slow: they count
// against the namespace's throttling, and a scaler (KEDA polls every 30 s)
// reads the same numbers.
const minDepthInterval = 10 * time.Second

// EngineNames are the engines AQ_ENGINES may name.
var EngineNames = []string{"claude", "codex", "devin", "script"}

func setEngines(c *Config, raw string) error {
	c.Engines = nil
	raw = strings.TrimSpace(raw)
	if raw == "" {
		return nil
	}
	seen := map[string]bool{}
	list := []string{}
	for _, f := range strings.FieldsFunc(raw, func(r rune) bool { return r == ',' || r == ' ' }) {
		f = strings.ToLower(f)
		switch {
		case f == "all":
			for _, e := range EngineNames {
				if !seen[e] {
					seen[e] = true
					list = append(list, e)
				}
			}
		case slices.Contains(EngineNames, f):
			if !seen[f] {
				seen[f] = true
				list = append(list, f)
			}
		default:
			return fmt.Errorf("names %q, which is not an engine (use claude, codex, devin, script or all, comma-separated)", clipValue(f))
		}
	}
	c.Engines = list
	return nil
}

var envName = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

func setEngineEnv(c *Config, raw string) error {
	c.EngineEnv = nil
	for _, f := range strings.FieldsFunc(raw, func(r rune) bool { return r == ',' || r == ' ' }) {
		if !envName.MatchString(f) {
			return fmt.Errorf("names %q, which is not an environment variable name (letters, digits and _, comma-separated)", clipValue(f))
		}
		c.EngineEnv = append(c.EngineEnv, f)
	}
	return nil
}

func clipValue(s string) string {
	if len(s) > 40 {
		return s[:40] + "…"
	}
	return s
}

func setDepthInterval(c *Config, raw string) error {
	d, err := time.ParseDuration(strings.TrimSpace(raw))
	if err != nil {
		return fmt.Errorf("is not a duration (use Go syntax such as 60s or 5m; 0 turns it off)")
	}
	if d != 0 && d < minDepthInterval {
		return fmt.Errorf("is too short (use at least %s, or 0 to turn it off: each read is a management API call)", minDepthInterval)
	}
	c.BrokerDepthInterval = d
	return nil
}

func setHost(field func(*Config) *string) func(*Config, string) error {
	return func(c *Config, raw string) error {
		raw = strings.TrimSpace(raw)
		if strings.ContainsAny(raw, "/;= ") {
			return fmt.Errorf("is not a host name (use the fully-qualified namespace, e.g. myns.servicebus.windows.net)")
		}
		*field(c) = raw
		return nil
	}
}

func setHostPort(field func(*Config) *string) func(*Config, string) error {
	return func(c *Config, raw string) error {
		raw = strings.TrimSpace(raw)
		if raw != "" {
			if _, port, err := net.SplitHostPort(raw); err != nil || port == "" {
				return fmt.Errorf("is not host:port (use e.g. 127.0.0.1:9464)")
			}
		}
		*field(c) = raw
		return nil
	}
}

func expandHome(p string) string {
	if p == "~" || strings.HasPrefix(p, "~/") {
		if home, err := os.UserHomeDir(); err == nil {
			return filepath.Join(home, p[1:])
		}
	}
	return p
}
