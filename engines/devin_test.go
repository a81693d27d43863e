package engines

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

func TestDevinArgs(t *testing.T) {
	spec := Spec{LogDir: "/aq/logs/j1", Attempt: 2, Model: "swe-1.7", PermissionMode: "bypassPermissions"}
	want := []string{"-p", "--prompt-file", "/aq/logs/j1/devin-prompt-2.md", "--export", "/aq/logs/j1/devin-trajectory-2.json",
		"--permission-mode", "bypass", "--model", "swe-1.7"}
	if got := (&Devin{}).Args(spec); !slices.Equal(got, want) {
		t.Errorf("Args = %q, want %q", got, want)
	}
	for _, mode := range []string{"", "default", "acceptEdits", "plan", "dontAsk"} {
		spec := Spec{LogDir: "/l", Attempt: 1, PermissionMode: mode}
		if got := argAfter((&Devin{}).Args(spec), "--permission-mode"); got != "normal" {
			t.Errorf("permission mode %q → %q, want normal", mode, got)
		}
	}
}

// devinCases are the recorded outputs and how each must be classified.
var devinCases = []struct {
	name   string
	export bool
	exit   int
	want   Outcome
}{
	{name: "success", export: true, want: Succeeded},
	{name: "legacy_metrics", export: true, want: Succeeded},
	{name: "failed", exit: 1, want: TaskFailed},
	{name: "auth", exit: 1, want: Unavailable},
	{name: "no_answer", exit: 0, want: TaskFailed}, // exit 0 without an answer is no success
}

func TestDevinGolden(t *testing.T) {
	for _, tc := range devinCases {
		t.Run(tc.name, func(t *testing.T) {
			out := &devinOutput{answer: tail{n: 200}, errLines: tail{n: 20}}
			feed(t, "devin/"+tc.name+".txt", out.onStdout)
			if _, err := os.Stat(filepath.Join("testdata", "devin", tc.name+".stderr")); err == nil {
				feed(t, "devin/"+tc.name+".stderr", out.onStderr)
			}
			var traj *atifTrajectory
			var trajErr = fs.ErrNotExist
			if tc.export {
				traj, trajErr = readATIF(filepath.Join("testdata", "devin", tc.name+".atif.json"))
				if trajErr != nil {
					t.Fatal(trajErr)
				}
			}
			res := devinResult(out, traj, trajErr, tc.exit, false, "")
			if res.Outcome != tc.want || !res.NoStructuredOutcome {
				t.Fatalf("Outcome = %s (%s), NoStructuredOutcome %t; want %s, true", res.Outcome, res.Detail, res.NoStructuredOutcome, tc.want)
			}
			checkGolden(t, "devin/"+tc.name+".golden", res)
		})
	}
}

// TestDevinTrajectory: turns and usage come from the exported ATIF
// trajectory, and only when it has them.
func TestDevinTrajectory(t *testing.T) {
	traj, err := readATIF(filepath.Join("testdata", "devin", "success.atif.json"))
	if err != nil {
		t.Fatal(err)
	}
	if u, want := traj.usage(), (Usage{TokensIn: 43912, TokensCached: 38692, TokensOut: 325, Turns: 3}); u != want {
		t.Errorf("usage from final_metrics %+v, want %+v", u, want)
	}
	traj.FinalMetrics = nil
	if u, want := traj.usage(), (Usage{TokensIn: 43912, TokensCached: 38692, TokensOut: 325, Turns: 3}); u != want {
		t.Errorf("usage from the steps %+v, want %+v", u, want)
	}
	legacy, err := readATIF(filepath.Join("testdata", "devin", "legacy_metrics.atif.json"))
	if err != nil {
		t.Fatal(err)
	}
	if u, want := legacy.usage(), (Usage{TokensIn: 12 + 20110 + 1804, TokensCached: 20110, TokensCacheWrite: 1804, TokensOut: 310, Turns: 1}); u != want {
		t.Errorf("usage from metadata.metrics %+v, want %+v", u, want)
	}
	bad := filepath.Join(t.TempDir(), "t.json")
	if err := os.WriteFile(bad, []byte(`{"hello":"world"}`), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := readATIF(bad); err == nil {
		t.Error("a JSON file that is no trajectory was accepted")
	}
}

// TestDevinRun: the prompt goes through a file in the job's log directory,
// never argv; the trajectory is read back; stdin is closed.
func TestDevinRun(t *testing.T) {
	h := newFakeHost(t)
	r := h.run(t, fixture{stdout: "devin/success.txt", export: "devin/success.atif.json"})
	r.spec.Model = "swe-1.7"
	var metered []Usage
	r.spec.Meter = MeterFunc(func(u Usage) { metered = append(metered, u) })
	res, err := (&Devin{}).Run(t.Context(), r.spec)
	if err != nil {
		t.Fatal(err)
	}
	rec := r.recording(t)
	promptFile := filepath.Join(r.spec.LogDir, "devin-prompt-1.md")
	want := []string{"-p", "--prompt-file", promptFile, "--export", filepath.Join(r.spec.LogDir, "devin-trajectory-1.json"),
		"--permission-mode", "normal", "--model", "swe-1.7"}
	if !slices.Equal(rec.Args, want) {
		t.Errorf("devin got %q, want %q", rec.Args, want)
	}
	if rec.Prompt != r.spec.Prompt || strings.Contains(strings.Join(rec.Args, " "), "Fix the failing") {
		t.Errorf("prompt file held %q; the prompt must not be in argv %q", rec.Prompt, rec.Args)
	}
	if fi, err := os.Stat(promptFile); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("prompt file: %v, mode %v; want 0600", err, fi.Mode())
	}
	if res.Outcome != Succeeded || !res.NoStructuredOutcome || res.SessionID != "cooked-exhaust" || res.Model != "swe-1.7" || res.Version != "2026.9.4" {
		t.Errorf("result = %+v", res)
	}
	if res.Usage.Turns != 3 || res.Usage.Tokens() != 43912+325 || len(metered) != 1 || metered[0] != res.Usage {
		t.Errorf("usage %+v, metered %+v; want the trajectory's, metered once", res.Usage, metered)
	}
	if res.FinalText != "Fixed the off-by-one in parse/range.go; go test ./... passes." {
		t.Errorf("FinalText = %q", res.FinalText)
	}
}

// TestDevinStaleTrajectory: a trajectory left by an earlier run of the same
// attempt number is not read as this run's.
func TestDevinStaleTrajectory(t *testing.T) {
	h := newFakeHost(t)
	r := h.run(t, fixture{stdout: "devin/success.txt"})
	if err := os.MkdirAll(r.spec.LogDir, 0o700); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join("testdata", "devin", "success.atif.json"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(r.spec.LogDir, "devin-trajectory-1.json"), b, 0o600); err != nil {
		t.Fatal(err)
	}
	res, err := (&Devin{}).Run(t.Context(), r.spec)
	if err != nil {
		t.Fatal(err)
	}
	if res.Outcome != Succeeded || res.Usage != (Usage{}) || res.SessionID != "" {
		t.Errorf("result = %+v, want success with no usage (no trajectory this time)", res)
	}
	if _, err := os.Stat(filepath.Join(r.spec.LogDir, "devin-trajectory-1.json")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("the stale trajectory is still there: %v", err)
	}
}

// TestDevinTrajectoryThatIsALink: a trajectory the engine leaves as a
// symbolic link (to a host file it cannot read itself) is refused — not
// read, not copied into the job's logs — and reported in Result.Refused;
// the run's usage comes from its output alone. Before internal/safefs aq
// followed the link and kept the linked file as the job's artifact.
func TestDevinTrajectoryThatIsALink(t *testing.T) {
	h := newFakeHost(t)
	r := h.run(t, fixture{stdout: "devin/success.txt", export: "devin/success.atif.json"}, fakeExportLink+"=1")
	r.spec.StateDir = t.TempDir()
	res, err := (&Devin{}).Run(t.Context(), r.spec)
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Refused) != 1 || res.Refused[0].Tree != "state" || res.Refused[0].Path != "devin-trajectory-1.json" || res.Refused[0].Why != "a symbolic link" {
		t.Fatalf("refused %+v, want the trajectory in state/ as a symbolic link", res.Refused)
	}
	if res.Outcome != Succeeded || res.Usage != (Usage{}) {
		t.Errorf("result %+v: want success with no usage from the refused trajectory", res)
	}
	if _, err := os.Stat(filepath.Join(r.spec.LogDir, "devin-trajectory-1.json")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("the linked file was kept in the job's logs: %v", err)
	}
}

// TestDevinPromptFileReplacesWhatIsThere: a prompt file's place in the
// job's state/ that an earlier engine made a symbolic link to a host file
// gets a new file; the host file is untouched.
func TestDevinPromptFileReplacesWhatIsThere(t *testing.T) {
	h := newFakeHost(t)
	r := h.run(t, fixture{stdout: "devin/success.txt"})
	r.spec.StateDir = t.TempDir()
	victim := filepath.Join(t.TempDir(), "victim")
	os.WriteFile(victim, []byte("keep"), 0o600)
	os.Symlink(victim, filepath.Join(r.spec.StateDir, "devin-prompt-1.md"))
	if _, err := (&Devin{}).Run(t.Context(), r.spec); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(victim); string(b) != "keep" {
		t.Errorf("the prompt was written through the link: %q", b)
	}
	if rec := r.recording(t); rec.Prompt != r.spec.Prompt {
		t.Errorf("devin read the prompt %q", rec.Prompt)
	}
}

// readATIF reads and parses a trajectory file of testdata.
func readATIF(path string) (*atifTrajectory, error) {
	b, err := os.ReadFile(path)
	return parseATIF(filepath.Base(path), b, err)
}
