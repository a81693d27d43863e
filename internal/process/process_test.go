//go:build unix

package process_test

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/aqfleet/aq/internal/process"
	"github.com/aqfleet/aq/internal/secrets"
)

// procWorks reports whether FindTagged can see processes on this platform.
var procWorks = runtime.GOOS == "linux"

func requireProc(t testing.TB) {
	t.Helper()
	if !procWorks {
		t.Skip("FindTagged needs /proc (Linux)")
	}
}

var tagSeq atomic.Int64

// newTag returns a job id no other test uses, and checks when the test ends
// that no process carrying it is alive.
func newTag(t testing.TB) string {
	t.Helper()
	tag := fmt.Sprintf("aqtest-%d-%d", os.Getpid(), tagSeq.Add(1))
	t.Cleanup(func() {
		if !procWorks {
			return
		}
		pids, err := process.FindTagged(tag)
		if err != nil {
			t.Errorf("FindTagged(%s): %v", tag, err)
		}
		if len(pids) > 0 {
			t.Errorf("processes tagged %s still alive after the test: %v", tag, pids)
			for _, pid := range pids {
				_ = syscall.Kill(pid, syscall.SIGKILL)
			}
		}
	})
	return tag
}

// childVars select the child mode of a re-executed test binary, and turn off
// -race's one-second sleep at exit (GORACE atexit_sleep_ms), which would
// otherwise delay every child that exits 0.
func childVars(mode string) []string {
	race := "atexit_sleep_ms=0"
	if old := os.Getenv("GORACE"); old != "" {
		race = old + " " + race
	}
	return []string{"GORACE=" + race, childModeEnv + "=" + mode}
}

// childEnv is our environment plus childVars.
func childEnv(mode string) []string { return append(os.Environ(), childVars(mode)...) }

// childSpec runs the test binary in the given child mode.
func childSpec(t testing.TB, mode string, args ...string) process.Spec {
	t.Helper()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	return process.Spec{
		Path:  self,
		Args:  args,
		Env:   childEnv(mode),
		Tag:   newTag(t),
		Grace: 10 * time.Second, // generous: a signalled child must beat it on a loaded machine
	}
}

// lines is a Writer that records everything and announces each complete line
// as soon as it is written.
type lines struct {
	mu      sync.Mutex
	all     bytes.Buffer
	partial []byte
	ch      chan string
}

func newLines() *lines { return &lines{ch: make(chan string, 1024)} }

func (l *lines) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.all.Write(p)
	l.partial = append(l.partial, p...)
	for {
		i := bytes.IndexByte(l.partial, '\n')
		if i < 0 {
			break
		}
		select {
		case l.ch <- string(l.partial[:i]):
		default:
		}
		l.partial = l.partial[i+1:]
	}
	return len(p), nil
}

func (l *lines) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.all.String()
}

// await returns the next line starting with prefix. The timeout only keeps a
// broken test from hanging; no test depends on it.
func (l *lines) await(t *testing.T, prefix string) string {
	t.Helper()
	timeout := time.NewTimer(time.Minute)
	defer timeout.Stop()
	for {
		select {
		case s := <-l.ch:
			if strings.HasPrefix(s, prefix) {
				return s
			}
		case <-timeout.C:
			t.Fatalf("no line %q; output so far: %q", prefix, l.String())
		}
	}
}

type outcome struct {
	res process.Result
	err error
}

func runAsync(ctx context.Context, s process.Spec) <-chan outcome {
	ch := make(chan outcome, 1)
	go func() {
		res, err := process.Run(ctx, s)
		ch <- outcome{res, err}
	}()
	return ch
}

func mustRun(t *testing.T, ctx context.Context, s process.Spec) process.Result {
	t.Helper()
	res, err := process.Run(ctx, s)
	if err != nil {
		t.Fatalf("Run: %v", err)
	}
	return res
}

func pidField(t *testing.T, line string, i int) int {
	t.Helper()
	f := strings.Fields(line)
	if i >= len(f) {
		t.Fatalf("line %q has no field %d", line, i)
	}
	pid, err := strconv.Atoi(f[i])
	if err != nil {
		t.Fatalf("line %q: %v", line, err)
	}
	return pid
}

func TestRunExitCodes(t *testing.T) {
	t.Parallel()
	for _, code := range []int{0, 1, 3, 42} {
		t.Run(strconv.Itoa(code), func(t *testing.T) {
			t.Parallel()
			s := childSpec(t, "echo", strconv.Itoa(code))
			var stdout, stderr bytes.Buffer
			s.Stdin, s.Stdout, s.Stderr = strings.NewReader("hello\nworld\n"), &stdout, &stderr
			res := mustRun(t, context.Background(), s)
			if res.ExitCode != code || res.Signal != "" {
				t.Errorf("exit %d signal %q, want %d and none", res.ExitCode, res.Signal, code)
			}
			if res.Stopped || res.StopCause != nil || res.LadderStep != "" {
				t.Errorf("not cancelled, yet Stopped=%v StopCause=%v LadderStep=%q", res.Stopped, res.StopCause, res.LadderStep)
			}
			if res.Escaped != 0 || res.Warning != nil {
				t.Errorf("Escaped=%d Warning=%v, want 0 and nil", res.Escaped, res.Warning)
			}
			if res.Pid <= 0 || res.Duration <= 0 {
				t.Errorf("Pid=%d Duration=%v", res.Pid, res.Duration)
			}
			if got := stdout.String(); got != "hello\nworld\n" {
				t.Errorf("stdout %q", got)
			}
			if got := stderr.String(); got != "to-stderr\n" {
				t.Errorf("stderr %q", got)
			}
		})
	}
}

func TestRunNilStdinIsEOF(t *testing.T) {
	t.Parallel()
	s := childSpec(t, "echo")
	var stdout bytes.Buffer
	s.Stdout = &stdout // Stderr nil: discarded
	res := mustRun(t, context.Background(), s)
	if res.ExitCode != 0 || stdout.Len() != 0 {
		t.Errorf("exit %d stdout %q, want 0 and empty", res.ExitCode, stdout.String())
	}
}

func TestRunEnvironment(t *testing.T) {
	t.Parallel()
	s := childSpec(t, "env")
	host := append(os.Environ(),
		"AQ_FLEET_TOKEN=fleet-secret-value", // aq's secret: EngineEnv removes it
		"CLAUDECODE=1",                      // agent marker: removed
		process.TagEnv+"=stale-job",         // replaced by the tag
		"KEEP_ME=yes",
	)
	s.Env = append(secrets.EngineEnv(host), childVars("env")...)
	envBefore := slices.Clone(s.Env)
	var stdout bytes.Buffer
	s.Stdout = &stdout
	mustRun(t, context.Background(), s)

	if !slices.Equal(s.Env, envBefore) {
		t.Error("Run modified the caller's Env")
	}
	var tags []string
	got := map[string]bool{}
	for _, kv := range strings.Split(strings.TrimSpace(stdout.String()), "\n") {
		name, _, _ := strings.Cut(kv, "=")
		got[name] = true
		if name == process.TagEnv {
			tags = append(tags, kv)
		}
	}
	if want := []string{process.TagEnv + "=" + s.Tag}; !slices.Equal(tags, want) {
		t.Errorf("tag entries %q, want %q", tags, want)
	}
	for _, name := range []string{"AQ_FLEET_TOKEN", "CLAUDECODE"} {
		if got[name] {
			t.Errorf("%s reached the child", name)
		}
	}
	if !got["KEEP_ME"] {
		t.Error("KEEP_ME did not reach the child")
	}
}

// runReady runs s, a "ready-sleep" child, and returns once the child has
// printed its ready line, with Run's outcome to come and the cancel of its
// context.
func runReady(t *testing.T, s process.Spec) (<-chan outcome, context.CancelCauseFunc) {
	t.Helper()
	out := newLines()
	s.Stdout = out
	ctx, cancel := context.WithCancelCause(context.Background())
	t.Cleanup(func() { cancel(nil) })
	done := runAsync(ctx, s)
	out.await(t, "ready")
	return done, cancel
}

// The child sleeps until it is signalled: seeing its line proves the writer
// gets output while the process runs, not when it exits. Cancelled without
// a cause, StopCause is ctx.Err().
func TestRunStreamsOutput(t *testing.T) {
	t.Parallel()
	done, cancel := runReady(t, childSpec(t, "ready-sleep"))
	select {
	case o := <-done:
		t.Fatalf("Run returned before it was cancelled: %+v %v", o.res, o.err)
	default:
	}
	cancel(nil)
	o := <-done
	if o.err != nil || !o.res.Stopped {
		t.Fatalf("err %v Stopped %v", o.err, o.res.Stopped)
	}
	if !errors.Is(o.res.StopCause, context.Canceled) {
		t.Errorf("StopCause=%v, want context.Canceled", o.res.StopCause)
	}
}

// Each line must reach the writer while the child waits for the answer to
// it: output is streamed line by line, in both directions.
func TestRunStreamsLineByLine(t *testing.T) {
	t.Parallel()
	const n = 5
	s := childSpec(t, "lines", strconv.Itoa(n))
	out := newLines()
	pr, pw := io.Pipe()
	s.Stdin, s.Stdout = pr, out
	done := runAsync(context.Background(), s)
	for i := range n {
		out.await(t, fmt.Sprintf("line %d", i))
		if _, err := fmt.Fprintln(pw, "next"); err != nil {
			t.Fatal(err)
		}
	}
	_ = pw.Close()
	o := <-done
	if o.err != nil || o.res.ExitCode != 0 || o.res.Stopped {
		t.Fatalf("Run = %+v, %v; want exit 0, not stopped", o.res, o.err)
	}
}

func TestRunKillLadder(t *testing.T) {
	t.Parallel()
	tests := []struct {
		disposition string
		grace       time.Duration
		step        string
		exit        int
		signal      string
	}{
		// A grace is only sat out when a signal is ignored; a long one
		// elsewhere keeps a slow machine from skipping a step.
		{"exit130", 10 * time.Second, "SIGINT", 130, ""},
		{"default", 10 * time.Second, "SIGINT", -1, "SIGINT"},
		{"ignore-int", 2 * time.Second, "SIGTERM", -1, "SIGTERM"},
		{"ignore-int-term", 100 * time.Millisecond, "SIGKILL", -1, "SIGKILL"},
	}
	for _, tt := range tests {
		t.Run(tt.disposition, func(t *testing.T) {
			t.Parallel()
			s := childSpec(t, "ready-sleep", tt.disposition)
			s.Grace = tt.grace
			done, cancel := runReady(t, s)
			stop := errors.New("timeout")
			cancel(stop)
			o := <-done
			if o.err != nil {
				t.Fatal(o.err)
			}
			r := o.res
			if !r.Stopped || !errors.Is(r.StopCause, stop) {
				t.Errorf("Stopped=%v StopCause=%v, want true and %v", r.Stopped, r.StopCause, stop)
			}
			if r.LadderStep != tt.step || r.ExitCode != tt.exit || r.Signal != tt.signal {
				t.Errorf("step %q exit %d signal %q, want %q %d %q", r.LadderStep, r.ExitCode, r.Signal, tt.step, tt.exit, tt.signal)
			}
		})
	}
}

func TestRunKillsGroupMembers(t *testing.T) {
	t.Parallel()
	s := childSpec(t, "group-grandchild")
	out := newLines()
	s.Stdout = out
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := runAsync(ctx, s)
	gc := pidField(t, out.await(t, "gc "), 1)
	if !process.Alive(gc) {
		t.Fatalf("grandchild %d not running", gc)
	}
	cancel()
	o := <-done
	if o.err != nil {
		t.Fatal(o.err)
	}
	// The leader dies of SIGINT; the grandchild ignores it and is killed with
	// the rest of the group once the leader is gone.
	if o.res.LadderStep != "SIGINT" || o.res.Signal != "SIGINT" {
		t.Errorf("step %q signal %q, want SIGINT for both", o.res.LadderStep, o.res.Signal)
	}
	if process.Alive(gc) {
		t.Errorf("grandchild %d survived Run", gc)
	}
	if o.res.Escaped != 0 {
		t.Errorf("Escaped=%d: a group member is not an escapee", o.res.Escaped)
	}
}

func TestRunKillsEscapedTagged(t *testing.T) {
	t.Parallel()
	for _, disposition := range []string{"default", "ignore-int-term"} {
		t.Run(disposition, func(t *testing.T) {
			t.Parallel()
			requireProc(t)
			s := childSpec(t, "escape", disposition)
			s.Grace = 100 * time.Millisecond
			out := newLines()
			pr, pw := io.Pipe()
			s.Stdin, s.Stdout = pr, out
			done := runAsync(context.Background(), s)
			line := out.await(t, "pids ")
			leader, gc := pidField(t, line, 1), pidField(t, line, 2)

			pids, err := process.FindTagged(s.Tag)
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Contains(pids, leader) || !slices.Contains(pids, gc) {
				t.Errorf("FindTagged = %v, want both leader %d and escaped grandchild %d", pids, leader, gc)
			}
			lpg, _ := syscall.Getpgid(leader)
			gpg, _ := syscall.Getpgid(gc)
			if lpg == gpg {
				t.Fatalf("grandchild did not leave the group (pgid %d)", gpg)
			}

			_ = pw.Close() // the leader exits 0 on EOF, leaving the grandchild behind
			o := <-done
			if o.err != nil {
				t.Fatal(o.err)
			}
			if o.res.ExitCode != 0 || o.res.Stopped {
				t.Errorf("exit %d Stopped %v, want 0 and false", o.res.ExitCode, o.res.Stopped)
			}
			if o.res.Escaped != 1 {
				t.Errorf("Escaped=%d, want 1", o.res.Escaped)
			}
			if process.Alive(gc) {
				t.Errorf("escaped grandchild %d survived Run", gc)
			}
		})
	}
}

func TestRunChildIgnoresStdin(t *testing.T) {
	t.Parallel()
	big := bytes.Repeat([]byte("prompt line that nobody reads\n"), 1<<19) // ~15 MiB, far beyond a pipe buffer
	for _, code := range []int{0, 3} {
		t.Run(strconv.Itoa(code), func(t *testing.T) {
			t.Parallel()
			s := childSpec(t, "no-stdin", strconv.Itoa(code))
			s.Stdin = bytes.NewReader(big)
			res := mustRun(t, context.Background(), s)
			if res.ExitCode != code || res.Warning != nil {
				t.Errorf("exit %d Warning %v, want %d and nil (EPIPE is expected)", res.ExitCode, res.Warning, code)
			}
		})
	}
}

func TestRunGroupMemberHoldingStdout(t *testing.T) {
	t.Parallel()
	s := childSpec(t, "hold-stdout")
	// If the group were not killed as soon as the leader exits, Wait would
	// sit out WaitDelay and report exec.ErrWaitDelay.
	s.WaitDelay = 30 * time.Second
	out := newLines()
	s.Stdout = out
	res := mustRun(t, context.Background(), s)
	gc := pidField(t, out.await(t, "gc "), 1)
	if res.ExitCode != 0 || res.Warning != nil {
		t.Errorf("exit %d Warning %v, want 0 and nil", res.ExitCode, res.Warning)
	}
	if process.Alive(gc) {
		t.Errorf("grandchild %d holding stdout survived Run", gc)
	}
}

func TestRunWaitDelay(t *testing.T) {
	t.Parallel()
	pidFile := filepath.Join(t.TempDir(), "gc.pid")
	s := childSpec(t, "hold-stdout-untraceable", pidFile)
	s.Grace, s.WaitDelay = 100*time.Millisecond, 200*time.Millisecond
	s.Stdout = io.Discard
	res := mustRun(t, context.Background(), s)
	b, err := os.ReadFile(pidFile)
	if err != nil {
		t.Fatal(err)
	}
	gc, _ := strconv.Atoi(string(b))
	// Out of the group and untagged: aq cannot find it, only stop waiting.
	t.Cleanup(func() { _ = syscall.Kill(gc, syscall.SIGKILL) })
	if res.ExitCode != 0 || !errors.Is(res.Warning, exec.ErrWaitDelay) {
		t.Errorf("exit %d Warning %v, want 0 and exec.ErrWaitDelay", res.ExitCode, res.Warning)
	}
	if res.Escaped != 0 {
		t.Errorf("Escaped=%d, want 0 (the holder dropped the tag)", res.Escaped)
	}
}

func TestRunSignalledOnItsOwn(t *testing.T) {
	t.Parallel()
	res := mustRun(t, context.Background(), childSpec(t, "self-signal"))
	if res.ExitCode != -1 || res.Signal != "SIGHUP" || res.Stopped || res.LadderStep != "" {
		t.Errorf("exit %d signal %q Stopped %v step %q, want -1 SIGHUP false \"\"", res.ExitCode, res.Signal, res.Stopped, res.LadderStep)
	}
}

// TestEngineGetsTheLaddersSignals: an aq started with SIGINT ignored (in
// the background of a shell without job control) still starts its engines
// with SIGINT's default disposition, so the ladder's first, polite step
// reaches them. A shell sets the ignore, then executes the test binary.
func TestEngineGetsTheLaddersSignals(t *testing.T) {
	t.Parallel()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("/bin/sh", "-c", `trap '' INT; exec "$0"`, self)
	cmd.Env = childEnv("run-ignoring-int")
	out, err := cmd.CombinedOutput()
	if err != nil || strings.TrimSpace(string(out)) != "default" {
		t.Fatalf("the engine of an aq that ignores SIGINT found it %q (%v), want default", out, err)
	}
}

func TestRunStartErrors(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	notExec := filepath.Join(dir, "engine")
	if err := os.WriteFile(notExec, []byte("#!/bin/sh\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	stop := errors.New("shutdown")
	cancelled, cancel := context.WithCancelCause(context.Background())
	cancel(stop)

	tests := []struct {
		name string
		ctx  context.Context
		edit func(*process.Spec)
		want error
	}{
		{"not on PATH", context.Background(), func(s *process.Spec) { s.Path = "aq-no-such-engine" }, exec.ErrNotFound},
		{"missing file", context.Background(), func(s *process.Spec) { s.Path = filepath.Join(dir, "missing") }, fs.ErrNotExist},
		{"not executable", context.Background(), func(s *process.Spec) { s.Path = notExec }, fs.ErrPermission},
		{"missing dir", context.Background(), func(s *process.Spec) { s.Dir = filepath.Join(dir, "missing") }, fs.ErrNotExist},
		{"no tag", context.Background(), func(s *process.Spec) { s.Tag = "" }, nil},
		{"already cancelled", cancelled, func(*process.Spec) {}, stop},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			s := childSpec(t, "echo")
			tt.edit(&s)
			res, err := process.Run(tt.ctx, s)
			if err == nil {
				t.Fatalf("Run succeeded: %+v", res)
			}
			if tt.want != nil && !errors.Is(err, tt.want) {
				t.Errorf("error %v is not %v", err, tt.want)
			}
		})
	}
	t.Run("already cancelled is context.Canceled", func(t *testing.T) {
		_, err := process.Run(cancelled, childSpec(t, "echo"))
		if !errors.Is(err, context.Canceled) {
			t.Errorf("error %v is not context.Canceled", err)
		}
	})
}

func TestRunConcurrent(t *testing.T) {
	t.Parallel()
	const n = 8
	var wg sync.WaitGroup
	for i := range n {
		s := childSpec(t, "echo", strconv.Itoa(i))
		wg.Go(func() {
			in := strings.Repeat(fmt.Sprintf("job %d\n", i), 1000)
			var stdout bytes.Buffer
			s.Stdin, s.Stdout = strings.NewReader(in), &stdout
			res, err := process.Run(context.Background(), s)
			if err != nil {
				t.Errorf("job %d: %v", i, err)
				return
			}
			if res.ExitCode != i || stdout.String() != in {
				t.Errorf("job %d: exit %d, stdout %d bytes, want %d and %d bytes", i, res.ExitCode, stdout.Len(), i, len(in))
			}
		})
	}
	wg.Wait()
}

// taggedChild is a process started by a test (not by Run) with a tag.
type taggedChild struct {
	cmd    *exec.Cmd
	reaped chan struct{} // closed once cmd.Wait returned; cmd.ProcessState is set
}

// startTagged starts the test binary in mode ready-sleep with the given
// environment tag entry, in a session of its own, and waits until it is
// ready. It is killed and reaped when the test ends.
func startTagged(t *testing.T, tagEntry, disposition string, extraEnv ...string) *taggedChild {
	t.Helper()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(self, disposition)
	cmd.Env = append(append(childEnv("ready-sleep"), tagEntry), extraEnv...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	c := &taggedChild{cmd: cmd, reaped: make(chan struct{})}
	go func() { _ = cmd.Wait(); close(c.reaped) }()
	t.Cleanup(func() { _ = cmd.Process.Kill(); <-c.reaped })
	if line, _ := bufio.NewReader(out).ReadString('\n'); line != "ready\n" {
		t.Fatalf("child not ready: %q", line)
	}
	return c
}

// killedBy waits for c to be reaped and returns the signal that ended it.
func (c *taggedChild) killedBy(t *testing.T) syscall.Signal {
	t.Helper()
	<-c.reaped
	ws, ok := c.cmd.ProcessState.Sys().(syscall.WaitStatus)
	if !ok || !ws.Signaled() {
		t.Fatalf("child %d was not killed by a signal: %v", c.cmd.Process.Pid, c.cmd.ProcessState)
	}
	return ws.Signal()
}

func TestFindTaggedExactMatch(t *testing.T) {
	t.Parallel()
	requireProc(t)
	tag := newTag(t)
	other := newTag(t)
	p := startTagged(t, process.TagEnv+"="+other, "default", "DECOY="+process.TagEnv+"="+tag)

	pids, err := process.FindTagged(tag)
	if err != nil || len(pids) != 0 {
		t.Errorf("FindTagged(%q) = %v, %v; want nothing (only %q and a decoy value are set)", tag, pids, err, other)
	}
	pids, err = process.FindTagged(other)
	if err != nil || !slices.Equal(pids, []int{p.cmd.Process.Pid}) {
		t.Errorf("FindTagged(%q) = %v, %v; want [%d]", other, pids, err, p.cmd.Process.Pid)
	}
	if _, err := process.FindTagged(""); err == nil {
		t.Error(`FindTagged("") succeeded`)
	}
	if n, err := process.KillTagged(context.Background(), other, time.Second); n != 1 || err != nil {
		t.Errorf("KillTagged = %d, %v; want 1, nil", n, err)
	}
}

func TestKillTagged(t *testing.T) {
	t.Parallel()
	requireProc(t)
	tests := []struct {
		disposition string
		grace       time.Duration // long where it is not sat out
		n           int
		sig         syscall.Signal
	}{
		{"default", time.Minute, 2, syscall.SIGTERM},
		{"ignore-int-term", 100 * time.Millisecond, 1, syscall.SIGKILL},
	}
	for _, tt := range tests {
		t.Run(tt.disposition, func(t *testing.T) {
			t.Parallel()
			tag := newTag(t)
			var children []*taggedChild
			for range tt.n {
				children = append(children, startTagged(t, process.TagEnv+"="+tag, tt.disposition))
			}
			n, err := process.KillTagged(context.Background(), tag, tt.grace)
			if err != nil || n != tt.n {
				t.Fatalf("KillTagged = %d, %v; want %d, nil", n, err, tt.n)
			}
			if pids, _ := process.FindTagged(tag); len(pids) != 0 {
				t.Errorf("still tagged after KillTagged: %v", pids)
			}
			for _, c := range children {
				if sig := c.killedBy(t); sig != tt.sig {
					t.Errorf("child ended by %v, want %v", sig, tt.sig)
				}
			}
			if n, err := process.KillTagged(context.Background(), tag, time.Second); n != 0 || err != nil {
				t.Errorf("second KillTagged = %d, %v; want 0, nil", n, err)
			}
		})
	}
}

func TestKillTaggedCancelledSkipsGrace(t *testing.T) {
	t.Parallel()
	requireProc(t)
	tag := newTag(t)
	stubborn := startTagged(t, process.TagEnv+"="+tag, "ignore-int-term")
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	// An hour of grace, but the context is done: straight to SIGKILL.
	if n, err := process.KillTagged(ctx, tag, time.Hour); n != 1 || err != nil {
		t.Fatalf("KillTagged = %d, %v; want 1, nil", n, err)
	}
	if sig := stubborn.killedBy(t); sig != syscall.SIGKILL {
		t.Errorf("ended by %v, want SIGKILL", sig)
	}
}

func BenchmarkRun(b *testing.B) {
	path, err := exec.LookPath("true")
	if err != nil {
		b.Skip("no true(1) on PATH")
	}
	s := process.Spec{Path: path, Env: []string{"PATH=/usr/bin:/bin"}, Tag: newTag(b)}
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		res, err := process.Run(ctx, s)
		if err != nil || res.ExitCode != 0 {
			b.Fatalf("Run: %+v %v", res, err)
		}
	}
}

func BenchmarkFindTagged(b *testing.B) {
	if !procWorks {
		b.Skip("needs /proc")
	}
	tag := newTag(b)
	b.ReportAllocs()
	for b.Loop() {
		if _, err := process.FindTagged(tag); err != nil {
			b.Fatal(err)
		}
	}
}
