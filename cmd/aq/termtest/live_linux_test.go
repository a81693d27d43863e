//go:build !unit

package termtest

import (
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/aqfleet/aq/internal/testenv"
)

// liveHome is a home with repo webapp (and its origin), a fake claude that
// prints its recorded stream-json run a line every second and a half —
// text, a Bash tool call, an Edit, usage as it accrues — then does script,
// and the environment to run aq in a terminal with it.
func liveHome(t *testing.T, script string) (h *testenv.Home, origin string, env []string) {
	t.Helper()
	h = testenv.NewHome(t)
	h.Bin = testenv.BuildAQ(t)
	repo := h.Repo(t, "webapp", map[string]string{"index.html": "<title>Helo</title>\n"})
	origin = testenv.AddOrigin(t, repo)
	rec := filepath.Join(testenv.ClaudeTestdata(t), "success.jsonl")
	b, err := os.ReadFile(rec)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	dir := t.TempDir()
	bin := filepath.Join(dir, "bin")
	// The recording is copied beside the fake: the fake's folder stays
	// readable in the sandbox, the source tree need not (a clone under
	// /tmp is hidden, and every note was lost).
	notes := filepath.Join(bin, "notes.jsonl")
	testenv.WriteFile(t, notes, strings.Join(lines[:len(lines)-1], "\n")+"\n")
	last := filepath.Join(bin, "result.jsonl")
	testenv.WriteFile(t, last, lines[len(lines)-1]+"\n")
	steps := []string{"echo started > started.txt"} // work to checkpoint
	for i := range lines[:len(lines)-1] {
		// Each note stays 3 s: a margin for a loaded machine, where aq's
		// redraw and tmux's capture are slow.
		steps = append(steps, "sed -n "+strconv.Itoa(i+1)+"p "+shellQuote(notes)+" || exit 97", "sleep 3")
	}
	testenv.FakeClaude{Script: strings.Join(append(steps, script), "\n"), Stream: last}.Write(t, bin)
	// A key the fake never uses: claude's login check wants one.
	env = termEnv(h, "PATH="+bin+":"+os.Getenv("PATH"), "ANTHROPIC_API_KEY=sk-ant-fake-for-tests")
	// The environment a person has: aq's debug level from the test home
	// would not be theirs.
	for i, kv := range env {
		if strings.HasPrefix(kv, "AQ_LOG_LEVEL=") {
			env[i] = "AQ_LOG_LEVEL=info"
		}
	}
	return h, origin, env
}

// blockLine matches a live block's line of job id.
func blockLine(id string) *regexp.Regexp {
	return regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(id) + `  (preparing|engine|checkpoint|verify|repair \d+/\d+|shipping)\b`)
}

// TestLiveRunInTmux: aq run --once in a real terminal shows the job's
// live line — its stage, the engine's last note, the usage and cost
// changing — no log lines, and then only the result line: no part of the
// block is left on the final screen.
func TestLiveRunInTmux(t *testing.T) {
	t.Parallel()
	h, _, env := liveHome(t, "printf '<title>Hello</title>\\n' > index.html")
	id := testenv.ID("live")
	h.Submit(t, "live", "repo: webapp\nengine: claude\nverify: sleep 3; grep -q Hello index.html\nship: branch")
	x := testenv.StartTmux(t, env, 120, 30, shellLine(h.RepoBase, h.Bin, "run", "--once"))

	s := x.WaitText(id+"  engine  ", "I'll run the tests first")
	if !strings.Contains(s, "$0.") || !strings.Contains(s, " tok ") {
		t.Errorf("the live line lacks the usage:\n%s", s)
	}
	first := s
	s = x.WaitText(id+"  engine  ", "→ Bash go test ./...")
	if s == first {
		t.Errorf("the line did not change")
	}
	x.WaitText(id+"  engine  ", "→ Edit")
	x.WaitText(id + "  verify  ")
	final := x.WaitText("EXITED 0")
	if !strings.Contains(final, "job "+id+": shipped (aq/job/"+id) {
		t.Errorf("no result line:\n%s", final)
	}
	if blockLine(id).MatchString(final) {
		t.Errorf("the live block was left on the screen:\n%s", final)
	}
	if strings.Contains(final, "level=INFO") || strings.Contains(final, "level=DEBUG") {
		t.Errorf("log lines on the terminal without -v:\n%s", final)
	}
}

// TestLiveRunCtrlC: Ctrl-C in the middle of the engine's run leaves a
// clean terminal — the block erased, the shell's prompt on a line of its
// own — and the job's work checkpointed (aq/wip/<id>) as without a
// terminal.
func TestLiveRunCtrlC(t *testing.T) {
	t.Parallel()
	h, origin, env := liveHome(t, "sleep 60")
	id := testenv.ID("livectrlc")
	h.Submit(t, "livectrlc", "repo: webapp\nengine: claude\nship: branch")
	x := testenv.StartTmux(t, env, 100, 30, shellLine(h.RepoBase, h.Bin, "run", "--once"))
	x.WaitText(id+"  engine  ", "→ Bash go test ./...")
	x.Keys("C-c")
	final := x.WaitText("EXITED ")
	if blockLine(id).MatchString(final) {
		t.Errorf("Ctrl-C left the live block on the screen:\n%s", final)
	}
	if !regexp.MustCompile(`(?m)^EXITED \d+\s*$`).MatchString(final) {
		t.Errorf("the line after aq is not clean:\n%s", final)
	}
	refs := testenv.RemoteRefs(t, origin, "refs/heads/aq/wip/")
	if _, ok := refs["refs/heads/aq/wip/"+id]; !ok {
		t.Errorf("no WIP checkpoint on origin after Ctrl-C: %v\nscreen:\n%s", refs, final)
	}
}
