package cli

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/aqfleet/aq/internal/testenv"
	"github.com/aqfleet/aq/job"
)

// fakeGH puts a `gh` on PATH that answers like the GitHub CLI (logged in;
// `pr create` prints the new PR's URL; `pr merge --auto` succeeds) and
// records each call's arguments and the PR body file in dir.
func fakeGH(t *testing.T, h *testenv.Home) (calls, body string) {
	t.Helper()
	dir := t.TempDir()
	calls, body = filepath.Join(dir, "calls"), filepath.Join(dir, "body")
	script := `#!/bin/sh
echo "$*" >> "` + calls + `"
case "$1 $2" in
  "auth status") exit 0 ;;
  "pr create")
    while [ $# -gt 0 ]; do [ "$1" = "--body-file" ] && cp "$2" "` + body + `"; shift; done
    echo "https://github.com/acme/app/pull/7"; exit 0 ;;
  "pr merge") exit 0 ;;
  "pr list") echo "[]"; exit 0 ;;
esac
echo "fake gh: unexpected $*" >&2; exit 1
`
	bin := filepath.Join(dir, "bin")
	os.MkdirAll(bin, 0o755)
	if err := os.WriteFile(filepath.Join(bin, "gh"), []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	h.Env = append(h.Env, "PATH="+bin+":"+os.Getenv("PATH"))
	return calls, body
}

// TestShipPRAndMerge: ship: pr pushes aq/job/<id>, opens the PR with the
// engine's .aq_pr.md as its body (never committed), and records the URL;
// ship: merge also enables auto-merge with branch deletion.
func TestShipPRAndMerge(t *testing.T) {
	t.Parallel() // its own home, repos and processes: it runs beside the others
	h := binHome(t)
	calls, body := fakeGH(t, h)
	repo := h.Repo(t, "app", nil)
	origin := testenv.AddOrigin(t, repo)
	h.Submit(t, "pr", scriptJob("app", "echo change > c.txt\nprintf 'Why this change\\n' > .aq_pr.md", "ship: pr"))
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

	h.Submit(t, "merge", scriptJob("app", "echo m > m.txt", "ship: merge"))
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
	h := binHome(t)
	h.Env = append(h.Env, "PATH=/usr/bin:/bin") // no gh here
	if _, err := os.Stat("/usr/bin/gh"); err == nil {
		t.Skip("gh is installed in /usr/bin")
	}
	h.Repo(t, "app", nil)
	h.Submit(t, "nogh", scriptJob("app", "echo x > x.txt", "ship: pr"))
	r := h.Run(t, "run", "--once")
	v := show(t, h, "nogh")
	if r.Code != 1 || v.Reason != job.ReasonCapabilityMismatch || !strings.Contains(v.Detail, "has:gh") {
		t.Fatalf("exit %d reason %s detail %q", r.Code, v.Reason, v.Detail)
	}
	if testenv.Exists(h.Worktree("app", testenv.ID("nogh"))) {
		t.Fatal("a worktree was made before the pre-flight failed")
	}
}
