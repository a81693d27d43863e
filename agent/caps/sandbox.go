package caps

import (
	"strconv"
	"strings"

	"github.com/aqfleet/aq/internal/sandbox"
	"github.com/aqfleet/aq/job"
)

// Sandbox is how this host runs jobs' engines (internal/sandbox,
// docs/sandbox.md): AQ_SANDBOX's mode, what the host's probe found — the
// level, the mechanism, the guarantees that hold and those missing, with
// why — and, under AQ_SANDBOX=on on a host that cannot sandbox fully, why
// every job is refused here. It is offered as sandbox:<level> (Tokens).
type Sandbox struct {
	Mode sandbox.Mode `json:"mode"`
	sandbox.Report
	// Limits are every job's memory and process limits (zero: none); they
	// hold where Holds has limits (LimitsBy says how).
	Limits sandbox.Limits `json:"limits"`
	// Refused says why this host refuses every job (AQ_SANDBOX=on without
	// the full level); "" when it runs them.
	Refused string `json:"refused,omitempty"`
}

// SandboxOf is what h (AQ_SANDBOX's Host: it probes on first use) says of
// this host; nil for a nil h.
func SandboxOf(h *sandbox.Host) *Sandbox {
	if h == nil {
		return nil
	}
	s := &Sandbox{Mode: h.Mode(), Report: h.Report(), Limits: h.Limits()}
	if err := h.Refuses(); err != nil {
		s.Refused = err.Error()
	}
	return s
}

// RunLevel is the level jobs' engines run at here: the probe's, none when
// every job is refused (or s is nil).
func (s *Sandbox) RunLevel() sandbox.Level {
	if s == nil || s.Refused != "" {
		return sandbox.LevelNone
	}
	return s.Level
}

// offeredLevels are the sandbox: values a host offers: both levels when it
// sandboxes fully (a job that asks for partial runs there too), partial
// when that is what it has, none otherwise.
func (s *Sandbox) offeredLevels() []string {
	switch s.RunLevel() {
	case sandbox.LevelFull:
		return append([]string(nil), job.SandboxLevels...)
	case sandbox.LevelPartial:
		return []string{string(sandbox.LevelPartial)}
	}
	return nil
}

// Line says in one line how engines run here: the level and mechanism,
// the guarantees that hold, and those missing with why ("full
// (namespaces+landlock): files, network, processes, stragglers hold;
// missing: limits (cgroup v1)").
func (s *Sandbox) Line() string {
	if s == nil {
		return "unknown"
	}
	var b strings.Builder
	b.WriteString(string(s.Level))
	if s.Mechanism != "" {
		b.WriteString(" (" + s.Mechanism + ")")
	}
	if s.Mode != sandbox.ModeAuto {
		b.WriteString(", AQ_SANDBOX=" + string(s.Mode))
	}
	if len(s.Holds) > 0 {
		holds := make([]string, len(s.Holds))
		for i, g := range s.Holds {
			holds[i] = string(g)
		}
		b.WriteString(": " + strings.Join(holds, ", ") + " hold")
	}
	if s.Has(sandbox.GuaranteeLimits) && s.Mode != sandbox.ModeOff {
		b.WriteString("; limits (" + s.LimitsBy + "): " + LimitsLine(s.Limits))
	}
	if m := s.MissingLine(); m != "" && s.Mode != sandbox.ModeOff {
		b.WriteString("; missing: " + m)
	}
	if s.Refused != "" {
		b.WriteString("; every job is refused here (sandbox_unavailable)")
	}
	return b.String()
}

// LimitsLine says a job's limits in words: "memory 12 GiB, 4096 processes"
// ("none" for none).
func LimitsLine(l sandbox.Limits) string {
	var parts []string
	switch {
	case l.MemoryBytes >= 1<<30 && l.MemoryBytes%(1<<30) == 0:
		parts = append(parts, "memory "+strconv.FormatInt(l.MemoryBytes>>30, 10)+" GiB")
	case l.MemoryBytes > 0:
		parts = append(parts, "memory "+strconv.FormatInt(l.MemoryBytes>>20, 10)+" MiB")
	default:
		parts = append(parts, "memory unlimited")
	}
	if l.Pids > 0 {
		parts = append(parts, strconv.Itoa(l.Pids)+" processes")
	} else {
		parts = append(parts, "processes unlimited")
	}
	return strings.Join(parts, ", ")
}

// sandboxReason says what h has instead of a sandbox level it lacks.
func sandboxReason(want string, h *Host) string {
	s := h.Sandbox
	switch {
	case s == nil:
		return "this host offers no sandbox"
	case s.Refused != "":
		return "AQ_SANDBOX=on and this host cannot sandbox fully: " + s.Lacks()
	case s.Mode == sandbox.ModeOff:
		return "AQ_SANDBOX=off: engines run unsandboxed here"
	case s.Level == sandbox.LevelNone:
		return "engines run unsandboxed here: " + s.MissingLine()
	case want == string(sandbox.LevelFull) && s.Level == sandbox.LevelPartial:
		return "engines run in a partial sandbox here: " + s.Lacks()
	}
	return "host has sandbox:" + string(s.Level)
}
