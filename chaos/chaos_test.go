//go:build linux

package chaos_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/aqfleet/aq/chaos"
	"github.com/aqfleet/aq/demo/sbpeer/sbpeertest"
	"github.com/aqfleet/aq/internal/testenv"
)

// replaySeed is AQ_CHAOS_SEED, read before testenv.Main clears every AQ_*
// variable from the test's environment.
var replaySeed string

func TestMain(m *testing.M) {
	// The harness's helpers (the coordinator stub, the forwarders) are this
	// test binary run again.
	if code, ok := chaos.RunHelper(); ok {
		os.Exit(code)
	}
	replaySeed = os.Getenv("AQ_CHAOS_SEED")
	os.Exit(testenv.Main(m))
}

// logWriter sends the harness's progress lines to t.Log.
type logWriter struct {
	mu sync.Mutex
	t  *testing.T
}

func (w *logWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, l := range strings.Split(strings.TrimRight(string(p), "\n"), "\n") {
		if !strings.Contains(l, " terminal: ") { // one progress line a second is noise here
			w.t.Log(l)
		}
	}
	return len(p), nil
}

// TestChaos is the reduced chaos run of `make test`: 48 jobs, 3 factories
// (each in its own network namespace when the test runs as root with
// iproute2, else on loopback), and a compressed fault schedule that still
// has a kill -9 mid-job, a partition long enough for the reaper (a zombie),
// a broker peer restart, a stub restart, a SIGTERM drain and a window of
// 503s. It fails if any invariant breaks. AQ_CHAOS_SEED replays a seed.
func TestChaos(t *testing.T) {
	if testing.Short() {
		t.Skip("the reduced chaos run takes 1½ to 5 minutes under -race on 2 cores; skipped with -short")
	}
	if why := sbpeertest.Missing(); why != "" {
		t.Skip("the chaos run needs the broker peer: " + why)
	}
	seed := rand.Uint64N(1 << 48)
	if s := replaySeed; s != "" {
		v, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			t.Fatalf("AQ_CHAOS_SEED=%q: %v", s, err)
		}
		seed = v
	}
	cfg := chaos.Reduced(seed)
	cfg.AQ = testenv.BuildAQ(t) // built without -race, as the full run's
	cfg.Progress = &logWriter{t: t}
	t.Logf("seed %d (replay: AQ_CHAOS_SEED=%d go test -run TestChaos ./chaos/)", seed, seed)

	res, err := chaos.Run(context.Background(), cfg)
	if err != nil {
		t.Fatalf("seed %d: the harness failed: %v (sandbox %s)", seed, err, dirOf(res))
	}
	t.Logf("hosts: %s %s; %s in %s", res.Mode, res.ModeWhy, res.Checks.Summary(), res.Duration.Round(1e9))
	for _, c := range res.Checks.Checks {
		t.Logf("  %s: %s", c.Name, c.Summary)
	}
	if !res.Checks.OK() {
		t.Errorf("seed %d: %s (sandbox kept at %s; replay: AQ_CHAOS_SEED=%d go test -run TestChaos ./chaos/)\n%s",
			seed, res.Checks.Summary(), res.Dir, seed, strings.Join(res.Checks.Failed(), "\n"))
	}
	// Jobs with verify: need a repair round (the engine fixes what verify
	// checks only when handed its failure): some must have shipped so.
	verifyJobs := 0
	for _, j := range res.Jobs {
		if j.Verify && j.Plan != chaos.PlanInvalid && j.Plan != chaos.PlanAlways {
			verifyJobs++
		}
	}
	if verifyJobs > 0 && res.Checks.Repaired == 0 {
		t.Errorf("%d jobs with verify: could ship, none shipped through a repair round", verifyJobs)
	}
	t.Logf("repair rounds: %d shipped jobs passed verify after %d rounds", res.Checks.Repaired, res.Checks.RepairRounds)
	// The faults the issue names all happened, and the zombie case too.
	kinds := map[string]int{}
	for _, f := range res.Faults {
		kinds[f.Kind]++
		if (f.Kind == chaos.KindKill9 || f.Kind == chaos.KindPartition) && f.Running == 0 {
			t.Errorf("%s of f%d hit no running job", f.Kind, f.Target+1)
		}
	}
	for _, k := range []string{chaos.KindKill9, chaos.KindPartition, chaos.KindPeer, chaos.KindStub, chaos.KindTerm, chaos.KindErrors} {
		if kinds[k] == 0 {
			t.Errorf("no %s fault was injected", k)
		}
	}
	// Where the factories sandbox fully, aq was killed -9 under a
	// sandboxed engine whose straggler was up (and the invariant above
	// found it gone with its aq); elsewhere the fault says why it did not
	// run.
	t.Logf("engines: %s %s", res.Sandbox, res.SandboxWhy)
	for _, f := range res.Faults {
		if f.Kind != chaos.KindKill9Sandboxed {
			continue
		}
		t.Logf("%s of f%d: %s", f.Kind, f.Target+1, f.Detail)
		switch {
		case res.SandboxWhy == "" && f.Job == "":
			t.Errorf("%s of f%d hit no engine with a straggler up: %s", f.Kind, f.Target+1, f.Detail)
		case res.SandboxWhy != "" && !strings.HasPrefix(f.Detail, "not run: "):
			t.Errorf("%s ran although the engines are not fully sandboxed: %s", f.Kind, f.Detail)
		}
	}
	for _, c := range res.Checks.Checks {
		if c.Name == "no engine or straggler outlives its aq" && res.SandboxWhy == "" && kinds[chaos.KindKill9Sandboxed] > 0 && strings.Contains(c.Summary, "(0 with a straggler up)") {
			t.Errorf("no engine with a straggler up was running at a kill -9: %s", c.Summary)
		}
	}
	// A partition of a factory that held leases at the cut (in the stub's
	// log) must make a zombie. One whose jobs had just reported when it was
	// cut (its status file lags) had none to lose: that run did not exercise
	// the case, which the log says.
	zombies, held := 0, 0
	for _, z := range res.Checks.Zombies {
		zombies += z.Reaped
		held += z.Held
	}
	switch {
	case held > 0 && zombies == 0:
		t.Errorf("the partition made no zombie (the cut-off factory held %d leases, none was reaped): %+v", held, res.Checks.Zombies)
	case held == 0:
		t.Logf("the partitioned factory held no lease at the cut (its jobs had just ended): no zombie this run: %+v", res.Checks.Zombies)
	}
}

func dirOf(res *chaos.Result) string {
	if res == nil {
		return "?"
	}
	return fmt.Sprint(res.Dir)
}
