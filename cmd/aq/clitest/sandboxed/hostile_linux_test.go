package sandboxed

import (
	"encoding/json"
	"maps"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/aqfleet/aq/cmd/aq/clitest"
	"github.com/aqfleet/aq/demo/coord"
	"github.com/aqfleet/aq/internal/sandbox"
	"github.com/aqfleet/aq/internal/sandbox/hostile"
	"github.com/aqfleet/aq/internal/testenv"
	"github.com/aqfleet/aq/job"
)

// TestHostileEngine is the hostile-engine suite of docs/sandbox.md: a real
// job whose engine (internal/sandbox/hostile's script) tries every escape
// — read $AQ_HOME, the credentials, another job, another worktree, another
// repository, the user's keys; write outside its worktree; plant a hook
// and core.fsmonitor in the repository's shared .git; reach a loopback
// port, the coordinator, a host no job is allowed; see and signal aq;
// leave a daemonised straggler — and still does the job. Sandboxed (the
// default, auto: full on this host) every escape fails and the job ships;
// the same job with AQ_SANDBOX=off shows each escape succeeding, so the
// test can tell. Two things hold in both modes: aq's settings and the
// factory's tokens ($AQ_HOME, $GH_TOKEN) are not in the engine's
// environment (it is built: docs/engines.md; hostile.Always), and aq's own
// git runs neither the hook nor the core.fsmonitor the engine planted (its
// git is hardened: docs/sandbox.md) — unsandboxed, a plain git then shows
// both plants live. aq selftest judges the same script the same way
// (hostile.Denied).
func TestHostileEngine(t *testing.T) {
	if b, err := os.ReadFile("/proc/sys/user/max_user_namespaces"); err == nil && strings.TrimSpace(string(b)) == "0" {
		t.Skip("user namespaces are blocked on this host: no full sandbox to test")
	}
	t.Run("sandboxed", func(t *testing.T) { hostileRun(t, "auto") })
	t.Run("off", func(t *testing.T) { hostileRun(t, "off") })
}

// hostileWorld is what the hostile engine tries to reach.
type hostileWorld struct {
	h                        *testenv.Home
	args                     hostile.Args
	id                       string
	loopback, forbidden, hit *atomic.Int64
}

func hostileRun(t *testing.T, mode string) {
	w := hostileWorld{h: clitest.BinHome(t)}
	h := w.h
	w.args = hostile.Args{AQHome: h.Dir, RepoBase: h.RepoBase, UserHome: t.TempDir(), AQBin: h.Bin,
		Nonce: strconv.FormatInt(time.Now().UnixNano(), 36), Repo: "app"}
	h.Env = append(h.Env, "HOME="+w.args.UserHome, "AQ_SANDBOX="+mode, "AQ_WORKTREE_POOL=0", "GH_TOKEN=ghp_hostiletestfaketoken")
	t.Cleanup(func() {
		killMarked(w.args.StragglerMark())
		for _, p := range w.args.Writes() {
			os.Remove(p)
		}
		_, hookRan, fsmonitorRan := w.args.Plants()
		os.Remove(hookRan)
		os.Remove(fsmonitorRan)
	})
	for path, content := range map[string]string{
		".ssh/id_ed25519":      "-----BEGIN OPENSSH PRIVATE KEY----- fake",
		".aws/credentials":     "[default]\naws_secret_access_key = fake",
		".config/gh/hosts.yml": "github.com:\n  oauth_token: gho_fake",
	} {
		testenv.WriteFile(t, filepath.Join(w.args.UserHome, path), content)
	}
	testenv.WriteFile(t, filepath.Join(h.Dir, "credentials"), "factory-token-fake")
	// The engine is the script, committed to the job's repository: the
	// sandbox shows the engine its worktree.
	h.Repo(t, "app", map[string]string{"README.md": "app\n", "hostile.sh": hostile.Script})
	h.Repo(t, "other", map[string]string{"secret.txt": "another product's secret\n"})

	w.args.Port, w.loopback = countingListener(t, "127.0.0.1")
	w.args.ForbiddenPort, w.forbidden = countingListener(t, "127.0.0.2")
	stub, err := coord.New(coord.Options{})
	if err != nil {
		t.Fatal(err)
	}
	w.hit = new(atomic.Int64)
	cs := httptest.NewServer(http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		w.hit.Add(1)
		stub.ServeHTTP(rw, r)
	}))
	t.Cleanup(cs.Close)
	w.args.CoordPort = cs.Listener.Addr().(*net.TCPAddr).Port

	// Another job first: its manifest, logs and worktree stay in $AQ_HOME.
	h.Submit(t, "other-job", clitest.ScriptJob("other", "echo other > other-work.txt", "ship: branch"))
	if r := h.Run(t, "run", "--once"); r.Code != 0 {
		t.Fatalf("the other job: %s", r)
	}
	h.Submit(t, "hostile", clitest.ScriptJob("app", w.args.Command("hostile.sh"), "ship: branch", "retry: {max: 0}"))
	w.id = testenv.ID("hostile")
	r := h.Run(t, "run", "--once")
	if r.Code != 0 {
		t.Fatalf("the hostile job did not ship: %s", r)
	}
	if v := show(t, h, "hostile"); v.State.Stage != job.Shipped {
		t.Fatalf("the hostile job is %s, want shipped", v.State.Stage)
	}
	if got := testenv.Git(t, filepath.Join(h.RepoBase, "app"), "show", job.JobBranch(w.id)+":result.txt"); got != "done by a hostile engine" {
		t.Fatalf("the job's work on its branch: %q", got)
	}
	probes := hostile.Parse(testenv.ReadFile(t, filepath.Join(h.Dir, "logs", w.id, "stdout.log")))
	if len(probes) == 0 {
		t.Fatalf("no probe ran: %s", testenv.ReadFile(t, filepath.Join(h.Dir, "logs", w.id, "stdout.log")))
	}
	t.Logf("AQ_SANDBOX=%s: %v", mode, probes)
	w.checkAlways(t, probes)
	if mode == "off" {
		w.checkEscaped(t, probes)
		return
	}
	if !strings.Contains(r.Stderr, "engines run in a full sandbox") {
		t.Fatalf("aq did not say it runs engines in a full sandbox:\n%s", r.Stderr)
	}
	w.checkContained(t, probes)
}

// checkAlways checks what holds in both modes: the probes hostile.Always
// denied, and neither plant run by aq's own git.
func (w hostileWorld) checkAlways(t *testing.T, probes map[string]string) {
	t.Helper()
	for _, p := range hostile.Always {
		if probes[p] != "denied" {
			t.Errorf("escape %s: %q, want denied in every mode (the engine's environment is built: docs/engines.md)", p, probes[p])
		}
	}
	_, hookRan, fsmonitorRan := w.args.Plants()
	for what, marker := range map[string]string{"the planted post-commit hook": hookRan, "the planted core.fsmonitor": fsmonitorRan} {
		if testenv.Exists(marker) {
			t.Errorf("aq's git ran %s (%s exists)", what, marker)
		}
	}
}

func (w hostileWorld) checkContained(t *testing.T, probes map[string]string) {
	t.Helper()
	for _, g := range sandbox.Guarantees {
		for _, e := range hostile.Escaped(hostile.Denied(sandbox.LevelFull, g), probes) {
			t.Errorf("escape %s inside the sandbox (guarantee %s), want denied", e, g)
		}
	}
	// What lands in the job's own $HOME and /tmp stays there.
	hook, _, _ := w.args.Plants()
	for _, p := range append(slices.Collect(maps.Values(w.args.Writes())), hook) {
		if testenv.Exists(p) {
			t.Errorf("%s exists on the host: a write left the sandbox", p)
		}
	}
	if got, _ := testenv.GitErr(filepath.Join(w.h.RepoBase, "app"), "config", "--get", "core.fsmonitor"); got != "" {
		t.Errorf("core.fsmonitor was planted in the repository's config: %q", got)
	}
	if n := w.loopback.Load() + w.forbidden.Load(); n != 0 {
		t.Errorf("the host's loopback listeners accepted %d connections from the sandbox", n)
	}
	if n := w.hit.Load(); n != 0 {
		t.Errorf("the coordinator stub answered %d requests from the sandbox", n)
	}
	// aq is gone by now, and so is everything its sandbox ran.
	testenv.WaitFor(t, 30*time.Second, "the sandbox's straggler to be gone", func() bool { return len(marked(w.args.StragglerMark())) == 0 })
}

func (w hostileWorld) checkEscaped(t *testing.T, probes map[string]string) {
	t.Helper()
	for _, p := range hostile.Escapes {
		if probes[p.Name] != "ok" {
			t.Errorf("escape %s: %q without the sandbox, want ok (else the sandboxed run proves nothing)", p.Name, probes[p.Name])
		}
	}
	for _, p := range w.args.Writes() {
		if !testenv.Exists(p) {
			t.Errorf("%s does not exist: the unsandboxed write did not happen", p)
		}
	}
	if w.loopback.Load() == 0 || w.forbidden.Load() == 0 || w.hit.Load() == 0 {
		t.Errorf("unsandboxed, the engine did not reach the host's network (loopback %d, forbidden %d, coordinator %d)",
			w.loopback.Load(), w.forbidden.Load(), w.hit.Load())
	}
	if len(marked(w.args.StragglerMark())) == 0 {
		t.Error("unsandboxed, the straggler did not outlive aq")
	}
	// aq's git ran neither plant (checkAlways); a plain git in the
	// repository runs both, so that check can fail.
	repo := filepath.Join(w.h.RepoBase, "app")
	testenv.Git(t, repo, "status", "--porcelain")
	testenv.Git(t, repo, "commit", "--allow-empty", "-q", "-m", "a plain git's commit")
	_, hookRan, fsmonitorRan := w.args.Plants()
	for what, marker := range map[string]string{"post-commit hook": hookRan, "core.fsmonitor": fsmonitorRan} {
		if !testenv.Exists(marker) {
			t.Errorf("a plain git did not run the planted %s: the plant is not live, and aq not running it proves nothing", what)
		}
	}
}

// countingListener listens on host:0 and counts what it accepts.
func countingListener(t *testing.T, host string) (int, *atomic.Int64) {
	t.Helper()
	ln, err := net.Listen("tcp4", host+":0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	n := new(atomic.Int64)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			n.Add(1)
			c.Close()
		}
	}()
	return ln.Addr().(*net.TCPAddr).Port, n
}

// marked are the live processes whose command line carries mark.
func marked(mark string) []int {
	pids, _ := hostile.Marked(mark)
	return pids
}

// killMarked kills the process groups of the processes carrying mark.
func killMarked(mark string) { hostile.KillMarked(mark) }

// TestSandboxWhereUserNamespacesAreBlocked runs aq where no user namespace
// can be made (inside one whose max_user_namespaces is 0, as on a host
// that blocks them): under AQ_SANDBOX=on the job is refused with one line
// naming what the host lacks, sandbox_unavailable, back in the inbox;
// under auto the job runs at the partial level (Landlock alone), aq says
// which guarantees are missing, and it ships.
func TestSandboxWhereUserNamespacesAreBlocked(t *testing.T) {
	h := clitest.BinHome(t)
	h.Repo(t, "app", nil)
	run := func(mode string) testenv.Result {
		t.Helper()
		cmd := h.Command(t, "run", "--once")
		cmd.Env = append(cmd.Env, "AQ_SANDBOX="+mode)
		withoutUserNamespaces(cmd, h.Bin, `run --once`)
		return testenv.RunCmd(t, cmd)
	}

	h.Submit(t, "blocked-on", clitest.ScriptJob("app", "echo x > x.txt", "ship: branch"))
	r := run("on")
	if r.Code != 1 || !strings.Contains(r.Stderr, "sandbox_unavailable") || !strings.Contains(r.Stderr, "user.max_user_namespaces=0") {
		t.Fatalf("AQ_SANDBOX=on where user namespaces are blocked: %s", r)
	}
	if v := show(t, h, "blocked-on"); v.State.Stage != job.Inbox || v.Reason != job.ReasonSandboxUnavailable {
		t.Fatalf("the refused job is %s (%s), want back in the inbox", v.State.Stage, v.Reason)
	}
	if testenv.Exists(h.Worktree("app", testenv.ID("blocked-on"))) {
		t.Error("a worktree was made for the refused job")
	}

	h.Submit(t, "blocked-auto", clitest.ScriptJob("app", "echo x > x.txt", "ship: branch"))
	r = run("auto")
	if r.Code != 0 || !strings.Contains(r.Stderr, "engines run in a partial sandbox (landlock)") || !strings.Contains(r.Stderr, "stragglers") {
		t.Fatalf("AQ_SANDBOX=auto where user namespaces are blocked: %s", r)
	}
	if v := show(t, h, "blocked-auto"); v.State.Stage != job.Shipped {
		t.Fatalf("the partial-level job is %s", v.State.Stage)
	}
}

// TestSelftestSandbox: aq selftest's sandbox checks run the escape set in
// a real sandbox — at the full level here, every check passes; where user
// namespaces are blocked (the partial level) they pass but the straggler
// check, which is skipped saying why; and there, under AQ_SANDBOX=on, they
// fail, as that host refuses every job.
func TestSelftestSandbox(t *testing.T) {
	if b, err := os.ReadFile("/proc/sys/user/max_user_namespaces"); err == nil && strings.TrimSpace(string(b)) == "0" {
		t.Skip("user namespaces are blocked on this host")
	}
	t.Parallel() // its own home; the selftest's workspace is its own
	h := clitest.BinHome(t)
	run := func(mode string, blocked bool) map[string]string {
		t.Helper()
		cmd := h.Command(t, "selftest", "--only", `^pipeline\.sandbox\.`, "--json")
		cmd.Env = append(cmd.Env, "AQ_SANDBOX="+mode)
		if blocked {
			withoutUserNamespaces(cmd, h.Bin, `selftest --only '^pipeline\.sandbox\.' --json`)
		}
		r := testenv.RunCmd(t, cmd)
		var rep struct {
			Checks []struct{ Name, Status, Reason string }
		}
		if err := json.Unmarshal([]byte(r.Stdout), &rep); err != nil || len(rep.Checks) != 5 {
			t.Fatalf("AQ_SANDBOX=%s (blocked %v): %v: %s", mode, blocked, err, r)
		}
		got := map[string]string{}
		for _, c := range rep.Checks {
			got[strings.TrimPrefix(c.Name, "pipeline.sandbox.")] = c.Status
			t.Logf("AQ_SANDBOX=%s, blocked %v: %s %s: %s", mode, blocked, c.Status, c.Name, c.Reason)
		}
		return got
	}
	all := func(s string) map[string]string {
		return map[string]string{"level": s, "files": s, "network": s, "processes": s, "stragglers": s}
	}
	partial := all("pass")
	partial["stragglers"] = "skip"
	for _, tc := range []struct {
		mode    string
		blocked bool
		want    map[string]string
	}{
		{"auto", false, all("pass")},
		{"auto", true, partial},
		{"on", true, all("fail")},
		{"off", false, all("skip")},
	} {
		if got := run(tc.mode, tc.blocked); !maps.Equal(got, tc.want) {
			t.Errorf("AQ_SANDBOX=%s, user namespaces blocked %v: %v, want %v", tc.mode, tc.blocked, got, tc.want)
		}
	}
}

// withoutUserNamespaces makes cmd run aq (bin, with args as a shell would
// read them) where user namespaces are blocked: in a user namespace of its
// own whose max_user_namespaces is 0, as on a host that restricts them.
func withoutUserNamespaces(cmd *exec.Cmd, bin, args string) {
	cmd.Path, cmd.Args = "/bin/sh", []string{"/bin/sh", "-c", `echo 0 > /proc/sys/user/max_user_namespaces && exec "$0" ` + args, bin}
	cmd.SysProcAttr.Cloneflags = syscall.CLONE_NEWUSER
	cmd.SysProcAttr.UidMappings = []syscall.SysProcIDMap{{ContainerID: 0, HostID: os.Getuid(), Size: 1}}
	cmd.SysProcAttr.GidMappings = []syscall.SysProcIDMap{{ContainerID: 0, HostID: os.Getgid(), Size: 1}}
}
