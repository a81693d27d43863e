package manifest

import (
	"strings"
	"testing"

	"github.com/aqfleet/aq/internal/sandbox"
	"github.com/aqfleet/aq/job"
)

// TestCheckSandbox: admission refuses a job that requires a sandbox level
// (sandbox: required is sandbox:full; a sandbox:<level> capability) on a
// factory whose engines run at a lower one — sandbox_unavailable, retryable
// elsewhere, one line naming both — and admits it at that level or above;
// a policy that does not know the level (aq submit) does not check.
func TestCheckSandbox(t *testing.T) {
	level := func(l sandbox.Level) func() sandbox.Level { return func() sandbox.Level { return l } }
	for _, c := range []struct {
		name  string
		front string
		have  func() sandbox.Level
		want  string // "" admitted
	}{
		{"required, unsandboxed", "sandbox: required\n", level(sandbox.LevelNone), "the job requires sandbox:full and engines run unsandboxed here (docs/sandbox.md)"},
		{"required, partial", "sandbox: required\n", level(sandbox.LevelPartial), "the job requires sandbox:full and engines run in a partial sandbox here"},
		{"required, full", "sandbox: required\n", level(sandbox.LevelFull), ""},
		{"partial capability, unsandboxed", "capabilities: [has:git, sandbox:partial]\n", level(sandbox.LevelNone), "the job requires sandbox:partial and engines run unsandboxed here"},
		{"partial capability, partial", "capabilities: [sandbox:partial]\n", level(sandbox.LevelPartial), ""},
		{"partial capability, full", "capabilities: [sandbox:partial]\n", level(sandbox.LevelFull), ""},
		{"both, partial", "capabilities: [sandbox:partial]\nsandbox: required\n", level(sandbox.LevelPartial), "requires sandbox:full"},
		{"nothing required, unsandboxed", "capabilities: [has:git]\n", level(sandbox.LevelNone), ""},
		{"required, level not known", "sandbox: required\n", nil, ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			j, err := Parse("j.md", mf("repo: app\nengine: script\nscript: make\n"+c.front, body), nil)
			if err != nil {
				t.Fatal(err)
			}
			for _, fleet := range []bool{false, true} {
				ref := Check(j, Policy{Fleet: fleet, Sandbox: c.have})
				switch {
				case c.want == "" && ref != nil:
					t.Fatalf("fleet %v: refused: %s (%s)", fleet, ref.Msg, ref.Reason)
				case c.want == "":
				case ref == nil:
					t.Fatalf("fleet %v: admitted, want %q", fleet, c.want)
				case ref.Reason != job.ReasonSandboxUnavailable || !strings.Contains(ref.Msg, c.want):
					t.Fatalf("fleet %v: refused %s %q, want sandbox_unavailable naming %q", fleet, ref.Reason, ref.Msg, c.want)
				case ref.Reason.Permanent():
					t.Fatalf("sandbox_unavailable is permanent: another factory could run the job")
				}
			}
		})
	}
}

// TestAdmitSandbox: a job the coordinator hands out that requires a level
// this factory lacks is refused at admission, as every job's check is.
func TestAdmitSandbox(t *testing.T) {
	m := "---\nid: j1\nrepo: app\nengine: script\nscript: make\nsandbox: required\n---\n# Fix it\n"
	_, ref := Admit(Wire{ID: "j1", Repo: "app", BodyMd: m}, nil, Policy{Sandbox: func() sandbox.Level { return sandbox.LevelNone }})
	if ref == nil || ref.Reason != job.ReasonSandboxUnavailable {
		t.Fatalf("admitted or refused otherwise: %v", ref)
	}
	if j, ref := Admit(Wire{ID: "j1", Repo: "app", BodyMd: m}, nil, Policy{Sandbox: func() sandbox.Level { return sandbox.LevelFull }}); ref != nil || j.ID != "j1" {
		t.Fatalf("refused at the full level: %v", ref)
	}
}
