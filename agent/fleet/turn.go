package fleet

import (
	"context"
	"errors"
	"net"
	"net/http"
	"sync"
)

// wireTurn orders one lease's renewals and its job's terminal report on the
// wire: one at a time, and no renewal after a report attempt the
// coordinator may have taken. Without it a renewal could cross the report —
// sent while /fleet/fail freed the lease, or after it — and the coordinator
// would refuse it ("nobody holds its lease") and log a fenced write of a
// factory that did nothing wrong. While the coordinator answers the report's
// attempts with 429 or 5xx (it took nothing), renewals go between them, so
// the lease is still held when the report finally lands. docs/fleet.md
// ("Leases") describes the order.
type wireTurn struct {
	jobID string
	epoch int64
	waits func() // a report attempt waits for a renewal (a seam for tests)
	// renewalWaits: a renewal waits for another call on the wire (tests).
	renewalWaits func()

	mu sync.Mutex
	// renewing counts the renewals on the wire: the renewer's, and a
	// Confirm of the run's beside it (before a push) — one ending must
	// not give the report the wire while the other is still on it.
	renewing int
	sending  bool          // a report attempt is on the wire
	taken    bool          // an attempt may have been taken: no more renewals
	changed  chan struct{} // closed (and replaced) at each change
}

func newWireTurn(jobID string, epoch int64, waits func()) *wireTurn {
	return &wireTurn{jobID: jobID, epoch: epoch, waits: waits, changed: make(chan struct{})}
}

// renewal takes the wire for a renewal, waiting while a report attempt is on
// it; false when ctx ended or the report may have ended the lease.
func (w *wireTurn) renewal(ctx context.Context) bool {
	return w.await(ctx, w.renewalWaits, func() (got, never bool) {
		if w.taken {
			return false, true
		}
		if !w.sending {
			w.renewing++
			return true, false
		}
		return false, false
	})
}

// renewed gives the wire back after a renewal.
func (w *wireTurn) renewed() {
	w.mu.Lock()
	w.renewing--
	w.signal()
	w.mu.Unlock()
}

// send takes the wire for one attempt of the report, waiting while a
// renewal is on it; false when ctx ended first (the attempt then fails on
// ctx without being sent).
func (w *wireTurn) send(ctx context.Context) bool { return w.await(ctx, w.waits, w.takeSending) }

// sent gives the wire back after a report attempt; taken says the
// coordinator may have acted on it (then no renewal follows, ever).
func (w *wireTurn) sent(taken bool) {
	w.mu.Lock()
	w.sending = false
	w.taken = w.taken || taken
	w.signal()
	w.mu.Unlock()
}

// beside takes the wire for a call of the job's that is no report (a live
// log chunk), waiting while a renewal or a report attempt is on it; false
// when ctx ended first. So a renewal and a chunk are never on the wire
// together: after one of them is refused 409, the other sees the fence
// before it is sent (a fenced factory sends nothing more).
func (w *wireTurn) beside(ctx context.Context) bool { return w.await(ctx, nil, w.takeSending) }

// besideDone gives the wire back after a call beside the report; it never
// ends renewals.
func (w *wireTurn) besideDone() { w.sent(false) }

// takeSending takes the wire for a report attempt or a call beside it when
// nothing is on it (w.mu held).
func (w *wireTurn) takeSending() (got, never bool) {
	if w.renewing == 0 && !w.sending {
		w.sending = true
		return true, false
	}
	return false, false
}

// await calls take (with w.mu held) at every change of the wire until it
// got the wire, or says it never will, or ctx ends; waits, if set, is
// called once, the first time it has to wait.
func (w *wireTurn) await(ctx context.Context, waits func(), take func() (got, never bool)) bool {
	said := false
	for {
		w.mu.Lock()
		got, never := take()
		if got || never {
			w.mu.Unlock()
			return got
		}
		ch := w.changed
		w.mu.Unlock()
		if !said && waits != nil {
			said = true
			waits()
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return false
		}
	}
}

func (w *wireTurn) signal() {
	close(w.changed)
	w.changed = make(chan struct{})
}

// turnKey carries a lease's wireTurn in its terminal report's context
// (JobLease.Reporting).
type turnKey struct{}

// turnFor is the wire turn call cl must take, attempt by attempt: the
// lease's when cl is a report of its job sent on the context Reporting
// returned, else nil. The live log's last chunks, sent just before the
// report on its context, are no report: taking the turn, they would end
// the renewals before the report went out.
func turnFor(ctx context.Context, cl call) *wireTurn {
	w, _ := ctx.Value(turnKey{}).(*wireTurn)
	if w == nil || cl.name == RouteRenew || cl.name == RouteLogAppend || cl.jobID != w.jobID || cl.epoch != w.epoch {
		return nil
	}
	return w
}

// untaken reports whether an attempt's answer shows the coordinator did not
// act on it: it answered 429 or 5xx, or no connection was made. Anything
// else — an answer, a connection lost mid-request — may have been taken.
func untaken(resp *http.Response, err error) bool {
	if err == nil {
		return resp != nil && (resp.StatusCode == http.StatusTooManyRequests || resp.StatusCode >= 500)
	}
	var op *net.OpError
	return errors.As(err, &op) && op.Op == "dial"
}
