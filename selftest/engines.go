package selftest

import (
	"context"
	"fmt"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"time"

	"github.com/aqfleet/aq/agent/caps"
	"github.com/aqfleet/aq/agent/config"
	"github.com/aqfleet/aq/agent/runner"
	"github.com/aqfleet/aq/internal/brief"
	"github.com/aqfleet/aq/internal/fakellm"
	"github.com/aqfleet/aq/internal/fixture"
	"github.com/aqfleet/aq/internal/sandbox"
	"github.com/aqfleet/aq/job"
)

// --- the engines: each installed CLI, a tiny job, against a fake API -----------

// An engineRow is one engine CLI `aq selftest --engines` runs: a tiny job
// (write a file, say done) in the sandbox this host gives engines, against
// an in-process fake of the engine's API (internal/fakellm) on 127.0.0.1,
// with an empty login and the fake's base URL — so an operator's own
// settings cannot send it to a real API, and no token is spent.
type engineRow struct {
	// name is the engine (and its CLI on PATH).
	name string
	// model is the manifest's model: a real id (the CLI prices from it).
	model string
	// env is the engine's environment for a fake at url: the base URL, a
	// test credential, the switches that keep the CLI from calling home.
	env func(url string) []string
	// drop says which variables of the host's environment the job must not
	// get (the operator's own credentials and settings for the engine).
	drop func(key string) bool
	// home writes the files of the empty login into the engine's empty
	// HOME (codex's config.toml with its update check, analytics and
	// feedback off); nil writes none.
	home func(dir string) error
	// serve starts the fake with the conversation: write file (an
	// absolute path in the job's worktree) with content, then say done.
	serve func(file, content string) (*engineFake, error)
}

// engineFake is a row's running fake API and what the job must record of
// its usage.
type engineFake struct {
	// url is the base URL the engine is given.
	url string
	// requests counts the API calls the fake has seen.
	requests func() int
	close    func() error
	// tokensIn, tokensOut are the job's insights' totals for the script.
	tokensIn, tokensOut int64
	usage               string // the script's usage, for a failure line
}

// engineRows are the engines the check runs, claude first.
var engineRows = []engineRow{
	{
		name:  "claude",
		model: "claude-haiku-4-5",
		env: func(url string) []string {
			return []string{
				"ANTHROPIC_BASE_URL=" + url,
				"ANTHROPIC_API_KEY=sk-ant-selftest-not-a-key",
				"CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC=1",
				"DISABLE_AUTOUPDATER=1", "DISABLE_TELEMETRY=1", "DISABLE_ERROR_REPORTING=1",
				"CLAUDE_CODE_MAX_RETRIES=1",
			}
		},
		drop: func(k string) bool {
			return strings.HasPrefix(k, "ANTHROPIC_") || strings.HasPrefix(k, "CLAUDE_") || strings.HasPrefix(k, "DISABLE_") ||
				strings.HasPrefix(k, "AWS_") || strings.HasPrefix(k, "GOOGLE_") || k == "CLOUD_ML_REGION"
		},
		serve: func(file, content string) (*engineFake, error) {
			script := fakellm.Script{Turns: []fakellm.Turn{
				{Tools: []fakellm.ToolCall{{Name: "Write", Input: map[string]any{"file_path": file, "content": content}}},
					Usage: fakellm.Usage{Input: 120, Output: 30, CacheWrite: 400}},
				{Text: "Done.", Usage: fakellm.Usage{Input: 60, Output: 5, CacheRead: 400}},
			}}
			var want fakellm.Usage
			for _, t := range script.Turns {
				want = want.Plus(t.Usage)
			}
			fake, err := fakellm.Start(script)
			if err != nil {
				return nil, err
			}
			return &engineFake{url: fake.URL, requests: func() int { return len(fake.Requests()) }, close: fake.Close,
				tokensIn: want.Input + want.CacheWrite + want.CacheRead, tokensOut: want.Output, usage: fmt.Sprintf("%+v", want)}, nil
		},
	},
	{
		// codex 0.171.0: the built-in provider's base URL comes from
		// OPENAI_BASE_URL (ending in /v1), which aq passes to codex as
		// -c openai_base_url=… (codex reads none from its environment); the
		// key from CODEX_API_KEY (codex exec reads it). Its WebSocket
		// upgrade on GET /v1/responses is refused (426) by the fake, and
		// codex falls back to HTTP at once.
		name:  "codex",
		model: "gpt-5.5",
		env: func(url string) []string {
			return []string{"OPENAI_BASE_URL=" + url, "CODEX_API_KEY=sk-selftest-not-a-key"}
		},
		drop: func(k string) bool {
			return strings.HasPrefix(k, "OPENAI_") || strings.HasPrefix(k, "CODEX_") || strings.HasPrefix(k, "AZURE_OPENAI")
		},
		home: func(dir string) error {
			// The switches the real-CLI suite sets (docs/engines.md, "codex
			// end to end"): no update check, no analytics, no feedback upload.
			return fixture.WriteFile(filepath.Join(dir, ".codex", "config.toml"),
				"check_for_update_on_startup = false\n\n[analytics]\nenabled = false\n\n[feedback]\nenabled = false\n")
		},
		serve: func(file, content string) (*engineFake, error) {
			// apply_patch takes a path relative to the worktree (codex's
			// working directory); the patch's lines are the file's.
			var patch strings.Builder
			patch.WriteString("*** Begin Patch\n*** Add File: " + filepath.Base(file) + "\n")
			for _, line := range strings.SplitAfter(strings.TrimSuffix(content, "\n"), "\n") {
				patch.WriteString("+" + strings.TrimSuffix(line, "\n") + "\n")
			}
			patch.WriteString("*** End Patch\n")
			script := fakellm.ResponsesScript{Turns: []fakellm.ResponsesTurn{
				{Calls: []fakellm.ResponsesCall{{Patch: patch.String()}}, Usage: fakellm.ResponsesUsage{Input: 1200, Cached: 400, Output: 30}},
				{Text: "Done.", Usage: fakellm.ResponsesUsage{Input: 1300, Cached: 1100, Output: 5}},
			}}
			var want fakellm.ResponsesUsage
			for _, t := range script.Turns {
				want.Input += t.Usage.Input
				want.Cached += t.Usage.Cached
				want.Output += t.Usage.Output
			}
			fake, err := fakellm.StartResponses(script)
			if err != nil {
				return nil, err
			}
			return &engineFake{url: fake.URL(), requests: func() int { return len(fake.Posts()) }, close: fake.Close,
				tokensIn: want.Input, tokensOut: want.Output, usage: fmt.Sprintf("%+v", want)}, nil
		},
	},
}

// cliScenarios are the engines group: one scenario per row.
func cliScenarios() []*scenario {
	out := make([]*scenario, 0, len(engineRows))
	for _, row := range engineRows {
		out = append(out, cliScenario(row))
	}
	return out
}

func cliScenario(row engineRow) *scenario {
	g := GroupEngines
	name := "engines." + row.name
	sc := single(g, name, "the "+row.name+" CLI installed here runs a tiny job in this host's engine sandbox against an in-process fake of its API (an empty login, no token spent): it writes a file, the job ships, the usage is the fake's", 4*time.Minute,
		func(ctx context.Context, s *session) (string, error) {
			return s.runEngine(ctx, row)
		})
	sc.workspace = true
	return sc
}

// runEngine is one row's job.
func (s *session) runEngine(ctx context.Context, row engineRow) (string, error) {
	bin, err := lookPathIn(row.name, s.h.path)
	if err != nil {
		return "", skipf("%s is not installed here (not on PATH)", row.name)
	}
	mode := sandbox.ModeAuto
	if s.h.cfg != nil {
		mode = s.h.cfg.Sandbox
	}
	if s.h.exe == "" && mode != sandbox.ModeOff {
		return "", skipf("no aq binary to run the sandbox's init with (a Go test binary; pass Options.Exe)")
	}
	w := s.ws
	dir, err := w.dir("engine-" + row.name + "-home")
	if err != nil {
		return "", err
	}
	if row.home != nil {
		if err := row.home(dir); err != nil {
			return "", err
		}
	}
	// The fake first: its URL is in the engine's environment.
	l, err := w.newLocal("engine-"+row.name, localOpt{
		env:  []string{"HOME=" + dir, "PATH=" + filepath.Dir(bin) + string(filepath.ListSeparator) + s.h.path},
		drop: row.drop,
		config: func(c *config.Config) {
			c.Supervisor, c.Sandbox, c.WorktreePool = s.h.exe, mode, 0
			if s.h.cfg != nil {
				c.SandboxMemory, c.SandboxPids = s.h.cfg.SandboxMemory, s.h.cfg.SandboxPids
				c.ClaudePermissionMode = s.h.cfg.ClaudePermissionMode
				c.SandboxNet = s.h.cfg.SandboxNet
			}
		},
	})
	if err != nil {
		return "", err
	}
	id := l.id("engine-" + row.name)
	const content = "written by the engine selftest\n"
	fake, err := row.serve(filepath.Join(l.worktreePath("app", id), "selftest.txt"), content)
	if err != nil {
		return "", err
	}
	defer func() { _ = fake.close() }()
	l.a.Runner.Env = append(l.a.Runner.Env, row.env(fake.url)...)
	// The job's egress proxy allows (and the sandbox bridges) the hosts of
	// the base URLs in the environment engines start from: this one's, not
	// aq's own (which a factory's engines start from).
	if e, ok := l.a.Runner.Egress.(runner.EgressProxies); ok {
		e.Env = l.a.Runner.Env
		l.a.Runner.Egress = e
	}
	host := caps.FromTokens([]string{"os:" + runtime.GOOS, "arch:" + runtime.GOARCH, "engine:" + row.name, "has:git"})
	l.a.Host = func(context.Context) (*caps.Host, error) { return host, nil }
	if _, _, err := l.repo(ctx, "app", nil, true); err != nil {
		return "", err
	}
	if _, err := l.submit(id, fmt.Sprintf("repo: app\nengine: %s\nmodel: %s\nship: branch\nretry: { max: 0 }\nbudget: { wall: 3m }", row.name, row.model),
		"# Selftest\n\nWrite selftest.txt in the repository's root.\n"); err != nil {
		return "", err
	}
	r, err := l.runOne(ctx, id)
	if err != nil {
		return "", err
	}
	level := l.a.Runner.Sandbox.Level()
	reqs := fake.requests()
	if r.Outcome.Failed() || r.Stage != job.Shipped {
		why := outcomeText(r)
		if reqs == 0 {
			why += fmt.Sprintf("; %s never reached the fake API at %s (%s)", row.name, fake.url, where(level))
		}
		return "", failf("the %s job did not ship: %s", row.name, brief.OneLine(why, 600))
	}
	if !w.treeHas(ctx, l.repoDir("app"), job.JobBranch(id), "selftest.txt") {
		return "", failf("the %s job shipped without the file the fake asked it to write", row.name)
	}
	in := r.Outcome.Insights
	if in.TokensOut != fake.tokensOut || in.TokensIn != fake.tokensIn {
		return "", failf("the %s job's usage is not what the fake reported (%s): tokens in %d, out %d", row.name, fake.usage, in.TokensIn, in.TokensOut)
	}
	version := in.EngineVersion
	if version == "" {
		version = "?"
	}
	return fmt.Sprintf("%s %s (%s) shipped a job (%s): %d requests to the fake API, %d tokens", row.name, version, bin, where(level), reqs, in.TokensIn+in.TokensOut), nil
}

// where says where the engine ran: "in the full sandbox", "unsandboxed".
func where(level sandbox.Level) string {
	if level == sandbox.LevelNone {
		return "unsandboxed"
	}
	return "in the " + string(level) + " sandbox"
}

// lookPathIn finds name on path (a PATH value).
func lookPathIn(name, path string) (string, error) {
	for _, dir := range filepath.SplitList(path) {
		if dir == "" {
			continue
		}
		p := filepath.Join(dir, name)
		if _, err := exec.LookPath(p); err == nil {
			return p, nil
		}
	}
	return "", exec.ErrNotFound
}
