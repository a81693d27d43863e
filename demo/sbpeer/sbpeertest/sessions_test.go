//go:build !unit

package sbpeertest_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/azcore"
	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"
	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus/admin"
	"github.com/Azure/go-amqp"

	"github.com/aqfleet/aq/demo/sbpeer/sbpeertest"
)

// sessionPeer is a peer whose subscription s requires sessions (and n does
// not), a client with short retries, and a sender to the topic.
type sessionPeer struct {
	t      *testing.T
	peer   *sbpeertest.Peer
	client *azservicebus.Client
	sender *azservicebus.Sender
}

func newSessionPeer(t *testing.T, o sbpeertest.Options) *sessionPeer {
	t.Helper()
	o.Subs = append(o.Subs, "fleet-dispatch/s=*", "fleet-dispatch/n=none")
	o.Sessions = append(o.Sessions, "fleet-dispatch/s")
	if o.SessionWait == 0 {
		o.SessionWait = 300 * time.Millisecond
	}
	p := sbpeertest.Start(t, o)
	c, err := azservicebus.NewClientFromConnectionString(p.ConnectionString(), &azservicebus.ClientOptions{
		RetryOptions: azservicebus.RetryOptions{MaxRetries: 2, RetryDelay: 10 * time.Millisecond, MaxRetryDelay: 50 * time.Millisecond},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close(context.Background()) })
	snd, err := c.NewSender("fleet-dispatch", nil)
	if err != nil {
		t.Fatal(err)
	}
	return &sessionPeer{t: t, peer: p, client: c, sender: snd}
}

// send publishes id in session (none when session is "").
func (sp *sessionPeer) send(id, session string) {
	sp.t.Helper()
	m := &azservicebus.Message{MessageID: &id, Body: []byte(id)}
	if session != "" {
		m.SessionID = &session
	}
	if err := sp.sender.SendMessage(context.Background(), m, nil); err != nil {
		sp.t.Fatal(err)
	}
}

// acceptNext is AcceptNextSession with a ctx deadline of wait (the SDK
// sends it as com.microsoft:timeout, less up to 1% of jitter: the peer's
// answer and the deadline race), or without one when wait is 0 (the peer
// waits its SessionWait, then answers com.microsoft:timeout).
func (sp *sessionPeer) acceptNext(wait time.Duration) (*azservicebus.SessionReceiver, error) {
	ctx := context.Background()
	if wait > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, wait)
		defer cancel()
	}
	return sp.client.AcceptNextSessionForSubscription(ctx, "fleet-dispatch", "s", nil)
}

func (sp *sessionPeer) accept(session string) (*azservicebus.SessionReceiver, error) {
	return sp.client.AcceptSessionForSubscription(context.Background(), "fleet-dispatch", "s", session, nil)
}

func (sp *sessionPeer) events() []sbpeertest.Event {
	sp.t.Helper()
	evs, err := sp.peer.Events()
	if err != nil {
		sp.t.Fatal(err)
	}
	for _, e := range evs {
		if e.Event == "internal-error" {
			sp.t.Fatalf("the peer hit an internal error: %s", e.Error)
		}
	}
	return evs
}

// waitEvent waits for an event (bounded by the test binary's -timeout only).
func (sp *sessionPeer) waitEvent(match func(sbpeertest.Event) bool) sbpeertest.Event {
	sp.t.Helper()
	for {
		for _, e := range sp.events() {
			if match(e) {
				return e
			}
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func receiveN(t *testing.T, r *azservicebus.SessionReceiver, n int) []*azservicebus.ReceivedMessage {
	t.Helper()
	var out []*azservicebus.ReceivedMessage
	for len(out) < n {
		ms, err := r.ReceiveMessages(context.Background(), n-len(out), nil)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, ms...)
	}
	return out
}

func ids(ms []*azservicebus.ReceivedMessage) string {
	var s []string
	for _, m := range ms {
		s = append(s, m.MessageID+"@"+*m.SessionID)
	}
	return strings.Join(s, " ")
}

// The SDK's session receivers against the peer: AcceptNext takes the free
// session whose oldest message is oldest, gets only that session's
// messages, in order; a named Accept takes a given one; a session held by
// another receiver is refused with session-cannot-be-locked (a raw
// *amqp.Error, matched by condition); closing a receiver frees its session.
func TestPeerSessionsAcceptReceiveComplete(t *testing.T) {
	sp := newSessionPeer(t, sbpeertest.Options{})
	ctx := context.Background()
	sp.send("a1", "app")
	sp.send("b1", "lib")
	sp.send("a2", "app")
	sp.send("b2", "lib")
	sp.send("a3", "app")

	ra, err := sp.acceptNext(10 * time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if ra.SessionID() != "app" {
		t.Fatalf("AcceptNext took %q, want app (its message is the oldest)", ra.SessionID())
	}
	if until := ra.LockedUntil(); until.Before(time.Now()) || until.After(time.Now().Add(40*time.Second)) {
		t.Fatalf("LockedUntil %v: want about 30 s from now (the peer's lock duration)", until)
	}
	got := receiveN(t, ra, 3)
	if ids(got) != "a1@app a2@app a3@app" {
		t.Fatalf("session app delivered %s, want a1 a2 a3 in order", ids(got))
	}
	for _, m := range got {
		if err := ra.CompleteMessage(ctx, m, nil); err != nil {
			t.Fatal(err)
		}
	}

	// lib is free: a named Accept takes it; a second named Accept is refused.
	rb, err := sp.accept("lib")
	if err != nil {
		t.Fatal(err)
	}
	_, err = sp.accept("lib")
	var ae *amqp.Error
	if !errors.As(err, &ae) || ae.Condition != "com.microsoft:session-cannot-be-locked" {
		t.Fatalf("a second Accept of a held session: %v (%T), want *amqp.Error com.microsoft:session-cannot-be-locked", err, err)
	}
	// app is held by ra: AcceptNext finds nothing else with a message.
	if _, err := sp.acceptNext(0); !isTimeout(err) {
		t.Fatalf("AcceptNext with every session held: %v, want a timeout", err)
	}
	got = receiveN(t, rb, 2)
	if ids(got) != "b1@lib b2@lib" {
		t.Fatalf("session lib delivered %s", ids(got))
	}
	for _, m := range got {
		if err := rb.CompleteMessage(ctx, m, nil); err != nil {
			t.Fatal(err)
		}
	}
	// Closing frees a session: it can be accepted by name again.
	if err := rb.Close(ctx); err != nil {
		t.Fatal(err)
	}
	sp.waitEvent(func(e sbpeertest.Event) bool { return e.Event == "session-release" && e.Session == "lib" })
	rb2, err := sp.accept("lib")
	if err != nil {
		t.Fatalf("Accept after the holder closed: %v", err)
	}
	_ = rb2.Close(ctx)
	_ = ra.Close(ctx)

	evs := sp.events()
	if n := len(sbpeertest.Filter(evs, func(e sbpeertest.Event) bool { return e.Event == "deliver" && e.Session == "app" && e.Link != "" })); n != 3 {
		t.Fatalf("%d deliveries of app, want 3", n)
	}
	for _, e := range sbpeertest.Filter(evs, func(e sbpeertest.Event) bool { return e.Event == "deliver" }) {
		if (e.Session == "app") != strings.HasPrefix(e.MessageID, "a") {
			t.Fatalf("a delivery crossed sessions: %+v", e)
		}
	}
}

func isTimeout(err error) bool {
	var se *azservicebus.Error
	return errors.As(err, &se) && se.Code == azservicebus.CodeTimeout
}

// AcceptNext with no free session waits and is answered
// com.microsoft:timeout — the SDK's CodeTimeout — when none comes: for as
// long as the link property com.microsoft:timeout says (the SDK derives it
// from the ctx deadline), else the service's default wait. A session that
// comes free while it waits is granted to it.
func TestPeerSessionsAcceptNextWaitsThenTimesOut(t *testing.T) {
	sp := newSessionPeer(t, sbpeertest.Options{})
	_, err := sp.acceptNext(0)
	if !isTimeout(err) {
		t.Fatalf("AcceptNext on an empty subscription: %v, want CodeTimeout", err)
	}
	w := sp.waitEvent(func(e sbpeertest.Event) bool { return e.Event == "session-wait" })
	if w.Link == "" || w.TimeoutMs != 300 {
		t.Fatalf("session-wait: %+v, want the default wait (300 ms here)", w)
	}
	refused := sp.waitEvent(func(e sbpeertest.Event) bool { return e.Event == "attach" && e.Refused != "" })
	if refused.Refused != "com.microsoft:timeout" {
		t.Fatalf("refusal %+v", refused)
	}
	// With a deadline, the wait is the SDK's com.microsoft:timeout; the
	// SDK's error is the peer's timeout or the deadline, whichever it sees first.
	_, err = sp.acceptNext(time.Second)
	if !isTimeout(err) && !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("AcceptNext with a deadline: %v", err)
	}
	w2 := sp.waitEvent(func(e sbpeertest.Event) bool { return e.Event == "session-wait" && e.Link != w.Link })
	if w2.TimeoutMs < 500 || w2.TimeoutMs > 1000 {
		t.Fatalf("session-wait %+v: want the deadline's time left (< 1 s)", w2)
	}

	// A waiting AcceptNext is granted the session a message opens.
	type res struct {
		r   *azservicebus.SessionReceiver
		err error
	}
	got := make(chan res, 1)
	go func() {
		r, err := sp.acceptNext(time.Minute)
		got <- res{r, err}
	}()
	sp.waitEvent(func(e sbpeertest.Event) bool {
		return e.Event == "session-wait" && e.Link != w.Link && e.Link != w2.Link
	})
	sp.send("x1", "late")
	r := <-got
	if r.err != nil || r.r.SessionID() != "late" {
		t.Fatalf("waiting AcceptNext: %v, %v", r.r, r.err)
	}
	if m := receiveN(t, r.r, 1)[0]; m.MessageID != "x1" {
		t.Fatalf("got %s", m.MessageID)
	}
	_ = r.r.Close(context.Background())
}

// RenewSessionLock extends the lock (the peer's $management answers with the
// new expiration); session state is kept per session; a session lock that is
// not renewed expires: the session is free again, the message its holder had
// not settled comes back to the next holder with its delivery count raised,
// and the old holder's renewal is refused (lock lost).
func TestPeerSessionsRenewStateAndExpiry(t *testing.T) {
	sp := newSessionPeer(t, sbpeertest.Options{LockDuration: 2 * time.Second})
	ctx := context.Background()
	sp.send("a1", "app")
	r, err := sp.acceptNext(10 * time.Second)
	if err != nil {
		t.Fatal(err)
	}
	first := r.LockedUntil()
	m := receiveN(t, r, 1)[0]
	if m.MessageID != "a1" || m.DeliveryCount != 1 {
		t.Fatalf("got %s count %d", m.MessageID, m.DeliveryCount)
	}
	if err := r.RenewSessionLock(ctx, nil); err != nil {
		t.Fatalf("RenewSessionLock: %v", err)
	}
	if !r.LockedUntil().After(first) {
		t.Fatalf("LockedUntil %v after renewal, was %v", r.LockedUntil(), first)
	}
	sp.waitEvent(func(e sbpeertest.Event) bool { return e.Event == "session-renew" && e.Session == "app" })

	if st, err := r.GetSessionState(ctx, nil); err != nil || st != nil {
		t.Fatalf("state before any set: %q, %v", st, err)
	}
	if err := r.SetSessionState(ctx, []byte("step-2"), nil); err != nil {
		t.Fatal(err)
	}
	if st, err := r.GetSessionState(ctx, nil); err != nil || string(st) != "step-2" {
		t.Fatalf("state: %q, %v", st, err)
	}

	// Stop renewing: the lock runs out (2 s), the session is released.
	exp := sp.waitEvent(func(e sbpeertest.Event) bool { return e.Event == "session-lock-expired" && e.Session == "app" })
	if exp.Reason != "lock-expired" {
		t.Fatalf("expiry %+v", exp)
	}
	r2, err := sp.accept("app")
	if err != nil {
		t.Fatalf("Accept after the lock expired: %v", err)
	}
	again := receiveN(t, r2, 1)[0]
	if again.MessageID != "a1" || again.DeliveryCount != 2 {
		t.Fatalf("after expiry got %s count %d, want a1 count 2", again.MessageID, again.DeliveryCount)
	}
	if st, err := r2.GetSessionState(ctx, nil); err != nil || string(st) != "step-2" {
		t.Fatalf("state after the holder changed: %q, %v", st, err)
	}
	if err := r2.CompleteMessage(ctx, again, nil); err != nil {
		t.Fatal(err)
	}
	// The old holder lost it: its renewal fails with lock lost (the SDK may
	// first try to take the session back by name, which r2 holds).
	if err := r.RenewSessionLock(ctx, nil); err == nil {
		t.Fatal("the old holder renewed a lock it lost")
	}
	_ = r2.Close(ctx)
	_ = r.Close(ctx)
}

// A test can expire a held session lock at once (the peer's control
// channel): the holder's link is detached with session-lock-lost and the
// session can be taken by another receiver.
func TestPeerSessionsExpireOnCommand(t *testing.T) {
	sp := newSessionPeer(t, sbpeertest.Options{})
	sp.send("a1", "app")
	r, err := sp.acceptNext(10 * time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if err := sp.peer.ExpireSessionLock("fleet-dispatch/s", "app"); err != nil {
		t.Fatal(err)
	}
	if err := sp.peer.ExpireSessionLock("fleet-dispatch/s", "app"); err == nil {
		t.Fatal("expired a session nobody holds")
	}
	var se *azservicebus.Error
	if err := r.RenewSessionLock(context.Background(), nil); err == nil {
		// The SDK recovers a lost session link by accepting the session again
		// by name; the session was free, so it got it back.
		if r.SessionID() != "app" {
			t.Fatalf("renewed into session %q", r.SessionID())
		}
	} else if !errors.As(err, &se) || se.Code != azservicebus.CodeLockLost {
		t.Fatalf("renewal after expiry: %v", err)
	}
	_ = r.Close(context.Background())
}

// Bad input: a message without a SessionId on a subscription that requires
// sessions is dead-lettered there (Service Bus's reason and words); a
// receiver without sessions on it, and a session receiver on a subscription
// without sessions, are refused with amqp:not-allowed.
func TestPeerSessionsRefusals(t *testing.T) {
	sp := newSessionPeer(t, sbpeertest.Options{Subs: []string{"fleet-dispatch/m=*"}, Admin: true})
	ctx := context.Background()
	sp.send("plain", "")
	dl := sp.waitEvent(func(e sbpeertest.Event) bool { return e.Event == "dead-letter" && e.MessageID == "plain" })
	if dl.Reason != "Session id is null." || !strings.HasSuffix(dl.Queue, "/s") {
		t.Fatalf("dead-letter %+v", dl)
	}
	// The same message reaches a subscription without sessions as usual.
	plain, err := sp.client.NewReceiverForSubscription("fleet-dispatch", "m", nil)
	if err != nil {
		t.Fatal(err)
	}
	if ms, err := plain.ReceiveMessages(ctx, 1, nil); err != nil || len(ms) != 1 || ms[0].MessageID != "plain" {
		t.Fatalf("m: %v %v", ms, err)
	}
	dlq, err := sp.client.NewReceiverForSubscription("fleet-dispatch", "s", &azservicebus.ReceiverOptions{SubQueue: azservicebus.SubQueueDeadLetter})
	if err != nil {
		t.Fatal(err)
	}
	ms, err := dlq.ReceiveMessages(ctx, 1, nil)
	if err != nil || len(ms) != 1 || ms[0].DeadLetterReason == nil || *ms[0].DeadLetterReason != "Session id is null." {
		t.Fatalf("DLQ of s: %v %v", ms, err)
	}

	wrong, err := sp.client.NewReceiverForSubscription("fleet-dispatch", "s", nil)
	if err != nil {
		t.Fatal(err)
	}
	_, err = wrong.PeekMessages(ctx, 1, nil)
	var ae *amqp.Error
	if !errors.As(err, &ae) || ae.Condition != amqp.ErrCondNotAllowed || !strings.Contains(ae.Description, "requires sessions") {
		t.Fatalf("a receiver without sessions on s: %v", err)
	}
	_, err = sp.client.AcceptSessionForSubscription(ctx, "fleet-dispatch", "m", "x", nil)
	if !errors.As(err, &ae) || ae.Condition != amqp.ErrCondNotAllowed {
		t.Fatalf("a session receiver on m: %v", err)
	}

	// The management API shows which subscription requires sessions.
	ac, err := admin.NewClientFromConnectionString(sp.peer.AdminConnectionString(), &admin.ClientOptions{ClientOptions: azcore.ClientOptions{Transport: sp.peer.AdminHTTPClient()}})
	if err != nil {
		t.Fatal(err)
	}
	for sub, want := range map[string]bool{"s": true, "m": false} {
		got, err := ac.GetSubscription(ctx, "fleet-dispatch", sub, nil)
		if err != nil || got == nil || got.RequiresSession == nil || *got.RequiresSession != want {
			t.Fatalf("%s: RequiresSession %v (%v), want %v", sub, got, err, want)
		}
	}
	if rp, err := ac.GetSubscriptionRuntimeProperties(ctx, "fleet-dispatch", "s", nil); err != nil || rp.DeadLetterMessageCount != 1 || rp.ActiveMessageCount != 0 {
		t.Fatalf("runtime properties of s: %+v %v; want the session-less message dead-lettered", rp, err)
	}
}

// ListSessions (a $management call with no entity link) lists the sessions
// with messages.
func TestPeerSessionsList(t *testing.T) {
	sp := newSessionPeer(t, sbpeertest.Options{})
	pager := sp.client.NewListSessionsForSubscriptionPager("fleet-dispatch", "s", nil)
	var got []string
	for pager.More() {
		page, err := pager.NextPage(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, page.Sessions...)
	}
	if len(got) != 0 {
		t.Fatalf("sessions of an empty subscription: %v", got)
	}
	sp.send("a1", "app")
	sp.send("b1", "lib")
	sp.send("a2", "app")
	pager = sp.client.NewListSessionsForSubscriptionPager("fleet-dispatch", "s", nil)
	for pager.More() {
		page, err := pager.NextPage(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, page.Sessions...)
	}
	if strings.Join(got, " ") != "app lib" {
		t.Fatalf("sessions: %v", got)
	}
}
