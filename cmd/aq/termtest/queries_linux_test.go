//go:build !unit

package termtest

import (
	"fmt"
	"io"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/aqfleet/aq/internal/testenv"
)

// termEnv is h's environment as a terminal's shell would have it: a
// terminal type that supports colour and queries, not inside tmux or
// screen (termenv does not query under them), no NO_COLOR, and not a CI
// runner's (CI set makes termenv take every output for no terminal: it
// would neither query nor style, and the tests could not fail).
func termEnv(h *testenv.Home, extra ...string) []string {
	var env []string
	for _, kv := range h.Environ() {
		k, _, _ := strings.Cut(kv, "=")
		switch k {
		case "TERM", "TMUX", "STY", "NO_COLOR", "COLORTERM", "TERM_PROGRAM", "CI", "CLICOLOR", "CLICOLOR_FORCE":
			continue
		}
		env = append(env, kv)
	}
	return append(append(env, "TERM=xterm-256color"), extra...)
}

// commandPaths lists every command under path, from the help each prints
// ("Available Commands:"), path included.
func commandPaths(t *testing.T, bin string, env []string, path []string) [][]string {
	t.Helper()
	cmd := exec.Command(bin, append(append([]string{}, path...), "--help")...)
	cmd.Env = env
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("aq %v --help: %v", path, err)
	}
	all := [][]string{path}
	_, list, ok := strings.Cut(string(out), "\nAvailable Commands:\n")
	if !ok {
		return all
	}
	list, _, _ = strings.Cut(list, "\n\n")
	for _, l := range strings.Split(list, "\n") {
		f := strings.Fields(l)
		if len(f) == 0 || f[0] == "help" {
			continue
		}
		all = append(all, commandPaths(t, bin, env, append(append([]string{}, path...), f[0]))...)
	}
	return all
}

// TestNoTerminalQueries runs every command's --help, and a terminating
// invocation of each command that terminates (the board quit with a key
// press), on a pty that never answers. None may write a terminal query
// (what made every command stall five seconds on such a terminal: Bubble
// Tea's init asked for the background colour), and none may take longer
// there than without a terminal by more than a generous margin (the
// stall was five seconds; the bytes are the assertion that matters).
func TestNoTerminalQueries(t *testing.T) {
	t.Parallel()
	bin := testenv.BuildAQ(t)
	h := testenv.NewHome(t)
	h.Bin = bin
	repo := h.Repo(t, "webapp", map[string]string{"index.html": "<title>Helo</title>\n"})
	testenv.AddOrigin(t, repo)
	dir := t.TempDir()
	id := testenv.ID("pty")
	manifest := testenv.Manifest(t, dir, id, "repo: webapp\nengine: script\nscript: printf '<title>Hello</title>\\n' > index.html\nverify: grep -q Hello index.html\nship: branch")
	env := termEnv(h)
	// The baseline of a job's run without a terminal: the same job under
	// another id, run first.
	base := testenv.Manifest(t, dir, testenv.ID("ptybase"), "repo: webapp\nengine: script\nscript: printf '<title>Hello</title>\\n' > index.html\nverify: grep -q Hello index.html\nship: branch")
	if d, code := runPlain(t, bin, env, h.RepoBase, []string{"submit", base}); code != 0 {
		t.Fatalf("submit the baseline job: exit %d after %v", code, d)
	}
	runBase, code := runPlain(t, bin, env, h.RepoBase, []string{"run", "--once"})
	if code != 0 {
		t.Fatalf("the baseline job: exit %d", code)
	}

	var invocations [][]string
	for _, p := range commandPaths(t, bin, env, nil) {
		invocations = append(invocations, append(p, "--help"))
	}
	invocations = append(invocations,
		[]string{},
		[]string{"-v"},
		[]string{"version"},
		[]string{"help"},
		[]string{"config"},
		[]string{"caps"},
		[]string{"profiles"},
		[]string{"completion", "bash"},
		[]string{"validate", manifest},
		[]string{"submit", manifest},
		[]string{"status"},
		[]string{"job", "show", id},
		[]string{"run", "--once"}, // runs the job: the engine, its sandbox's init, verify, ship
		[]string{"job", "logs", id},
		[]string{"job", "requeue", "nosuch"},
		[]string{"job", "reject", "nosuch"},
		[]string{"job", "ship", "nosuch"},
		[]string{"job", "rm", "nosuch"},
		[]string{"gc", "--dry-run", "--offline"},
		[]string{"selftest", "--list"},
		[]string{"daemon"},                            // fleet mode off: exit 2
		[]string{"fleet", "check"},                    // no coordinator: exit 2
		[]string{"servicebus", "ensure-subscription"}, // no namespace: exit 2
		[]string{"demo", "--routes", "nonsense"},      // exit 2
		[]string{"--log-format", "nonsense", "version"},
	)
	for _, args := range invocations {
		name := "aq " + strings.Join(args, " ")
		r := runOnPty(t, bin, env, h.RepoBase, args, nil)
		t.Logf("%s: exit %d in %v", name, r.Code, r.Took.Round(time.Millisecond))
		if asked := askedTerminal(r.Out); len(asked) > 0 {
			t.Errorf("%s asked the terminal: %v; it wrote %q", name, asked, head(r.Out))
		}
		if strings.Join(args, " ") == "run --once" && !strings.Contains(r.Out, "job "+id+": shipped") {
			t.Errorf("%s: exit %d, no shipped line on the terminal:\n%s", name, r.Code, r.Out)
		}
		if r.Took > 3*time.Second {
			// Compare with the same command without a terminal (aq run
			// --once: the baseline job's run).
			plain := runBase
			if strings.Join(args, " ") != "run --once" {
				plain, _ = runPlain(t, bin, env, h.RepoBase, args)
			}
			if r.Took > plain+4*time.Second {
				t.Errorf("%s took %v on a pty that never answers, %v without a terminal", name, r.Took.Round(time.Millisecond), plain.Round(time.Millisecond))
			}
		}
	}
	// The board: drawn, then q quits it.
	r := runOnPty(t, bin, env, h.RepoBase, []string{"status", "--watch"}, func(seen func() string, keys io.Writer) {
		testenv.WaitFor(t, time.Minute, "the board to draw", func() bool { return strings.Contains(seen(), "SHIPPED") || strings.Contains(seen(), "shipped") })
		fmt.Fprint(keys, "q")
	})
	if r.Code != 0 {
		t.Errorf("aq status --watch: exit %d after q:\n%q", r.Code, r.Out)
	}
	if asked := askedTerminal(r.Out); len(asked) > 0 {
		t.Errorf("the board asked the terminal: %v", asked)
	}
	if !strings.Contains(r.Out, "\x1b[?1049h") || !strings.Contains(r.Out, "\x1b[?1049l") {
		t.Errorf("the board did not enter and leave the alternate screen: %q", head(r.Out))
	}
}

// head is the start of a terminal's output, for a failure message.
func head(s string) string {
	if len(s) > 400 {
		return s[:400] + "…"
	}
	return s
}
