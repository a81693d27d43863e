package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"runtime"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/aqfleet/aq/cmd/aq/clitest"
)

// These tests exec scripts they write, so they never run in parallel (a
// concurrent fork would make the exec fail with ETXTBSY).

// capsHost is a fake host: a PATH holding only fake tools, and a repo base.
type capsHost struct {
	bin, base string
	git       string // the real git, to build real repositories
	sleep     string
}

// newCapsHost isolates aq's configuration (no real config file, no aq
// variables), points PATH at an empty temp dir and AQ_REPO_BASE at another.
func newCapsHost(t *testing.T) *capsHost {
	t.Helper()
	git, err := exec.LookPath("git")
	if err != nil {
		t.Skip("git not found")
	}
	sleep, err := exec.LookPath("sleep")
	if err != nil {
		t.Skip("sleep not found")
	}
	dir := clitest.CleanEnv(t)
	h := &capsHost{bin: filepath.Join(dir, "bin"), base: filepath.Join(dir, "src"), git: git, sleep: sleep}
	for _, d := range []string{h.bin, h.base} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	t.Setenv("PATH", h.bin)
	t.Setenv("AQ_REPO_BASE", h.base)
	return h
}

func (h *capsHost) exe(t *testing.T, name, body string) string {
	t.Helper()
	p := filepath.Join(h.bin, name)
	if err := os.WriteFile(p, []byte("#!/bin/sh\n"+body+"\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	return p
}

// engine writes a fake engine CLI: --help prints the real CLI's recorded
// help (engines/testdata), the hidden-flag probe is answered as commander
// does, anything else runs body.
func (h *capsHost) engine(t *testing.T, name, body string) string {
	t.Helper()
	base := "help.txt"
	if name == "codex" {
		base = "exec-help.txt"
	}
	help, err := filepath.Abs(filepath.Join("..", "..", "..", "engines", "testdata", name, base))
	if err != nil {
		t.Fatal(err)
	}
	cat, err := exec.LookPath("cat")
	if err != nil {
		t.Skip("cat not found")
	}
	return h.exe(t, name, fmt.Sprintf(`case "$*" in
*--help) %q %q; exit 0;;
*--aq-probe-unknown-option) echo "error: unknown option '--aq-probe-unknown-option'" >&2; exit 1;;
esac
%s`, cat, help, body))
}

func (h *capsHost) repo(t *testing.T, name string) {
	t.Helper()
	if out, err := exec.Command(h.git, "init", "-q", filepath.Join(h.base, name)).CombinedOutput(); err != nil {
		t.Fatalf("git init %s: %v\n%s", name, err, out)
	}
}

// standardHost: claude, codex, node and gh printing what the real tools
// print; repos notes and web; clutter that is not a repo.
func standardHost(t *testing.T) (*capsHost, map[string]string) {
	h := newCapsHost(t)
	paths := map[string]string{
		"claude": h.engine(t, "claude", `echo "2.0.14 (Claude Code)"`),
		"codex":  h.engine(t, "codex", `echo "codex-cli 0.46.0"`),
		"node":   h.exe(t, "node", `echo "v20.20.2"`),
		"gh":     h.exe(t, "gh", `echo "gh version 2.81.0 (2025-10-01)"`),
	}
	h.repo(t, "notes")
	h.repo(t, "web")
	h.repo(t, filepath.Join("plain", "nested"))
	if err := os.WriteFile(filepath.Join(h.base, "README.md"), []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	return h, paths
}

func TestCapsJSON(t *testing.T) {
	h, paths := standardHost(t)
	out, errOut, code := runAQ(t, "caps", "--json")
	if code != 0 {
		t.Fatalf("exit %d, stderr %q", code, errOut)
	}
	if errOut != "" {
		t.Errorf("stderr %q, want nothing", errOut)
	}

	var raw map[string]json.RawMessage
	if err := json.Unmarshal([]byte(out), &raw); err != nil {
		t.Fatalf("not JSON: %v\n%s", err, out)
	}
	var keys []string
	for k := range raw {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	wantKeys := []string{"arch", "engines", "holds", "node", "notes", "os", "repoBase", "repos", "tokens", "tools", "toolsProbed"}
	if !reflect.DeepEqual(keys, wantKeys) {
		t.Errorf("JSON keys = %q, want %q", keys, wantKeys)
	}

	var got struct {
		Tokens  []string `json:"tokens"`
		OS      string   `json:"os"`
		Arch    string   `json:"arch"`
		Engines []struct {
			Name    string   `json:"name"`
			Path    string   `json:"path"`
			Version string   `json:"version"`
			Builtin bool     `json:"builtin"`
			Flags   []string `json:"flags"`
			Dropped []string `json:"dropped"`
		} `json:"engines"`
		Node        *int              `json:"node"`
		Tools       map[string]string `json:"tools"`
		ToolsProbed []string          `json:"toolsProbed"`
		Repos       []string          `json:"repos"`
		RepoBase    string            `json:"repoBase"`
		Notes       []string          `json:"notes"`
	}
	if err := json.Unmarshal([]byte(out), &got); err != nil {
		t.Fatal(err)
	}
	wantTokens := []string{
		"arch:" + runtime.GOARCH, "engine:claude", "engine:codex", "engine:script",
		"has:gh", "has:node", "node:20", "os:" + runtime.GOOS, "repo:notes", "repo:web",
	}
	if !reflect.DeepEqual(got.Tokens, wantTokens) {
		t.Errorf("tokens\n got %q\nwant %q", got.Tokens, wantTokens)
	}
	if got.OS != runtime.GOOS || got.Arch != runtime.GOARCH {
		t.Errorf("os/arch = %s/%s", got.OS, got.Arch)
	}
	engines := fmt.Sprintf("%+v", got.Engines)
	wantEngines := fmt.Sprintf("[{Name:claude Path:%s Version:2.0.14 (Claude Code) Builtin:false Flags:[-p --output-format --verbose --permission-mode --model --session-id --max-turns --max-budget-usd --append-system-prompt] Dropped:[]} "+
		"{Name:codex Path:%s Version:codex-cli 0.46.0 Builtin:false Flags:[--json -m --sandbox -c] Dropped:[]} {Name:script Path: Version: Builtin:true Flags:[] Dropped:[]}]", paths["claude"], paths["codex"])
	if engines != wantEngines {
		t.Errorf("engines\n got %s\nwant %s", engines, wantEngines)
	}
	if got.Node == nil || *got.Node != 20 {
		t.Errorf("node = %v, want 20", got.Node)
	}
	if want := map[string]string{"gh": paths["gh"], "node": paths["node"]}; !reflect.DeepEqual(got.Tools, want) {
		t.Errorf("tools = %v, want %v", got.Tools, want)
	}
	if !slices.Contains(got.ToolsProbed, "docker") || !slices.Contains(got.ToolsProbed, "git") {
		t.Errorf("toolsProbed = %q", got.ToolsProbed)
	}
	if !reflect.DeepEqual(got.Repos, []string{"notes", "web"}) || got.RepoBase != h.base {
		t.Errorf("repos = %q under %q, want [notes web] under %q", got.Repos, got.RepoBase, h.base)
	}
	if string(raw["notes"]) != "[]" || string(raw["holds"]) != "[]" {
		t.Errorf("notes = %s, holds = %s, want [] and []", raw["notes"], raw["holds"])
	}
}

func TestCapsJSONEmptyHost(t *testing.T) {
	h := newCapsHost(t)
	missing := filepath.Join(h.base, "nope")
	t.Setenv("AQ_REPO_BASE", missing)
	out, errOut, code := runAQ(t, "caps", "--json")
	if code != 0 {
		t.Fatalf("exit %d, stderr %q", code, errOut)
	}
	var raw map[string]json.RawMessage
	if err := json.Unmarshal([]byte(out), &raw); err != nil {
		t.Fatal(err)
	}
	for key, want := range map[string]string{"node": "null", "tools": "{}", "repos": "[]", "repoBase": fmt.Sprintf("%q", missing)} {
		if got := string(raw[key]); got != want {
			t.Errorf("%s = %s, want %s", key, got, want)
		}
	}
	var notes []string
	if err := json.Unmarshal(raw["notes"], &notes); err != nil || len(notes) != 1 || !strings.Contains(notes[0], missing+" does not exist") {
		t.Errorf("notes = %s, want one saying the repo base does not exist", raw["notes"])
	}
	var engines []map[string]any
	if err := json.Unmarshal(raw["engines"], &engines); err != nil || len(engines) != 1 || engines[0]["name"] != "script" {
		t.Errorf("engines = %s, want only the built-in script engine", raw["engines"])
	}
}

func TestCapsHuman(t *testing.T) {
	h, paths := standardHost(t)
	devin := h.exe(t, "devin", `echo "devin: not logged in" >&2; exit 2`)
	out, errOut, code := runAQ(t, "caps")
	if code != 0 || errOut != "" {
		t.Fatalf("exit %d, stderr %q", code, errOut)
	}
	for _, want := range []string{
		"platform:   " + runtime.GOOS + "/" + runtime.GOARCH + "\n",
		"node:       20\n",
		"repo base:  " + h.base + "\n",
		"  claude  2.0.14 (Claude Code)  " + paths["claude"] + "\n",
		"  codex   codex-cli 0.46.0      " + paths["codex"] + "\n",
		"          flags:   -p --output-format --verbose --permission-mode --model --session-id --max-turns --max-budget-usd --append-system-prompt\n",
		"  devin   -                     " + devin + "\n",
		"          refused: devin is unavailable: `devin --help` exited 2: devin: not logged in\n",
		"  script  (built in)\n",
		"  gh          " + paths["gh"] + "\n",
		"repos (2):\n  notes\n  web\n",
		"engine:codex engine:script",
		"repo:notes repo:web\n",
		"notes:\n  - engine devin: " + devin + " --version failed (exit status 2: devin: not logged in); listed without a version\n",
		"  - engine devin refused, not offered: devin is unavailable: `devin --help` exited 2: devin: not logged in\n",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "nested") || strings.Contains(out, "README") {
		t.Errorf("output lists something that is not a repo directly under the base:\n%s", out)
	}
	for i, line := range strings.Split(out, "\n") {
		if strings.TrimRight(line, " ") != line {
			t.Errorf("line %d has trailing spaces: %q", i+1, line)
		}
	}
}

func TestCapsProbeTimeout(t *testing.T) {
	h := newCapsHost(t)
	claude := h.exe(t, "claude", fmt.Sprintf("%q 30", h.sleep))
	// Deadlock guard, not a speed limit: a probe the timeout does not stop
	// runs into it, and caps then fails as interrupted.
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	out, errOut, code := runAQContext(t, ctx, "caps", "--json", "--probe-timeout", "200ms")
	if code != 0 {
		t.Fatalf("exit %d, stderr %q", code, errOut)
	}
	var got struct {
		Tokens  []string         `json:"tokens"`
		Engines []map[string]any `json:"engines"`
		Notes   []string         `json:"notes"`
	}
	if err := json.Unmarshal([]byte(out), &got); err != nil {
		t.Fatal(err)
	}
	// A probe that times out is a busy host, not a missing engine (#33
	// item 6): claude is listed without a version and offered, its flags
	// unknown.
	if !slices.Contains(got.Tokens, "engine:claude") || got.Engines[0]["name"] != "claude" || got.Engines[0]["version"] != "" || got.Engines[0]["path"] != claude {
		t.Errorf("hung claude must be listed without a version, and offered: %+v", got)
	}
	if r, ok := got.Engines[0]["refused"]; ok && r != "" {
		t.Errorf("refused = %v, want none", r)
	}
	want := "engine claude: " + claude + " --version did not finish within 200ms; listed without a version"
	unknown := "engine claude: `claude --help` did not answer within 200ms (a busy host?): its flags are unknown"
	if !slices.Contains(got.Notes, want) || !slices.ContainsFunc(got.Notes, func(n string) bool { return strings.HasPrefix(n, unknown) }) {
		t.Errorf("notes = %q, want %q and %q", got.Notes, want, unknown)
	}
}

// TestCapsRequiredFlagMissing: a claude whose --help lacks --output-format
// (an old or a future CLI) is listed, refused with one line naming the
// flag and what to do, and not offered; the probe is cached per binary.
func TestCapsRequiredFlagMissing(t *testing.T) {
	h := newCapsHost(t)
	claude := h.exe(t, "claude", `case "$*" in
*--help) echo "Usage: claude [options]"; echo "  -p, --print  print"; echo "  --verbose"; echo "  --model <m>"; echo "  --permission-mode <m>"; exit 0;;
*--aq-probe-unknown-option) echo "error: unknown option '--aq-probe-unknown-option'" >&2; exit 1;;
esac
echo "0.2.9 (Claude Code)"`)
	out, errOut, code := runAQ(t, "caps", "--json")
	if code != 0 {
		t.Fatalf("exit %d, stderr %q", code, errOut)
	}
	var got struct {
		Tokens  []string         `json:"tokens"`
		Engines []map[string]any `json:"engines"`
	}
	if err := json.Unmarshal([]byte(out), &got); err != nil {
		t.Fatal(err)
	}
	refused, _ := got.Engines[0]["refused"].(string)
	if slices.Contains(got.Tokens, "engine:claude") || !strings.Contains(refused, "claude at "+claude+" lacks --output-format") ||
		!strings.Contains(refused, "upgrade") || strings.Contains(refused, "\n") {
		t.Errorf("tokens %q, refused %q; want claude refused, naming --output-format and saying to upgrade", got.Tokens, refused)
	}
	dropped := fmt.Sprint(got.Engines[0]["dropped"])
	if dropped != "[--session-id --resume --max-budget-usd --append-system-prompt]" {
		t.Errorf("dropped = %s, want the optional flags the help lacks (--max-turns answers the hidden-flag probe)", dropped)
	}
	cache, err := os.ReadFile(filepath.Join(os.Getenv("AQ_HOME"), "engines", "probes.json"))
	if err != nil || !strings.Contains(string(cache), claude) {
		t.Errorf("the probe was not cached in $AQ_HOME/engines/probes.json: %v\n%s", err, cache)
	}
}

func TestCapsRepoBaseFlagWinsOverEnv(t *testing.T) {
	h := newCapsHost(t)
	other := t.TempDir()
	if out, err := exec.Command(h.git, "init", "-q", filepath.Join(other, "api")).CombinedOutput(); err != nil {
		t.Fatalf("git init: %v\n%s", err, out)
	}
	h.repo(t, "notes")
	out, errOut, code := runAQ(t, "caps", "--json", "--repo-base", other)
	var got struct {
		Repos    []string `json:"repos"`
		RepoBase string   `json:"repoBase"`
	}
	if code != 0 || json.Unmarshal([]byte(out), &got) != nil {
		t.Fatalf("exit %d, stderr %q, out %q", code, errOut, out)
	}
	if got.RepoBase != other || !reflect.DeepEqual(got.Repos, []string{"api"}) {
		t.Errorf("repos %q under %q, want [api] under %q", got.Repos, got.RepoBase, other)
	}
}

func TestCapsErrors(t *testing.T) {
	h := newCapsHost(t)
	file := filepath.Join(h.base, "file")
	if err := os.WriteFile(file, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	cancelled, cancel := context.WithCancel(context.Background())
	cancel()
	tests := []struct {
		name string
		ctx  context.Context
		env  string // AQ_REPO_BASE
		args []string
		code int
		want string
	}{
		{"repo base is a file", context.Background(), file, []string{"caps"}, 2,
			"aq: repo base " + file + " is not a directory (set AQ_REPO_BASE to the folder that holds your git checkouts)\n"},
		{"bad probe timeout", context.Background(), h.base, []string{"caps", "--probe-timeout", "-1s"}, 2,
			"aq: --probe-timeout must be positive, got -1s (give a positive duration, e.g. --probe-timeout 5s)\n"},
		{"unparsable probe timeout", context.Background(), h.base, []string{"caps", "--probe-timeout", "soon"}, 2, ""},
		{"extra argument", context.Background(), h.base, []string{"caps", "notes"}, 2, ""},
		{"interrupted", cancelled, h.base, []string{"caps"}, 1,
			"aq: capability detection was interrupted (run 'aq caps' again)\n"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv("AQ_REPO_BASE", tc.env)
			out, errOut, code := runAQContext(t, tc.ctx, tc.args...)
			if code != tc.code {
				t.Errorf("exit %d, want %d (stderr %q)", code, tc.code, errOut)
			}
			if out != "" {
				t.Errorf("stdout %q, want nothing", out)
			}
			if strings.Count(errOut, "\n") != 1 || !strings.HasPrefix(errOut, "aq: ") {
				t.Errorf("stderr must be one 'aq: ...' line, got %q", errOut)
			}
			if tc.want != "" && errOut != tc.want {
				t.Errorf("stderr\n got %q\nwant %q", errOut, tc.want)
			}
		})
	}
}
