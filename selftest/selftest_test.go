package selftest

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/aqfleet/aq/agent/config"
	"github.com/aqfleet/aq/demo/coord"
	"github.com/aqfleet/aq/demo/coord/coordtest"
	"github.com/aqfleet/aq/demo/sbpeer/sbpeertest"
	"github.com/aqfleet/aq/internal/process"
	"github.com/aqfleet/aq/internal/testenv"
)

func TestMain(m *testing.M) { os.Exit(testenv.Main(m)) }

// hostConfig points aq at a fresh AQ_HOME (never the real one) and returns
// the configuration the CLI would load.
func hostConfig(t *testing.T) *config.Config {
	t.Helper()
	dir := t.TempDir()
	t.Setenv("AQ_HOME", filepath.Join(dir, "aqhome"))
	t.Setenv("AQ_REPO_BASE", filepath.Join(dir, "src"))
	cfg, err := config.Load(nil)
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

var namePattern = regexp.MustCompile(`^(host|pipeline|engines)\.[a-z0-9]+(?:[.-][a-z0-9]+)*$`)

// TestCatalog: at least sixty distinct, well-formed checks, each with a
// one-line description, in two groups.
func TestCatalog(t *testing.T) {
	cat := Catalog()
	seen := map[string]bool{}
	groups := map[Group]int{}
	for _, c := range cat {
		if seen[c.Name] {
			t.Errorf("duplicate check %s", c.Name)
		}
		seen[c.Name] = true
		groups[c.Group]++
		if !namePattern.MatchString(c.Name) || !strings.HasPrefix(c.Name, string(c.Group)+".") {
			t.Errorf("check %q of group %q: bad name", c.Name, c.Group)
		}
		if c.Description == "" || strings.ContainsAny(c.Description, "\r\n") {
			t.Errorf("check %s: description %q", c.Name, c.Description)
		}
	}
	if len(seen) < 60 {
		t.Fatalf("%d distinct checks, want at least 60", len(seen))
	}
	if groups[GroupHost] == 0 || groups[GroupPipeline] == 0 || groups[GroupEngines] == 0 || len(groups) != 3 {
		t.Fatalf("groups %v", groups)
	}
	// The engines group runs only when asked: --engines adds it to a run of
	// every group, --group engines runs it alone.
	def := Select(Options{})
	for _, c := range def {
		if c.Group == GroupEngines {
			t.Errorf("a default run selects %s", c.Name)
		}
	}
	if n := len(def); n != groups[GroupHost]+groups[GroupPipeline] {
		t.Errorf("a default run selects %d checks, want host and pipeline's %d", n, groups[GroupHost]+groups[GroupPipeline])
	}
	if n := len(Select(Options{Engines: true})); n != len(cat) {
		t.Errorf("--engines selects %d checks, want all %d", n, len(cat))
	}
	if got := Select(Options{Group: GroupEngines}); len(got) != groups[GroupEngines] || got[0].Name != "engines.claude" {
		t.Errorf("--group engines selects %v, want the engines group, claude first", got)
	}
	if n := len(Select(Options{Group: GroupHost})); n != groups[GroupHost] {
		t.Errorf("--group host selects %d, want %d", n, groups[GroupHost])
	}
	if got := Select(Options{Only: regexp.MustCompile(`^host\.git\.`)}); len(got) != 2 {
		t.Errorf("--only ^host.git. selects %v", got)
	}
	for name := range skipsWhen {
		if !seen[name] {
			t.Errorf("skipsWhen names %s, which is not a check", name)
		}
	}
	doc, err := os.ReadFile("../docs/selftest.md")
	if err != nil {
		t.Fatal(err)
	}
	for name := range seen {
		if !strings.Contains(string(doc), "| `"+name+"` |") {
			t.Errorf("docs/selftest.md does not list %s", name)
		}
	}
	t.Logf("%d checks: host %d, pipeline %d", len(seen), groups[GroupHost], groups[GroupPipeline])
}

// TestRunAllPassOrSkip runs every check in-process, as `aq selftest` does,
// with the aq binary for the child-process checks: on this machine every
// check passes or is skipped with a reason; nothing is left behind.
func TestRunAllPassOrSkip(t *testing.T) {
	testenv.Slow(t, "runs every check, the offline pipeline included")
	cfg := hostConfig(t)
	tmp := t.TempDir()
	rep, err := Run(context.Background(), Options{Config: cfg, Exe: testenv.BuildAQ(t), TempDir: tmp})
	if err != nil {
		t.Fatal(err)
	}
	if n := len(Select(Options{})); rep.Counts.Total != n || len(rep.Checks) != n {
		t.Fatalf("%d results for %d checks", len(rep.Checks), n)
	}
	broker := sbpeertest.Missing() == "" // the broker checks must then pass, not skip
	for _, r := range rep.Checks {
		t.Logf("%-4s %-36s %6dms %s", r.Status, r.Name, r.DurationMS, r.Reason)
		switch {
		case r.Status == Fail:
			t.Errorf("%s failed: %s", r.Name, r.Reason)
		case r.Status == Skip && skipsWhen[r.Name] == "":
			t.Errorf("%s skipped, but its catalog entry says it never skips: %s", r.Name, r.Reason)
		case r.Reason == "" || strings.ContainsAny(r.Reason, "\r\n"):
			t.Errorf("%s: reason %q is not one line", r.Name, r.Reason)
		case r.Status == Skip && strings.HasPrefix(r.Name, "pipeline.broker.") && broker:
			t.Errorf("%s skipped although node and the peer's packages are here: %s", r.Name, r.Reason)
		case r.Status == Skip && strings.HasPrefix(r.Name, "pipeline.recover."):
			t.Errorf("%s skipped although the aq binary was given: %s", r.Name, r.Reason)
		case r.Status == Skip && strings.HasPrefix(r.Name, "pipeline.") && !strings.HasPrefix(r.Name, "pipeline.broker.") && r.Name != "pipeline.ladder.escaped":
			t.Errorf("%s skipped: %s", r.Name, r.Reason)
		}
	}
	if !rep.OK || rep.Counts.Fail != 0 {
		t.Fatalf("report not ok: %+v", rep.Counts)
	}
	assertNothingLeft(t, rep, tmp)
	t.Logf("%d checks in %dms", rep.Counts.Total, rep.DurationMS)
}

// TestNothingLeftBehind: the checks that start processes (the kill ladder,
// kill -9 recovery, budgets, the peer) leave no process carrying one of their
// tags, and their temp dir is removed; the real AQ_HOME is not touched.
func TestNothingLeftBehind(t *testing.T) {
	testenv.Slow(t, "runs every check, the offline pipeline included")
	cfg := hostConfig(t)
	tmp := t.TempDir()
	rep, err := Run(context.Background(), Options{Config: cfg, Exe: testenv.BuildAQ(t), TempDir: tmp,
		Only: regexp.MustCompile(`ladder|recover|budget|broker|locks\.child|proc\.tagged`)})
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range rep.Failed() {
		t.Errorf("%s failed: %s", r.Name, r.Reason)
	}
	assertNothingLeft(t, rep, tmp)
	if _, err := os.Stat(cfg.Home); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("AQ_HOME %s was created by the pipeline checks", cfg.Home)
	}
}

func assertNothingLeft(t *testing.T, rep *Report, tmp string) {
	t.Helper()
	if rep.Workspace == "" {
		t.Fatal("no workspace was reported")
	}
	if _, err := os.Lstat(rep.Workspace); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the workspace %s is still there (%v)", rep.Workspace, err)
	}
	if ents, _ := os.ReadDir(tmp); len(ents) != 0 {
		var names []string
		for _, e := range ents {
			names = append(names, e.Name())
		}
		t.Errorf("left in the temp dir: %v", names)
	}
	if len(rep.Tags) == 0 {
		t.Fatal("no job tags were reported")
	}
	for _, tag := range rep.Tags {
		if pids, err := process.FindScoped(tag.ID, tag.Scope); err != nil || len(pids) > 0 {
			t.Errorf("processes tagged %s (scope %s) alive: %v %v", tag.ID, tag.Scope, pids, err)
		}
		if pids, err := process.FindTagged(tag.ID); err != nil || len(pids) > 0 {
			t.Errorf("processes tagged %s alive: %v %v", tag.ID, pids, err)
		}
	}
}

// TestGitMissingFails: with git off PATH the host group fails, and the git
// check says so in one line.
func TestGitMissingFails(t *testing.T) {
	cfg := hostConfig(t)
	bin := t.TempDir()
	for _, tool := range []string{"sh", "sleep"} {
		if p, err := exec.LookPath(tool); err == nil {
			if err := os.Symlink(p, filepath.Join(bin, tool)); err != nil {
				t.Fatal(err)
			}
		}
	}
	env := withEnv(os.Environ(), "PATH="+bin)
	rep, err := Run(context.Background(), Options{Config: cfg, Env: env, Group: GroupHost})
	if err != nil {
		t.Fatal(err)
	}
	if rep.OK {
		t.Fatal("the host group passed without git")
	}
	got := map[string]Result{}
	for _, r := range rep.Checks {
		got[r.Name] = r
	}
	g := got["host.git.present"]
	if g.Status != Fail || !strings.Contains(g.Reason, "git is not on PATH") || strings.ContainsAny(g.Reason, "\n") {
		t.Fatalf("host.git.present: %+v", g)
	}
	if v := got["host.git.version"]; v.Status != Skip || !strings.Contains(v.Reason, "host.git.present") {
		t.Errorf("host.git.version: %+v", v)
	}
	for _, r := range rep.Failed() {
		if r.Name != "host.git.present" {
			t.Errorf("another check failed: %+v", r)
		}
	}
}

// TestHungCheckFails: a check that ignores its deadline is reported hung,
// with its scenario's later checks not run, instead of hanging the run.
func TestHungCheckFails(t *testing.T) {
	block := make(chan struct{})
	defer close(block)
	g := GroupPipeline
	sc := &scenario{name: "hang", group: g, checks: []Check{
		check(g, "pipeline.test.hangs", "hangs"),
		check(g, "pipeline.test.after", "never reached"),
	}, run: func(ctx context.Context, s *session) {
		if !s.step(ctx, "pipeline.test.hangs", 50*time.Millisecond, func(context.Context) (string, error) {
			<-block // ignores its context
			return "", nil
		}) {
			return
		}
		s.step(ctx, "pipeline.test.after", time.Second, func(context.Context) (string, error) { return "ran", nil })
	}}
	ok := single(GroupHost, "host.test.ok", "passes", time.Second, func(context.Context, *session) (string, error) { return "fine", nil })
	skip := single(GroupHost, "host.test.skip", "skips", time.Second, func(context.Context, *session) (string, error) { return "", skipf("not here") })
	boom := single(GroupHost, "host.test.panics", "panics", time.Second, func(context.Context, *session) (string, error) { panic("boom") })
	var streamed []string
	rep, err := Run(context.Background(), Options{scenarios: []*scenario{ok, skip, boom, sc}, hungGrace: 50 * time.Millisecond,
		OnResult: func(r Result) { streamed = append(streamed, r.Name) }})
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]Status{"host.test.ok": Pass, "host.test.skip": Skip, "host.test.panics": Fail, "pipeline.test.hangs": Fail, "pipeline.test.after": Fail}
	for _, r := range rep.Checks {
		if r.Status != want[r.Name] {
			t.Errorf("%s: %s (%s), want %s", r.Name, r.Status, r.Reason, want[r.Name])
		}
	}
	if r := rep.Checks[3]; !strings.Contains(r.Reason, "hung") {
		t.Errorf("the hung check says %q", r.Reason)
	}
	if r := rep.Checks[4]; !strings.Contains(r.Reason, "not run") {
		t.Errorf("the check after it says %q", r.Reason)
	}
	if r := rep.Checks[2]; !strings.Contains(r.Reason, "panic: boom") {
		t.Errorf("the panicking check says %q", r.Reason)
	}
	if strings.Join(streamed, " ") != "host.test.ok host.test.skip host.test.panics pipeline.test.hangs pipeline.test.after" {
		t.Errorf("streamed out of order: %v", streamed)
	}
	if rep.OK || rep.Counts != (Counts{Total: 5, Pass: 1, Fail: 3, Skip: 1}) {
		t.Errorf("counts %+v ok %v", rep.Counts, rep.OK)
	}
}

// TestFleetHostChecks: in fleet mode the host checks reach the coordinator
// with the token, compare clocks, and fail with a clear reason when the token
// is refused; secrets never appear in a reason.
func TestFleetHostChecks(t *testing.T) {
	s := coordtest.Start(t, coord.Options{})
	only := regexp.MustCompile(`^host\.(fleet|clock\.coordinator|credentials|sb)`)
	run := func(token string) map[string]Result {
		cfg := hostConfig(t)
		cfg.Fleet, cfg.FleetAPI, cfg.FleetToken = true, s.API, token
		rep, err := Run(context.Background(), Options{Config: cfg, Only: only})
		if err != nil {
			t.Fatal(err)
		}
		out := map[string]Result{}
		for _, r := range rep.Checks {
			if strings.Contains(r.Reason, token) {
				t.Errorf("%s prints the token: %s", r.Name, r.Reason)
			}
			out[r.Name] = r
		}
		return out
	}
	good := run(s.EnrollToken())
	for _, n := range []string{"host.fleet.settings", "host.fleet.reachable", "host.fleet.token", "host.clock.coordinator"} {
		if good[n].Status != Pass {
			t.Errorf("%s: %+v", n, good[n])
		}
	}
	bad := run("aqf_wrong_" + strings.Repeat("x", 12))
	if r := bad["host.fleet.token"]; r.Status != Fail || !strings.Contains(r.Reason, "refused the token") {
		t.Errorf("a refused token: %+v", r)
	}
	if r := bad["host.fleet.reachable"]; r.Status != Pass {
		t.Errorf("reachable with a refused token: %+v", r)
	}
}

// TestServiceBusSettings: a non-loopback emulator string fails; fleet off
// with broker settings fails; nothing configured skips.
func TestServiceBusSettings(t *testing.T) {
	only := regexp.MustCompile(`^host\.sb\.`)
	run := func(mut func(*config.Config)) map[string]Result {
		cfg := hostConfig(t)
		mut(cfg)
		rep, err := Run(context.Background(), Options{Config: cfg, Only: only})
		if err != nil {
			t.Fatal(err)
		}
		out := map[string]Result{}
		for _, r := range rep.Checks {
			if strings.Contains(r.Reason, "c2VjcmV0") {
				t.Errorf("%s prints the key: %s", r.Name, r.Reason)
			}
			out[r.Name] = r
		}
		return out
	}
	none := run(func(*config.Config) {})
	for n, r := range none {
		if r.Status != Skip {
			t.Errorf("nothing configured: %s %+v", n, r)
		}
	}
	remote := run(func(c *config.Config) {
		c.Fleet = true
		c.SBConnectionString = "Endpoint=sb://broker.example.com;SharedAccessKeyName=k;SharedAccessKey=c2VjcmV0;UseDevelopmentEmulator=true"
	})
	if r := remote["host.sb.emulator"]; r.Status != Fail || !strings.Contains(r.Reason, "broker.example.com") {
		t.Errorf("remote emulator: %+v", r)
	}
	if r := remote["host.sb.settings"]; r.Status != Fail {
		t.Errorf("remote emulator settings: %+v", r)
	}
	local := run(func(c *config.Config) {
		c.SBConnectionString = "Endpoint=sb://127.0.0.1:5672;SharedAccessKeyName=k;SharedAccessKey=c2VjcmV0;UseDevelopmentEmulator=true"
	})
	if r := local["host.sb.emulator"]; r.Status != Pass {
		t.Errorf("loopback emulator: %+v", r)
	}
	if r := local["host.sb.fleet"]; r.Status != Fail || !strings.Contains(r.Reason, "AQ_FLEET=0") {
		t.Errorf("broker without fleet mode: %+v", r)
	}
	both := run(func(c *config.Config) {
		c.Fleet, c.SBNamespace = true, "ns.servicebus.windows.net"
		c.SBConnectionString = "Endpoint=sb://127.0.0.1;SharedAccessKeyName=k;SharedAccessKey=c2VjcmV0"
	})
	if r := both["host.sb.settings"]; r.Status != Fail || !strings.Contains(r.Reason, "both") {
		t.Errorf("namespace and connection string: %+v", r)
	}
}

// TestNoTestingInBinary: selftest runs inside aq; neither it nor anything
// it imports may pull the testing package (or the test helpers) into the
// binary.
func TestNoTestingInBinary(t *testing.T) {
	testenv.Slow(t, "reads the whole binary")
	out, err := exec.Command("go", "list", "-deps", "github.com/aqfleet/aq/cmd/aq").Output()
	if err != nil {
		t.Skipf("go list: %v", err)
	}
	for _, p := range strings.Fields(string(out)) {
		if p == "testing" || strings.HasSuffix(p, "/internal/testenv") || strings.HasSuffix(p, "/sbpeertest") {
			t.Errorf("the aq binary depends on %s", p)
		}
	}
}

// withEnv returns env with each KEY=value of set replacing its key.
func withEnv(env []string, set ...string) []string {
	out := append([]string(nil), env...)
	for _, kv := range set {
		k, _, _ := strings.Cut(kv, "=")
		for i, e := range out {
			if strings.HasPrefix(e, k+"=") {
				out[i] = ""
			}
		}
		out = append(out, kv)
	}
	var clean []string
	for _, e := range out {
		if e != "" {
			clean = append(clean, e)
		}
	}
	return clean
}
