package dispatch

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"time"

	"github.com/aqfleet/aq/internal/logging"
)

// The paths a Source takes work from, as Live reports them (and the daemon's
// status, metrics and logs show them).
const (
	LiveBroker = "broker" // targeted messages from this factory's subscription
	LivePoll   = "poll"   // POST /fleet/claim (gated by GET /fleet/queue-state when configured)
	LiveNone   = "none"   // not started, waiting for the broker's first word, or stopped
)

// Poll is the poll path as the Source drives it: one look at the queue per
// Tick, and the wait before the next. The fleet Poller implements it (through
// a small adapter in the daemon, which turns a claim into an Accepted).
type Poll interface {
	// Tick looks once (the gate read, when on, and at most one claim). ok
	// means the factory now holds the returned job's lease.
	Tick(ctx context.Context) (job Accepted, ok bool, err error)
	// Wait is how long to wait after the last Tick (idle backoff, jitter).
	Wait() time.Duration
}

// SourceOptions configure a Source.
type SourceOptions struct {
	// Broker, when set, makes the broker the primary path: a Receiver is
	// built from it (its Handler and Slots are the Source's; its OnHealth is
	// called after the Source's own). Nil: poll only.
	Broker *Options
	// Poll is the fallback path (required).
	Poll Poll
	// Handler runs a job from either path, holding one slot until it
	// returns (required). Its context is not cancelled when the Source
	// stops: the caller cancels jobs through its own context.
	Handler Handler
	// Slots are the daemon's job slots, shared by both paths (required).
	Slots Slots
	// ConnectGrace is how long the poll path waits, at start, for the
	// broker's first health report before it takes over (default 10s).
	ConnectGrace time.Duration
	// Fatal says which poll errors end the Source (credentials refused);
	// any other poll error is an idle tick.
	Fatal func(error) bool
	// OnSwitch is called on every change of the live path, with why (the
	// broker's error when polling takes over). Keep it quick.
	OnSwitch func(live string, why error)
	Logger   *slog.Logger
}

// Source is the factory's dispatch source with hand-off (docs/servicebus.md, "Hand-off with the poll path"): the
// broker is the primary path while its link is healthy; the moment it is
// not, the poll path takes over, and when the receiver (which reconnects on
// its own, with capped exponential backoff and jitter) reports the link
// healthy again, the poll path stops — so while the broker path is healthy
// and idle the factory makes no claim and no queue-state read at all. Both
// paths take a slot before they take work: the factory never holds more
// jobs (or messages) than it has free slots.
//
// A poll tick in flight when the broker comes back is let finish (a claim
// whose answer is thrown away would strand its job until the lease expires);
// the poll path then gives its slot back at once.
type Source struct {
	o    SourceOptions
	recv *Receiver
	log  *slog.Logger

	mu    sync.Mutex
	live  string
	heard bool // the broker has reported its health at least once
	// off is why the broker path was turned off for good (OffBroker);
	// stopRecv ends the receiver.
	off      error
	stopRecv context.CancelFunc
	changed  chan struct{} // closed and replaced on every change of live or heard
	ticks    int64

	jobs sync.WaitGroup // poll-path Handlers
}

// NewSource checks o and builds the Source (and its Receiver). It dials
// nothing.
func NewSource(o SourceOptions) (*Source, error) {
	if o.Poll == nil || o.Handler == nil || o.Slots == nil {
		return nil, errors.New("dispatch: Source needs Poll, Handler and Slots")
	}
	if o.ConnectGrace <= 0 {
		o.ConnectGrace = 10 * time.Second
	}
	if o.Fatal == nil {
		o.Fatal = func(error) bool { return false }
	}
	s := &Source{o: o, log: o.Logger, live: LiveNone, changed: make(chan struct{})}
	if s.log == nil {
		s.log = logging.Discard()
	}
	s.log = s.log.With("component", "dispatch")
	if o.Broker != nil {
		ro := *o.Broker
		user := ro.OnHealth
		ro.OnHealth = func(h Health) {
			// The owner hears first: a report that stops it (a replica
			// whose subscription does not exist) must do so before the
			// poll path takes over and claims.
			if user != nil {
				user(h)
			}
			s.brokerHealth(h)
		}
		ro.Handler, ro.Slots = o.Handler, o.Slots
		if ro.Logger == nil {
			ro.Logger = o.Logger
		}
		r, err := New(ro)
		if err != nil {
			return nil, err
		}
		s.recv = r
	}
	return s, nil
}

// Receiver is the broker receiver (nil when poll only).
func (s *Source) Receiver() *Receiver { return s.recv }

// Live is the path work comes from now: LiveBroker, LivePoll or LiveNone.
func (s *Source) Live() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.live
}

// PollTicks counts the poll path's looks at the queue since start.
func (s *Source) PollTicks() int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.ticks
}

// state returns live, whether the broker was heard from, and the channel
// that is closed at the next change.
func (s *Source) state() (string, bool, <-chan struct{}) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.live, s.heard, s.changed
}

func (s *Source) set(live string, heard bool, why error) {
	s.mu.Lock()
	old := s.live
	if old == live && s.heard == heard {
		s.mu.Unlock()
		return
	}
	s.live, s.heard = live, heard
	close(s.changed)
	s.changed = make(chan struct{})
	s.mu.Unlock()
	if old == live {
		return
	}
	switch live {
	case LiveBroker:
		s.log.Info("dispatch source: broker (polling stops)", "from", old)
	case LivePoll:
		s.log.Warn("dispatch source: poll", "from", old, "why", errString(why))
	}
	if s.o.OnSwitch != nil {
		s.o.OnSwitch(live, why)
	}
}

// OffBroker turns the broker path off for the rest of Run: the receiver is
// stopped (a message it holds unsettled is redelivered, then dead-lettered
// at the broker's max delivery count) and the poll path takes work. The
// daemon calls it when the coordinator turns out to have no POST
// /fleet/accept, so no delivered message could ever be accepted. Safe to
// call at any time, more than once; without a broker it does nothing.
func (s *Source) OffBroker(why error) {
	if s.recv == nil {
		return
	}
	s.mu.Lock()
	first := s.off == nil
	if first {
		s.off = why
	}
	stop := s.stopRecv
	s.mu.Unlock()
	if !first {
		return
	}
	s.log.Warn("dispatch source: the broker path is off for good; polling", "why", errString(why))
	if stop != nil {
		stop()
	}
	s.set(LivePoll, true, why)
}

// brokerHealth is the receiver's health report.
func (s *Source) brokerHealth(h Health) {
	if errors.Is(h.Err, ErrStopped) {
		return // Run is ending; stop() says so
	}
	s.mu.Lock()
	off := s.off != nil
	s.mu.Unlock()
	if off {
		return // OffBroker: the poll path stays
	}
	if h.Healthy {
		s.set(LiveBroker, true, nil)
		return
	}
	s.set(LivePoll, true, h.Err)
}

func (s *Source) isOff() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.off != nil
}

// errNoWord is why polling takes over when the broker never reported.
var errNoWord = errors.New("the broker gave no sign of life at start-up")

// Run takes work until ctx is done (a drain: no new work), then waits for the
// receiver to close and for every running Handler to return. It returns an
// error when the broker cannot be used at all (a configuration error) or the
// poll path met a Fatal error; then the other path is stopped too (running
// Handlers are still waited for).
func (s *Source) Run(ctx context.Context) error {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	var wg sync.WaitGroup
	errs := make(chan error, 2)
	if s.recv != nil {
		rctx, stop := context.WithCancel(ctx)
		defer stop()
		s.mu.Lock()
		s.stopRecv = stop
		if s.off != nil {
			stop() // turned off before Run
		}
		s.mu.Unlock()
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := s.recv.Run(rctx); err != nil && ctx.Err() == nil && !s.isOff() {
				errs <- err
				cancel(err)
			}
		}()
	} else {
		s.set(LivePoll, true, errors.New("no broker configured"))
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		if err := s.pollLoop(ctx); err != nil {
			errs <- err
			cancel(err)
		}
	}()
	wg.Wait()
	s.jobs.Wait()
	_, heard, _ := s.state()
	s.set(LiveNone, heard, nil)
	close(errs)
	return <-errs // the first error, or nil
}

// pollLoop is the poll path: it runs only while the broker is not live.
func (s *Source) pollLoop(ctx context.Context) error {
	grace := time.NewTimer(s.o.ConnectGrace)
	defer grace.Stop()
	for {
		live, heard, changed := s.state()
		if ctx.Err() != nil {
			return nil
		}
		if live != LivePoll {
			if s.recv != nil && !heard {
				// Start-up: give the broker a moment to say it is there.
				select {
				case <-ctx.Done():
					return nil
				case <-changed:
				case <-grace.C:
					s.set(LivePoll, false, errNoWord)
				}
				continue
			}
			select {
			case <-ctx.Done():
				return nil
			case <-changed:
			}
			continue
		}
		if err := s.pollWithSlot(ctx, changed); err != nil {
			return err
		}
	}
}

// pollWithSlot takes a slot (giving up when the live path changes), then
// ticks until it holds a job, the broker takes over, or ctx is done.
func (s *Source) pollWithSlot(ctx context.Context, changed <-chan struct{}) error {
	if err := s.acquire(ctx, changed); err != nil {
		return nil // stopping, or the broker is back
	}
	for {
		s.mu.Lock()
		s.ticks++
		s.mu.Unlock()
		// Neither the broker coming back nor a stop cancels a tick in
		// flight (its calls have their own short budgets): a claim whose
		// answer were thrown away would strand its job until the lease
		// expires. A job claimed as the Source stops is still handed over;
		// the Handler decides what to do with it (the daemon gives it back).
		a, ok, err := s.o.Poll.Tick(context.WithoutCancel(ctx))
		switch {
		case ok:
			s.jobs.Add(1)
			go func() {
				defer s.jobs.Done()
				defer s.o.Slots.Release()
				s.o.Handler(context.WithoutCancel(ctx), a)
			}()
			return nil
		case err != nil && s.o.Fatal(err):
			s.o.Slots.Release()
			return err
		case err != nil && ctx.Err() == nil:
			s.log.Warn("poll failed; backing off", "err", err)
		}
		t := time.NewTimer(s.o.Poll.Wait())
		select {
		case <-ctx.Done():
			t.Stop()
			s.o.Slots.Release()
			return nil
		case <-changed:
			t.Stop()
			s.o.Slots.Release()
			return nil
		case <-t.C:
		}
	}
}

// acquire takes a slot, or fails when ctx is done or the live path changes
// (a slot taken just as it changed is given back).
func (s *Source) acquire(ctx context.Context, changed <-chan struct{}) error {
	actx, cancel := context.WithCancel(ctx)
	exited := make(chan struct{})
	go func() {
		defer close(exited)
		select {
		case <-changed:
			cancel()
		case <-actx.Done():
		}
	}()
	err := s.o.Slots.Acquire(actx)
	cancel()
	<-exited
	if err != nil {
		return err
	}
	select {
	case <-changed:
		s.o.Slots.Release()
		return errors.New("the live path changed")
	default:
		return nil
	}
}
