package engines

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aqfleet/aq/internal/process"
	"github.com/aqfleet/aq/internal/secrets"
)

// The script engine's tests run real /bin/sh commands in temp dirs.

// scriptSpec is a Spec for a script run in a fresh dir, with a short kill
// ladder and the host's environment.
func scriptSpec(t *testing.T, script string) Spec {
	t.Helper()
	dir := t.TempDir()
	return Spec{
		// Unique on the host: the tag sweep kills every process carrying it.
		JobID:  fmt.Sprintf("script-%s-%d", strings.NewReplacer("/", "-", " ", "-").Replace(t.Name()), os.Getpid()),
		Dir:    dir,
		Prompt: "Fix the bug.\n",
		Script: script,
		LogDir: filepath.Join(t.TempDir(), "logs"),
		Env:    os.Environ(),
		Grace:  100 * time.Millisecond,
	}
}

func scriptNoTagged(t *testing.T, tag string) {
	t.Helper()
	if pids, err := process.FindTagged(tag); err != nil || len(pids) > 0 {
		t.Errorf("processes tagged %s alive after Run: %v %v", tag, pids, err)
	}
}

func TestParseUsage(t *testing.T) {
	cases := []struct {
		in   string
		want Usage
		ok   bool
	}{
		{"tokens_in=1200 tokens_out=300 tokens_cached=50 cost_usd=0.02 turns=3", Usage{TokensIn: 1200, TokensOut: 300, TokensCached: 50, CostUSD: 0.02, Turns: 3}, true},
		{"cost_usd=1.5", Usage{CostUSD: 1.5}, true},
		{"  turns=2   tokens_in=7 ", Usage{Turns: 2, TokensIn: 7}, true},
		{"unknown=3 tokens_out=4", Usage{TokensOut: 4}, true},
		{"garbage", Usage{}, false},
		{"", Usage{}, false},
		{"cost_usd=abc", Usage{}, false},
	}
	for _, c := range cases {
		got, ok := parseUsage(c.in)
		if ok != c.ok || got != c.want {
			t.Errorf("parseUsage(%q) = %+v %v, want %+v %v", c.in, got, ok, c.want, c.ok)
		}
	}
}

// TestScriptPreflight: a missing script: or a first command that is not on
// the engine's PATH is no_engine before anything runs; shell syntax,
// builtins and paths are left to the run.
func TestScriptPreflight(t *testing.T) {
	bin := t.TempDir()
	if err := os.WriteFile(filepath.Join(bin, "my-tool"), []byte("#!/bin/sh\nexit 0\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	hostPath := os.Getenv("PATH")
	withPath := func(p string) []string { return []string{"PATH=" + p, "HOME=/nonexistent"} }
	cases := []struct {
		script string
		env    []string
		ok     bool
	}{
		{"", nil, false},
		{"   \n ", nil, false},
		{"no-such-command-xyz --fix", nil, false},
		{"my-tool --fix", withPath(bin + ":" + hostPath), true},
		{"my-tool --fix", withPath(hostPath), false}, // aq's own PATH does not count: the engine's does
		{"sh -c 'exit 0'", nil, true},
		{"echo hi; no-such-command-xyz", nil, true}, // only the first word is judged
		{"FOO=1 no-such-command-xyz", nil, true},
		{"cd sub && ./build.sh", nil, true},
		{"./tools/missing.sh", nil, true}, // a path: judged when it runs (exit 127)
		{"/no/such/abs/tool", nil, true},
		{"(cd x; make)", nil, true},
		{"if true; then echo; fi", nil, true},
	}
	s := &Script{}
	for _, c := range cases {
		env := c.env
		if env == nil {
			env = os.Environ()
		}
		info, err := s.Preflight(context.Background(), Spec{Script: c.script, Env: env})
		if c.ok && (err != nil || info.Name != "script" || info.Path == "") {
			t.Errorf("Preflight(%q): %+v %v, want ok", c.script, info, err)
		}
		if !c.ok && !errors.Is(err, ErrNotInstalled) {
			t.Errorf("Preflight(%q): %v, want ErrNotInstalled", c.script, err)
		}
	}
	if _, err := (&Script{Shell: "/no/such/shell"}).Preflight(context.Background(), Spec{Script: "true", Env: os.Environ()}); !errors.Is(err, ErrNotInstalled) {
		t.Errorf("missing shell: %v", err)
	}
}

// TestScriptOutcomes: the outcome comes from the directives and the exit
// status, in that order.
func TestScriptOutcomes(t *testing.T) {
	cases := []struct {
		name    string
		script  string
		outcome Outcome
		subtype string
		detail  string
		exit    int
		notInst bool
	}{
		{name: "exit0", script: "echo done", outcome: Succeeded, subtype: "exit_0"},
		{name: "exit3", script: "echo trying; exit 3", outcome: TaskFailed, subtype: "exit_3", detail: "script exited 3", exit: 3},
		{name: "signal", script: "kill -KILL $$", outcome: TaskFailed, subtype: "exit_-1", detail: "script killed by SIGKILL", exit: -1},
		{name: "unavailable_exit0", script: "echo '::aq-unavailable OAuth token expired'", outcome: Unavailable, detail: "OAuth token expired"},
		{name: "unavailable_exit1", script: "echo ::aq-unavailable rate limited; exit 1", outcome: Unavailable, detail: "rate limited", exit: 1},
		{name: "unavailable_no_why", script: "echo ::aq-unavailable", outcome: Unavailable, detail: "the script reported the engine unavailable"},
		{name: "exit127", script: "./no/such/tool.sh", notInst: true},
		{name: "directive_on_stderr_ignored", script: "echo '::aq-unavailable nope' >&2", outcome: Succeeded, subtype: "exit_0"},
		{name: "directive_mid_line_ignored", script: "echo 'x ::aq-unavailable nope'", outcome: Succeeded, subtype: "exit_0"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			spec := scriptSpec(t, c.script)
			res, err := (&Script{}).Run(context.Background(), spec)
			scriptNoTagged(t, spec.JobID)
			if c.notInst {
				if !errors.Is(err, ErrNotInstalled) || !strings.Contains(err.Error(), "127") {
					t.Fatalf("err %v, want ErrNotInstalled naming exit 127", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if res.Outcome != c.outcome || res.Subtype != c.subtype || res.Detail != c.detail || res.ExitCode != c.exit {
				t.Errorf("got outcome %q subtype %q detail %q exit %d, want %q %q %q %d", res.Outcome, res.Subtype, res.Detail, res.ExitCode, c.outcome, c.subtype, c.detail, c.exit)
			}
		})
	}
}

// TestScriptUsageFeedsMeter: every ::aq-usage line reaches the meter as it
// is printed (cumulative; malformed lines skipped); the result has the last.
func TestScriptUsageFeedsMeter(t *testing.T) {
	spec := scriptSpec(t, `echo ::aq-usage tokens_in=10 tokens_out=1 turns=1
echo "::aq-usage not a usage line"
echo ::aq-usage tokens_in=25 tokens_out=4 cost_usd=0.125 turns=2
echo done`)
	var mu sync.Mutex
	var seen []Usage
	spec.Meter = MeterFunc(func(u Usage) { mu.Lock(); seen = append(seen, u); mu.Unlock() })
	res, err := (&Script{}).Run(context.Background(), spec)
	if err != nil || res.Outcome != Succeeded {
		t.Fatalf("%+v %v", res, err)
	}
	want := []Usage{{TokensIn: 10, TokensOut: 1, Turns: 1}, {TokensIn: 25, TokensOut: 4, CostUSD: 0.125, Turns: 2}}
	if !slices.Equal(seen, want) {
		t.Errorf("meter saw %+v, want %+v", seen, want)
	}
	if res.Usage != want[1] {
		t.Errorf("result usage %+v", res.Usage)
	}
}

// TestScriptMeterStopsItLive: a meter that cancels the run (as the runner's
// budget does) stops a script that would otherwise run on.
func TestScriptMeterStopsItLive(t *testing.T) {
	spec := scriptSpec(t, "echo ::aq-usage tokens_in=5000\nsleep 60")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	spec.Meter = MeterFunc(func(u Usage) {
		if u.Tokens() > 1000 {
			cancel()
		}
	})
	res, err := (&Script{}).Run(ctx, spec)
	if err != nil || res.Outcome != Stopped || res.Usage.TokensIn != 5000 {
		t.Fatalf("%+v %v", res, err)
	}
	scriptNoTagged(t, spec.JobID)
}

// TestScriptEnvironment: the script runs in spec.Dir, gets the prompt on
// stdin, and sees spec.Env plus the AQ_JOB_ID tag, nothing of aq's own.
func TestScriptEnvironment(t *testing.T) {
	spec := scriptSpec(t, `cat > prompt.txt; pwd > cwd.txt; env > env.txt`)
	spec.Env = secrets.EngineEnv(append(os.Environ(), "AQ_FLEET_TOKEN=tok-12345678", "ONLY_FOR_ENGINE=yes", "CLAUDECODE=1"))
	res, err := (&Script{}).Run(context.Background(), spec)
	if err != nil || res.Outcome != Succeeded {
		t.Fatalf("%+v %v", res, err)
	}
	read := func(n string) string {
		b, err := os.ReadFile(filepath.Join(spec.Dir, n))
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	if got := read("prompt.txt"); got != spec.Prompt {
		t.Errorf("stdin %q, want the prompt %q", got, spec.Prompt)
	}
	if got := strings.TrimSpace(read("cwd.txt")); got != spec.Dir {
		t.Errorf("cwd %q, want %q", got, spec.Dir)
	}
	env := read("env.txt")
	for _, want := range []string{"ONLY_FOR_ENGINE=yes", "AQ_JOB_ID=" + spec.JobID} {
		if !strings.Contains(env, want) {
			t.Errorf("env lacks %s", want)
		}
	}
	for _, not := range []string{"AQ_FLEET_TOKEN", "CLAUDECODE"} {
		if strings.Contains(env, not) {
			t.Errorf("env has %s", not)
		}
	}
}

// TestScriptStopped: when its context ends, the script is stopped through
// the ladder (SIGKILL for one that ignores SIGINT and SIGTERM) and reported
// Stopped, however it exited.
func TestScriptStopped(t *testing.T) {
	for _, c := range []struct {
		name, script, step string
		grace              time.Duration
	}{
		// A long grace: SIGINT ends it at once, however busy the machine.
		// The shell makes the signal file itself (a redirect, no child):
		// with `touch started`, SIGINT could reach the shell while it still
		// waited for touch, which then exited 0 — and a shell whose child
		// did not die of SIGINT carries on (wait-and-cooperative-exit), so
		// `sleep` ran until SIGTERM.
		{"polite", ": > started; exec sleep 60", "SIGINT", 5 * time.Second},
		{"stubborn", "trap '' INT TERM; touch started; while :; do sleep 0.05; done", "SIGKILL", 100 * time.Millisecond},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			spec := scriptSpec(t, c.script)
			spec.Grace = c.grace
			ctx, cancel := context.WithCancel(context.Background())
			go func() {
				for !fileThere(filepath.Join(spec.Dir, "started")) {
					time.Sleep(5 * time.Millisecond)
				}
				cancel()
			}()
			res, err := (&Script{}).Run(ctx, spec)
			if err != nil || res.Outcome != Stopped || res.Detail != "stopped by aq" || res.Process.LadderStep != c.step {
				t.Fatalf("%+v (ladder %s) %v", res, res.Process.LadderStep, err)
			}
			scriptNoTagged(t, spec.JobID)
		})
	}
}

func fileThere(p string) bool { _, err := os.Stat(p); return err == nil }
