package selftest

import (
	"context"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/aqfleet/aq/internal/fakellm"
	"github.com/aqfleet/aq/internal/fixture"
	"github.com/aqfleet/aq/internal/sandbox"
	"github.com/aqfleet/aq/internal/testenv"
)

// The engines group with the real CLIs (realcli/, REALCLI_DIR): each row's
// tiny job runs in the full sandbox (AQ_SANDBOX=on: the CLI reaches the
// fake on this machine's loopback through the sandbox's gateway bridge,
// and its proxy refuses every other host without resolving it), so
// nothing leaves the machine.

// engineOptions is a run of the engines group's check name alone, with
// path's directory first on PATH, in the full sandbox; tmp is its temp dir.
func engineOptions(t *testing.T, name, path string) (Options, string) {
	t.Helper()
	cfg := hostConfig(t)
	cfg.Sandbox = sandbox.ModeOn
	env := []string{}
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "PATH=") {
			env = append(env, kv)
		}
	}
	env = append(env, "PATH="+path+string(os.PathListSeparator)+os.Getenv("PATH"))
	// Short: the job's proxy socket is under it, and a Unix socket's path
	// is at most 108 bytes (t.TempDir's is too long: "connect: invalid
	// argument").
	tmp, err := os.MkdirTemp("", "st")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(tmp) })
	return Options{Config: cfg, Exe: testenv.BuildAQ(t), Env: env, TempDir: tmp, Group: GroupEngines,
		Only: regexp.MustCompile(`^engines\.` + name + `$`), Timeout: 6 * time.Minute}, tmp
}

// runEngineCheck runs o and returns its one result.
func runEngineCheck(t *testing.T, o Options, tmp string) Result {
	t.Helper()
	rep, err := Run(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Checks) != 1 {
		t.Fatalf("%d results, want 1: %+v", len(rep.Checks), rep.Checks)
	}
	r := rep.Checks[0]
	t.Logf("%s %s %dms %s", r.Status, r.Name, r.DurationMS, r.Reason)
	if r.Reason == "" || strings.ContainsAny(r.Reason, "\r\n") {
		t.Errorf("reason %q is not one line", r.Reason)
	}
	if r.Status != Skip {
		assertNothingLeft(t, rep, tmp)
	}
	return r
}

// TestEnginesRealCLIsShip: `aq selftest --engines` with the pinned claude
// and codex: each row's job ships in the full sandbox, its usage the
// fake's.
func TestEnginesRealCLIsShip(t *testing.T) {
	for _, name := range []string{"claude", "codex"} {
		t.Run(name, func(t *testing.T) {
			bin := testenv.RealCLI(t, name)
			o, tmp := engineOptions(t, name, filepath.Dir(bin))
			r := runEngineCheck(t, o, tmp)
			if r.Status != Pass || !strings.Contains(r.Reason, "shipped a job (in the full sandbox)") {
				t.Fatalf("engines.%s: %s %s", name, r.Status, r.Reason)
			}
			// The CLI's version, not a warning it printed on stderr.
			if !regexp.MustCompile(`^` + name + ` (codex-cli )?\d+\.\d+\.\d+ \(/`).MatchString(r.Reason) {
				t.Errorf("engines.%s does not start with the CLI's version: %s", name, r.Reason)
			}
		})
	}
}

// TestEngineCodexFails: codex's row says what went wrong and how to fix
// it: the fake answering 401 (the row's own script, changed), codex's npm
// launcher without the native binary of its sibling package, no codex on
// PATH (skipped).
func TestEngineCodexFails(t *testing.T) {
	bin := testenv.RealCLI(t, "codex")
	codex := engineRows[1]
	if codex.name != "codex" {
		t.Fatalf("engineRows[1] is %s, want codex", codex.name)
	}

	t.Run("401", func(t *testing.T) {
		row := codex
		var fake *fakellm.ResponsesServer
		row.serve = func(string, string) (*engineFake, error) {
			var err error
			fake, err = fakellm.StartResponses(fakellm.ResponsesScript{Turns: []fakellm.ResponsesTurn{{Times: 100,
				Fail: &fakellm.ResponsesFail{Status: 401, Message: "Incorrect API key provided: sk-selft****-key.", Code: "invalid_api_key"}}}})
			if err != nil {
				return nil, err
			}
			return &engineFake{url: fake.URL(), requests: func() int { return len(fake.Posts()) }, close: fake.Close}, nil
		}
		o, tmp := engineOptions(t, "codex", filepath.Dir(bin))
		o.scenarios = []*scenario{cliScenario(row)}
		r := runEngineCheck(t, o, tmp)
		for _, want := range []string{"the codex job did not ship", "engine_unavailable", "401 Unauthorized", "CODEX_API_KEY"} {
			if r.Status != Fail || !strings.Contains(r.Reason, want) {
				t.Errorf("engines.codex against a fake answering 401: %s %s; want a failure naming %q", r.Status, r.Reason, want)
			}
		}
		if fake == nil || len(fake.Posts()) == 0 {
			t.Errorf("codex never asked the fake")
		}
	})

	t.Run("native binary missing", func(t *testing.T) {
		// The launcher (bin/codex.js and its package.json) in a
		// node_modules of its own, without @openai/codex-linux-x64.
		pkg := filepath.Join(filepath.Dir(bin), "..", "@openai", "codex")
		dir := filepath.Join(t.TempDir(), "node_modules")
		for _, f := range []string{"package.json", "bin/codex.js"} {
			b, err := os.ReadFile(filepath.Join(pkg, f))
			if err != nil {
				t.Fatal(err)
			}
			if err := fixture.WriteFile(filepath.Join(dir, "@openai", "codex", f), string(b)); err != nil {
				t.Fatal(err)
			}
		}
		if err := os.Chmod(filepath.Join(dir, "@openai", "codex", "bin", "codex.js"), 0o755); err != nil {
			t.Fatal(err)
		}
		binDir := filepath.Join(dir, ".bin")
		if err := os.MkdirAll(binDir, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink("../@openai/codex/bin/codex.js", filepath.Join(binDir, "codex")); err != nil {
			t.Fatal(err)
		}
		o, tmp := engineOptions(t, "codex", binDir)
		r := runEngineCheck(t, o, tmp)
		for _, want := range []string{"the codex job did not ship", "Missing optional dependency @openai/codex-linux-x64", "npm install -g @openai/codex"} {
			if r.Status != Fail || !strings.Contains(r.Reason, want) {
				t.Errorf("engines.codex without its native binary: %s %s; want a failure naming %q", r.Status, r.Reason, want)
			}
		}
	})

	t.Run("not on PATH", func(t *testing.T) {
		o, tmp := engineOptions(t, "codex", t.TempDir())
		o.Env = append(o.Env, "PATH="+t.TempDir()) // the last PATH wins
		r := runEngineCheck(t, o, tmp)
		if r.Status != Skip || r.Reason != "codex is not installed here (not on PATH)" {
			t.Errorf("engines.codex without codex: %s %s", r.Status, r.Reason)
		}
	})
}
