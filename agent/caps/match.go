package caps

import (
	"fmt"
	"slices"
	"strings"

	"github.com/aqfleet/aq/job"
)

// Missing is one required capability the host does not offer.
type Missing struct {
	// Token is the requirement in canonical form (node:>=20), or as written
	// when it does not parse.
	Token string `json:"token"`
	// Reason says what the host has of that kind instead, in words.
	Reason string `json:"reason"`
	// Err is the parse error of a malformed requirement; nil otherwise.
	Err error `json:"-"`
}

// String renders m as `node:>=20 (host has node:18)`.
func (m Missing) String() string { return m.Token + " (" + m.Reason + ")" }

// Match checks every requirement against h and returns those h does not
// satisfy, in the order given (each at most once). An empty result means the
// host can take the job. A requirement that does not parse is reported as
// missing with its parse error: manifests are validated elsewhere, and an
// unknown requirement must never match by accident. Match is pure; a nil h
// offers nothing.
//
// engine:any is not a capability: a manifest's `engine: any` is resolved by
// the caller to an installed engine before matching.
func Match(required []string, h *Host) []Missing {
	var out []Missing
	seen := map[string]bool{}
	for _, raw := range required {
		r, err := job.ParseRequirement(raw)
		if err != nil {
			tok := strings.TrimSpace(raw)
			if !seen[tok] {
				seen[tok] = true
				out = append(out, Missing{Token: tok, Reason: "invalid: " + err.Error(), Err: err})
			}
			continue
		}
		tok := r.String()
		if seen[tok] {
			continue
		}
		seen[tok] = true
		if slices.ContainsFunc(h.offered(r.Kind), r.Satisfied) {
			continue
		}
		out = append(out, Missing{Token: tok, Reason: missingReason(r, h)})
	}
	return out
}

// Satisfies reports whether h offers every requirement.
func Satisfies(required []string, h *Host) bool { return len(Match(required, h)) == 0 }

// missingReason says what h has of r's kind, for a requirement it fails.
func missingReason(r job.Requirement, h *Host) string {
	if h == nil {
		h = &Host{}
	}
	switch r.Kind {
	case "os", "arch":
		if have := h.offered(r.Kind); len(have) > 0 {
			return "host has " + Token(r.Kind, have[0])
		}
		return "host " + r.Kind + " unknown"
	case "engine":
		if r.Value == "any" {
			return "engine:any is not a capability; a manifest's engine: any means any installed engine"
		}
		for _, e := range h.Engines {
			if e.Name == r.Value && e.Refused != "" {
				return "refused: " + e.Refused
			}
		}
		return "not installed"
	case "node":
		if h.Node > 0 {
			return fmt.Sprintf("host has node:%d", h.Node)
		}
		if p, ok := h.Tools["node"]; ok {
			if p == "" {
				return "node's version is unknown"
			}
			return "node at " + p + " did not report a version"
		}
		return "node not found on PATH"
	case "has":
		if h.ToolsProbed != nil && !slices.Contains(h.ToolsProbed, r.Value) {
			return "aq does not look for " + r.Value + " (see `aq caps` for the tools it detects)"
		}
		return "not found on PATH"
	case "repo":
		if h.RepoBase == "" {
			return "no git repository named " + r.Value + " (no repo base configured)"
		}
		return "no git repository named " + r.Value + " under " + h.RepoBase
	case "sandbox":
		return sandboxReason(r.Value, h)
	case "manifest":
		return "this aq does not understand the manifest key " + r.Value + " (an older version: upgrade it)"
	}
	return "not offered"
}

// Explain renders missing capabilities as one line:
// `missing capabilities: node:>=20 (host has node:18); has:docker (not found on PATH)`.
// It returns "" when nothing is missing.
func Explain(missing []Missing) string {
	if len(missing) == 0 {
		return ""
	}
	parts := make([]string, len(missing))
	for i, m := range missing {
		parts[i] = m.String()
	}
	label := "missing capabilities: "
	if len(missing) == 1 {
		label = "missing capability: "
	}
	return oneLine.Replace(label + strings.Join(parts, "; "))
}

// oneLine keeps Explain on one line whatever a path or parse error holds.
var oneLine = strings.NewReplacer("\r\n", " ", "\n", " ", "\r", " ")
