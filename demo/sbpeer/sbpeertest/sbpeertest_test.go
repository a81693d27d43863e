//go:build !unit

package sbpeertest_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/azcore"
	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"
	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus/admin"

	"github.com/aqfleet/aq/demo/sbpeer/sbpeertest"
)

// The peer itself, driven by the real SDK: routing, settle outcomes, the DLQ
// with its reason, duplicate detection, peek, refused links, persistence.
func TestPeerWithSDK(t *testing.T) {
	p := sbpeertest.Start(t, sbpeertest.Options{
		Subs:    []string{"fleet-dispatch/fa", "fleet-dispatch/fb"},
		Persist: true,
	})
	ctx := context.Background()
	c, err := azservicebus.NewClientFromConnectionString(p.ConnectionString(), &azservicebus.ClientOptions{RetryOptions: azservicebus.RetryOptions{MaxRetries: 3, RetryDelay: 10 * time.Millisecond, MaxRetryDelay: 100 * time.Millisecond}})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(ctx)
	snd, err := c.NewSender("fleet-dispatch", nil)
	if err != nil {
		t.Fatal(err)
	}
	send := func(id, target string) {
		t.Helper()
		err := snd.SendMessage(ctx, &azservicebus.Message{
			MessageID:             &id,
			Body:                  []byte(`{"jobId":"` + id + `"}`),
			ApplicationProperties: map[string]any{"targetFactoryId": target},
		}, nil)
		if err != nil {
			t.Fatal(err)
		}
	}
	send("j1", "fa")
	send("j1", "fa") // duplicate: collapsed
	send("j2", "fb")
	send("j3", "fa")

	rcv, err := c.NewReceiverForSubscription("fleet-dispatch", "fa", nil)
	if err != nil {
		t.Fatal(err)
	}
	peeked, err := rcv.PeekMessages(ctx, 10, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(peeked) != 2 {
		t.Fatalf("peeked %d messages on fa, want 2 (j1, j3)", len(peeked))
	}
	msgs := receive(t, rcv, 2)
	if msgs[0].MessageID != "j1" || msgs[1].MessageID != "j3" {
		t.Fatalf("got %s, %s; want j1, j3", msgs[0].MessageID, msgs[1].MessageID)
	}
	if msgs[0].DeliveryCount != 1 || msgs[0].SequenceNumber == nil || msgs[0].EnqueuedTime == nil || msgs[0].LockedUntil == nil {
		t.Fatalf("system properties missing: %+v", msgs[0])
	}
	if err := rcv.CompleteMessage(ctx, msgs[0], nil); err != nil {
		t.Fatal(err)
	}
	if err := rcv.AbandonMessage(ctx, msgs[1], nil); err != nil {
		t.Fatal(err)
	}
	again := receive(t, rcv, 1)[0]
	if again.MessageID != "j3" || again.DeliveryCount != 2 {
		t.Fatalf("redelivery: got %s count %d, want j3 count 2", again.MessageID, again.DeliveryCount)
	}
	reason := "BadBody"
	if err := rcv.DeadLetterMessage(ctx, again, &azservicebus.DeadLetterOptions{Reason: &reason, ErrorDescription: ptr("not json")}); err != nil {
		t.Fatal(err)
	}
	dlq, err := c.NewReceiverForSubscription("fleet-dispatch", "fa", &azservicebus.ReceiverOptions{SubQueue: azservicebus.SubQueueDeadLetter})
	if err != nil {
		t.Fatal(err)
	}
	dl := receive(t, dlq, 1)[0]
	if dl.MessageID != "j3" || dl.DeadLetterReason == nil || *dl.DeadLetterReason != "BadBody" || *dl.DeadLetterErrorDescription != "not json" {
		t.Fatalf("dead letter: %+v", dl)
	}

	// Not modelled management operations answer with an error.
	if err := rcv.RenewMessageLock(ctx, dl, nil); err == nil {
		t.Fatal("renew-lock succeeded against a peer that does not model it")
	}
	// Sending to a subscription is refused.
	if bad, err := c.NewSender("fleet-dispatch/Subscriptions/fa", nil); err == nil {
		if err := bad.SendMessage(ctx, &azservicebus.Message{Body: []byte("x")}, nil); err == nil {
			t.Fatal("sending to a subscription succeeded")
		}
	}

	// Restart with persistence: fb's message is still there.
	if err := p.Restart(); err != nil {
		t.Fatal(err)
	}
	rfb, err := c.NewReceiverForSubscription("fleet-dispatch", "fb", nil)
	if err != nil {
		t.Fatal(err)
	}
	if m := receive(t, rfb, 1)[0]; m.MessageID != "j2" {
		t.Fatalf("after restart got %s, want j2", m.MessageID)
	}

	evs, err := p.Events()
	if err != nil {
		t.Fatal(err)
	}
	count := func(kind string) int {
		return len(sbpeertest.Filter(evs, func(e sbpeertest.Event) bool { return e.Event == kind }))
	}
	if count("duplicate") != 1 || count("send") != 3 || count("dead-letter") != 1 {
		t.Fatalf("events: duplicate %d send %d dead-letter %d; want 1 3 1", count("duplicate"), count("send"), count("dead-letter"))
	}
	if n := count("internal-error"); n != 0 {
		t.Fatalf("%d internal errors in the peer: %+v", n, evs)
	}
	if len(sbpeertest.Filter(evs, func(e sbpeertest.Event) bool { return e.Event == "management" && e.Status == 501 })) == 0 {
		t.Fatal("no management event answered 501")
	}
}

func receive(t *testing.T, r *azservicebus.Receiver, n int) []*azservicebus.ReceivedMessage {
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

func ptr[T any](v T) *T { return &v }

// The peer answers the management API's read of a subscription's runtime
// properties — what KEDA's azure-servicebus scaler reads — through the
// SDK's own admin client: active and dead-letter counts follow the messages,
// a locked message counts until it is completed, an unknown subscription is
// not found.
func TestPeerAdminRuntimeProperties(t *testing.T) {
	p := sbpeertest.Start(t, sbpeertest.Options{Subs: []string{"fleet-dispatch/pool"}, Admin: true})
	ctx := context.Background()
	ac, err := admin.NewClientFromConnectionString(p.AdminConnectionString(), &admin.ClientOptions{ClientOptions: azcore.ClientOptions{Transport: p.AdminHTTPClient()}})
	if err != nil {
		t.Fatal(err)
	}
	counts := func() (active, dead int32) {
		t.Helper()
		rp, err := ac.GetSubscriptionRuntimeProperties(ctx, "fleet-dispatch", "pool", nil)
		if err != nil || rp == nil {
			t.Fatalf("runtime properties: %v (%v)", rp, err)
		}
		return rp.ActiveMessageCount, rp.DeadLetterMessageCount
	}
	if a, d := counts(); a != 0 || d != 0 {
		t.Fatalf("empty subscription: active %d dead %d", a, d)
	}
	c, err := azservicebus.NewClientFromConnectionString(p.ConnectionString(), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(ctx)
	snd, err := c.NewSender("fleet-dispatch", nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{"a", "b", "c"} {
		if err := snd.SendMessage(ctx, &azservicebus.Message{MessageID: &id, Body: []byte("{}"), ApplicationProperties: map[string]any{"targetFactoryId": "pool"}}, nil); err != nil {
			t.Fatal(err)
		}
	}
	if a, _ := counts(); a != 3 {
		t.Fatalf("active %d, want 3", a)
	}
	rcv, err := c.NewReceiverForSubscription("fleet-dispatch", "pool", nil)
	if err != nil {
		t.Fatal(err)
	}
	msgs := receive(t, rcv, 2)
	if a, _ := counts(); a != 3 {
		t.Fatalf("active %d with two locked, want 3 (locked messages are active)", a)
	}
	if err := rcv.CompleteMessage(ctx, msgs[0], nil); err != nil {
		t.Fatal(err)
	}
	if err := rcv.DeadLetterMessage(ctx, msgs[1], nil); err != nil {
		t.Fatal(err)
	}
	if a, d := counts(); a != 1 || d != 1 {
		t.Fatalf("after a complete and a dead-letter: active %d dead %d, want 1 and 1", a, d)
	}
	if rp, err := ac.GetSubscriptionRuntimeProperties(ctx, "fleet-dispatch", "nope", nil); err != nil || rp != nil {
		t.Fatalf("an unknown subscription: %+v, %v; want not found (nil, nil)", rp, err)
	}
	// A key without Manage rights is refused (401), as the service refuses it.
	lc, err := admin.NewClientFromConnectionString(p.AdminConnectionStringFor("listen"), &admin.ClientOptions{ClientOptions: azcore.ClientOptions{Transport: p.AdminHTTPClient()}})
	if err != nil {
		t.Fatal(err)
	}
	_, err = lc.GetSubscriptionRuntimeProperties(ctx, "fleet-dispatch", "pool", nil)
	var re *azcore.ResponseError
	if !errors.As(err, &re) || re.StatusCode != 401 {
		t.Fatalf("a Listen-only key: %v; want a 401", err)
	}
}
