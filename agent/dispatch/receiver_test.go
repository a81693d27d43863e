package dispatch_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/azcore"
	"github.com/Azure/azure-sdk-for-go/sdk/azcore/policy"
	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"

	"github.com/aqfleet/aq/agent/dispatch"
	"github.com/aqfleet/aq/demo/sbpeer/sbpeertest"
)

// A message is accepted, handed over with the message's fields and the
// dispatch lag, and completed at once: while the job runs (complete-on-claim;
// the job does not wait for the settlement, see
// TestAcceptedJobStartsBeforeItsMessageIsSettled).
func TestAcceptThenComplete(t *testing.T) {
	onOff(t, func(t *testing.T, sessions bool) {
		r := newRig(t, rigOptions{blockJobs: true, sessions: sessions})
		r.publish(job("j1", "fa"))
		got := r.nextJob()
		r.waitEvent(disposition("j1", "complete")) // the job is still running: it waits on r.release
		if evs := r.events(); count(evs, disposition("j1", "complete")) != 1 {
			t.Fatalf("the message was not completed once:\n%s", dump(evs))
		}
		r.release <- struct{}{}
		want := job("j1", "fa")
		m := got.Message
		if m.JobID != want.JobID || m.Repo != want.Repo || m.ProductID != want.ProductID || m.Priority != 5 ||
			strings.Join(m.Caps, " ") != "os:linux engine:script" || m.TargetFactoryID != "fa" {
			t.Fatalf("message = %+v, want %+v", m, want)
		}
		if got.Claim.Job.ID != "j1" || got.Claim.LeaseEpoch != 1 || got.DeliveryCount != 1 || got.EnqueuedTime.IsZero() || got.Lag <= 0 {
			t.Fatalf("accepted = %+v", got)
		}
		if r.metrics.get(dispatch.OutcomeAccepted) != 1 || len(r.metrics.lags) != 1 {
			t.Fatalf("metrics: %+v", r.metrics.outcomes)
		}
		// The body's fields are application properties too (the routing key among them).
		send := r.waitEvent(isEvent("send", "j1"))
		if send.App["targetFactoryId"] != "fa" || send.App["repo"] != "repo-j1" || send.App["jobId"] != "j1" {
			t.Fatalf("application properties: %v", send.App)
		}
	})
}

// The broker routes by the subscription's correlation filter: a message for
// factory fb never reaches fa. A subscription whose rules let everything in
// (a left-over $Default TrueFilter) does get it — and dead-letters it.
func TestRoutingAndMistargeted(t *testing.T) {
	r := newRig(t, rigOptions{peer: sbpeertest.Options{Subs: []string{topic + "/fa", topic + "/fb", topic + "/fc=*"}}})
	fc := newReceiverOn(t, r, "fc")

	r.publish(job("for-b", "fb"))
	r.publish(job("for-a", "fa"))
	if got := r.nextJob(); got.Message.JobID != "for-a" {
		t.Fatalf("fa got %s first, want for-a", got.Message.JobID)
	}
	evs := r.events()
	send := r.waitEvent(isEvent("send", "for-b"))
	for _, q := range send.RoutedTo {
		if strings.HasSuffix(q, "/fa") {
			t.Fatalf("for-b was routed to fa: %v", send.RoutedTo)
		}
	}
	if n := count(evs, func(e sbpeertest.Event) bool {
		return e.Event == "deliver" && e.MessageID == "for-b" && strings.HasSuffix(e.Queue, "/fa")
	}); n != 0 {
		t.Fatalf("for-b was delivered to fa %d times", n)
	}
	if r.acc.Calls("for-b") != 0 {
		t.Fatal("fa asked the coordinator for fb's job")
	}

	// fc's match-all subscription got both; it dead-letters them without asking the coordinator.
	dl := r.waitEvent(func(e sbpeertest.Event) bool {
		return e.Event == "dead-letter" && e.MessageID == "for-b" && strings.HasSuffix(e.Queue, "/fc")
	})
	if dl.Reason != dispatch.ReasonMistargeted || !strings.Contains(dl.Description, `targetFactoryId is "fb", this factory is "fc"`) {
		t.Fatalf("dead-letter: %+v", dl)
	}
	if fc.acc.Calls("for-b") != 0 || fc.acc.Calls("for-a") != 0 {
		t.Fatal("fc asked the coordinator for a job that is not its own")
	}
	m := receiveDLQ(t, r.client, "fc", "for-b")
	if m.DeadLetterReason == nil || *m.DeadLetterReason != dispatch.ReasonMistargeted {
		t.Fatalf("DLQ message reason: %v", m.DeadLetterReason)
	}
}

// 409: the job is owned elsewhere — completed, never redelivered.
func TestConflictCompletes(t *testing.T) {
	onOff(t, func(t *testing.T, sessions bool) {
		r := newRig(t, rigOptions{sessions: sessions})
		r.acc.script["j1"] = []error{statusErr{409}}
		r.acc.script["j2"] = []error{statusErr{404}}
		r.publish(job("j1", "fa"))
		r.publish(job("j2", "fa"))
		r.publish(job("j3", "fa"))
		if got := r.nextJob(); got.Message.JobID != "j3" {
			t.Fatalf("handler got %s, want j3", got.Message.JobID)
		}
		r.barrier("1")
		evs := r.events()
		for _, id := range []string{"j1", "j2"} {
			if count(evs, disposition(id, "complete")) != 1 || count(evs, isEvent("deliver", id)) != 1 || count(evs, isEvent("redelivery", id)) != 0 {
				t.Fatalf("%s: want one delivery, completed, no redelivery:\n%s", id, dump(evs))
			}
			if r.acc.Calls(id) != 1 {
				t.Fatalf("%s: %d accept calls, want 1", id, r.acc.Calls(id))
			}
		}
		if r.metrics.get(dispatch.OutcomeConflict) != 1 || r.metrics.get(dispatch.OutcomeGone) != 1 {
			t.Fatalf("metrics: %+v", r.metrics.outcomes)
		}
	})
}

// 503: abandoned, redelivered at once with delivery count 2, then accepted.
func TestUnavailableAbandonsThenAccepts(t *testing.T) {
	onOff(t, func(t *testing.T, sessions bool) {
		r := newRig(t, rigOptions{sessions: sessions})
		r.acc.script["j1"] = []error{statusErr{503}}
		r.publish(job("j1", "fa"))
		got := r.nextJob()
		if got.Message.JobID != "j1" || got.DeliveryCount != 2 {
			t.Fatalf("got %s delivery %d, want j1 delivery 2", got.Message.JobID, got.DeliveryCount)
		}
		r.waitEvent(disposition("j1", "complete")) // completed beside the running job
		evs := r.events()
		if count(evs, disposition("j1", "abandon")) != 1 || count(evs, disposition("j1", "complete")) != 1 ||
			count(evs, func(e sbpeertest.Event) bool {
				return e.Event == "redelivery" && e.MessageID == "j1" && e.Reason == "abandoned"
			}) != 1 {
			t.Fatalf("want abandon, redelivery, complete:\n%s", dump(evs))
		}
		if r.acc.Calls("j1") != 2 || r.metrics.get(dispatch.OutcomeAbandoned) != 1 || r.metrics.get(dispatch.OutcomeAccepted) != 1 {
			t.Fatalf("calls %d, metrics %+v", r.acc.Calls("j1"), r.metrics.outcomes)
		}
	})
}

// A body that is not a dispatch message, or whose routing properties
// disagree with it, is dead-lettered with a reason; the coordinator is never
// asked. A MessageID that is not the job's (a dispatcher that leaves it to
// the SDK) does not stop the job: the body's jobId is accepted and run.
func TestGarbageBodyDeadLetters(t *testing.T) {
	onOff(t, func(t *testing.T, sessions bool) {
		r := newRig(t, rigOptions{sessions: sessions})
		r.publishRaw("g1", []byte("this is not json"), map[string]any{"targetFactoryId": "fa"})
		r.publishRaw("g3", []byte(`{"jobId":"j3","targetFactoryId":"fa"}`), map[string]any{"targetFactoryId": "fa", "jobId": "j4"})
		r.publishRaw("g2", []byte(`{"jobId":"other","targetFactoryId":"fa"}`), map[string]any{"targetFactoryId": "fa"})
		if got := r.nextJob(); got.Message.JobID != "other" {
			t.Fatalf("the job of message g2 = %+v, want other (the body's jobId)", got)
		}
		evs := r.events()
		for id, want := range map[string]string{"g1": "body is not a dispatch message", "g3": `application property jobId "j4" disagrees`} {
			dl := sbpeertest.Filter(evs, isEvent("dead-letter", id))
			if len(dl) != 1 || dl[0].Reason != dispatch.ReasonMalformed || !strings.Contains(dl[0].Description, want) {
				t.Fatalf("%s: dead-letter events %+v, want reason %s with %q", id, dl, dispatch.ReasonMalformed, want)
			}
		}
		if r.acc.Calls("other") != 1 || r.acc.Calls("j3") != 0 || r.metrics.get(dispatch.OutcomeMalformed) != 2 {
			t.Fatalf("calls other %d j3 %d, metrics %+v", r.acc.Calls("other"), r.acc.Calls("j3"), r.metrics.outcomes)
		}
		m := receiveDLQ(t, r.client, "fa", "g1")
		if m.DeadLetterErrorDescription == nil || !strings.Contains(*m.DeadLetterErrorDescription, "body is not a dispatch message") {
			t.Fatalf("DLQ description: %v", m.DeadLetterErrorDescription)
		}
	})
}

// The coordinator publishes the same job twice (e.g. after a restart): the
// broker's duplicate detection on MessageID collapses it — one run.
func TestDuplicatePublishRunsOnce(t *testing.T) {
	r := newRig(t, rigOptions{})
	r.publish(job("j1", "fa"))
	r.publish(job("j1", "fa"))
	if got := r.nextJob(); got.Message.JobID != "j1" {
		t.Fatalf("got %s", got.Message.JobID)
	}
	r.publish(job("j1", "fa")) // after the first was completed, still inside the window
	r.publish(job("j2", "fa"))
	if got := r.nextJob(); got.Message.JobID != "j2" {
		t.Fatalf("got %s, want j2 (j1 ran twice)", got.Message.JobID)
	}
	evs := r.events()
	if n := count(evs, isEvent("duplicate", "j1")); n != 2 {
		t.Fatalf("%d duplicates logged, want 2", n)
	}
	if r.acc.Calls("j1") != 1 || count(evs, isEvent("deliver", "j1")) != 1 {
		t.Fatalf("j1: %d accepts, %d deliveries; want 1, 1", r.acc.Calls("j1"), count(evs, isEvent("deliver", "j1")))
	}
}

// A message whose lock expires while aq still holds it is redelivered with
// delivery count + 1; the late settlement of the first copy fails (lock lost)
// and is counted, and the job runs once.
func TestLockExpiryRedelivers(t *testing.T) {
	r := newRig(t, rigOptions{slots: 2, peer: sbpeertest.Options{LockDuration: 300 * time.Millisecond}})
	hold := make(chan struct{})
	r.acc.block["j1"] = hold
	r.acc.script["j1"] = []error{statusErr{503}}
	r.publish(job("j1", "fa"))
	r.waitEvent(func(e sbpeertest.Event) bool {
		return e.Event == "redelivery" && e.MessageID == "j1" && e.Reason == "lock-expired"
	})
	got := r.nextJob() // the second copy, on the second slot
	if got.Message.JobID != "j1" || got.DeliveryCount != 2 {
		t.Fatalf("got %s delivery %d, want j1 delivery 2", got.Message.JobID, got.DeliveryCount)
	}
	close(hold) // the first copy's accept now answers 503: its abandon finds the lock gone
	for o := range r.metrics.seen {
		if o == dispatch.OutcomeAbandoned {
			break
		}
	}
	r.waitEvent(func(e sbpeertest.Event) bool {
		return e.Event == "disposition" && e.MessageID == "j1" && e.Outcome == "abandon" && e.Result == "lock-lost"
	})
	// The peer logs the refusal before the SDK hands the error back: the
	// receiver counts the failed settlement a moment later (this read raced
	// it under load). Bounded by the test binary's -timeout only.
	failed := 0
	for failed == 0 {
		r.metrics.mu.Lock()
		failed = r.metrics.failed[dispatch.Abandon]
		r.metrics.mu.Unlock()
		time.Sleep(5 * time.Millisecond)
	}
	r.barrier("after-abandon") // anything more would have been counted by now
	r.metrics.mu.Lock()
	failed = r.metrics.failed[dispatch.Abandon]
	r.metrics.mu.Unlock()
	if failed != 1 {
		t.Fatalf("settle failures %d, want 1", failed)
	}
}

// After the subscription's max delivery count, a message that keeps being
// abandoned moves to the dead-letter queue with the broker's reason.
func TestMaxDeliveriesDeadLetters(t *testing.T) {
	onOff(t, func(t *testing.T, sessions bool) {
		r := newRig(t, rigOptions{peer: sbpeertest.Options{MaxDelivery: 3}, sessions: sessions})
		r.acc.script["j1"] = []error{statusErr{503}, statusErr{502}, statusErr{500}, nil}
		r.publish(job("j1", "fa"))
		dl := r.waitEvent(isEvent("dead-letter", "j1"))
		if dl.Reason != "MaxDeliveryCountExceeded" || dl.DeliveryCount != 3 {
			t.Fatalf("dead-letter: %+v", dl)
		}
		r.publish(job("j2", "fa"))
		if got := r.nextJob(); got.Message.JobID != "j2" {
			t.Fatalf("got %s, want j2", got.Message.JobID)
		}
		if r.acc.Calls("j1") != 3 || r.metrics.get(dispatch.OutcomeAbandoned) != 3 {
			t.Fatalf("accept calls %d, abandoned %d; want 3, 3", r.acc.Calls("j1"), r.metrics.get(dispatch.OutcomeAbandoned))
		}
		m := receiveDLQ(t, r.client, "fa", "j1")
		if m.DeadLetterReason == nil || *m.DeadLetterReason != "MaxDeliveryCountExceeded" {
			t.Fatalf("DLQ reason %v", m.DeadLetterReason)
		}
	})
}

// The broker goes away: the receiver reports unhealthy (the daemon polls
// meanwhile) while a job it started keeps running; the broker comes back: the
// receiver reports healthy and receives again.
//
// The peer logs j1's complete before it answers it, so the kill can cut the
// answer off; the SDK then retries the complete on its own schedule (4 s,
// 8 s, 16 s) until SettleTimeout, and the receiver reconnects only once the
// settlements in its hand have ended. That wait is not what this test is
// about: SettleTimeout is 2 s here (30 s by default: the test took 30 s
// whenever the kill won the race).
func TestPeerKilledThenRestarted(t *testing.T) {
	onOff(t, func(t *testing.T, sessions bool) {
		r := newRig(t, rigOptions{slots: 2, blockJobs: true, peer: sbpeertest.Options{Persist: true}, sessions: sessions,
			mutate: func(o *dispatch.Options) { o.SettleTimeout = 2 * time.Second }})
		r.waitHealth(true)
		r.publish(job("j1", "fa"))
		running := r.nextJob()
		r.waitEvent(disposition("j1", "complete")) // settled while the job runs

		r.peer.Kill()
		h := r.waitHealth(false)
		if h.Err == nil {
			t.Fatal("unhealthy without a reason")
		}
		if r.recv.Healthy() {
			t.Fatal("Healthy() is true while the peer is down")
		}
		r.release <- struct{}{} // the running job is not touched by the outage and finishes
		_ = running

		if err := r.peer.Restart(); err != nil {
			t.Fatal(err)
		}
		r.waitHealth(true)
		r.publish(job("j2", "fa"))
		got := r.nextJob()
		if got.Message.JobID == "j1" {
			// The kill cut the peer off between logging j1's complete and
			// keeping it (Persist): the broker delivers j1 again, at least
			// once as Service Bus does, and the coordinator's accept is what
			// dedups it. Once, then j2.
			r.release <- struct{}{}
			got = r.nextJob()
		}
		if got.Message.JobID != "j2" {
			t.Fatalf("got %s, want j2:\n%s", got.Message.JobID, dump(r.events()))
		}
		r.release <- struct{}{}
	})
}

// The managed-identity path: a token credential, jwt put-tokens over TLS.
// The peer sees the credential's token (by hash) for the entity and its
// $management node; the message flows end to end.
func TestTokenCredentialOverTLS(t *testing.T) {
	cred := &fakeCredential{token: "fake-jwt-for-aq-tests"}
	r := newRig(t, rigOptions{peer: sbpeertest.Options{TLS: true}, cred: cred})
	r.publish(job("j1", "fa"))
	if got := r.nextJob(); got.Message.JobID != "j1" {
		t.Fatalf("got %s", got.Message.JobID)
	}
	evs := r.events()
	tokens := sbpeertest.Filter(evs, func(e sbpeertest.Event) bool { return e.Event == "put-token" })
	paths := map[string]bool{}
	for _, e := range tokens {
		if e.Type != "jwt" || e.TokenHash != sbpeertest.TokenHash(cred.token) || e.Status != 202 {
			t.Fatalf("put-token %+v: want a jwt with the credential's token", e)
		}
		paths[e.Path] = true
	}
	for _, p := range []string{"fleet-dispatch/subscriptions/fa", "fleet-dispatch/subscriptions/fa/$management", "fleet-dispatch"} {
		if !paths[p] {
			t.Fatalf("no put-token for %s: %v", p, paths)
		}
	}
	for _, s := range cred.Scopes() {
		if s != "https://servicebus.azure.net//.default" {
			t.Fatalf("credential asked for scope %q", s)
		}
	}
}

// No free slot: no message is taken (no credit, no delivery). With two slots
// and two running jobs, a third message waits in the broker until a job ends.
func TestBackpressure(t *testing.T) {
	onOff(t, func(t *testing.T, sessions bool) {
		r := newRig(t, rigOptions{slots: 2, blockJobs: true, sessions: sessions})
		r.waitHealth(true)
		r.publish(job("j1", "fa"))
		r.publish(job("j2", "fa"))
		r.publish(job("j3", "fa"))
		a, b := r.nextJob(), r.nextJob()
		if a.Message.JobID != "j1" || b.Message.JobID != "j2" {
			t.Fatalf("got %s, %s; want j1, j2", a.Message.JobID, b.Message.JobID)
		}
		r.barrier("full")
		if n := count(r.events(), isEvent("deliver", "j3")); n != 0 {
			t.Fatalf("j3 was delivered %d times while no slot was free", n)
		}
		if r.slots.Free() != 0 {
			t.Fatalf("%d free slots, want 0", r.slots.Free())
		}
		r.release <- struct{}{} // j1 ends
		if got := r.nextJob(); got.Message.JobID != "j3" {
			t.Fatalf("got %s, want j3", got.Message.JobID)
		}
		r.release <- struct{}{}
		r.release <- struct{}{}
	})
}

// Not a single slot from the start: the receiver connects but takes nothing.
func TestNoFreeSlotTakesNothing(t *testing.T) {
	onOff(t, func(t *testing.T, sessions bool) {
		r := newRig(t, rigOptions{noStart: true, sessions: sessions})
		if !r.slots.TryAcquire() {
			t.Fatal("could not take the only slot")
		}
		r.start()
		r.waitHealth(true)
		r.publish(job("j1", "fa"))
		r.barrier("none")
		evs := r.events()
		if n := count(evs, func(e sbpeertest.Event) bool { return e.Event == "deliver" }); n != 0 {
			t.Fatalf("%d deliveries with no free slot:\n%s", n, dump(evs))
		}
		r.slots.Release()
		if got := r.nextJob(); got.Message.JobID != "j1" {
			t.Fatalf("got %s", got.Message.JobID)
		}
	})
}

// The connection string never shows in health errors or logs.
func TestSecretsStayOut(t *testing.T) {
	const key = "c3VwZXItc2VjcmV0LWtleS1mb3ItYXEtdGVzdHM="
	cs := "Endpoint=sb://127.0.0.1:1;SharedAccessKeyName=k;SharedAccessKey=" + key + ";UseDevelopmentEmulator=true"
	var mu sync.Mutex
	var reports []dispatch.Health
	got := make(chan struct{}, 1) // health is reported once per change: keep it
	recv, err := dispatch.New(dispatch.Options{
		Config:   dispatch.Config{FactoryID: "fa", ConnectionString: cs},
		Acceptor: newAcceptor(),
		Handler:  func(context.Context, dispatch.Accepted) {},
		Slots:    dispatch.NewSemaphore(1),
		Backoff:  dispatch.Backoff{Initial: time.Millisecond, Max: 5 * time.Millisecond},
		SDKRetry: &azservicebus.RetryOptions{MaxRetries: -1},
		OnHealth: func(h dispatch.Health) {
			mu.Lock()
			reports = append(reports, h)
			mu.Unlock()
			if !h.Healthy {
				select {
				case got <- struct{}{}:
				default:
				}
			}
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = recv.Run(ctx) }()
	<-got
	cancel()
	<-done
	mu.Lock()
	defer mu.Unlock()
	for _, h := range reports {
		if h.Err != nil && (strings.Contains(h.Err.Error(), key) || strings.Contains(h.Err.Error(), "SharedAccessKey=")) {
			t.Fatalf("health error leaks the key: %v", h.Err)
		}
	}

	_, err = dispatch.New(dispatch.Options{
		Config:   dispatch.Config{FactoryID: "fa", ConnectionString: strings.Replace(cs, "127.0.0.1:1", "sb.example.net", 1)},
		Acceptor: newAcceptor(), Handler: func(context.Context, dispatch.Accepted) {}, Slots: dispatch.NewSemaphore(1),
	})
	if err == nil || strings.Contains(err.Error(), key) || !strings.Contains(err.Error(), "not loopback") {
		t.Fatalf("emulator flag towards a remote host: err = %v", err)
	}
}

// newReceiverOn runs a second factory's receiver against r's peer.
func newReceiverOn(t *testing.T, r *rig, factory string) *rig {
	t.Helper()
	o := &rig{t: t, peer: r.peer, acc: newAcceptor(), metrics: newCounts(), slots: dispatch.NewSemaphore(1),
		jobs: make(chan dispatch.Accepted, 100), health: make(chan dispatch.Health, 100)}
	recv, err := dispatch.New(dispatch.Options{
		Config:   dispatch.Config{FactoryID: factory, ConnectionString: r.peer.ConnectionString(), Topic: topic},
		Acceptor: o.acc,
		Handler:  func(ctx context.Context, a dispatch.Accepted) { o.jobs <- a },
		Slots:    o.slots,
		Metrics:  o.metrics,
	})
	if err != nil {
		t.Fatal(err)
	}
	o.recv = recv
	o.start()
	return o
}

func receiveDLQ(t *testing.T, c *azservicebus.Client, sub, id string) *azservicebus.ReceivedMessage {
	t.Helper()
	rcv, err := c.NewReceiverForSubscription(topic, sub, &azservicebus.ReceiverOptions{SubQueue: azservicebus.SubQueueDeadLetter})
	if err != nil {
		t.Fatal(err)
	}
	defer rcv.Close(context.Background())
	for {
		ms, err := rcv.ReceiveMessages(context.Background(), 1, nil)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range ms {
			if m.MessageID == id {
				return m
			}
		}
	}
}

type fakeCredential struct {
	token  string
	mu     sync.Mutex
	scopes []string
}

func (c *fakeCredential) GetToken(ctx context.Context, o policy.TokenRequestOptions) (azcore.AccessToken, error) {
	c.mu.Lock()
	c.scopes = append(c.scopes, o.Scopes...)
	c.mu.Unlock()
	return azcore.AccessToken{Token: c.token, ExpiresOn: time.Now().Add(time.Hour)}, nil
}

func (c *fakeCredential) Scopes() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]string(nil), c.scopes...)
}

// A subscription that does not exist is a deployment mistake, not an outage:
// the broker link reports unhealthy with an error that names the
// subscription and how to create it, and says it is missing (IsMissing).
func TestMissingSubscription(t *testing.T) {
	onOff(t, func(t *testing.T, sessions bool) { testMissingSubscription(t, sessions) })
}

func testMissingSubscription(t *testing.T, sessions bool) {
	r := newRig(t, rigOptions{factory: "nosuch", mutate: func(o *dispatch.Options) { o.Pool, o.Sessions = "builders", sessions }})
	// The first report may be a dropped connection; the receiver reports
	// again once the broker has said the subscription is not there.
	var h dispatch.Health
	for deadline := time.After(time.Minute); ; {
		select {
		case h = <-r.health:
		case <-deadline:
			t.Fatalf("no report of a missing subscription in a minute; last: %+v", h)
		}
		if h.Healthy {
			t.Fatalf("healthy on a subscription that does not exist")
		}
		if dispatch.IsMissingSubscription(h.Err) {
			break
		}
	}
	var me *dispatch.MissingSubscriptionError
	if !errors.As(h.Err, &me) || !dispatch.IsMissingSubscription(h.Err) {
		t.Fatalf("health error %v (%T) is not a missing subscription", h.Err, h.Err)
	}
	for _, want := range []string{"fleet-dispatch/builders", "does not exist", "aq servicebus ensure-subscription --pool builders"} {
		if !strings.Contains(h.Err.Error(), want) {
			t.Errorf("error %q lacks %q", h.Err, want)
		}
	}
	if dispatch.IsMissingSubscription(errors.New("connection refused")) {
		t.Errorf("any error is a missing subscription")
	}
}
