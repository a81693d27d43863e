package selftest

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"time"

	"github.com/aqfleet/aq/agent/caps"
	"github.com/aqfleet/aq/agent/config"
	"github.com/aqfleet/aq/agent/fleet"
	"github.com/aqfleet/aq/agent/manifest"
	"github.com/aqfleet/aq/agent/runner"
	"github.com/aqfleet/aq/agent/ship"
	"github.com/aqfleet/aq/demo/coord"
	"github.com/aqfleet/aq/internal/fixture"
	"github.com/aqfleet/aq/internal/logging"
	"github.com/aqfleet/aq/internal/secrets"
)

// startStub serves a stub on addr ("127.0.0.1:0" for a free port; the
// address of a killed one brings it back there).
func startStub(ctx context.Context, o coord.Options, addr string) (*coord.Served, error) {
	ln, err := coord.ListenAgain(ctx, addr)
	if err != nil {
		return nil, err
	}
	return coord.ServeOn(ctx, ln, o, nil)
}

// fastBudgets are retry budgets for the selftest: long enough to ride out a
// fault, short enough that an outage reaches the spool within a second or
// two.
func fastBudgets() fleet.Budgets {
	return fleet.Budgets{
		Enroll: 5 * time.Second, Heartbeat: 500 * time.Millisecond, QueueState: 10 * time.Second, Claim: 5 * time.Second,
		Accept: 5 * time.Second, Renew: 5 * time.Second, Release: time.Second, Report: time.Second,
		FinalReport: 2 * time.Second, Drain: time.Second, Submit: 5 * time.Second,
		MinWait: 5 * time.Millisecond, MaxWait: 50 * time.Millisecond, PerTry: 2 * time.Second,
	}
}

// world is a fleet scenario's shared state: origins of its repositories,
// an operator client, and the factories.
type world struct {
	w       *workspace
	name    string
	dir     string
	st      *coord.Served
	origins map[string]string // repo → bare origin
	scope   string            // AQ_SCOPE of job ids that no factory home owns
}

// newWorld makes the origins of repos (each with a README) for a fleet
// scenario.
func (w *workspace) newWorld(ctx context.Context, name string, repos ...string) (*world, error) {
	dir, err := w.dir(name)
	if err != nil {
		return nil, err
	}
	wd := &world{w: w, name: name, dir: dir, origins: map[string]string{}, scope: "aq-selftest-" + w.token}
	for _, r := range repos {
		_, bare, err := w.newRepo(ctx, filepath.Join(dir, "upstream"), r, nil, true)
		if err != nil {
			return nil, err
		}
		wd.origins[r] = bare
	}
	return wd, nil
}

// operator is a client with the enrollment (operator) token.
func (wd *world) operator() (*fleet.Client, error) {
	return fleet.NewClient(fleet.ClientOptions{API: wd.st.API, Token: wd.st.EnrollToken(), Budgets: fastBudgets()})
}

// submit posts a manifest as `aq submit` does in fleet mode.
func (wd *world) submit(ctx context.Context, id, front string) error {
	text := manifestText(id, front, "")
	j, err := manifest.Parse(id+".md", []byte(text), wd.w.cat)
	if err != nil {
		return err
	}
	op, err := wd.operator()
	if err != nil {
		return err
	}
	_, err = op.Submit(ctx, j, []byte(text))
	return err
}

// factory is one fleet factory: its own AQ_HOME and clones of the origins.
type factory struct {
	id    string
	home  string
	base  string
	cfg   *config.Config
	agent *fleet.Agent
	scope string
	wd    *world
	parts func(*fleet.Parts)
	// mutate adjusts the configuration and parts at every build.
	mutate func(*config.Config, *fleet.Parts)
}

// newFactory builds factory id against the world's stub; mutate adjusts its
// configuration and parts.
func (wd *world) newFactory(ctx context.Context, id string, mutate func(*config.Config, *fleet.Parts)) (*factory, error) {
	root := filepath.Join(wd.dir, "factory-"+id)
	f := &factory{id: id, home: filepath.Join(root, "home"), base: filepath.Join(root, "src"), wd: wd}
	var repos []string
	for name, bare := range wd.origins {
		if err := wd.w.clone(ctx, bare, filepath.Join(f.base, name)); err != nil {
			return nil, err
		}
		repos = append(repos, name)
	}
	sort.Strings(repos)
	f.cfg = localConfig(f.home, f.base)
	f.cfg.Fleet, f.cfg.FleetAPI, f.cfg.FleetToken, f.cfg.FactoryID = true, wd.st.API, wd.st.EnrollToken(), id
	f.cfg.Heartbeat, f.cfg.LeaseRenew, f.cfg.Poll = time.Second, 200*time.Millisecond, 50*time.Millisecond
	f.scope = runner.Scope(f.home)
	tokens := []string{"os:linux", "arch:amd64", "engine:script", "has:git"}
	for _, r := range repos {
		tokens = append(tokens, "repo:"+r)
	}
	f.parts = func(p *fleet.Parts) {
		b := fastBudgets()
		p.Budgets = &b
		p.Catalog = wd.w.cat
		p.Host = func(context.Context) (*caps.Host, error) { return caps.FromTokens(tokens), nil }
	}
	f.mutate = mutate
	if err := f.build(); err != nil {
		return nil, err
	}
	return f, nil
}

// build makes (or remakes, as a restarted aq would) the factory's agent.
func (f *factory) build() error {
	w := f.wd.w
	log := logging.Discard()
	if w.o.Log != nil {
		log = w.o.Log.With("selftest", f.wd.name, "factory", f.id)
	}
	var p fleet.Parts
	f.parts(&p)
	if f.mutate != nil {
		f.mutate(f.cfg, &p)
	}
	red := secrets.NewRedactor(w.engineEnv, f.cfg.FleetToken)
	r, err := runner.FromConfig(f.cfg, runner.Parts{Shipper: ship.GH{}, Log: log, Redactor: red, FetchBase: true})
	if err != nil {
		return err
	}
	r.Git, r.Env = w.git, w.engineEnv
	p.Pipeline = r
	a, err := fleet.New(f.cfg, log, red, p)
	if err != nil {
		return err
	}
	f.agent = a
	return nil
}

// id is a job id of this run, tagged with this factory's scope.
func (f *factory) jobID(name string) string { return f.wd.w.id(name, f.scope) }

// runOnce is `aq run --once` in fleet mode.
func (f *factory) runOnce(ctx context.Context) (*fleet.Result, error) {
	var res *fleet.Result
	err := f.agent.Run(ctx, fleet.RunOptions{Once: true}, func(r *fleet.Result) { res = r })
	return res, err
}

// repo is the factory's clone of repository name.
func (f *factory) repo(name string) string { return filepath.Join(f.base, name) }

// enroll gives the factory's client its credentials (as Start does).
func (f *factory) enroll(ctx context.Context) (*fleet.Credentials, error) {
	return fleet.EnsureEnrolled(ctx, f.agent.Client, fleet.EnrollOptions{Path: f.cfg.CredentialsFile(), EnvToken: f.cfg.FleetToken,
		Request: fleet.EnrollRequest{FactoryID: f.id, Capabilities: []string{"os:linux", "engine:script"}, Repos: []string{}, Engines: []string{"script"}, SeatLimit: 1}})
}

// runWaiting submits job id (ship: ship) whose engine writes partial.txt,
// then waits (bounded) for goFile before it writes result.txt; it runs f once
// in the background and returns when the engine has started.
func (wd *world) runWaiting(ctx context.Context, f *factory, id, ship string) (done <-chan runResult, goFile string, err error) {
	started := filepath.Join(wd.dir, id+".started")
	goFile = filepath.Join(wd.dir, id+".go")
	script := fmt.Sprintf("echo partial > partial.txt\ntouch %s\ni=0\nwhile [ ! -f %s ] && [ $i -lt 1200 ]; do sleep 0.05; i=$((i+1)); done\necho result > result.txt",
		shq(started), shq(goFile))
	if err := wd.submit(ctx, id, "repo: app\nengine: script\n"+yamlBlock("script", script)+"\nship: "+ship); err != nil {
		return nil, "", err
	}
	done = f.runOnceBackground(ctx)
	if err := fixture.WaitFor(ctx, "the engine to start", func() bool { return fixture.Exists(started) }); err != nil {
		return nil, "", err
	}
	return done, goFile, nil
}

// takeOver makes factory name and runs it once, for job id that another
// factory failed: the job's processes now carry this factory's scope too.
func (wd *world) takeOver(ctx context.Context, name, id string) (*factory, *fleet.Result, error) {
	f, err := wd.newFactory(ctx, name, nil)
	if err != nil {
		return nil, nil, err
	}
	wd.w.tag(id, f.scope)
	time.Sleep(10 * time.Millisecond) // the stub's 1ms backoff cap
	res, err := f.runOnce(ctx)
	return f, res, err
}

func fileMode(p string) os.FileMode {
	fi, err := os.Stat(p)
	if err != nil {
		return 0
	}
	return fi.Mode().Perm()
}

var errNoResult = errors.New("aq run --once returned no result")
