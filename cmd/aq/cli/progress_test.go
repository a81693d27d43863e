package cli

import (
	"bytes"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/charmbracelet/x/ansi"

	"github.com/aqfleet/aq/agent/runner"
	"github.com/aqfleet/aq/engines"
	"github.com/aqfleet/aq/job"
)

// TestProgressTTYBlock: on a terminal each event redraws the job's line in
// place (erase the block, draw it again), a line written meanwhile lands
// above the block, and done leaves nothing of the block behind.
func TestProgressTTYBlock(t *testing.T) {
	var out bytes.Buffer
	p := newProgress(&out, true, slog.New(slog.DiscardHandler))
	clock := time.Unix(0, 0)
	p.now = func() time.Time { return clock }
	p.event("j1", runner.Preparing{})
	p.event("j1", runner.EngineStarted{Engine: "claude"})
	clock = clock.Add(65 * time.Second)
	p.event("j1", runner.Progress{Engine: "claude", Usage: engines.Usage{TokensIn: 2400, TokensOut: 600, CostUSD: 0.04, Turns: 3}})
	fmt.Fprint(p, "level=WARN msg=\"something\"\n")
	p.event("j1", runner.VerifyStarted{Command: "make test"})
	p.event("j1", runner.Shipping{Ship: "branch"})
	p.done("j1")
	s := out.String()
	for _, want := range []string{
		"j1  preparing  0s\n",
		"\r\033[1A\033[Jj1  engine  0s\n",
		"j1  engine  3 turns  3.0k tok  $0.0400  1m05s\n",
		"\r\033[1A\033[Jlevel=WARN msg=\"something\"\nj1  engine  3 turns",
		"j1  verify  3 turns",
		"j1  shipping  3 turns",
	} {
		if !strings.Contains(s, want) {
			t.Errorf("output lacks %q:\n%q", want, s)
		}
	}
	if !strings.HasSuffix(s, "j1  shipping  3 turns  3.0k tok  $0.0400  1m05s\n\r\033[1A\033[J") {
		t.Errorf("done must erase the block: %q", s)
	}
}

// TestLiveLineFits: a job's line never takes more than width-1 columns;
// the job and its stage come first, the note goes first when room is short.
func TestLiveLineFits(t *testing.T) {
	j := &liveJob{stage: "repair 1/2", hasUsage: true, usage: engines.Usage{TokensIn: 12000, CostUSD: 0.1234, Turns: 7}}
	note := "→ Bash: go test ./internal/very/long/package/path/..."
	for _, tc := range []struct {
		width int
		want  string
	}{
		{120, "job-1  repair 1/2  → Bash: go test ./internal/very/long/package/path/...  7 turns  12.0k tok  $0.1234  2m03s"},
		{70, "job-1  repair 1/2  → Bash: go te…  7 turns  12.0k tok  $0.1234  2m03s"},
		{50, "job-1  repair 1/2  7 turns  12.0k tok  $0.1234  …"},
		{20, "job-1  repair 1/2 …"},
		{1, "…"},
	} {
		got := liveLine("job-1", j, note, 123*time.Second, tc.width)
		if got != tc.want {
			t.Errorf("width %d: %q, want %q", tc.width, got, tc.want)
		}
		if w := ansi.StringWidth(got); w > max(tc.width-1, 1) {
			t.Errorf("width %d: the line takes %d columns", tc.width, w)
		}
	}
}

// TestProgressClearsWrappedLines: after a resize to fewer columns, a line
// drawn at the old width wraps; the erase goes up as many rows.
func TestProgressClearsWrappedLines(t *testing.T) {
	var out bytes.Buffer
	p := newProgress(&out, true, slog.New(slog.DiscardHandler))
	width := 100
	p.width = func() int { return width }
	p.event("a-long-job-name-that-is-long", runner.EngineStarted{Engine: "claude"})
	p.event("a-long-job-name-that-is-long", runner.Progress{Engine: "claude", Usage: engines.Usage{TokensIn: 1, Turns: 1}})
	width = 20
	out.Reset()
	p.done("a-long-job-name-that-is-long")
	// "a-long-job-name-that-is-long  engine  1 turn  1 tok  $0.0000  0s":
	// 64 columns, 4 rows at 20.
	if got := out.String(); got != "\r\033[4A\033[J" {
		t.Errorf("erase after a resize: %q, want 4 rows up", got)
	}
}

func TestProgressPlainLogsThrottled(t *testing.T) {
	var logs bytes.Buffer
	p := newProgress(&bytes.Buffer{}, false, slog.New(slog.NewTextHandler(&logs, nil)))
	clock := time.Unix(0, 0)
	p.now = func() time.Time { return clock }
	p.event("j1", runner.EngineStarted{})
	for i := 0; i < 10; i++ {
		clock = clock.Add(2 * time.Second)
		p.event("j1", runner.Progress{Engine: "codex", Usage: engines.Usage{TokensIn: int64(i)}})
	}
	if n := strings.Count(logs.String(), "msg=progress"); n != 2 {
		t.Fatalf("%d progress lines in 20 s, want 2 (one per 15 s):\n%s", n, logs.String())
	}
}

// TestProgressShowsTheRepairRound: a repair round gets a line of its own
// (why, and whether the engine continues its session), and the live line
// names the round.
func TestProgressShowsTheRepairRound(t *testing.T) {
	var out, logs bytes.Buffer
	p := newProgress(&out, true, slog.New(slog.NewTextHandler(&logs, nil)))
	p.event("j1", runner.EngineStarted{Engine: "claude"})
	p.event("j1", runner.Progress{Engine: "claude", Usage: engines.Usage{TokensIn: 1200, Turns: 2}})
	p.event("j1", runner.RepairStarted{Round: 1, Of: 2, Engine: "claude", Session: "s-1", Verify: job.VerifyResult{Command: "make test", ExitCode: 2}})
	p.event("j1", runner.Progress{Engine: "claude", Usage: engines.Usage{TokensIn: 2400, Turns: 3}})
	p.done("j1")
	s := out.String()
	if !strings.Contains(s, "j1  repair 1/2: verify \"make test\" exited 2; claude again, continuing its session\n") || !strings.Contains(s, "j1  repair 1/2  3 turns") {
		t.Fatalf("output: %q", s)
	}
	if !strings.Contains(logs.String(), "msg=\"repair round\"") {
		t.Errorf("no log line for the round:\n%s", logs.String())
	}
}
