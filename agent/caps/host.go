package caps

import (
	"log/slog"
	"slices"
	"sort"
	"strconv"

	"github.com/aqfleet/aq/internal/sandbox"
	"github.com/aqfleet/aq/job"
)

// Token joins a kind and a value into a capability token (has:git).
func Token(kind, value string) string { return kind + ":" + value }

// Tokens returns every capability h offers, canonical and sorted: what a
// heartbeat or claim sends as capabilities[] (docs/contract.md, "Enrollment and heartbeats").
func (h *Host) Tokens() []string {
	if h == nil {
		return []string{}
	}
	out := []string{}
	for _, kind := range job.CapabilityKinds {
		for _, v := range h.offered(kind) {
			out = append(out, Token(kind, v))
		}
	}
	sort.Strings(out)
	return out
}

// offered returns the values h offers for kind.
func (h *Host) offered(kind string) []string {
	if h == nil {
		return nil
	}
	switch kind {
	case "os":
		if h.OS != "" {
			return []string{h.OS}
		}
	case "arch":
		if h.Arch != "" {
			return []string{h.Arch}
		}
	case "engine":
		out := make([]string, 0, len(h.Engines))
		for _, e := range h.Engines {
			if e.Refused == "" {
				out = append(out, e.Name)
			}
		}
		return out
	case "node":
		if h.Node > 0 {
			return []string{strconv.Itoa(h.Node)}
		}
	case "has":
		out := make([]string, 0, len(h.Tools))
		for t := range h.Tools {
			out = append(out, t)
		}
		sort.Strings(out)
		return out
	case "repo":
		return h.Repos
	case "sandbox":
		return h.Sandbox.offeredLevels()
	case "manifest":
		return h.Manifest
	}
	return nil
}

// FromTokens rebuilds a Host from capability tokens (a factory's heartbeat,
// as a coordinator sees it), so that Match works on either side of the wire.
// Tokens that do not parse or carry a comparison are ignored; paths and
// versions are unknown.
func FromTokens(tokens []string) *Host {
	h := &Host{Tools: map[string]string{}}
	seenRepo := map[string]bool{}
	for _, t := range tokens {
		r, err := job.ParseRequirement(t)
		if err != nil || r.Op != "" {
			continue
		}
		switch r.Kind {
		case "os":
			h.OS = r.Value
		case "arch":
			h.Arch = r.Value
		case "engine":
			dup := false
			for _, e := range h.Engines {
				dup = dup || e.Name == r.Value
			}
			if !dup {
				h.Engines = append(h.Engines, EngineInfo{Name: r.Value, Builtin: r.Value == ScriptEngine})
			}
		case "node":
			if n, err := strconv.Atoi(r.Value); err == nil && n > h.Node {
				h.Node = n
			}
		case "has":
			h.Tools[r.Value] = ""
		case "repo":
			if !seenRepo[r.Value] {
				seenRepo[r.Value] = true
				h.Repos = append(h.Repos, r.Value)
			}
		case "sandbox":
			if h.Sandbox == nil || r.Value == string(sandbox.LevelFull) {
				h.Sandbox = &Sandbox{Mode: sandbox.ModeAuto, Report: sandbox.Report{Level: sandbox.Level(r.Value)}}
			}
		case "manifest":
			if !slices.Contains(h.Manifest, r.Value) {
				h.Manifest = append(h.Manifest, r.Value)
			}
		}
	}
	sort.Slice(h.Engines, func(i, j int) bool { return h.Engines[i].Name < h.Engines[j].Name })
	sort.Strings(h.Repos)
	return h
}

// LogEngines logs, once a host is detected, each engine aq refuses (one
// warning line naming the missing flag or the failed --help, and what to
// do) and each optional flag it dropped.
func LogEngines(log *slog.Logger, h *Host) {
	if log == nil || h == nil {
		return
	}
	for _, name := range h.Missing {
		log.Warn("engine "+name+" is in AQ_ENGINES but not installed: not offered", "engine", name)
	}
	for _, e := range h.Engines {
		if e.Refused != "" {
			log.Warn("engine refused, not offered: "+e.Refused, "engine", e.Name, "path", e.Path)
		}
		if len(e.Dropped) > 0 {
			log.Info("engine flags dropped: the CLI lacks them, aq runs without them (see aq caps)", "engine", e.Name, "dropped", e.Dropped)
		}
	}
}
