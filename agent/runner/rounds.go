package runner

// Repair rounds (docs/engines.md, "Repair rounds"): when the job's verify
// fails and it has rounds and budget left, the engine runs again in the
// same worktree, in the same attempt, told the command, its exit status and
// the tail of its output — continuing its own session where the engine can
// (engines.Spec.Resume), else fresh with the failure after the task. Each
// round is checkpointed, committed and verified as the first run was; the
// rounds share the attempt's budgets. And the first run of an attempt that
// follows another is told how that one ended (Options.Previous).

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/aqfleet/aq/engines"
	"github.com/aqfleet/aq/internal/telemetry"
	"github.com/aqfleet/aq/job"
)

// runCost is what one engine run spent.
type runCost struct {
	usage engines.Usage
	took  time.Duration
}

// rounds is how many repair rounds the job gets: its manifest's (or
// profile's) verify_rounds, else the factory's AQ_VERIFY_ROUNDS; none
// without a verify: command.
func (ru *run) rounds() int {
	if strings.TrimSpace(ru.j.Verify) == "" {
		return 0
	}
	n := ru.r.Cfg.VerifyRounds
	if v := ru.j.VerifyRounds; v != nil {
		n = *v
	}
	return min(max(n, 0), job.MaxVerifyRounds)
}

// retryNote is what the attempt's runs are told after the task about the
// attempt before it (job.RetryNote): the caller's record of how it ended,
// bounded and masked, and whether the worktree starts from its checkpoint.
func (ru *run) retryNote() string {
	p := ru.o.Previous.Bounded()
	if p != nil && ru.r.Redactor != nil {
		p.Detail = ru.r.Redactor.String(p.Detail)
		if p.Verify != nil {
			p.Verify.Command, p.Verify.Tail = ru.r.Redactor.String(p.Verify.Command), ru.r.Redactor.String(p.Verify.Tail)
		}
	}
	return job.RetryNote(ru.o.Attempt, p, ru.resumedFrom)
}

// budgetLeft is what the attempt's budgets leave for the next run (the
// engines that take limits as flags get these).
func (ru *run) budgetLeft() engines.Budget {
	b, s := ru.j.Budget, ru.spent
	left := engines.Budget{USD: b.USD, Tokens: b.Tokens, Turns: b.Turns}
	if b.USD > 0 {
		left.USD = max(b.USD-s.CostUSD, 0)
	}
	if b.Tokens > 0 {
		left.Tokens = max(b.Tokens-s.Tokens(), 0)
	}
	if b.Turns > 0 {
		left.Turns = max(b.Turns-s.Turns, 0)
	}
	return left
}

// repairSpec makes spec a repair round's: its number in the log header,
// the task followed by the failure as the prompt of a fresh run, and the
// failure alone for an engine that continues the session of the run before.
func (ru *run) repairSpec(spec *engines.Spec) {
	if ru.round == 0 || ru.repair == nil {
		return
	}
	n := ru.rounds()
	spec.Round, spec.Rounds = ru.round, n
	spec.Prompt = job.RepairTask(spec.Prompt, *ru.repair, ru.round, n)
	if sid := ru.last.SessionID; sid != "" {
		spec.Resume = &engines.Resume{SessionID: sid, Prompt: job.RepairPrompt(*ru.repair, ru.round, n), Usage: ru.sessionUsage}
	}
}

// recordRun adds a finished run to the attempt's spending (the least any
// run spent, the session's usage) and, for a job with a verify: command, to
// the insights' runs.
func (ru *run) recordRun(res engines.Result, err error) {
	if err != nil {
		return // it did not start: nothing spent
	}
	ru.spent = ru.spent.Plus(res.Usage)
	c := runCost{usage: res.Usage, took: ru.runTime}
	if l := ru.least; l == nil {
		ru.least = &c
	} else {
		// Each the least of its kind: what any run needed at least.
		l.usage.CostUSD = min(l.usage.CostUSD, c.usage.CostUSD)
		if c.usage.Tokens() < l.usage.Tokens() {
			l.usage.TokensIn, l.usage.TokensOut = c.usage.TokensIn, c.usage.TokensOut
		}
		l.usage.Turns = min(l.usage.Turns, c.usage.Turns)
		l.took = min(l.took, c.took)
	}
	if res.Resumed && res.SessionID == ru.last.SessionID {
		ru.sessionUsage = ru.sessionUsage.Plus(res.Usage)
	} else {
		ru.sessionUsage = res.Usage
	}
	if res.ResumeNote != "" {
		ru.log.Warn("the repair round could not continue the engine's session; it ran fresh with the task and the failure", "round", ru.round, "why", res.ResumeNote)
	}
	ru.last = res
	if strings.TrimSpace(ru.j.Verify) == "" {
		return
	}
	r := job.Run{Round: ru.round, TokensIn: res.Usage.TokensIn, TokensOut: res.Usage.TokensOut, CostUSD: res.Usage.CostUSD,
		Turns: res.Usage.Turns, EngineMS: ru.runTime.Milliseconds(), VerifyExit: -1}
	if res.Resumed {
		r.Session = res.SessionID
	}
	ru.out.Insights.Runs = append(ru.out.Insights.Runs, r)
}

// acrossRounds says, in a budget's detail, that the spending is the
// attempt's, repair rounds included.
func (ru *run) acrossRounds() string {
	if ru.round == 0 {
		return ""
	}
	return fmt.Sprintf(" (the first run and %d repair round%s)", ru.round, plural(ru.round))
}

// engineRun runs the engine once (the attempt's first run or a repair
// round), checkpoints the worktree, and judges the run.
func (ru *run) engineRun(ctx context.Context) bool {
	res, runErr := ru.runEngine(ctx)
	ru.checkpoint(ctx)
	return ru.judgeEngine(ctx, res, runErr)
}

// result commits the work on the job branch and verifies it, with repair
// rounds while verify fails and the job has rounds and budget left. It
// returns the PR description (the last one the engine wrote).
func (ru *run) result(ctx context.Context) (prBody string, ok bool) {
	for {
		cctx, cspan := ru.step(ctx, telemetry.SpanCommit)
		body, ok := ru.commitResult(cctx)
		ru.endStep(cspan, ok)
		if !ok {
			return "", false
		}
		if strings.TrimSpace(body) != "" {
			prBody = body
		}
		v, passed := ru.verify(ctx)
		if passed {
			return prBody, true
		}
		if v == nil || !ru.repairRound(ctx, *v) {
			return "", false
		}
	}
}

// repairRound starts the next repair round after verify failed with v, if
// the job has one left and the budget for it; otherwise it fails the run:
// verify_failed, or budget_exceeded when a round would pass the budget
// (job.Insights.RepairRounds says how many ran).
func (ru *run) repairRound(ctx context.Context, v job.VerifyResult) bool {
	n := ru.rounds()
	if ru.round >= n {
		ru.fail(job.ReasonVerifyFailed, ru.verifyFailed(v))
		return false
	}
	if why := ru.roundWouldPass(); why != "" {
		ru.fail(job.ReasonBudgetExceeded, ru.verifyFailed(v)+"; repair round "+fmt.Sprint(ru.round+1)+" was not started: "+why)
		return false
	}
	if ru.stopped(ctx, "before repair round "+fmt.Sprint(ru.round+1)) {
		return false
	}
	ru.round++
	ru.repair = &v
	ru.out.Insights.RepairRounds = ru.round
	ru.out.Detail = ""
	ru.log.Info("verify failed: a repair round runs the engine again with the failure in hand", "round", ru.round, "of", n,
		"verify", v.Command, "exit", v.ExitCode, "session", ru.last.SessionID)
	ru.event(RepairStarted{Round: ru.round, Of: n, Engine: ru.eng.Name(), Session: ru.last.SessionID, Verify: v})
	return ru.engineRun(ctx)
}

// roundWouldPass says why a repair round would pass the attempt's budget
// ("" when it would not): what a budget has left is less than the least any
// run of this attempt spent of it (usd, tokens, turns, the wall's engine
// time). The meter still stops a round that spends more than that.
func (ru *run) roundWouldPass() string {
	b, s, l := ru.j.Budget, ru.spent, ru.least
	if l == nil {
		l = &runCost{}
	}
	spentOf := fmt.Sprintf(" spent by the first run%s", ru.acrossRounds())
	switch {
	case b.USD > 0 && b.USD-s.CostUSD <= 0:
		return fmt.Sprintf("budget.usd $%.2f%s ($%.4f)", b.USD, spentOf, s.CostUSD)
	case b.USD > 0 && b.USD-s.CostUSD < l.usage.CostUSD:
		return fmt.Sprintf("$%.4f of budget.usd $%.2f is left, and a run of this attempt has cost at least $%.4f", b.USD-s.CostUSD, b.USD, l.usage.CostUSD)
	case b.Tokens > 0 && b.Tokens-s.Tokens() <= 0:
		return fmt.Sprintf("budget.tokens %d%s (%d)", b.Tokens, spentOf, s.Tokens())
	case b.Tokens > 0 && b.Tokens-s.Tokens() < l.usage.Tokens():
		return fmt.Sprintf("%d of budget.tokens %d are left, and a run of this attempt has used at least %d", b.Tokens-s.Tokens(), b.Tokens, l.usage.Tokens())
	case b.Turns > 0 && b.Turns-s.Turns <= 0:
		return fmt.Sprintf("budget.turns %d%s (%d)", b.Turns, spentOf, s.Turns)
	case b.Turns > 0 && b.Turns-s.Turns < l.usage.Turns:
		return fmt.Sprintf("%d of budget.turns %d are left, and a run of this attempt has taken at least %d", b.Turns-s.Turns, b.Turns, l.usage.Turns)
	}
	wall := ru.wall()
	switch left := wall - ru.engineTime; {
	case left <= 0:
		return fmt.Sprintf("the wall budget's %s of engine time%s", wall, spentOf)
	case left < l.took:
		return fmt.Sprintf("%s of the wall budget's %s of engine time is left, and a run of this attempt has taken at least %s",
			left.Round(time.Second), wall, l.took.Round(time.Second))
	}
	return ""
}

// verifyFailed is the detail of a verify that failed for good.
func (ru *run) verifyFailed(v job.VerifyResult) string {
	d := fmt.Sprintf("verify %q exited %d (see aq job logs %s)", v.Command, v.ExitCode, ru.j.ID)
	if ru.round > 0 {
		d += fmt.Sprintf(" after %d repair round%s", ru.round, plural(ru.round))
	}
	if v.ExitCode == 126 || v.ExitCode == 127 { // the shell's "cannot run" and "not found"
		d += ru.hiddenFrom(v.Command)
	}
	return d
}

// verifySummary is the PR description's account of verify and the rounds
// it took: each run's session, spending and what verify said after it.
func (ru *run) verifySummary() string {
	in := ru.out.Insights
	v := in.Verify
	if v == nil {
		return ""
	}
	var b strings.Builder
	switch {
	case in.RepairRounds == 0:
		fmt.Fprintf(&b, "`%s` passed after the engine's first run.\n", v.Command)
	default:
		fmt.Fprintf(&b, "`%s` passed after %d repair round%s: aq ran the engine again with verify's failure in hand.\n\n", v.Command, in.RepairRounds, plural(in.RepairRounds))
		b.WriteString("| run | session | tokens in/out | cost | turns | verify after it |\n|---|---|---|---|---|---|\n")
		for _, r := range in.Runs {
			name, sess, after := "first", "new", "passed"
			if r.Round > 0 {
				name = fmt.Sprintf("repair %d", r.Round)
				if r.Session != "" {
					sess = "continued"
				}
			}
			switch {
			case r.VerifyExit < 0:
				after = "not run"
			case !r.VerifyPassed:
				after = fmt.Sprintf("exited %d", r.VerifyExit)
			}
			fmt.Fprintf(&b, "| %s | %s | %d/%d | $%.4f | %d | %s |\n", name, sess, r.TokensIn, r.TokensOut, r.CostUSD, r.Turns, after)
		}
	}
	return b.String()
}

func plural(n int) string {
	if n == 1 {
		return ""
	}
	return "s"
}
