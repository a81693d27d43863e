package testenv

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// Tmux is one detached tmux session on a private server: the real terminal
// the board and the live view are tested in (capture-pane reads its
// screen).
type Tmux struct {
	tb   testing.TB
	sock string
	env  []string
}

// StartTmux runs command (a shell line) in a cols×rows tmux session; after
// it exits the pane shows "EXITED <code>". It skips tb when tmux is not
// installed (.ci/run installs it from Debian).
func StartTmux(tb testing.TB, env []string, cols, rows int, command string) *Tmux {
	tb.Helper()
	if _, err := exec.LookPath("tmux"); err != nil {
		tb.Skip("tmux is not installed: the terminal tests need it (.ci/run installs it from Debian)")
	}
	dir, err := os.MkdirTemp("", "aqtmux") // short: a socket path is at most ~100 bytes
	if err != nil {
		tb.Fatal(err)
	}
	x := &Tmux{tb: tb, sock: filepath.Join(dir, "s"), env: append(terminalFree(env), "TERM=xterm-256color", "LANG=C.UTF-8", "LC_ALL=C.UTF-8")}
	tb.Cleanup(func() {
		_ = x.Cmd("kill-server").Run()
		os.RemoveAll(dir)
	})
	line := command + `; echo "EXITED $?"; sleep 600`
	if out, err := x.Cmd("new-session", "-d", "-s", "aq", "-x", fmt.Sprint(cols), "-y", fmt.Sprint(rows), line).CombinedOutput(); err != nil {
		tb.Fatalf("tmux new-session: %v %s", err, out)
	}
	return x
}

// terminalFree is env without what the test runner's own environment says
// about its terminal: CI (set by CI runners) makes termenv take any output
// for "not a terminal" and draw no style, CLICOLOR and CLICOLOR_FORCE
// override the profile, and TERM, COLORTERM, TERM_PROGRAM, TMUX and STY
// describe a terminal that is not the pane. NO_COLOR stays: tests set it.
func terminalFree(env []string) []string {
	var out []string
	for _, kv := range env {
		switch k, _, _ := strings.Cut(kv, "="); k {
		case "CI", "CLICOLOR", "CLICOLOR_FORCE", "TERM", "COLORTERM", "TERM_PROGRAM", "TMUX", "STY":
			continue
		}
		out = append(out, kv)
	}
	return out
}

// Cmd is a tmux command on the session's server.
func (x *Tmux) Cmd(args ...string) *exec.Cmd {
	c := exec.Command("tmux", append([]string{"-S", x.sock, "-f", "/dev/null"}, args...)...)
	c.Env = x.env
	return c
}

// Keys types keys (tmux key names: Down, Enter, Escape, C-c, or text).
func (x *Tmux) Keys(keys ...string) {
	x.tb.Helper()
	if out, err := x.Cmd(append([]string{"send-keys", "-t", "aq"}, keys...)...).CombinedOutput(); err != nil {
		x.tb.Fatalf("send-keys %v: %v %s", keys, err, out)
	}
}

// Screen is what the pane shows now (escapes: with its escape sequences,
// to see styles).
func (x *Tmux) Screen(escapes bool) string {
	x.tb.Helper()
	args := []string{"capture-pane", "-p", "-t", "aq"}
	if escapes {
		args = append(args, "-e")
	}
	out, err := x.Cmd(args...).Output()
	if err != nil {
		x.tb.Fatalf("capture-pane: %v", err)
	}
	return string(out)
}

// WaitScreen waits (bounded: a deadlock guard, not a speed requirement)
// until the screen satisfies cond, and returns it.
func (x *Tmux) WaitScreen(what string, cond func(string) bool) string {
	x.tb.Helper()
	var s string
	deadline := time.Now().Add(90 * time.Second)
	for time.Now().Before(deadline) {
		s = x.Screen(false)
		if cond(s) {
			return s
		}
		time.Sleep(100 * time.Millisecond)
	}
	x.tb.Fatalf("the screen never showed %s; it shows:\n%s", what, s)
	return ""
}

// WaitText waits until the screen shows every one of texts.
func (x *Tmux) WaitText(texts ...string) string {
	x.tb.Helper()
	return x.WaitScreen(fmt.Sprintf("%q", texts), func(s string) bool {
		for _, t := range texts {
			if !strings.Contains(s, t) {
				return false
			}
		}
		return true
	})
}
