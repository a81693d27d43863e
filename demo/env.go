package demo

import (
	"errors"
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
