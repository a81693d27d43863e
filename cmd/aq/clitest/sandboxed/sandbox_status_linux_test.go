package sandboxed

import (
	"encoding/json"
	"slices"
	"strings"
	"testing"

	"github.com/aqfleet/aq/cmd/aq/clitest"
	"github.com/aqfleet/aq/internal/sandbox"
	"github.com/aqfleet/aq/internal/testenv"
	"github.com/aqfleet/aq/job"
)

// capsJSON is the part of aq caps --json this file reads.
type capsJSON struct {
	Tokens  []string `json:"tokens"`
	Sandbox *struct {
		Mode    sandbox.Mode        `json:"mode"`
		Level   sandbox.Level       `json:"level"`
		Holds   []sandbox.Guarantee `json:"holds"`
		Missing []sandbox.Missing   `json:"missing"`
	} `json:"sandbox"`
}

// TestSandboxVisibleAndRoutable is items 10 of #23 end to end with the
// binary: aq caps shows the sandbox's level, the guarantees that hold and
// those missing, and offers sandbox:full and sandbox:partial; a job whose
// manifest says sandbox: required waits on a host whose engines run
// unsandboxed (AQ_SANDBOX=off) — aq run takes nothing, aq status says why
// and which level engines run at — and ships where the sandbox is full.
func TestSandboxVisibleAndRoutable(t *testing.T) {
	clitest.FullHost(t)
	t.Parallel() // its own home and job ids
	h := clitest.BinHome(t)
	h.Repo(t, "app", nil)

	var full capsJSON
	r := h.Run(t, "caps", "--json")
	if r.Code != 0 || json.Unmarshal([]byte(r.Stdout), &full) != nil || full.Sandbox == nil {
		t.Fatalf("aq caps --json: %s", r)
	}
	if s := full.Sandbox; s.Mode != sandbox.ModeAuto || s.Level != sandbox.LevelFull || len(s.Holds) < 4 {
		t.Errorf("aq caps --json's sandbox: %+v", s)
	}
	if !slices.Contains(full.Tokens, "sandbox:full") || !slices.Contains(full.Tokens, "sandbox:partial") {
		t.Errorf("a full host's tokens: %q", full.Tokens)
	}
	r = h.Run(t, "caps")
	for _, want := range []string{"sandbox (docs/sandbox.md):", "full (namespaces+landlock), AQ_SANDBOX=auto", "files network processes stragglers", "sandbox:full sandbox:partial"} {
		if !strings.Contains(r.Stdout, want) {
			t.Errorf("aq caps lacks %q:\n%s", want, r.Stdout)
		}
	}
	if strings.Contains(r.Stderr, "engines run") {
		t.Errorf("aq caps announced how engines run (it only shows it):\n%s", r.Stderr)
	}

	var off capsJSON
	r = h.Run(t, "caps", "--json", "--sandbox", "off")
	if r.Code != 0 || json.Unmarshal([]byte(r.Stdout), &off) != nil || off.Sandbox == nil {
		t.Fatalf("aq caps --json --sandbox off: %s", r)
	}
	if off.Sandbox.Level != sandbox.LevelNone || off.Sandbox.Mode != sandbox.ModeOff || slices.ContainsFunc(off.Tokens, func(s string) bool { return strings.HasPrefix(s, "sandbox:") }) {
		t.Errorf("AQ_SANDBOX=off: %+v, tokens %q", off.Sandbox, off.Tokens)
	}

	h.Submit(t, "needs-sandbox", clitest.ScriptJob("app", "echo x > x.txt", "sandbox: required"))
	unsandboxed := append([]string(nil), h.Env...)
	h.Env = append(h.Env, "AQ_SANDBOX=off")
	if r := h.Run(t, "run", "--once"); r.Code != 3 {
		t.Fatalf("AQ_SANDBOX=off: aq run --once: %s (want exit 3: nothing it can run)", r)
	}
	b := board(t, h)
	if b.Sandbox == nil || b.Sandbox.Level != sandbox.LevelNone || b.Sandbox.Mode != sandbox.ModeOff {
		t.Errorf("aq status --json's sandbox under AQ_SANDBOX=off: %+v", b.Sandbox)
	}
	if len(b.Waiting) != 1 || b.Waiting[0].ID != testenv.ID("needs-sandbox") ||
		b.Waiting[0].Why != "this host cannot run it: missing capability: sandbox:full (AQ_SANDBOX=off: engines run unsandboxed here)" {
		t.Errorf("waiting: %+v", b.Waiting)
	}
	r = h.Run(t, "status")
	for _, want := range []string{"sandbox none, AQ_SANDBOX=off", "sandbox:full (AQ_SANDBOX=off: engines run unsandboxed here)"} {
		if !strings.Contains(r.Stdout, want) {
			t.Errorf("aq status lacks %q:\n%s", want, r.Stdout)
		}
	}

	h.Env = unsandboxed
	r = h.Run(t, "status")
	if !strings.Contains(r.Stdout, "sandbox full (namespaces+landlock): files, network, processes, stragglers") ||
		!strings.Contains(r.Stdout, "runnable") {
		t.Errorf("aq status on a full host:\n%s", r.Stdout)
	}
	if r := h.Run(t, "run", "--once"); r.Code != 0 {
		t.Fatalf("the sandboxing host did not run it: %s", r)
	}
	if v := show(t, h, "needs-sandbox"); v.State.Stage != job.Shipped {
		t.Fatalf("the job is %s, want shipped", v.State.Stage)
	}
}
