package fleet

import (
	"context"
	"fmt"
	"log/slog"
	"time"
)

// Poller is the poll path: it asks the coordinator for work with POST
// /fleet/claim, backing off while idle (with jitter, up to MaxIdle × Base).
// With Gate it first reads GET /fleet/queue-state each tick and claims only
// when the queue's version changed since the last claim (or SafetyInterval
// passed), so an idle factory makes no claim at all.
type Poller struct {
	Client *Client
	// Base is the tick at work (POLL_SECONDS); idle ticks double up to
	// MaxIdle×Base.
	Base    time.Duration
	MaxIdle int // default 8
	Gate    bool
	// SafetyInterval: with the gate, claim anyway when this long passed
	// since the last claim — in case a coordinator that lost its state
	// counted its version back up to exactly the value last seen. Any other
	// change (a decrease included) is seen at once, so this is rare and the
	// default is long: six hours; negative: never.
	SafetyInterval time.Duration
	Clock          Clock
	Log            *slog.Logger
	Rand           func() float64
	// Repos, when set, is the repo list each claim advertises instead of
	// the client's offer: a daemon leaves out the repos it is busy with.
	// With the gate, a repo that came back into the list since the last
	// claim counts as a change (a job for it may have waited meanwhile).
	Repos func() []string
	// Refresher, when set, is checked before each look: a claim offers
	// what the host has now (a repo removed a moment ago is not offered).
	Refresher *Refresher
	// Ready, when set, is asked before each claim: while it fails (this
	// host cannot write $AQ_HOME: hostfault) nothing is claimed — a job
	// taken now could only fail host_unavailable.
	Ready func() error

	idle        int
	haveVersion bool
	version     int64
	lastClaim   time.Time
	lastRepos   []string
}

// DefaultSafetyInterval is the gated path's forced claim interval.
const DefaultSafetyInterval = 6 * time.Hour

// Next blocks until it holds a claim (returned), ctx is done (ctx's error),
// or the coordinator refuses the credentials (*AuthError). Transient errors
// count as an idle tick.
func (p *Poller) Next(ctx context.Context) (*Claim, error) {
	for {
		c, err := p.Tick(ctx)
		if c != nil || IsAuth(err) {
			return c, err
		}
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		if err != nil {
			// Transient, or a refusal that a later tick may not repeat (a
			// coordinator being redeployed): log and back off.
			p.log().Warn("poll failed; backing off", "err", err)
		}
		if err := p.clock().Sleep(ctx, p.Wait()); err != nil {
			return nil, err
		}
	}
}

// Tick is one look at the queue: the gate read (when on) and, unless the
// gate says nothing changed, one claim. A nil claim and nil error mean no
// job now; the idle counter grows. A claim resets it.
func (p *Poller) Tick(ctx context.Context) (*Claim, error) {
	if p.Ready != nil {
		if err := p.Ready(); err != nil {
			p.idle++
			return nil, fmt.Errorf("not claiming: %w", err)
		}
	}
	p.Refresher.Check(ctx)
	now := p.clock().Now()
	var repos []string
	if p.Repos != nil {
		repos = p.Repos()
		if repos == nil {
			repos = []string{}
		}
	}
	// Without GET /fleet/queue-state (a coordinator older than the gate)
	// the gate is off: the plain poll with idle backoff. The client says so
	// once, when it learns it.
	gate := p.Gate && p.Client.Has(RouteQueueState)
	var qs QueueState
	if gate {
		var err error
		qs, err = p.Client.QueueState(ctx)
		switch {
		case IsRouteAbsent(err):
			gate, p.haveVersion = false, false
		case err != nil:
			if IsAuth(err) {
				return nil, err
			}
			p.idle++
			return nil, err
		}
	}
	if gate {
		safety := p.SafetyInterval
		if safety == 0 {
			safety = DefaultSafetyInterval
		}
		stale := safety > 0 && !p.lastClaim.IsZero() && now.Sub(p.lastClaim) >= safety
		if p.haveVersion && qs.Version == p.version && !stale && !reposAdded(p.lastRepos, repos) {
			p.idle++
			return nil, nil
		}
		// Remember the version read *before* the claim: a change during the
		// claim is seen on the next tick.
		p.haveVersion, p.version = true, qs.Version
	}
	p.lastClaim = now
	p.lastRepos = repos
	c, err := p.Client.ClaimRepos(ctx, false, repos)
	if err != nil {
		p.idle++
		if gate {
			p.haveVersion = false // claim again next tick
		}
		return nil, err
	}
	if c == nil {
		p.idle++
		return nil, nil
	}
	p.idle = 0
	return c, nil
}

// reposAdded reports whether cur holds a repo that prev (the list of the
// last claim) did not; nil lists (no Repos function) never differ.
func reposAdded(prev, cur []string) bool {
	if cur == nil || prev == nil {
		return false
	}
	have := make(map[string]bool, len(prev))
	for _, r := range prev {
		have[r] = true
	}
	for _, r := range cur {
		if !have[r] {
			return true
		}
	}
	return false
}

// Wait is how long to sleep after the last tick: Base at work, doubling per
// idle tick up to MaxIdle×Base, jittered ±20%.
func (p *Poller) Wait() time.Duration {
	base := p.Base
	if base <= 0 {
		base = 15 * time.Second
	}
	maxIdle := p.MaxIdle
	if maxIdle <= 0 {
		maxIdle = 8
	}
	d := base
	for i := 1; i < p.idle && d < base*time.Duration(maxIdle); i++ {
		d *= 2
	}
	if cap := base * time.Duration(maxIdle); d > cap {
		d = cap
	}
	return Jitter(d, 0.2, p.rand())
}

func (p *Poller) clock() Clock {
	if p.Clock != nil {
		return p.Clock
	}
	return RealClock{}
}

func (p *Poller) rand() func() float64 {
	if p.Rand != nil {
		return p.Rand
	}
	return defaultRand
}

func (p *Poller) log() *slog.Logger {
	if p.Log != nil {
		return p.Log
	}
	return slog.New(slog.DiscardHandler)
}
