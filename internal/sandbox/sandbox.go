// Package sandbox owns the per-job sandbox an engine and the job's verify
// command run in (docs/sandbox.md): what this host can enforce (Probe: the
// level full, partial or none, and which guarantees hold), the Policy of
// one job (what its engine may read, write and reach), the job's own
// directory (its home, with copies of the engine's login files, and its
// temporary directory), and starting a command inside the sandbox for the
// process layer (process.Jail).
//
// On Linux (full): aq re-executed as the sandbox's init (MaybeInit), PID 1
// of new user, mount, pid, net, ipc and uts namespaces; the host seen
// read-only with what the job must not read hidden under empty mounts; a
// fresh /proc; loopback only, with a bridge to the job's egress proxy; the
// engine without capabilities, with no_new_privs and a Landlock domain on
// top; and, where the host delegates cgroup v2 (or lets aq write the
// cgroup v1 memory and pids hierarchies), cgroups of the job's own with
// its memory and process limits. Everything inside ends when init
// does, and init ends with the engine or with aq, however aq dies. Where
// user namespaces are blocked (partial): Landlock alone. macOS (partial):
// sandbox-exec with a Seatbelt profile generated from the same Policy
// (seatbelt.go). Windows: none.
//
// It is a leaf package: the runner builds a Policy per job and hands the
// Jail to the process layer.
package sandbox

import (
	"errors"
	"fmt"
	"strings"
)

// Mode is AQ_SANDBOX: whether engines run sandboxed.
type Mode string

const (
	// ModeAuto sandboxes at the best level the host offers, and says once
	// at start which guarantees are missing.
	ModeAuto Mode = "auto"
	// ModeOn requires the full level: a host that cannot offer it refuses
	// every job (sandbox_unavailable, retryable elsewhere).
	ModeOn Mode = "on"
	// ModeOff runs engines as the factory's user on the host, as before
	// the sandbox; aq says so once at start.
	ModeOff Mode = "off"
)

// ParseMode reads AQ_SANDBOX ("" is auto).
func ParseMode(s string) (Mode, error) {
	switch m := Mode(strings.ToLower(strings.TrimSpace(s))); m {
	case "":
		return ModeAuto, nil
	case ModeAuto, ModeOn, ModeOff:
		return m, nil
	}
	return "", fmt.Errorf("is not a sandbox mode (use auto, on or off)")
}

// Level is how much of the Policy a host can enforce.
type Level string

const (
	// LevelNone: no sandbox; the engine runs as the factory's user.
	LevelNone Level = "none"
	// LevelPartial: Landlock alone (user namespaces blocked): files,
	// TCP connect limited to the proxy's port, no signals or ptrace out of
	// the sandbox; other processes stay visible and a daemonised straggler
	// can outlive a killed aq.
	LevelPartial Level = "partial"
	// LevelFull: every guarantee of docs/sandbox.md but the limits, which
	// need cgroup v2 delegated to aq or cgroup v1 writable by it
	// (GuaranteeLimits).
	LevelFull Level = "full"
)

// Holds reports whether level l gives every guarantee of level want (an
// unknown level holds none but none's).
func (l Level) Holds(want Level) bool { return levelRank(l) >= levelRank(want) }

func levelRank(l Level) int {
	switch l {
	case LevelFull:
		return 2
	case LevelPartial:
		return 1
	}
	return 0
}

// Guarantee is one promise of the sandbox (docs/sandbox.md's table of
// levels by guarantees).
type Guarantee string

const (
	// GuaranteeFiles: the hidden paths are unreadable, the engine writes
	// only to its worktree and its own home and temporary directory, and
	// the job's git metadata is read-only.
	GuaranteeFiles Guarantee = "files"
	// GuaranteeNetwork: no route out but the job's egress proxy.
	GuaranteeNetwork Guarantee = "network"
	// GuaranteeProcesses: the engine cannot see, trace or signal aq, other
	// jobs or the host's processes.
	GuaranteeProcesses Guarantee = "processes"
	// GuaranteeStragglers: everything the engine starts ends with the job,
	// a daemonised straggler included, even when aq is killed -9.
	GuaranteeStragglers Guarantee = "stragglers"
	// GuaranteeLimits: the job's memory and process-count limits hold, and
	// an out-of-memory kill is told apart (cgroup v2 delegated, or v1
	// writable).
	GuaranteeLimits Guarantee = "limits"
)

// Guarantees are every guarantee, in the order docs/sandbox.md lists them.
var Guarantees = []Guarantee{GuaranteeFiles, GuaranteeNetwork, GuaranteeProcesses, GuaranteeStragglers, GuaranteeLimits}

// fullGuarantees are what the full level means.
var fullGuarantees = []Guarantee{GuaranteeFiles, GuaranteeNetwork, GuaranteeProcesses, GuaranteeStragglers}

// Missing is a guarantee that does not hold on this host, and why.
type Missing struct {
	Guarantee Guarantee `json:"guarantee"`
	Why       string    `json:"why"`
}

// Report is what Probe found this host can do.
type Report struct {
	Level Level `json:"level"`
	// Mechanism names how the level is reached: "namespaces+landlock",
	// "landlock", or "" for none.
	Mechanism string      `json:"mechanism,omitempty"`
	Holds     []Guarantee `json:"holds,omitempty"`
	Missing   []Missing   `json:"missing,omitempty"`
	// LandlockABI is the kernel's Landlock ABI version (0: none).
	LandlockABI int `json:"landlockAbi"`
	// UserNS is "" when user namespaces work for aq, else why not.
	UserNS string `json:"userns,omitempty"`
	// LimitsBy is how the limits are held ("cgroup v2", "cgroup v1"; ""
	// none); Cgroup is where aq makes job cgroups (v1: the memory and the
	// pids directories); CgroupWhy says why there is none.
	LimitsBy  string `json:"limitsBy,omitempty"`
	Cgroup    string `json:"cgroup,omitempty"`
	CgroupWhy string `json:"cgroupWhy,omitempty"`
}

// Has reports whether g holds.
func (r Report) Has(g Guarantee) bool {
	for _, h := range r.Holds {
		if h == g {
			return true
		}
	}
	return false
}

// Lacks says in one line what keeps the host from the full level ("" when
// it is full): the message of a job refused under AQ_SANDBOX=on.
func (r Report) Lacks() string {
	var full []Missing
	for _, m := range r.Missing {
		for _, g := range fullGuarantees {
			if m.Guarantee == g {
				full = append(full, m)
			}
		}
	}
	return joinMissing(full, ": ")
}

// MissingLine says in one line which guarantees are missing ("" when none
// is), for the message aq logs once at start.
func (r Report) MissingLine() string { return joinMissing(r.Missing, " (") }

// joinMissing names each reason once, after the guarantees it takes:
// "network, processes: why; limits: why" (sep ": "), or "network,
// processes (why); limits (why)" (sep " (").
func joinMissing(ms []Missing, sep string) string {
	var whys []string
	by := map[string][]string{}
	for _, m := range ms {
		if _, ok := by[m.Why]; !ok {
			whys = append(whys, m.Why)
		}
		by[m.Why] = append(by[m.Why], string(m.Guarantee))
	}
	parts := make([]string, 0, len(whys))
	for _, w := range whys {
		p := strings.Join(by[w], ", ") + sep + w
		if sep == " (" {
			p += ")"
		}
		parts = append(parts, p)
	}
	return strings.Join(parts, "; ")
}

// finish sets the level from the guarantees: full when every full
// guarantee holds.
func (r *Report) finish(missing []Missing) {
	r.Missing = missing
	r.Holds = nil
	for _, g := range Guarantees {
		held := true
		for _, m := range missing {
			if m.Guarantee == g {
				held = false
			}
		}
		if held {
			r.Holds = append(r.Holds, g)
		}
	}
	if r.Level != LevelNone {
		r.Level = LevelFull
		for _, g := range fullGuarantees {
			if !r.Has(g) {
				r.Level = LevelPartial
			}
		}
	}
}

// ErrUnavailable is wrapped by every error of a sandbox that could not be
// made for a job: the host cannot sandbox (AQ_SANDBOX=on), or the
// sandbox failed to start. The runner fails the job sandbox_unavailable,
// retryable, with its worktree and branch intact.
var ErrUnavailable = errors.New("sandbox unavailable")

// StartError is a sandbox that failed to start for one job.
type StartError struct {
	// Step names what failed ("mount /tmp", "landlock", "exec").
	Step string
	Err  error
}

func (e *StartError) Error() string {
	return "the sandbox did not start (" + e.Step + "): " + e.Err.Error()
}

// Unwrap returns both ErrUnavailable and the cause, so errors.Is finds
// fs.ErrNotExist for an engine binary the sandbox cannot see.
func (e *StartError) Unwrap() []error { return []error{ErrUnavailable, e.Err} }
