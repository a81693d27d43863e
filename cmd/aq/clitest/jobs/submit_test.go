//go:build !unit

package jobs

import (
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/aqfleet/aq/cmd/aq/clitest"
	"github.com/aqfleet/aq/internal/testenv"
)

// queued lists the job files in a stage folder.
func queued(t *testing.T, h *testenv.Home, stage string) []string {
	t.Helper()
	ents, err := os.ReadDir(h.Queue(stage))
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	var names []string
	for _, e := range ents {
		if !strings.HasPrefix(e.Name(), ".") {
			names = append(names, e.Name())
		}
	}
	return names
}

// TestSubmitInvalidManifest: errors are FILE:LINE lines, exit 2, and nothing
// of the batch is enqueued.
func TestSubmitInvalidManifest(t *testing.T) {
	t.Parallel() // its own home, repos and processes: it runs beside the others
	h := clitest.BinHome(t)
	dir := t.TempDir()
	good := testenv.Manifest(t, dir, "good", clitest.ScriptJob("app", "true"))
	bad := filepath.Join(dir, "bad.md")
	testenv.WriteFile(t, bad, "---\nid: bad\nreop: app\nengine: script\nscript: true\npriority: urgent\n---\n# bad\n")
	r := h.Run(t, "submit", good, bad)
	if r.Code != 2 {
		t.Fatalf("want exit 2: %s", r)
	}
	lines := strings.Split(strings.TrimRight(r.Stderr, "\n"), "\n")
	fileLine := regexp.MustCompile("^" + regexp.QuoteMeta(bad) + `:\d+: `)
	var located []string
	for _, l := range lines {
		if fileLine.MatchString(l) {
			located = append(located, l)
		}
	}
	if len(located) < 2 || !strings.Contains(r.Stderr, bad+":3:") || !strings.Contains(r.Stderr, bad+":6:") {
		t.Errorf("want FILE:LINE errors for reop (line 3) and priority (line 6):\n%s", r.Stderr)
	}
	if !strings.Contains(lines[len(lines)-1], "nothing was submitted") {
		t.Errorf("last line %q", lines[len(lines)-1])
	}
	if got := queued(t, h, "inbox"); len(got) != 0 {
		t.Errorf("enqueued despite the invalid manifest: %v", got)
	}
	if strings.TrimSpace(r.Stdout) != "" {
		t.Errorf("stdout: %q", r.Stdout)
	}

	// A missing file is refused the same way, with the line aq validate
	// prints (both read through manifest.ReadFile).
	nope := filepath.Join(dir, "nope.md")
	if r := h.Run(t, "submit", nope); r.Code != 2 || !strings.Contains(r.Stderr, nope+": cannot read: no such file or directory (check the path and its permissions)") {
		t.Errorf("missing file: %s", r)
	}
}

// TestSubmitDuplicates: a second job with an existing idempotencyKey is
// refused naming the existing job; so is an existing id.
func TestSubmitDuplicates(t *testing.T) {
	t.Parallel() // its own home, repos and processes: it runs beside the others
	h := clitest.BinHome(t)
	dir := t.TempDir()
	first := testenv.Manifest(t, dir, "first", clitest.ScriptJob("app", "true", "idempotencyKey: TRACK-1234"))
	r := h.Run(t, "submit", "--json", first)
	var out []struct { // `aq submit --json`: one object per accepted job
		ID    string `json:"id"`
		Stage string `json:"stage"`
	}
	if r.Code != 0 || json.Unmarshal([]byte(r.Stdout), &out) != nil || len(out) != 1 || out[0].ID != "first" || out[0].Stage != "inbox" {
		t.Fatalf("first: %s", r)
	}
	second := testenv.Manifest(t, dir, "second", clitest.ScriptJob("app", "true", "idempotencyKey: TRACK-1234"))
	r = h.Run(t, "submit", second)
	if r.Code != 2 || !strings.Contains(r.Stderr, "duplicates job first") || !strings.Contains(r.Stderr, "TRACK-1234") {
		t.Errorf("duplicate key: %s", r)
	}
	again := testenv.Manifest(t, t.TempDir(), "first", clitest.ScriptJob("app", "echo other"))
	if r := h.Run(t, "submit", again); r.Code != 2 || !strings.Contains(r.Stderr, "already exists") {
		t.Errorf("duplicate id: %s", r)
	}
	if got := queued(t, h, "inbox"); len(got) != 2 { // first.md, first.json
		t.Errorf("inbox: %v", got)
	}
	// Deps not shipped: blocked.
	dep := testenv.Manifest(t, dir, "after", clitest.ScriptJob("app", "true", "deps: [first]"))
	if r := h.Run(t, "submit", dep); r.Code != 0 || !strings.Contains(r.Stdout, "submitted after to blocked") {
		t.Errorf("dependent job: %s", r)
	}
}
