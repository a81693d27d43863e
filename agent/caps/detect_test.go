package caps

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/aqfleet/aq/engines"
	"github.com/aqfleet/aq/internal/aqerr"
	"github.com/aqfleet/aq/internal/process"
	"github.com/aqfleet/aq/internal/testenv"
	"github.com/aqfleet/aq/job"
)

// These tests exec shell scripts they have just written. They do not call
// t.Parallel: a fork in a parallel test while a script is open for writing
// would make its exec fail with ETXTBSY.

// writeExe writes an executable /bin/sh script named name into dir.
func writeExe(tb testing.TB, dir, name, body string) string {
	tb.Helper()
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, []byte("#!/bin/sh\n"+body+"\n"), 0o755); err != nil {
		tb.Fatal(err)
	}
	return p
}

// engineExe writes a fake engine CLI: `--help` prints the real CLI's
// recorded help (engines/testdata; codex's is `codex exec --help`), the
// hidden-flag probe is answered as commander does (the bogus option is
// named), anything else runs body.
func engineExe(tb testing.TB, dir, name, body string) string {
	tb.Helper()
	base := "help.txt"
	if name == "codex" {
		base = "exec-help.txt"
	}
	help, err := filepath.Abs(filepath.Join("..", "..", "engines", "testdata", name, base))
	if err != nil {
		tb.Fatal(err)
	}
	cat, err := exec.LookPath("cat")
	if err != nil {
		tb.Skip("cat not found")
	}
	return writeExe(tb, dir, name, fmt.Sprintf(`case "$*" in
*--help) %q %q; exit 0;;
*--aq-probe-unknown-option) echo "error: unknown option '--aq-probe-unknown-option'" >&2; exit 1;;
esac
%s`, cat, help, body))
}

// allFlags are the flags aq passes to engine name, all found.
func allFlags(name string) []string {
	var out []string
	for _, n := range engines.HelpSpecs[name].Needs {
		out = append(out, n.Flag)
	}
	return out
}

// sleepBin is the absolute path of sleep: fake PATHs hold only the fakes.
func sleepBin(tb testing.TB) string {
	tb.Helper()
	p, err := exec.LookPath("sleep")
	if err != nil {
		tb.Skip("sleep not found")
	}
	return p
}

// gitBin is the real git, used to build real repositories.
func gitBin(tb testing.TB) string {
	tb.Helper()
	p, err := exec.LookPath("git")
	if err != nil {
		tb.Skip("git not found")
	}
	return p
}

func runGit(tb testing.TB, git string, args ...string) {
	tb.Helper()
	cmd := exec.Command(git, args...)
	cmd.Env = append(os.Environ(), "GIT_CONFIG_GLOBAL=/dev/null", "GIT_CONFIG_NOSYSTEM=1",
		"GIT_AUTHOR_NAME=t", "GIT_AUTHOR_EMAIL=t@example.com", "GIT_COMMITTER_NAME=t", "GIT_COMMITTER_EMAIL=t@example.com")
	if out, err := cmd.CombinedOutput(); err != nil {
		tb.Fatalf("git %s: %v\n%s", strings.Join(args, " "), err, out)
	}
}

// gitInit makes a real repository at dir with one commit.
func gitInit(tb testing.TB, git, dir string) {
	tb.Helper()
	runGit(tb, git, "init", "-q", "-b", "main", dir)
	runGit(tb, git, "-C", dir, "commit", "-q", "--allow-empty", "-m", "init")
}

// The real tools' --version output.
const (
	claudeVersion = `echo "2.0.14 (Claude Code)"`
	codexVersion  = `echo "codex-cli 0.46.0"`
	nodeVersion   = `echo "v20.20.2"`
	ghVersion     = "echo \"gh version 2.81.0 (2025-10-01)\"\necho \"https://github.com/cli/cli/releases/tag/v2.81.0\""
)

func TestDetectEnginesToolsAndNode(t *testing.T) {
	bin, later, cwd := t.TempDir(), t.TempDir(), t.TempDir()
	ran := filepath.Join(t.TempDir(), "gh-ran")
	claude := engineExe(t, bin, "claude", claudeVersion)
	codex := engineExe(t, bin, "codex", codexVersion)
	node := writeExe(t, bin, "node", nodeVersion)
	gh := writeExe(t, bin, "gh", `: > "`+ran+`"`+"\n"+ghVersion)
	git := writeExe(t, bin, "git", `echo "git version 2.43.0"`)
	// Not executable, a directory, shadowed, or only on a relative PATH entry:
	// none of these is offered.
	if err := os.WriteFile(filepath.Join(bin, "docker"), []byte("#!/bin/sh\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(filepath.Join(bin, "make"), 0o755); err != nil {
		t.Fatal(err)
	}
	writeExe(t, later, "claude", `echo "9.9.9 (Claude Code)"`)
	writeExe(t, cwd, "devin", `echo "devin 1.0"`)
	writeExe(t, cwd, "psql", `echo "psql (PostgreSQL) 16"`)
	t.Chdir(cwd)

	h, err := Detect(context.Background(), DetectOptions{
		RepoBase: t.TempDir(),
		Path:     strings.Join([]string{".", "", bin, later, bin}, string(os.PathListSeparator)),
	})
	if err != nil {
		t.Fatal(err)
	}
	wantEngines := []EngineInfo{
		{Name: "claude", Path: claude, Version: "2.0.14 (Claude Code)", Flags: allFlags("claude"), Dropped: []string{}},
		{Name: "codex", Path: codex, Version: "codex-cli 0.46.0", Flags: allFlags("codex"), Dropped: []string{}},
		{Name: "script", Builtin: true, Flags: []string{}, Dropped: []string{}},
	}
	if !reflect.DeepEqual(h.Engines, wantEngines) {
		t.Errorf("Engines\n got %+v\nwant %+v", h.Engines, wantEngines)
	}
	if h.Node != 20 {
		t.Errorf("Node = %d, want 20", h.Node)
	}
	wantTools := map[string]string{"gh": gh, "git": git, "node": node}
	if !reflect.DeepEqual(h.Tools, wantTools) {
		t.Errorf("Tools = %v, want %v", h.Tools, wantTools)
	}
	if _, err := os.Stat(ran); err == nil {
		t.Errorf("gh was executed: tools are detected by presence only")
	}
	wantTokens := []string{
		"arch:" + runtime.GOARCH, "engine:claude", "engine:codex", "engine:script",
		"has:gh", "has:git", "has:node", "manifest:budget.disk", "manifest:may_change", "node:20", "os:" + runtime.GOOS,
	}
	if got := h.Tokens(); !reflect.DeepEqual(got, wantTokens) {
		t.Errorf("Tokens()\n got %q\nwant %q", got, wantTokens)
	}
	if h.OS != runtime.GOOS || h.Arch != runtime.GOARCH {
		t.Errorf("OS/Arch = %s/%s", h.OS, h.Arch)
	}
	if len(h.Notes) != 0 || len(h.Repos) != 0 {
		t.Errorf("Notes = %q, Repos = %q; want none", h.Notes, h.Repos)
	}
	if !slices.Equal(h.ToolsProbed, DefaultTools()) {
		t.Errorf("ToolsProbed = %q, want DefaultTools()", h.ToolsProbed)
	}
}

func TestDetectDefaultsToProcessPATH(t *testing.T) {
	bin := t.TempDir()
	claude := engineExe(t, bin, "claude", claudeVersion)
	t.Setenv("PATH", bin)
	h, err := Detect(context.Background(), DetectOptions{RepoBase: t.TempDir(), Tools: []string{"git"}})
	if err != nil {
		t.Fatal(err)
	}
	if len(h.Engines) != 2 || !reflect.DeepEqual(h.Engines[0], EngineInfo{Name: "claude", Path: claude, Version: "2.0.14 (Claude Code)", Flags: allFlags("claude"), Dropped: []string{}}) {
		t.Errorf("Engines = %+v, want claude from $PATH and script", h.Engines)
	}
	if len(h.Tools) != 0 || !slices.Equal(h.ToolsProbed, []string{"git"}) {
		t.Errorf("Tools = %v, ToolsProbed = %v; want only git looked for, and not found", h.Tools, h.ToolsProbed)
	}
}

func TestDetectProbeEnvironment(t *testing.T) {
	bin := t.TempDir()
	engineExe(t, bin, "codex", `echo "codex-cli 0.46.0 token=${AQ_FLEET_TOKEN:-unset} conn=${AQ_SB_CONNECTION_STRING:-unset} home=$HOME path=$PATH"`)
	h, err := Detect(context.Background(), DetectOptions{
		RepoBase: t.TempDir(),
		Path:     bin,
		Env:      []string{"AQ_FLEET_TOKEN=tok-secret-1", "AQ_SB_CONNECTION_STRING=Endpoint=sb://x", "HOME=/home/probe", "PATH=/somewhere/else"},
	})
	if err != nil {
		t.Fatal(err)
	}
	want := "codex-cli 0.46.0 token=unset conn=unset home=/home/probe path=" + bin
	if got := h.Engines[0].Version; got != want {
		t.Errorf("probe saw %q, want %q (no aq secrets; PATH is the searched path)", got, want)
	}
}

func TestDetectProbeFailures(t *testing.T) {
	testenv.Slow(t, "probes through timeouts and real repositories")
	bin := t.TempDir()
	pidFile := filepath.Join(t.TempDir(), "sleep.pid")
	// claude hangs in a child that holds stdout open for an hour: the timeout
	// must kill the whole process group and not wait for the pipe.
	claude := writeExe(t, bin, "claude", fmt.Sprintf("%q 3600 &\necho $! > %q\nwait\necho never", sleepBin(t), pidFile))
	t.Cleanup(func() { killLeftover(pidFile) })
	codex := writeExe(t, bin, "codex", `echo "error: config.toml is broken" >&2; exit 3`)
	devin := writeExe(t, bin, "devin", `exit 0`)

	// One timeout for all three: the hanging claude needs it to pass, and the
	// others must answer within it however busy the machine — 2 s, not the
	// few hundred milliseconds a quick machine would do with.
	h, err := detectOrHang(t, context.Background(), DetectOptions{RepoBase: t.TempDir(), Path: bin, ProbeTimeout: 2 * time.Second, HelpTimeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	// Listed without versions. codex and devin refused: their --help fails
	// or says nothing, so aq cannot know how to call them. claude's hangs:
	// a busy host, not a missing engine (#33 item 6) — offered, with its
	// flags unknown (all of them), and a note.
	var claudeFlags []string
	for _, n := range engines.HelpSpecs["claude"].Needs {
		claudeFlags = append(claudeFlags, n.Flag)
	}
	refusedExit := "codex is unavailable: `codex exec --help` exited 3: error: config.toml is broken"
	refusedQuiet := "devin is unavailable: `devin --help` printed nothing"
	none := []string{}
	wantEngines := []EngineInfo{
		{Name: "claude", Path: claude, Flags: claudeFlags, Dropped: none},
		{Name: "codex", Path: codex, Flags: none, Dropped: none, Refused: refusedExit},
		{Name: "devin", Path: devin, Flags: none, Dropped: none, Refused: refusedQuiet},
		{Name: "script", Builtin: true, Flags: none, Dropped: none},
	}
	if !reflect.DeepEqual(h.Engines, wantEngines) {
		t.Errorf("Engines\n got %+v\nwant %+v (listed, without versions, refused)", h.Engines, wantEngines)
	}
	wantNotes := []string{
		"engine claude: " + claude + " --version did not finish within 2s; listed without a version",
		"engine claude: `claude --help` did not answer within 2s (a busy host?): its flags are unknown, it is offered and runs with all of them, and is probed again next time (AQ_ENGINE_PROBE_TIMEOUT)",
		"engine codex: " + codex + " --version failed (exit status 3: error: config.toml is broken); listed without a version",
		"engine codex refused, not offered: " + refusedExit,
		"engine devin: " + devin + " --version printed nothing; listed without a version",
		"engine devin refused, not offered: " + refusedQuiet,
	}
	if !reflect.DeepEqual(h.Notes, wantNotes) {
		t.Errorf("Notes\n got %q\nwant %q", h.Notes, wantNotes)
	}
	for _, tok := range []string{"engine:codex", "engine:devin"} {
		if slices.Contains(h.Tokens(), tok) {
			t.Errorf("Tokens() offers %s, whose --help failed", tok)
		}
	}
	if !slices.Contains(h.Tokens(), "engine:claude") {
		t.Error("Tokens() lacks engine:claude, whose --help only timed out: a missing capability on a busy host")
	}
	if !slices.Contains(h.Tokens(), "engine:script") {
		t.Error("Tokens() lacks engine:script")
	}
	if m := Match([]string{"engine:codex"}, h); len(m) != 1 || !strings.Contains(m[0].Reason, "refused: "+refusedExit) {
		t.Errorf("Match(engine:codex) = %v, want the refusal as the reason", m)
	}

	// The hung probe's child was killed with its group.
	if runtime.GOOS == "linux" {
		b, err := os.ReadFile(pidFile)
		if err != nil {
			t.Fatalf("the hanging fake never started its child: %v", err)
		}
		pid, _ := strconv.Atoi(strings.TrimSpace(string(b)))
		deadline := time.Now().Add(3 * time.Second)
		for process.Alive(pid) {
			if time.Now().After(deadline) {
				t.Fatalf("the hung probe's child (pid %d) is still running", pid)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
}

// detectOrHang is Detect with a deadlock guard, not a speed requirement: the
// fakes these tests hang on run for an hour, so a Detect that waits for one
// instead of killing it is still running after a minute.
func detectOrHang(t *testing.T, ctx context.Context, o DetectOptions) (*Host, error) {
	t.Helper()
	type result struct {
		h   *Host
		err error
	}
	done := make(chan result, 1)
	go func() {
		h, err := Detect(ctx, o)
		done <- result{h, err}
	}()
	select {
	case r := <-done:
		return r.h, r.err
	case <-time.After(time.Minute):
		t.Fatal("Detect is still waiting for a hung probe after a minute")
		return nil, nil
	}
}

// killLeftover kills the process whose pid a fake wrote to pidFile, if it
// still runs (only when the code under test failed to kill it).
func killLeftover(pidFile string) {
	b, err := os.ReadFile(pidFile)
	if err != nil {
		return
	}
	if pid, _ := strconv.Atoi(strings.TrimSpace(string(b))); process.Alive(pid) {
		if p, err := os.FindProcess(pid); err == nil {
			_ = p.Kill()
		}
	}
}

func TestDetectNode(t *testing.T) {
	sleep := sleepBin(t)
	tests := []struct {
		name, script string
		want         int
		note         string // substring of the one expected note; "" = none
	}{
		{"stdout", nodeVersion, 20, ""},
		{"old major", `echo v8.9.4`, 8, ""},
		{"blank lines first, CRLF", `printf '\n\r\nv22.1.0\r\n'`, 22, ""},
		{"stderr only", `echo v18.19.1 >&2`, 18, ""},
		{"garbage", `echo "not a version"`, 0, `cannot read a major version from`},
		{"fails", `echo "node: bad option" >&2; exit 9`, 0, "failed (exit status 9: node: bad option); no node:<major> capability"},
		{"hangs", `exec "` + sleep + `" 30`, 0, "did not finish within 200ms; no node:<major> capability"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			bin := t.TempDir()
			node := writeExe(t, bin, "node", tc.script)
			// The probe's timeout is the case under test only for "hangs";
			// the others get a deadlock guard, so that a node that answers
			// is read on a machine however busy.
			timeout := 30 * time.Second
			if tc.name == "hangs" {
				timeout = 200 * time.Millisecond
			}
			h, err := Detect(context.Background(), DetectOptions{RepoBase: t.TempDir(), Path: bin, ProbeTimeout: timeout})
			if err != nil {
				t.Fatal(err)
			}
			if h.Node != tc.want {
				t.Errorf("Node = %d, want %d", h.Node, tc.want)
			}
			if h.Tools["node"] != node {
				t.Errorf("has:node missing: Tools = %v (node is on PATH whatever its version)", h.Tools)
			}
			hasNodeToken := slices.ContainsFunc(h.Tokens(), func(s string) bool { return strings.HasPrefix(s, "node:") })
			if hasNodeToken != (tc.want > 0) {
				t.Errorf("Tokens() = %q: node:<major> present = %v, want %v", h.Tokens(), hasNodeToken, tc.want > 0)
			}
			switch {
			case tc.note == "" && len(h.Notes) != 0:
				t.Errorf("Notes = %q, want none", h.Notes)
			case tc.note != "" && (len(h.Notes) != 1 || !strings.Contains(h.Notes[0], tc.note) || !strings.HasPrefix(h.Notes[0], "node: ")):
				t.Errorf("Notes = %q, want one node note containing %q", h.Notes, tc.note)
			}
		})
	}
}

// TestDetectProbesRunConcurrently proves the version probes overlap: each
// fake waits (up to 5s) until all four have started. Run one after another,
// the first would give up and lose its version.
func TestDetectProbesRunConcurrently(t *testing.T) {
	bin, marks := t.TempDir(), t.TempDir()
	sleep := sleepBin(t)
	names := []string{"claude", "codex", "devin", "node"}
	var all []string
	for _, n := range names {
		all = append(all, fmt.Sprintf("[ -e %q ]", filepath.Join(marks, n)))
	}
	for _, n := range names {
		exe := writeExe
		if n != "node" {
			exe = engineExe
		}
		exe(t, bin, n, fmt.Sprintf(`: > %q
i=0
while [ $i -lt 100 ]; do
  if %s; then echo "v21.0.0"; exit 0; fi
  %q 0.05
  i=$((i+1))
done
echo "barrier not reached" >&2
exit 1`, filepath.Join(marks, n), strings.Join(all, " && "), sleep))
	}
	h, err := Detect(context.Background(), DetectOptions{RepoBase: t.TempDir(), Path: bin, ProbeTimeout: 15 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if len(h.Notes) != 0 {
		t.Fatalf("probes did not overlap: %q", h.Notes)
	}
	for _, e := range h.Engines[:3] {
		if e.Version != "v21.0.0" {
			t.Errorf("engine %s version = %q", e.Name, e.Version)
		}
	}
	if h.Node != 21 {
		t.Errorf("Node = %d", h.Node)
	}
}

func TestDetectCancelled(t *testing.T) {
	bin := t.TempDir()
	pidFile := filepath.Join(t.TempDir(), "sleep.pid")
	writeExe(t, bin, "claude", fmt.Sprintf("echo $$ > %q\nexec %q 3600", pidFile, sleepBin(t)))
	t.Cleanup(func() { killLeftover(pidFile) })
	ctx, cancel := context.WithCancel(context.Background())
	time.AfterFunc(100*time.Millisecond, cancel)
	h, err := detectOrHang(t, ctx, DetectOptions{RepoBase: t.TempDir(), Path: bin, ProbeTimeout: time.Hour})
	if !errors.Is(err, context.Canceled) || h != nil {
		t.Fatalf("Detect = %v, %v; want context.Canceled", h, err)
	}
}

func TestDetectRepos(t *testing.T) {
	testenv.Slow(t, "probes through timeouts and real repositories")
	git := gitBin(t)
	base := t.TempDir()
	in := func(name string) string { return filepath.Join(base, name) }
	long := strings.Repeat("r", 129)

	gitInit(t, git, in("notes"))
	gitInit(t, git, in("web"))
	gitInit(t, git, in("a.b_c-1"))
	// A linked worktree: its .git is a file.
	runGit(t, git, "-C", in("notes"), "worktree", "add", "-q", "-b", "feature", in("linked"))
	// A submodule-style checkout: .git file with a gitdir link.
	if err := os.MkdirAll(in("sub"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(in("sub"), ".git"), []byte("gitdir: ../notes/.git/modules/sub\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(in("notes"), ".git", "modules", "sub"), 0o755); err != nil {
		t.Fatal(err)
	}
	// A gitdir link whose target is gone (its main repository was removed):
	// not a repository.
	if err := os.MkdirAll(in("orphaned"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(in("orphaned"), ".git"), []byte("gitdir: "+in("removed")+"/.git/worktrees/orphaned\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	// A symbolic link to a repository is that repository under another name.
	if err := os.Symlink(in("web"), in("alias")); err != nil {
		t.Fatal(err)
	}

	// Not repositories: a plain folder, a file, a repo nested one level down,
	// a .git file that is no gitdir link, a dangling link, a link to a file.
	if err := os.MkdirAll(filepath.Join(in("plain"), "src"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(in("file.txt"), []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(in("looks.git"), []byte("gitdir: x"), 0o644); err != nil {
		t.Fatal(err)
	}
	gitInit(t, git, filepath.Join(in("outer"), "inner"))
	if err := os.MkdirAll(in("fake"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(in("fake"), ".git"), []byte("not a link\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(in("nowhere"), in("dangling")); err != nil {
		t.Fatal(err)
	}
	// A clone that has only just begun: its .git holds no HEAD, objects or
	// refs yet, and the runner would refuse it (worktree.IsRepo).
	if err := os.MkdirAll(filepath.Join(in("cloning"), ".git"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(in("file.txt"), in("tofile")); err != nil {
		t.Fatal(err)
	}
	// Repositories whose names fail the id rule: skipped with a note; a
	// hidden one (a clone in progress is .<name>.clone-*) silently.
	for _, bad := range []string{"bad name", ".hidden", "-dash", long} {
		gitInit(t, git, in(bad))
	}

	h, err := Detect(context.Background(), DetectOptions{RepoBase: base, Path: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"a.b_c-1", "alias", "linked", "notes", "sub", "web"}
	if !reflect.DeepEqual(h.Repos, want) {
		t.Errorf("Repos\n got %q\nwant %q", h.Repos, want)
	}
	if h.RepoBase != base {
		t.Errorf("RepoBase = %q", h.RepoBase)
	}
	for _, r := range want {
		if !slices.Contains(h.Tokens(), "repo:"+r) {
			t.Errorf("Tokens() lacks repo:%s", r)
		}
	}
	var skipped []string
	for _, n := range h.Notes {
		if strings.HasPrefix(n, "skipped git repository ") {
			skipped = append(skipped, n)
		}
	}
	if len(skipped) != 3 || len(h.Notes) != 3 {
		t.Fatalf("Notes = %q, want 3 'skipped' notes", h.Notes)
	}
	for _, bad := range []string{`"-dash"`, `"bad name"`, `"` + long + `"`} {
		if !slices.ContainsFunc(skipped, func(n string) bool { return strings.Contains(n, bad) }) {
			t.Errorf("no note for %s in %q", bad, skipped)
		}
	}
	// Repos it can clone on demand are offered beside the clones, once.
	h, err = Detect(context.Background(), DetectOptions{RepoBase: base, Path: t.TempDir(), Clonable: []string{"web", "zeta", "0app"}})
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"0app", "a.b_c-1", "alias", "linked", "notes", "sub", "web", "zeta"}; !reflect.DeepEqual(h.Repos, want) {
		t.Errorf("Repos with clonable ones\n got %q\nwant %q", h.Repos, want)
	}
}

func TestDetectRepoBaseProblems(t *testing.T) {
	tmp := t.TempDir()
	file := filepath.Join(tmp, "file")
	if err := os.WriteFile(file, nil, 0o644); err != nil {
		t.Fatal(err)
	}

	t.Run("missing is a note", func(t *testing.T) {
		missing := filepath.Join(tmp, "nope")
		h, err := Detect(context.Background(), DetectOptions{RepoBase: missing, Path: tmp})
		if err != nil {
			t.Fatal(err)
		}
		if len(h.Repos) != 0 || len(h.Notes) != 1 || !strings.Contains(h.Notes[0], "repo base "+missing+" does not exist") {
			t.Errorf("Repos = %q, Notes = %q", h.Repos, h.Notes)
		}
	})
	t.Run("unset is a note", func(t *testing.T) {
		h, err := Detect(context.Background(), DetectOptions{Path: tmp})
		if err != nil {
			t.Fatal(err)
		}
		if len(h.Notes) != 1 || !strings.HasPrefix(h.Notes[0], "no repo base configured") {
			t.Errorf("Notes = %q", h.Notes)
		}
	})
	t.Run("a file is an error", func(t *testing.T) {
		_, err := Detect(context.Background(), DetectOptions{RepoBase: file, Path: tmp})
		var e *aqerr.Error
		if !errors.As(err, &e) || e.Code != aqerr.Usage || !strings.Contains(e.Error(), file+" is not a directory") {
			t.Errorf("err = %v, want a usage error saying it is not a directory", err)
		}
	})
	t.Run("unreadable is an error", func(t *testing.T) {
		if os.Geteuid() == 0 {
			t.Skip("root reads any directory")
		}
		locked := filepath.Join(tmp, "locked")
		if err := os.Mkdir(locked, 0o000); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { os.Chmod(locked, 0o755) })
		_, err := Detect(context.Background(), DetectOptions{RepoBase: locked, Path: tmp})
		var e *aqerr.Error
		if !errors.As(err, &e) || e.Code != aqerr.Usage || !strings.Contains(e.Error(), "cannot list repo base") {
			t.Errorf("err = %v, want a usage error", err)
		}
	})
}

func TestDefaultTools(t *testing.T) {
	t.Parallel()
	tools := DefaultTools()
	for _, need := range []string{"git", "gh", "docker", "go", "python3", "make", "node", "npm", "cargo", "rustc", "java", "mvn", "psql"} {
		if !slices.Contains(tools, need) {
			t.Errorf("DefaultTools lacks %s", need)
		}
	}
	if !slices.IsSorted(tools) || len(slices.Compact(slices.Clone(tools))) != len(tools) {
		t.Errorf("DefaultTools is not sorted and unique: %q", tools)
	}
	for _, tool := range tools {
		if _, err := job.ParseRequirement("has:" + tool); err != nil {
			t.Errorf("has:%s is not a valid token: %v", tool, err)
		}
	}
	tools[0] = "mutated"
	if DefaultTools()[0] == "mutated" {
		t.Error("DefaultTools returns the shared slice")
	}
}

func TestParseNodeMajor(t *testing.T) {
	t.Parallel()
	tests := []struct {
		in   string
		want int
		ok   bool
	}{
		{"v20.20.2", 20, true},
		{"v8.9.4", 8, true},
		{"22.1.0", 22, true},
		{" v24 ", 24, true},
		{"", 0, false},
		{"v", 0, false},
		{"vx.1", 0, false},
		{"v0.12.18", 0, false},
		{"v+20.1", 0, false},
		{"v-1.0", 0, false},
		{"v020.1", 0, false},
	}
	for _, tc := range tests {
		got, ok := ParseNodeMajor(tc.in)
		if got != tc.want || ok != tc.ok {
			t.Errorf("ParseNodeMajor(%q) = %d, %v; want %d, %v", tc.in, got, ok, tc.want, tc.ok)
		}
	}
}

func TestFirstLine(t *testing.T) {
	t.Parallel()
	tests := map[string]string{
		"2.0.14 (Claude Code)\n":       "2.0.14 (Claude Code)",
		"\n  \r\ncodex-cli 0.46.0\r\n": "codex-cli 0.46.0",
		"\x1b[32mv1\x1b[0m\tbeta\n":    "[32mv1[0m beta",
		"":                             "",
		strings.Repeat("x", 500):       strings.Repeat("x", maxVersionLine),
	}
	for in, want := range tests {
		if got := firstLine([]byte(in)); got != want {
			t.Errorf("firstLine(%q) = %q, want %q", in, got, want)
		}
	}
	var w capWriter
	n, err := w.Write(make([]byte, capLimit+10))
	if n != capLimit+10 || err != nil || len(w.Bytes()) != capLimit {
		t.Errorf("capWriter kept %d bytes (n=%d, err=%v), want %d", len(w.Bytes()), n, err, capLimit)
	}
}

// BenchmarkDetect: a PATH of fakes (three engines, node, gh, git) and a repo
// base of 50 real repositories plus clutter.
func BenchmarkDetect(b *testing.B) {
	git := gitBin(b)
	bin, base := b.TempDir(), b.TempDir()
	writeExe(b, bin, "claude", claudeVersion)
	writeExe(b, bin, "codex", codexVersion)
	writeExe(b, bin, "devin", `echo "devin 2025.10.1"`)
	writeExe(b, bin, "node", nodeVersion)
	writeExe(b, bin, "gh", ghVersion)
	writeExe(b, bin, "git", `echo "git version 2.43.0"`)
	for i := range 50 {
		runGit(b, git, "init", "-q", filepath.Join(base, fmt.Sprintf("repo-%02d", i)))
		if err := os.MkdirAll(filepath.Join(base, fmt.Sprintf("plain-%02d", i)), 0o755); err != nil {
			b.Fatal(err)
		}
	}
	path := strings.Join([]string{b.TempDir(), b.TempDir(), bin, "/usr/bin", "/bin"}, string(os.PathListSeparator))
	for b.Loop() {
		h, err := Detect(context.Background(), DetectOptions{RepoBase: base, Path: path})
		if err != nil {
			b.Fatal(err)
		}
		if len(h.Repos) != 50 || h.Node != 20 || len(h.Engines) != 4 {
			b.Fatalf("Repos %d, Node %d, Engines %d", len(h.Repos), h.Node, len(h.Engines))
		}
	}
}

// TestProbeCache: detection runs an unchanged engine binary's probes
// (--version, --help) once — the cache answers after, in this process and
// in another through its file; a changed binary (an upgrade) is probed
// again; a failed probe is not kept.
func TestProbeCache(t *testing.T) {
	help, err := filepath.Abs("../../engines/testdata/claude/help.txt")
	if err != nil {
		t.Fatal(err)
	}
	cat, err := exec.LookPath("cat") // the fakes run with PATH=dir
	if err != nil {
		t.Skip("cat not found")
	}
	dir := t.TempDir()
	runs, codexRuns := filepath.Join(t.TempDir(), "runs"), filepath.Join(t.TempDir(), "codex-runs")
	claude := writeExe(t, dir, "claude", `echo "$*" >> "`+runs+`"
case "$*" in
--version) echo "2.1.0 (Claude Code)";;
*--help) "`+cat+`" "`+help+`";;
*) echo "error: unknown option '--aq-probe-unknown-option'" >&2; exit 1;;
esac`)
	writeExe(t, dir, "codex", `echo "$*" >> "`+codexRuns+`"; echo broken >&2; exit 1`)
	count := func(f string) int { b, _ := os.ReadFile(f); return strings.Count(string(b), "\n") }
	file := filepath.Join(t.TempDir(), "engines", "probes.json")
	detect := func(c *engines.ProbeCache) *Host {
		t.Helper()
		h, err := Detect(context.Background(), DetectOptions{Path: dir, Tools: []string{}, Probes: c})
		if err != nil {
			t.Fatal(err)
		}
		if e := h.Engines[0]; e.Name != "claude" || e.Version != "2.1.0 (Claude Code)" || len(e.Flags) == 0 || e.Refused != "" {
			t.Fatalf("engines %+v", h.Engines)
		}
		return h
	}
	c := engines.NewProbeCache(file)
	detect(c)
	first := count(runs)
	if first < 2 {
		t.Fatalf("the first detection ran claude %d times, want --version and --help at least", first)
	}
	detect(c)
	detect(engines.NewProbeCache(file)) // another process, the same file
	if n := count(runs); n != first {
		t.Fatalf("claude ran %d times in three detections, %d in the first: an unchanged binary was probed again", n, first)
	}
	if n := count(codexRuns); n < 3 {
		t.Fatalf("codex's failed probes ran %d times in three detections: a failure was kept", n)
	}
	// An upgrade: the binary's mtime moves.
	later := time.Now().Add(time.Hour)
	if err := os.Chtimes(claude, later, later); err != nil {
		t.Fatal(err)
	}
	detect(c)
	if n := count(runs); n != 2*first {
		t.Fatalf("a changed binary: %d runs, want %d", n, 2*first)
	}
}
