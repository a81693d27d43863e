package fleetdemo

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/aqfleet/aq/agent/daemon"
	"github.com/aqfleet/aq/internal/process"
)

// factory is one `aq daemon` child process with its own AQ_HOME and
// AQ_REPO_BASE (its own clones of the three repos).
type factory struct {
	id      string
	dir     string
	home    string
	base    string
	logPath string
	env     []string

	cmd   *exec.Cmd
	done  chan struct{}
	state *os.ProcessState // once done
	pids  []int            // every pid this factory ever had
}

// start launches `aq daemon` (again, after a kill: the same home).
func (f *factory) start(aqBin string) error {
	logf, err := os.OpenFile(f.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	cmd := exec.Command(aqBin, "daemon")
	cmd.Env = f.env
	cmd.Dir = f.dir
	cmd.Stdout, cmd.Stderr = logf, logf
	// Its own process group: a Ctrl-C at the terminal reaches the demo only,
	// and the demo stops its children itself, in order.
	process.SetGroup(cmd)
	if err := cmd.Start(); err != nil {
		logf.Close()
		return fmt.Errorf("start aq daemon for %s: %w", f.id, err)
	}
	done := make(chan struct{})
	f.cmd, f.done, f.state = cmd, done, nil
	f.pids = append(f.pids, cmd.Process.Pid)
	go func() {
		_ = cmd.Wait()
		logf.Close()
		close(done)
	}()
	return nil
}

func (f *factory) pid() int {
	if f.cmd == nil || f.cmd.Process == nil {
		return 0
	}
	return f.cmd.Process.Pid
}

// running reports whether the daemon process is still there.
func (f *factory) running() bool {
	if f.done == nil {
		return false
	}
	select {
	case <-f.done:
		f.state = f.cmd.ProcessState
		return false
	default:
		return true
	}
}

// kill9 is `kill -9 <pid>`: the daemon dies on the spot (its engines, in
// their own process groups, do not).
func (f *factory) kill9() (*os.ProcessState, error) {
	if !f.running() {
		return nil, errors.New(f.id + " is not running")
	}
	if err := f.cmd.Process.Kill(); err != nil {
		return nil, err
	}
	<-f.done
	f.state = f.cmd.ProcessState
	return f.state, nil
}

// stop sends SIGTERM (drain), and after drain a second one (abort: running
// jobs are stopped and checkpointed), then SIGKILL as a last resort. It
// returns the exit code (-1 when killed by a signal).
func (f *factory) stop(drain time.Duration) int {
	if f.done == nil {
		return -1
	}
	p := f.cmd.Process
	steps := []struct {
		send func(*os.Process) error
		wait time.Duration
	}{{process.Terminate, drain}, {process.Terminate, 30 * time.Second}, {(*os.Process).Kill, time.Minute}}
	for _, s := range steps {
		if !f.running() {
			break
		}
		_ = s.send(p)
		t := time.NewTimer(s.wait)
		select {
		case <-f.done:
		case <-t.C:
		}
		t.Stop()
	}
	if f.running() {
		return -1
	}
	f.state = f.cmd.ProcessState
	return f.state.ExitCode()
}

// status reads the daemon's status file.
func (f *factory) status() *daemon.Status {
	st, err := daemon.ReadStatus(filepath.Join(f.home, "state"))
	if err != nil {
		return nil
	}
	return st
}

// tail is the last n lines of the daemon's log (for a failed run).
func (f *factory) tail(n int) string {
	b, err := os.ReadFile(f.logPath)
	if err != nil {
		return ""
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// runAQ runs one aq command (submit, gc, status) to completion with env.
func runAQ(ctx context.Context, aqBin string, env []string, dir string, args ...string) (stdout, stderr string, code int, err error) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, aqBin, args...)
	cmd.Env = env
	cmd.Dir = dir
	var o, e bytes.Buffer
	cmd.Stdout, cmd.Stderr = &o, &e
	err = cmd.Run()
	code = -1
	if cmd.ProcessState != nil {
		code = cmd.ProcessState.ExitCode()
	}
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		err = nil // the exit code says it
	}
	return o.String(), e.String(), code, err
}
