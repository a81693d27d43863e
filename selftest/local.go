package selftest

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"time"

	"github.com/aqfleet/aq/agent/caps"
	"github.com/aqfleet/aq/agent/config"
	"github.com/aqfleet/aq/agent/local"
	"github.com/aqfleet/aq/agent/queue"
	"github.com/aqfleet/aq/agent/runner"
	"github.com/aqfleet/aq/internal/fixture"
	"github.com/aqfleet/aq/internal/logging"
	"github.com/aqfleet/aq/internal/secrets"
	"github.com/aqfleet/aq/job"
)

// killGrace is the kill ladder's step in the pipeline's runs: short, so
// stops are quick.
const killGrace = 150 * time.Millisecond

// localSetup is one aq installation inside the workspace: its own AQ_HOME
// and AQ_REPO_BASE, a local agent built the way `aq run` builds it (with
// git isolated), and a scratch dir the engines' scripts write marks into.
type localSetup struct {
	w     *workspace
	name  string
	dir   string
	home  string
	base  string
	mark  string
	cfg   *config.Config
	a     *local.Agent
	red   *secrets.Redactor
	scope string
}

type localOpt struct {
	parts local.Parts
	env   []string // extra host environment
	// drop removes variables of the host's environment (before env is
	// added): the engine checks keep an operator's engine settings out.
	drop  func(key string) bool
	pass  []string // AQ_ENGINE_ENV: names of env the engines get
	clock func() time.Time
	// config adjusts the installation's configuration before its agent is
	// built (the sandbox's checks: aq as the sandbox's init).
	config func(*config.Config)
}

// newLocal makes an installation called name.
func (w *workspace) newLocal(name string, o localOpt) (*localSetup, error) {
	dir, err := w.dir(name)
	if err != nil {
		return nil, err
	}
	l := &localSetup{w: w, name: name, dir: dir, home: filepath.Join(dir, "home"), base: filepath.Join(dir, "src"), mark: filepath.Join(dir, "mark")}
	for _, d := range []string{l.base, l.mark} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return nil, err
		}
	}
	l.cfg = localConfig(l.home, l.base)
	l.cfg.EngineEnv = o.pass
	if o.config != nil {
		o.config(l.cfg)
	}
	l.scope = runner.Scope(l.home)
	var env []string
	for _, kv := range w.engineEnv {
		if k, _, _ := strings.Cut(kv, "="); o.drop == nil || !o.drop(k) {
			env = append(env, kv)
		}
	}
	env = append(env, o.env...)
	l.red = secrets.NewRedactor(env)
	parts := o.parts
	if parts.Catalog == nil {
		parts.Catalog = w.cat
	}
	a, err := local.New(l.cfg, logging.Discard(), l.red, parts)
	if err != nil {
		return nil, err
	}
	if w.o.Log != nil {
		a.Log = w.o.Log.With("selftest", name)
		a.Runner.Log = a.Log
	}
	a.Runner.Git = w.git
	a.Runner.Env = env
	// What this installation offers: fixed, so that the engines installed
	// on the host (and their slow --version probes) play no part here;
	// host.caps.detect checks the real detection.
	host := caps.FromTokens([]string{"os:" + runtime.GOOS, "arch:" + runtime.GOARCH, "engine:script", "has:git"})
	a.Host = func(context.Context) (*caps.Host, error) { return host, nil }
	if o.clock != nil {
		q, err := queue.Open(l.cfg.QueueDir(), queue.WithParser(a.Parse), queue.WithClock(o.clock))
		if err != nil {
			return nil, err
		}
		a.Queue = q
	}
	l.a = a
	return l, nil
}

// newLocal is a scenario's set-up: installation name with repositories
// repos (each with a README, no origin) under its repo base. When it cannot
// be made the scenario is stopped (setupFailed) and newLocal returns nil.
func (s *session) newLocal(ctx context.Context, name string, o localOpt, repos ...string) *localSetup {
	l, err := s.ws.newLocal(name, o)
	for _, r := range repos {
		if err == nil {
			_, _, err = l.repo(ctx, r, nil, false)
		}
	}
	if err != nil {
		s.setupFailed(err)
		return nil
	}
	return l
}

// localConfig is the configuration of a throw-away installation.
func localConfig(home, base string) *config.Config {
	return &config.Config{
		Home: home, RepoBase: base, KillGrace: killGrace, Poll: time.Second, ClaudePermissionMode: "acceptEdits",
		FleetRoute: true, LogFormat: "text", LogLevel: "info", GCWIPRetention: 336 * time.Hour, Slots: 1, WorktreePool: 1,
		Heartbeat: 30 * time.Second, LeaseRenew: 30 * time.Second, SBTopic: "fleet-dispatch", FactoryID: "selftest",
		// The pipeline checks run script jobs, in fleet mode too: opted in
		// (AQ_ENGINES=all).
		Engines:      config.EngineNames,
		VerifyRounds: job.DefaultVerifyRounds, // AQ_VERIFY_ROUNDS's default, as an installation has it
	}
}

// id is a job id of this run, tagged with this installation's scope.
func (l *localSetup) id(name string) string { return l.w.id(name, l.scope) }

// repoDir is where repository name is (or goes) under the repo base.
func (l *localSetup) repoDir(name string) string { return filepath.Join(l.base, name) }

// repo makes a repository under the installation's repo base.
func (l *localSetup) repo(ctx context.Context, name string, files map[string]string, origin bool) (string, string, error) {
	return l.w.newRepo(ctx, l.base, name, files, origin)
}

// manifestText is a job manifest: id, then front matter lines, then a body.
func manifestText(id, front, body string) string {
	if body == "" {
		body = "# Selftest job " + id + "\n\nDo the work for " + id + ".\n"
	}
	return fmt.Sprintf("---\nid: %s\n%s\n---\n%s", id, front, body)
}

// submit writes a manifest and submits it to the local queue.
func (l *localSetup) submit(id, front, body string) (*job.Job, error) {
	text := manifestText(id, front, body)
	path := filepath.Join(l.dir, "manifests", id+".md")
	if err := fixture.WriteFile(path, text); err != nil {
		return nil, err
	}
	j, err := l.a.Parse(path)
	if err != nil {
		return nil, fmt.Errorf("manifest of %s: %w", id, err)
	}
	if _, err := l.a.Queue.Submit(j, []byte(text)); err != nil {
		return nil, fmt.Errorf("submit %s: %w", id, err)
	}
	return j, nil
}

// runOne runs the next job and checks it is the expected one.
func (l *localSetup) runOne(ctx context.Context, id string) (*local.Result, error) {
	res, err := l.a.RunOne(ctx)
	if err != nil {
		return res, fmt.Errorf("aq run --once: %w", err)
	}
	if res.JobID != id {
		return res, fmt.Errorf("aq run took job %s, want %s", res.JobID, id)
	}
	return res, nil
}

// state is a job's sidecar.
func (l *localSetup) state(id string) (queue.State, error) {
	e, err := l.a.Queue.Get(id)
	if err != nil {
		return queue.State{}, err
	}
	return e.State, nil
}

// worktreePath is where aq puts a job's worktree.
func (l *localSetup) worktreePath(repo, id string) string {
	return filepath.Join(l.cfg.WorktreesDir(), repo, id)
}

// markFile is a file in the scratch dir.
func (l *localSetup) markFile(name string) string { return filepath.Join(l.mark, name) }

// outcomeText describes a run's result in a few words.
func outcomeText(r *local.Result) string {
	if r == nil {
		return "no result"
	}
	o := r.Outcome
	if o.Failed() {
		return fmt.Sprintf("%s (%s: %s)", r.Stage, o.Reason, o.Detail)
	}
	return string(r.Stage)
}
