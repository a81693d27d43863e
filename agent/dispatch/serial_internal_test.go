package dispatch

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"
)

// gateSession is a session receiver whose CompleteMessage blocks until the
// test opens the gate, and which logs the order calls enter and leave.
type gateSession struct {
	sessionReceiver
	gate, inside chan struct{}
	mu           sync.Mutex
	order        []string
}

func (g *gateSession) note(s string) { g.mu.Lock(); g.order = append(g.order, s); g.mu.Unlock() }

func (g *gateSession) CompleteMessage(context.Context, *azservicebus.ReceivedMessage, *azservicebus.CompleteMessageOptions) error {
	g.note("complete")
	close(g.inside)
	<-g.gate
	g.note("complete done")
	return nil
}

func (g *gateSession) RenewSessionLock(context.Context, *azservicebus.RenewSessionLockOptions) error {
	g.note("renew")
	return nil
}

// TestSessionRenewalWaitsForASettlement: a renewal never runs beside a
// settlement on the same session (the SDK races on the session's lock time
// when a settlement re-attaches the link).
func TestSessionRenewalWaitsForASettlement(t *testing.T) {
	g := &gateSession{gate: make(chan struct{}), inside: make(chan struct{})}
	s := &serialSession{sessionReceiver: g}
	go func() { _ = s.CompleteMessage(context.Background(), nil, nil) }()
	<-g.inside
	renewed := make(chan struct{})
	go func() { _ = s.RenewSessionLock(context.Background(), nil); close(renewed) }()
	select {
	case <-renewed:
		t.Fatal("the renewal ran while the settlement was in flight")
	case <-time.After(100 * time.Millisecond): // it waits; a wrong order fails below too
	}
	close(g.gate)
	<-renewed
	g.mu.Lock()
	defer g.mu.Unlock()
	if want := []string{"complete", "complete done", "renew"}; len(g.order) != 3 || g.order[0] != want[0] || g.order[1] != want[1] || g.order[2] != want[2] {
		t.Fatalf("calls entered in the order %v, want %v", g.order, want)
	}
}
