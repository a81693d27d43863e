package dispatch

import (
	"context"
	"errors"
	"time"

	"github.com/aqfleet/aq/agent/claim"
)

// Acceptor asks the coordinator for a job that was dispatched to this factory
// (POST /fleet/accept {jobId, factoryId}). The fleet client implements it.
//
// The error contract — how the receiver settles the message — is decided by
// Classify from small predicates the error (or any error it wraps) satisfies:
//
//	nil                                   accepted: Complete at once, then the Handler runs the job
//	interface{ Conflict() bool } → true   409: owned elsewhere or fenced → Complete
//	interface{ Gone() bool } → true       404: the job is gone → Complete
//	interface{ Temporary() bool } → true  network error, 5xx, 429 → Abandon (the broker redelivers)
//	anything else                         also Abandon: an error dispatch cannot read must never
//	                                      lose a message; the subscription's max delivery count
//	                                      bounds the retries and then dead-letters it
//
// Conflict wins over Gone, and both over Temporary. Context errors (the
// receiver is stopping) abandon. The fleet client should make its status
// errors answer these predicates rather than have dispatch read status codes.
type Acceptor interface {
	Accept(ctx context.Context, jobID string) (Accepted, error)
}

// AcceptFunc adapts a function to Acceptor.
type AcceptFunc func(ctx context.Context, jobID string) (Accepted, error)

// Accept calls f.
func (f AcceptFunc) Accept(ctx context.Context, jobID string) (Accepted, error) { return f(ctx, jobID) }

// Accepted is a job this factory now holds a lease on. The Acceptor fills
// Claim; the receiver adds the message fields before the Handler sees it.
type Accepted struct {
	// Claim is the job and its lease as the fleet client decoded them;
	// dispatch reads only its lease epoch (for logs).
	Claim *claim.Claim

	// Filled by the receiver.
	Message       Message
	EnqueuedTime  time.Time     // when the broker enqueued the message
	Lag           time.Duration // EnqueuedTime → accepted (the dispatch lag metric)
	DeliveryCount uint32        // 1 on the first delivery
}

// epoch is the accepted lease's epoch (0: no claim).
func (a Accepted) epoch() int64 {
	if a.Claim == nil {
		return 0
	}
	return a.Claim.LeaseEpoch
}

// Handler runs an accepted job. It is called on its own goroutine holding one
// of the receiver's slots, which is released when it returns. Its context is
// not cancelled when the receiver stops (a drain lets running jobs finish);
// the daemon cancels jobs through its own job context.
type Handler func(ctx context.Context, job Accepted)

// Outcome is what happened to one message; it is also the metric label.
type Outcome string

// Outcomes, with the settlement each leads to (docs/contract.md, "Broker messages").
const (
	OutcomeAccepted    Outcome = "accepted"    // 200: completed, handed to the Handler
	OutcomeConflict    Outcome = "conflict"    // 409: completed
	OutcomeGone        Outcome = "gone"        // 404: completed
	OutcomeAbandoned   Outcome = "abandoned"   // network error / 5xx / unknown: abandoned, redelivered
	OutcomeMalformed   Outcome = "malformed"   // body unreadable: dead-lettered
	OutcomeMistargeted Outcome = "mistargeted" // targetFactoryId is not this factory: dead-lettered
	OutcomeUnfit       Outcome = "unfit"       // the job needs what this factory no longer offers: dead-lettered, not accepted
)

// Settlement is what the receiver does with a message.
type Settlement string

// Settlements.
const (
	Complete   Settlement = "complete"
	Abandon    Settlement = "abandon"
	DeadLetter Settlement = "dead-letter"
)

// Settle maps an outcome to its settlement: the outcome table of docs/contract.md ("Broker messages").
func (o Outcome) Settle() Settlement {
	switch o {
	case OutcomeAccepted, OutcomeConflict, OutcomeGone:
		return Complete
	case OutcomeMalformed, OutcomeMistargeted, OutcomeUnfit:
		return DeadLetter
	}
	return Abandon
}

// Classify maps the Acceptor's answer to an outcome (see Acceptor).
func Classify(err error) Outcome {
	if err == nil {
		return OutcomeAccepted
	}
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return OutcomeAbandoned
	}
	var c interface{ Conflict() bool }
	if errors.As(err, &c) && c.Conflict() {
		return OutcomeConflict
	}
	var g interface{ Gone() bool }
	if errors.As(err, &g) && g.Gone() {
		return OutcomeGone
	}
	return OutcomeAbandoned // Temporary() or unknown: never lose the message
}

// Backoff is a capped exponential backoff with jitter, for reconnecting to the
// broker.
type Backoff struct {
	Initial time.Duration // first delay (default 500ms)
	Max     time.Duration // cap (default 30s)
	Jitter  float64       // up to this fraction is taken off each delay (default 0.2)
}

// Delay is the wait before reconnect attempt n (0-based); rnd in [0,1) picks
// the jitter. It is a pure function.
func (b Backoff) Delay(n int, rnd float64) time.Duration {
	b = b.withDefaults()
	d := b.Initial
	for i := 0; i < n && d < b.Max; i++ {
		d *= 2
	}
	d = min(d, b.Max)
	return d - time.Duration(float64(d)*b.Jitter*rnd)
}

func (b Backoff) withDefaults() Backoff {
	if b.Initial <= 0 {
		b.Initial = 500 * time.Millisecond
	}
	if b.Max <= 0 {
		b.Max = 30 * time.Second
	}
	if b.Max < b.Initial {
		b.Max = b.Initial
	}
	if b.Jitter <= 0 || b.Jitter >= 1 {
		b.Jitter = 0.2
	}
	return b
}
