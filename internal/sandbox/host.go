package sandbox

import (
	"fmt"
	"strconv"
	"strings"
	"sync"

	"github.com/aqfleet/aq/internal/egress"
)

// Options configure Open.
type Options struct {
	// Init is aq's own executable, re-executed as each sandbox's init (it
	// calls MaybeInit first thing). "" (aq's packages run in-process, as
	// in tests): no sandbox can start, the level is none.
	Init string
	// Mode is AQ_SANDBOX.
	Mode Mode
	// Limits are AQ_SANDBOX_MEMORY and AQ_SANDBOX_PIDS: every job's, unless
	// its Policy sets its own.
	Limits Limits
	// TrialCache is a file that remembers, for this boot, that a trial
	// sandbox started ("": every probe runs the trial). On Linux the
	// trial is skipped while the file names the same boot, user, init
	// binary and user-namespace sysctls (trialKey); a failed trial is
	// never remembered, and a full sandbox that then fails to start
	// forgets it.
	TrialCache string
}

// Host is this aq process's view of sandboxing: what Probe found, and the
// Jails it hands out. Safe for concurrent use.
type Host struct {
	opts   Options
	report Report
	plat   hostPlatform

	once   sync.Once
	onOpen func(*Host)
	said   sync.Once
}

// Open probes the host (a trial sandbox on Linux) unless the mode is off,
// and returns its Host.
func Open(o Options) *Host {
	h := OpenLazy(o, nil)
	h.open()
	return h
}

// OpenLazy returns a Host that probes when it is first asked (so commands
// that never run a job never pay for the probe), and calls onOpen once
// (nil: nothing) when a job first asks (Refusal, Jail) — where aq says how
// engines will run. What only shows the sandbox (Report, Level: aq caps,
// aq status, the capability offer) probes without it.
func OpenLazy(o Options, onOpen func(*Host)) *Host {
	h := &Host{opts: o, onOpen: onOpen}
	if o.Mode == "" {
		h.opts.Mode = ModeAuto
	}
	return h
}

func (h *Host) open() {
	h.once.Do(func() {
		if h.opts.Mode == ModeOff {
			h.report = Report{Level: LevelNone}
			h.report.finish(offMissing())
			return
		}
		h.report, h.plat = probe(h.opts)
	})
}

// announce probes and, the first time a job asks, calls onOpen.
func (h *Host) announce() {
	h.open()
	first := false
	h.said.Do(func() { first = true })
	if first && h.onOpen != nil {
		h.onOpen(h) // outside the Once: it may ask the Host anything
	}
}

func offMissing() []Missing {
	out := make([]Missing, 0, len(Guarantees))
	for _, g := range Guarantees {
		out = append(out, Missing{Guarantee: g, Why: "AQ_SANDBOX=off"})
	}
	return out
}

// Report is what the probe found (level none with every guarantee missing
// under AQ_SANDBOX=off).
func (h *Host) Report() Report {
	h.open()
	return h.report
}

// Limits are every job's limits unless its Policy sets its own
// (AQ_SANDBOX_MEMORY, AQ_SANDBOX_PIDS); they hold where the report has
// GuaranteeLimits.
func (h *Host) Limits() Limits { return h.opts.Limits }

// Mode is the configured mode.
func (h *Host) Mode() Mode { return h.opts.Mode }

// Level is the level jobs run at: the probe's, none when the mode is off.
func (h *Host) Level() Level {
	h.open()
	return h.report.Level
}

// Refusal is the error every job gets on this host: under AQ_SANDBOX=on,
// when the host cannot reach the full level (wrapping ErrUnavailable);
// nil otherwise.
func (h *Host) Refusal() error {
	h.announce()
	return h.Refuses()
}

// Refuses is Refusal without saying how engines run: for what only shows
// the sandbox.
func (h *Host) Refuses() error {
	h.open()
	if h.opts.Mode != ModeOn || h.report.Level == LevelFull {
		return nil
	}
	return fmt.Errorf("%w: AQ_SANDBOX=on and this host cannot sandbox fully: %s", ErrUnavailable, h.report.Lacks())
}

// StartLine says once, at start, how engines run here: "" when fully
// sandboxed; what is missing under auto; that they are not sandboxed under
// off. warn says whether it is worth a warning.
func (h *Host) StartLine() (line string, warn bool) {
	h.open()
	r := h.report
	switch {
	case h.opts.Mode == ModeOff:
		return "AQ_SANDBOX=off: engines run unsandboxed, as the factory's user, with its files, network and processes in reach (docs/sandbox.md)", true
	case r.Level == LevelFull && r.Has(GuaranteeLimits):
		return "", false
	case r.Level == LevelFull:
		return "engines run in a full sandbox (" + r.Mechanism + "); missing: " + r.MissingLine(), h.opts.Limits != (Limits{})
	case r.Level == LevelPartial && h.opts.Mode == ModeAuto:
		return "engines run in a partial sandbox (" + r.Mechanism + "); missing: " + r.MissingLine(), true
	case r.Level == LevelNone && h.opts.Mode == ModeAuto:
		return "engines run unsandboxed: this host cannot sandbox: " + r.MissingLine(), true
	case h.opts.Mode == ModeOn:
		return "AQ_SANDBOX=on, but this host cannot sandbox fully: every job is refused (sandbox_unavailable): " + r.Lacks(), true
	}
	return "", false
}

// Jail returns the sandbox of one job's runs under p, having made the
// job's directory (p.JobDir), or nil when engines run unsandboxed (level
// none). The Jail is for the job's processes, one at a time (the engine,
// then verify); Remove removes the job's directory after the last.
func (h *Host) Jail(p Policy) (*Jail, error) {
	h.announce()
	if h.report.Level == LevelNone {
		return nil, nil
	}
	p = p.Clean()
	if p.Limits == (Limits{}) {
		p.Limits = h.opts.Limits
	}
	j := &Jail{h: h, p: p, level: h.report.Level}
	if err := j.prepare(); err != nil {
		_ = removeTree(p.JobDir)
		return nil, err
	}
	return j, nil
}

// Jail is one job's sandbox: it starts that job's processes (process.Jail)
// under its Policy.
type Jail struct {
	h     *Host
	p     Policy
	level Level
	plat  jailPlatform

	mu    sync.Mutex
	notes []string
	// trace: the init reports its steps' times as notes (benchmarks).
	trace bool
}

// Notes returns, and forgets, what the sandbox's starts since the last
// call did not do as planned but could do without (a cache without its
// overlay, a toolchain that could not be bound): worth a log line.
func (j *Jail) Notes() []string {
	j.mu.Lock()
	defer j.mu.Unlock()
	n := j.notes
	j.notes = nil
	return n
}

func (j *Jail) note(n ...string) {
	j.mu.Lock()
	j.notes = append(j.notes, n...)
	j.mu.Unlock()
}

// Level is the level this jail enforces.
func (j *Jail) Level() Level { return j.level }

// Policy is the jail's policy.
func (j *Jail) Policy() Policy { return j.p }

// Supervises reports whether the jail ends everything it runs when aq
// dies (the full level: the sandbox's init does), so the process layer
// starts no supervisor (process.Jail).
func (j *Jail) Supervises() bool { return j.level == LevelFull }

// Home is $HOME as the engine sees it: the user's home path where the
// job's home is mounted there (full), else the job's home itself.
func (j *Jail) Home() string { return j.plat.home(j) }

// Env returns env as the engine gets it inside the sandbox: HOME and
// TMPDIR the job's own, the proxy variables (or none), IS_SANDBOX=1 (claude
// takes bypassPermissions as root only inside a sandbox), and without the
// user's session: its runtime directory, agent sockets and XDG homes that
// point outside the job's home.
func (j *Jail) Env(env []string) []string {
	return sandboxEnv(env, j.Home(), j.plat.tmp(j), j.proxyURL())
}

// proxyURL is where the engine finds its proxy, "" when it has none.
func (j *Jail) proxyURL() string {
	switch {
	case j.p.Net.ProxySocket != "" && j.level == LevelFull:
		return "http://127.0.0.1:" + strconv.Itoa(ProxyBridgePort)
	case j.p.Net.ProxyPort > 0:
		return "http://127.0.0.1:" + strconv.Itoa(j.p.Net.ProxyPort)
	}
	return ""
}

// proxyVars are the variables git, curl, npm, pip, go and the engine CLIs
// read their proxy from.
var proxyVars = []string{"HTTPS_PROXY", "HTTP_PROXY", "ALL_PROXY", "https_proxy", "http_proxy", "all_proxy"}

// sessionVars are the user's session, which the sandbox does not carry.
var sessionVars = []string{"XDG_RUNTIME_DIR", "SSH_AUTH_SOCK", "SSH_AGENT_PID", "DBUS_SESSION_BUS_ADDRESS",
	"XDG_CONFIG_HOME", "XDG_DATA_HOME", "XDG_CACHE_HOME", "XDG_STATE_HOME", "GNUPGHOME", "TMPDIR", "TMP", "TEMP",
	"NO_PROXY", "no_proxy", "IS_SANDBOX", "HOME"}

func sandboxEnv(env []string, home, tmp, proxy string) []string {
	drop := map[string]bool{}
	for _, k := range append(append([]string{}, proxyVars...), sessionVars...) {
		drop[k] = true
	}
	out := make([]string, 0, len(env)+12)
	for _, kv := range env {
		k, _, _ := strings.Cut(kv, "=")
		if !drop[k] {
			out = append(out, kv)
		}
	}
	out = append(out, "HOME="+home, "TMPDIR="+tmp, "IS_SANDBOX=1")
	if proxy != "" {
		// The proxy variables (both spellings), NO_PROXY for loopback, and
		// what makes Node's fetch, Yarn 2+ and the JVM follow them too.
		out = egress.Env(proxy, out)
	}
	return out
}
