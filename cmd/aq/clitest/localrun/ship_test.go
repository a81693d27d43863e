//go:build !unit

package localrun

import (
	"os"
	"strings"
	"testing"

	"github.com/aqfleet/aq/cmd/aq/clitest"
	"github.com/aqfleet/aq/internal/testenv"
	"github.com/aqfleet/aq/job"
)

// TestShipPRAndMerge: ship: pr pushes aq/job/<id>, opens the PR with the
// engine's .aq_pr.md as its body (never committed), and records the URL;
// ship: merge also enables auto-merge with branch deletion.
func TestShipPRAndMerge(t *testing.T) {
	t.Parallel() // its own home, repos and processes: it runs beside the others
	h := clitest.BinHome(t)
	calls, body := clitest.FakeGH(t, h)
	repo := h.Repo(t, "app", nil)
	origin := testenv.AddOrigin(t, repo)
	h.Submit(t, "pr", clitest.ScriptJob("app", "echo change > c.txt\nprintf 'Why this change\\n' > .aq_pr.md", "ship: pr"))
	if r := h.Run(t, "run", "--once"); r.Code != 0 {
		t.Fatalf("run: %s", r)
	}
	v := show(t, h, "pr")
	id := testenv.ID("pr")
	if v.Stage != job.Review || v.PR != "https://github.com/acme/app/pull/7" {
		t.Fatalf("job after ship: pr: stage %s pr %q", v.Stage, v.PR)
	}
	if refs := testenv.RemoteRefs(t, origin, "refs/heads/aq/job/"); refs["refs/heads/aq/job/"+id] == "" {
		t.Fatalf("aq/job/%s not on origin: %v", id, refs)
	}
	if got := testenv.ReadFile(t, body); got != "Why this change\n" {
		t.Fatalf("PR body %q, want the engine's .aq_pr.md", got)
	}
	if files := testenv.TreeFiles(t, repo, "aq/job/"+id); files[".aq_pr.md"] != "" || files["c.txt"] == "" {
		t.Fatalf("committed files %v: .aq_pr.md must not be committed", files)
	}
	log := testenv.ReadFile(t, calls)
	if !strings.Contains(log, "auth status") || !strings.Contains(log, "pr create --head aq/job/"+id+" --base main") || strings.Contains(log, "pr merge") {
		t.Fatalf("gh calls:\n%s", log)
	}

	h.Submit(t, "merge", clitest.ScriptJob("app", "echo m > m.txt", "ship: merge"))
	if r := h.Run(t, "run", "--once"); r.Code != 0 {
		t.Fatalf("run: %s", r)
	}
	log = testenv.ReadFile(t, calls)
	if !strings.Contains(log, "pr merge") || !strings.Contains(log, "--auto") || !strings.Contains(log, "--delete-branch") {
		t.Fatalf("ship: merge did not enable auto-merge with branch deletion:\n%s", log)
	}
}

// TestShipPRWithoutGH: gh missing is caught before any worktree is made,
// as capability_mismatch naming has:gh.
func TestShipPRWithoutGH(t *testing.T) {
	t.Parallel() // its own home, repos and processes: it runs beside the others
	h := clitest.BinHome(t)
	h.Env = append(h.Env, "PATH=/usr/bin:/bin") // no gh here
	if _, err := os.Stat("/usr/bin/gh"); err == nil {
		t.Skip("gh is installed in /usr/bin")
	}
	h.Repo(t, "app", nil)
	h.Submit(t, "nogh", clitest.ScriptJob("app", "echo x > x.txt", "ship: pr"))
	r := h.Run(t, "run", "--once")
	v := show(t, h, "nogh")
	if r.Code != 1 || v.Reason != job.ReasonCapabilityMismatch || !strings.Contains(v.Detail, "has:gh") {
		t.Fatalf("exit %d reason %s detail %q", r.Code, v.Reason, v.Detail)
	}
	if testenv.Exists(h.Worktree("app", testenv.ID("nogh"))) {
		t.Fatal("a worktree was made before the pre-flight failed")
	}
}
