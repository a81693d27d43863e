package selftest

import (
	"context"
	"errors"
	"fmt"
	"runtime/debug"
	"time"
)

// A scenario is a sequence of checks that share a set-up (a workspace, a
// coordinator stub, a peer): each step is a named check, later steps may
// depend on earlier ones. Scenarios run concurrently; the steps of one run in
// order.
type scenario struct {
	name   string
	group  Group
	checks []Check
	// workspace: the scenario needs the pipeline's temp dir.
	workspace bool
	// last: run after every other scenario is done (the clean-up checks).
	last bool
	run  func(ctx context.Context, s *session)
}

// scenarios is every scenario, in catalog order.
func scenarios() []*scenario {
	var out []*scenario
	out = append(out, hostScenarios()...)
	out = append(out, pipelineScenarios()...)
	out = append(out, cliScenarios()...)
	return out
}

// check declares a check of group g.
func check(g Group, name, desc string) Check { return Check{Name: name, Group: g, Description: desc} }

// single is a scenario of one check.
func single(g Group, name, desc string, timeout time.Duration, fn func(ctx context.Context, s *session) (string, error)) *scenario {
	return &scenario{name: name, group: g, checks: []Check{check(g, name, desc)}, run: func(ctx context.Context, s *session) {
		s.step(ctx, name, timeout, func(ctx context.Context) (string, error) { return fn(ctx, s) })
	}}
}

// session is one run of a scenario.
type session struct {
	sc  *scenario
	rec *recorder
	h   *hostEnv
	ws  *workspace
	// stop is the step that ended the scenario early: a failure, a skip
	// the rest depends on, or a hang.
	stop *Result
	hung bool
}

// skipError makes a step end as skipped.
type skipError struct{ reason string }

func (e *skipError) Error() string { return e.reason }

// skipf ends a step as skipped, with a reason.
func skipf(format string, args ...any) error { return &skipError{reason: fmt.Sprintf(format, args...)} }

// failf is a step failure with a formatted reason.
func failf(format string, args ...any) error { return fmt.Errorf(format, args...) }

// hungGrace is how long a step whose deadline passed may take to return
// (its processes are being stopped by the kill ladder) before it is
// reported hung and abandoned.
const hungGrace = 5 * time.Second

// step runs the declared check name under its own deadline and records its
// result. It reports whether the check passed; a scenario stops at false
// when its later checks depend on this one. A step is not run when an
// earlier one hung, or when no selected check is left in the scenario.
func (s *session) step(ctx context.Context, name string, timeout time.Duration, fn func(ctx context.Context) (string, error)) bool {
	if s.hung || !s.pending() {
		return false
	}
	declared := false
	for _, c := range s.sc.checks {
		declared = declared || c.Name == name
	}
	if !declared {
		s.record(Result{Name: name, Status: Fail, Reason: "internal error: check " + name + " is not declared in scenario " + s.sc.name})
		return false
	}
	if ctx.Err() != nil {
		res := Result{Name: name, Status: Fail, Reason: "not run: " + stoppedWhy(ctx)}
		s.record(res)
		s.stop = &res
		return false
	}
	sctx, cancel := context.WithTimeoutCause(ctx, timeout, fmt.Errorf("the check's deadline (%s) passed", timeout))
	defer cancel()
	type outcome struct {
		reason string
		err    error
	}
	done := make(chan outcome, 1)
	start := time.Now()
	go func() {
		defer func() {
			if p := recover(); p != nil {
				done <- outcome{err: fmt.Errorf("internal error: panic: %v (%s)", p, firstFrames(debug.Stack()))}
			}
		}()
		r, err := fn(sctx)
		done <- outcome{r, err}
	}()
	var out outcome
	select {
	case out = <-done:
	case <-sctx.Done():
		grace := hungGrace
		if s.rec.o.hungGrace > 0 {
			grace = s.rec.o.hungGrace
		}
		t := time.NewTimer(grace)
		select {
		case out = <-done:
			t.Stop()
		case <-t.C:
			res := Result{Name: name, Status: Fail, Duration: time.Since(start),
				Reason: fmt.Sprintf("hung: did not finish within %s (its processes were stopped; the scenario's later checks are not run)", timeout)}
			s.record(res)
			s.stop, s.hung = &res, true
			return false
		}
	}
	res := Result{Name: name, Duration: time.Since(start)}
	var se *skipError
	switch {
	case out.err == nil:
		res.Status, res.Reason = Pass, out.reason
		if res.Reason == "" {
			res.Reason = "ok"
		}
	case errors.As(out.err, &se):
		res.Status, res.Reason = Skip, se.reason
	default:
		res.Status, res.Reason = Fail, out.err.Error()
		if sctx.Err() != nil && ctx.Err() == nil {
			res.Reason = fmt.Sprintf("timed out after %s: %s", timeout, res.Reason)
		}
	}
	s.record(res)
	if res.Status != Pass {
		s.stop = &res
	}
	return res.Status == Pass
}

func (s *session) record(r Result) { s.rec.add(r) }

// setupFailed ends the scenario before its first check: each check it
// declares fails, "not run: set-up: " and why.
func (s *session) setupFailed(err error) {
	s.stop = &Result{Status: Fail, Reason: "set-up: " + err.Error()}
}

// pending reports whether a selected check of the scenario has no result yet.
func (s *session) pending() bool {
	for _, c := range s.sc.checks {
		if s.rec.wanted(c.Name) && !s.rec.reported(c.Name) {
			return true
		}
	}
	return false
}

// runScenario runs sc and then gives every selected check it did not reach
// a result that says why.
func runScenario(ctx context.Context, sc *scenario, rec *recorder, h *hostEnv, ws *workspace) {
	s := &session{sc: sc, rec: rec, h: h, ws: ws}
	func() {
		defer func() {
			if p := recover(); p != nil {
				res := Result{Name: sc.checks[0].Name, Status: Fail, Reason: fmt.Sprintf("internal error: panic in scenario %s: %v (%s)", sc.name, p, firstFrames(debug.Stack()))}
				s.stop = &res
			}
		}()
		if sc.workspace && ws == nil {
			res := Result{Status: Fail, Reason: "no workspace"}
			s.stop = &res
			return
		}
		sc.run(ctx, s)
	}()
	for _, c := range sc.checks {
		if !rec.wanted(c.Name) || rec.reported(c.Name) {
			continue
		}
		res := Result{Name: c.Name, Status: Fail}
		switch {
		case s.stop != nil && s.stop.Name == "":
			res.Reason = "not run: " + s.stop.Reason
		case s.stop != nil && s.stop.Status == Skip:
			res.Status, res.Reason = Skip, s.stop.Reason
		case s.stop != nil && s.stop.Name == c.Name:
			res.Reason = s.stop.Reason
		case s.stop != nil:
			res.Reason = fmt.Sprintf("not run: %s failed first (%s)", s.stop.Name, s.stop.Reason)
		case ctx.Err() != nil:
			res.Reason = "not run: " + stoppedWhy(ctx)
		default:
			res.Reason = "internal error: scenario " + sc.name + " ended without running this check"
		}
		rec.add(res)
	}
}

// stoppedWhy says why the run's context ended.
func stoppedWhy(ctx context.Context) string {
	if errors.Is(ctx.Err(), context.DeadlineExceeded) {
		return "the selftest's overall deadline passed"
	}
	return "the selftest was interrupted"
}

// firstFrames is a short excerpt of a stack for an internal error's reason.
func firstFrames(stack []byte) string {
	s := string(stack)
	if len(s) > 300 {
		s = s[:300]
	}
	return s
}
