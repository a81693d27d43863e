package termtest

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// tmuxSession is one detached tmux session on a private server: the real
// terminal the live view is tested in (capture-pane reads its screen).
type tmuxSession struct {
	t    *testing.T
	sock string
	env  []string
}

// startTmux runs command (a shell line) in a cols×rows tmux session; after
// it exits the pane shows "EXITED <code>". It skips without tmux.
func startTmux(t *testing.T, env []string, cols, rows int, command string) *tmuxSession {
	t.Helper()
	if _, err := exec.LookPath("tmux"); err != nil {
		t.Skip("tmux is not installed: the terminal tests need it (.ci/run installs it from Debian)")
	}
	dir, err := os.MkdirTemp("", "aqtmux") // short: a socket path is at most ~100 bytes
	if err != nil {
		t.Fatal(err)
	}
	x := &tmuxSession{t: t, sock: filepath.Join(dir, "s"), env: append(env, "TERM=xterm-256color", "LANG=C.UTF-8", "LC_ALL=C.UTF-8")}
	t.Cleanup(func() {
		_ = x.cmd("kill-server").Run()
		os.RemoveAll(dir)
	})
	line := command + `; echo "EXITED $?"; sleep 600`
	if out, err := x.cmd("new-session", "-d", "-s", "aq", "-x", fmt.Sprint(cols), "-y", fmt.Sprint(rows), line).CombinedOutput(); err != nil {
		t.Fatalf("tmux new-session: %v %s", err, out)
	}
	return x
}

func (x *tmuxSession) cmd(args ...string) *exec.Cmd {
	c := exec.Command("tmux", append([]string{"-S", x.sock, "-f", "/dev/null"}, args...)...)
	c.Env = x.env
	return c
}

func (x *tmuxSession) keys(keys ...string) {
	x.t.Helper()
	if out, err := x.cmd(append([]string{"send-keys", "-t", "aq"}, keys...)...).CombinedOutput(); err != nil {
		x.t.Fatalf("send-keys %v: %v %s", keys, err, out)
	}
}

// screen is what the pane shows now (-e: with its escape sequences, to
// see styles).
func (x *tmuxSession) screen(escapes bool) string {
	x.t.Helper()
	args := []string{"capture-pane", "-p", "-t", "aq"}
	if escapes {
		args = append(args, "-e")
	}
	out, err := x.cmd(args...).Output()
	if err != nil {
		x.t.Fatalf("capture-pane: %v", err)
	}
	return string(out)
}

// waitScreen waits (bounded: a deadlock guard, not a speed requirement)
// until the screen satisfies cond, and returns it.
func (x *tmuxSession) waitScreen(what string, cond func(string) bool) string {
	x.t.Helper()
	var s string
	deadline := time.Now().Add(90 * time.Second)
	for time.Now().Before(deadline) {
		s = x.screen(false)
		if cond(s) {
			return s
		}
		time.Sleep(100 * time.Millisecond)
	}
	x.t.Fatalf("the screen never showed %s; it shows:\n%s", what, s)
	return ""
}

func (x *tmuxSession) waitText(texts ...string) string {
	x.t.Helper()
	return x.waitScreen(fmt.Sprintf("%q", texts), func(s string) bool {
		for _, t := range texts {
			if !strings.Contains(s, t) {
				return false
			}
		}
		return true
	})
}

func shellQuote(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }

// shellLine is a command line that runs args in dir (the environment is
// the session's).
func shellLine(dir string, args ...string) string {
	q := make([]string, len(args))
	for i, a := range args {
		q[i] = shellQuote(a)
	}
	return "cd " + shellQuote(dir) + " && " + strings.Join(q, " ")
}
