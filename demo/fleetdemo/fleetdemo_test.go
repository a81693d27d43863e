//go:build !unit

package fleetdemo

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/aqfleet/aq/demo"
	"github.com/aqfleet/aq/demo/coord"
	"github.com/aqfleet/aq/internal/testenv"
)

func TestMain(m *testing.M) { os.Exit(testenv.Main(m)) }

// runDemo runs the fleet act in-process (the stub here, the factories as
// real `aq daemon` processes of the built binary) and requires every check.
func runDemo(t *testing.T, o Options) (*Summary, string) {
	t.Helper()
	if testing.Short() {
		t.Skip("the fleet demo takes about half a minute")
	}
	var out bytes.Buffer
	o.Out, o.AQ = &out, testenv.BuildAQ(t)
	if o.Dir == "" {
		o.Dir = t.TempDir()
	}
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	sum, err := Run(ctx, o)
	if err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	if !sum.Passed() {
		t.Fatalf("demo checks failed:\n%s", out.String())
	}
	t.Logf("fleet demo (%s path) passed in %s", sum.Path, time.Duration(sum.DurationMS)*time.Millisecond)
	if testing.Verbose() {
		t.Log(out.String())
	}
	return sum, out.String()
}

// The fleet act on the full route set (the broker path when Node and the
// peer are installed) is run and held to its checks and narration by
// cmd/aq/clitest/demoacts' TestDemoWholeBinary, whose act 2 it is: these tests run the
// act's other two paths, side by side (each has its own workspace, stub,
// peer and factories).

// TestFleetDemoLegacyRoutes runs the act against today's coordinator (the
// stub with --routes legacy: no POST /fleet/accept, no /fleet/fail): the
// factories, given the broker, refuse it at start and take jobs over the
// gated poll path, and say so; the failing job's lease is released at once
// by a fenced PATCH and lease/release; every other check holds as on the
// full route set.
func TestFleetDemoLegacyRoutes(t *testing.T) {
	t.Parallel()
	sum, out := runDemo(t, Options{Routes: coord.RoutesLegacy})
	if sum.Path != "poll" || sum.Routes != coord.RoutesLegacy || !strings.Contains(sum.PathNote, "POST /fleet/accept") {
		t.Fatalf("path %q (%s), routes %q", sum.Path, sum.PathNote, sum.Routes)
	}
	for _, want := range []string{"route set legacy", "gated poll path", "lease/release (the coordinator has no /fleet/fail)", "kill -9", "the reaper:"} {
		if !strings.Contains(out, want) {
			t.Errorf("narration lacks %q:\n%s", want, out)
		}
	}
	if demo.PeerMissing(os.Environ(), demo.FindPeerDir("")) == "" && !strings.Contains(out, "broker refused at start") {
		t.Errorf("the peer is installed, but the narration does not show the factories refusing it:\n%s", out)
	}
	for _, r := range sum.Requests {
		if r.Route == coord.RouteFail || r.Route == coord.RouteAccept {
			t.Errorf("the legacy stub counted %s", r.Route)
		}
	}
}

// TestFleetDemoWithoutNode hides node from the children's PATH: the demo
// says so in one line and runs the same story over the gated poll path.
func TestFleetDemoWithoutNode(t *testing.T) {
	t.Parallel()
	env := hideFromPath(t, os.Environ(), "node", "nodejs")
	sum, out := runDemo(t, Options{Env: env})
	if sum.Path != "poll" || !strings.Contains(sum.PathNote, "node") {
		t.Fatalf("path %q (%s), want poll because node is missing", sum.Path, sum.PathNote)
	}
	if !strings.Contains(out, "no Service Bus:") || !strings.Contains(out, "gated poll path") {
		t.Errorf("the narration does not say why there is no broker:\n%s", out)
	}
}

// hideFromPath returns env with a PATH whose directories mirror the
// original ones (symlinks) minus the named programs.
func hideFromPath(t *testing.T, env []string, hide ...string) []string {
	t.Helper()
	root := t.TempDir()
	var path string
	out := make([]string, 0, len(env))
	for _, kv := range env {
		if v, ok := strings.CutPrefix(kv, "PATH="); ok {
			path = v
			continue
		}
		out = append(out, kv)
	}
	var dirs []string
	for i, dir := range filepath.SplitList(path) {
		entries, err := os.ReadDir(dir)
		if err != nil {
			continue
		}
		mirror := filepath.Join(root, "p"+string(rune('a'+i%26))+strings.Repeat("x", i/26))
		if err := os.MkdirAll(mirror, 0o755); err != nil {
			t.Fatal(err)
		}
		for _, e := range entries {
			if slices.Contains(hide, e.Name()) {
				continue
			}
			_ = os.Symlink(filepath.Join(dir, e.Name()), filepath.Join(mirror, e.Name()))
		}
		dirs = append(dirs, mirror)
	}
	return append(out, "PATH="+strings.Join(dirs, string(filepath.ListSeparator)))
}
