package fleet

import (
	"context"
	"errors"
	"net"
	"net/http"
	"testing"
)

// TestWireTurn: a report attempt waits for the renewal on the wire; a
// renewal waits for the attempt; after an attempt the coordinator refused
// (503) renewals go on, after one it may have taken they never do.
func TestWireTurn(t *testing.T) {
	t.Parallel()
	waited := make(chan struct{}, 1)
	w := newWireTurn("j", 1, func() { waited <- struct{}{} })
	ctx := context.Background()
	if !w.renewal(ctx) {
		t.Fatal("a renewal before any report was refused")
	}
	sent := make(chan bool)
	go func() { sent <- w.send(ctx) }()
	<-waited // the attempt waits for the renewal on the wire
	w.renewed()
	if !<-sent {
		t.Fatal("the attempt did not get the wire after the renewal")
	}
	renewed := make(chan bool)
	go func() { renewed <- w.renewal(ctx) }()
	w.sent(false) // answered 503: not taken
	if !<-renewed {
		t.Fatal("a renewal after an attempt the coordinator refused was refused")
	}
	w.renewed()
	if !w.send(ctx) {
		t.Fatal("the second attempt did not get the wire")
	}
	w.sent(true)
	if w.renewal(ctx) {
		t.Fatal("a renewal went out after a report the coordinator may have taken")
	}
	if !w.send(ctx) {
		t.Fatal("a report's next call (a release) did not get the wire")
	}
	w.sent(false)
	if w.renewal(ctx) {
		t.Fatal("a refused call after a taken one let renewals go again")
	}
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	w2 := newWireTurn("j", 1, nil)
	w2.renewal(ctx)
	if w2.send(cctx) {
		t.Fatal("a cancelled attempt got the wire")
	}
}

// TestWireTurnTwoRenewals: the renewer's renewal and a Confirm beside it
// (before a push) can be on the wire together; the report waits for both,
// not for the first to end (then the other crossed the report: the
// coordinator logged a fenced renewal).
func TestWireTurnTwoRenewals(t *testing.T) {
	w := newWireTurn("j", 1, nil)
	ctx := context.Background()
	first := w.renewal(ctx)  // the renewer's
	second := w.renewal(ctx) // a Confirm beside it
	if !first || !second {
		t.Fatal("two renewals were not let on the wire together")
	}
	w.renewed() // the Confirm's ends; the renewer's is still on the wire
	now, cancel := context.WithCancel(ctx)
	cancel() // take the wire now or not at all
	if w.send(now) {
		t.Fatal("the report took the wire while a renewal was still on it")
	}
	w.renewed()
	if !w.send(now) {
		t.Fatal("the report did not get the wire once both renewals ended")
	}
}

func TestUntaken(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name    string
		status  int
		err     error
		untaken bool
	}{
		{"200", 200, nil, false},
		{"409", 409, nil, false},
		{"429", 429, nil, true},
		{"503", 503, nil, true},
		{"dial refused", 0, &net.OpError{Op: "dial", Err: errors.New("connection refused")}, true},
		{"reset mid-request", 0, &net.OpError{Op: "read", Err: errors.New("connection reset")}, false},
		{"timeout", 0, context.DeadlineExceeded, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var resp *http.Response
			if tc.status != 0 {
				resp = &http.Response{StatusCode: tc.status}
			}
			if got := untaken(resp, tc.err); got != tc.untaken {
				t.Fatalf("untaken = %v, want %v", got, tc.untaken)
			}
		})
	}
}
