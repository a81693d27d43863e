package demo

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/aqfleet/aq/demo/sbpeer/sbpeerproc"
)

// ChildEnv is env without aq's own variables (the user's AQ_FLEET_TOKEN or
// config must not leak into the demo) and with git and aq configuration
// isolated in the workspace.
func ChildEnv(env []string, ws string) []string {
	if env == nil {
		env = os.Environ()
	}
	out := make([]string, 0, len(env)+4)
	for _, kv := range env {
		k, _, _ := strings.Cut(kv, "=")
		switch {
		case strings.HasPrefix(k, "AQ_"), k == "POLL_SECONDS", k == "XDG_CONFIG_HOME",
			strings.HasPrefix(k, "GIT_"):
			continue
		}
		out = append(out, kv)
	}
	return append(out, "GIT_CONFIG_GLOBAL="+filepath.Join(ws, "gitconfig"), "GIT_CONFIG_NOSYSTEM=1",
		"XDG_CONFIG_HOME="+filepath.Join(ws, "xdg"), "GIT_TERMINAL_PROMPT=0")
}

// PeerMissing says why the peer cannot run with this environment ("" when it
// can): node on PATH, and demo/sbpeer with its node_modules installed.
func PeerMissing(env []string, dir string) string {
	if _, err := LookPath("node", env); err != nil {
		return "Node.js (node) is not on PATH"
	}
	if dir == "" {
		return "demo/sbpeer was not found (run aq demo from a clone of aq)"
	}
	if !sbpeerproc.Installed(dir) {
		return "the peer's packages are not installed (run: make sbpeer)"
	}
	return ""
}

// LookPath finds an executable in env's PATH (not this process's: a test
// may hide node from the demo).
func LookPath(name string, env []string) (string, error) {
	path := ""
	for _, kv := range env {
		if v, ok := strings.CutPrefix(kv, "PATH="); ok {
			path = v
		}
	}
	for _, dir := range filepath.SplitList(path) {
		if dir == "" {
			dir = "."
		}
		p := filepath.Join(dir, name)
		if st, err := os.Stat(p); err == nil && !st.IsDir() && st.Mode()&0o111 != 0 {
			return p, nil
		}
	}
	return "", errors.New(name + " is not on PATH")
}

// Workspace is an act's workspace: dir (made if missing), or a new temp dir
// named for prefix. cleanup removes a temp dir unless keep; it leaves a
// given dir alone. The path returned is absolute.
func Workspace(dir, prefix string, keep bool) (ws string, cleanup func(), err error) {
	cleanup = func() {}
	if dir == "" {
		if dir, err = os.MkdirTemp("", prefix); err != nil {
			return "", cleanup, err
		}
		if !keep {
			tmp := dir
			cleanup = func() { _ = os.RemoveAll(tmp) }
		}
	} else if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", cleanup, err
	}
	if ws, err = filepath.Abs(dir); err != nil {
		cleanup()
		return "", func() {}, err
	}
	return ws, cleanup, nil
}

// Binary is aq, or this executable when aq is empty: the binary an act's
// children run.
func Binary(aq string) (string, error) {
	if aq != "" {
		return aq, nil
	}
	exe, err := os.Executable()
	if err != nil {
		return "", fmt.Errorf("find the aq binary: %w", err)
	}
	return exe, nil
}
