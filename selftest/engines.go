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
	"github.com/aqfleet/aq/internal/brief"
	"github.com/aqfleet/aq/internal/fakellm"
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
	// script is the conversation: write file (an absolute path) with
	// content, then say done.
	script func(file, content string) fakellm.Script
}

// engineRows are the engines the check runs, claude first.
//
// codex's row goes here once fakellm has the OpenAI Responses API
// (responses*.go): {name: "codex", model: "gpt-5-codex", env: OPENAI_BASE_URL
// (ending in /v1) and CODEX_API_KEY, drop: OPENAI_*, CODEX_*, script: a
// Responses conversation calling the tool the request offers}.
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
		script: func(file, content string) fakellm.Script {
			return fakellm.Script{Turns: []fakellm.Turn{
				{Tools: []fakellm.ToolCall{{Name: "Write", Input: map[string]any{"file_path": file, "content": content}}},
					Usage: fakellm.Usage{Input: 120, Output: 30, CacheWrite: 400}},
				{Text: "Done.", Usage: fakellm.Usage{Input: 60, Output: 5, CacheRead: 400}},
			}}
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
	fake, err := fakellm.Start(row.script(filepath.Join(l.worktreePath("app", id), "selftest.txt"), content))
	if err != nil {
		return "", err
	}
	defer fake.Close()
	l.a.Runner.Env = append(l.a.Runner.Env, row.env(fake.URL)...)
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
	reqs := fake.Requests()
	if r.Outcome.Failed() || r.Stage != job.Shipped {
		why := outcomeText(r)
		if len(reqs) == 0 {
			why += fmt.Sprintf("; %s never reached the fake API at %s (%s)", row.name, fake.URL, where(level))
		}
		return "", failf("the %s job did not ship: %s", row.name, brief.OneLine(why, 600))
	}
	if !w.treeHas(ctx, l.repoDir("app"), job.JobBranch(id), "selftest.txt") {
		return "", failf("the %s job shipped without the file the fake asked it to write", row.name)
	}
	var want fakellm.Usage
	for _, t := range row.script("", "").Turns {
		want = want.Plus(t.Usage)
	}
	in := r.Outcome.Insights
	if in.TokensOut != want.Output || in.TokensIn != want.Input+want.CacheWrite+want.CacheRead {
		return "", failf("the %s job's usage is not what the fake reported (%+v): tokens in %d, out %d", row.name, want, in.TokensIn, in.TokensOut)
	}
	version := in.EngineVersion
	if version == "" {
		version = "?"
	}
	return fmt.Sprintf("%s %s (%s) shipped a job (%s): %d requests to the fake API, %d tokens", row.name, version, bin, where(level), len(reqs), in.TokensIn+in.TokensOut), nil
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
