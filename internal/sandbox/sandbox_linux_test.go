package sandbox_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/aqfleet/aq/internal/process"
	"github.com/aqfleet/aq/internal/sandbox"
	"github.com/aqfleet/aq/internal/testenv"
)

func openFull(t *testing.T) *sandbox.Host {
	t.Helper()
	h := sandbox.Open(sandbox.Options{Init: self(t), Mode: sandbox.ModeAuto})
	if h.Level() != sandbox.LevelFull {
		t.Fatalf("level %s, want full on this host (user namespaces work here): %s", h.Level(), h.Report().MissingLine())
	}
	return h
}

func TestProbeFull(t *testing.T) {
	r := openFull(t).Report()
	if r.Mechanism != "namespaces+landlock" || r.LandlockABI < 1 {
		t.Errorf("report %+v: want namespaces+landlock", r)
	}
	for _, g := range []sandbox.Guarantee{sandbox.GuaranteeFiles, sandbox.GuaranteeNetwork, sandbox.GuaranteeProcesses, sandbox.GuaranteeStragglers} {
		if !r.Has(g) {
			t.Errorf("guarantee %s does not hold: %s", g, r.MissingLine())
		}
	}
}

func TestOffAndNoInit(t *testing.T) {
	off := sandbox.Open(sandbox.Options{Init: self(t), Mode: sandbox.ModeOff})
	if off.Level() != sandbox.LevelNone || len(off.Report().Holds) != 0 {
		t.Errorf("off: %+v", off.Report())
	}
	if line, warn := off.StartLine(); !warn || !strings.Contains(line, "AQ_SANDBOX=off") {
		t.Errorf("off start line %q (warn %v)", line, warn)
	}
	if j, err := off.Jail(sandbox.Policy{Worktree: t.TempDir(), JobDir: t.TempDir()}); j != nil || err != nil {
		t.Errorf("off gave a jail: %v %v", j, err)
	}
	in := sandbox.Open(sandbox.Options{Mode: sandbox.ModeOn}) // aq's packages in-process: no init
	if in.Level() != sandbox.LevelNone {
		t.Errorf("no init: level %s", in.Level())
	}
	err := in.Refusal()
	if !errors.Is(err, sandbox.ErrUnavailable) || !strings.Contains(err.Error(), "no aq executable") {
		t.Errorf("on without a sandbox: %v", err)
	}
	if openFull(t).Refusal() != nil {
		t.Error("a full host refuses jobs")
	}
}

// TestEscapesFull runs the escape probes in a full sandbox as root: every
// escape fails, the honest work succeeds, nothing reaches the host, and
// the straggler dies with the sandbox.
func TestEscapesFull(t *testing.T) {
	testenv.Slow(t, "starts real sandboxes under a cgroup limit or many escapes")
	h := openFull(t)
	l := makeLayout(t, t.TempDir())
	port, accepted := listener(t)
	n := nonce(t)
	j, err := h.Jail(l.policy)
	if err != nil {
		t.Fatal(err)
	}
	defer j.Remove()
	out, res, err := runScript(context.Background(), j, l, escapeScript(), port, strconv.Itoa(os.Getpid()), n, nil)
	if err != nil {
		t.Fatal(err)
	}
	if res.ExitCode != 0 {
		t.Fatalf("exit %d %s:\n%s", res.ExitCode, res.Signal, out)
	}
	got := probes(out)
	check(t, got, merge(honest, escapesDenied, want{"write_cache": "ok", "see_parent": "denied"}))
	if accepted.Load() != 0 {
		t.Errorf("the host's loopback listener accepted %d connections from inside", accepted.Load())
	}
	hostUntouched(t, l, n)
	waitGone(t, n)
	for _, note := range j.Notes() {
		t.Errorf("sandbox note (the plan was not followed): %s", note)
	}
}

// TestEscapesControl is the same probes without a sandbox: each escape
// works, so the tests above can tell.
func TestEscapesControl(t *testing.T) {
	testenv.Slow(t, "starts real sandboxes under a cgroup limit or many escapes")
	l := makeLayout(t, t.TempDir())
	port, accepted := listener(t)
	n := nonce(t)
	t.Cleanup(func() {
		killStragglers(n)
		os.Remove("/usr/aq-escape-" + n)
		os.Remove("/tmp/aq-escape-" + n)
	})
	out, _, err := runScript(context.Background(), nil, l, escapeScript(), port, strconv.Itoa(os.Getpid()), n, nil)
	if err != nil {
		t.Fatal(err)
	}
	allOK := want{}
	for k := range merge(honest, escapesDenied) {
		allOK[k] = "ok"
	}
	allOK["see_parent"] = "ok"
	check(t, probes(out), allOK)
	if accepted.Load() == 0 {
		t.Error("the unsandboxed probe did not reach the loopback listener")
	}
	if _, err := os.Stat("/tmp/aq-escape-" + n); err != nil {
		t.Error("the unsandboxed probe did not write to the host's /tmp")
	}
	if len(stragglers(n)) == 0 {
		t.Error("the unsandboxed straggler did not outlive the run (the control cannot tell)")
	}
}

// TestEscapesUnprivileged runs the probes in a sandbox made by an
// unprivileged aq: the test binary re-executed as nobody.
func TestEscapesUnprivileged(t *testing.T) {
	if os.Getuid() != 0 {
		t.Skip("needs root to start a child as nobody")
	}
	const nobody = 65534
	root, err := os.MkdirTemp("", "aq-sandbox-nobody-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(root) })
	l := makeLayout(t, filepath.Join(root, "layout"))
	bin := filepath.Join(root, "aq.test")
	copyFile(t, self(t), bin, 0o755)
	script := filepath.Join(root, "escape.sh")
	copyFile(t, "testdata/escape.sh", script, 0o644)
	if err := filepath.Walk(root, func(p string, _ os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		return os.Lchown(p, nobody, nobody)
	}); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(root, 0o755); err != nil {
		t.Fatal(err)
	}
	port, accepted := listener(t)
	n := nonce(t)
	cmd := exec.Command(bin)
	cmd.Dir = root
	cmd.Env = []string{childEnv + "=escapes", "LAYOUT=" + l.root, "PORT=" + port, "PARENT=" + strconv.Itoa(os.Getpid()),
		"NONCE=" + n, "PATH=/usr/bin:/bin", "HOME=" + l.home, "TMPDIR=/tmp", "SCRIPT=" + script}
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: nobody, Gid: nobody}}
	out := runChild(t, cmd)
	if !strings.Contains(out, "LEVEL full") {
		t.Fatalf("an unprivileged aq did not get the full level:\n%s", out)
	}
	got := probes(out)
	// nobody cannot write /usr nor signal root's test process anyway; the
	// sandbox must still deny them.
	check(t, got, merge(honest, escapesDenied, want{"write_cache": "ok", "see_parent": "denied"}))
	if accepted.Load() != 0 {
		t.Errorf("the host's loopback listener accepted %d connections", accepted.Load())
	}
	hostUntouched(t, l, n)
	waitGone(t, n)
}

// TestEscapesPartial runs the probes where user namespaces are blocked (a
// user namespace whose max_user_namespaces is 0): Landlock alone holds
// the files, TCP and signals; processes stay visible and the straggler
// outlives the run, as docs/sandbox.md says of the partial level.
func TestEscapesPartial(t *testing.T) {
	l := makeLayout(t, t.TempDir())
	port, accepted := listener(t)
	n := nonce(t)
	t.Cleanup(func() { killStragglers(n) })
	cmd := exec.Command(self(t))
	cmd.Env = []string{childEnv + "=escapes", "BLOCK_USERNS=1", "LAYOUT=" + l.root, "PORT=" + port,
		"PARENT=" + strconv.Itoa(os.Getpid()), "NONCE=" + n, "PATH=/usr/bin:/bin", "HOME=" + l.home, "SCRIPT=" + absPath(t, "testdata/escape.sh")}
	cmd.SysProcAttr = &syscall.SysProcAttr{
		Cloneflags:  syscall.CLONE_NEWUSER,
		UidMappings: []syscall.SysProcIDMap{{ContainerID: 0, HostID: os.Getuid(), Size: 1}},
		GidMappings: []syscall.SysProcIDMap{{ContainerID: 0, HostID: os.Getgid(), Size: 1}},
	}
	out := runChild(t, cmd)
	if !strings.Contains(out, "LEVEL partial") {
		t.Fatalf("with user namespaces blocked the level is not partial:\n%s", out)
	}
	got := probes(out)
	check(t, got, merge(honest, escapesDenied, want{
		"write_cache": "denied", // the shared cache is read-only; the job's own is under its HOME
		"see_parent":  "ok",     // no pid namespace: processes stay visible
	}))
	if accepted.Load() != 0 {
		t.Errorf("the host's loopback listener accepted %d connections", accepted.Load())
	}
	for _, p := range []string{"/tmp/aq-escape-" + n, filepath.Join(l.home, "aq-escape-"+n)} {
		if _, err := os.Lstat(p); err == nil {
			t.Errorf("%s exists on the host", p)
		}
	}
	if len(stragglers(n)) == 0 {
		t.Error("the partial level ended a straggler that dropped its tag: docs/sandbox.md says it cannot")
	}
}

func runChild(t *testing.T, cmd *exec.Cmd) string {
	t.Helper()
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("child: %v\nstdout:\n%s\nstderr:\n%s", err, out, stderr.String())
	}
	return string(out)
}

func copyFile(t *testing.T, src, dst string, mode os.FileMode) {
	t.Helper()
	in, err := os.Open(src)
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, mode)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(out, in); err != nil {
		t.Fatal(err)
	}
	if err := out.Close(); err != nil {
		t.Fatal(err)
	}
}

// TestExitStatus: the engine's own end is reported, not its init's.
func TestExitStatus(t *testing.T) {
	h := openFull(t)
	l := makeLayout(t, t.TempDir())
	j, err := h.Jail(l.policy)
	if err != nil {
		t.Fatal(err)
	}
	defer j.Remove()
	for _, tc := range []struct {
		script string
		code   int
		signal string
	}{
		{"exit 0", 0, ""},
		{"exit 7", 7, ""},
		{"kill -TERM $$", -1, "SIGTERM"},
		{"kill -KILL $$", -1, "SIGKILL"},
	} {
		_, res, err := runScript(context.Background(), j, l, tc.script, "0", "0", nonce(t), nil)
		if err != nil {
			t.Fatal(err)
		}
		if res.ExitCode != tc.code || res.Signal != tc.signal || res.Stopped {
			t.Errorf("%q: exit %d signal %q stopped %v, want %d %q", tc.script, res.ExitCode, res.Signal, res.Stopped, tc.code, tc.signal)
		}
		// One jail, run after run (the engine, then verify): the cache's
		// overlay mounts again on its layer every time.
		for _, n := range j.Notes() {
			t.Errorf("%q: sandbox note: %s", tc.script, n)
		}
	}
}

// TestLadderReachesTheEngine: aq's kill ladder (SIGINT first) reaches the
// engine through init, which lets it clean up and exit as it chooses; an
// engine deaf to every catchable signal ends at SIGKILL with the sandbox.
func TestLadderReachesTheEngine(t *testing.T) {
	h := openFull(t)
	l := makeLayout(t, t.TempDir())
	j, err := h.Jail(l.policy)
	if err != nil {
		t.Fatal(err)
	}
	defer j.Remove()
	for _, tc := range []struct {
		script string
		code   int
		step   string
	}{
		{`trap 'echo cleaned > "$WORKTREE/cleanup"; exit 130' INT; echo ready; while :; do sleep 0.05; done`, 130, "SIGINT"},
		{`trap '' INT TERM; echo ready; while :; do sleep 0.05; done`, -1, "SIGKILL"},
	} {
		ctx, cancel := context.WithCancel(context.Background())
		pr, pw := io.Pipe()
		go func() {
			bufio.NewReader(pr).ReadString('\n') // "ready": its traps are set
			cancel()
			io.Copy(io.Discard, pr)
		}()
		res, err := process.Run(ctx, process.Spec{
			Path: "/bin/bash", Args: []string{"-c", tc.script}, Dir: l.worktree, Env: []string{"PATH=/usr/bin:/bin", "WORKTREE=" + l.worktree},
			Stdout: pw, Tag: "ladder-" + nonce(t), Grace: 300 * time.Millisecond, Jail: j,
		})
		pw.Close()
		cancel()
		if err != nil {
			t.Fatal(err)
		}
		if !res.Stopped || res.LadderStep != tc.step || res.ExitCode != tc.code {
			t.Errorf("%q: stopped %v at %s, exit %d; want %s, exit %d", tc.script, res.Stopped, res.LadderStep, res.ExitCode, tc.step, tc.code)
		}
	}
	if b, _ := os.ReadFile(filepath.Join(l.worktree, "cleanup")); string(b) != "cleaned\n" {
		t.Errorf("the engine's SIGINT clean-up did not run: %q", b)
	}
}

// TestAQKilledEndsTheSandbox: an aq killed -9 while its engine runs (a
// child process holding a sandbox with a daemonised straggler) leaves
// nothing of the sandbox running.
func TestAQKilledEndsTheSandbox(t *testing.T) {
	l := makeLayout(t, t.TempDir())
	n := nonce(t)
	cmd := exec.Command(self(t))
	cmd.Env = []string{childEnv + "=hold", "LAYOUT=" + l.root, "NONCE=" + n, "PATH=/usr/bin:/bin", "HOME=" + l.home}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { killStragglers(n) })
	// What aq gc (or the job's next run) does with the directory of a
	// killed aq: the caches' tmpfs it left mounted there goes first.
	t.Cleanup(func() {
		if err := sandbox.RemoveJobDir(l.policy.JobDir); err != nil {
			t.Errorf("the killed aq's job directory: %v", err)
		}
	})
	r := bufio.NewReader(stdout)
	for {
		line, err := r.ReadString('\n')
		if err != nil {
			t.Fatalf("the holding child ended before its sandbox was ready: %v", err)
		}
		if strings.Contains(line, "ready") {
			break
		}
	}
	if len(stragglers(n)) == 0 {
		t.Fatal("the sandbox's straggler is not running")
	}
	_ = cmd.Process.Kill() // aq killed -9
	_ = cmd.Wait()
	waitGone(t, n)
}

// TestEngineNotInSandbox: an engine binary the sandbox does not show (it
// lies under a hidden path) fails to start with a StartError that still
// says the file is missing; nothing is left running.
func TestEngineNotInSandbox(t *testing.T) {
	h := openFull(t)
	l := makeLayout(t, t.TempDir())
	hiddenBin := filepath.Join(l.aqHome, "bin", "engine")
	if err := os.MkdirAll(filepath.Dir(hiddenBin), 0o755); err != nil {
		t.Fatal(err)
	}
	copyFile(t, "/bin/true", hiddenBin, 0o755)
	j, err := h.Jail(l.policy)
	if err != nil {
		t.Fatal(err)
	}
	defer j.Remove()
	_, err = process.Run(context.Background(), process.Spec{Path: hiddenBin, Dir: l.worktree, Tag: "missing-" + nonce(t), Jail: j})
	var se *sandbox.StartError
	if !errors.As(err, &se) || !errors.Is(err, sandbox.ErrUnavailable) || !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("start error %v: want a StartError that is ErrUnavailable and fs.ErrNotExist", err)
	}
}

// TestBrokenPolicyFailsToStart: a sandbox that cannot be built (the
// worktree is gone) is a StartError, and nothing is left running.
func TestBrokenPolicyFailsToStart(t *testing.T) {
	h := openFull(t)
	l := makeLayout(t, t.TempDir())
	j, err := h.Jail(l.policy)
	if err != nil {
		t.Fatal(err)
	}
	defer j.Remove()
	if err := os.RemoveAll(l.worktree); err != nil {
		t.Fatal(err)
	}
	tag := "broken-" + nonce(t)
	_, err = process.Run(context.Background(), process.Spec{Path: "/bin/true", Dir: "/", Tag: tag, Jail: j})
	if !errors.Is(err, sandbox.ErrUnavailable) {
		t.Fatalf("start error %v: want ErrUnavailable", err)
	}
	if pids, _ := process.FindTagged(tag); len(pids) > 0 {
		t.Errorf("processes %v were left running", pids)
	}
}

func absPath(t *testing.T, p string) string {
	t.Helper()
	a, err := filepath.Abs(p)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// TestOpenLazy: the probe waits for the first question, and the callback
// that says how engines run may ask the Host anything (it once
// deadlocked doing so).
func TestOpenLazy(t *testing.T) {
	calls := 0
	h := sandbox.OpenLazy(sandbox.Options{Init: self(t), Mode: sandbox.ModeAuto}, func(h *sandbox.Host) {
		calls++
		if line, _ := h.StartLine(); h.Level() != sandbox.LevelFull || !strings.Contains(line, "limits") && line != "" {
			t.Errorf("in the callback: level %s, line %q", h.Level(), line)
		}
	})
	if calls != 0 {
		t.Fatal("probed before anyone asked")
	}
	// What only shows the sandbox (aq caps, aq status, the offer) probes
	// without saying how engines run.
	if h.Level() != sandbox.LevelFull || h.Refuses() != nil || h.Report().Level != sandbox.LevelFull {
		t.Fatalf("level %s", h.Level())
	}
	if calls != 0 {
		t.Fatalf("the callback ran %d times before a job asked", calls)
	}
	if h.Refusal() != nil {
		t.Fatal("a full host refuses jobs")
	}
	h.Report()
	h.Refusal()
	if calls != 1 {
		t.Errorf("the callback ran %d times, want once", calls)
	}
}

// TestProxyBridge: in a full sandbox the engine's proxy variables point at
// 127.0.0.1:3128 inside, and what it sends there reaches the job's proxy
// on its unix socket on the host (here a plain HTTP server standing in for
// internal/egress).
func TestProxyBridge(t *testing.T) {
	h := openFull(t)
	l := makeLayout(t, t.TempDir())
	sock := filepath.Join(t.TempDir(), "proxy.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "proxied %s %s\n", r.Method, r.URL)
	})}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	p := l.policy
	p.Net.ProxySocket = sock
	j, err := h.Jail(p)
	if err != nil {
		t.Fatal(err)
	}
	defer j.Remove()
	out, res, err := runScript(context.Background(), j, l, `echo "proxy=$HTTPS_PROXY $http_proxy no=$NO_PROXY"
exec 3<>/dev/tcp/127.0.0.1/3128 && printf 'GET http://example.test/x HTTP/1.0\r\n\r\n' >&3 && cat <&3`, "0", "0", nonce(t), nil)
	if err != nil || res.ExitCode != 0 {
		t.Fatalf("exit %d, %v:\n%s", res.ExitCode, err, out)
	}
	if !strings.Contains(out, "proxy=http://127.0.0.1:3128 http://127.0.0.1:3128 no=localhost") {
		t.Errorf("the engine's proxy variables:\n%s", out)
	}
	if !strings.Contains(out, "proxied GET http://example.test/x") {
		t.Errorf("the request did not reach the proxy through the bridge:\n%s", out)
	}
}

// TestSharedWritable: a shared directory (AQ_SANDBOX_WRITABLE) — here
// under /tmp, which the job's own /tmp covers — is the host's own inside a
// full sandbox: what the engine writes there is on the host, and its
// neighbours stay out of reach.
func TestSharedWritable(t *testing.T) {
	h := openFull(t)
	l := makeLayout(t, t.TempDir())
	shared, neighbour := t.TempDir(), t.TempDir()
	p := l.policy
	p.Shared = []string{shared}
	j, err := h.Jail(p)
	if err != nil {
		t.Fatal(err)
	}
	defer j.Remove()
	out, res, err := runScript(context.Background(), j, l, `echo shared > "`+shared+`/from-engine" && echo wrote
echo x > "`+neighbour+`/escape" 2>/dev/null && echo escaped; true`, "0", "0", nonce(t), nil)
	if err != nil || res.ExitCode != 0 {
		t.Fatalf("exit %d, %v:\n%s", res.ExitCode, err, out)
	}
	if b, _ := os.ReadFile(filepath.Join(shared, "from-engine")); string(b) != "shared\n" || !strings.Contains(out, "wrote") {
		t.Errorf("the engine's write to the shared directory is not on the host (%q):\n%s", b, out)
	}
	if strings.Contains(out, "escaped") || testenvExists(filepath.Join(neighbour, "escape")) {
		t.Errorf("a neighbour of the shared directory was writable:\n%s", out)
	}
}

func testenvExists(p string) bool { _, err := os.Lstat(p); return err == nil }
