//go:build linux

package chaos

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"
)

// child is one process the harness started, in its own process group (a
// Ctrl-C on the terminal reaches the harness alone, which then stops its
// children in order).
type child struct {
	name string
	cmd  *exec.Cmd
	done chan struct{}
	code int // exit code; -1 when a signal ended it
	sig  string
	// readyAddr is where a helper said it listens.
	readyAddr string
}

func startChild(name string, cmd *exec.Cmd, logPath string) (*child, error) {
	return startChildReady(name, cmd, logPath, false)
}

// startChildReady starts cmd; with wantReady it waits for the helper's
// first stdout line ({"event":"ready","addr":...}) and keeps the address in
// readyAddr.
func startChildReady(name string, cmd *exec.Cmd, logPath string, wantReady bool) (*child, error) {
	if err := os.MkdirAll(filepath.Dir(logPath), 0o755); err != nil {
		return nil, err
	}
	lf, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Stderr = lf
	var out io.ReadCloser
	if wantReady {
		if out, err = cmd.StdoutPipe(); err != nil {
			lf.Close()
			return nil, err
		}
	} else {
		cmd.Stdout = lf
	}
	if err := cmd.Start(); err != nil {
		lf.Close()
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	c := &child{name: name, cmd: cmd, done: make(chan struct{})}
	var line []byte
	var rerr error
	var rest *bufio.Reader
	if wantReady {
		rest = bufio.NewReader(out)
		line, rerr = rest.ReadBytes('\n')
	}
	go func() {
		if rest != nil {
			_, _ = io.Copy(lf, rest)
		}
		err := cmd.Wait()
		c.code = cmd.ProcessState.ExitCode()
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
				c.sig = ws.Signal().String()
			}
		}
		lf.Close()
		close(c.done)
	}()
	if wantReady {
		var r struct {
			Event string `json:"event"`
			Addr  string `json:"addr"`
		}
		if rerr != nil || json.Unmarshal(line, &r) != nil || r.Event != "ready" {
			c.kill()
			c.wait()
			b, _ := os.ReadFile(logPath)
			return nil, fmt.Errorf("%s did not start: %s", name, tail(string(b), 800))
		}
		c.readyAddr = r.Addr
	}
	return c, nil
}

// alive reports whether the process has not exited yet.
func (c *child) alive() bool {
	select {
	case <-c.done:
		return false
	default:
		return true
	}
}

// kill sends SIGKILL to the process alone (not its group: a kill -9 of aq
// leaves its engines running, as on a real host).
func (c *child) kill() { _ = c.cmd.Process.Signal(syscall.SIGKILL) }

// killGroup sends SIGKILL to the process group.
func (c *child) killGroup() { _ = syscall.Kill(-c.cmd.Process.Pid, syscall.SIGKILL) }

func (c *child) signal(s syscall.Signal) { _ = c.cmd.Process.Signal(s) }

// wait waits for the exit.
func (c *child) wait() { <-c.done }

// waitFor waits at most d; it reports whether the process exited.
func (c *child) waitFor(d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-c.done:
		return true
	case <-t.C:
		return false
	}
}

// helperCommand is this binary as helper kind with config cfg (written to
// dir), to be run on host (nil: here).
func helperCommand(exe, dir, kind, name string, cfg any, wrap func(name string, args ...string) *exec.Cmd) (*exec.Cmd, error) {
	b, err := json.Marshal(cfg)
	if err != nil {
		return nil, err
	}
	p := filepath.Join(dir, name+".json")
	if err := os.WriteFile(p, b, 0o600); err != nil {
		return nil, err
	}
	var cmd *exec.Cmd
	if wrap != nil {
		cmd = wrap(exe)
	} else {
		cmd = exec.Command(exe)
	}
	cmd.Env = append(os.Environ(), HelperEnv+"="+kind+":"+p)
	return cmd, nil
}

func tail(s string, n int) string {
	s = strings.TrimSpace(s)
	if len(s) > n {
		return "…" + s[len(s)-n:]
	}
	return s
}
