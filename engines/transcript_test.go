package engines

import (
	"bufio"
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// render feeds a recorded log to a transcript and returns its notes as
// lines.
func render(t *testing.T, tr *Transcript, log []byte) []string {
	t.Helper()
	var out []string
	sc := bufio.NewScanner(bytes.NewReader(log))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		for _, n := range tr.Line(sc.Bytes()) {
			out = append(out, n.String())
		}
	}
	return out
}

func recorded(t *testing.T, name string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func hasLine(lines []string, sub string) bool {
	for _, l := range lines {
		if strings.Contains(l, sub) {
			return true
		}
	}
	return false
}

// TestTranscriptClaude: claude's stream-json rendered for a person — the
// engine's words, each tool call with its target, a failed tool result, the
// usage as it accrues and the result — with the engine read from the log's
// attempt header, and the usage the adapter's own accounting (the golden
// file's figures).
func TestTranscriptClaude(t *testing.T) {
	log := append([]byte("=== aq job j-1 attempt 1: claude at 2026-01-02T03:04:05Z ===\n"), recorded(t, "claude/success.jsonl")...)
	tr := NewTranscript("", "", nil)
	lines := render(t, tr, log)
	for _, want := range []string{
		"── attempt 1: claude at 2026-01-02T03:04:05Z ──",
		"claude 2.1.85, model claude-sonnet-4-5-20250929",
		"I'll run the tests first",
		"→ Bash go test ./...",
		"→ Edit /home/aq/.aq/worktrees/demo/j-7f2c/parse/range.go",
		"✗ tool failed: --- FAIL: TestParseRange",
		"· usage: ",
		"■ result: success, 48.8k tokens (48.4k in, 410 out), $0.0396, 4 turn(s)",
	} {
		if !hasLine(lines, want) {
			t.Errorf("no line with %q in:\n%s", want, strings.Join(lines, "\n"))
		}
	}
	u, ok := tr.Usage()
	if !ok || u.CostUSD != 0.0396 || u.TokensIn != 48402 || u.TokensOut != 410 || u.Turns != 4 || u.Estimated {
		t.Errorf("usage %+v (the adapter's golden: in 48402, out 410, $0.0396, 4 turns)", u)
	}
	if !tr.Ended() || !strings.Contains(tr.Last(), "result: success") {
		t.Errorf("ended %v, last %q", tr.Ended(), tr.Last())
	}
	// A second attempt starts afresh.
	tr.Line([]byte("=== aq job j-1 attempt 2: claude at 2026-01-02T04:00:00Z ==="))
	if u, ok := tr.Usage(); ok || u != (Usage{}) || tr.Ended() {
		t.Errorf("after a new attempt header: usage %+v %v, ended %v", u, ok, tr.Ended())
	}
}

// TestTranscriptCodex: codex's JSONL — commands, file changes, the answer,
// a failed command, and usage priced from the table as the adapter prices it.
func TestTranscriptCodex(t *testing.T) {
	tr := NewTranscript("codex", "gpt-5.3-codex", nil)
	lines := render(t, tr, recorded(t, "codex/success.jsonl"))
	for _, want := range []string{
		"codex thread 0199a213",
		"→ command bash -lc 'go test ./...'",
		"✗ command exited 1",
		"→ edit update /home/aq/.aq/worktrees/demo/j-7f2c/parse/range.go",
		"Fixed the off-by-one",
		"■ turn completed, 49.8k tokens (48.2k in, 1.6k out), ~$0.0421, 1 turn(s)",
	} {
		if !hasLine(lines, want) {
			t.Errorf("no line with %q in:\n%s", want, strings.Join(lines, "\n"))
		}
	}
	if u, _ := tr.Usage(); u.CostUSD != 0.04205635 || !u.Estimated {
		t.Errorf("usage %+v (golden cost 0.04205635, estimated)", u)
	}
}

// TestTranscriptScriptAndText: a script's ::aq-usage directives become
// usage; anything else is shown as it is; devin's plain answer too.
func TestTranscriptScriptAndText(t *testing.T) {
	tr := NewTranscript("", "", nil)
	lines := render(t, tr, []byte("::aq-usage tokens_in=1200 tokens_out=300 cost_usd=0.02 turns=3\nworking on it\n::aq-unavailable quota gone\n"))
	want := []string{"· usage: 1.5k tokens (1.2k in, 300 out), $0.0200, 3 turn(s)", "working on it", "! unavailable: quota gone"}
	if strings.Join(lines, "\n") != strings.Join(want, "\n") {
		t.Errorf("script lines:\n%s\nwant:\n%s", strings.Join(lines, "\n"), strings.Join(want, "\n"))
	}
	d := NewTranscript("devin", "", nil)
	if l := render(t, d, []byte(`{"type":"not really"}`+"\n")); len(l) != 1 || l[0] != `{"type":"not really"}` {
		t.Errorf("devin output %q", l)
	}
	if !IsHeader([]byte("=== aq job x attempt 3: sh at 2026-01-02T03:04:05Z ===\n")) || IsHeader([]byte("=== not a header ===")) {
		t.Error("IsHeader")
	}
}
