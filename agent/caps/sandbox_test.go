package caps

import (
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/aqfleet/aq/internal/sandbox"
)

// sandboxed is laptop() with its engines' sandbox at level, as a probe of
// that host would find it.
func sandboxed(level sandbox.Level, mode sandbox.Mode, refused string) *Host {
	h := laptop()
	r := sandbox.Report{Level: level}
	switch level {
	case sandbox.LevelFull:
		r.Mechanism = "namespaces+landlock"
		r.Holds = []sandbox.Guarantee{sandbox.GuaranteeFiles, sandbox.GuaranteeNetwork, sandbox.GuaranteeProcesses, sandbox.GuaranteeStragglers}
		r.Missing = []sandbox.Missing{{Guarantee: sandbox.GuaranteeLimits, Why: "cgroup v1"}}
	case sandbox.LevelPartial:
		r.Mechanism = "landlock"
		r.Holds = []sandbox.Guarantee{sandbox.GuaranteeFiles}
		why := "user namespaces are blocked (user.max_user_namespaces=0)"
		r.Missing = []sandbox.Missing{{Guarantee: sandbox.GuaranteeNetwork, Why: why}, {Guarantee: sandbox.GuaranteeProcesses, Why: why},
			{Guarantee: sandbox.GuaranteeStragglers, Why: why}, {Guarantee: sandbox.GuaranteeLimits, Why: "cgroup v1"}}
	default:
		for _, g := range sandbox.Guarantees {
			r.Missing = append(r.Missing, sandbox.Missing{Guarantee: g, Why: "AQ_SANDBOX=off"})
		}
	}
	h.Sandbox = &Sandbox{Mode: mode, Report: r, Refused: refused}
	return h
}

// TestSandboxCapability: a host offers the levels its engines run at —
// both when full (a job that asks for partial runs there too), partial
// alone, none unsandboxed or when AQ_SANDBOX=on refuses every job — and a
// job that requires one it lacks is told why in words.
func TestSandboxCapability(t *testing.T) {
	t.Parallel()
	refusing := sandboxed(sandbox.LevelPartial, sandbox.ModeOn, "sandbox unavailable: AQ_SANDBOX=on and this host cannot sandbox fully: …")
	tests := []struct {
		name    string
		host    *Host
		offered []string
		full    string // why sandbox:full is missing ("" satisfied)
		partial string
	}{
		{"full", sandboxed(sandbox.LevelFull, sandbox.ModeAuto, ""), []string{"sandbox:full", "sandbox:partial"}, "", ""},
		{"partial", sandboxed(sandbox.LevelPartial, sandbox.ModeAuto, ""), []string{"sandbox:partial"},
			"sandbox:full (engines run in a partial sandbox here: network, processes, stragglers: user namespaces are blocked (user.max_user_namespaces=0))", ""},
		{"refused under on", refusing, nil,
			"sandbox:full (AQ_SANDBOX=on and this host cannot sandbox fully: network, processes, stragglers: user namespaces are blocked (user.max_user_namespaces=0))",
			"sandbox:partial (AQ_SANDBOX=on and this host cannot sandbox fully: network, processes, stragglers: user namespaces are blocked (user.max_user_namespaces=0))"},
		{"off", sandboxed(sandbox.LevelNone, sandbox.ModeOff, ""), nil,
			"sandbox:full (AQ_SANDBOX=off: engines run unsandboxed here)", "sandbox:partial (AQ_SANDBOX=off: engines run unsandboxed here)"},
		{"unknown", laptop(), nil, "sandbox:full (this host offers no sandbox)", "sandbox:partial (this host offers no sandbox)"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var got []string
			for _, tok := range tc.host.Tokens() {
				if strings.HasPrefix(tok, "sandbox:") {
					got = append(got, tok)
				}
			}
			if !reflect.DeepEqual(got, tc.offered) {
				t.Errorf("offered %q, want %q", got, tc.offered)
			}
			for req, want := range map[string]string{"sandbox:full": tc.full, "sandbox:partial": tc.partial} {
				got := ""
				if m := Match([]string{req}, tc.host); len(m) > 0 {
					got = m[0].String()
				}
				if got != want {
					t.Errorf("Match(%s)\n got %q\nwant %q", req, got, want)
				}
			}
			// The coordinator's side of the wire sees the same.
			back := FromTokens(tc.host.Tokens())
			if Satisfies([]string{"sandbox:full"}, back) != (tc.full == "") || Satisfies([]string{"sandbox:partial"}, back) != (tc.partial == "") {
				t.Errorf("FromTokens(%q) matches otherwise", tc.host.Tokens())
			}
			if !slices.Equal(back.Tokens(), tc.host.Tokens()) {
				t.Errorf("round trip: %q, want %q", back.Tokens(), tc.host.Tokens())
			}
		})
	}
}

// limited is a full host whose limits hold (cgroup v1), with l.
func limited(l sandbox.Limits) *Sandbox {
	s := sandboxed(sandbox.LevelFull, sandbox.ModeAuto, "").Sandbox
	s.Holds = append(s.Holds, sandbox.GuaranteeLimits)
	s.Missing, s.LimitsBy, s.Limits = nil, "cgroup v1", l
	return s
}

func TestSandboxLine(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		s    *Sandbox
		want string
	}{
		{sandboxed(sandbox.LevelFull, sandbox.ModeAuto, "").Sandbox,
			"full (namespaces+landlock): files, network, processes, stragglers hold; missing: limits (cgroup v1)"},
		{sandboxed(sandbox.LevelPartial, sandbox.ModeAuto, "").Sandbox,
			"partial (landlock): files hold; missing: network, processes, stragglers (user namespaces are blocked (user.max_user_namespaces=0)); limits (cgroup v1)"},
		{sandboxed(sandbox.LevelNone, sandbox.ModeOff, "").Sandbox, "none, AQ_SANDBOX=off"},
		{sandboxed(sandbox.LevelPartial, sandbox.ModeOn, "x").Sandbox,
			"partial (landlock), AQ_SANDBOX=on: files hold; missing: network, processes, stragglers (user namespaces are blocked (user.max_user_namespaces=0)); limits (cgroup v1); every job is refused here (sandbox_unavailable)"},
		{limited(sandbox.Limits{MemoryBytes: 12 << 30, Pids: 4096}),
			"full (namespaces+landlock): files, network, processes, stragglers, limits hold; limits (cgroup v1): memory 12 GiB, 4096 processes"},
		{limited(sandbox.Limits{MemoryBytes: 1536 << 20}),
			"full (namespaces+landlock): files, network, processes, stragglers, limits hold; limits (cgroup v1): memory 1536 MiB, processes unlimited"},
		{nil, "unknown"},
	} {
		if got := tc.s.Line(); got != tc.want {
			t.Errorf("Line()\n got %q\nwant %q", got, tc.want)
		}
	}
}
