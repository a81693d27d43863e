package runner_test

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aqfleet/aq/agent/runner"
	"github.com/aqfleet/aq/engines"
	"github.com/aqfleet/aq/internal/testenv"
	"github.com/aqfleet/aq/job"
)

// The repair rounds' tests share one task: answer.txt must say 42. The
// job's verify (check.sh, in the repository) prints what is wrong; the
// engine fixes it only when its prompt names the failure ("want 42"), and
// leaves the wrong answer otherwise — so a job can only ship if verify's
// output reached the engine.

var roundsFiles = map[string]string{
	"README.md": "# calc\n",
	"check.sh":  "a=$(cat answer.txt 2>/dev/null)\nif [ \"$a\" != 42 ]; then echo \"running the answer check\"; echo \"FAIL: answer.txt says '$a', want 42\"; exit 1; fi\necho ok\n",
}

// needsFailure is the scripted engine: it keeps each prompt it is given in
// $MARK/prompt-<n> and writes the answer the prompt lets it write.
const needsFailure = `n=1; while [ -e "$MARK/prompt-$n" ]; do n=$((n+1)); done
cat > "$MARK/prompt-$n"
if grep -q "want 42" "$MARK/prompt-$n"; then echo 42 > answer.txt; else echo 41 > answer.txt; fi
echo "::aq-usage tokens_in=1000 tokens_out=100 cost_usd=0.01 turns=2"
`

func newRoundsFixture(t *testing.T, extra ...engines.Engine) *fixture {
	t.Helper()
	f := newFixture(t, extra...)
	f.repo = f.home.Repo(t, "calc", roundsFiles)
	f.r.Cfg.VerifyRounds = job.DefaultVerifyRounds // as a factory's AQ_VERIFY_ROUNDS default
	return f
}

func (f *fixture) roundsJob(name string, rounds *int) *job.Job {
	j := f.job(name, needsFailure)
	j.Repo, j.Verify, j.VerifyRounds = "calc", "sh check.sh", rounds
	return j
}

func (f *fixture) prompts() []string {
	f.t.Helper()
	var out []string
	for n := 1; ; n++ {
		b, err := os.ReadFile(filepath.Join(f.mark, "prompt-"+itoa(n)))
		if err != nil {
			return out
		}
		out = append(out, string(b))
	}
}

func itoa(n int) string { return strconv.Itoa(n) }

func rounds(n int) *int { return &n }

// events collects a run's events.
type events struct {
	mu  sync.Mutex
	all []runner.Event
}

func (e *events) add(ev runner.Event) { e.mu.Lock(); e.all = append(e.all, ev); e.mu.Unlock() }

func (e *events) verified() (out []job.VerifyResult) {
	e.mu.Lock()
	defer e.mu.Unlock()
	for _, ev := range e.all {
		if v, ok := ev.(runner.Verified); ok {
			out = append(out, v.Result)
		}
	}
	return out
}

func (e *events) repairs() (out []runner.RepairStarted) {
	e.mu.Lock()
	defer e.mu.Unlock()
	for _, ev := range e.all {
		if r, ok := ev.(runner.RepairStarted); ok {
			out = append(out, r)
		}
	}
	return out
}

// TestRepairRoundsShipWhatABlindRunCannot is #28's "done when": without
// rounds the job fails verify_failed after one run; with rounds it ships in
// the same attempt after two runs, the second told verify's command, exit
// status and output.
func TestRepairRoundsShipWhatABlindRunCannot(t *testing.T) {
	testenv.Slow(t, "runs whole jobs with real git, processes and waits")
	t.Run("without_rounds", func(t *testing.T) {
		t.Parallel()
		f := newRoundsFixture(t)
		var ev events
		out := f.run(context.Background(), f.roundsJob("blind", rounds(0)), runner.Options{OnEvent: ev.add})
		if out.Reason != job.ReasonVerifyFailed || strings.Contains(out.Detail, "repair round") {
			t.Fatalf("reason %q (%s), want verify_failed with no rounds", out.Reason, out.Detail)
		}
		if p := f.prompts(); len(p) != 1 {
			t.Fatalf("%d engine runs, want 1", len(p))
		}
		in := out.Insights
		if in.RepairRounds != 0 || len(in.Runs) != 1 || in.Runs[0].VerifyExit != 1 || in.Verify == nil || !strings.Contains(in.Verify.Tail, "want 42") {
			t.Errorf("insights: rounds %d runs %+v verify %+v", in.RepairRounds, in.Runs, in.Verify)
		}
		if len(ev.repairs()) != 0 || len(ev.verified()) != 1 {
			t.Errorf("events: %d repairs, %d verifies", len(ev.repairs()), len(ev.verified()))
		}
	})
	t.Run("with_rounds", func(t *testing.T) {
		t.Parallel()
		f := newRoundsFixture(t)
		var ev events
		j := f.roundsJob("repaired", nil) // the factory's default: 2
		out := f.run(context.Background(), j, runner.Options{Attempt: 1, OnEvent: ev.add})
		if out.Failed() || out.Stage != job.Testing {
			t.Fatalf("stage %s reason %q (%s), want it to pass verify in this attempt", out.Stage, out.Reason, out.Detail)
		}
		p := f.prompts()
		if len(p) != 2 {
			t.Fatalf("%d engine runs, want 2 (the first and one repair round)", len(p))
		}
		for _, want := range []string{"Do the work for " + j.ID, "repair round 1 of 2", "Verify command: sh check.sh", "Exit status: 1",
			"FAIL: answer.txt says '41', want 42", "--- verify output ---"} {
			if !strings.Contains(p[1], want) {
				t.Errorf("the repair round's prompt lacks %q:\n%s", want, p[1])
			}
		}
		if strings.Contains(p[0], "want 42") {
			t.Errorf("the first prompt already had the failure:\n%s", p[0])
		}
		if got := testenv.TreeFiles(t, f.repo, out.Commit)["answer.txt"]; got != "42" {
			t.Errorf("the result has answer.txt %q, want 42", got)
		}
		in := out.Insights
		if in.RepairRounds != 1 || len(in.Runs) != 2 || in.Runs[0].VerifyExit != 1 || !in.Runs[1].VerifyPassed || in.Runs[1].Round != 1 || in.Runs[1].Session != "" {
			t.Errorf("insights: rounds %d runs %+v", in.RepairRounds, in.Runs)
		}
		if in.TokensIn != 2000 || in.CostUSD < 0.0199 || in.CostUSD > 0.0201 || in.Turns != 4 {
			t.Errorf("the attempt's usage is both runs': tokens in %d, cost %f, turns %d", in.TokensIn, in.CostUSD, in.Turns)
		}
		if in.Verify == nil || !in.Verify.Passed || in.Verify.Tail != "" {
			t.Errorf("last verify %+v, want passed without a tail", in.Verify)
		}
		if r := ev.repairs(); len(r) != 1 || r[0].Round != 1 || r[0].Of != 2 || r[0].Verify.ExitCode != 1 || r[0].Session != "" {
			t.Errorf("repair events %+v", r)
		}
		if v := ev.verified(); len(v) != 2 || v[0].Passed || !v[1].Passed {
			t.Errorf("verify events %+v", v)
		}
		// Each round is checkpointed: aq/wip holds the first run's work
		// under the round's.
		wip := testenv.Git(t, f.repo, "log", "--format=%s", "aq/wip/"+j.ID)
		if !strings.Contains(wip, "(after the engine)") || !strings.Contains(wip, "(after the engine, repair round 1)") {
			t.Errorf("aq/wip history:\n%s", wip)
		}
		msg := testenv.Git(t, f.repo, "log", "-1", "--format=%B", out.Commit)
		if !strings.Contains(msg, "aq-repair-rounds: 1") || testenv.Git(t, f.repo, "rev-parse", out.Commit+"^") != testenv.Git(t, f.repo, "rev-parse", "main") {
			t.Errorf("the result commit is not one commit on main with the rounds in its trailers:\n%s", msg)
		}
		// Both runs' output is in the engine log, the round's under its
		// own header; the verify log has both verifies.
		log := testenv.ReadFile(t, filepath.Join(f.home.Dir, "logs", j.ID, "stdout.log"))
		if !strings.Contains(log, "attempt 1 repair 1/2: sh") || strings.Count(log, "=== aq job ") != 2 {
			t.Errorf("stdout.log:\n%s", log)
		}
		vlog := testenv.ReadFile(t, filepath.Join(f.home.Dir, "logs", j.ID, "verify.log"))
		if strings.Count(vlog, "FAIL: answer.txt") != 1 || !strings.Contains(vlog, "(after repair 1/2): verify") || !strings.Contains(vlog, "ok") {
			t.Errorf("verify.log:\n%s", vlog)
		}
	})
}

// TestRepairRoundsRunOut: an engine that never fixes the cause gets its
// rounds and no more; the job fails verify_failed saying how many ran.
func TestRepairRoundsRunOut(t *testing.T) {
	testenv.Slow(t, "runs whole jobs with real git, processes and waits")
	f := newRoundsFixture(t)
	j := f.roundsJob("stubborn", rounds(2))
	j.Script = strings.Replace(needsFailure, `grep -q "want 42"`, `false`, 1)
	out := f.run(context.Background(), j, runner.Options{})
	if out.Reason != job.ReasonVerifyFailed || !strings.Contains(out.Detail, "after 2 repair rounds") {
		t.Fatalf("reason %q (%s), want verify_failed after 2 repair rounds", out.Reason, out.Detail)
	}
	p := f.prompts()
	if len(p) != 3 || !strings.Contains(p[2], "repair round 2 of 2") {
		t.Fatalf("%d runs, want 3; last prompt:\n%s", len(p), p[len(p)-1])
	}
	in := out.Insights
	if in.RepairRounds != 2 || len(in.Runs) != 3 || in.Verify == nil || in.Verify.Passed {
		t.Errorf("insights: rounds %d runs %+v verify %+v", in.RepairRounds, in.Runs, in.Verify)
	}
	if out.Checkpoint == "" || f.wip(j.ID) != out.Checkpoint {
		t.Errorf("the last round's work is not the checkpoint: %q / %q", out.Checkpoint, f.wip(j.ID))
	}
}

// TestRepairRoundBudget: the rounds share the attempt's budgets. A round
// that would pass one (what is left is less than any run of the attempt
// spent) is not started; one that starts and spends past it is stopped by
// the meter; the wall budget bounds the engine time of all the runs.
func TestRepairRoundBudget(t *testing.T) {
	testenv.Slow(t, "runs whole jobs with real git, processes and waits")
	never := strings.Replace(needsFailure, `grep -q "want 42"`, `false`, 1)
	cases := []struct {
		name       string
		script     string
		budget     job.Budget
		want       job.Reason
		wantRuns   int
		wantRounds int
		detail     string
	}{
		{name: "usd_would_pass", script: strings.Replace(never, "cost_usd=0.01", "cost_usd=0.03", 1), budget: job.Budget{USD: 0.05},
			want: job.ReasonBudgetExceeded, wantRuns: 1, detail: "repair round 1 was not started: $0.0200 of budget.usd $0.05 is left, and a run of this attempt has cost at least $0.0300"},
		{name: "tokens_spent", script: never, budget: job.Budget{Tokens: 2200},
			want: job.ReasonBudgetExceeded, wantRuns: 2, wantRounds: 1, detail: "repair round 2 was not started"},
		{name: "turns_spent", script: never, budget: job.Budget{Turns: 2},
			want: job.ReasonBudgetExceeded, wantRuns: 1, detail: "budget.turns 2 spent by the first run (2)"},
		{name: "meter_stops_the_round", budget: job.Budget{USD: 0.05},
			script: `n=1; while [ -e "$MARK/prompt-$n" ]; do n=$((n+1)); done
cat > "$MARK/prompt-$n"
echo 41 > answer.txt
if [ $n -eq 1 ]; then echo "::aq-usage cost_usd=0.01"; exit 0; fi
echo "::aq-usage cost_usd=0.045"
sleep 300
`, want: job.ReasonBudgetExceeded, wantRuns: 2, wantRounds: 1, detail: "cost $0.0550 over budget $0.05 (the first run and 1 repair round)"},
		{name: "wall_across_rounds", budget: job.Budget{Wall: job.Duration(4 * time.Second)},
			script: `n=1; while [ -e "$MARK/prompt-$n" ]; do n=$((n+1)); done
cat > "$MARK/prompt-$n"
echo 41 > answer.txt
if [ $n -gt 1 ]; then sleep 300; fi
`, want: job.ReasonTimeout, wantRuns: 2, wantRounds: 1, detail: "wall budget 4s spent (the first run and 1 repair round)"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			f := newRoundsFixture(t)
			j := f.roundsJob("budget-"+strings.ReplaceAll(c.name, "_", "-"), rounds(2))
			j.Script, j.Budget = c.script, c.budget
			if j.Budget.Wall == 0 {
				j.Budget.Wall = job.Duration(2 * time.Minute)
			}
			out := f.run(context.Background(), j, runner.Options{})
			if out.Reason != c.want || !strings.Contains(out.Detail, c.detail) {
				t.Fatalf("reason %q detail %q, want %q with %q", out.Reason, out.Detail, c.want, c.detail)
			}
			if n := len(f.prompts()); n != c.wantRuns || out.Insights.RepairRounds != c.wantRounds {
				t.Errorf("%d runs and %d rounds, want %d and %d", n, out.Insights.RepairRounds, c.wantRuns, c.wantRounds)
			}
			if out.Checkpoint == "" {
				t.Error("no checkpoint")
			}
		})
	}
}

// TestRepairRoundWithAMegabyteVerify: a verify that prints megabytes hands
// the engine a bounded tail with the failure at its end; verify.log keeps
// it all.
func TestRepairRoundWithAMegabyteVerify(t *testing.T) {
	testenv.Slow(t, "runs whole jobs with real git, processes and waits")
	f := newRoundsFixture(t)
	j := f.roundsJob("loud", rounds(1))
	j.Verify = "i=0; while [ $i -lt 40000 ]; do echo \"=== RUN   TestNoise/$i ok padding padding padding\"; i=$((i+1)); done; sh check.sh"
	out := f.run(context.Background(), j, runner.Options{})
	if out.Failed() {
		t.Fatalf("%s: %s", out.Reason, out.Detail)
	}
	p := f.prompts()
	if len(p) != 2 {
		t.Fatalf("%d runs, want 2", len(p))
	}
	section := p[1][strings.Index(p[1], "--- verify output ---"):]
	section = section[:strings.Index(section, "--- end of verify output ---")]
	if len(section) > job.VerifyTailBytes+100 || !strings.Contains(section, "want 42") || !strings.Contains(p[1], "The last lines of its output") {
		t.Errorf("the prompt's verify output is %d bytes (bound %d), failure in it %v", len(section), job.VerifyTailBytes, strings.Contains(section, "want 42"))
	}
	if n := len(p[1]); n > 16<<10 {
		t.Errorf("the round's prompt is %d bytes", n)
	}
	vlog := testenv.ReadFile(t, filepath.Join(f.home.Dir, "logs", j.ID, "verify.log"))
	if len(vlog) < 2<<20 || !strings.Contains(vlog, "TestNoise/0 ok") {
		t.Errorf("verify.log is %d bytes; the whole output belongs there", len(vlog))
	}
}

// TestRepairRoundContinuesClaudesSession: with claude (a fake that keeps
// sessions as claude does), the round continues the first run's session —
// --resume <its id>, no --session-id — told only the failure; when the
// session is gone by then, the round runs fresh with the whole prompt.
func TestRepairRoundContinuesClaudesSession(t *testing.T) {
	testenv.Slow(t, "runs whole jobs with real git, processes and waits")
	for _, gone := range []bool{false, true} {
		name := map[bool]string{false: "resumed", true: "session_gone"}[gone]
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			bin, sessions, record := t.TempDir(), t.TempDir(), t.TempDir()
			testenv.FakeClaude{
				Script: `if grep -q "want 42" "$FAKE_PROMPT"; then echo 42 > answer.txt; else echo 41 > answer.txt; fi`,
				Stream: filepath.Join(testenv.ClaudeTestdata(t), "success.jsonl"), Sessions: sessions, Record: record,
			}.Write(t, bin)
			f := newRoundsFixture(t, &engines.Claude{ResultGrace: time.Minute})
			f.r.Env = append(f.r.Env, "PATH="+bin+":"+os.Getenv("PATH"), "ANTHROPIC_API_KEY=sk-ant-test-key")
			j := f.roundsJob("claude-"+name, nil)
			j.Engine, j.Script = "claude", ""
			if gone {
				j.Verify = "rm -f " + sessions + "/*; sh check.sh" // the session store is lost before the round
			}
			out := f.run(context.Background(), j, runner.Options{})
			if out.Failed() || out.Insights.RepairRounds != 1 {
				t.Fatalf("stage %s reason %q (%s), %d rounds", out.Stage, out.Reason, out.Detail, out.Insights.RepairRounds)
			}
			args := func(n int) []string {
				return strings.Split(strings.TrimSpace(testenv.ReadFile(t, filepath.Join(record, itoa(n)+".args"))), "\n")
			}
			prompt := func(n int) string { return testenv.ReadFile(t, filepath.Join(record, itoa(n)+".prompt")) }
			sid := argAfter(args(1), "--session-id")
			if sid == "" || slices.Contains(args(1), "--resume") {
				t.Fatalf("first run args %q", args(1))
			}
			if argAfter(args(2), "--resume") != sid || slices.Contains(args(2), "--session-id") {
				t.Errorf("the round's args %q, want --resume %s and no --session-id", args(2), sid)
			}
			if p := prompt(2); !strings.HasPrefix(p, "aq ran the job's verify command") || !strings.Contains(p, "want 42") || strings.Contains(p, "Do the work for") {
				t.Errorf("the resumed session was told:\n%s", p)
			}
			runs := out.Insights.Runs
			switch gone {
			case false:
				if testenv.Exists(filepath.Join(record, "3.args")) || runs[1].Session != sid {
					t.Errorf("a third claude run, or the round's session %q is not %s", runs[1].Session, sid)
				}
			case true:
				// Refused ("No conversation found"), then fresh: a new
				// session, the task and the failure.
				if argAfter(args(3), "--session-id") == "" || argAfter(args(3), "--session-id") == sid || runs[1].Session != "" {
					t.Errorf("the fresh round's args %q, run %+v", args(3), runs[1])
				}
				if p := prompt(3); !strings.Contains(p, "Do the work for") || !strings.Contains(p, "want 42") {
					t.Errorf("the fresh round was told:\n%s", p)
				}
			}
		})
	}
}

func argAfter(args []string, flag string) string {
	for i, a := range args {
		if a == flag && i+1 < len(args) {
			return args[i+1]
		}
	}
	return ""
}

// TestRetryPromptSaysHowThePreviousAttemptEnded: the first run of a later
// attempt is told how the one before ended (the caller's record), and that
// the worktree holds its checkpoint; with no record, a generic note when it
// resumes from a checkpoint; nothing on a first attempt.
func TestRetryPromptSaysHowThePreviousAttemptEnded(t *testing.T) {
	testenv.Slow(t, "runs whole jobs with real git, processes and waits")
	f := newRoundsFixture(t)
	j := f.roundsJob("retried", rounds(0))
	first := f.run(context.Background(), j, runner.Options{Attempt: 1})
	if first.Reason != job.ReasonVerifyFailed {
		t.Fatalf("first attempt: %s %s", first.Reason, first.Detail)
	}
	prev := job.PreviousOf(1, first.Reason, first.Detail, &first.Insights)
	j2 := *j
	j2.VerifyRounds = rounds(0)
	second := f.run(context.Background(), &j2, runner.Options{Attempt: 2, Previous: prev})
	if second.Failed() {
		t.Fatalf("second attempt: %s %s", second.Reason, second.Detail)
	}
	p := f.prompts()
	if len(p) != 2 {
		t.Fatalf("%d runs", len(p))
	}
	if strings.Contains(p[0], "ran before") {
		t.Errorf("the first attempt was told of an earlier one:\n%s", p[0])
	}
	for _, want := range []string{"This job ran before. Its attempt 1 ended: verify_failed", "resumes from a checkpoint of the earlier work (commit " + first.Checkpoint[:12],
		"The earlier attempt's last verify, `sh check.sh`, exited 1", "FAIL: answer.txt says '41', want 42"} {
		if !strings.Contains(p[1], want) {
			t.Errorf("the retry's prompt lacks %q:\n%s", want, p[1])
		}
	}

	// Nothing known, but a checkpoint to resume: the generic note (which
	// names no failure: this engine then writes the wrong answer again).
	f.run(context.Background(), f.roundsJob("retried", rounds(0)), runner.Options{Attempt: 3})
	if p := f.prompts(); len(p) != 3 || !strings.Contains(p[2], "This is attempt 3 of this job: an earlier attempt ran elsewhere and how it ended is not known here") {
		t.Errorf("the generic note is missing:\n%s", p[2])
	}
}

// recShipper records the pull requests it is asked to open.
type recShipper struct {
	mu   sync.Mutex
	reqs []runner.ShipRequest
}

var _ runner.Shipper = (*recShipper)(nil)

func (s *recShipper) Ready(context.Context, string) error { return nil }

func (s *recShipper) Ship(_ context.Context, req runner.ShipRequest) (string, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.reqs = append(s.reqs, req)
	return "https://example.test/pr/1", nil
}

// TestPullRequestSaysWhatTheRoundsDid: the PR description carries verify's
// account — the rounds it took, each run's session, spending and what
// verify said after it — after the engine's own description or aq's.
func TestPullRequestSaysWhatTheRoundsDid(t *testing.T) {
	testenv.Slow(t, "runs whole jobs with real git, processes and waits")
	for _, engineBody := range []bool{false, true} {
		t.Run(map[bool]string{false: "aq_body", true: "engine_body"}[engineBody], func(t *testing.T) {
			t.Parallel()
			f := newRoundsFixture(t)
			testenv.AddOrigin(t, f.repo)
			sh := &recShipper{}
			f.r.Shipper = sh
			j := f.roundsJob("pr-"+map[bool]string{false: "aq", true: "engine"}[engineBody], nil)
			j.Ship = "pr"
			if engineBody {
				j.Script += "echo 'Fixed the answer.' > .aq_pr.md\n"
			}
			out := f.run(context.Background(), j, runner.Options{})
			if out.Failed() || out.Stage != job.Review || len(sh.reqs) != 1 {
				t.Fatalf("stage %s reason %q (%s), %d PRs", out.Stage, out.Reason, out.Detail, len(sh.reqs))
			}
			body := sh.reqs[0].Body
			for _, want := range []string{"`sh check.sh` passed after 1 repair round", "| first | new | 1000/100 | $0.0100 | 2 | exited 1 |", "| repair 1 | new | 1000/100 | $0.0100 | 2 | passed |"} {
				if !strings.Contains(body, want) {
					t.Errorf("the PR description lacks %q:\n%s", want, body)
				}
			}
			if engineBody && (!strings.HasPrefix(body, "Fixed the answer.") || !strings.Contains(body, "## Verify (aq)")) {
				t.Errorf("the engine's description is not first, or aq's account not marked as aq's:\n%s", body)
			}
		})
	}
}
