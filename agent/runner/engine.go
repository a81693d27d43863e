package runner

// Engine: the engine's spec and environment, the run under the wall, USD
// and token budgets, and the judgement of its result.

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/aqfleet/aq/agent/holds"
	"github.com/aqfleet/aq/engines"
	"github.com/aqfleet/aq/internal/telemetry"
	"github.com/aqfleet/aq/job"
)

func (ru *run) spec() engines.Spec {
	name := ru.j.Engine
	if ru.eng != nil {
		name = ru.eng.Name()
	}
	return ru.specFor(name)
}

// specFor is the spec of the job's run on engine name, with that engine's
// environment (engineEnv).
func (ru *run) specFor(name string) engines.Spec {
	j := ru.j
	withPersona := name != "claude" // claude takes it through --append-system-prompt
	env := ru.engineEnv(name)
	var stateDir string
	if ru.jail != nil {
		stateDir = ru.jail.Policy().StateDir()
	}
	spec := engines.Spec{
		JobID:          j.ID,
		Scope:          Scope(ru.r.Cfg.Home),
		Dir:            ru.wtPath,
		Prompt:         j.Prompt(withPersona) + ru.retryNote(),
		Persona:        j.Persona,
		Model:          j.Model,
		Script:         j.Script,
		Budget:         ru.budgetLeft(),
		PermissionMode: ru.permissionMode(),
		CodexSandbox:   ru.codexSandbox(),
		LogDir:         ru.logDir,
		LogMax:         ru.r.Cfg.LogMax,
		Attempt:        ru.o.Attempt,
		Env:            env,
		Grace:          ru.r.Cfg.Grace,
		Supervisor:     ru.r.Cfg.Supervisor,
		Jail:           ru.jailed(),
		StateDir:       stateDir,
		Redactor:       ru.r.Redactor,
		Prices:         ru.r.Cfg.Prices,
		Flags:          ru.info.Flags,
	}
	ru.repairSpec(&spec)
	return spec
}

// engineEnv is engine name's environment (engines.Environ: a documented
// base, the engine's own variables, AQ_ENGINE_ENV); "" is a job's verify
// command's. With AQ_CLAUDE_TELEMETRY, claude also gets the OTLP exporter's
// settings (never its headers: aq's secrets) and the switches that turn its
// export on.
func (ru *run) engineEnv(name string) []string {
	pass := ru.r.Cfg.EngineEnv
	telem := ru.r.Cfg.ClaudeTelemetry && name == "claude"
	if telem {
		for _, kv := range ru.r.env() {
			if k, _, _ := strings.Cut(kv, "="); strings.HasPrefix(k, "OTEL_") {
				pass = append(append([]string{}, pass...), k)
			}
		}
	}
	// The sandbox's own (the job's HOME and TMPDIR, its proxy) go over
	// the base.
	env := ru.sandboxEnv(engines.Environ(ru.r.env(), name, pass))
	if telem {
		env = telemetry.ClaudeEnv(env, ru.j.ID)
	}
	return env
}

func (r *Runner) env() []string {
	if r.Env != nil {
		return r.Env
	}
	return os.Environ()
}

// wall is the job's wall budget, which bounds the attempt's engine time
// (across its repair rounds) and each verify.
func (ru *run) wall() time.Duration {
	if w := ru.j.Budget.Wall.D(); w > 0 {
		return w
	}
	return job.DefaultWall
}

// runEngine runs the engine under the wall, USD and token budgets, in the
// engine's span: the engine gets its trace context (TRACEPARENT), and the
// span ends when the engine is gone, with its usage.
func (ru *run) runEngine(ctx context.Context) (res engines.Result, err error) {
	// Periodic checkpoints are the job's steps, beside the engine's span.
	jobSpan := trace.SpanFromContext(ctx)
	ctx, span := ru.step(ctx, telemetry.SpanEngine, attribute.String(telemetry.AttrEngine, ru.eng.Name()))
	defer func() { ru.endEngineSpan(span, res, err) }()
	j, wall := ru.j, ru.wall()
	runCtx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	// The wall budget bounds the attempt's engine time: a repair round gets
	// what the runs before it left.
	spentWall := "wall budget " + wall.String() + " spent"
	if ru.round > 0 {
		spentWall += fmt.Sprintf(" (the first run and %d repair round%s)", ru.round, plural(ru.round))
	}
	runCtx, cancelT := context.WithTimeoutCause(runCtx, wall-ru.engineTime, job.Stop(job.ReasonTimeout, spentWall))
	defer cancelT()

	spec := ru.spec()
	spec.Env = telemetry.EngineEnv(ctx, spec.Env)
	var (
		mu   sync.Mutex
		last engines.Usage
	)
	// The meter holds the attempt's budgets: what this run spent on top of
	// the runs before it.
	prior := ru.spent
	spec.Meter = engines.MeterFunc(func(u engines.Usage) {
		mu.Lock()
		last = u
		mu.Unlock()
		total := prior.Plus(u)
		ru.event(Progress{Engine: ru.eng.Name(), Usage: total})
		if j.Budget.USD > 0 && total.CostUSD > j.Budget.USD {
			cancel(job.Stop(job.ReasonBudgetExceeded, fmt.Sprintf("cost $%.4f over budget $%.2f%s", total.CostUSD, j.Budget.USD, ru.acrossRounds())))
		}
		if j.Budget.Tokens > 0 && total.Tokens() > j.Budget.Tokens {
			cancel(job.Stop(job.ReasonBudgetExceeded, fmt.Sprintf("%d tokens over budget %d%s", total.Tokens(), j.Budget.Tokens, ru.acrossRounds())))
		}
	})
	ru.log.Info("engine starting", "engine", ru.eng.Name(), "version", ru.info.Version, "attempt", ru.o.Attempt, "round", ru.round, "worktree", ru.wtPath, "sandbox", ru.sandboxLevel())
	stopPeriodic := ru.startPeriodic(trace.ContextWithSpan(runCtx, jobSpan))
	stopDisk := ru.startDiskWatch(runCtx, cancel)
	started := time.Now()
	res, err = ru.eng.Run(runCtx, spec)
	ru.runTime = time.Since(started)
	ru.engineTime += ru.runTime
	stopDisk()
	stopPeriodic()
	ru.clearRefLocks()
	for _, ref := range res.Refused {
		ru.untrusted(ref)
	}
	ru.removeSpecialFiles()
	ru.afterSandboxed()
	mu.Lock()
	if res.Usage == (engines.Usage{}) {
		res.Usage = last
	}
	mu.Unlock()
	// The run's own stop cause (timeout, budget) wins over the parent's.
	if runCtx.Err() != nil && res.Outcome != engines.Succeeded {
		if reason, detail, ok := job.StopReason(runCtx); ok {
			ru.fail(reason, detail)
		}
	}
	return res, err
}

// endEngineSpan ends the engine's span with its usage; a run that did not
// succeed (an error, an outcome other than success, a budget or a stop) is
// an error span.
func (ru *run) endEngineSpan(span trace.Span, res engines.Result, err error) {
	if !span.IsRecording() {
		span.End()
		return
	}
	in := job.Insights{Engine: ru.eng.Name(), EngineVersion: firstNonEmpty(res.Version, ru.info.Version), Model: firstNonEmpty(res.Model, ru.j.Model),
		TokensIn: res.Usage.TokensIn, TokensOut: res.Usage.TokensOut, TokensCached: res.Usage.TokensCached, CostUSD: res.Usage.CostUSD, Turns: res.Usage.Turns}
	span.SetAttributes(telemetry.EngineAttrs(in)...)
	span.SetAttributes(attribute.Int("aq.engine.exit_code", res.ExitCode), attribute.String("aq.engine.result", outcomeName(res.Outcome)))
	switch {
	case ru.out.Reason != "":
		span.SetAttributes(attribute.String(telemetry.AttrReason, string(ru.out.Reason)))
		span.SetStatus(codes.Error, string(ru.out.Reason))
	case err != nil:
		span.SetStatus(codes.Error, "the engine did not run")
	case res.Outcome != engines.Succeeded:
		span.SetStatus(codes.Error, outcomeName(res.Outcome))
	}
	span.End()
}

func outcomeName(o engines.Outcome) string {
	if o == "" {
		return "none"
	}
	return string(o)
}

// limited parks a run its engine's account stopped, until the limit resets
// (job.ParkUntil: the engine's reset time, or a default), and holds the
// engine until then so that no other job is started on it. The work is
// already checkpointed.
func (ru *run) limited(res engines.Result) {
	lim := res.Limit
	if lim == nil {
		lim = &engines.Limit{Kind: engines.LimitRate}
	}
	name := ru.eng.Name()
	until, note := job.ParkUntil(ru.r.now(), lim.ResetAt)
	detail := firstNonEmpty(res.Detail, name+" "+lim.Kind)
	for _, n := range []string{lim.Note, note} {
		if n != "" {
			detail += " (" + n + ")"
		}
	}
	if err := ru.r.Holds.Hold(holds.Hold{Engine: name, Until: until, Why: lim.Kind, Job: ru.j.ID}); err != nil {
		ru.log.Warn("cannot hold the engine; other jobs may meet the same limit", "engine", name, "err", err)
	}
	ru.park(name+" "+lim.Kind, until, detail)
}

// judgeEngine records the engine's result and decides whether to go on.
// The usage in the insights is the attempt's: every run's summed.
func (ru *run) judgeEngine(ctx context.Context, res engines.Result, err error) bool {
	ru.recordRun(res, err)
	in := &ru.out.Insights
	in.Engine = ru.eng.Name()
	if res.Version != "" {
		in.EngineVersion = res.Version
	}
	in.Model = firstNonEmpty(res.Model, ru.j.Model)
	in.SessionID, in.Subtype = firstNonEmpty(res.SessionID, in.SessionID), res.Subtype
	u := ru.spent
	in.TokensIn, in.TokensOut, in.TokensCached = u.TokensIn, u.TokensOut, u.TokensCached
	in.CostUSD, in.CostEstimated, in.Turns = u.CostUSD, u.Estimated, u.Turns
	in.ExitCode = res.ExitCode

	if ru.out.Reason != "" { // stopped by its own budget
		return false
	}
	if ru.sandboxFailure("the engine", err, res.Process.OOM && res.Outcome != engines.Succeeded) {
		return false
	}
	if err != nil {
		var ue *engines.UnavailableError
		switch {
		case errors.Is(err, engines.ErrNotInstalled):
			ru.fail(job.ReasonNoEngine, err.Error()+ru.hiddenFrom(ru.j.Script))
		case ru.stopped(ctx, "engine"):
		case errors.As(err, &ue): // its --help changed under aq: a flag it needs is gone
			ru.fail(job.ReasonEngineUnavailable, err.Error())
		default:
			ru.fail(job.ReasonCrash, "engine did not run: "+err.Error())
		}
		return false
	}
	if ru.stopped(ctx, "engine running") {
		return false
	}
	switch res.Outcome {
	case engines.Succeeded:
		ru.log.Info("engine finished", "engine", in.Engine, "turns", in.Turns, "cost_usd", in.CostUSD)
		ru.noOutcome = res.NoStructuredOutcome
		return true
	case engines.Unavailable:
		ru.fail(job.ReasonEngineUnavailable, firstNonEmpty(res.Detail, "the engine is unavailable"))
		if r := res.EgressRefused; r != nil {
			ru.engineRefused(job.EgressRefusal{Host: r.Host, Port: r.Port, Count: 1, Why: r.Why})
		}
		if res.NoProgress {
			if _, gw := engines.Endpoint(ru.eng.Name(), ru.r.env()); gw {
				ru.holdUnreachable(res.Detail)
			}
		}
	case engines.Limited:
		ru.limited(res)
	case engines.Stopped:
		if res.BudgetExceeded { // the engine stopped itself at the budget aq gave it
			ru.fail(job.ReasonBudgetExceeded, firstNonEmpty(res.Detail, "the engine stopped at its budget"))
			break
		}
		ru.fail(job.ReasonCrash, firstNonEmpty(res.Detail, "the engine was stopped"))
	default:
		ru.fail(job.ReasonEngineFailed, firstNonEmpty(res.Detail, "the engine did not finish the task"))
	}
	return false
}
