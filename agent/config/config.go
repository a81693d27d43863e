// Package config owns aq's configuration (README.md, "Configuration"; `aq config` lists every key): the keys, their flag and
// environment bindings (including the legacy agent-queue.sh names), the config
// file, precedence flag > environment > file > default, validation, and where
// each effective value came from. Everything is bound in one place, with viper.
package config

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/pflag"
	"github.com/spf13/viper"

	"github.com/aqfleet/aq/internal/aqerr"
	"github.com/aqfleet/aq/internal/brief"
	"github.com/aqfleet/aq/internal/egress"
	"github.com/aqfleet/aq/internal/sandbox"
	"github.com/aqfleet/aq/internal/secrets"
)

// Config is aq's effective configuration.
type Config struct {
	ConfigFile string // the file that was read, if any

	// Supervisor is not a key: the aq binary sets it to its own path, so
	// that engines are stopped if aq dies (process.Spec.Supervisor). Tests
	// that run aq's packages in-process leave it empty.
	Supervisor string

	Home     string
	RepoBase string
	// RepoURLs (AQ_REPO_URLS) maps repo names to clone URLs: a template
	// with {repo}, or a file of `name url` lines (agent/repos).
	RepoURLs string
	// RepoMirror (AQ_REPO_MIRROR) is a read-only folder of mirrors that
	// on-demand clones borrow objects from.
	RepoMirror string

	Fleet      bool
	FleetAPI   string
	FleetToken string // secret
	ProductID  string
	FactoryID  string
	// FactoryPool (AQ_FACTORY_POOL) makes this factory a replica of a pool:
	// its subscription is the pool's, and a message targeted at the pool is
	// its to take. Leases are still held under FactoryID.
	FactoryPool string
	FleetRoute  bool
	FleetShadow bool
	FleetGate   bool
	Heartbeat   time.Duration
	LeaseRenew  time.Duration
	Poll        time.Duration
	// CapsRefresh (AQ_CAPS_REFRESH) is the capability refresh cadence of a
	// long-running factory; 0: off.
	CapsRefresh time.Duration

	SBNamespace        string
	SBConnectionString string // secret
	SBTopic            string
	SBSubscription     string
	SBSessions         bool

	MetricsAddr    string
	GCWIPRetention time.Duration
	Slots          int
	DrainTimeout   time.Duration
	KillGrace      time.Duration
	// EngineProbeTimeout (AQ_ENGINE_PROBE_TIMEOUT) bounds each engine
	// CLI's --version and --help probe.
	EngineProbeTimeout time.Duration
	CheckpointInterval time.Duration // periodic checkpoints while an engine runs; 0: off
	// VerifyRounds (AQ_VERIFY_ROUNDS) is how many repair rounds a job gets
	// after a failed verify when neither its manifest nor its profile says;
	// 0: off.
	VerifyRounds int
	// WorktreePool (AQ_WORKTREE_POOL) is how many finished jobs' worktrees
	// are kept per repository for the next job; derived from Slots when
	// unset. 0: none (a Config built by hand gets none).
	WorktreePool int
	// WorktreePoolMaxAge: aq gc removes a pooled worktree unused this long.
	WorktreePoolMaxAge time.Duration
	// WorktreeDiskMax (AQ_WORKTREE_DISK_MAX) is the disk, in bytes, aq's
	// worktrees may use before aq gc trims the pool; 0: no ceiling.
	WorktreeDiskMax int64

	// Sandbox (AQ_SANDBOX) is whether engines run in a per-job sandbox;
	// SandboxMemory and SandboxPids are its cgroup limits (0: none); unset,
	// the memory is the host's divided by the slots (derive).
	Sandbox       sandbox.Mode
	SandboxMemory int64
	// LogMax (AQ_LOG_MAX) bounds what one run stores in each job log.
	LogMax int64
	// JobDiskMax (AQ_JOB_DISK_MAX) is a job's disk budget when its manifest
	// sets none; DiskReserve (AQ_DISK_RESERVE) the free space no job may
	// take the factory below (0: none).
	JobDiskMax, DiskReserve int64
	SandboxPids             int
	// SandboxWritable (AQ_SANDBOX_WRITABLE) are host directories every
	// job's engine may also write (docs/sandbox.md).
	SandboxWritable []string
	// ProtectedPaths (AQ_PROTECTED_PATHS) are the globs of the paths a
	// change may not touch unless its manifest's may_change names them;
	// nil: shipcheck.DefaultProtected (docs/sandbox.md, "What ships is
	// checked").
	ProtectedPaths []string

	// ClaudePermissionMode and CodexSandbox are the engines' own autonomy
	// settings; "" lets the runner choose by the sandbox (docs/sandbox.md).
	ClaudePermissionMode string
	CodexSandbox         string
	// SandboxNet (AQ_SANDBOX_NET) is what a sandboxed engine may reach
	// through its job's egress proxy besides its own API endpoints.
	SandboxNet egress.Rules
	// SandboxEngineHosts (AQ_SANDBOX_ENGINE_HOSTS) replaces engines'
	// built-in endpoints.
	SandboxEngineHosts egress.EngineHostSet
	PriceTable         string
	// Engines (AQ_ENGINES) are the engines this factory may run and offer;
	// nil: the default (RunEngines).
	Engines []string
	// EngineEnv (AQ_ENGINE_ENV) are further environment variables an
	// engine gets beyond its documented base (engines.Environ).
	EngineEnv []string
	// ClaudeTelemetry (AQ_CLAUDE_TELEMETRY) switches Claude Code's own
	// OpenTelemetry export on in its environment.
	ClaudeTelemetry bool

	// NotifyURL (AQ_NOTIFY_URL, secret) gets a JSON POST per notable job
	// event (agent/notify).
	NotifyURL string
	// BrokerDepthInterval (AQ_BROKER_DEPTH_INTERVAL) is the cadence of the
	// subscription depth reads behind the broker gauges; 0: off.
	BrokerDepthInterval time.Duration

	LogFormat string
	LogLevel  string

	settings map[string]Setting
}

// Source says where an effective value came from.
type Source string

// Sources in precedence order.
const (
	FromFlag    Source = "flag"
	FromEnv     Source = "env"
	FromFile    Source = "file"
	FromDefault Source = "default"
	FromDerived Source = "derived" // computed from other keys (factory id from host name, ...)
)

// Setting is one key's effective value, as `aq config` shows it.
type Setting struct {
	Key    string `json:"key"`
	Value  string `json:"value"` // secrets are "***" when set
	Source Source `json:"source"`
	Origin string `json:"origin,omitempty"` // the flag, variable or file that set it
	Env    string `json:"env"`
	Flag   string `json:"flag"`
	Secret bool   `json:"secret,omitempty"`
}

// Load resolves every key from fs (flags that were set), the process
// environment, the config file and the defaults, validates each value and
// returns the typed Config. Any invalid value is a usage error (exit 2) whose
// message names where the value came from.
func Load(fs *pflag.FlagSet) (*Config, error) {
	c := &Config{settings: map[string]Setting{}}
	v := viper.New()

	for _, k := range Keys {
		if err := v.BindEnv(append([]string{k.Name}, k.Env...)...); err != nil {
			return nil, err
		}
		if k.Default != "" {
			v.SetDefault(k.Name, k.Default)
		}
	}

	// A flag counts only when it was given: it then beats every other
	// source. Secret flags take a file path; the secret never sits in argv.
	for _, k := range Keys {
		if fs == nil {
			break
		}
		f := fs.Lookup(k.Flag)
		if f == nil || !f.Changed {
			continue
		}
		if !k.FlagIsFile {
			v.Set(k.Name, f.Value.String())
			continue
		}
		b, err := os.ReadFile(f.Value.String())
		if err != nil {
			return nil, aqerr.Usagef("check the path and its permissions", "--%s: cannot read %s: %v", k.Flag, f.Value.String(), errors.Unwrap(err))
		}
		v.Set(k.Name, strings.TrimSpace(string(b)))
	}

	// The config file may be named by flag/env; its location otherwise depends
	// on AQ_HOME, which never comes from the file itself.
	if err := resolveOne(c, v, fs, nil, "config"); err != nil {
		return nil, err
	}
	if err := resolveOne(c, v, fs, nil, "home"); err != nil {
		return nil, err
	}
	file, fileKeys, err := readFile(v, c.ConfigFile, c.Home)
	if err != nil {
		return nil, err
	}
	c.ConfigFile = file
	if file != "" {
		s := c.settings["config"]
		if s.Source == "" || s.Source == FromDefault {
			s.Value, s.Source = file, FromDerived
			c.settings["config"] = s
		}
	}

	for _, k := range Keys {
		if k.Name == "config" || k.Name == "home" {
			continue
		}
		if err := resolveOne(c, v, fs, fileKeys, k.Name); err != nil {
			return nil, err
		}
	}
	if fileKeys["home"] {
		return nil, aqerr.Usagef("set AQ_HOME in the environment or with --home", "%s: home cannot be set in the config file that lives inside it", file)
	}
	c.derive()
	return c, nil
}

// resolveOne applies key name's effective value to c and records its source.
func resolveOne(c *Config, v *viper.Viper, fs *pflag.FlagSet, fileKeys map[string]bool, name string) error {
	k, _ := Lookup(name)
	raw := v.GetString(k.Name)
	src, origin := FromDefault, ""
	switch {
	case fs != nil && fs.Lookup(k.Flag) != nil && fs.Lookup(k.Flag).Changed:
		src, origin = FromFlag, "--"+k.Flag
	case envOrigin(k) != "":
		src, origin = FromEnv, envOrigin(k)
	case fileKeys[k.Name]:
		src, origin = FromFile, c.ConfigFile
	}
	if src == FromDefault && k.Default == "" && raw == "" {
		src = ""
	}
	if err := k.set(c, raw); err != nil {
		return aqerr.Usagef(fixFor(k, src), "%s %v", describe(k, src, origin, raw), err)
	}
	shown := raw
	if strings.HasPrefix(raw, "~") {
		shown = expandHome(raw)
	}
	if k.Secret && raw != "" {
		shown = secrets.Mask
	}
	c.settings[k.Name] = Setting{Key: k.Name, Value: shown, Source: src, Origin: origin, Env: k.Env[0], Flag: "--" + k.Flag, Secret: k.Secret}
	return nil
}

func envOrigin(k Key) string {
	for _, e := range k.Env {
		if _, ok := os.LookupEnv(e); ok {
			return e
		}
	}
	return ""
}

// describe names a bad value the way the user wrote it.
func describe(k Key, src Source, origin, raw string) string {
	val := raw
	if k.Secret {
		val = secrets.Mask
	}
	switch src {
	case FromFlag:
		if k.FlagIsFile {
			return fmt.Sprintf("the value in the file given to %s", origin)
		}
		return fmt.Sprintf("%s=%q", origin, val)
	case FromEnv:
		return fmt.Sprintf("%s=%q", origin, val)
	case FromFile:
		return fmt.Sprintf("%s in %s: %q", k.Name, origin, val)
	}
	return fmt.Sprintf("default %s=%q", k.Name, val)
}

func fixFor(k Key, src Source) string {
	switch src {
	case FromFlag:
		return "fix the --" + k.Flag + " flag"
	case FromEnv:
		return "fix or unset the environment variable"
	case FromFile:
		return "fix " + k.Name + " in the config file"
	}
	return ""
}

// readFile loads the config file into v. An explicitly named file must exist;
// the default locations are optional. Unknown keys are errors: a typo must not
// be silently ignored. Keys may be written as in `aq config` (heartbeat_sec) or
// as their environment names (AQ_HEARTBEAT_SEC), which eases migration from
// agent-queue.sh env files.
func readFile(v *viper.Viper, explicit, home string) (string, map[string]bool, error) {
	path := explicit
	if path == "" {
		for _, cand := range defaultFiles(home) {
			if _, err := os.Stat(cand); err == nil {
				path = cand
				break
			}
		}
		if path == "" {
			return "", nil, nil
		}
	}
	b, err := os.ReadFile(path)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return "", nil, aqerr.Usagef("create it or point AQ_CONFIG/--config at an existing file", "config file %s does not exist", path)
		}
		return "", nil, aqerr.Usagef("check its permissions (aq needs to read it)", "cannot read config file %s: %v", path, errors.Unwrap(err))
	}
	fv := viper.New()
	fv.SetConfigType("yaml")
	if err := fv.ReadConfig(bytes.NewReader(b)); err != nil {
		return "", nil, aqerr.Usagef("fix the YAML syntax", "config file %s is not valid YAML: %s", path, brief.FirstLine(err.Error(), 0))
	}
	byEnv := map[string]string{}
	for _, k := range Keys {
		for _, e := range k.Env {
			byEnv[strings.ToLower(e)] = k.Name
		}
	}
	settings := map[string]any{}
	seen := map[string]bool{}
	var unknown []string
	for key, val := range fv.AllSettings() {
		name := key
		if _, ok := Lookup(key); !ok {
			if canon, ok := byEnv[key]; ok {
				name = canon
			} else {
				unknown = append(unknown, key)
				continue
			}
		}
		if name == "config" {
			return "", nil, aqerr.Usagef("remove it", "config file %s: the key config cannot be set inside a config file", path)
		}
		if _, isMap := val.(map[string]any); isMap {
			return "", nil, aqerr.Usagef("use a plain value", "config file %s: %s must be a single value, not a map", path, key)
		}
		settings[name] = val
		seen[name] = true
	}
	if len(unknown) > 0 {
		sort.Strings(unknown)
		return "", nil, aqerr.Usagef("remove it or fix its spelling; `aq config` lists the keys", "config file %s: unknown key %q", path, unknown[0])
	}
	if err := v.MergeConfigMap(settings); err != nil {
		return "", nil, err
	}
	return path, seen, nil
}

func defaultFiles(home string) []string {
	var out []string
	if home != "" {
		out = append(out, filepath.Join(home, "config.yaml"))
	}
	xdg := os.Getenv("XDG_CONFIG_HOME")
	if xdg == "" {
		if h, err := os.UserHomeDir(); err == nil {
			xdg = filepath.Join(h, ".config")
		}
	}
	if xdg != "" {
		out = append(out, filepath.Join(xdg, "aq", "config.yaml"))
	}
	return out
}

// derive fills values computed from other keys.
func (c *Config) derive() {
	if c.SandboxMemory < 0 {
		c.SandboxMemory = 0
		if m := sandbox.HostMemory(); m > 0 {
			c.SandboxMemory = max(m/int64(max(c.Slots, 1)), minSandboxMemory)
			c.setDerived("sandbox_memory", strconv.FormatInt(c.SandboxMemory>>20, 10)+"MiB", "host memory / slots")
		}
	}
	if c.WorktreePool < 0 {
		c.WorktreePool = max(c.Slots, 1)
		c.setDerived("worktree_pool", strconv.Itoa(c.WorktreePool), "slots")
	}
	if c.FactoryID == "" {
		c.FactoryID = DefaultFactoryID()
		c.setDerived("factory_id", c.FactoryID, "host name")
	}
	switch {
	case c.SBSubscription != "":
	case c.FactoryPool != "":
		c.SBSubscription = c.FactoryPool
		c.setDerived("sb_subscription", c.SBSubscription, "factory_pool")
	default:
		c.SBSubscription = c.FactoryID
		c.setDerived("sb_subscription", c.SBSubscription, "factory_id")
	}
}

// setDerived records key name's value as computed from origin.
func (c *Config) setDerived(name, value, origin string) {
	k, _ := Lookup(name)
	c.settings[name] = Setting{Key: name, Value: value, Source: FromDerived, Origin: origin, Env: k.Env[0], Flag: "--" + k.Flag}
}

// DefaultFactoryID is the host name, made into a valid id.
func DefaultFactoryID() string {
	h, err := os.Hostname()
	if err != nil || h == "" {
		return "factory"
	}
	h, _, _ = strings.Cut(h, ".")
	var b strings.Builder
	for _, r := range h {
		switch {
		case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z', r >= '0' && r <= '9', r == '-', r == '_':
			b.WriteRune(r)
		default:
			b.WriteRune('-')
		}
	}
	id := strings.Trim(b.String(), "-_")
	if id == "" {
		return "factory"
	}
	if len(id) > 128 {
		id = id[:128]
	}
	return id
}

// Settings returns every key's effective value and source, in Keys order.
func (c *Config) Settings() []Setting {
	out := make([]Setting, 0, len(Keys))
	for _, k := range Keys {
		s, ok := c.settings[k.Name]
		if !ok {
			s = Setting{Key: k.Name, Env: k.Env[0], Flag: "--" + k.Flag, Secret: k.Secret}
		}
		out = append(out, s)
	}
	return out
}

// Secrets returns the secret values in c, for a Redactor.
func (c *Config) Secrets() []string {
	var out []string
	for _, s := range []string{c.FleetToken, c.SBConnectionString, c.NotifyURL} {
		if s != "" {
			out = append(out, s)
		}
	}
	return out
}

// Paths under Home (docs/local.md, "The queue on disk"; docs/architecture.md, "Running a job").
func (c *Config) QueueDir() string     { return filepath.Join(c.Home, "queue") }
func (c *Config) WorktreesDir() string { return filepath.Join(c.Home, "worktrees") }
func (c *Config) LocksDir() string     { return filepath.Join(c.Home, "locks") }
func (c *Config) LogsDir() string      { return filepath.Join(c.Home, "logs") }
func (c *Config) SpoolDir() string     { return filepath.Join(c.Home, "spool") }
func (c *Config) StateDir() string     { return filepath.Join(c.Home, "state") }

// SandboxDir holds the jobs' sandbox directories, $AQ_HOME/sandbox/<id>
// (docs/sandbox.md).
func (c *Config) SandboxDir() string { return filepath.Join(c.Home, "sandbox") }
func (c *Config) CredentialsFile() string {
	return filepath.Join(c.Home, "credentials")
}

// RunEngines are the engines this factory may run and offer: AQ_ENGINES
// when set, else every coding engine (claude, codex, devin) and, outside
// fleet mode, script. In fleet mode script is opt-in: a script job runs
// whatever command its author wrote, so offering it lets whoever can submit
// a job run code on this factory (docs/fleet.md).
func (c *Config) RunEngines(fleet bool) []string {
	if c.Engines != nil {
		return append([]string{}, c.Engines...)
	}
	out := []string{"claude", "codex", "devin"}
	if !fleet {
		out = append(out, "script")
	}
	return out
}

// EnginesExplicit reports whether AQ_ENGINES was set (then an engine it
// lists but this host lacks is worth a line at start).
func (c *Config) EnginesExplicit() bool { return c.Engines != nil }
