package engines

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/aqfleet/aq/internal/testenv"
)

func readTestdata(t *testing.T, rel string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", rel))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// TestHelpFlagsRealCLIs parses the --help recorded from the real CLIs
// (testdata/README.md names the versions): every flag aq requires is
// found, and the traps FIELD-NOTES §4 names are what the help says.
func TestHelpFlagsRealCLIs(t *testing.T) {
	claude := HelpFlags(readTestdata(t, "claude/help.txt"))
	// The pinned claude (realcli, 2.1.332) answers as the 2.1.197
	// help that the fake claudes print, for every flag aq passes: the fakes'
	// --help is still the real one where aq looks.
	pinned := HelpFlags(readTestdata(t, "claude/help-2.1.332.txt"))
	for _, n := range claudeNeeds {
		for _, sp := range n.spellings() {
			if claude[sp] != pinned[sp] {
				t.Errorf("%s: claude 2.1.197's --help lists it: %t; the pinned 2.1.332's: %t", sp, claude[sp], pinned[sp])
			}
		}
	}
	for _, n := range claudeNeeds {
		has := slices.ContainsFunc(n.spellings(), func(s string) bool { return claude[s] })
		if has == n.Hidden {
			t.Errorf("claude 2.1.197 --help lists %s: %t; want %t (hidden flags are not listed)", n.Flag, has, !n.Hidden)
		}
	}
	for _, f := range []string{"--print", "-p", "--max-budget-usd", "--bare", "--fork-session", "--resume", "-r"} {
		if !claude[f] {
			t.Errorf("claude --help: %s not found", f)
		}
	}
	for _, f := range []string{"--max-turns", "-only", "--only", "-interactive", "--tmux=classic"} {
		if claude[f] {
			t.Errorf("claude --help: %s found, but it is not an option there", f)
		}
	}

	exec := HelpFlags(readTestdata(t, "codex/exec-help.txt"))
	for _, f := range []string{"--json", "-m", "--model", "--sandbox", "-s", "-c", "--config", "-C", "--cd", "--skip-git-repo-check", "--ephemeral", "-o", "--output-last-message"} {
		if !exec[f] {
			t.Errorf("codex exec --help: %s not found", f)
		}
	}
	if exec["--full-auto"] {
		t.Error("codex 0.169.0 exec --help lists --full-auto, which it removed")
	}
	resume := HelpFlags(readTestdata(t, "codex/exec-resume-help.txt"))
	for _, f := range []string{"-s", "--sandbox", "-C", "--cd", "--approve-for-me"} {
		if resume[f] {
			t.Errorf("codex exec resume --help lists %s; FIELD-NOTES says it has none", f)
		}
	}
	if !resume["--json"] || !resume["-c"] || !resume["--last"] {
		t.Errorf("codex exec resume --help: want --json, -c and --last, got %v", resume)
	}

	devin := HelpFlags(readTestdata(t, "devin/help.txt"))
	for _, n := range devinNeeds {
		if !slices.ContainsFunc(n.spellings(), func(s string) bool { return devin[s] }) {
			t.Errorf("devin's documented flags: %s not found", n.Flag)
		}
	}
}

// TestHelpSpecsCoverArgs: every flag an adapter can put on its command line
// is one the probe looks for.
func TestHelpSpecsCoverArgs(t *testing.T) {
	spec := Spec{
		Model: "m", PermissionMode: "bypassPermissions", Persona: "p", SessionID: "5f3c1d2e-8b7a-4c6d-9e0f-1a2b3c4d5e6f",
		Budget: Budget{USD: 1, Turns: 2, Tokens: 3}, LogDir: "/tmp/l", Attempt: 1,
	}
	cargs, _, err := (&Claude{}).Args(spec)
	if err != nil {
		t.Fatal(err)
	}
	noSandbox := spec
	noSandbox.Flags = &FlagSet{Found: []string{"--json", "-m", "-c"}}
	for name, args := range map[string][]string{
		"claude": cargs,
		"codex":  append((&Codex{}).Args(spec)[1:], (&Codex{}).Args(noSandbox)[1:]...), // after the subcommand
		"devin":  (&Devin{}).Args(spec),
	} {
		var known []string
		for _, n := range HelpSpecs[name].Needs {
			known = append(known, n.spellings()...)
		}
		for _, a := range args {
			if strings.HasPrefix(a, "-") && a != "-" && !slices.Contains(known, a) {
				t.Errorf("%s passes %s, which HelpSpecs does not probe", name, a)
			}
		}
	}
}

// TestProbeFlags runs the probe against the fake CLIs printing the real
// --help texts: found, dropped, the hidden flag confirmed by the
// unknown-option probe, and a refusal naming what is missing.
func TestProbeFlags(t *testing.T) {
	testenv.Slow(t, "runs engine processes through their timeouts")
	h := newFakeHost(t)
	r := h.run(t, fixture{})
	path := filepath.Join(h.bin, "claude")

	fs, err := ProbeFlags(t.Context(), "claude", path, r.spec.Env, 0, nil)
	if err != nil {
		t.Fatal(err)
	}
	var all []string
	for _, n := range claudeNeeds {
		all = append(all, n.Flag)
	}
	if !slices.Equal(fs.Found, all) || len(fs.Dropped) != 0 || fs.Refusal(claudeNeeds) != "" {
		t.Errorf("claude 2.1.197: found %v, dropped %v; want every flag (--max-turns through the hidden-flag probe)", fs.Found, fs.Dropped)
	}
	if len(fs.Probed) != 2 || !strings.Contains(fs.Probed[1], "--max-turns 1 "+unknownProbe) {
		t.Errorf("probed %q, want claude --help and the --max-turns probe", fs.Probed)
	}

	// A claude that rejects --max-turns: dropped, with a note.
	r = h.run(t, fixture{}, fakeUnknownOpt+"=1")
	fs, err = ProbeFlags(t.Context(), "claude", path, r.spec.Env, 0, nil)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(fs.Dropped, []string{"--max-turns"}) || len(fs.Notes) != 1 || !strings.Contains(fs.Notes[0], "budget.turns") || fs.Has("--max-turns") {
		t.Errorf("without --max-turns: dropped %v, notes %q", fs.Dropped, fs.Notes)
	}

	// An old claude: no --max-budget-usd, no --append-system-prompt.
	old := filepath.Join(t.TempDir(), "help.txt")
	text := strings.NewReplacer("--max-budget-usd", "--max-budget-xyz", "--append-system-prompt", "--append-xyz").Replace(readTestdata(t, "claude/help.txt"))
	if err := os.WriteFile(old, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	r = h.run(t, fixture{}, fakeHelp+"="+old)
	fs, err = ProbeFlags(t.Context(), "claude", path, r.spec.Env, 0, nil)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(fs.Dropped, []string{"--max-budget-usd", "--append-system-prompt"}) || fs.Refusal(claudeNeeds) != "" {
		t.Errorf("old claude: dropped %v, refusal %q", fs.Dropped, fs.Refusal(claudeNeeds))
	}

	// codex exec resume's help (no --sandbox): -c stands in for it.
	r = h.run(t, fixture{}, fakeHelp+"="+testdataPath(t, "codex/exec-resume-help.txt"))
	fs, err = ProbeFlags(t.Context(), "codex", filepath.Join(h.bin, "codex"), r.spec.Env, 0, nil)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(fs.Dropped, []string{"--sandbox"}) || fs.Refusal(codexNeeds) != "" {
		t.Errorf("codex without --sandbox: dropped %v, refusal %q", fs.Dropped, fs.Refusal(codexNeeds))
	}
	if got := (&Codex{}).Args(Spec{Flags: fs}); !slices.Equal(got, []string{"exec", "--json", "-c", `sandbox_mode="workspace-write"`, "-"}) {
		t.Errorf("codex Args without --sandbox = %q", got)
	}

	// Neither --sandbox nor -c: refused, as for a required flag.
	bare := filepath.Join(t.TempDir(), "help.txt")
	if err := os.WriteFile(bare, []byte("Usage: codex exec [OPTIONS]\n  --json  JSONL\n  -m, --model <M>\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	r = h.run(t, fixture{}, fakeHelp+"="+bare)
	fs, err = ProbeFlags(t.Context(), "codex", filepath.Join(h.bin, "codex"), r.spec.Env, 0, nil)
	if err != nil {
		t.Fatal(err)
	}
	if why := fs.Refusal(codexNeeds); !slices.Equal(fs.Missing, []string{"--sandbox"}) || !strings.Contains(why, "lacks --sandbox") {
		t.Errorf("codex without --sandbox or -c: missing %v, refusal %q", fs.Missing, why)
	}

	// A help that lists no flag at all is not taken for a CLI without flags.
	empty := filepath.Join(t.TempDir(), "help.txt")
	if err := os.WriteFile(empty, []byte("Welcome! Visit https://example.com for help.\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	r = h.run(t, fixture{}, fakeHelp+"="+empty)
	var ue *UnavailableError
	if _, err := ProbeFlags(t.Context(), "claude", path, r.spec.Env, 0, nil); !errors.As(err, &ue) || !strings.Contains(ue.Why, "lists no flags") {
		t.Errorf("a help without flags: %v, want *UnavailableError saying it lists no flags", err)
	}
}

// TestProbeCache: a probed binary is not run again while its path, size
// and mtime stand; a new binary there is probed again; an unreadable cache
// file costs a probe, nothing else.
func TestProbeCache(t *testing.T) {
	h := newFakeHost(t)
	count := filepath.Join(t.TempDir(), "count")
	r := h.run(t, fixture{}, fakeHelpCount+"="+count)
	cacheFile := filepath.Join(t.TempDir(), "cache", "engines.json")
	cache := NewProbeCache(cacheFile)
	// A copy of the fake, so its mtime can change without touching the test binary.
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	path := filepath.Join(dir, "codex")
	copyFile(t, self, path)

	probes := func() int {
		b, _ := os.ReadFile(count)
		return strings.Count(string(b), "\n")
	}
	first, err := ProbeFlags(t.Context(), "codex", path, r.spec.Env, 0, cache)
	if err != nil {
		t.Fatal(err)
	}
	second, err := ProbeFlags(t.Context(), "codex", path, r.spec.Env, 0, NewProbeCache(cacheFile)) // another process
	if err != nil {
		t.Fatal(err)
	}
	if probes() != 1 || !slices.Equal(first.Found, second.Found) {
		t.Fatalf("%d --help runs for an unchanged binary, want 1; found %v then %v", probes(), first.Found, second.Found)
	}

	later := time.Now().Add(time.Hour)
	if err := os.Chtimes(path, later, later); err != nil {
		t.Fatal(err)
	}
	if _, err := ProbeFlags(t.Context(), "codex", path, r.spec.Env, 0, cache); err != nil {
		t.Fatal(err)
	}
	if probes() != 2 {
		t.Errorf("%d --help runs after the binary changed, want 2", probes())
	}

	if err := os.WriteFile(cacheFile, []byte("{not json"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := ProbeFlags(t.Context(), "codex", path, r.spec.Env, 0, cache); err != nil {
		t.Fatal(err)
	}
	if probes() != 3 {
		t.Errorf("%d --help runs with a corrupt cache, want 3", probes())
	}
	if _, err := ProbeFlags(t.Context(), "codex", path, r.spec.Env, 0, cache); err != nil || probes() != 3 {
		t.Errorf("the corrupt cache was not rewritten: %d runs, %v", probes(), err)
	}
}

func copyFile(t *testing.T, from, to string) {
	t.Helper()
	b, err := os.ReadFile(from)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(to, b, 0o755); err != nil {
		t.Fatal(err)
	}
}

// TestProbeUnknownIsNotCached and TestProbeLockRunsOnce (#33 item 6): a
// --help that times out is "unknown" and probed again next time, never
// kept; four probes of one binary at once — four processes' caches on one
// file — run its --help once, the others waiting on the probe's lock and
// finding the answer in the cache.
func TestProbeUnknownIsNotCached(t *testing.T) {
	h := newFakeHost(t)
	r := h.run(t, fixture{}, fakeHelpHang+"=1")
	cache := NewProbeCache(filepath.Join(t.TempDir(), "engines.json"))
	path := filepath.Join(h.bin, "codex")
	for range 2 {
		fs, err := ProbeFlags(t.Context(), "codex", path, r.spec.Env, 200*time.Millisecond, cache)
		if err != nil || !fs.Unknown {
			t.Fatalf("%+v %v", fs, err)
		}
	}
	var kept FlagSet
	if cache.get(path, helpProbeKey(HelpSpecs["codex"]), &kept) {
		t.Errorf("unknown flags were kept in the cache: %+v", kept)
	}
}

func TestProbeLockRunsOnce(t *testing.T) {
	h := newFakeHost(t)
	count := filepath.Join(t.TempDir(), "count")
	r := h.run(t, fixture{}, fakeHelpCount+"="+count)
	cacheFile := filepath.Join(t.TempDir(), "engines.json")
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "codex")
	copyFile(t, self, path)
	errs := make(chan error, 4)
	for range 4 {
		go func() {
			_, err := ProbeFlags(t.Context(), "codex", path, r.spec.Env, 0, NewProbeCache(cacheFile))
			errs <- err
		}()
	}
	for range 4 {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	b, _ := os.ReadFile(count)
	if n := strings.Count(string(b), "\n"); n != 1 {
		t.Errorf("four probes at once ran --help %d times, want 1:\n%s", n, b)
	}
}
