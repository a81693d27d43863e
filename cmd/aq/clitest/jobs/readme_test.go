//go:build !unit

package jobs

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/aqfleet/aq/cmd/aq/clitest"
	"github.com/aqfleet/aq/internal/process"
	"github.com/aqfleet/aq/internal/testenv"
)

// quickStartMarker precedes the README's quick start (the script-engine
// path): the next fenced sh block is what a newcomer types.
const quickStartMarker = "<!-- quickstart:"

// readmeQuickStart returns the README's quick-start block, as written.
func readmeQuickStart(t *testing.T) string {
	t.Helper()
	return clitest.ReadmeBlock(t, quickStartMarker, "sh")
}

// TestReadmeQuickStart runs the README's quick start exactly as written,
// in a shell that stops at the first failing command, with the aq binary on
// PATH (what `make build` and the README's export leave) and nothing of
// aq's in the environment: a README edit that breaks it fails here. Then
// it checks what the README says the commands print and do.
func TestReadmeQuickStart(t *testing.T) {
	t.Parallel() // its own home, repos and processes: it runs beside the others
	if testing.Short() {
		t.Skip("runs the aq binary")
	}
	block := readmeQuickStart(t)
	for _, want := range []string{"engine: script", "aq submit fix-title.md", "aq run --once"} {
		if !strings.Contains(block, want) {
			t.Fatalf("the quick start no longer has %q; update this test with it:\n%s", want, block)
		}
	}
	sh, err := exec.LookPath("sh")
	if err != nil {
		t.Skip("no sh")
	}
	bin := testenv.BuildAQ(t)
	tmp := t.TempDir()
	script := filepath.Join(tmp, "quickstart.sh")
	testenv.WriteFile(t, script, block)

	// A newcomer's environment: their PATH with aq on it, a HOME, git's
	// identity (their ~/.gitconfig has one), no AQ_* variables.
	var env []string
	for _, kv := range os.Environ() {
		k, _, _ := strings.Cut(kv, "=")
		if strings.HasPrefix(k, "AQ_") || k == "POLL_SECONDS" || k == "HOME" || k == "TMPDIR" || k == "PATH" || strings.HasPrefix(k, "GIT_") {
			continue
		}
		env = append(env, kv)
	}
	home := filepath.Join(tmp, "home")
	if err := os.MkdirAll(home, 0o755); err != nil {
		t.Fatal(err)
	}
	env = append(env, "PATH="+filepath.Dir(bin)+string(os.PathListSeparator)+os.Getenv("PATH"), "HOME="+home, "TMPDIR="+tmp)
	env = append(env, testenv.Identity...)

	cmd := exec.Command(sh, "-e", script)
	cmd.Env, cmd.Dir = env, tmp
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	process.SetGroup(cmd)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	r, err := testenv.Wait(cmd, &out, &errb, 3*time.Minute) // a hang guard, not a speed requirement
	if err != nil || r.Code != 0 {
		t.Fatalf("the README's quick start failed (%v): %s\nthe block:\n%s", err, r, block)
	}
	for _, want := range []string{
		"ok fix-title.md id=fix-title repo=webapp engine=script\n",
		"submitted fix-title to inbox\n",
		"job fix-title: shipped (aq/job/fix-title, 1 files +1/-1; engine script",
		"shipped:\n  fix-title aq/job/fix-title\n", // aq status lists it
		"<title>Hello</title>\n",                   // the shipped branch on origin
	} {
		if !strings.Contains(r.Stdout, want) {
			t.Errorf("the quick start's output lacks %q:\n%s", want, r.Stdout)
		}
	}
	if strings.Contains(r.Stderr, "warning:") {
		t.Errorf("the quick start's job draws a warning:\n%s", r.Stderr)
	}
}
