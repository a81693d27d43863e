// Capability tokens (docs/manifest.md, "Capability tokens"): the grammar of what a job requires of a
// host (os:linux, has:git, node:>=20). Detection and matching live in
// agent/caps; the grammar is job vocabulary, shared with profiles and
// manifests.

package job

import (
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"sync"
)

// CapabilityKinds of capability token.
var CapabilityKinds = []string{"os", "arch", "engine", "node", "has", "repo", "sandbox", "manifest"}

// ManifestFeatures are the values of a manifest: token: manifest keys a
// factory understands that older factories refuse as invalid_manifest.
// A manifest using one requires it, so a coordinator hands the job only to
// a factory that understands it (docs/contract.md).
var ManifestFeatures = []string{"may_change", "budget.disk"}

// MayChangeRequired is the capability a manifest's may_change: adds.
const MayChangeRequired = "manifest:may_change"

// SandboxLevels are the values of a sandbox: token, the levels of the
// engine's sandbox (docs/sandbox.md): a host sandboxing fully offers both,
// since full holds every guarantee partial does.
var SandboxLevels = []string{"full", "partial"}

// SandboxRequired is the capability a manifest's `sandbox: required`
// adds: only factories whose engines run in a full sandbox take the job.
const SandboxRequired = "sandbox:full"

// DiskBudget is the capability a manifest's budget.disk adds: only
// factories that hold a job to a disk budget take it — an older one, which
// would refuse the manifest as invalid_manifest, does not offer it.
const DiskBudget = "manifest:budget.disk"

// numericKinds accept comparisons (node:>=20).
var numericKinds = map[string]bool{"node": true}

// Requirement is one parsed capability a job needs.
type Requirement struct {
	Kind  string // os, arch, engine, node, has, repo, sandbox, manifest
	Op    string // "" (equal) or one of >= > <= < =
	Value string
}

// String renders r in canonical form (node:>=20, has:git).
func (r Requirement) String() string { return r.Kind + ":" + r.Op + r.Value }

var valuePattern = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._+-]{0,127}$`) })

// ParseRequirement parses a capability token as written in a manifest or
// profile. Errors say what is wrong and what is allowed.
func ParseRequirement(s string) (Requirement, error) {
	s = strings.TrimSpace(s)
	kind, val, ok := strings.Cut(s, ":")
	if !ok || kind == "" || val == "" {
		return Requirement{}, fmt.Errorf("capability %q is not kind:value (kinds: %s)", s, strings.Join(CapabilityKinds, ", "))
	}
	known := false
	for _, k := range CapabilityKinds {
		if k == kind {
			known = true
		}
	}
	if !known {
		return Requirement{}, fmt.Errorf("capability %q has unknown kind %q (kinds: %s)", s, kind, strings.Join(CapabilityKinds, ", "))
	}
	r := Requirement{Kind: kind}
	for _, op := range []string{">=", "<=", ">", "<", "="} {
		if strings.HasPrefix(val, op) {
			r.Op, val = op, strings.TrimSpace(val[len(op):])
			break
		}
	}
	if r.Op == "=" {
		r.Op = ""
	}
	if r.Op != "" && !numericKinds[kind] {
		return Requirement{}, fmt.Errorf("capability %q: comparisons are only allowed for node (e.g. node:>=20)", s)
	}
	if numericKinds[kind] {
		if _, err := strconv.Atoi(val); err != nil {
			return Requirement{}, fmt.Errorf("capability %q: %s needs a major version number (e.g. %s:>=20)", s, kind, kind)
		}
	}
	if kind == "sandbox" && val != SandboxLevels[0] && val != SandboxLevels[1] {
		return Requirement{}, fmt.Errorf("capability %q: the sandbox levels are %s (or write sandbox: required)", s, strings.Join(SandboxLevels, " and "))
	}
	if !valuePattern().MatchString(val) {
		return Requirement{}, fmt.Errorf("capability %q has an invalid value (letters, digits, '.', '_', '+', '-')", s)
	}
	r.Value = val
	return r, nil
}

// Satisfied reports whether an offered token value satisfies r (same kind).
func (r Requirement) Satisfied(offered string) bool {
	if r.Op == "" {
		return offered == r.Value
	}
	have, err1 := strconv.Atoi(offered)
	want, err2 := strconv.Atoi(r.Value)
	if err1 != nil || err2 != nil {
		return false
	}
	switch r.Op {
	case ">=":
		return have >= want
	case ">":
		return have > want
	case "<=":
		return have <= want
	case "<":
		return have < want
	}
	return false
}

// sizeUnits are the suffixes ParseSize takes, longest first.
var sizeUnits = []struct {
	suffix string
	n      int64
}{
	{"KiB", 1 << 10}, {"MiB", 1 << 20}, {"GiB", 1 << 30}, {"TiB", 1 << 40},
	{"KB", 1e3}, {"MB", 1e6}, {"GB", 1e9}, {"TB", 1e12},
	{"K", 1 << 10}, {"M", 1 << 20}, {"G", 1 << 30}, {"T", 1 << 40}, {"B", 1},
}

// ParseSize reads a size: a whole number of bytes, or one with a unit
// (10GiB, 500MB, 2G = 2GiB); never negative.
func ParseSize(raw string) (int64, error) {
	raw = strings.TrimSpace(raw)
	num, mult := raw, int64(1)
	for _, u := range sizeUnits {
		if n, ok := strings.CutSuffix(raw, u.suffix); ok {
			num, mult = strings.TrimSpace(n), u.n
			break
		}
	}
	n, err := strconv.ParseInt(num, 10, 64)
	if err != nil || n < 0 || (n > 0 && n > (1<<62)/mult) {
		return 0, fmt.Errorf("%q is not a size (use bytes or a unit: 10GiB, 500MB)", raw)
	}
	return n * mult, nil
}
