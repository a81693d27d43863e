package fleet

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"go.opentelemetry.io/otel/attribute"

	"github.com/aqfleet/aq/agent/runner"
	"github.com/aqfleet/aq/internal/telemetry"
	"github.com/aqfleet/aq/job"
)

// JobLease holds a claimed job's lease while it runs: it renews it every
// interval (jittered), retries transient failures until the lease's expiry is
// near, and cancels the job's context with a job.StopError when the lease is
// gone — fenced (a 409, or 404) or lost (not renewed in time, or credentials
// refused). Confirm is a synchronous renewal, which the runner calls before
// every irreversible step (push, PR). Once fenced or lost, a lease stays so.
type JobLease struct {
	c      *Client
	jobID  string
	epoch  int64
	every  time.Duration
	clock  Clock
	rnd    func() float64
	log    *slog.Logger
	cancel context.CancelCauseFunc

	stopRenewer context.CancelFunc // set by Start
	renewer     sync.WaitGroup

	mu       sync.Mutex
	expiry   time.Time // local clock
	margin   time.Duration
	state    *job.StopError // set once fenced, lost or ended
	authErr  error
	renewals int
	failures int
	// reporting is set once the job's final report is out: a renewal the
	// coordinator refuses (409, 404) from then on raced the report that
	// ended the lease — no loss, no failure.
	reporting bool
	// turn keeps renewals off the wire while the final report is on it.
	turn *wireTurn
	// Failed, when set, is called for each renewal that failed (metrics).
	Failed func()
	// Hooks are seams for tests (nil: none).
	Hooks *LeaseHooks
}

// LeaseHooks are seams for tests, injected through JobRunner.LeaseHooks
// (never a package-level variable).
type LeaseHooks struct {
	// Renewing is called on the renewing goroutine with each renewal, right
	// before it goes on the wire.
	Renewing func(ctx context.Context)
	// ReportWaits is called when an attempt of the job's terminal report
	// waits for a renewal on the wire to end.
	ReportWaits func()
	// RenewalWaits is called when a renewal waits for another call of the
	// job's on the wire to end (a live log chunk, a report attempt).
	RenewalWaits func()
}

var _ runner.Lease = (*JobLease)(nil)

// NewJobLease starts holding cl's lease; cancel is the job context's, called
// with the StopError when the lease goes. every is the renewal cadence
// (AQ_FLEET_LEASE_RENEW_SEC); when two renewals would not fit before the
// lease counts as lost, it is shortened to a third of the lease's time to
// live.
func NewJobLease(c *Client, cl *Claim, every time.Duration, cancel context.CancelCauseFunc, clock Clock, log *slog.Logger) *JobLease {
	if clock == nil {
		clock = RealClock{}
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	l := &JobLease{c: c, jobID: cl.Job.ID, epoch: cl.LeaseEpoch, every: every, clock: clock, rnd: defaultRand, log: log, cancel: cancel}
	l.turn = newWireTurn(cl.Job.ID, cl.LeaseEpoch, func() {
		if l.Hooks != nil && l.Hooks.ReportWaits != nil {
			l.Hooks.ReportWaits()
		}
	})
	l.turn.renewalWaits = func() {
		if l.Hooks != nil && l.Hooks.RenewalWaits != nil {
			l.Hooks.RenewalWaits()
		}
	}
	exp := cl.LocalExpiry
	if exp.IsZero() {
		exp = cl.LeaseExpiresAt
	}
	l.setExpiry(exp)
	return l
}

// setExpiry records a new expiry and the margin before it at which the
// lease counts as lost: a quarter of the time to live, between 1 s and 15 s —
// time to stop the engine (the kill ladder) before another factory may take
// the job.
func (l *JobLease) setExpiry(exp time.Time) {
	now := l.clock.Now()
	if exp.IsZero() {
		exp = now.Add(90 * time.Second) // the coordinator did not say: assume its default
	}
	ttl := exp.Sub(now)
	margin := ttl / 4
	if margin < time.Second {
		margin = time.Second
	}
	if margin > 15*time.Second {
		margin = 15 * time.Second
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.expiry, l.margin = exp, margin
	// At least two renewals must fit before the lease counts as lost.
	if room := (ttl - margin) / 2; ttl > 0 && (l.every <= 0 || l.every > room) {
		if l.every > 0 {
			l.log.Warn("lease renewal interval is too long for the lease's time to live; renewing more often", "every", l.every, "ttl", ttl.Round(time.Millisecond))
		}
		// A third of the time to live, or less when the margin leaves less
		// room (a short lease): never so long that the deadline passes
		// before the first renewal is tried.
		l.every = max(min(ttl/3, room), 50*time.Millisecond)
	}
}

// Epoch is the lease's epoch.
func (l *JobLease) Epoch() int64 { return l.epoch }

// Expiry is the lease's expiry on the local clock.
func (l *JobLease) Expiry() time.Time {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.expiry
}

// Held reports, without asking the coordinator, whether this factory still
// holds the lease: not fenced, not lost, and its expiry (as last renewed) at
// least margin away on the local clock. The runner asks it before pushing a
// WIP checkpoint, which must not move while another factory may own the job.
func (l *JobLease) Held(margin time.Duration) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.state == nil && l.clock.Now().Add(margin).Before(l.expiry)
}

// Fenced reports whether the coordinator said another factory owns the job.
func (l *JobLease) Fenced() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.state != nil && l.state.Reason == job.ReasonFenced
}

// Lost reports whether the lease lapsed (not renewed in time).
func (l *JobLease) Lost() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.state != nil && l.state.Reason == job.ReasonLeaseLost
}

// AuthErr is the *AuthError a renewal saw, if any.
func (l *JobLease) AuthErr() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.authErr
}

// Renewals counts successful renewals (Confirm included).
func (l *JobLease) Renewals() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.renewals
}

// Reporting says the job's final report is about to be sent, on the context
// it returns: each attempt of the report waits for a renewal on the wire to
// end, no renewal goes out while an attempt is on it, and none at all once
// an attempt may have been taken (wireTurn) — the lease stays held while
// the coordinator refuses the report (503s, a restart), and no renewal
// follows the report that ended it. A refusal of a renewal from now on ends
// the renewer quietly (the report ended the lease).
func (l *JobLease) Reporting(ctx context.Context) context.Context {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.reporting = true
	return context.WithValue(ctx, turnKey{}, l.turn)
}

// Wire runs call, a call of the job's beside its lease (a live log chunk),
// with the wire to itself: after a renewal on it, never beside one, and
// not at all once the lease is gone (fenced, lost, ended) — false then, or
// when ctx ended first.
func (l *JobLease) Wire(ctx context.Context, call func()) bool {
	if !l.turn.beside(ctx) {
		return false
	}
	defer l.turn.besideDone()
	l.mu.Lock()
	gone := l.state != nil
	l.mu.Unlock()
	if gone {
		return false
	}
	call()
	return true
}

// Fence marks the lease fenced (a 409 seen elsewhere, e.g. on a PATCH) and
// stops the job.
func (l *JobLease) Fence(detail string) error { return l.stop(job.ReasonFenced, detail) }

// Start renews the lease every interval (see run) in a goroutine of its
// own, until End, ctx is done or the lease goes.
func (l *JobLease) Start(ctx context.Context) {
	ctx, l.stopRenewer = context.WithCancel(ctx)
	l.renewer.Go(func() { l.run(ctx) })
}

// End says the job's final report has settled: the lease is over (the
// coordinator ended it with the report, or will refuse it anyway). It stops
// the renewer and waits for it; a renewal refused after this is not taken
// as a loss (the lease is already over).
func (l *JobLease) End() {
	l.mu.Lock()
	if l.state == nil {
		l.state = &job.StopError{Reason: job.ReasonInterrupted, Detail: "the job's final report settled"}
	}
	l.mu.Unlock()
	if l.stopRenewer != nil {
		l.stopRenewer()
	}
	l.renewer.Wait()
}

func (l *JobLease) stop(reason job.Reason, detail string) error {
	l.mu.Lock()
	if l.state == nil {
		l.state = &job.StopError{Reason: reason, Detail: detail}
		l.log.Warn("lease gone: stopping the job", "reason", reason, "detail", detail)
	}
	se := l.state
	l.mu.Unlock()
	l.cancel(se)
	return se
}

// Confirm renews the lease now (runner.Lease): it returns nil when the lease
// is ours until at least one more renewal interval, else the StopError.
func (l *JobLease) Confirm(ctx context.Context) error { return l.renewUntil(ctx) }

// run renews the lease every interval until ctx is done or the lease goes.
func (l *JobLease) run(ctx context.Context) {
	for {
		l.mu.Lock()
		every := l.every
		l.mu.Unlock()
		if l.clock.Sleep(ctx, Jitter(every, 0.1, l.rnd)) != nil {
			return
		}
		if err := l.renewUntil(ctx); err != nil {
			return
		}
	}
}

// renewUntil renews, retrying failures that may pass until the lease's
// expiry is near; a renewal that fails after earlier successes is retried
// like any other, never taken as the end of the lease by itself.
func (l *JobLease) renewUntil(ctx context.Context) error {
	for attempt := 0; ; attempt++ {
		l.mu.Lock()
		st := l.state
		deadline := l.expiry.Add(-l.margin)
		l.mu.Unlock()
		if st != nil {
			return st
		}
		if ctx.Err() != nil {
			return stopCause(ctx)
		}
		if !l.clock.Now().Before(deadline) {
			return l.stop(job.ReasonLeaseLost, fmt.Sprintf("the lease could not be renewed before its expiry (%d failed renewals)", l.failed()))
		}
		if !l.turn.renewal(ctx) {
			if ctx.Err() != nil {
				return stopCause(ctx)
			}
			return &job.StopError{Reason: job.ReasonInterrupted, Detail: "the job's final report ended the lease"}
		}
		// The lease may have gone while this renewal waited for the wire (a
		// live log chunk refused 409): then it is not sent.
		l.mu.Lock()
		st = l.state
		l.mu.Unlock()
		if st != nil {
			l.turn.renewed()
			return st
		}
		cctx, cancel := context.WithDeadline(ctx, deadline)
		if l.Hooks != nil && l.Hooks.Renewing != nil {
			l.Hooks.Renewing(cctx)
		}
		le, err := l.c.Renew(cctx, l.jobID, l.epoch)
		cancel()
		l.turn.renewed()
		switch {
		case err == nil:
			l.mu.Lock()
			l.renewals++
			l.failures = 0
			l.mu.Unlock()
			l.setExpiry(le.LocalExpiry)
			telemetry.Event(ctx, telemetry.EventLeaseRenew, attribute.Int64(telemetry.AttrEpoch, l.epoch), attribute.String("aq.lease.expires_at", le.ExpiresAt.UTC().Format(time.RFC3339)))
			return nil
		case IsFenced(err), errors.Is(err, ErrGone):
			l.mu.Lock()
			raced := l.reporting
			l.mu.Unlock()
			if raced {
				l.log.Debug("lease renewal refused after the final report went out: the report ended the lease", "err", err)
				return &job.StopError{Reason: job.ReasonInterrupted, Detail: "the job's final report ended the lease"}
			}
			l.failedOnce()
			telemetry.Event(ctx, telemetry.EventLeaseRenewFailed, attribute.String(telemetry.AttrError, "fenced"))
			return l.stop(job.ReasonFenced, err.Error())
		case IsAuth(err):
			l.failedOnce()
			l.mu.Lock()
			l.authErr = err
			l.mu.Unlock()
			return l.stop(job.ReasonLeaseLost, err.Error())
		case ctx.Err() != nil:
			return stopCause(ctx)
		}
		l.mu.Lock()
		l.failures++
		l.mu.Unlock()
		l.failedOnce()
		telemetry.Event(ctx, telemetry.EventLeaseRenewFailed, attribute.String(telemetry.AttrError, errKind(err)), attribute.Int(telemetry.AttrAttemptN, attempt+1))
		l.log.Warn("lease renewal failed; retrying until the lease's expiry is near", "err", err, "deadline", deadline.Format(time.RFC3339))
		wait := min(Backoff(200*time.Millisecond, 5*time.Second, attempt, nil, l.rnd), deadline.Sub(l.clock.Now()))
		if wait > 0 && l.clock.Sleep(ctx, wait) != nil {
			return stopCause(ctx)
		}
	}
}

// errKind names a failed call for a span event: the error's kind, never
// its text (which may quote the coordinator's answer).
func errKind(err error) string {
	var te *TransientError
	switch {
	case errors.As(err, &te) && te.Status != 0:
		return fmt.Sprintf("http %d", te.Status)
	case errors.As(err, &te):
		return "network"
	case IsAuth(err):
		return "auth"
	}
	return "error"
}

func (l *JobLease) failedOnce() {
	if l.Failed != nil {
		l.Failed()
	}
}

func (l *JobLease) failed() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.failures
}

// stopCause is ctx's StopError cause, or interrupted.
func stopCause(ctx context.Context) error {
	r, d, ok := job.StopReason(ctx)
	if !ok {
		r, d = job.ReasonInterrupted, "stopped"
	}
	return &job.StopError{Reason: r, Detail: d}
}
