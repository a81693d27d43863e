package cli

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/aqfleet/aq/agent/runner"
	"github.com/aqfleet/aq/engines"
	"github.com/aqfleet/aq/job"
)

func TestProgressTTYRewritesOneLine(t *testing.T) {
	var out bytes.Buffer
	p := newProgress(&out, true, slog.New(slog.DiscardHandler))
	p.event("j1", runner.EngineStarted{Engine: "claude"})
	p.event("j1", runner.Progress{Engine: "claude", Usage: engines.Usage{TokensIn: 1200, TokensOut: 300, CostUSD: 0.02, Turns: 2}})
	p.event("j1", runner.Progress{Engine: "claude", Usage: engines.Usage{TokensIn: 2400, TokensOut: 600, CostUSD: 0.04, Turns: 3}})
	p.done("j1")
	s := out.String()
	if strings.Count(s, "\r\033[K") != 3 || strings.Contains(s, "\n") || !strings.Contains(s, "3 turns") || !strings.Contains(s, "$0.0400") {
		t.Fatalf("live line: %q", s)
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
	if !strings.Contains(s, "j1  repair 1/2: verify \"make test\" exited 2; claude again, continuing its session\n") || !strings.Contains(s, "j1  repair 1/2  claude  3 turns") {
		t.Fatalf("output: %q", s)
	}
	if !strings.Contains(logs.String(), "msg=\"repair round\"") {
		t.Errorf("no log line for the round:\n%s", logs.String())
	}
}
