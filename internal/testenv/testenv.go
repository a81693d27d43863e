// Package testenv is what aq's pipeline tests share: real git repositories
// (with a bare origin) in temp dirs, the aq binary built once per test
// binary, an $AQ_HOME to run it against, manifests, and waits that poll for
// files rather than trusting the clock. Only tests import it; its
// testing-free core, internal/fixture, is shared with aq selftest.
//
// A test package that uses it calls Main from its TestMain, which isolates
// the tests from the host: git reads no global or system configuration, and
// no AQ_* variable of the host leaks into aq.
package testenv

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aqfleet/aq/internal/fixture"
	"github.com/aqfleet/aq/internal/process"
)

// Identity is the git identity the tests' own commits use (the code under
// test never sees it: aq commits as the repository says, else aq <aq@localhost>).
var Identity = []string{
	"GIT_AUTHOR_NAME=Test Person", "GIT_AUTHOR_EMAIL=test@example.com",
	"GIT_COMMITTER_NAME=Test Person", "GIT_COMMITTER_EMAIL=test@example.com",
}

// Token is random per test binary run. Tests put it in the ids of jobs whose
// engines run (see ID): aq finds and kills a job's processes host-wide by
// their AQ_JOB_ID=<id> tag, so two test binaries (go test runs packages in
// parallel), or two parallel tests, running jobs of the same id would kill
// each other's engines.
var Token = fixture.RandomHex(4)

// ID is name made unique to this test binary run: name-<Token> (a name that
// already ends in -<Token> is returned as it is).
func ID(name string) string {
	if strings.HasSuffix(name, "-"+Token) {
		return name
	}
	return name + "-" + Token
}

var (
	scratch  string // per test binary: git config, the built aq
	buildMu  sync.Mutex
	aqBin    string
	buildErr error
	goCache  string // the host's Go build cache, for BuildAQ
)

// Main isolates the test binary from the host and runs the tests:
//
//	func TestMain(m *testing.M) { os.Exit(testenv.Main(m)) }
func Main(m *testing.M) int {
	dir, err := os.MkdirTemp("", "aq-testenv-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "testenv:", err)
		return 1
	}
	scratch = dir
	defer os.RemoveAll(dir)
	for _, kv := range os.Environ() {
		if k, _, _ := strings.Cut(kv, "="); fixture.HostOnly(k) {
			os.Unsetenv(k)
		}
	}
	// A race-enabled process sleeps a second at exit by default (GORACE
	// atexit_sleep_ms), so a test that runs this binary again, as a helper
	// or a sandbox's init, would wait a second for each one that ends. The
	// children inherit this.
	if g := os.Getenv("GORACE"); !strings.Contains(g, "atexit_sleep_ms") {
		os.Setenv("GORACE", strings.TrimSpace(g+" atexit_sleep_ms=0"))
	}
	gitEnv, err := fixture.IsolatedGit(dir)
	if err != nil {
		fmt.Fprintln(os.Stderr, "testenv:", err)
		return 1
	}
	// BuildAQ's go build keeps the host's build cache: the XDG_CACHE_HOME
	// below would otherwise move it to an empty one, and every test binary
	// would compile all of aq afresh (minutes on a loaded machine).
	goCache = os.Getenv("GOCACHE")
	if c, err := os.UserCacheDir(); goCache == "" && err == nil {
		goCache = filepath.Join(c, "go-build")
	}
	// aq's git writes its configuration files under the cache directory
	// (worktree.Git.ConfigDir): the scratch one, not the user's.
	for _, kv := range append(gitEnv, "XDG_CONFIG_HOME="+filepath.Join(dir, "xdg"), "XDG_CACHE_HOME="+filepath.Join(dir, "cache")) {
		k, v, _ := strings.Cut(kv, "=")
		os.Setenv(k, v)
	}
	return m.Run()
}

// Git runs git in dir for a test's own setup and checks, failing the test on
// error, and returns stdout without trailing newlines.
func Git(tb testing.TB, dir string, args ...string) string {
	tb.Helper()
	out, err := GitErr(dir, args...)
	if err != nil {
		tb.Fatalf("git %s (in %s): %v", strings.Join(args, " "), dir, err)
	}
	return out
}

// GitErr is Git that returns the error.
func GitErr(dir string, args ...string) (string, error) {
	return git(context.Background(), dir, args...)
}

// git is the fixture.Git of the tests' own commands: the test identity.
func git(ctx context.Context, dir string, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, "git", args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), Identity...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return stdout.String(), fmt.Errorf("%v: %s", err, strings.TrimSpace(stderr.String()))
	}
	return strings.TrimRight(stdout.String(), "\n"), nil
}

// WriteFile writes content to path, creating parent directories.
func WriteFile(tb testing.TB, path, content string) {
	tb.Helper()
	if err := fixture.WriteFile(path, content); err != nil {
		tb.Fatal(err)
	}
}

// ReadFile returns path's content, failing the test when it cannot be read.
func ReadFile(tb testing.TB, path string) string {
	tb.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		tb.Fatal(err)
	}
	return string(b)
}

// Exists reports whether path exists.
func Exists(path string) bool { return fixture.Exists(path) }

// NewRepo makes a git repository base/name on branch main with files (path →
// content) in one commit, and returns its directory. With no files it gets a
// README.
func NewRepo(tb testing.TB, base, name string, files map[string]string) string {
	tb.Helper()
	dir, err := fixture.NewRepo(context.Background(), git, base, name, files)
	if err != nil {
		tb.Fatalf("new repo %s: %v", name, err)
	}
	return dir
}

// AddOrigin makes a bare repository beside repoDir's parent, adds it as
// repoDir's origin and pushes main to it. It returns the bare repository.
func AddOrigin(tb testing.TB, repoDir string) string {
	tb.Helper()
	bare := filepath.Join(tb.TempDir(), filepath.Base(repoDir)+".git")
	if err := fixture.AddOrigin(context.Background(), git, repoDir, bare); err != nil {
		tb.Fatalf("add origin to %s: %v", repoDir, err)
	}
	return bare
}

// RemoteRefs lists the refs of the repository (or bare repository) dir
// under prefix, as `git ls-remote` shows them: ref → sha.
func RemoteRefs(tb testing.TB, dir, prefix string) map[string]string {
	tb.Helper()
	refs, err := fixture.RemoteRefs(context.Background(), git, dir, prefix)
	if err != nil {
		tb.Fatal(err)
	}
	return refs
}

// TreeFiles returns the files of commit-ish rev in repo dir: path → content.
func TreeFiles(tb testing.TB, dir, rev string) map[string]string {
	tb.Helper()
	out := Git(tb, dir, "ls-tree", "-r", "--name-only", "-z", rev)
	files := map[string]string{}
	for _, p := range strings.Split(out, "\x00") {
		if p == "" {
			continue
		}
		files[p] = Git(tb, dir, "show", rev+":"+p)
	}
	return files
}

// Manifest writes a job manifest <dir>/<id>.md: id, then the front matter
// lines front (YAML, without the --- fences), then a body. It returns the path.
func Manifest(tb testing.TB, dir, id, front string) string {
	tb.Helper()
	path := filepath.Join(dir, id+".md")
	WriteFile(tb, path, fmt.Sprintf("---\nid: %s\n%s\n---\n# job %s\n\nDo the work for %s.\n", id, strings.TrimRight(front, "\n"), id, id))
	return path
}

// WaitFor polls cond until it holds, failing the test with what after
// timeout. The timeout is a deadlock guard, never a speed requirement: give a
// generous one.
func WaitFor(tb testing.TB, timeout time.Duration, what string, cond func() bool) {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	if fixture.WaitFor(ctx, what, cond) != nil {
		tb.Fatalf("timed out after %v waiting for %s", timeout, what)
	}
}

// SyncBuffer is a bytes.Buffer safe for concurrent writers: a log sink, or
// the stdout of a command running in another goroutine.
type SyncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *SyncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

// String is what was written so far.
func (s *SyncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// Slow skips the test under -short (`make unit`), saying why it is slow;
// `make test` runs it. why finishes "skipped under -short: …".
func Slow(tb testing.TB, why string) {
	tb.Helper()
	if testing.Short() {
		tb.Skip("skipped under -short: " + why)
	}
}

// BuildAQ builds the aq binary once per test binary and returns its path:
// the binary as `make build` ships it (CGO_ENABLED=0, no race detector,
// even when the tests run with -race: the race detector covers aq's code
// in the in-process tests; a test that runs the binary tests what users
// run, docs/architecture.md "Tests"). A test that runs the binary is slow
// (a build, then whole processes): it skips under -short.
func BuildAQ(tb testing.TB) string {
	tb.Helper()
	Slow(tb, "builds and runs the aq binary")
	buildMu.Lock()
	defer buildMu.Unlock()
	if aqBin == "" && buildErr == nil {
		aqBin, buildErr = build()
	}
	if buildErr != nil {
		tb.Fatalf("build aq: %v", buildErr)
	}
	return aqBin
}

// PrebuiltEnv names an aq binary that `make race` built once for every
// test package: BuildAQ takes it instead of building its own. A package run
// alone (go test ./pkg) has no such variable and builds its own.
const PrebuiltEnv = "TESTENV_AQ_BINARY"

func build() (string, error) {
	if scratch == "" {
		return "", errors.New("testenv.Main was not called from TestMain")
	}
	if bin := os.Getenv(PrebuiltEnv); bin != "" {
		if fi, err := os.Stat(bin); err != nil || !fi.Mode().IsRegular() {
			return "", fmt.Errorf("%s=%s: not a built aq binary (%v): unset it or run make race", PrebuiltEnv, bin, err)
		}
		return bin, nil
	}
	bin := filepath.Join(scratch, "aq")
	args := []string{"build", "-o", bin, "github.com/aqfleet/aq/cmd/aq"}
	cmd := exec.Command("go", args...)
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if goCache != "" {
		cmd.Env = append(cmd.Env, "GOCACHE="+goCache)
	}
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return bin, nil
}

// Home is one aq installation for a test: $AQ_HOME, $AQ_REPO_BASE and the
// environment the aq binary runs with.
type Home struct {
	Dir      string // AQ_HOME
	RepoBase string // AQ_REPO_BASE
	Bin      string // the aq binary; set by NewHome when built
	// Env is extra environment for aq (KEY=value), after the defaults.
	Env []string
}

// NewHome makes an empty AQ_HOME and AQ_REPO_BASE under a temp dir. The kill
// ladder's grace is 200ms and the poll interval 1s, so stops are quick.
func NewHome(tb testing.TB) *Home {
	tb.Helper()
	root := tb.TempDir()
	h := &Home{Dir: filepath.Join(root, "home"), RepoBase: filepath.Join(root, "src")}
	if err := os.MkdirAll(h.RepoBase, 0o755); err != nil {
		tb.Fatal(err)
	}
	return h
}

// Environ is the environment aq runs with.
func (h *Home) Environ() []string {
	env := append(os.Environ(),
		"AQ_HOME="+h.Dir, "AQ_REPO_BASE="+h.RepoBase,
		"AQ_KILL_GRACE=200ms", "AQ_POLL_SECONDS=1", "AQ_LOG_LEVEL=debug",
	)
	return append(env, h.Env...)
}

// Repo makes a repository under the repo base (see NewRepo).
func (h *Home) Repo(tb testing.TB, name string, files map[string]string) string {
	tb.Helper()
	return NewRepo(tb, h.RepoBase, name, files)
}

// Worktree is where aq puts the job's worktree.
func (h *Home) Worktree(repo, id string) string {
	return filepath.Join(h.Dir, "worktrees", repo, id)
}

// Queue is the stage folder of the local queue.
func (h *Home) Queue(stage string) string { return filepath.Join(h.Dir, "queue", stage) }

// Command is the aq binary with args, in h's environment; it runs in its own
// process group so a test can signal aq alone.
func (h *Home) Command(tb testing.TB, args ...string) *exec.Cmd {
	tb.Helper()
	if h.Bin == "" {
		h.Bin = BuildAQ(tb)
	}
	cmd := exec.Command(h.Bin, args...)
	cmd.Env = h.Environ()
	cmd.Dir = h.RepoBase
	process.SetGroup(cmd)
	return cmd
}

// Result is one finished aq process.
type Result struct {
	Stdout, Stderr string
	Code           int
}

func (r Result) String() string {
	return fmt.Sprintf("exit %d\nstdout:\n%s\nstderr:\n%s", r.Code, r.Stdout, r.Stderr)
}

// Run runs the aq binary to its end (bounded by a generous deadlock guard).
func (h *Home) Run(tb testing.TB, args ...string) Result {
	tb.Helper()
	res, err := h.RunE(tb, args...)
	if err != nil {
		tb.Fatal(err)
	}
	return res
}

// RunE is Run returning its error instead of failing the test, for use from
// goroutines other than the test's (the binary must be built: h.Bin set).
func (h *Home) RunE(tb testing.TB, args ...string) (Result, error) {
	if h.Bin == "" {
		return Result{}, errors.New("testenv: Home.Bin is not set")
	}
	return runCmd(h.Command(tb, args...))
}

// RunCmd runs cmd — an aq command from Command that the test has changed
// (another program in front of it, a namespace of its own), or a process
// group of its own — and returns what it printed and its exit status, as
// Run does; a start failure or a deadlock fails the test.
func RunCmd(tb testing.TB, cmd *exec.Cmd) Result {
	tb.Helper()
	res, err := runCmd(cmd)
	if err != nil {
		tb.Fatal(err)
	}
	return res
}

func runCmd(cmd *exec.Cmd) (Result, error) {
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Start(); err != nil {
		return Result{}, err
	}
	return Wait(cmd, &out, &errb, 3*time.Minute)
}

// Wait waits for an aq started by Command. If it outlives timeout (a
// deadlock), its process group is killed and the error says so. Code is -1
// when a signal ended aq. It may be called from any goroutine.
func Wait(cmd *exec.Cmd, out, errb *bytes.Buffer, timeout time.Duration) (Result, error) {
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		res := Result{Stdout: out.String(), Stderr: errb.String(), Code: cmd.ProcessState.ExitCode()}
		var ee *exec.ExitError
		if err != nil && !errors.As(err, &ee) {
			return res, fmt.Errorf("aq %v: %v", cmd.Args[1:], err)
		}
		return res, nil
	case <-time.After(timeout):
		_ = process.KillGroup(cmd.Process.Pid)
		killed := <-done
		return Result{Stdout: out.String(), Stderr: errb.String(), Code: -1},
			fmt.Errorf("aq %v still running after %v (deadlock?), then %v\nstdout:\n%s\nstderr:\n%s", cmd.Args[1:], timeout, killed, out, errb)
	}
}

// Submit writes the manifest for the job a test calls name, whose id is
// ID(name) (see Manifest), and submits it with the binary, failing the test
// unless aq accepts it.
func (h *Home) Submit(tb testing.TB, name, front string) {
	tb.Helper()
	path := Manifest(tb, tb.TempDir(), ID(name), front)
	if r := h.Run(tb, "submit", path); r.Code != 0 {
		tb.Fatalf("aq submit %s: %s", name, r)
	}
}
