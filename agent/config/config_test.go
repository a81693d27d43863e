package config

import (
	"github.com/aqfleet/aq/internal/sandbox"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/spf13/pflag"

	"github.com/aqfleet/aq/internal/aqerr"
)

// sample holds a valid non-default raw value for every key, and what it reads
// back as in `aq config` (secrets read back as ***). A key without a sample
// fails TestEveryKeyHasFlagAndEnv, so new keys cannot skip the test.
var sample = map[string]string{
	"config":                 "", // tested separately: it names a file
	"home":                   "/tmp/aq-sample-home",
	"repo_base":              "/tmp/aq-sample-src",
	"repo_urls":              "https://github.com/acme/{repo}.git",
	"repo_mirror":            "/tmp/aq-sample-mirror",
	"fleet":                  "1",
	"fleet_api":              "http://127.0.0.1:9/api",
	"fleet_token":            "tok-sample-123",
	"product_id":             "chronomind",
	"factory_id":             "mac-7",
	"factory_pool":           "builders",
	"fleet_route":            "0",
	"fleet_shadow":           "1",
	"fleet_gate":             "1",
	"heartbeat_sec":          "20",
	"lease_renew_sec":        "11",
	"poll_seconds":           "7",
	"caps_refresh":           "90s",
	"sb_namespace":           "ns.servicebus.windows.net",
	"sb_connection_string":   "Endpoint=sb://127.0.0.1:5672;SharedAccessKeyName=k;SharedAccessKey=v",
	"sb_topic":               "other-topic",
	"sb_subscription":        "sub-9",
	"sb_sessions":            "1",
	"metrics_addr":           "127.0.0.1:9464",
	"gc_wip_retention":       "48h",
	"slots":                  "3",
	"worktree_pool":          "2",
	"worktree_pool_max_age":  "24h0m0s",
	"worktree_disk_max":      "50GiB",
	"drain_timeout":          "10m0s",
	"kill_grace":             "500ms",
	"engine_probe_timeout":   "90s",
	"checkpoint_interval":    "2m",
	"verify_rounds":          "1",
	"claude_permission_mode": "bypassPermissions",
	"codex_sandbox":          "danger-full-access",
	"sandbox":                "on",
	"sandbox_memory":         "8GiB",
	"sandbox_pids":           "4096",
	"log_max":                "64MiB",
	"job_disk_max":           "10GiB",
	"disk_reserve":           "4GiB",
	"sandbox_writable":       "/var/cache/ccache",
	"protected_paths":        ".github/**,Makefile",
	"sandbox_net":            "@registries,*.corp.example.com,10.20.0.0/16:443",
	"sandbox_engine_hosts":   "claude=llm-gateway.example.com:443",
	"price_table":            "/tmp/prices.json",
	"engines":                "claude,script",
	"engine_env":             "AWS_PROFILE,MY_TOOL_HOME",
	"claude_telemetry":       "1",
	"notify_url":             "https://hooks.example.com/services/T0/B0/sample-token",
	"broker_depth_interval":  "2m0s",
	"log_format":             "json",
	"log_level":              "debug",
}

// isolate clears every aq variable so the test sees only what it sets, and
// points HOME and XDG_CONFIG_HOME at a temp dir so no real config is read.
func isolate(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	for _, k := range Keys {
		for _, e := range k.Env {
			t.Setenv(e, "")
			os.Unsetenv(e)
		}
	}
	t.Setenv("HOME", dir)
	t.Setenv("XDG_CONFIG_HOME", filepath.Join(dir, "xdg"))
	return dir
}

func flags(t *testing.T, args ...string) *pflag.FlagSet {
	t.Helper()
	fs := pflag.NewFlagSet("aq", pflag.ContinueOnError)
	AddFlags(fs)
	if err := fs.Parse(args); err != nil {
		t.Fatal(err)
	}
	return fs
}

func setting(t *testing.T, c *Config, key string) Setting {
	t.Helper()
	for _, s := range c.Settings() {
		if s.Key == key {
			return s
		}
	}
	t.Fatalf("no setting %s", key)
	return Setting{}
}

func TestEveryKeyHasFlagAndEnv(t *testing.T) {
	for _, k := range Keys {
		if k.Flag == "" || len(k.Env) == 0 || k.Usage == "" {
			t.Errorf("key %s: flag %q env %v usage %q: every key needs a flag, an env name and a usage line", k.Name, k.Flag, k.Env, k.Usage)
		}
		if _, ok := sample[k.Name]; !ok {
			t.Errorf("key %s has no sample value in config_test.go", k.Name)
		}
		// pflag takes a `quoted` word in a usage line for the flag's type
		// name in help (--repo-urls name url).
		if strings.Contains(k.Usage, "`") {
			t.Errorf("key %s: its usage has a backquote, which help would show as the flag's type", k.Name)
		}
	}
	for _, k := range Keys {
		if k.Name == "config" {
			continue
		}
		want := sample[k.Name]
		if k.Secret {
			want = "***"
		}
		t.Run(k.Name+"/env", func(t *testing.T) {
			isolate(t)
			t.Setenv(k.Env[0], sample[k.Name])
			c, err := Load(flags(t))
			if err != nil {
				t.Fatal(err)
			}
			s := setting(t, c, k.Name)
			if s.Source != FromEnv || s.Origin != k.Env[0] || s.Value != want {
				t.Fatalf("env %s: got %+v, want value %q from env", k.Env[0], s, want)
			}
		})
		t.Run(k.Name+"/flag", func(t *testing.T) {
			dir := isolate(t)
			val := sample[k.Name]
			if k.FlagIsFile {
				p := filepath.Join(dir, "secret")
				if err := os.WriteFile(p, []byte(val+"\n"), 0o600); err != nil {
					t.Fatal(err)
				}
				val = p
			}
			c, err := Load(flags(t, "--"+k.Flag+"="+val))
			if err != nil {
				t.Fatal(err)
			}
			s := setting(t, c, k.Name)
			if s.Source != FromFlag || s.Value != want {
				t.Fatalf("flag --%s: got %+v, want value %q from flag", k.Flag, s, want)
			}
		})
	}
}

func TestPrecedenceFlagEnvFileDefault(t *testing.T) {
	dir := isolate(t)
	home := filepath.Join(dir, "home")
	os.MkdirAll(home, 0o755)
	os.WriteFile(filepath.Join(home, "config.yaml"), []byte("poll_seconds: 40\nheartbeat_sec: 25\nlease_renew_sec: 12\n"), 0o644)
	t.Setenv("AQ_HOME", home)
	t.Setenv("AQ_POLL_SECONDS", "41")
	t.Setenv("AQ_HEARTBEAT_SEC", "26")

	c, err := Load(flags(t, "--poll-seconds=42"))
	if err != nil {
		t.Fatal(err)
	}
	if c.Poll != 42*time.Second || setting(t, c, "poll_seconds").Source != FromFlag {
		t.Errorf("flag must beat env and file: poll=%v", c.Poll)
	}
	if c.Heartbeat != 26*time.Second || setting(t, c, "heartbeat_sec").Source != FromEnv {
		t.Errorf("env must beat file: heartbeat=%v", c.Heartbeat)
	}
	if c.LeaseRenew != 12*time.Second || setting(t, c, "lease_renew_sec").Source != FromFile {
		t.Errorf("file must beat default: lease=%v", c.LeaseRenew)
	}
	if c.SBTopic != "fleet-dispatch" || setting(t, c, "sb_topic").Source != FromDefault {
		t.Errorf("default: topic=%q", c.SBTopic)
	}
	if c.ConfigFile != filepath.Join(home, "config.yaml") {
		t.Errorf("config file %q", c.ConfigFile)
	}
}

func TestLegacyNames(t *testing.T) {
	isolate(t)
	t.Setenv("POLL_SECONDS", "9")
	t.Setenv("AQ_FLEET_REPO_BASE", "/srv/src")
	c, err := Load(flags(t))
	if err != nil {
		t.Fatal(err)
	}
	if c.Poll != 9*time.Second || setting(t, c, "poll_seconds").Origin != "POLL_SECONDS" {
		t.Errorf("legacy POLL_SECONDS not honoured: %v %+v", c.Poll, setting(t, c, "poll_seconds"))
	}
	if c.RepoBase != "/srv/src" {
		t.Errorf("legacy AQ_FLEET_REPO_BASE not honoured: %q", c.RepoBase)
	}
	t.Setenv("AQ_POLL_SECONDS", "8")
	c, err = Load(flags(t))
	if err != nil {
		t.Fatal(err)
	}
	if c.Poll != 8*time.Second {
		t.Errorf("AQ_POLL_SECONDS must win over POLL_SECONDS: %v", c.Poll)
	}
}

func TestFileAcceptsEnvNames(t *testing.T) {
	dir := isolate(t)
	p := filepath.Join(dir, "c.yaml")
	os.WriteFile(p, []byte("AQ_FLEET_GATE: 1\nPOLL_SECONDS: 33\n"), 0o644)
	c, err := Load(flags(t, "--config", p))
	if err != nil {
		t.Fatal(err)
	}
	if !c.FleetGate || c.Poll != 33*time.Second {
		t.Fatalf("env-style keys in file not applied: gate=%v poll=%v", c.FleetGate, c.Poll)
	}
}

func TestInvalidValuesAreUsageErrors(t *testing.T) {
	cases := []struct {
		name string
		env  map[string]string
		args []string
		file string
		want []string // substrings of the one-line message
	}{
		{name: "heartbeat too high", env: map[string]string{"AQ_HEARTBEAT_SEC": "120"}, want: []string{`AQ_HEARTBEAT_SEC="120"`, "90"}},
		{name: "heartbeat not numeric", env: map[string]string{"AQ_HEARTBEAT_SEC": "soon"}, want: []string{"AQ_HEARTBEAT_SEC", "whole number"}},
		{name: "poll not numeric legacy", env: map[string]string{"POLL_SECONDS": "3s"}, want: []string{"POLL_SECONDS", "whole number"}},
		{name: "bool word", env: map[string]string{"AQ_FLEET": "maybe"}, want: []string{"AQ_FLEET", "boolean"}},
		{name: "bad url", args: []string{"--fleet-api=ftp://x"}, want: []string{"--fleet-api", "http(s) URL"}},
		{name: "url with creds", env: map[string]string{"AQ_FLEET_API": "https://u:p@host/api"}, want: []string{"credentials"}},
		{name: "bad factory id", env: map[string]string{"AQ_FACTORY_ID": "../etc"}, want: []string{"AQ_FACTORY_ID", "valid id"}},
		{name: "bad duration", env: map[string]string{"AQ_GC_WIP_RETENTION": "two weeks"}, want: []string{"AQ_GC_WIP_RETENTION", "duration"}},
		{name: "bad metrics addr", env: map[string]string{"AQ_METRICS_ADDR": "9464"}, want: []string{"host:port"}},
		{name: "bad log format", args: []string{"--log-format=xml"}, want: []string{"text|json"}},
		{name: "caps refresh too short", env: map[string]string{"AQ_CAPS_REFRESH": "10ms"}, want: []string{"AQ_CAPS_REFRESH", "at least 1s"}},
		{name: "caps refresh not a duration", env: map[string]string{"AQ_CAPS_REFRESH": "often"}, want: []string{"AQ_CAPS_REFRESH", "duration"}},
		{name: "slots zero", env: map[string]string{"AQ_SLOTS": "0"}, want: []string{"AQ_SLOTS", "1 to 64"}},
		{name: "engines unknown", env: map[string]string{"AQ_ENGINES": "claude,bash"}, want: []string{`AQ_ENGINES="claude,bash"`, `"bash", which is not an engine`, "claude, codex, devin, script or all"}},
		{name: "engine env not a name", env: map[string]string{"AQ_ENGINE_ENV": "GOOD,BAD-NAME"}, want: []string{"AQ_ENGINE_ENV", `"BAD-NAME", which is not an environment variable name`}},
		{name: "verify rounds negative", env: map[string]string{"AQ_VERIFY_ROUNDS": "-1"}, want: []string{`AQ_VERIFY_ROUNDS="-1"`, "0 to 10"}},
		{name: "verify rounds not numeric", env: map[string]string{"AQ_VERIFY_ROUNDS": "two"}, want: []string{"AQ_VERIFY_ROUNDS", "whole number"}},
		{name: "verify rounds in file", file: "verify_rounds: 11\n", want: []string{"verify_rounds in", "0 to 10"}},
		{name: "pool negative", env: map[string]string{"AQ_WORKTREE_POOL": "-1"}, want: []string{"AQ_WORKTREE_POOL", "0 to 64"}},
		{name: "pool not numeric", env: map[string]string{"AQ_WORKTREE_POOL": "many"}, want: []string{"AQ_WORKTREE_POOL", "whole number"}},
		{name: "disk max unit", env: map[string]string{"AQ_WORKTREE_DISK_MAX": "50 gigs"}, want: []string{"AQ_WORKTREE_DISK_MAX", "size", "50GiB"}},
		{name: "disk max negative", env: map[string]string{"AQ_WORKTREE_DISK_MAX": "-5GB"}, want: []string{"AQ_WORKTREE_DISK_MAX", "size"}},
		{name: "disk max overflow", env: map[string]string{"AQ_WORKTREE_DISK_MAX": "99999999999TiB"}, want: []string{"AQ_WORKTREE_DISK_MAX", "size"}},
		{name: "pool age", env: map[string]string{"AQ_WORKTREE_POOL_MAX_AGE": "3 days"}, want: []string{"AQ_WORKTREE_POOL_MAX_AGE", "duration"}},
		{name: "bad yaml", file: "poll_seconds: [1,\n", want: []string{"not valid YAML"}},
		{name: "unknown key", file: "heartbeat_secs: 30\n", want: []string{`unknown key "heartbeat_secs"`, "spelling"}},
		{name: "file value invalid", file: "heartbeat_sec: 95\n", want: []string{"heartbeat_sec in", "95"}},
		{name: "home in file", file: "home: /x\n", want: []string{"home cannot be set"}},
		{name: "missing explicit file", args: []string{"--config=/nonexistent/aq.yaml"}, want: []string{"does not exist"}},
		{name: "unreadable token file", args: []string{"--fleet-token-file=/nonexistent/tok"}, want: []string{"--fleet-token-file", "cannot read"}},
		{name: "notify url not http", env: map[string]string{"AQ_NOTIFY_URL": "ftp://hooks.example.com/T0/tok-in-url"}, want: []string{`AQ_NOTIFY_URL="***"`, "http(s) URL"}},
		{name: "notify url no host", env: map[string]string{"AQ_NOTIFY_URL": "https:///tok-in-url"}, want: []string{"AQ_NOTIFY_URL", "http(s) URL"}},
		{name: "notify url file", args: []string{"--notify-url-file=/nonexistent/url"}, want: []string{"--notify-url-file", "cannot read"}},
		{name: "depth interval too short", env: map[string]string{"AQ_BROKER_DEPTH_INTERVAL": "1s"}, want: []string{"AQ_BROKER_DEPTH_INTERVAL", "at least 10s"}},
		{name: "sandbox mode", env: map[string]string{"AQ_SANDBOX": "maybe"}, want: []string{`AQ_SANDBOX="maybe"`, "auto, on or off"}},
		{name: "sandbox memory not a size", env: map[string]string{"AQ_SANDBOX_MEMORY": "lots"}, want: []string{"AQ_SANDBOX_MEMORY", "size", "8GiB"}},
		{name: "sandbox memory too small", env: map[string]string{"AQ_SANDBOX_MEMORY": "8M"}, want: []string{"AQ_SANDBOX_MEMORY", "at least 64MiB"}},
		{name: "sandbox pids not a number", env: map[string]string{"AQ_SANDBOX_PIDS": "many"}, want: []string{"AQ_SANDBOX_PIDS", "whole number"}},
		{name: "sandbox pids negative", env: map[string]string{"AQ_SANDBOX_PIDS": "-3"}, want: []string{"AQ_SANDBOX_PIDS", "negative"}},
		{name: "log max not a size", env: map[string]string{"AQ_LOG_MAX": "lots"}, want: []string{"AQ_LOG_MAX", "size", "32MiB"}},
		{name: "log max negative", env: map[string]string{"AQ_LOG_MAX": "-1"}, want: []string{"AQ_LOG_MAX", "size"}},
		{name: "job disk max negative", env: map[string]string{"AQ_JOB_DISK_MAX": "-1"}, want: []string{"AQ_JOB_DISK_MAX", "not a size", "10GiB"}},
		{name: "disk reserve not a size", env: map[string]string{"AQ_DISK_RESERVE": "lots"}, want: []string{"AQ_DISK_RESERVE", "not a size", "2GiB"}},
		{name: "log max too small", env: map[string]string{"AQ_LOG_MAX": "10KiB"}, want: []string{"AQ_LOG_MAX", "at least 1MiB"}},
		{name: "sandbox writable relative", env: map[string]string{"AQ_SANDBOX_WRITABLE": "/ok,cache"}, want: []string{"AQ_SANDBOX_WRITABLE", `entry "cache" is not an absolute path`}},
		{name: "sandbox writable root", env: map[string]string{"AQ_SANDBOX_WRITABLE": "/"}, want: []string{"AQ_SANDBOX_WRITABLE", "the whole host"}},
		{name: "sandbox writable in aq home", env: map[string]string{"AQ_HOME": "/srv/aq", "AQ_SANDBOX_WRITABLE": "/srv/aq/worktrees"}, want: []string{"AQ_SANDBOX_WRITABLE", "overlaps AQ_HOME /srv/aq"}},
		{name: "sandbox writable above the repo base", env: map[string]string{"AQ_REPO_BASE": "/srv/src/repos", "AQ_SANDBOX_WRITABLE": "/srv"}, want: []string{"AQ_SANDBOX_WRITABLE", "overlaps the repo base"}},
		{name: "sandbox writable the home", env: map[string]string{"AQ_HOME": "/srv/aq", "AQ_REPO_BASE": "/srv/src", "AQ_SANDBOX_WRITABLE": "~"}, want: []string{"AQ_SANDBOX_WRITABLE", "holds the home"}},
		{name: "codex sandbox", env: map[string]string{"AQ_CODEX_SANDBOX": "yolo"}, want: []string{"AQ_CODEX_SANDBOX", "danger-full-access"}},
		{name: "permission mode", env: map[string]string{"AQ_CLAUDE_PERMISSION_MODE": "yolo"}, want: []string{"AQ_CLAUDE_PERMISSION_MODE", "bypassPermissions"}},
		{name: "depth interval not a duration", env: map[string]string{"AQ_BROKER_DEPTH_INTERVAL": "often"}, want: []string{"AQ_BROKER_DEPTH_INTERVAL", "duration"}},
		{name: "protected paths bad glob", env: map[string]string{"AQ_PROTECTED_PATHS": ".github/**, ci/[x"}, want: []string{`AQ_PROTECTED_PATHS=".github/**, ci/[x"`, `entry "ci/[x" is not a valid glob`, "e.g. .github/workflows/**"}},
		{name: "protected paths outside", args: []string{"--protected-paths=../x"}, want: []string{"--protected-paths", `entry "../x" is outside the repository`}},
		{name: "sandbox net bad host", env: map[string]string{"AQ_SANDBOX_NET": "github.com, exa mple.com"}, want: []string{`AQ_SANDBOX_NET="github.com, exa mple.com"`, `entry "exa mple.com" is not a host name`, "(use host, *.domain, host:port"}},
		{name: "sandbox net bad port", args: []string{"--sandbox-net=github.com:https"}, want: []string{"--sandbox-net", `entry "github.com:https" has port "https"`, "1 to 65535"}},
		{name: "sandbox net unknown set", file: "sandbox_net: \"@pip\"\n", want: []string{"sandbox_net in", `entry "@pip" is not a known set`, "@pypi"}},
		{name: "sandbox engine hosts", env: map[string]string{"AQ_SANDBOX_ENGINE_HOSTS": "claude"}, want: []string{"AQ_SANDBOX_ENGINE_HOSTS", "is not engine=hosts"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			dir := isolate(t)
			for k, v := range tc.env {
				t.Setenv(k, v)
			}
			args := tc.args
			if tc.file != "" {
				p := filepath.Join(dir, "config.yaml")
				os.WriteFile(p, []byte(tc.file), 0o644)
				args = append(args, "--config="+p)
			}
			_, err := Load(flags(t, args...))
			if err == nil {
				t.Fatal("Load accepted an invalid value")
			}
			if aqerr.ExitCode(err) != aqerr.Usage {
				t.Errorf("exit code %v, want usage (2)", aqerr.ExitCode(err))
			}
			msg := aqerr.Message(err)
			if strings.Contains(msg, "\n") {
				t.Errorf("message is not one line: %q", msg)
			}
			if strings.Contains(msg, "tok-in-url") {
				t.Errorf("message quotes a secret: %q", msg)
			}
			for _, w := range tc.want {
				if !strings.Contains(msg, w) {
					t.Errorf("message %q lacks %q", msg, w)
				}
			}
		})
	}
}

func TestUnreadableConfigFile(t *testing.T) {
	dir := isolate(t)
	// A directory where the file should be cannot be read, even by root.
	p := filepath.Join(dir, "cfgdir")
	os.Mkdir(p, 0o755)
	_, err := Load(flags(t, "--config="+p))
	if err == nil || aqerr.ExitCode(err) != aqerr.Usage || !strings.Contains(err.Error(), "cannot read config file") {
		t.Fatalf("got %v", err)
	}
}

func TestSecretsNeverShown(t *testing.T) {
	isolate(t)
	t.Setenv("AQ_FLEET_TOKEN", "tok-very-secret")
	t.Setenv("AQ_HEARTBEAT_SEC", "200")
	_, err := Load(flags(t))
	if err == nil {
		t.Fatal("want error")
	}
	var c *Config
	isolate(t)
	t.Setenv("AQ_FLEET_TOKEN", "tok-very-secret")
	c, err = Load(flags(t))
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range c.Settings() {
		if strings.Contains(s.Value, "tok-very-secret") {
			t.Fatalf("secret shown in setting %+v", s)
		}
	}
	if c.FleetToken != "tok-very-secret" {
		t.Fatal("token not loaded")
	}
	if got := c.Secrets(); len(got) != 1 || got[0] != "tok-very-secret" {
		t.Fatalf("Secrets() = %v", got)
	}
}

func TestDerivedDefaults(t *testing.T) {
	isolate(t)
	t.Setenv("AQ_FACTORY_ID", "f-1")
	c, err := Load(flags(t))
	if err != nil {
		t.Fatal(err)
	}
	if c.SBSubscription != "f-1" || setting(t, c, "sb_subscription").Source != FromDerived {
		t.Fatalf("subscription should default to factory id: %q", c.SBSubscription)
	}
	t.Setenv("AQ_FACTORY_POOL", "builders")
	if c, err := Load(flags(t)); err != nil || c.SBSubscription != "builders" || setting(t, c, "sb_subscription").Origin != "factory_pool" {
		t.Fatalf("a replica's subscription should default to its pool: %q (%v)", c.SBSubscription, err)
	}
	t.Setenv("AQ_FACTORY_POOL", "")
	home, _ := os.UserHomeDir()
	if c.Home != filepath.Join(home, ".aq") || c.RepoBase != filepath.Join(home, "src") {
		t.Fatalf("home %q repo base %q", c.Home, c.RepoBase)
	}
	if !c.FleetRoute || c.Heartbeat != 30*time.Second || c.Poll != 15*time.Second || c.GCWIPRetention != 336*time.Hour {
		t.Fatalf("defaults wrong: %+v", c)
	}
}

// The worktree pool's size defaults to the slots; 0 turns it off; sizes
// take units.
func TestWorktreePoolKeys(t *testing.T) {
	isolate(t)
	c, err := Load(flags(t))
	if err != nil {
		t.Fatal(err)
	}
	if c.WorktreePool != 1 || setting(t, c, "worktree_pool").Source != FromDerived || c.WorktreeDiskMax != 0 || c.WorktreePoolMaxAge != 72*time.Hour {
		t.Fatalf("defaults: pool %d (%+v), disk max %d, age %v", c.WorktreePool, setting(t, c, "worktree_pool"), c.WorktreeDiskMax, c.WorktreePoolMaxAge)
	}
	t.Setenv("AQ_SLOTS", "4")
	if c, err := Load(flags(t)); err != nil || c.WorktreePool != 4 || setting(t, c, "worktree_pool").Origin != "slots" {
		t.Fatalf("pool should follow the slots: %d (%v)", c.WorktreePool, err)
	}
	t.Setenv("AQ_WORKTREE_POOL", "0")
	if c, err := Load(flags(t)); err != nil || c.WorktreePool != 0 {
		t.Fatalf("AQ_WORKTREE_POOL=0 turns pooling off: %d (%v)", c.WorktreePool, err)
	}
	for raw, want := range map[string]int64{"": 0, "0": 0, "1048576": 1 << 20, "500MB": 500e6, "50GiB": 50 << 30, "2T": 2 << 40, "3 KiB": 3 << 10} {
		t.Setenv("AQ_WORKTREE_DISK_MAX", raw)
		if c, err := Load(flags(t)); err != nil || c.WorktreeDiskMax != want {
			t.Errorf("AQ_WORKTREE_DISK_MAX=%q: %d (%v), want %d", raw, c.WorktreeDiskMax, err, want)
		}
	}
}

func TestBareBoolFlag(t *testing.T) {
	isolate(t)
	c, err := Load(flags(t, "--fleet", "--fleet-gate"))
	if err != nil {
		t.Fatal(err)
	}
	if !c.Fleet || !c.FleetGate {
		t.Fatalf("bare bool flags: fleet=%v gate=%v", c.Fleet, c.FleetGate)
	}
}

// TestRunEngines: AQ_ENGINES lists the engines a factory runs; its default
// leaves script out in fleet mode only (issue #26: a script job runs code
// from whoever can submit one).
func TestRunEngines(t *testing.T) {
	for _, c := range []struct {
		raw         string
		local, flee string
	}{
		{"", "claude,codex,devin,script", "claude,codex,devin"},
		{"all", "claude,codex,devin,script", "claude,codex,devin,script"},
		{"script, claude claude", "script,claude", "script,claude"},
		{"CODEX", "codex", "codex"},
	} {
		var cfg Config
		if err := setEngines(&cfg, c.raw); err != nil {
			t.Fatalf("%q: %v", c.raw, err)
		}
		if got := strings.Join(cfg.RunEngines(false), ","); got != c.local {
			t.Errorf("%q locally: %s, want %s", c.raw, got, c.local)
		}
		if got := strings.Join(cfg.RunEngines(true), ","); got != c.flee {
			t.Errorf("%q in fleet mode: %s, want %s", c.raw, got, c.flee)
		}
		if cfg.EnginesExplicit() != (c.raw != "") {
			t.Errorf("%q: explicit %v", c.raw, cfg.EnginesExplicit())
		}
	}
}

// The sandbox's limits have defaults where the host allows (#32): memory
// is the host's divided by the slots, processes 4096; 0 turns either off.
func TestSandboxLimitDefaults(t *testing.T) {
	isolate(t)
	mem := sandbox.HostMemory()
	if mem == 0 {
		t.Skip("this platform does not say its memory")
	}
	c, err := Load(flags(t))
	if err != nil {
		t.Fatal(err)
	}
	if c.SandboxMemory != max(mem, minSandboxMemory) || setting(t, c, "sandbox_memory").Source != FromDerived || c.SandboxPids != 4096 {
		t.Fatalf("defaults: memory %d (%+v), want %d; pids %d", c.SandboxMemory, setting(t, c, "sandbox_memory"), mem, c.SandboxPids)
	}
	t.Setenv("AQ_SLOTS", "4")
	if c, err := Load(flags(t)); err != nil || c.SandboxMemory != max(mem/4, minSandboxMemory) || setting(t, c, "sandbox_memory").Origin != "host memory / slots" {
		t.Fatalf("memory should be the host's divided by the slots: %d (%v)", c.SandboxMemory, err)
	}
	t.Setenv("AQ_SANDBOX_MEMORY", "0")
	t.Setenv("AQ_SANDBOX_PIDS", "0")
	if c, err := Load(flags(t)); err != nil || c.SandboxMemory != 0 || c.SandboxPids != 0 {
		t.Fatalf("0 turns the limits off: %d %d (%v)", c.SandboxMemory, c.SandboxPids, err)
	}
	t.Setenv("AQ_SANDBOX_MEMORY", "2GiB")
	if c, err := Load(flags(t)); err != nil || c.SandboxMemory != 2<<30 {
		t.Fatalf("AQ_SANDBOX_MEMORY=2GiB: %d (%v)", c.SandboxMemory, err)
	}
}

// TestProtectedPathsDefault: unset, AQ_PROTECTED_PATHS leaves the default
// list (nil: shipcheck.DefaultProtected) — an empty list would protect
// nothing, which the hostile suite's workflow case caught; "," protects
// nothing on purpose.
func TestProtectedPathsDefault(t *testing.T) {
	isolate(t)
	c, err := Load(nil)
	if err != nil || c.ProtectedPaths != nil {
		t.Fatalf("unset: %q, %v; want nil (the default list)", c.ProtectedPaths, err)
	}
	t.Setenv("AQ_PROTECTED_PATHS", ",")
	c, err = Load(nil)
	if err != nil || c.ProtectedPaths == nil || len(c.ProtectedPaths) != 0 {
		t.Fatalf(`",": %q, %v; want an empty list`, c.ProtectedPaths, err)
	}
}
