package sandbox_test

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/aqfleet/aq/internal/process"
	"github.com/aqfleet/aq/internal/sandbox"
)

// childEnv selects what the re-executed test binary does instead of the
// tests: run the escape probes in a sandbox (as another user, or where
// user namespaces are blocked), or hold a sandbox until killed.
const childEnv = "AQ_SANDBOX_TEST_CHILD"

// TestMain lets the test binary stand in for aq: re-executed as a
// sandbox's init (or an engine's supervisor), it does what cmd/aq does.
func TestMain(m *testing.M) {
	if code, ok := sandbox.MaybeInit(); ok {
		os.Exit(code)
	}
	if code, ok := process.MaybeSupervise(); ok {
		os.Exit(code)
	}
	if mode := os.Getenv(childEnv); mode != "" {
		os.Exit(child(mode))
	}
	os.Exit(m.Run())
}

// child runs a child mode; its report goes to stdout.
func child(mode string) int {
	if os.Getenv("BLOCK_USERNS") != "" {
		// This child runs in a user namespace of its own: no user
		// namespace may be made below it, as on a host that blocks them.
		if err := os.WriteFile("/proc/sys/user/max_user_namespaces", []byte("0"), 0o644); err != nil {
			fmt.Println("cannot block user namespaces:", err)
			return 97
		}
	}
	exe, _ := os.Executable()
	h := sandbox.Open(sandbox.Options{Init: exe, Mode: sandbox.ModeAuto})
	fmt.Println("LEVEL", h.Level())
	l := layoutAt(os.Getenv("LAYOUT"))
	j, err := h.Jail(l.policy)
	if err != nil || j == nil {
		fmt.Println("no jail:", err, h.Report().MissingLine())
		return 98
	}
	defer j.Remove()
	switch mode {
	case "escapes":
		out, res, err := runScript(context.Background(), j, l, escapeScript(), os.Getenv("PORT"), os.Getenv("PARENT"), os.Getenv("NONCE"), nil)
		if err != nil {
			fmt.Println("run:", err)
			return 99
		}
		fmt.Print(out)
		fmt.Println("EXIT", res.ExitCode)
		return 0
	case "hold": // a sandbox with a straggler, until this process is killed
		_, _, _ = runScript(context.Background(), j, l, stragglerScript+`echo ready; exec sleep 1000`,
			"0", "0", os.Getenv("NONCE"), os.Stdout)
		return 0
	}
	return 2
}

// escapeScript is testdata/escape.sh (a child finds it through SCRIPT).
func escapeScript() string {
	path := os.Getenv("SCRIPT")
	if path == "" {
		path = "testdata/escape.sh"
	}
	b, err := os.ReadFile(path)
	if err != nil {
		panic(err)
	}
	return string(b)
}

// stragglerScript leaves a daemonised process that drops the job's tag
// and leaves the engine's process group, and waits until it runs.
const stragglerScript = `env -i setsid /bin/sh -c "echo up > '$WORKTREE/.straggler-$NONCE'; sleep 1000; : straggler-$NONCE" </dev/null >/dev/null 2>&1 &
while [ ! -e "$WORKTREE/.straggler-$NONCE" ]; do sleep 0.01; done
`

// layout is a job's world on the host: $AQ_HOME with the job's worktree
// and another job's files, a repo base with the job's repository and
// another product's, and a home with a private key, a toolchain and a
// package cache.
type layout struct {
	root, aqHome, repoBase, home string
	worktree, gitDir             string
	policy                       sandbox.Policy
}

func layoutAt(root string) layout {
	l := layout{root: root, aqHome: filepath.Join(root, "aq"), repoBase: filepath.Join(root, "src"), home: filepath.Join(root, "home")}
	l.worktree = filepath.Join(l.aqHome, "worktrees", "app", "job-1")
	l.gitDir = filepath.Join(l.repoBase, "app", ".git")
	l.policy = sandbox.Policy{
		Worktree: l.worktree,
		GitDirs:  []string{l.gitDir},
		Home:     l.home,
		JobDir:   filepath.Join(l.aqHome, "sandbox", "job-1"),
		Hidden:   []string{l.aqHome, l.repoBase},
		ReadOnly: []string{filepath.Join(l.home, ".tool")},
		Caches:   []string{filepath.Join(l.home, ".cache", "pkgs")},
	}
	return l
}

// makeLayout writes a layout's files under root.
func makeLayout(t testing.TB, root string) layout {
	t.Helper()
	l := layoutAt(root)
	for path, content := range map[string]string{
		filepath.Join(l.aqHome, "credentials"):                        "factory-token",
		filepath.Join(l.aqHome, "queue", "inbox", "other.md"):         "another job",
		filepath.Join(l.aqHome, "worktrees", "app", "job-2", "x.txt"): "another worktree",
		filepath.Join(l.worktree, "README"):                           "mine",
		filepath.Join(l.gitDir, "config"):                             "[core]\n",
		filepath.Join(l.repoBase, "other", "secret.txt"):              "another product",
		filepath.Join(l.home, ".ssh", "id_ed25519"):                   "private key",
		filepath.Join(l.home, ".tool", "bin", "tool"):                 "#!/bin/sh\necho tool-ran\n",
		filepath.Join(l.home, ".cache", "pkgs", "shared.txt"):         "cached",
	} {
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(content), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	return l
}

// runScript runs script with bash in j (nil: unsandboxed), with the
// probes' inputs; its stdout goes to stdout when set, else is returned.
func runScript(ctx context.Context, j *sandbox.Jail, l layout, script, port, parent, nonce string, stdout io.Writer) (string, process.Result, error) {
	var out bytes.Buffer
	if stdout == nil {
		stdout = &out
	}
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	res, err := process.Run(ctx, process.Spec{
		Path: "/bin/bash", Args: []string{"-c", script}, Dir: l.worktree,
		Env: []string{"PATH=/usr/bin:/bin", "HOME=" + l.home, "AQHOME=" + l.aqHome, "REPOBASE=" + l.repoBase,
			"HOSTHOME=" + l.home, "GITDIR=" + l.gitDir, "WORKTREE=" + l.worktree, "PORT=" + port, "PARENT=" + parent, "NONCE=" + nonce},
		Stdout: stdout, Stderr: io.Discard,
		Tag: "sandbox-test-" + nonce, Grace: 200 * time.Millisecond, Jail: jailOrNil(j),
	})
	return out.String(), res, err
}

// jailOrNil keeps a nil *Jail from becoming a non-nil process.Jail.
func jailOrNil(j *sandbox.Jail) process.Jail {
	if j == nil {
		return nil
	}
	return j
}

// self is the test binary, the sandbox's init.
func self(t testing.TB) string {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	return exe
}

// listener is a TCP listener on the host's loopback that counts the
// connections it accepts.
func listener(t *testing.T) (port string, accepted *atomic.Int64) {
	t.Helper()
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	accepted = new(atomic.Int64)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			accepted.Add(1)
			c.Close()
		}
	}()
	return strconv.Itoa(ln.Addr().(*net.TCPAddr).Port), accepted
}

// probes parses "PROBE name outcome" lines.
func probes(out string) map[string]string {
	m := map[string]string{}
	sc := bufio.NewScanner(strings.NewReader(out))
	for sc.Scan() {
		if f := strings.Fields(sc.Text()); len(f) == 3 && f[0] == "PROBE" {
			m[f[1]] = f[2]
		}
	}
	return m
}

// stragglers are the live processes carrying the nonce's straggler mark.
func stragglers(nonce string) []int {
	var pids []int
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile("/proc/" + e.Name() + "/cmdline")
		if err == nil && bytes.Contains(b, []byte("straggler-"+nonce)) {
			if st, err := os.ReadFile("/proc/" + e.Name() + "/stat"); err == nil && !bytes.Contains(st, []byte(") Z ")) {
				pids = append(pids, pid)
			}
		}
	}
	return pids
}

// killStragglers ends the stragglers an unsandboxed (or partial) run left.
func killStragglers(nonce string) {
	for _, pid := range stragglers(nonce) {
		_ = syscall.Kill(-pid, syscall.SIGKILL)
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
}

// want is what each probe must show at one level.
type want map[string]string

func check(t *testing.T, got map[string]string, w want) {
	t.Helper()
	for name, outcome := range w {
		if got[name] != outcome {
			t.Errorf("probe %s: %q, want %q", name, got[name], outcome)
		}
	}
}

var (
	honest = want{"read_worktree": "ok", "write_worktree": "ok", "write_home": "ok", "write_tmpdir": "ok",
		"run_toolchain": "ok", "read_gitdir": "ok", "read_cache": "ok"}
	escapesDenied = want{"read_credentials": "denied", "read_other_job": "denied", "read_other_worktree": "denied",
		"read_other_repo": "denied", "read_ssh_key": "denied", "plant_git_hook": "denied",
		"plant_git_config": "denied", "write_usr": "denied", "loopback": "denied", "read_parent_environ": "denied",
		"signal_parent": "denied"}
)

func merge(ws ...want) want {
	out := want{}
	for _, w := range ws {
		for k, v := range w {
			out[k] = v
		}
	}
	return out
}

// hostUntouched checks what the probes tried to write on the host.
func hostUntouched(t *testing.T, l layout, nonce string) {
	t.Helper()
	for _, p := range []string{"/tmp/aq-escape-" + nonce, filepath.Join(l.home, "aq-escape-"+nonce),
		filepath.Join(l.repoBase, "aq-escape-"+nonce), "/usr/aq-escape-" + nonce, filepath.Join(l.gitDir, "hooks", "post-checkout"),
		filepath.Join(l.home, ".cache", "pkgs", "mine-"+nonce)} {
		if _, err := os.Lstat(p); err == nil {
			t.Errorf("%s exists on the host: the sandbox let a write out", p)
		}
	}
	if b, _ := os.ReadFile(filepath.Join(l.gitDir, "config")); string(b) != "[core]\n" {
		t.Errorf("the repository's git config changed: %q", b)
	}
	if b, _ := os.ReadFile(filepath.Join(l.home, ".cache", "pkgs", "shared.txt")); string(b) != "cached" {
		t.Errorf("the shared cache changed: %q", b)
	}
	if b, _ := os.ReadFile(filepath.Join(l.worktree, "made-by-engine")); string(b) != "work\n" {
		t.Errorf("the engine's work is not in the worktree: %q", b)
	}
}

// waitGone waits until the nonce's stragglers are gone (they are killed
// asynchronously when a pid namespace ends), failing after a long bound.
func waitGone(t *testing.T, nonce string) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for len(stragglers(nonce)) > 0 {
		if time.Now().After(deadline) {
			t.Errorf("stragglers %v outlived the sandbox", stragglers(nonce))
			killStragglers(nonce)
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func nonce(t *testing.T) string {
	return strconv.FormatInt(time.Now().UnixNano(), 36) + strconv.Itoa(os.Getpid())
}
