package cli

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/aqfleet/aq/agent/config"
	"github.com/aqfleet/aq/agent/queue"
	"github.com/aqfleet/aq/job"
)

// TestBoardPhaseOfARepairRound: a running job whose engine log is in a
// repair round shows "repair k/n" (its usage the attempt's: every run's);
// the first run shows "engine"; a run that printed its end, "finishing".
func TestBoardPhaseOfARepairRound(t *testing.T) {
	home := t.TempDir()
	r := &statusReader{cfg: &config.Config{Home: home}, logs: &liveLogs{m: map[string]*liveLog{}}}
	log := filepath.Join(home, "logs", "j1", "stdout.log")
	if err := os.MkdirAll(filepath.Dir(log), 0o700); err != nil {
		t.Fatal(err)
	}
	write := func(s string) {
		f, err := os.OpenFile(log, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		if _, err := f.WriteString(s); err != nil {
			t.Fatal(err)
		}
	}
	phase := func() (string, int64) {
		var ph, last string
		var tokens int64
		var cost float64
		var est bool
		r.enrich("j1", 1, &ph, &tokens, &cost, &est, &last)
		return ph, tokens
	}
	write("=== aq job j1 attempt 1: sh at 2026-01-02T03:04:05Z ===\n::aq-usage tokens_in=100 tokens_out=10\n")
	if ph, _ := phase(); ph != "engine" {
		t.Errorf("first run: phase %q", ph)
	}
	write("=== aq job j1 attempt 1 repair 1/2: sh at 2026-01-02T03:05:05Z ===\n::aq-usage tokens_in=50 tokens_out=5\n")
	if ph, tok := phase(); ph != "repair 1/2" || tok != 165 {
		t.Errorf("repair round: phase %q, tokens %d (want repair 1/2, 165: both runs)", ph, tok)
	}
}

// TestJobShowListsTheRounds: aq job show lists the last attempt's runs,
// each round's spending and verify after it, the failed verify's tail, and
// how the attempt before ended.
func TestJobShowListsTheRounds(t *testing.T) {
	var b strings.Builder
	st := queue.State{ID: "j1", Stage: job.Failed, Attempts: 2, Reason: job.ReasonVerifyFailed,
		Previous: &job.Previous{Attempt: 1, Reason: job.ReasonCrash, Detail: "recovered: the process running it is gone"},
		Insights: &job.Insights{RepairRounds: 1, Runs: []job.Run{
			{Round: 0, TokensIn: 1000, TokensOut: 100, CostUSD: 0.01, Turns: 2, EngineMS: 1500, VerifyExit: 1},
			{Round: 1, Session: "5f3c1d2e", TokensIn: 500, TokensOut: 50, CostUSD: 0.005, Turns: 1, EngineMS: 700, VerifyExit: 2},
		}, Verify: &job.VerifyResult{Command: "make test", ExitCode: 2, Tail: "FAIL: TestAdd\nwant 4"}}}
	if err := printJob(&b, JobView{State: st}); err != nil {
		t.Fatal(err)
	}
	out := b.String()
	for _, want := range []string{
		"previous  attempt 1 ended crash: recovered: the process running it is gone",
		"runs (1 repair round):",
		"  first     tokens in/out 1000/100, $0.0100, 2 turns, 1.5s; verify exited 1",
		"  repair 1  tokens in/out 500/50, $0.0050, 1 turns, 700ms, continued session 5f3c1d2e; verify exited 2",
		"last verify (make test, exit 2), its output's end:\n  FAIL: TestAdd\n  want 4",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("aq job show lacks %q:\n%s", want, out)
		}
	}
}
