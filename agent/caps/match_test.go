package caps

import (
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/aqfleet/aq/job"
)

// laptop is a host as Detect would return it.
func laptop() *Host {
	return &Host{
		OS:   "linux",
		Arch: "amd64",
		Engines: []EngineInfo{
			{Name: "claude", Path: "/opt/bin/claude", Version: "2.0.14 (Claude Code)"},
			{Name: "script", Builtin: true},
		},
		Node:        18,
		Tools:       map[string]string{"git": "/usr/bin/git", "gh": "/usr/bin/gh", "node": "/usr/bin/node"},
		ToolsProbed: DefaultTools(),
		Repos:       []string{"notes", "web"},
		RepoBase:    "/home/x/src",
	}
}

func TestMatch(t *testing.T) {
	t.Parallel()
	noNode := laptop()
	noNode.Node = 0
	delete(noNode.Tools, "node")
	brokenNode := laptop()
	brokenNode.Node = 0
	noBase := laptop()
	noBase.RepoBase, noBase.Repos = "", nil

	tests := []struct {
		name     string
		host     *Host
		required []string
		want     []string // Missing.String()
	}{
		{name: "nothing required", host: laptop(), required: nil, want: nil},
		{name: "all satisfied", host: laptop(), required: []string{
			"os:linux", "arch:amd64", "engine:claude", "engine:script", "has:git", "has:gh",
			"node:18", "node:=18", "node:>=18", "node:>17", "node:<=20", "node:<19", "repo:notes", "repo:web",
		}, want: nil},
		{name: "node too old", host: laptop(), required: []string{"node:>=20"}, want: []string{"node:>=20 (host has node:18)"}},
		{name: "node exact", host: laptop(), required: []string{"node:20"}, want: []string{"node:20 (host has node:18)"}},
		{name: "node upper bound", host: laptop(), required: []string{"node:<18"}, want: []string{"node:<18 (host has node:18)"}},
		{name: "no node", host: noNode, required: []string{"node:>=20"}, want: []string{"node:>=20 (node not found on PATH)"}},
		{name: "node without version", host: brokenNode, required: []string{"node:>=1"}, want: []string{"node:>=1 (node at /usr/bin/node did not report a version)"}},
		{name: "tool absent", host: laptop(), required: []string{"has:docker"}, want: []string{"has:docker (not found on PATH)"}},
		{name: "tool not probed", host: laptop(), required: []string{"has:ansible"}, want: []string{"has:ansible (aq does not look for ansible (see `aq caps` for the tools it detects))"}},
		{name: "repo absent", host: laptop(), required: []string{"repo:notes", "repo:api"}, want: []string{"repo:api (no git repository named api under /home/x/src)"}},
		{name: "repo without base", host: noBase, required: []string{"repo:notes"}, want: []string{"repo:notes (no git repository named notes (no repo base configured))"}},
		{name: "engine absent", host: laptop(), required: []string{"engine:codex"}, want: []string{"engine:codex (not installed)"}},
		{name: "engine any is not a token", host: laptop(), required: []string{"engine:any"}, want: []string{"engine:any (engine:any is not a capability; a manifest's engine: any means any installed engine)"}},
		{name: "os and arch", host: laptop(), required: []string{"os:darwin", "arch:arm64"}, want: []string{"os:darwin (host has os:linux)", "arch:arm64 (host has arch:amd64)"}},
		{name: "values are case sensitive", host: laptop(), required: []string{"os:Linux"}, want: []string{"os:Linux (host has os:linux)"}},
		{name: "order kept, duplicates once", host: laptop(), required: []string{"has:docker", "engine:codex", " has:docker", "has:docker", "node:=22", "node:22"},
			want: []string{"has:docker (not found on PATH)", "engine:codex (not installed)", "node:22 (host has node:18)"}},
		{name: "nil host offers nothing", host: nil, required: []string{"os:linux", "has:git", "node:>=1", "repo:x", "engine:script"},
			want: []string{"os:linux (host os unknown)", "has:git (not found on PATH)", "node:>=1 (node not found on PATH)", "repo:x (no git repository named x (no repo base configured))", "engine:script (not installed)"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var got []string
			for _, m := range Match(tc.required, tc.host) {
				if m.Err != nil {
					t.Errorf("%s: unexpected parse error %v", m.Token, m.Err)
				}
				got = append(got, m.String())
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("Match(%q)\n got %q\nwant %q", tc.required, got, tc.want)
			}
			if Satisfies(tc.required, tc.host) != (len(tc.want) == 0) {
				t.Errorf("Satisfies disagrees with Match")
			}
		})
	}
}

func TestMatchInvalidRequirement(t *testing.T) {
	t.Parallel()
	got := Match([]string{"gpu:a100", "node:>=x", "", "has:git", "gpu:a100"}, laptop())
	if len(got) != 3 {
		t.Fatalf("Match = %v, want 3 invalid requirements (duplicates once, has:git satisfied)", got)
	}
	for i, tok := range []string{"gpu:a100", "node:>=x", ""} {
		m := got[i]
		if m.Token != tok || m.Err == nil || !strings.HasPrefix(m.Reason, "invalid: ") || !strings.Contains(m.Reason, m.Err.Error()) {
			t.Errorf("missing[%d] = %+v, want token %q reported invalid with its parse error", i, m, tok)
		}
	}
	if _, err := job.ParseRequirement("gpu:a100"); !strings.Contains(got[0].Reason, err.Error()) {
		t.Errorf("reason %q does not carry the parse error %q", got[0].Reason, err)
	}
}

func TestExplain(t *testing.T) {
	t.Parallel()
	tests := []struct {
		missing []Missing
		want    string
	}{
		{nil, ""},
		{[]Missing{{Token: "engine:codex", Reason: "not installed"}}, "missing capability: engine:codex (not installed)"},
		{Match([]string{"node:>=20", "has:docker", "repo:notes", "repo:api"}, laptop()),
			"missing capabilities: node:>=20 (host has node:18); has:docker (not found on PATH); repo:api (no git repository named api under /home/x/src)"},
		{[]Missing{{Token: "repo:x", Reason: "no git repository named x under /tmp/a\nb"}}, "missing capability: repo:x (no git repository named x under /tmp/a b)"},
	}
	for _, tc := range tests {
		if got := Explain(tc.missing); got != tc.want {
			t.Errorf("Explain(%v)\n got %q\nwant %q", tc.missing, got, tc.want)
		}
	}
}

func TestTokens(t *testing.T) {
	t.Parallel()
	want := []string{
		"arch:amd64", "engine:claude", "engine:script", "has:gh", "has:git", "has:node",
		"node:18", "os:linux", "repo:notes", "repo:web",
	}
	if got := laptop().Tokens(); !reflect.DeepEqual(got, want) {
		t.Errorf("Tokens()\n got %q\nwant %q", got, want)
	}
	if got := (*Host)(nil).Tokens(); got == nil || len(got) != 0 {
		t.Errorf("nil host Tokens() = %#v, want empty non-nil", got)
	}
	for _, tok := range laptop().Tokens() {
		if _, err := job.ParseRequirement(tok); err != nil {
			t.Errorf("token %q does not parse as a requirement: %v", tok, err)
		}
	}
}

func TestFromTokensRoundTrip(t *testing.T) {
	t.Parallel()
	tokens := laptop().Tokens()
	h := FromTokens(append(tokens, "bogus", "node:>=3", "repo:notes"))
	if got := h.Tokens(); !reflect.DeepEqual(got, tokens) {
		t.Errorf("FromTokens(...).Tokens()\n got %q\nwant %q", got, tokens)
	}
	if m := Match([]string{"node:>=18", "repo:web", "engine:claude"}, h); len(m) != 0 {
		t.Errorf("Match on rebuilt host = %v, want none", m)
	}
	if m := Match([]string{"has:docker"}, h); Explain(m) != "missing capability: has:docker (not found on PATH)" {
		t.Errorf("Explain = %q", Explain(m))
	}
}

// TestDiskBudgetCapability (#32): a job with budget.disk requires
// manifest:budget.disk; this aq offers it, an older factory (whose heartbeat lacks
// it) is not matched and is told why — it would refuse the manifest.
func TestDiskBudgetCapability(t *testing.T) {
	t.Parallel()
	older := FromTokens([]string{"os:linux", "engine:script"})
	if m := Match([]string{job.DiskBudget}, older); len(m) != 1 || !strings.Contains(m[0].String(), "does not understand the manifest key budget.disk") {
		t.Errorf("an older factory: %v", m)
	}
	newer := FromTokens([]string{"os:linux", "engine:script", job.DiskBudget})
	if m := Match([]string{job.DiskBudget}, newer); len(m) != 0 {
		t.Errorf("a factory offering it: %v", m)
	}
	if !slices.Contains(newer.Tokens(), job.DiskBudget) {
		t.Errorf("the round trip lost it: %q", newer.Tokens())
	}
}
