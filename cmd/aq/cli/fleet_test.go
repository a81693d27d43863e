package cli

import (
	"context"
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/aqfleet/aq/agent/fleet"
	"github.com/aqfleet/aq/agent/manifest"
	"github.com/aqfleet/aq/cmd/aq/clitest"
	"github.com/aqfleet/aq/demo/coord"
	"github.com/aqfleet/aq/internal/testenv"
	"github.com/aqfleet/aq/profiles"
)

// Job ids are unique per test binary run: the runner kills every process
// tagged with a finished job's id, host-wide, so two test binaries running
// jobs of the same id at once would kill each other's engines.
var (
	idCLIJob    = testenv.ID("cli-job")
	idContested = testenv.ID("contested")
	idSame      = testenv.ID("same")
	idLocalOnly = testenv.ID("local-only")
)

// eachRouteSet runs fn once per route set of the stub (full: docs/contract.md;
// legacy: the coordinator in service today).
func eachRouteSet(t *testing.T, fn func(t *testing.T, routes string)) {
	for _, rs := range coord.RouteSets {
		t.Run(rs, func(t *testing.T) { fn(t, rs) })
	}
}

func TestFleetSubmitRunOnceStatus(t *testing.T) {
	testenv.Slow(t, "runs commands end to end with real git and a coordinator")
	eachRouteSet(t, func(t *testing.T, routes string) {
		s, dir, _ := clitest.FleetEnvRoutes(t, routes)
		m := clitest.WriteManifest(t, dir, idCLIJob, "script: echo hi > hi.txt\nship: branch")
		out, errOut, code := runAQ(t, "submit", m)
		if code != 0 || !strings.Contains(out, "submitted "+idCLIJob+" to the fleet (queued)") {
			t.Fatalf("submit: %d %q %q", code, out, errOut)
		}
		if j, ok := s.Job(idCLIJob); !ok || !strings.Contains(j.BodyMd, "echo hi") || len(j.ManifestSnapshot) == 0 {
			t.Fatalf("stub job %+v", j)
		}
		out, errOut, code = runAQ(t, "run", "--once")
		if code != 0 || !strings.Contains(out, "job "+idCLIJob+": shipped") || !strings.Contains(out, "report delivered") {
			t.Fatalf("run: %d %q %q", code, out, errOut)
		}
		st, err := os.Stat(filepath.Join(os.Getenv("AQ_HOME"), "credentials"))
		if err != nil || st.Mode().Perm() != 0o600 {
			t.Fatalf("credentials %v %v", st, err)
		}
		// Second start: reuses the credentials, nothing to run → exit 3.
		_, errOut, code = runAQ(t, "run", "--once")
		if code != 3 || !strings.Contains(errOut, "no runnable job in the fleet") {
			t.Fatalf("second run: %d %q", code, errOut)
		}
		if n := s.Stats().Count(coord.RouteEnroll); n != 1 {
			t.Fatalf("%d enroll calls", n)
		}
		out, _, code = runAQ(t, "status", "--json")
		var b Board
		if code != 0 || json.Unmarshal([]byte(out), &b) != nil || b.Fleet == nil {
			t.Fatalf("status: %d %s", code, out)
		}
		if b.Fleet.Mode != "fleet" || !b.Fleet.Enrolled || b.Fleet.FactoryID != "cli-factory" || len(b.Fleet.Recent) != 1 || b.Fleet.Recent[0].Stage != "shipped" || b.Fleet.Recent[0].LeaseEpoch != 1 {
			t.Fatalf("fleet status %+v", b.Fleet)
		}
		out, _, _ = runAQ(t, "status")
		if !strings.Contains(out, "fleet: fleet mode, enrolled as cli-factory") {
			t.Fatalf("status text %q", out)
		}
	})
}

func TestFleetRevokedTokenExits5(t *testing.T) {
	testenv.Slow(t, "runs commands end to end with real git and a coordinator")
	s, _, _ := clitest.FleetEnv(t)
	if _, _, code := runAQ(t, "run", "--once"); code != 3 {
		t.Fatalf("first run: %d", code)
	}
	if err := s.RevokeFactory("cli-factory"); err != nil {
		t.Fatal(err)
	}
	creds, err := fleet.LoadCredentials(filepath.Join(os.Getenv("AQ_HOME"), "credentials"))
	if err != nil {
		t.Fatal(err)
	}
	_, errOut, code := runAQ(t, "run", "--once")
	if code != 5 || strings.Count(errOut, "\n") < 1 || !strings.Contains(errOut, "AQ_FLEET_TOKEN") || !strings.Contains(errOut, "401") {
		t.Fatalf("exit %d, stderr %q", code, errOut)
	}
	last := errOut[strings.LastIndex(strings.TrimRight(errOut, "\n"), "\n")+1:]
	if !strings.HasPrefix(last, "aq: the coordinator refused this factory's credentials") {
		t.Fatalf("last line %q", last)
	}
	if strings.Contains(errOut, creds.Token) || strings.Contains(errOut, s.EnrollToken()) {
		t.Fatal("a token reached stderr")
	}
}

func TestFleetConfigErrors(t *testing.T) {
	clitest.CleanEnv(t)
	t.Setenv("AQ_FLEET", "1")
	_, errOut, code := runAQ(t, "run", "--once")
	if code != 2 || !strings.Contains(errOut, "AQ_FLEET_API") {
		t.Fatalf("no API: %d %q", code, errOut)
	}
	t.Setenv("AQ_FLEET_API", "http://127.0.0.1:9/api")
	_, errOut, code = runAQ(t, "run", "--once")
	if code != 2 || !strings.Contains(errOut, "AQ_FLEET_TOKEN") {
		t.Fatalf("no token: %d %q", code, errOut)
	}
}

func TestFleetShadowInLocalRun(t *testing.T) {
	testenv.Slow(t, "runs commands end to end with real git and a coordinator")
	s, dir, _ := clitest.FleetEnv(t)
	t.Setenv("AQ_FLEET_SHADOW", "1")
	cat, _ := profiles.Embedded()
	post := func(path string) {
		raw, _ := os.ReadFile(path)
		j, err := manifest.Parse(path, raw, cat)
		if err != nil {
			t.Fatal(err)
		}
		c, _ := fleet.NewClient(fleet.ClientOptions{API: os.Getenv("AQ_FLEET_API"), Token: s.EnrollToken()})
		if _, err := c.Submit(context.Background(), j, raw); err != nil {
			t.Fatal(err)
		}
	}
	// The same job in both queues: AGREE.
	same := clitest.WriteManifest(t, dir, idSame, "script: true\nship: none")
	if _, errOut, code := runAQ(t, "submit", same); code != 0 {
		t.Fatalf("local submit: %s", errOut)
	}
	post(same)
	_, errOut, code := runAQ(t, "run", "--once")
	if code != 0 || !strings.Contains(errOut, "shadow: AGREE") {
		t.Fatalf("agree: %d %q", code, errOut)
	}
	// Shadow mode never moves the fleet's queue: the coordinator would still
	// hand out idSame, while the local queue picks its next job: DIVERGE.
	local := clitest.WriteManifest(t, dir, idLocalOnly, "script: true\nship: none")
	runAQ(t, "submit", local)
	_, errOut, code = runAQ(t, "run", "--once")
	if code != 0 || !strings.Contains(errOut, "shadow: DIVERGE local="+idLocalOnly+" fleet="+idSame) {
		t.Fatalf("diverge: %d %q", code, errOut)
	}
	// Shadow mode leased nothing in the fleet.
	if j, _ := s.Job(idSame); j.Stage != coord.StageQueued || j.LeaseEpoch != 0 {
		t.Fatalf("the dry run leased %+v", j)
	}
	out, _, _ := runAQ(t, "status", "--json")
	var b Board
	json.Unmarshal([]byte(out), &b)
	if b.Fleet == nil || b.Fleet.Mode != "shadow" || b.Fleet.Shadow == nil || b.Fleet.Shadow.Agree != 1 || b.Fleet.Shadow.Diverge != 1 {
		t.Fatalf("status %s", out)
	}
}

func TestDemoCoordinatorCommand(t *testing.T) {
	clitest.CleanEnv(t)
	out, _, code := runAQ(t, "demo", "--help") // bare `aq demo` runs the demo
	if code != 0 || !strings.Contains(out, "coordinator") {
		t.Fatalf("aq demo: %d %q", code, out)
	}
	if _, _, code := runAQ(t, "demo", "coordinator", "--fail-rate", "2"); code != 2 {
		t.Fatalf("bad --fail-rate: %d", code)
	}
	if _, errOut, code := runAQ(t, "demo", "--routes", "newest"); code != 2 || !strings.Contains(errOut, "--routes legacy") {
		t.Fatalf("bad --routes: %d %q", code, errOut)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var stdout, stderr testenv.SyncBuffer
	done := make(chan int, 1)
	go func() {
		done <- Run(ctx, []string{"demo", "coordinator", "--listen", "127.0.0.1:0", "--lease-ttl", "30s"}, IO{In: strings.NewReader(""), Out: &stdout, Err: &stderr})
	}()
	// The banner's last line, not its token line: the stub prints the
	// banner in several writes, and the check below reads all of it.
	testenv.WaitFor(t, time.Minute, "the stub's banner", func() bool { return strings.Contains(stdout.String(), "aq run --once\n") })
	text := stdout.String()
	_, rest, _ := strings.Cut(text, "listening on ")
	api, _, _ := strings.Cut(rest, "\n")
	resp, err := http.Get(strings.TrimSuffix(api, "/api") + "/fleet/_stats")
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("stub not serving at %q: %v", api, err)
	}
	resp.Body.Close()
	if !strings.Contains(text, "test and demo double") || !strings.Contains(text, "AQ_FLEET_API="+api) {
		t.Fatalf("banner %q", text)
	}
	cancel()
	if code := <-done; code != 0 {
		t.Fatalf("exit %d: %s", code, stderr.String())
	}
}

// TestFleetFencedExits4: a job requeued by an operator while it runs is
// fenced; `aq run --once` exits 4 and pushes nothing.
func TestFleetFencedExits4(t *testing.T) {
	testenv.Slow(t, "runs commands end to end with real git and a coordinator")
	eachRouteSet(t, func(t *testing.T, routes string) {
		s, dir, origin := clitest.FleetEnvRoutes(t, routes)
		started, goFile := filepath.Join(dir, "started"), filepath.Join(dir, "go")
		script := filepath.Join(dir, "wait.sh")
		testenv.WriteFile(t, script, "touch '"+started+"'\ni=0\nwhile [ ! -f '"+goFile+"' ] && [ $i -lt 1200 ]; do sleep 0.05; i=$((i+1)); done\necho x > x.txt\n")
		m := clitest.WriteManifest(t, dir, idContested, "script: /bin/sh "+script+"\nship: branch")
		if _, errOut, code := runAQ(t, "submit", m); code != 0 {
			t.Fatal(errOut)
		}
		done := make(chan int, 1)
		var stderr testenv.SyncBuffer
		go func() {
			done <- Run(context.Background(), []string{"run", "--once"}, IO{In: strings.NewReader(""), Out: &testenv.SyncBuffer{}, Err: &stderr})
		}()
		testenv.WaitFor(t, time.Minute, "the engine to start", func() bool { return testenv.Exists(started) })
		if _, err := s.Action(idContested, "requeue"); err != nil {
			t.Fatal(err)
		}
		if code := <-done; code != 4 {
			t.Fatalf("exit %d, want 4\n%s", code, stderr.String())
		}
		if !strings.Contains(stderr.String(), "nothing was pushed or reported") {
			t.Fatalf("stderr %q", stderr.String())
		}
		if refs := testenv.RemoteRefs(t, origin, "refs/heads/aq/"); len(refs) != 0 {
			t.Fatalf("the fenced factory pushed %v", refs)
		}
		if j, _ := s.Job(idContested); j.Branch != "" || j.Stage != coord.StageQueued {
			t.Fatalf("stub job %+v", j)
		}
	})
}
