package cli

import (
	"bufio"
	"bytes"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/aqfleet/aq/demo/coord"
	"github.com/aqfleet/aq/internal/testenv"
	"github.com/aqfleet/aq/job"
)

// TestHostileEngine is the hostile-engine suite of docs/sandbox.md: a real
// job whose engine (testdata/hostile.sh) tries every escape — read
// $AQ_HOME, the credentials, another job, another worktree, another
// repository, the user's keys; write outside its worktree; plant a hook
// and core.fsmonitor in the repository's shared .git; reach a loopback
// port, the coordinator, a host no job is allowed; see and signal aq;
// leave a daemonised straggler — and still does the job. Sandboxed (the
// default, auto: full on this host) every escape fails and the job ships;
// the same job with AQ_SANDBOX=off shows each escape succeeding, so the
// test can tell. Two things hold in both modes: aq's settings and the
// factory's tokens ($AQ_HOME, $GH_TOKEN) are not in the engine's
// environment (it is built: docs/engines.md), and aq's own git runs
// neither the hook nor the core.fsmonitor the engine planted (its git is
// hardened: docs/sandbox.md) — unsandboxed, a plain git then shows both
// plants live.
func TestHostileEngine(t *testing.T) {
	if b, err := os.ReadFile("/proc/sys/user/max_user_namespaces"); err == nil && strings.TrimSpace(string(b)) == "0" {
		t.Skip("user namespaces are blocked on this host: no full sandbox to test")
	}
	t.Run("sandboxed", func(t *testing.T) { hostile(t, "auto") })
	t.Run("off", func(t *testing.T) { hostile(t, "off") })
}

// hostileWorld is what the hostile engine tries to reach.
type hostileWorld struct {
	h                        *testenv.Home
	userHome, nonce, id      string
	loopback, forbidden, hit *atomic.Int64
}

func hostile(t *testing.T, mode string) {
	w := hostileWorld{h: binHome(t), userHome: t.TempDir(), nonce: strconv.FormatInt(time.Now().UnixNano(), 36)}
	h := w.h
	h.Env = append(h.Env, "HOME="+w.userHome, "AQ_SANDBOX="+mode, "AQ_WORKTREE_POOL=0", "GH_TOKEN=ghp_hostiletestfaketoken")
	t.Cleanup(func() {
		killMarked("straggler-" + w.nonce)
		for _, p := range []string{"aq-escape-", "aq-hook-ran-", "aq-fsmonitor-ran-"} {
			os.Remove("/tmp/" + p + w.nonce)
		}
	})
	for path, content := range map[string]string{
		".ssh/id_ed25519":      "-----BEGIN OPENSSH PRIVATE KEY----- fake",
		".aws/credentials":     "[default]\naws_secret_access_key = fake",
		".config/gh/hosts.yml": "github.com:\n  oauth_token: gho_fake",
	} {
		testenv.WriteFile(t, filepath.Join(w.userHome, path), content)
	}
	testenv.WriteFile(t, filepath.Join(h.Dir, "credentials"), "factory-token-fake")
	h.Repo(t, "app", map[string]string{"README.md": "app\n"})
	h.Repo(t, "other", map[string]string{"secret.txt": "another product's secret\n"})

	var port, forbidden string
	port, w.loopback = countingListener(t, "127.0.0.1")
	forbidden, w.forbidden = countingListener(t, "127.0.0.2")
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
	coordPort := cs.Listener.Addr().(*net.TCPAddr).Port

	// Another job first: its manifest, logs and worktree stay in $AQ_HOME.
	h.Submit(t, "other-job", scriptJob("other", "echo other > other-work.txt", "ship: branch"))
	if r := h.Run(t, "run", "--once"); r.Code != 0 {
		t.Fatalf("the other job: %s", r)
	}
	script, err := filepath.Abs("testdata/hostile.sh")
	if err != nil {
		t.Fatal(err)
	}
	args := []string{script, h.Dir, h.RepoBase, w.userHome, port, strconv.Itoa(coordPort), forbidden, h.Bin, w.nonce, "app"}
	h.Submit(t, "hostile", scriptJob("app", "bash "+strings.Join(args, " "), "ship: branch", "retry: {max: 0}"))
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
	probes := readProbes(t, filepath.Join(h.Dir, "logs", w.id, "stdout.log"))
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

// escapes are the probes that must fail in a sandbox and work without one.
// The writes to $HOME, /tmp and the repo base are judged on the host: in
// the sandbox they land in the job's own home and /tmp (where this test's
// repo base lies).
var escapes = []string{"read_aq_credentials", "read_other_job_manifest", "read_other_job_log", "read_other_worktree",
	"read_other_repo", "read_ssh_key", "read_cloud_creds", "read_gh_token", "plant_hook", "plant_fsmonitor",
	"reach_loopback", "reach_coordinator", "reach_forbidden_host", "see_aq", "signal_aq", "read_aq_environ"}

// deniedAlways are the probes that fail with or without the sandbox: the
// engine's environment is built from a documented base, which never holds
// aq's settings or the tokens aq ships with.
var deniedAlways = []string{"env_aq_home", "env_gh_token"}

// checkAlways checks what holds in both modes: the probes deniedAlways
// denied, and neither plant run by aq's own git.
func (w hostileWorld) checkAlways(t *testing.T, probes map[string]string) {
	t.Helper()
	for _, p := range deniedAlways {
		if probes[p] != "denied" {
			t.Errorf("escape %s: %q, want denied in every mode (the engine's environment is built)", p, probes[p])
		}
	}
	for what, marker := range map[string]string{"the planted post-commit hook": "/tmp/aq-hook-ran-" + w.nonce, "the planted core.fsmonitor": "/tmp/aq-fsmonitor-ran-" + w.nonce} {
		if testenv.Exists(marker) {
			t.Errorf("aq's git ran %s (%s exists)", what, marker)
		}
	}
}

func (w hostileWorld) checkContained(t *testing.T, probes map[string]string) {
	t.Helper()
	for _, p := range escapes {
		if probes[p] != "denied" {
			t.Errorf("escape %s: %q inside the sandbox, want denied", p, probes[p])
		}
	}
	// What lands in the job's own $HOME and /tmp stays there.
	for _, p := range []string{filepath.Join(w.userHome, "aq-escape-"+w.nonce), "/tmp/aq-escape-" + w.nonce, filepath.Join(w.h.RepoBase, "aq-escape-"+w.nonce),
		filepath.Join(w.h.RepoBase, "app", ".git", "hooks", "post-commit")} {
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
	testenv.WaitFor(t, 30*time.Second, "the sandbox's straggler to be gone", func() bool { return len(marked("straggler-"+w.nonce)) == 0 })
}

func (w hostileWorld) checkEscaped(t *testing.T, probes map[string]string) {
	t.Helper()
	for _, p := range append(escapes, "write_home", "write_tmp", "write_repobase") {
		if probes[p] != "ok" {
			t.Errorf("escape %s: %q without the sandbox, want ok (else the sandboxed run proves nothing)", p, probes[p])
		}
	}
	for _, p := range []string{filepath.Join(w.userHome, "aq-escape-"+w.nonce), "/tmp/aq-escape-" + w.nonce, filepath.Join(w.h.RepoBase, "aq-escape-"+w.nonce)} {
		if !testenv.Exists(p) {
			t.Errorf("%s does not exist: the unsandboxed write did not happen", p)
		}
	}
	if w.loopback.Load() == 0 || w.forbidden.Load() == 0 || w.hit.Load() == 0 {
		t.Errorf("unsandboxed, the engine did not reach the host's network (loopback %d, forbidden %d, coordinator %d)",
			w.loopback.Load(), w.forbidden.Load(), w.hit.Load())
	}
	if len(marked("straggler-"+w.nonce)) == 0 {
		t.Error("unsandboxed, the straggler did not outlive aq")
	}
	// aq's git ran neither plant (checkAlways); a plain git in the
	// repository runs both, so that check can fail.
	repo := filepath.Join(w.h.RepoBase, "app")
	testenv.Git(t, repo, "status", "--porcelain")
	testenv.Git(t, repo, "commit", "--allow-empty", "-q", "-m", "a plain git's commit")
	for what, marker := range map[string]string{"post-commit hook": "/tmp/aq-hook-ran-" + w.nonce, "core.fsmonitor": "/tmp/aq-fsmonitor-ran-" + w.nonce} {
		if !testenv.Exists(marker) {
			t.Errorf("a plain git did not run the planted %s: the plant is not live, and aq not running it proves nothing", what)
		}
	}
}

// countingListener listens on host:0 and counts what it accepts.
func countingListener(t *testing.T, host string) (string, *atomic.Int64) {
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
	return strconv.Itoa(ln.Addr().(*net.TCPAddr).Port), n
}

func readProbes(t *testing.T, log string) map[string]string {
	t.Helper()
	out := map[string]string{}
	sc := bufio.NewScanner(strings.NewReader(testenv.ReadFile(t, log)))
	for sc.Scan() {
		if f := strings.Fields(sc.Text()); len(f) == 3 && f[0] == "PROBE" {
			out[f[1]] = f[2]
		}
	}
	if len(out) == 0 {
		t.Fatalf("no probe ran: %s", testenv.ReadFile(t, log))
	}
	return out
}

// marked are the live processes whose command line carries mark.
func marked(mark string) []int {
	var pids []int
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		cmdline, err := os.ReadFile("/proc/" + e.Name() + "/cmdline")
		if err != nil || !bytes.Contains(cmdline, []byte(mark)) {
			continue
		}
		if st, err := os.ReadFile("/proc/" + e.Name() + "/stat"); err == nil && !bytes.Contains(st, []byte(") Z ")) {
			pids = append(pids, pid)
		}
	}
	return pids
}

// killMarked kills the process groups of the processes carrying mark.
func killMarked(mark string) {
	for _, pid := range marked(mark) {
		_ = syscall.Kill(-pid, syscall.SIGKILL)
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
}

// TestSandboxWhereUserNamespacesAreBlocked runs aq where no user namespace
// can be made (inside one whose max_user_namespaces is 0, as on a host
// that blocks them): under AQ_SANDBOX=on the job is refused with one line
// naming what the host lacks, sandbox_unavailable, back in the inbox;
// under auto the job runs at the partial level (Landlock alone), aq says
// which guarantees are missing, and it ships.
func TestSandboxWhereUserNamespacesAreBlocked(t *testing.T) {
	h := binHome(t)
	h.Repo(t, "app", nil)
	run := func(mode string) testenv.Result {
		t.Helper()
		cmd := h.Command(t, "run", "--once")
		cmd.Path, cmd.Args = "/bin/sh", []string{"/bin/sh", "-c", `echo 0 > /proc/sys/user/max_user_namespaces && exec "$0" run --once`, h.Bin}
		cmd.Env = append(cmd.Env, "AQ_SANDBOX="+mode)
		cmd.SysProcAttr.Cloneflags = syscall.CLONE_NEWUSER
		cmd.SysProcAttr.UidMappings = []syscall.SysProcIDMap{{ContainerID: 0, HostID: os.Getuid(), Size: 1}}
		cmd.SysProcAttr.GidMappings = []syscall.SysProcIDMap{{ContainerID: 0, HostID: os.Getgid(), Size: 1}}
		var out, errb bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &errb
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		r, err := testenv.Wait(cmd, &out, &errb, 3*time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		return r
	}

	h.Submit(t, "blocked-on", scriptJob("app", "echo x > x.txt", "ship: branch"))
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

	h.Submit(t, "blocked-auto", scriptJob("app", "echo x > x.txt", "ship: branch"))
	r = run("auto")
	if r.Code != 0 || !strings.Contains(r.Stderr, "engines run in a partial sandbox (landlock)") || !strings.Contains(r.Stderr, "stragglers") {
		t.Fatalf("AQ_SANDBOX=auto where user namespaces are blocked: %s", r)
	}
	if v := show(t, h, "blocked-auto"); v.State.Stage != job.Shipped {
		t.Fatalf("the partial-level job is %s", v.State.Stage)
	}
}
