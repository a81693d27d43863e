//go:build unix && !unit

package demoacts

import (
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/aqfleet/aq/cmd/aq/cli"
	"github.com/aqfleet/aq/demo"
	"github.com/aqfleet/aq/internal/process"
	"github.com/aqfleet/aq/internal/testenv"
)

// TestDemoWholeBinary runs `aq demo --json` — both acts, the factories as
// real `aq daemon` processes of the built binary — and requires every check
// to pass, exit 0, JSON on stdout and the narration on stderr. Its act 2 is
// the fleet act on the full route set, so it also holds what fleetdemo's
// TestFleetDemo held when it ran that act once more in-process: the broker
// path when Node and the peer are installed, and the narration of the kill,
// the reaper, the 409, gc and the expected events (fleetdemo's own tests
// run the legacy route set and the no-Node path).
func TestDemoWholeBinary(t *testing.T) {
	t.Parallel() // its own home, repos and processes: it runs beside the others
	if testing.Short() {
		t.Skip("the whole demo takes about half a minute")
	}
	bin := testenv.BuildAQ(t)
	cmd := exec.Command(bin, "demo", "--json")
	cmd.Env = append(os.Environ(), "HOME="+t.TempDir())
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	res, err := testenv.Wait(cmd, &stdout, &stderr, 8*time.Minute)
	if err != nil {
		t.Fatalf("aq demo: %v\n%s", err, stderr.String())
	}
	var sum cli.DemoSummary
	if jerr := json.Unmarshal(stdout.Bytes(), &sum); jerr != nil {
		t.Fatalf("stdout is not the JSON summary: %v\n%s", jerr, stdout.String())
	}
	if res.Code != 0 || !sum.Passed || sum.Local == nil || sum.Fleet == nil || sum.Scale == nil {
		t.Fatalf("exit %d, passed %t:\n%s", res.Code, sum.Passed, stderr.String())
	}
	if len(sum.Fleet.Checks) < 15 || len(sum.Fleet.Jobs) != 8 || sum.Fleet.Total == 0 || len(sum.Fleet.Requests) == 0 {
		t.Fatalf("summary incomplete: %+v", sum.Fleet)
	}
	if demo.PeerMissing(os.Environ(), demo.FindPeerDir("")) == "" && sum.Fleet.Path != "broker" {
		t.Errorf("Node and the peer are installed, but act 2 used the %s path (%s)", sum.Fleet.Path, sum.Fleet.PathNote)
	}
	if sum.Scale.Skipped == "" && (len(sum.Scale.Checks) < 8 || sum.Scale.Peak == 0) {
		t.Fatalf("scale act summary incomplete: %+v", sum.Scale)
	}
	wants := []string{"Act 1 of 3", "Act 2 of 3", "Act 3 of 3: scale to zero", "kill -9", "the reaper:", "409 Conflict", "aq gc", "Expected events", "aq demo: all"}
	if sum.Scale.Skipped == "" {
		wants = append(wants, "Idle again")
	}
	for _, want := range wants {
		if !strings.Contains(stderr.String(), want) {
			t.Errorf("narration lacks %q", want)
		}
	}
	if sum.Kept || sum.Workspace != "" {
		t.Errorf("workspace kept without --keep: %q", sum.Workspace)
	}
	t.Logf("aq demo passed in %s (fleet path %s)", time.Duration(sum.DurationMS)*time.Millisecond, sum.Fleet.Path)
}

// TestDemoLocalAndFlags: `aq demo local` runs act 1 alone; --dir keeps the
// workspace and must be new or empty. It runs the binary (not Run in this
// process, whose environment a test can only change alone), so it runs
// beside the others.
func TestDemoLocalAndFlags(t *testing.T) {
	t.Parallel() // its own HOME and workspaces: it runs beside the others
	testenv.Slow(t, "runs the local demo act")
	bin, home := testenv.BuildAQ(t), t.TempDir()
	aq := func(args ...string) testenv.Result {
		t.Helper()
		cmd := exec.Command(bin, args...)
		cmd.Env = append(os.Environ(), "HOME="+home, "XDG_CONFIG_HOME="+filepath.Join(home, "xdg"), "AQ_HOME="+filepath.Join(home, "aqhome"))
		var stdout, stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		process.SetGroup(cmd)
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		res, err := testenv.Wait(cmd, &stdout, &stderr, 8*time.Minute)
		if err != nil {
			t.Fatalf("aq %v: %v", args, err)
		}
		return res
	}
	dir := filepath.Join(t.TempDir(), "ws")
	r := aq("demo", "local", "--dir", dir, "--json")
	var sum cli.DemoSummary
	if r.Code != 0 || json.Unmarshal([]byte(r.Stdout), &sum) != nil || !sum.Passed || sum.Fleet != nil || sum.Local == nil {
		t.Fatalf("aq demo local: %s", r)
	}
	if !sum.Kept || sum.Workspace != dir || !testenv.Exists(filepath.Join(dir, "local", "aq-home")) {
		t.Fatalf("--dir %s not used and kept: %+v", dir, sum)
	}
	if !strings.Contains(r.Stderr, "Act 1 of 1") {
		t.Errorf("narration: %s", r.Stderr)
	}
	if r := aq("demo", "--dir", dir); r.Code != 2 || !strings.Contains(r.Stderr, "not empty") {
		t.Fatalf("a non-empty --dir: %s", r)
	}
	if r := aq("demo", "--local-only", "--dir", filepath.Join(t.TempDir(), "ws2")); r.Code != 0 {
		t.Fatalf("--local-only: %s", r)
	}
}
