package runner_test

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/aqfleet/aq/agent/runner"
	"github.com/aqfleet/aq/engines"
	"github.com/aqfleet/aq/internal/sandbox"
	"github.com/aqfleet/aq/internal/testenv"
	"github.com/aqfleet/aq/job"
)

// sandboxed gives f's runner a real sandbox, the test binary as aq (its
// init and the engine's supervisor).
func sandboxed(t *testing.T, f *fixture, mode sandbox.Mode) {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	f.r.Cfg.Supervisor = exe
	f.r.Sandbox = sandbox.Open(sandbox.Options{Init: exe, Mode: mode})
}

// TestSandboxedRun: a job's engine and its verify run in the job's
// sandbox — their own HOME and TMPDIR, not root, $MARK (outside the
// worktree) out of reach, $AQ_HOME hidden — the job's work is committed,
// and the job's own directory is gone after the run.
func TestSandboxedRun(t *testing.T) {
	testenv.Slow(t, "runs whole jobs with real git, processes and waits")
	f := newFixture(t)
	sandboxed(t, f, sandbox.ModeAuto)
	if lvl := f.r.Sandbox.Level(); lvl != sandbox.LevelFull {
		t.Skipf("this host sandboxes at level %s", lvl)
	}
	j := f.job("sandboxed", `echo "home=$HOME tmp=$TMPDIR uid=$(id -u) sandbox=$IS_SANDBOX" > seen.txt
touch "$MARK/escaped" 2>/dev/null && echo escaped >> seen.txt
ls "`+f.home.Dir+`/queue" >/dev/null 2>&1 && echo aqhome >> seen.txt
echo work > work.txt`)
	j.Verify = `test -f work.txt && test "$(id -u)" != 0 && ! touch "$MARK/verify-escaped" 2>/dev/null`
	out := f.run(context.Background(), j, runner.Options{Attempt: 1})
	if out.Failed() {
		t.Fatalf("the sandboxed job failed: %s %s", out.Reason, out.Detail)
	}
	files := testenv.TreeFiles(t, f.repo, out.Commit)
	seen := files["seen.txt"]
	home, _ := os.UserHomeDir()
	if !strings.Contains(seen, "home="+home+" tmp=/tmp") || strings.Contains(seen, "uid=0 ") || !strings.Contains(seen, "sandbox=1") {
		t.Errorf("the engine's view: %q", seen)
	}
	if strings.Contains(seen, "escaped") || strings.Contains(seen, "aqhome") {
		t.Errorf("the engine reached outside its sandbox: %q", seen)
	}
	for _, m := range []string{"escaped", "verify-escaped"} {
		if testenv.Exists(f.marker(m)) {
			t.Errorf("%s exists: a write left the sandbox", f.marker(m))
		}
	}
	if files["work.txt"] != "work" {
		t.Errorf("the job's work: %q", files["work.txt"])
	}
	if ents, _ := os.ReadDir(filepath.Join(f.home.Dir, "sandbox")); len(ents) != 0 {
		t.Errorf("the job's sandbox directory is left: %v", ents)
	}
}

// TestSandboxRefusedOn: under AQ_SANDBOX=on, a host that cannot sandbox
// fully (here: no aq executable to run the sandbox's init with) refuses
// the job before any worktree — sandbox_unavailable, retryable.
func TestSandboxRefusedOn(t *testing.T) {
	f := newFixture(t)
	f.r.Sandbox = sandbox.Open(sandbox.Options{Mode: sandbox.ModeOn})
	j := f.job("refused", "echo x > x.txt")
	out := f.run(context.Background(), j, runner.Options{Attempt: 1})
	if out.Reason != job.ReasonSandboxUnavailable || !strings.Contains(out.Detail, "AQ_SANDBOX=on") {
		t.Fatalf("outcome %s %q, want sandbox_unavailable naming AQ_SANDBOX=on", out.Reason, out.Detail)
	}
	if !job.Retryable(out.Reason, 1, job.Retry{}) || !out.Reason.Infrastructure() {
		t.Error("sandbox_unavailable is not retried as an infrastructure failure")
	}
	if testenv.Exists(f.wt("refused")) {
		t.Error("a worktree was made for a refused job")
	}
}

// hiddenEngine is an engine whose binary lies where the sandbox hides it
// (under $AQ_HOME) and that aq does not know to show: its sandbox cannot
// start it.
type hiddenEngine struct{ bin string }

func (e hiddenEngine) Name() string { return "hidden" }
func (e hiddenEngine) Preflight(context.Context, engines.Spec) (engines.Info, error) {
	return engines.Info{Name: "hidden", Version: "1"}, nil
}
func (e hiddenEngine) Run(ctx context.Context, spec engines.Spec) (engines.Result, error) {
	res, err := engines.Exec(ctx, spec, engines.Invocation{Path: e.bin})
	if err != nil {
		return engines.Result{}, err
	}
	return engines.Result{Outcome: engines.Succeeded, Process: res}, nil
}

// TestSandboxStartFails: an engine whose sandbox does not start fails the
// job sandbox_unavailable, with its worktree and its checkpoint left as
// they are and nothing running.
func TestSandboxStartFails(t *testing.T) {
	testenv.Slow(t, "runs whole jobs with real git, processes and waits")
	f := newFixture(t)
	bin := filepath.Join(f.home.Dir, "bin", "hidden-engine")
	testenv.WriteFile(t, bin, "#!/bin/sh\necho ran > ran.txt\n")
	if err := os.Chmod(bin, 0o755); err != nil {
		t.Fatal(err)
	}
	f.r.Engines = engines.NewRegistry(&engines.Script{}, hiddenEngine{bin: bin})
	sandboxed(t, f, sandbox.ModeAuto)
	if lvl := f.r.Sandbox.Level(); lvl != sandbox.LevelFull {
		t.Skipf("this host sandboxes at level %s", lvl)
	}
	j := f.job("unstartable", "")
	j.Engine = "hidden"
	out := f.run(context.Background(), j, runner.Options{Attempt: 1})
	if out.Reason != job.ReasonSandboxUnavailable || !strings.Contains(out.Detail, "did not start in its sandbox") {
		t.Fatalf("outcome %s %q, want sandbox_unavailable", out.Reason, out.Detail)
	}
	if !testenv.Exists(f.wt("unstartable")) && !out.Pooled {
		t.Error("the worktree is gone")
	}
	if out.Checkpoint == "" && f.wip("unstartable") == "" {
		t.Error("no checkpoint of the worktree")
	}
	if testenv.Exists(filepath.Join(f.wt("unstartable"), "ran.txt")) {
		t.Error("the engine ran")
	}
}

// fakeEgress stands in for internal/egress behind the runner's Egress:
// an HTTP server on the job's unix socket that answers every request.
type fakeEgress struct {
	t           *testing.T
	job, engine string
	tcp, closed bool
	srv         *http.Server
}

func (e *fakeEgress) Start(_ context.Context, jobID, engine, sock string, tcp bool, _ func(job.EgressRefusal)) (runner.EgressProxy, error) {
	e.job, e.engine, e.tcp = jobID, engine, tcp
	ln, err := net.Listen("unix", sock)
	if err != nil {
		return nil, err
	}
	e.srv = &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "via the job's proxy: %s\n", r.URL.Host)
	})}
	go e.srv.Serve(ln)
	return e, nil
}
func (e *fakeEgress) Port() int                     { return 0 }
func (e *fakeEgress) Refusals() []job.EgressRefusal { return nil }
func (e *fakeEgress) Close() error                  { e.closed = true; return e.srv.Close() }

// TestSandboxedRunReachesItsProxy: with an egress proxy, the sandboxed
// engine finds it through its proxy variables (the bridge inside its
// network namespace) and nothing else; the proxy ends with the run.
func TestSandboxedRunReachesItsProxy(t *testing.T) {
	testenv.Slow(t, "runs whole jobs with real git, processes and waits")
	f := newFixture(t)
	sandboxed(t, f, sandbox.ModeAuto)
	if lvl := f.r.Sandbox.Level(); lvl != sandbox.LevelFull {
		t.Skipf("this host sandboxes at level %s", lvl)
	}
	eg := &fakeEgress{t: t}
	f.r.Egress = eg
	j := f.job("proxied", `echo "$HTTPS_PROXY" > proxy.txt
bash -c 'exec 3<>/dev/tcp/127.0.0.1/3128 && printf "GET http://registry.example/pkg HTTP/1.0\r\n\r\n" >&3 && cat <&3' > answer.txt`)
	out := f.run(context.Background(), j, runner.Options{Attempt: 1})
	if out.Failed() {
		t.Fatalf("the job failed: %s %s", out.Reason, out.Detail)
	}
	files := testenv.TreeFiles(t, f.repo, out.Commit)
	if files["proxy.txt"] != "http://127.0.0.1:3128" || !strings.Contains(files["answer.txt"], "via the job's proxy: registry.example") {
		t.Errorf("the engine's proxy: %q, its answer %q", files["proxy.txt"], files["answer.txt"])
	}
	if eg.job != j.ID || eg.engine != "script" || eg.tcp || !eg.closed {
		t.Errorf("the proxy: started for %q (%q, tcp %v), closed %v", eg.job, eg.engine, eg.tcp, eg.closed)
	}
}

// TestJobDirMadeAfreshForEveryRun: what a crashed run's engine planted in
// the job's directory (a file in its home and tmp, a link in place of a
// login copy, a FIFO) is gone when the next run of the job starts — the
// engine sees none of it, and the link's target is untouched. Before
// sandbox.FreshJobDir the directory was reused as it was.
func TestJobDirMadeAfreshForEveryRun(t *testing.T) {
	testenv.Slow(t, "runs whole jobs with real git, processes and waits")
	f := newFixture(t)
	sandboxed(t, f, sandbox.ModeAuto)
	if lvl := f.r.Sandbox.Level(); lvl == sandbox.LevelNone {
		t.Skip("this host cannot sandbox")
	}
	j := f.job("afresh", `for f in "$HOME/planted" "$TMPDIR/planted" "$HOME/.claude/.credentials.json" "$HOME/fifo"; do
  if [ -e "$f" ] || [ -L "$f" ]; then echo "$f" >> seen.txt; fi
done
echo work > work.txt`)
	dir := filepath.Join(f.home.Dir, "sandbox", j.ID)
	victim := f.marker("victim")
	os.WriteFile(victim, []byte("keep"), 0o600)
	for _, d := range []string{"home/.claude", "tmp"} {
		os.MkdirAll(filepath.Join(dir, d), 0o700)
	}
	os.WriteFile(filepath.Join(dir, "home", "planted"), []byte("x"), 0o600)
	os.WriteFile(filepath.Join(dir, "tmp", "planted"), []byte("x"), 0o600)
	os.Symlink(victim, filepath.Join(dir, "home", ".claude", ".credentials.json"))
	if err := syscall.Mkfifo(filepath.Join(dir, "home", "fifo"), 0o600); err != nil {
		t.Fatal(err)
	}
	out := f.run(context.Background(), j, runner.Options{Attempt: 2})
	if out.Failed() {
		t.Fatalf("the job failed: %s %s", out.Reason, out.Detail)
	}
	files := testenv.TreeFiles(t, f.repo, out.Commit)
	if seen, ok := files["seen.txt"]; ok {
		t.Errorf("the engine saw what the previous run planted:\n%s", seen)
	}
	if files["work.txt"] != "work" {
		t.Errorf("the job's work: %q", files["work.txt"])
	}
	if b, _ := os.ReadFile(victim); string(b) != "keep" {
		t.Errorf("the planted link's target changed: %q", b)
	}
}

// TestSandboxHiddenPathSaysSo (#34): a script: file or a verify: program
// under /tmp is there on the host, but /tmp is the job's own inside the
// sandbox, so the shell says "not found" (exit 127): the failure's detail
// names the path, why it is hidden and the fix, instead of reading as a
// missing command or a failed check.
func TestSandboxHiddenPathSaysSo(t *testing.T) {
	testenv.Slow(t, "runs whole jobs with real git, processes and waits")
	const why = " (/tmp is the job's own inside the sandbox): put it in the repository, name its folder in AQ_SANDBOX_WRITABLE, or set AQ_SANDBOX=off"
	for _, tc := range []struct {
		name   string
		reason job.Reason
		job    func(f *fixture, hidden string) *job.Job
		want   func(j *job.Job, hidden string) string
	}{
		{"script", job.ReasonNoEngine,
			func(f *fixture, hidden string) *job.Job { return f.job("hidden-script", hidden) },
			func(_ *job.Job, hidden string) string {
				return "script command not found (exit 127): fix script: or install the command; the sandbox hides " + hidden + why
			}},
		{"verify", job.ReasonVerifyFailed,
			func(f *fixture, hidden string) *job.Job {
				j := f.job("hidden-verify", "echo work > work.txt")
				j.Verify, j.VerifyRounds = hidden, rounds(0)
				return j
			},
			func(j *job.Job, hidden string) string {
				return "exited 127 (see aq job logs " + j.ID + "); the sandbox hides " + hidden + why
			}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t)
			sandboxed(t, f, sandbox.ModeAuto)
			if lvl := f.r.Sandbox.Level(); lvl != sandbox.LevelFull {
				t.Skipf("this host sandboxes at level %s", lvl)
			}
			dir, err := os.MkdirTemp("/tmp", "aq-hidden-")
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { os.RemoveAll(dir) })
			hidden := filepath.Join(dir, tc.name+".sh")
			testenv.WriteFile(t, hidden, "echo done > done.txt\n")
			if err := os.Chmod(hidden, 0o755); err != nil {
				t.Fatal(err)
			}
			j := tc.job(f, hidden)
			out := f.run(context.Background(), j, runner.Options{Attempt: 1})
			if want := tc.want(j, hidden); out.Reason != tc.reason || !strings.Contains(out.Detail, want) {
				t.Errorf("outcome %s %q, want %s with\n%s", out.Reason, out.Detail, tc.reason, want)
			}
		})
	}
}
