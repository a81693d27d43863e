package fleet

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/aqfleet/aq/agent/caps"
	"github.com/aqfleet/aq/agent/config"
	"github.com/aqfleet/aq/agent/manifest"
	"github.com/aqfleet/aq/demo/coord"
	"github.com/aqfleet/aq/demo/coord/coordtest"
	"github.com/aqfleet/aq/internal/secrets"
	"github.com/aqfleet/aq/internal/testenv"
	"github.com/aqfleet/aq/profiles"
)

func TestMain(m *testing.M) { os.Exit(testenv.Main(m)) }

// fastBudgets are retry budgets for tests: long enough to ride out injected
// faults, short enough that an outage reaches the spool in a second or two.
func fastBudgets() Budgets {
	return Budgets{
		Enroll: 5 * time.Second, Heartbeat: 500 * time.Millisecond, QueueState: 2 * time.Second, Claim: 5 * time.Second,
		Accept: 5 * time.Second, Renew: 5 * time.Second, Release: time.Second, Report: time.Second,
		FinalReport: 2 * time.Second, Drain: time.Second, Submit: 5 * time.Second,
		MinWait: 5 * time.Millisecond, MaxWait: 50 * time.Millisecond, PerTry: 2 * time.Second,
	}
}

// eachRouteSet runs fn once per route set of the stub — full (docs/contract.md)
// and legacy (the coordinator in service today: no /fleet/fail, accept,
// deregister) — so the fleet pipeline is held to both (a table over route
// sets, not copies of tests). The runs are parallel: each makes its own
// stub, world and factories (fn must not share state across them).
func eachRouteSet(t *testing.T, fn func(t *testing.T, rs routeSet)) {
	for _, name := range coord.RouteSets {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			fn(t, routeSet(name))
		})
	}
}

// routeSet is one of coord.RouteSets.
type routeSet string

// opts is o with the route set.
func (rs routeSet) opts(o coord.Options) coord.Options {
	o.Routes = string(rs)
	return o
}

func (rs routeSet) legacy() bool { return rs == coord.RoutesLegacy }

// pick is full's value or legacy's.
func pick[T any](rs routeSet, full, legacy T) T {
	if rs.legacy() {
		return legacy
	}
	return full
}

// stub is a coordinator stub on a real 127.0.0.1 listener.
// stub is a coordinator stub on a real 127.0.0.1 listener.
type stub struct{ *coord.Served }

func startStub(t testing.TB, o coord.Options) *stub {
	t.Helper()
	return &stub{coordtest.Start(t, o)}
}

// world is one test's repositories: a repo base with git repos that have
// bare origins.
type world struct {
	t       testing.TB
	base    string
	origins map[string]string
	dir     string // scratch for scripts and signal files
}

func newWorld(t testing.TB, repos ...string) *world {
	t.Helper()
	w := &world{t: t, base: filepath.Join(t.TempDir(), "src"), origins: map[string]string{}, dir: t.TempDir()}
	for _, r := range repos {
		dir := testenv.NewRepo(t, w.base, r, nil)
		w.origins[r] = testenv.AddOrigin(t, dir)
	}
	return w
}

// script writes a shell script into the scratch dir and returns the
// manifest's script: value.
func (w *world) script(name, body string) string {
	p := filepath.Join(w.dir, name+".sh")
	testenv.WriteFile(w.t, p, body)
	return "/bin/sh " + p
}

// waitScript waits (bounded) for the file go to appear, after touching
// started; then it writes result.txt in the worktree.
func (w *world) waitScript(id string) (script, started, goFile string) {
	started = filepath.Join(w.dir, id+".started")
	goFile = filepath.Join(w.dir, id+".go")
	script = w.script(id, fmt.Sprintf(`touch %q
i=0
while [ ! -f %q ] && [ $i -lt 1200 ]; do sleep 0.05; i=$((i+1)); done
echo "work of %s" > result.txt
`, started, goFile, id))
	return script, started, goFile
}

// manifest is a job manifest's text.
func manifestText(id, repo, front string) string {
	return fmt.Sprintf("---\nid: %s\nrepo: %s\nengine: script\n%s\n---\n# Job %s\n\nDo the work for %s.\n", id, repo, strings.TrimRight(front, "\n"), id, id)
}

// submit posts a manifest to the stub as an operator would (aq submit).
func (s *stub) submit(t testing.TB, id, repo, front string) {
	t.Helper()
	text := manifestText(id, repo, front)
	cat, err := profiles.Embedded()
	if err != nil {
		t.Fatal(err)
	}
	j, err := manifest.Parse(id+".md", []byte(text), cat) // what aq submit sends as the manifest
	if err != nil {
		t.Fatal(err)
	}
	c := s.operator(t)
	if _, err := c.Submit(context.Background(), j, []byte(text)); err != nil {
		t.Fatalf("submit %s: %v", id, err)
	}
}

// operator is a client with the enrollment (operator) token.
func (s *stub) operator(t testing.TB) *Client {
	t.Helper()
	c, err := NewClient(ClientOptions{API: s.API, Token: s.EnrollToken(), Budgets: fastBudgets()})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// factory is one aq factory in a test: its own AQ_HOME, the shared repos
// (each factory gets its own clones of the origins), and its logs.
type factory struct {
	ID    string
	Home  string
	Base  string
	Agent *Agent
	Logs  *testenv.SyncBuffer
	Cfg   *config.Config
}

type factoryOpt func(*config.Config, *Parts)

func newFactory(t testing.TB, s *stub, w *world, id string, opts ...factoryOpt) *factory {
	t.Helper()
	root := t.TempDir()
	f := &factory{ID: id, Home: filepath.Join(root, "home"), Base: filepath.Join(root, "src"), Logs: &testenv.SyncBuffer{}}
	for name, origin := range w.origins {
		testenv.Git(t, root, "clone", "-q", origin, filepath.Join(f.Base, name))
	}
	f.Cfg = &config.Config{
		Home: f.Home, RepoBase: f.Base, Fleet: true, FleetAPI: s.API, FleetToken: s.EnrollToken(), FactoryID: id,
		FleetRoute: true, Heartbeat: time.Second, LeaseRenew: 200 * time.Millisecond, Poll: 50 * time.Millisecond,
		Slots: 1, WorktreePool: 1, KillGrace: 200 * time.Millisecond, ClaudePermissionMode: "acceptEdits", LogFormat: "text", LogLevel: "debug",
		// The tests' jobs are script jobs: the factory opts in (AQ_ENGINES=all),
		// as the project's harnesses do.
		Engines: config.EngineNames,
	}
	f.rebuild(t, opts...)
	return f
}

// rebuild makes a new Agent on the factory's home and repos (at first, and
// again for a restarted aq). The logs are captured raw (no redactor) so a
// test can prove no secret was ever written, rather than masked.
func (f *factory) rebuild(t testing.TB, opts ...factoryOpt) {
	t.Helper()
	b := fastBudgets()
	tokens := []string{"os:linux", "arch:amd64", "engine:script", "has:git"}
	ents, _ := os.ReadDir(f.Base)
	for _, e := range ents {
		tokens = append(tokens, "repo:"+e.Name())
	}
	parts := Parts{Budgets: &b, Host: func(context.Context) (*caps.Host, error) { return caps.FromTokens(tokens), nil }}
	for _, o := range opts {
		o(f.Cfg, &parts)
	}
	a, err := New(f.Cfg, newTestLogger(f.Logs), secrets.NewRedactor(nil), parts)
	if err != nil {
		t.Fatal(err)
	}
	f.Agent = a
}

// runOnce is `aq run --once` for the factory.
func (f *factory) runOnce(t testing.TB, ctx context.Context) (*Result, error) {
	t.Helper()
	var res *Result
	err := f.Agent.Run(ctx, RunOptions{Once: true}, func(r *Result) { res = r })
	return res, err
}

// events of kind for a job, in order.
func kinds(evs []coord.Event) []string {
	var out []string
	for _, e := range evs {
		s := e.Kind
		if e.Kind == "stage" || e.Kind == "fail" {
			s += ":" + e.Stage
		}
		out = append(out, s)
	}
	return out
}

func ctxT(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute) // a deadlock guard, not a speed limit
	t.Cleanup(cancel)
	return ctx
}

func newTestLogger(w io.Writer) *slog.Logger {
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: slog.LevelDebug}))
}
