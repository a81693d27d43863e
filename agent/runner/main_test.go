package runner_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aqfleet/aq/agent/runner"
	"github.com/aqfleet/aq/engines"
	"github.com/aqfleet/aq/internal/process"
	"github.com/aqfleet/aq/internal/sandbox"
	"github.com/aqfleet/aq/internal/secrets"
	"github.com/aqfleet/aq/internal/testenv"
	"github.com/aqfleet/aq/job"
	"github.com/aqfleet/aq/worktree"
)

// TestMain lets the test binary stand in for aq in the sandboxed tests
// (sandbox_linux_test.go): re-executed, it is the sandbox's init or the
// engine's supervisor.
func TestMain(m *testing.M) {
	if code, ok := sandbox.MaybeInit(); ok {
		os.Exit(code)
	}
	if code, ok := process.MaybeSupervise(); ok {
		os.Exit(code)
	}
	os.Exit(testenv.Main(m))
}

// The runner's tests use real parts: git repositories in temp dirs, the
// script engine running /bin/sh, the process layer's kill ladder. Scripts
// leave markers in $MARK (outside the worktree) for the test to wait on.

// baseFiles is the repository every test starts from: tracked files, one of
// them to be deleted, and a .gitignore.
var baseFiles = map[string]string{
	"README.md":      "# app\n",
	"keep.txt":       "one\ntwo\nthree\n",
	"doomed.txt":     "to be deleted\n",
	"src/main.go":    "package main\n",
	".gitignore":     "*.log\nbuild/\n",
	"docs/guide.txt": "guide\n",
}

// writeAll is a script fragment that leaves every kind of change in the
// worktree: a tracked file changed, one deleted, untracked files (one in a
// new directory), and ignored ones that a checkpoint must not record.
const writeAll = `echo changed >> keep.txt
rm doomed.txt
echo new > new.txt
mkdir -p deep/er && echo nested > deep/er/file.txt
echo noise > debug.log
mkdir -p build && echo obj > build/out.o
`

// wantAll checks that files (a commit's tree) hold exactly writeAll's work.
func wantAll(t *testing.T, what string, files map[string]string) {
	t.Helper()
	if got := files["keep.txt"]; got != "one\ntwo\nthree\nchanged" {
		t.Errorf("%s: keep.txt = %q, want the engine's change", what, got)
	}
	if _, ok := files["doomed.txt"]; ok {
		t.Errorf("%s: doomed.txt is still there; the deletion was lost", what)
	}
	if files["new.txt"] != "new" || files["deep/er/file.txt"] != "nested" {
		t.Errorf("%s: untracked files missing: new.txt=%q deep/er/file.txt=%q", what, files["new.txt"], files["deep/er/file.txt"])
	}
	for _, p := range []string{"debug.log", "build/out.o"} {
		if _, ok := files[p]; ok {
			t.Errorf("%s: the ignored file %s was recorded", what, p)
		}
	}
	for p, c := range baseFiles {
		if p == "keep.txt" || p == "doomed.txt" {
			continue
		}
		if files[p] != strings.TrimRight(c, "\n") {
			t.Errorf("%s: %s = %q, want it untouched", what, p, files[p])
		}
	}
}

// fixture is one AQ_HOME with one repository "app" and a runner.
type fixture struct {
	t    *testing.T
	home *testenv.Home
	repo string // $AQ_REPO_BASE/app
	mark string // $MARK: where scripts leave markers
	r    *runner.Runner
}

// engineList adds engines beside the script engine.
type engineList []engines.Engine

func newFixture(t *testing.T, extra ...engines.Engine) *fixture {
	t.Helper()
	h := testenv.NewHome(t)
	f := &fixture{t: t, home: h, repo: h.Repo(t, "app", baseFiles), mark: t.TempDir()}
	env := append(os.Environ(), "MARK="+f.mark)
	f.r = &runner.Runner{
		// MARK reaches the engines as an operator passes a variable:
		// AQ_ENGINE_ENV (an engine's environment is built, not inherited).
		Cfg:      runner.Config{Home: h.Dir, RepoBase: h.RepoBase, Grace: 200 * time.Millisecond, PoolSize: 1, EngineEnv: []string{"MARK"}},
		Engines:  engines.NewRegistry(append(engineList{&engines.Script{}}, extra...)...),
		Log:      testLogger(t),
		Redactor: secrets.NewRedactor(env),
		Env:      env,
	}
	return f
}

// id is the job id a test's name for a job stands for: unique to this test
// binary run (testenv.ID), so that no other test's job shares its tag.
func (f *fixture) id(name string) string {
	if strings.HasSuffix(name, "-"+testenv.Token) {
		return name
	}
	return testenv.ID(name)
}

// job is a script job on app that ships nowhere, with a 2-minute wall; its
// id is f.id(name).
func (f *fixture) job(name, script string) *job.Job {
	id := f.id(name)
	return &job.Job{
		ID: id, Title: "job " + id, Repo: "app", Base: "main", Engine: "script", Script: script,
		Ship: "none", Body: "Do the work for " + id + ".\n", DepsMode: "all",
		Budget: job.Budget{Wall: job.Duration(2 * time.Minute)},
	}
}

func (f *fixture) run(ctx context.Context, j *job.Job, o runner.Options) runner.Outcome {
	f.t.Helper()
	if o.Attempt == 0 {
		o.Attempt = 1
	}
	out := f.r.Run(ctx, j, o)
	f.t.Logf("outcome of %s: stage %s reason %q detail %q checkpoint %s commit %s", j.ID, out.Stage, out.Reason, out.Detail, out.Checkpoint, out.Commit)
	noTagged(f.t, j.ID)
	return out
}

func (f *fixture) wt(name string) string { return f.home.Worktree("app", f.id(name)) }

// wip is the commit aq/wip/<id> points at in the repository ("" if none).
func (f *fixture) wip(name string) string {
	f.t.Helper()
	sha, err := testenv.GitErr(f.repo, "rev-parse", "-q", "--verify", "refs/heads/aq/wip/"+f.id(name))
	if err != nil {
		return ""
	}
	return sha
}

func (f *fixture) marker(name string) string { return filepath.Join(f.mark, name) }

// waitMarker waits for a script's marker file (a deadlock guard, not a
// speed requirement).
func (f *fixture) waitMarker(name string) {
	f.t.Helper()
	testenv.WaitFor(f.t, time.Minute, "marker "+name, func() bool { return testenv.Exists(f.marker(name)) })
}

// noTagged fails the test if any process still carries the job's tag.
func noTagged(t *testing.T, id string) {
	t.Helper()
	pids, err := process.FindTagged(id)
	if err != nil {
		t.Fatalf("FindTagged: %v", err)
	}
	if len(pids) > 0 {
		t.Errorf("processes tagged AQ_JOB_ID=%s still alive after the job: %v", id, pids)
	}
}

func readPid(t *testing.T, path string) int {
	t.Helper()
	pid, err := strconv.Atoi(strings.TrimSpace(testenv.ReadFile(t, path)))
	if err != nil {
		t.Fatalf("pid file %s: %v", path, err)
	}
	return pid
}

// testLogger sends the runner's log lines to the test log.
func testLogger(t *testing.T) *slog.Logger {
	w := &tlog{t: t}
	t.Cleanup(func() { w.mu.Lock(); w.done = true; w.mu.Unlock() })
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

type tlog struct {
	mu   sync.Mutex
	t    *testing.T
	done bool
}

func (w *tlog) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.done {
		w.t.Log(strings.TrimRight(string(p), "\n"))
	}
	return len(p), nil
}

// funcEngine is an engines.Engine made of functions, for what a script
// cannot do (panic inside aq).
type funcEngine struct {
	name string
	run  func(ctx context.Context, spec engines.Spec) (engines.Result, error)
}

var _ engines.Engine = (*funcEngine)(nil)

func (e *funcEngine) Name() string { return e.name }

func (e *funcEngine) Preflight(context.Context, engines.Spec) (engines.Info, error) {
	return engines.Info{Name: e.name, Version: "test"}, nil
}

func (e *funcEngine) Run(ctx context.Context, spec engines.Spec) (engines.Result, error) {
	return e.run(ctx, spec)
}

// branchExists reports whether refs/heads/<b> exists in dir.
func branchExists(t *testing.T, dir, b string) bool {
	ok, err := worktree.BranchExists(context.Background(), worktree.Git{}, dir, b)
	if err != nil {
		t.Fatal(err)
	}
	return ok
}

// snapshotDir is every file under dir (but .git) with its content and mode,
// for byte-identical comparisons.
func snapshotDir(t *testing.T, dir string) map[string]string {
	t.Helper()
	snap := map[string]string{}
	err := filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		if d.IsDir() {
			if rel == ".git" {
				return filepath.SkipDir
			}
			return nil
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		snap[rel] = fmt.Sprintf("%v %q", info.Mode(), b)
		return nil
	})
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		t.Fatal(err)
	}
	return snap
}

func sortedKeys(m map[string]string) []string {
	ks := make([]string, 0, len(m))
	for k := range m {
		ks = append(ks, k)
	}
	slices.Sort(ks)
	return ks
}

// startTagged starts sh -c script in dir as a job's process would run: in
// its own process group, tagged AQ_JOB_ID=id. It returns the pid; the test's
// cleanup kills the group whatever happened.
func startTagged(t *testing.T, id, dir, script string, env ...string) int {
	t.Helper()
	cmd := exec.Command("/bin/sh", "-c", script)
	cmd.Dir = dir
	cmd.Env = append(append(os.Environ(), env...), process.TagEnv+"="+id)
	process.SetGroup(cmd)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	pid := cmd.Process.Pid
	go cmd.Wait() // reap it when it dies, so it does not linger as a zombie
	t.Cleanup(func() { _ = process.KillGroup(pid) })
	return pid
}
