package dispatch

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"
	"github.com/Azure/go-amqp"

	"github.com/aqfleet/aq/internal/aqerr"
	"github.com/aqfleet/aq/internal/brief"
)

// Sessions keyed by repo (AQ_SB_SESSIONS=1; docs/servicebus.md, "Sessions";
// the background is the coordinator team's "Fleet dispatch redesign" on one repo's jobs). The dispatcher sets SessionId = repo on every message and
// the subscription requires sessions; the broker then hands each repo's
// messages, in order, to one receiver at a time — the one holding the
// session's lock — so same-repo work is serialised across every factory
// that receives from the subscription.
//
// The receiver accepts the next free session per free slot
// (AcceptNextSessionForSubscription) and holds it in that slot: it renews
// the session's lock, takes the session's messages one at a time, and runs
// each accepted job to its end before it takes the next (complete-on-claim,
// the outcome table of docs/servicebus.md per message). With no message for the
// session within SessionIdle it closes the session, which frees it for any
// receiver, and gives the slot back.
//
// The lease, not the broker, owns a job's liveness: when the session lock is
// lost mid-job (not renewed in time, the link gone), the job goes on; the
// receiver takes nothing more from that session, and the repo's next message
// waits in the broker for whoever takes the session next.

// Errors the broker answers a session receiver with (azservicebus v1.11.0
// internal/errors.go): a session another receiver holds is refused with this
// condition, handed back as a raw *amqp.Error with no azservicebus.Code.
const condSessionCannotBeLocked = amqp.ErrCond("com.microsoft:session-cannot-be-locked")

// Defaults of the session options.
const (
	defaultSessionAcceptWait = 30 * time.Second
	defaultSessionIdle       = time.Second
	minSessionRenew          = 50 * time.Millisecond
	// unknownSessionLock is the lock assumed when the broker's attach did
	// not say until when it holds (Service Bus's shortest lock duration).
	unknownSessionLock = 5 * time.Second
)

// heldElsewhere reports whether err says the session is locked by another
// receiver.
func heldElsewhere(err error) bool {
	var ae *amqp.Error
	return errors.As(err, &ae) && ae.Condition == condSessionCannotBeLocked
}

// lockLost reports whether err says this receiver's session lock is gone.
func lockLost(err error) bool {
	var se *azservicebus.Error
	return errors.As(err, &se) && se.Code == azservicebus.CodeLockLost
}

// noSessionFree reports whether err is the broker's answer that no session
// came free while an AcceptNextSession waited.
func noSessionFree(err error) bool {
	var se *azservicebus.Error
	return errors.As(err, &se) && se.Code == azservicebus.CodeTimeout
}

// kindMismatch turns the broker's refusal of a receiver of the wrong kind —
// a receiver without sessions on a subscription that requires them, or the
// reverse (amqp:not-allowed when the link is attached) — into one clear
// line; nil when err is not that refusal.
func (r *Receiver) kindMismatch(err error) error {
	var ae *amqp.Error
	if !errors.As(err, &ae) || ae.Condition != amqp.ErrCondNotAllowed {
		return nil
	}
	said := r.red.String(brief.Clip(ae.Description, 200))
	if r.opts.Sessions {
		return aqerr.Wrap(aqerr.Usage, err,
			fmt.Sprintf("AQ_SB_SESSIONS=1 but subscription %s does not require sessions (the broker said: %s)", r.path, said),
			"unset AQ_SB_SESSIONS, or recreate the subscription with sessions: delete it, then aq servicebus ensure-subscription --sb-sessions")
	}
	return aqerr.Wrap(aqerr.Usage, err,
		fmt.Sprintf("subscription %s requires sessions but AQ_SB_SESSIONS is off (the broker said: %s)", r.path, said),
		"set AQ_SB_SESSIONS=1, the dispatcher must then set SessionId = repo on every message (docs/servicebus.md)")
}

// receiveSessions is receive with sessions: one held session per free slot.
// It returns nil when ctx is done, an error when the broker link fails (Run
// reconnects) or a configuration error (Run stops).
func (r *Receiver) receiveSessions(ctx context.Context, client *azservicebus.Client, attempt *int) error {
	// A session-less proof that the link is up: listing the sessions is an
	// entity-level $management call (no receiver link, which a subscription
	// with sessions would refuse). Its failure proves nothing either way —
	// the accept below says what is wrong.
	pager := client.NewListSessionsForSubscriptionPager(r.opts.Topic, r.opts.Subscription, nil)
	pctx, cancel := context.WithTimeout(ctx, r.opts.SettleTimeout)
	_, perr := pager.NextPage(pctx)
	cancel()
	if perr == nil {
		r.setHealth(true, nil)
		*attempt = 0
	} else if ctx.Err() == nil {
		r.log.Debug("listing the sessions failed; accepting one tells", "err", r.clean(perr).Error())
	}
	for {
		if err := r.opts.Slots.Acquire(ctx); err != nil {
			return nil
		}
		actx, cancel := context.WithTimeout(ctx, r.opts.SessionAcceptWait)
		sr, err := client.AcceptNextSessionForSubscription(actx, r.opts.Topic, r.opts.Subscription, nil)
		waited := actx.Err() != nil
		cancel()
		if err != nil {
			r.opts.Slots.Release()
			switch {
			case ctx.Err() != nil:
				return nil
			case noSessionFree(err):
				// The broker answered: the link is up, no session is free.
				r.setHealth(true, nil)
				*attempt = 0
				continue
			case waited && errors.Is(err, context.DeadlineExceeded):
				// Our deadline beat the broker's answer (the SDK asks it to
				// answer a little before): no proof either way; ask again.
				continue
			}
			if merr := r.kindMismatch(err); merr != nil {
				return merr
			}
			if merr := r.missing(err); IsMissingSubscription(merr) {
				r.setHealth(false, merr)
				return merr
			}
			err = fmt.Errorf("accept a session of %s: %w", r.path, err)
			r.setHealth(false, err)
			return err
		}
		r.setHealth(true, nil)
		*attempt = 0
		r.held.Add(1)
		go func() {
			defer r.held.Done()
			defer r.opts.Slots.Release()
			r.holdSession(ctx, sr)
		}()
	}
}

// Session events, as SessionMetrics counts them.
const (
	SessionAccepted = "accepted" // a session was accepted (its lock taken)
	SessionReleased = "released" // a held session was closed (freed)
	SessionLost     = "lost"     // a held session's lock was lost
)

// SessionMetrics is what a Metrics may also implement to count sessions
// (AQ_SB_SESSIONS=1).
type SessionMetrics interface {
	Session(event string)
}

func (r *Receiver) sessionEvent(e string) {
	if sm, ok := r.metrics.(SessionMetrics); ok {
		sm.Session(e)
	}
}

// sessionReceiver is the part of the SDK's session receiver a held session
// uses.
type sessionReceiver interface {
	settler
	SessionID() string
	LockedUntil() time.Time
	ReceiveMessages(ctx context.Context, n int, o *azservicebus.ReceiveMessagesOptions) ([]*azservicebus.ReceivedMessage, error)
	RenewSessionLock(ctx context.Context, o *azservicebus.RenewSessionLockOptions) error
	Close(ctx context.Context) error
}

var _ sessionReceiver = (*azservicebus.SessionReceiver)(nil)

// serialSession lets one call at a time reach a session receiver for the
// lock renewal, the settlements and Close. The SDK's SessionReceiver
// (v1.11) is not safe for a renewal beside a settlement that re-attaches a
// failed link: both write the session's lock time (the race detector caught
// it when the local peer was killed and restarted mid-session). A
// settlement is bounded by SettleTimeout, so a renewal waits at most that.
type serialSession struct {
	sessionReceiver
	mu sync.Mutex
}

var _ sessionReceiver = (*serialSession)(nil)

func (s *serialSession) RenewSessionLock(ctx context.Context, o *azservicebus.RenewSessionLockOptions) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.sessionReceiver.RenewSessionLock(ctx, o)
}

func (s *serialSession) CompleteMessage(ctx context.Context, m *azservicebus.ReceivedMessage, o *azservicebus.CompleteMessageOptions) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.sessionReceiver.CompleteMessage(ctx, m, o)
}

func (s *serialSession) AbandonMessage(ctx context.Context, m *azservicebus.ReceivedMessage, o *azservicebus.AbandonMessageOptions) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.sessionReceiver.AbandonMessage(ctx, m, o)
}

func (s *serialSession) DeadLetterMessage(ctx context.Context, m *azservicebus.ReceivedMessage, o *azservicebus.DeadLetterOptions) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.sessionReceiver.DeadLetterMessage(ctx, m, o)
}

func (s *serialSession) Close(ctx context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.sessionReceiver.Close(ctx)
}

// holdSession runs one held session in its slot: the session's messages one
// at a time, each accepted job to its end, until the session has no message
// within SessionIdle, its lock is lost, the link fails, or ctx is done (a
// drain: the job in hand finishes first, the session held meanwhile). Then
// it closes the session, which frees it.
func (r *Receiver) holdSession(ctx context.Context, sr sessionReceiver) {
	sr = &serialSession{sessionReceiver: sr} // the renewer and the settlements take turns
	log := r.log.With("session", sr.SessionID())
	// Read once, before the renewer starts: the SDK writes it on renewal.
	lockFor := time.Until(sr.LockedUntil())
	if lockFor <= 0 {
		log.Warn("the broker did not say until when the session is locked; renewing as for the shortest lock", "assumed", unknownSessionLock)
		lockFor = unknownSessionLock
	}
	lost := make(chan struct{})
	rctx, stopRenew := context.WithCancel(context.WithoutCancel(ctx))
	var renewer sync.WaitGroup
	renewer.Add(1)
	go func() {
		defer renewer.Done()
		r.renewSession(rctx, sr, lockFor, lost, log)
	}()
	why := "stopping"
	defer func() {
		stopRenew()
		renewer.Wait()
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), r.opts.SettleTimeout)
		if err := sr.Close(cctx); err != nil {
			log.Debug("closing the session", "err", r.clean(err).Error())
		}
		cancel()
		r.sessionEvent(SessionReleased)
		log.Info("session released", "why", why)
	}()
	r.sessionEvent(SessionAccepted)
	log.Info("session accepted", "lockedFor", lockFor.Round(time.Millisecond))
	for {
		select {
		case <-lost:
			why = "its lock was lost"
			return
		default:
		}
		if ctx.Err() != nil {
			return
		}
		ictx, cancel := context.WithTimeout(ctx, r.opts.SessionIdle)
		msgs, err := sr.ReceiveMessages(ictx, 1, nil)
		idle := ictx.Err() != nil
		cancel()
		if len(msgs) == 0 {
			switch {
			case ctx.Err() != nil:
			case idle || err == nil:
				// Nothing more for this session now (nil, nil: the SDK saw
				// the link go; it would re-attach on the next call).
				why = "no message for it"
			case heldElsewhere(err) || lockLost(err):
				why = "its lock was lost"
			default:
				why = "the link failed: " + r.clean(err).Error()
			}
			return
		}
		done := make(chan struct{})
		r.handle(ctx, sr, msgs[0], func() { close(done) })
		<-done // in order: the session's next message waits for this job
	}
}

// renewSession renews the session's lock at half its duration while the
// session is held; it closes lost when the lock is gone (the broker says so,
// another receiver holds the session, or the lock ran out between failed
// renewals) and stops.
func (r *Receiver) renewSession(ctx context.Context, sr sessionReceiver, lockFor time.Duration, lost chan<- struct{}, log *slog.Logger) {
	every := max(lockFor/2, minSessionRenew)
	until := time.Now().Add(lockFor)
	t := time.NewTimer(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		rctx, cancel := context.WithTimeout(ctx, min(every, r.opts.SettleTimeout))
		err := sr.RenewSessionLock(rctx, nil)
		cancel()
		if ctx.Err() != nil {
			return
		}
		switch {
		case err == nil:
			until = time.Now().Add(lockFor)
			t.Reset(every)
		case lockLost(err) || heldElsewhere(err) || time.Now().After(until):
			r.sessionEvent(SessionLost)
			log.Warn("session lock lost: the job in hand goes on under its lease; the session's next message waits for whoever takes the session next",
				"err", r.clean(err).Error())
			close(lost)
			return
		default:
			log.Warn("renewing the session lock failed; trying again", "err", r.clean(err).Error(), "lockedUntil", until)
			t.Reset(max(time.Until(until)/4, minSessionRenew))
		}
	}
}
