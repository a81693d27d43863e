// Package clitest holds the helpers that cmd/aq/cli's tests and the
// packages of its binary tests (cmd/aq/clitest/...) share: a home for the
// aq binary, a script job's front matter, aq started in the background, a
// coordinator stub with aq's environment pointed at it, one command's JSON.
// The binary tests live in packages of their own so that they run beside
// the in-process tests and beside each other (#35). It imports nothing of
// cmd/aq/cli, so cli's own tests can use it too.
package clitest

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/aqfleet/aq/agent/config"
	"github.com/aqfleet/aq/demo/coord"
	"github.com/aqfleet/aq/demo/coord/coordtest"
	"github.com/aqfleet/aq/internal/process"
	"github.com/aqfleet/aq/internal/testenv"
)

// CleanEnv clears every aq variable and points HOME at a temp dir, so a test
// sees only the configuration it sets.
func CleanEnv(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	for _, k := range config.Keys {
		for _, e := range k.Env {
			t.Setenv(e, "")
			os.Unsetenv(e)
		}
	}
	t.Setenv("HOME", dir)
	t.Setenv("XDG_CONFIG_HOME", filepath.Join(dir, "xdg"))
	t.Setenv("AQ_HOME", filepath.Join(dir, "aqhome"))
	return dir
}

// BinHome is an AQ_HOME for the binary; its engines run sandboxed, as by
// default.
func BinHome(t *testing.T) *testenv.Home {
	t.Helper()
	if testing.Short() {
		t.Skip("runs the aq binary")
	}
	h := testenv.NewHome(t)
	h.Bin = testenv.BuildAQ(t)
	return h
}

// MarkedHome is BinHome for tests whose engines write markers to a folder
// outside their worktree (MARK, returned), which the sandbox would keep
// from the host: their engines run unsandboxed (AQ_SANDBOX=off).
func MarkedHome(t *testing.T) (*testenv.Home, string) {
	t.Helper()
	h := BinHome(t)
	mark := t.TempDir()
	// MARK reaches the engines as an operator passes a variable
	// (AQ_ENGINE_ENV): an engine's environment is built, not inherited.
	h.Env = append(h.Env, "MARK="+mark, "AQ_ENGINE_ENV=MARK", "AQ_SANDBOX=off")
	return h, mark
}

// ScriptJob is front matter for a script job on repo: the script as a YAML
// block, then extra lines.
func ScriptJob(repo, script string, extra ...string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "repo: %s\nengine: script\nscript: |\n", repo)
	for _, l := range strings.Split(strings.TrimRight(script, "\n"), "\n") {
		b.WriteString("  " + l + "\n")
	}
	for _, e := range extra {
		b.WriteString(e + "\n")
	}
	return b.String()
}

// JSON runs `aq ARGS...` (a command with --json among ARGS), which must
// exit 0, and decodes its stdout into a V.
func JSON[V any](t *testing.T, h *testenv.Home, args ...string) V {
	t.Helper()
	var v V
	r := h.Run(t, args...)
	if r.Code != 0 {
		t.Fatalf("aq %s: %s", strings.Join(args, " "), r)
	}
	if err := json.Unmarshal([]byte(r.Stdout), &v); err != nil {
		t.Fatalf("aq %s: %v\n%s", strings.Join(args, " "), err, r.Stdout)
	}
	return v
}

// Start starts aq in the background (in its own process group, killed when
// the test ends).
func Start(t *testing.T, h *testenv.Home, args ...string) *Started {
	t.Helper()
	cmd := h.Command(t, args...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = process.KillGroup(cmd.Process.Pid) })
	s := &Started{t: t, PID: cmd.Process.Pid, done: make(chan startedResult, 1)}
	go func() {
		res, err := testenv.Wait(cmd, &out, &errb, 3*time.Minute)
		s.done <- startedResult{res, err}
	}()
	return s
}

// Started is an aq process running in the background.
type Started struct {
	t    *testing.T
	PID  int
	done chan startedResult
	res  *startedResult // once Wait or WaitMark saw it end
}

type startedResult struct {
	res testenv.Result
	err error
}

// Wait waits for the process to end.
func (s *Started) Wait() testenv.Result {
	s.t.Helper()
	if s.res == nil {
		r := <-s.done
		s.res = &r
	}
	if s.res.err != nil {
		s.t.Fatal(s.res.err)
	}
	return s.res.res
}

// WaitMark waits for a script's marker while aq runs; aq ending first fails
// the test with its output.
func (s *Started) WaitMark(mark, name string) {
	s.t.Helper()
	testenv.WaitFor(s.t, 2*time.Minute, "marker "+name, func() bool {
		if testenv.Exists(filepath.Join(mark, name)) {
			return true
		}
		select {
		case r := <-s.done:
			s.res = &r
			s.t.Fatalf("aq ended before the engine wrote %s: %s (%v)", name, r.res, r.err)
		default:
		}
		return false
	})
}

// FleetEnv starts a coordinator stub on 127.0.0.1 and points aq's
// environment at it, with a repo (and bare origin) under AQ_REPO_BASE.
func FleetEnv(t *testing.T) (s *coord.Served, dir, origin string) {
	t.Helper()
	return FleetEnvRoutes(t, coord.RoutesFull)
}

// FleetEnvRoutes is FleetEnv with the stub serving a route set.
func FleetEnvRoutes(t *testing.T, routes string) (s *coord.Served, dir, origin string) {
	t.Helper()
	dir = CleanEnv(t)
	s = coordtest.Start(t, coord.Options{Routes: routes})
	base := filepath.Join(dir, "src")
	origin = testenv.AddOrigin(t, testenv.NewRepo(t, base, "app", nil))
	for k, v := range map[string]string{
		"AQ_FLEET": "1", "AQ_FLEET_API": s.API, "AQ_FLEET_TOKEN": s.EnrollToken(), "AQ_FACTORY_ID": "cli-factory", "AQ_ENGINES": "all",
		"AQ_REPO_BASE": base, "AQ_KILL_GRACE": "200ms", "AQ_HEARTBEAT_SEC": "1", "AQ_FLEET_LEASE_RENEW_SEC": "1", "AQ_POLL_SECONDS": "1",
	} {
		t.Setenv(k, v)
	}
	return s, dir, origin
}

// WriteManifest writes dir/ID.md, a script job on repo app with front
// matter front.
func WriteManifest(t *testing.T, dir, id, front string) string {
	t.Helper()
	p := filepath.Join(dir, id+".md")
	testenv.WriteFile(t, p, "---\nid: "+id+"\nrepo: app\nengine: script\n"+front+"\n---\n# "+id+"\n\nDo it.\n")
	return p
}

// OneErrLine asserts stderr's last line starts with "aq: " and holds want,
// and that stderr holds no stack trace.
func OneErrLine(t *testing.T, stderr, want string) {
	t.Helper()
	lines := strings.Split(strings.TrimRight(stderr, "\n"), "\n")
	last := lines[len(lines)-1]
	if !strings.HasPrefix(last, "aq: ") || !strings.Contains(last, want) {
		t.Fatalf("stderr's last line %q lacks %q (all: %q)", last, want, stderr)
	}
	if strings.Contains(stderr, "goroutine ") || strings.Contains(stderr, "panic") {
		t.Fatalf("a stack trace: %q", stderr)
	}
}

// StubReq is one call to the stub, as an operator or a factory makes it.
func StubReq(t *testing.T, base, method, path, token string, body any) map[string]any {
	t.Helper()
	var rd io.Reader
	if body != nil {
		b, _ := json.Marshal(body)
		rd = bytes.NewReader(b)
	}
	req, _ := http.NewRequest(method, base+path, rd)
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var m map[string]any
	_ = json.NewDecoder(resp.Body).Decode(&m)
	if resp.StatusCode >= 300 {
		t.Fatalf("%s %s: %d %v", method, path, resp.StatusCode, m)
	}
	return m
}

// ModuleRoot is the directory holding go.mod.
func ModuleRoot(t *testing.T) string {
	t.Helper()
	dir, _ := os.Getwd()
	for !testenv.Exists(filepath.Join(dir, "go.mod")) {
		parent := filepath.Dir(dir)
		if parent == dir {
			t.Fatal("go.mod not found")
		}
		dir = parent
	}
	return dir
}

// FakeGH puts a `gh` on PATH that answers like the GitHub CLI (logged in;
// `pr create` prints the new PR's URL; `pr merge --auto` succeeds) and
// records each call's arguments and the PR body file in dir.
func FakeGH(t *testing.T, h *testenv.Home) (calls, body string) {
	t.Helper()
	dir := t.TempDir()
	calls, body = filepath.Join(dir, "calls"), filepath.Join(dir, "body")
	script := `#!/bin/sh
echo "$*" >> "` + calls + `"
case "$1 $2" in
  "auth status") exit 0 ;;
  "pr create")
    while [ $# -gt 0 ]; do [ "$1" = "--body-file" ] && cp "$2" "` + body + `"; shift; done
    echo "https://github.com/acme/app/pull/7"; exit 0 ;;
  "pr merge") exit 0 ;;
  "pr list") echo "[]"; exit 0 ;;
esac
echo "fake gh: unexpected $*" >&2; exit 1
`
	bin := filepath.Join(dir, "bin")
	if err := os.MkdirAll(bin, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(bin, "gh"), []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	h.Env = append(h.Env, "PATH="+bin+":"+os.Getenv("PATH"))
	return calls, body
}

// ReadmeBlock returns the first fenced block of lang in the repository's
// README.md after the line that holds after, as written.
func ReadmeBlock(t *testing.T, after, lang string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(ModuleRoot(t), "README.md"))
	if err != nil {
		t.Fatalf("the README: %v", err)
	}
	readme := string(b)
	i := strings.Index(readme, after)
	if i < 0 {
		t.Fatalf("README.md has no %q line: the test cannot find the block after it", after)
	}
	rest := readme[i:]
	fence := "\n```" + lang + "\n"
	open := strings.Index(rest, fence)
	if open < 0 {
		t.Fatalf("no ```%s block after %q", lang, after)
	}
	rest = rest[open+len(fence):]
	end := strings.Index(rest, "\n```\n")
	if end < 0 {
		t.Fatalf("the ```%s block after %q is not closed", lang, after)
	}
	return rest[:end+1]
}

// SelectRow moves the cursor to the first row (the row may be above it:
// a shipped job the cursor followed is the last), then presses Down until
// it is on id's row.
func SelectRow(t *testing.T, x *testenv.Tmux, id string) {
	t.Helper()
	if strings.Contains(x.Screen(false), "> "+id) {
		return
	}
	x.Keys("g")
	time.Sleep(150 * time.Millisecond)
	for range 30 {
		if strings.Contains(x.Screen(false), "> "+id) {
			return
		}
		x.Keys("Down")
		time.Sleep(150 * time.Millisecond)
	}
	t.Fatalf("cannot select %s:\n%s", id, x.Screen(false))
}

// ShellQuote quotes s for a POSIX shell.
func ShellQuote(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }

// FullHost skips the test on a host where user namespaces are blocked
// (max_user_namespaces 0): the sandbox cannot be full there.
func FullHost(t *testing.T) {
	t.Helper()
	if b, err := os.ReadFile("/proc/sys/user/max_user_namespaces"); err == nil && strings.TrimSpace(string(b)) == "0" {
		t.Skip("user namespaces are blocked on this host: no full sandbox")
	}
}
