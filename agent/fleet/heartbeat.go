package fleet

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"time"
)

// Heartbeater tells the coordinator this factory is alive, every Interval
// (jittered ±10%), with what it offers and the jobs it runs. A 401/403 stops
// it with the *AuthError; any other failure is retried with backoff (and
// shows in LastOK, for /healthz).
type Heartbeater struct {
	Client    *Client
	Interval  time.Duration
	Running   *Running
	SeatLimit int
	Version   string
	// Pool is the pool this factory is a replica of (AQ_FACTORY_POOL),
	// advertised in every heartbeat.
	Pool  string
	Clock Clock
	Log   *slog.Logger
	Rand  func() float64
	// Refresher, when set, is checked before each beat: the beat carries
	// what the host offers now (a new clone, a removed repo).
	Refresher *Refresher

	mu       sync.Mutex
	lastOK   time.Time
	failures int
	kickMu   sync.Mutex
	kick     chan struct{}
}

// Kick asks Run for a beat now (the offer changed).
func (h *Heartbeater) Kick() {
	select {
	case h.kickChan() <- struct{}{}:
	default:
	}
}

func (h *Heartbeater) kickChan() chan struct{} {
	h.kickMu.Lock()
	defer h.kickMu.Unlock()
	if h.kick == nil {
		h.kick = make(chan struct{}, 1)
	}
	return h.kick
}

// Beat sends one heartbeat.
func (h *Heartbeater) Beat(ctx context.Context) error {
	h.Refresher.Check(ctx)
	caps, repos := h.Client.Offer()
	seats := h.SeatLimit
	if seats <= 0 {
		seats = 1
	}
	running := []RunningJob{}
	if h.Running != nil {
		running = h.Running.List()
	}
	h.mu.Lock()
	health := "ok"
	if h.failures > 0 {
		health = "degraded"
	}
	h.mu.Unlock()
	err := h.Client.Heartbeat(ctx, HeartbeatRequest{
		FactoryID: h.Client.FactoryID(), Capabilities: caps, Repos: repos,
		Load: float64(len(running)) / float64(seats), SeatLimit: seats,
		Health: health, Running: running, Version: h.Version, Pool: h.Pool,
	})
	h.mu.Lock()
	defer h.mu.Unlock()
	if err != nil {
		h.failures++
		return err
	}
	h.failures = 0
	h.lastOK = h.clock().Now()
	return nil
}

// Offline sends the last heartbeat of a factory that leaves cleanly:
// health "offline", nothing running, no load.
func (h *Heartbeater) Offline(ctx context.Context) error {
	caps, repos := h.Client.Offer()
	return h.Client.Heartbeat(ctx, HeartbeatRequest{
		FactoryID: h.Client.FactoryID(), Capabilities: caps, Repos: repos,
		SeatLimit: max(h.SeatLimit, 1), Health: "offline", Running: []RunningJob{}, Version: h.Version, Pool: h.Pool,
	})
}

// LastOK is when a heartbeat last succeeded (zero: never).
func (h *Heartbeater) LastOK() time.Time {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.lastOK
}

// Healthy reports whether the last good heartbeat is younger than twice the
// interval (the /healthz rule of docs/daemon.md, "Health and metrics").
func (h *Heartbeater) Healthy(now time.Time) bool {
	last := h.LastOK()
	return !last.IsZero() && now.Sub(last) < 2*h.Interval
}

// Run beats until ctx is done (nil) or the coordinator refuses the
// credentials (the *AuthError). The first beat is sent at once, unless one
// succeeded less than an interval ago (Start's).
func (h *Heartbeater) Run(ctx context.Context) error {
	fails := 0
	if last := h.LastOK(); !last.IsZero() {
		if wait := h.Interval - h.clock().Now().Sub(last); wait > 0 && h.clock().Sleep(ctx, Jitter(wait, 0.1, h.rand())) != nil {
			return nil
		}
	}
	for {
		err := h.Beat(ctx)
		var ae *AuthError
		switch {
		case errors.As(err, &ae):
			h.log().Error("heartbeat refused: stopping fleet work", "err", err)
			return err
		case ctx.Err() != nil:
			return nil
		case err != nil:
			fails++
			h.log().Warn("heartbeat failed; retrying", "err", err, "failures", fails)
		default:
			fails = 0
		}
		wait := Jitter(h.Interval, 0.1, h.rand())
		if fails > 0 {
			// Retry sooner than the cadence, backing off up to it.
			wait = min(Backoff(time.Second, h.Interval, fails-1, nil, h.rand()), wait)
		}
		if h.sleep(ctx, wait) != nil {
			return nil
		}
	}
}

// sleep waits d, or until Kick (nil); an error when ctx is done, or the
// clock's own (a simulation's end).
func (h *Heartbeater) sleep(ctx context.Context, d time.Duration) error {
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	kick := h.kickChan()
	kicked := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		select {
		case <-kick:
			close(kicked)
			cancel()
		case <-sctx.Done():
		}
	}()
	err := h.clock().Sleep(sctx, d)
	cancel()
	<-done
	select {
	case <-kicked:
		return ctx.Err()
	default:
		return err
	}
}

func (h *Heartbeater) clock() Clock {
	if h.Clock != nil {
		return h.Clock
	}
	return RealClock{}
}

func (h *Heartbeater) rand() func() float64 {
	if h.Rand != nil {
		return h.Rand
	}
	return defaultRand
}

func (h *Heartbeater) log() *slog.Logger {
	if h.Log != nil {
		return h.Log
	}
	return slog.New(slog.DiscardHandler)
}
