package engines

// The shared suite every coding-engine adapter passes, and the fake engines
// it runs: the test binary itself, reached through symlinks named claude,
// codex and devin on the engine's PATH, prints a recorded fixture of the
// real engine's output (testdata/<engine>/) and behaves as told by
// FAKE_ENGINE_* variables (STYLE example 11).

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/aqfleet/aq/internal/process"
	"github.com/aqfleet/aq/internal/secrets"
	"github.com/aqfleet/aq/internal/testenv"
)

var update = flag.Bool("update", false, "rewrite the testdata/*/*.golden files from the adapters' current output")

const (
	fakeStdout      = "FAKE_ENGINE_STDOUT"       // fixture printed on stdout line by line; "#!" lines are directives
	fakeStderr      = "FAKE_ENGINE_STDERR"       // file copied to stderr first
	fakeExit        = "FAKE_ENGINE_EXIT"         // exit status
	fakeRecord      = "FAKE_ENGINE_RECORD"       // where to write what the engine was given (JSON fakeRecording)
	fakeReady       = "FAKE_ENGINE_READY"        // #!ready writes the grandchildren's pids here
	fakeExport      = "FAKE_ENGINE_EXPORT"       // devin: file copied to the --export path
	fakeExportLink  = "FAKE_ENGINE_EXPORT_LINK"  // devin: "1": the --export path made a symbolic link to that file instead
	fakeVersion     = "FAKE_ENGINE_VERSION"      // --version output
	fakeVersionExit = "FAKE_ENGINE_VERSION_EXIT" // --version exit status
	fakeVersionWarn = "FAKE_ENGINE_VERSION_WARN" // --version prints this on stderr first
	fakeRole        = "FAKE_ENGINE_ROLE"         // "grandchild": sleep ignoring SIGINT
	fakeIgnoreTerm  = "FAKE_ENGINE_IGNORE_TERM"  // grandchild also ignores SIGTERM
	fakeHelpDir     = "FAKE_ENGINE_HELP_DIR"     // --help prints <dir>/<engine>/help.txt (codex exec: exec-help.txt)
	fakeHelp        = "FAKE_ENGINE_HELP"         // --help prints this file instead
	fakeHelpExit    = "FAKE_ENGINE_HELP_EXIT"    // --help exit status
	fakeHelpHang    = "FAKE_ENGINE_HELP_HANG"    // --help never answers
	fakeHelpCount   = "FAKE_ENGINE_HELP_COUNT"   // each --help appends a line here
	fakeUnknownOpt  = "FAKE_ENGINE_UNKNOWN_OPT"  // the hidden-flag probe: "1" rejects the probed flag itself
	fakeSessions    = "FAKE_ENGINE_SESSIONS"     // a directory: keep sessions there and honour --resume / exec resume (fakeSession)
)

var fakeVersions = map[string]string{
	"claude": "2.1.85 (Claude Code)",
	"codex":  "codex-cli 0.130.0",
	"devin":  "devin 2026.9.4",
}

// init turns the test binary into a fake engine when it is run as one.
func init() {
	if os.Getenv(fakeRole) == "grandchild" {
		os.Exit(fakeGrandchild())
	}
	switch name := filepath.Base(os.Args[0]); name {
	case "claude", "codex", "devin":
		os.Exit(fakeEngine(name, os.Args[1:]))
	}
}

// fakeRecording is what a fake engine was given.
type fakeRecording struct {
	Args   []string `json:"args"`
	Stdin  string   `json:"stdin"`
	Prompt string   `json:"prompt"` // devin: the --prompt-file's content
	Env    []string `json:"env"`
	Dir    string   `json:"dir"`
}

func fakeEngine(name string, args []string) int {
	if len(args) > 0 && args[len(args)-1] == "--help" {
		return fakeHelpText(name, args)
	}
	if len(args) > 0 && args[len(args)-1] == unknownProbe {
		// As commander and clap do: the first option not known is named.
		bad := unknownProbe
		if os.Getenv(fakeUnknownOpt) == "1" {
			for _, a := range args {
				if strings.HasPrefix(a, "-") {
					bad = a
					break
				}
			}
		}
		fmt.Fprintf(os.Stderr, "error: unknown option '%s'\n", bad)
		return 1
	}
	if len(args) == 1 && args[0] == "--version" {
		v := os.Getenv(fakeVersion)
		if v == "" {
			v = fakeVersions[name]
		}
		if w := os.Getenv(fakeVersionWarn); w != "" {
			fmt.Fprintln(os.Stderr, w)
		}
		fmt.Println(v)
		code, _ := strconv.Atoi(os.Getenv(fakeVersionExit))
		return code
	}
	rec := fakeRecording{Args: args, Env: os.Environ()}
	rec.Dir, _ = os.Getwd()
	if name == "devin" {
		if f := argAfter(args, "--prompt-file"); f != "" {
			b, _ := os.ReadFile(f)
			rec.Prompt = string(b)
		}
	} else {
		// Like the real engines, read the prompt to EOF before doing
		// anything: if aq left stdin open this hangs (codex's trap).
		b, err := io.ReadAll(os.Stdin)
		if err != nil {
			fmt.Fprintln(os.Stderr, "fake:", err)
			return 90
		}
		rec.Stdin = string(b)
	}
	if p := os.Getenv(fakeRecord); p != "" {
		b, _ := json.Marshal(rec)
		if err := os.WriteFile(p, b, 0o600); err != nil {
			fmt.Fprintln(os.Stderr, "fake:", err)
			return 91
		}
	}
	var sess *fakeSession
	if dir := os.Getenv(fakeSessions); dir != "" {
		var code int
		if sess, code = openFakeSession(name, dir, args, rec.Dir); sess == nil {
			return code
		}
	}
	if p := os.Getenv(fakeStderr); p != "" {
		b, _ := os.ReadFile(p)
		os.Stderr.Write(b)
	}
	if src := os.Getenv(fakeExport); src != "" && name == "devin" {
		b, _ := os.ReadFile(src)
		write := func() error { return os.WriteFile(argAfter(args, "--export"), b, 0o600) }
		if os.Getenv(fakeExportLink) == "1" {
			write = func() error { return os.Symlink(src, argAfter(args, "--export")) }
		}
		if err := write(); err != nil {
			fmt.Fprintln(os.Stderr, "fake:", err)
			return 92
		}
	}
	if p := os.Getenv(fakeStdout); p != "" {
		f, err := os.Open(p)
		if err != nil {
			fmt.Fprintln(os.Stderr, "fake:", err)
			return 93
		}
		// Lines go out in one write until a directive, as an engine
		// flushing a burst of events does: a small burst reaches aq in one
		// read, so what aq sees of it does not depend on scheduling.
		out := bufio.NewWriterSize(os.Stdout, 64<<10)
		defer out.Flush()
		var pids []int
		sc := bufio.NewScanner(f)
		sc.Buffer(nil, 1<<20)
		for sc.Scan() {
			line := sc.Text()
			if strings.HasPrefix(line, "#!") {
				out.Flush()
			}
			switch line {
			case "#!hang":
				time.Sleep(time.Hour)
			case "#!kill":
				out.Flush()
				if self, err := os.FindProcess(os.Getpid()); err == nil {
					_ = self.Kill() // SIGKILL: dies at once, like an engine killed -9
				}
				time.Sleep(time.Hour)
			case "#!grandchildren":
				pids = append(pids, startGrandchild(false), startGrandchild(true))
			case "#!ready":
				ready := os.Getenv(fakeReady)
				b := []byte(strings.Trim(fmt.Sprint(pids), "[]") + "\n")
				if err := os.WriteFile(ready+".tmp", b, 0o600); err != nil || os.Rename(ready+".tmp", ready) != nil {
					return 94
				}
			default:
				if sess != nil {
					line = sess.rewrite(line)
				}
				fmt.Fprintln(out, line)
			}
		}
	}
	if sess != nil {
		if err := sess.save(); err != nil {
			fmt.Fprintln(os.Stderr, "fake:", err)
			return 96
		}
	}
	code, _ := strconv.Atoi(os.Getenv(fakeExit))
	return code
}

// fakeHelpText prints the recorded --help of the real CLI (or the one the
// test chose), fails or hangs as told.
func fakeHelpText(name string, args []string) int {
	if p := os.Getenv(fakeHelpCount); p != "" {
		f, err := os.OpenFile(p, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
		if err == nil {
			fmt.Fprintln(f, strings.Join(args, " "))
			f.Close()
		}
	}
	if os.Getenv(fakeHelpHang) == "1" {
		time.Sleep(time.Hour)
	}
	file := os.Getenv(fakeHelp)
	if file == "" {
		base := "help.txt"
		switch {
		case len(args) > 2 && args[0] == "exec" && args[1] == "resume":
			base = "exec-resume-help.txt"
		case len(args) > 1 && args[0] == "exec":
			base = "exec-help.txt"
		}
		file = filepath.Join(os.Getenv(fakeHelpDir), name, base)
	}
	b, err := os.ReadFile(file)
	if err != nil {
		fmt.Fprintln(os.Stderr, "fake:", err)
		return 95
	}
	os.Stdout.Write(b)
	code, _ := strconv.Atoi(os.Getenv(fakeHelpExit))
	return code
}

func argAfter(args []string, flag string) string {
	for i, a := range args {
		if a == flag && i+1 < len(args) {
			return args[i+1]
		}
	}
	return ""
}

// startGrandchild starts a process that ignores SIGINT (and with setsid,
// leaves the engine's process group and ignores SIGTERM too), waits until it
// is set up and returns its pid.
func startGrandchild(setsid bool) int {
	self, _ := os.Executable()
	cmd := exec.Command(self)
	cmd.Env = append(os.Environ(), fakeRole+"=grandchild")
	if setsid {
		cmd.Env = append(cmd.Env, fakeIgnoreTerm+"=1")
	}
	newSession(cmd, setsid)
	out, err := cmd.StdoutPipe()
	if err != nil {
		panic(err)
	}
	if err := cmd.Start(); err != nil {
		panic(err)
	}
	if line, _ := bufio.NewReader(out).ReadString('\n'); line != "ready\n" {
		panic("grandchild not ready: " + line)
	}
	return cmd.Process.Pid
}

func fakeGrandchild() int {
	signal.Ignore(syscall.SIGINT)
	if os.Getenv(fakeIgnoreTerm) == "1" {
		signal.Ignore(syscall.SIGTERM)
	}
	fmt.Println("ready")
	time.Sleep(time.Hour)
	return 0
}

// fakeHost is a PATH holding the fake engines and a HOME for them.
type fakeHost struct {
	bin, home string
}

func newFakeHost(t *testing.T) *fakeHost {
	t.Helper()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	h := &fakeHost{bin: filepath.Join(dir, "bin"), home: filepath.Join(dir, "home")}
	for _, d := range []string{h.bin, h.home} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for _, name := range []string{"claude", "codex", "devin"} {
		if err := os.Symlink(self, filepath.Join(h.bin, name)); err != nil {
			t.Fatal(err)
		}
	}
	return h
}

// fakeRun is one fake engine run: its spec and where it records.
type fakeRun struct {
	spec   Spec
	record string
	ready  string
}

const testAPIKey = "sk-ant-api03-test-0123456789abcdef"

// run prepares a spec whose engine prints the given fixtures.
func (h *fakeHost) run(t *testing.T, fx fixture, extraEnv ...string) *fakeRun {
	t.Helper()
	tmp := t.TempDir()
	r := &fakeRun{record: filepath.Join(tmp, "record.json"), ready: filepath.Join(tmp, "ready")}
	env := []string{
		"PATH=" + h.bin + ":/usr/bin:/bin",
		"HOME=" + h.home,
		"ANTHROPIC_API_KEY=" + testAPIKey,
		"CODEX_API_KEY=sk-test-codex-0123456789",
		fakeRecord + "=" + r.record,
		fakeReady + "=" + r.ready,
		fakeExit + "=" + strconv.Itoa(fx.exit),
		fakeHelpDir + "=" + testdataPath(t, ""),
		// The race runtime sleeps a second before a process exits unless
		// told not to; the fake engines are this (race) test binary.
		"GORACE=" + strings.TrimSpace(os.Getenv("GORACE")+" atexit_sleep_ms=0"),
	}
	if fx.stdout != "" {
		env = append(env, fakeStdout+"="+testdataPath(t, fx.stdout))
	}
	if fx.stderr != "" {
		env = append(env, fakeStderr+"="+testdataPath(t, fx.stderr))
	}
	if fx.export != "" {
		env = append(env, fakeExport+"="+testdataPath(t, fx.export))
	}
	env = append(env, extraEnv...)
	r.spec = Spec{
		JobID:    "t-" + newUUID(),
		Dir:      t.TempDir(),
		Prompt:   "Fix the failing test in parse/range_test.go.\n",
		LogDir:   filepath.Join(tmp, "logs"),
		Attempt:  1,
		Env:      env,
		Grace:    100 * time.Millisecond,
		Redactor: secrets.NewRedactor(env),
	}
	return r
}

func testdataPath(t *testing.T, rel string) string {
	t.Helper()
	p, err := filepath.Abs(filepath.Join("testdata", rel))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(p); err != nil {
		t.Fatal(err)
	}
	return p
}

func (r *fakeRun) recording(t *testing.T) fakeRecording {
	t.Helper()
	b, err := os.ReadFile(r.record)
	if err != nil {
		t.Fatalf("the fake engine recorded nothing: %v", err)
	}
	var rec fakeRecording
	if err := json.Unmarshal(b, &rec); err != nil {
		t.Fatal(err)
	}
	return rec
}

// fixture is one recorded engine output: files under testdata/.
type fixture struct {
	stdout, stderr, export string
	exit                   int
}

// suiteAdapter is one adapter in the shared suite.
type suiteAdapter struct {
	name   string
	engine Engine
	// Recorded outputs for the scenarios every engine has.
	success, taskFailed, unavailable, limited fixture
	// budget is a scenario that reports usage mid-stream and then hangs;
	// "" for an engine that reports no usage while it runs.
	budget string
	// prompt is where the engine received the prompt.
	prompt func(fakeRecording) string
}

func suiteAdapters() []suiteAdapter {
	// A run that ends normally must not meet ResultGrace, however loaded
	// the machine: the tests of lingering engines set their own.
	grace := time.Minute
	return []suiteAdapter{
		{
			name:        "claude",
			engine:      &Claude{ResultGrace: grace},
			success:     fixture{stdout: "claude/success.jsonl"},
			taskFailed:  fixture{stdout: "claude/success_is_error.jsonl", exit: 1},
			unavailable: fixture{stdout: "claude/auth_expired.jsonl", exit: 1},
			limited:     fixture{stdout: "claude/rate_limit_event.jsonl", exit: 1},
			budget:      "claude/scenario_budget.jsonl",
			prompt:      func(r fakeRecording) string { return r.Stdin },
		},
		{
			name:        "codex",
			engine:      &Codex{ResultGrace: grace},
			success:     fixture{stdout: "codex/success.jsonl"},
			taskFailed:  fixture{stdout: "codex/turn_failed_exit0.jsonl"},
			unavailable: fixture{stdout: "codex/auth_401.jsonl", exit: 1},
			limited:     fixture{stdout: "codex/usage_limit.jsonl", exit: 1},
			budget:      "codex/scenario_budget.jsonl",
			prompt:      func(r fakeRecording) string { return r.Stdin },
		},
		{
			name:        "devin",
			engine:      &Devin{},
			success:     fixture{stdout: "devin/success.txt", export: "devin/success.atif.json"},
			taskFailed:  fixture{stdout: "devin/failed.txt", stderr: "devin/failed.stderr", exit: 1},
			unavailable: fixture{stdout: "devin/auth.txt", stderr: "devin/auth.stderr", exit: 1},
			limited:     fixture{stderr: "devin/usage_limit.stderr", exit: 1},
			prompt:      func(r fakeRecording) string { return r.Prompt },
		},
	}
}

// TestSuite runs every scenario against every adapter.
func TestSuite(t *testing.T) {
	testenv.Slow(t, "runs engine processes through their timeouts")
	for _, a := range suiteAdapters() {
		t.Run(a.name, func(t *testing.T) {
			t.Parallel()
			h := newFakeHost(t)
			t.Run("preflight", func(t *testing.T) { suitePreflight(t, h, a) })
			t.Run("not_installed", func(t *testing.T) { suiteNotInstalled(t, h, a) })
			t.Run("broken_version", func(t *testing.T) { suiteBrokenVersion(t, h, a) })
			t.Run("success", func(t *testing.T) { suiteSuccess(t, h, a) })
			t.Run("task_failed", func(t *testing.T) { suiteOutcome(t, h, a, a.taskFailed, TaskFailed) })
			t.Run("unavailable", func(t *testing.T) { suiteOutcome(t, h, a, a.unavailable, Unavailable) })
			t.Run("limited", func(t *testing.T) { suiteOutcome(t, h, a, a.limited, Limited) })
			t.Run("help_fails", func(t *testing.T) { suiteHelpFails(t, h, a) })
			t.Run("help_hangs", func(t *testing.T) { suiteHelpHangs(t, h, a) })
			t.Run("required_flag_missing", func(t *testing.T) { suiteRequiredFlagMissing(t, h, a) })
			t.Run("env", func(t *testing.T) { suiteEnv(t, h, a) })
			t.Run("stop_kills_every_process", func(t *testing.T) { suiteStop(t, h, a) })
			t.Run("budget_meter_stops", func(t *testing.T) { suiteBudget(t, h, a) })
		})
	}
}

func suitePreflight(t *testing.T, h *fakeHost, a suiteAdapter) {
	r := h.run(t, a.success)
	info, err := a.engine.Preflight(t.Context(), r.spec)
	if err != nil {
		t.Fatal(err)
	}
	if info.Name != a.name || info.Path != filepath.Join(h.bin, a.name) || info.Version != fakeVersions[a.name] {
		t.Errorf("Preflight = %+v, want %s at %s, version %s", info, a.name, filepath.Join(h.bin, a.name), fakeVersions[a.name])
	}
	// A warning on stderr is not the version (codex 0.171.0 with its home
	// under /tmp).
	warned := h.run(t, a.success, fakeVersionWarn+`=WARNING: proceeding, even though we could not create PATH aliases: Refusing to create helper binaries under temporary dir "/tmp"`)
	if wi, err := a.engine.Preflight(t.Context(), warned.spec); err != nil || wi.Version != fakeVersions[a.name] {
		t.Errorf("Preflight with a warning on stderr: version %q (%v), want %s", wi.Version, err, fakeVersions[a.name])
	}
	// The recorded --help of the real CLI has every flag aq requires.
	if info.Flags == nil || len(info.Flags.Missing) > 0 || !info.Flags.Has(HelpSpecs[a.name].Needs[0].Flag) {
		t.Errorf("Preflight's flags = %+v, want every required flag found", info.Flags)
	}
}

func suiteNotInstalled(t *testing.T, h *fakeHost, a suiteAdapter) {
	r := h.run(t, a.success)
	r.spec.Env = withEnv(r.spec.Env, "PATH=/nonexistent")
	if _, err := a.engine.Preflight(t.Context(), r.spec); !errors.Is(err, ErrNotInstalled) {
		t.Errorf("Preflight without %s on PATH: %v, want ErrNotInstalled", a.name, err)
	}
	if _, err := a.engine.Run(t.Context(), r.spec); !errors.Is(err, ErrNotInstalled) {
		t.Errorf("Run without %s on PATH: %v, want ErrNotInstalled", a.name, err)
	}
}

func suiteBrokenVersion(t *testing.T, h *fakeHost, a suiteAdapter) {
	r := h.run(t, a.success, fakeVersionExit+"=3", fakeVersion+"=Error: Cannot find module 'node:sqlite'")
	_, err := a.engine.Preflight(t.Context(), r.spec)
	var ue *UnavailableError
	if !errors.As(err, &ue) || !strings.Contains(ue.Why, "exited 3: Error: Cannot find module 'node:sqlite'") {
		t.Errorf("Preflight with a broken --version: %v, want *UnavailableError saying it exited 3 and why", err)
	}
	// Node's trace of an uncaught error, as codex 0.171.0's npm launcher
	// prints it without its native binary: the reason is the error's line,
	// not the first (the throwing file:line).
	trace := "file:///opt/node_modules/@openai/codex/bin/codex.js:108\n  throw new Error(\n  ^\n\n" +
		"Error: Missing optional dependency @openai/codex-linux-x64. Reinstall Codex: npm install -g @openai/codex@latest\n" +
		"    at findCodexExecutable (file:///opt/node_modules/@openai/codex/bin/codex.js:108:9)\n\nNode.js v20.20.2"
	r = h.run(t, a.success, fakeVersionExit+"=1", fakeVersion+"="+trace)
	_, err = a.engine.Preflight(t.Context(), r.spec)
	if !errors.As(err, &ue) || !strings.HasSuffix(ue.Why, "--version exited 1: Error: Missing optional dependency @openai/codex-linux-x64. Reinstall Codex: npm install -g @openai/codex@latest") {
		t.Errorf("Preflight with a --version that threw: %v, want *UnavailableError quoting the error's line", err)
	}
}

func suiteSuccess(t *testing.T, h *fakeHost, a suiteAdapter) {
	r := h.run(t, a.success)
	res, err := a.engine.Run(t.Context(), r.spec)
	if err != nil {
		t.Fatal(err)
	}
	if res.Outcome != Succeeded {
		t.Fatalf("Outcome = %s (%s), want success", res.Outcome, res.Detail)
	}
	if res.FinalText == "" || res.Usage.Tokens() == 0 || res.Usage.Turns == 0 {
		t.Errorf("result lacks the final text, tokens or turns: %+v", res)
	}
	rec := r.recording(t)
	if got := a.prompt(rec); got != r.spec.Prompt {
		t.Errorf("the engine received the prompt %q, want %q", got, r.spec.Prompt)
	}
	if rec.Dir != r.spec.Dir {
		t.Errorf("the engine ran in %s, want the worktree %s", rec.Dir, r.spec.Dir)
	}
	b, err := os.ReadFile(filepath.Join(r.spec.LogDir, "stdout.log"))
	if err != nil || !bytes.Contains(b, []byte("=== aq job "+r.spec.JobID)) {
		t.Errorf("stdout.log lacks the run header: %v\n%s", err, b)
	}
	assertNoTagged(t, r.spec.JobID)
}

func suiteOutcome(t *testing.T, h *fakeHost, a suiteAdapter, fx fixture, want Outcome) {
	r := h.run(t, fx)
	res, err := a.engine.Run(t.Context(), r.spec)
	if err != nil {
		t.Fatal(err)
	}
	if res.Outcome != want || res.Detail == "" {
		t.Errorf("Outcome = %s (%q), want %s with a detail", res.Outcome, res.Detail, want)
	}
	if res.ExitCode != fx.exit {
		t.Errorf("ExitCode = %d, want %d", res.ExitCode, fx.exit)
	}
}

// suiteHelpFails: a --help that exits non-zero makes the engine unavailable
// with the command and its exit named, at pre-flight and at run.
func suiteHelpFails(t *testing.T, h *fakeHost, a suiteAdapter) {
	r := h.run(t, a.success, fakeHelpExit+"=2")
	_, err := a.engine.Preflight(t.Context(), r.spec)
	var ue *UnavailableError
	if !errors.As(err, &ue) || !strings.Contains(ue.Why, "--help` exited 2") {
		t.Errorf("Preflight with a failing --help: %v, want *UnavailableError saying --help exited 2", err)
	}
	if _, err := a.engine.Run(t.Context(), r.spec); !errors.As(err, &ue) {
		t.Errorf("Run with a failing --help: %v, want *UnavailableError", err)
	}
	if _, err := os.Stat(r.record); err == nil {
		t.Error("the engine ran although its --help failed")
	}
}

// suiteHelpHangs (#33 item 6): a --help that never answers is stopped at
// the probe's timeout, and the engine's flags are unknown — not refused:
// it is offered with its full flag set, saying why, and the unknown answer
// is not kept (probed again next time).
func suiteHelpHangs(t *testing.T, h *fakeHost, a suiteAdapter) {
	r := h.run(t, a.success, fakeHelpHang+"=1")
	eng := withProbeTimeout(a.engine, 300*time.Millisecond)
	done := make(chan error, 1)
	go func() { _, err := eng.Preflight(t.Context(), r.spec); done <- err }()
	var err error
	select {
	case err = <-done:
	case <-time.After(2 * time.Minute): // a deadlock guard, not a speed limit
		t.Fatal("Preflight did not return: the --help probe is not bounded")
	}
	if err != nil {
		t.Fatalf("Preflight with a hanging --help: %v, want the engine offered with its flags unknown", err)
	}
	fs, err := ProbeFlags(t.Context(), a.name, filepath.Join(h.bin, a.name), r.spec.Env, 300*time.Millisecond, nil)
	if err != nil || fs == nil || !fs.Unknown || fs.Refusal(HelpSpecs[a.name].Needs) != "" || len(fs.Notes) != 1 || !strings.Contains(fs.Notes[0], "did not answer within 300ms") {
		t.Fatalf("a hanging --help: %+v %v, want unknown flags, no refusal, a note", fs, err)
	}
	for _, n := range HelpSpecs[a.name].Needs {
		if !fs.Has(n.Flag) {
			t.Errorf("unknown flags: %s dropped, want the full flag set", n.Flag)
		}
	}
}

// suiteRequiredFlagMissing: a CLI whose --help lacks a flag aq requires is
// refused with one line naming the flag and what to do.
func suiteRequiredFlagMissing(t *testing.T, h *fakeHost, a suiteAdapter) {
	need := HelpSpecs[a.name].Needs[0]
	help := filepath.Join(t.TempDir(), "help.txt")
	text := "Usage: " + a.name + " [options]\n\nOptions:\n  --something-else   not what aq needs\n  -h, --help   Display help\n"
	if err := os.WriteFile(help, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	r := h.run(t, a.success, fakeHelp+"="+help)
	_, err := a.engine.Preflight(t.Context(), r.spec)
	var ue *UnavailableError
	if !errors.As(err, &ue) || !slices.Contains(ue.MissingFlags, need.Flag) ||
		!strings.Contains(ue.Why, "lacks "+need.Flag) || !strings.Contains(ue.Why, "upgrade") || strings.Contains(ue.Error(), "\n") {
		t.Errorf("Preflight without %s: %v, want one line naming the flag and saying to upgrade", need.Flag, err)
	}
	if _, err := a.engine.Run(t.Context(), r.spec); !errors.As(err, &ue) {
		t.Errorf("Run without %s: %v, want *UnavailableError", need.Flag, err)
	}
}

// withProbeTimeout is a copy of e whose probes time out after d.
func withProbeTimeout(e Engine, d time.Duration) Engine {
	switch e := e.(type) {
	case *Claude:
		c := *e
		c.HelpTimeout = d
		return &c
	case *Codex:
		c := *e
		c.HelpTimeout = d
		return &c
	case *Devin:
		c := *e
		c.HelpTimeout = d
		return &c
	}
	return e
}

// suiteEnv: the engine gets the host environment minus aq's secrets and
// inherited agent markers, plus the job tag.
func suiteEnv(t *testing.T, h *fakeHost, a suiteAdapter) {
	r := h.run(t, a.success, "CLAUDECODE=1", "CLAUDE_CODE_ENTRYPOINT=cli", "AQ_FLEET_TOKEN=fleet-secret-0123456789", "KEEP_ME=yes")
	if _, err := a.engine.Run(t.Context(), r.spec); err != nil {
		t.Fatal(err)
	}
	env := r.recording(t).Env
	for _, gone := range []string{"CLAUDECODE", "CLAUDE_CODE_ENTRYPOINT", "AQ_FLEET_TOKEN"} {
		if v := envValue(env, gone); v != "" {
			t.Errorf("%s=%s reached the engine", gone, v)
		}
	}
	if envValue(env, "KEEP_ME") != "yes" || envValue(env, "ANTHROPIC_API_KEY") != testAPIKey {
		t.Errorf("the engine lost host variables it needs: %v", env)
	}
	if got := envValue(env, process.TagEnv); got != r.spec.JobID {
		t.Errorf("%s = %q, want the job id %q", process.TagEnv, got, r.spec.JobID)
	}
}

// suiteStop: an engine whose grandchildren ignore SIGINT (one in its
// group, one that escaped it with setsid and ignores SIGTERM too) is
// stopped through the kill ladder, and nothing of it survives.
func suiteStop(t *testing.T, h *fakeHost, a suiteAdapter) {
	r := h.run(t, fixture{stdout: "scenario_grandchildren.txt"})
	ctx, cancel := context.WithCancelCause(t.Context())
	defer cancel(nil)
	errStop := errors.New("test stops the job")
	var pids string
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		pids = waitForFile(ctx, r.ready)
		cancel(errStop)
	}()
	res, err := a.engine.Run(ctx, r.spec)
	wg.Wait()
	if err != nil {
		t.Fatal(err)
	}
	if pids == "" {
		t.Fatal("the fake engine never started its grandchildren")
	}
	if res.Outcome != Stopped || !errors.Is(res.Process.StopCause, errStop) {
		t.Errorf("Outcome = %s (cause %v), want stopped by the test", res.Outcome, res.Process.StopCause)
	}
	assertNoTagged(t, r.spec.JobID)
	for _, f := range strings.Fields(pids) {
		pid, _ := strconv.Atoi(f)
		if process.Alive(pid) {
			t.Errorf("grandchild %d survived the job", pid)
		}
	}
}

// suiteBudget: usage reported mid-stream reaches the Meter, and a Meter
// that cancels the run on a token budget, as the runner's does, stops it.
func suiteBudget(t *testing.T, h *fakeHost, a suiteAdapter) {
	if a.budget == "" {
		t.Skipf("%s reports no usage while it runs; only the wall budget can stop it", a.name)
	}
	r := h.run(t, fixture{stdout: a.budget})
	ctx, cancel := context.WithCancelCause(t.Context())
	defer cancel(nil)
	errBudget := errors.New("budget_exceeded: tokens")
	const limit = 100_000
	var (
		mu   sync.Mutex
		seen []Usage
	)
	r.spec.Meter = MeterFunc(func(u Usage) {
		mu.Lock()
		seen = append(seen, u)
		mu.Unlock()
		if u.Tokens() > limit {
			cancel(errBudget)
		}
	})
	res, err := a.engine.Run(ctx, r.spec)
	if err != nil {
		t.Fatal(err)
	}
	if res.Outcome != Stopped || !errors.Is(res.Process.StopCause, errBudget) {
		t.Fatalf("Outcome = %s (cause %v, %s), want stopped by the budget", res.Outcome, res.Process.StopCause, res.Detail)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(seen) == 0 || seen[len(seen)-1].Tokens() <= limit || seen[len(seen)-1].CostUSD <= 0 {
		t.Errorf("the meter saw %+v, want usage over %d tokens with a cost", seen, limit)
	}
	for i := 1; i < len(seen); i++ {
		if seen[i].Tokens() < seen[i-1].Tokens() {
			t.Errorf("usage went backwards: %+v then %+v", seen[i-1], seen[i])
		}
	}
	assertNoTagged(t, r.spec.JobID)
}

// waitForFile polls until path exists and returns its content, or "" when
// ctx ends.
func waitForFile(ctx context.Context, path string) string {
	for {
		if b, err := os.ReadFile(path); err == nil {
			return string(b)
		}
		select {
		case <-ctx.Done():
			return ""
		case <-time.After(10 * time.Millisecond):
		}
	}
}

func assertNoTagged(t *testing.T, jobID string) {
	t.Helper()
	pids, err := process.FindTagged(jobID)
	if errors.Is(err, errors.ErrUnsupported) {
		return
	}
	if err != nil {
		t.Fatal(err)
	}
	if len(pids) > 0 {
		t.Errorf("processes of job %s survived: %v", jobID, pids)
	}
}

// feed hands a recorded output file to a parser callback line by line, as
// Exec does (blank lines dropped, \r trimmed).
func feed(t *testing.T, rel string, fn func([]byte)) {
	t.Helper()
	if rel == "" {
		return
	}
	b, err := os.ReadFile(filepath.Join("testdata", rel))
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range bytes.Split(b, []byte("\n")) {
		l = bytes.TrimSuffix(l, []byte("\r"))
		if len(bytes.TrimSpace(l)) > 0 {
			fn(l)
		}
	}
}

// finishRecorded feeds p testdata/<engine>/<name>.jsonl (and .stderr, with
// stderr) and finishes it as a process that exited exit.
func finishRecorded(t *testing.T, p streamParser, engine, name string, exit int, stderr bool) Result {
	t.Helper()
	feed(t, engine+"/"+name+".jsonl", p.onStdout)
	if stderr {
		feed(t, engine+"/"+name+".stderr", p.onStderr)
	}
	return p.finish(process.Result{ExitCode: exit}, false)
}

// checkGolden compares res, as JSON, with testdata/<rel>; -update rewrites it.
func checkGolden(t *testing.T, rel string, res Result) {
	t.Helper()
	got, err := json.MarshalIndent(res, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	got = append(got, '\n')
	path := filepath.Join("testdata", rel)
	if *update {
		if err := os.WriteFile(path, got, 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run go test ./engines -run Golden -update to create it)", err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("%s changed (a format change? rerun with -update if intended)\ngot:\n%s\nwant:\n%s", path, got, want)
	}
}
