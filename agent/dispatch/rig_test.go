package dispatch_test

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/azcore"
	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"

	"github.com/aqfleet/aq/agent/claim"
	"github.com/aqfleet/aq/agent/dispatch"
	"github.com/aqfleet/aq/demo/sbpeer/sbpeertest"
)

const topic = "fleet-dispatch"

// statusErr is how a fleet client's error looks to dispatch: it answers the
// predicates of the Acceptor contract.
type statusErr struct{ code int }

func (e statusErr) Error() string   { return fmt.Sprintf("coordinator answered %d", e.code) }
func (e statusErr) Conflict() bool  { return e.code == 409 }
func (e statusErr) Gone() bool      { return e.code == 404 }
func (e statusErr) Temporary() bool { return e.code >= 500 || e.code == 429 }

// acceptor answers per job from a script of errors (nil = accepted); when a
// job's script is used up it accepts. block, if set, is waited on by the
// first call for that job.
type acceptor struct {
	mu     sync.Mutex
	script map[string][]error
	block  map[string]chan struct{}
	calls  map[string]int
}

func newAcceptor() *acceptor {
	return &acceptor{script: map[string][]error{}, block: map[string]chan struct{}{}, calls: map[string]int{}}
}

func (a *acceptor) Accept(ctx context.Context, jobID string) (dispatch.Accepted, error) {
	a.mu.Lock()
	a.calls[jobID]++
	n := a.calls[jobID]
	var err error
	if s := a.script[jobID]; len(s) > 0 {
		err, a.script[jobID] = s[0], s[1:]
	}
	block := a.block[jobID]
	a.mu.Unlock()
	if block != nil && n == 1 {
		<-block
	}
	if err != nil {
		return dispatch.Accepted{}, err
	}
	return dispatch.Accepted{Claim: &claim.Claim{Job: claim.Job{ID: jobID}, LeaseEpoch: int64(n)}}, nil
}

func (a *acceptor) Calls(jobID string) int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.calls[jobID]
}

// counts is a Metrics that counts.
type counts struct {
	mu       sync.Mutex
	outcomes map[dispatch.Outcome]int
	failed   map[dispatch.Settlement]int
	lags     []time.Duration
	seen     chan dispatch.Outcome
}

func newCounts() *counts {
	return &counts{outcomes: map[dispatch.Outcome]int{}, failed: map[dispatch.Settlement]int{}, seen: make(chan dispatch.Outcome, 100)}
}

func (c *counts) Message(o dispatch.Outcome) {
	c.mu.Lock()
	c.outcomes[o]++
	c.mu.Unlock()
	c.seen <- o
}

func (c *counts) SettleFailed(s dispatch.Settlement) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.failed[s]++
}

func (c *counts) Lag(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.lags = append(c.lags, d)
}

func (c *counts) get(o dispatch.Outcome) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.outcomes[o]
}

// rig is one peer, one publisher and one receiver for a factory.
type rig struct {
	t       testing.TB
	peer    *sbpeertest.Peer
	client  *azservicebus.Client
	sender  *azservicebus.Sender
	acc     *acceptor
	metrics *counts
	slots   *dispatch.Semaphore
	jobs    chan dispatch.Accepted
	health  chan dispatch.Health
	release chan struct{} // when non-nil, every Handler waits on it
	recv    *dispatch.Receiver
	cancel  context.CancelFunc
	done    chan struct{}
	// sessions: the factory's subscription requires sessions, the receiver
	// has them on, and publish sets SessionId = repo.
	sessions bool
}

type rigOptions struct {
	peer      sbpeertest.Options
	factory   string
	slots     int
	blockJobs bool
	// cred, with peer.TLS, is the token credential of the publisher and the
	// receiver (the managed-identity path) instead of a connection string.
	cred azcore.TokenCredential
	// mutate adjusts the receiver's options before New.
	mutate func(*dispatch.Options)
	// noStart leaves the receiver for the test to start.
	noStart bool
	// sessions: the factory's subscription requires sessions and the
	// receiver receives with them (SessionIdle 100ms).
	sessions bool
}

func newRig(t testing.TB, o rigOptions) *rig {
	t.Helper()
	if o.factory == "" {
		o.factory = "fa"
	}
	if o.slots == 0 {
		o.slots = 1
	}
	if len(o.peer.Subs) == 0 {
		o.peer.Subs = []string{topic + "/fa", topic + "/fb"}
	}
	if o.sessions {
		o.peer.Sessions = append(o.peer.Sessions, topic+"/"+o.factory)
	}
	p := sbpeertest.Start(t, o.peer)
	r := &rig{
		t: t, peer: p, acc: newAcceptor(), metrics: newCounts(), sessions: o.sessions,
		slots:  dispatch.NewSemaphore(o.slots),
		jobs:   make(chan dispatch.Accepted, 100),
		health: make(chan dispatch.Health, 100),
	}
	if o.blockJobs {
		r.release = make(chan struct{}, 100)
	}
	co := &azservicebus.ClientOptions{
		RetryOptions: azservicebus.RetryOptions{MaxRetries: 3, RetryDelay: 10 * time.Millisecond, MaxRetryDelay: 100 * time.Millisecond},
	}
	var c *azservicebus.Client
	var err error
	if o.cred != nil {
		co.TLSConfig = p.TLSConfig()
		c, err = azservicebus.NewClient(p.Addr(), o.cred, co)
	} else {
		c, err = azservicebus.NewClientFromConnectionString(p.ConnectionString(), co)
	}
	if err != nil {
		t.Fatal(err)
	}
	r.client = c
	if r.sender, err = c.NewSender(topic, nil); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close(context.Background()) })
	release := r.release
	opts := dispatch.Options{
		Config: dispatch.Config{
			FactoryID:        o.factory,
			ConnectionString: p.ConnectionString(),
			Topic:            topic,
		},
		Acceptor: r.acc,
		Handler: func(ctx context.Context, a dispatch.Accepted) {
			r.jobs <- a
			if release != nil {
				<-release
			}
		},
		Slots:    r.slots,
		Metrics:  r.metrics,
		OnHealth: func(h dispatch.Health) { r.health <- h },
		Backoff:  dispatch.Backoff{Initial: 10 * time.Millisecond, Max: 200 * time.Millisecond},
		SDKRetry: &azservicebus.RetryOptions{MaxRetries: 1, RetryDelay: 10 * time.Millisecond, MaxRetryDelay: 50 * time.Millisecond},
	}
	if o.sessions {
		opts.Sessions = true
		opts.SessionIdle = 100 * time.Millisecond
	}
	if o.cred != nil {
		opts.ConnectionString = ""
		opts.Namespace = p.Addr()
		opts.Credential = o.cred
		opts.TLSConfig = p.TLSConfig()
	}
	if o.mutate != nil {
		o.mutate(&opts)
	}
	r.recv, err = dispatch.New(opts)
	if err != nil {
		t.Fatal(err)
	}
	if !o.noStart {
		r.start()
	}
	return r
}

func (r *rig) start() {
	ctx, cancel := context.WithCancel(context.Background())
	r.cancel, r.done = cancel, make(chan struct{})
	go func() {
		defer close(r.done)
		if err := r.recv.Run(ctx); err != nil {
			r.t.Errorf("Run: %v", err)
		}
	}()
	r.t.Cleanup(r.stop)
}

func (r *rig) stop() {
	if r.cancel == nil {
		return
	}
	r.cancel()
	if r.release != nil {
		close(r.release) // unblock running jobs: Run waits for them
	}
	<-r.done
	r.cancel = nil
}

// waitHealthy waits for the next health report and checks it.
func (r *rig) waitHealth(want bool) dispatch.Health {
	r.t.Helper()
	for h := range r.health {
		if h.Healthy == want {
			return h
		}
	}
	panic("unreachable")
}

func job(id, target string) dispatch.Message {
	return dispatch.Message{JobID: id, ProductID: "p1", Repo: "repo-" + id, Caps: []string{"os:linux", "engine:script"}, Priority: 5, TargetFactoryID: target}
}

func (r *rig) publish(m dispatch.Message) {
	r.t.Helper()
	sm, err := m.ServiceBusMessage(r.sessions)
	if err != nil {
		r.t.Fatal(err)
	}
	if err := r.sender.SendMessage(context.Background(), sm, nil); err != nil {
		r.t.Fatal(err)
	}
}

// publishRaw sends a message as given (with sessions on: in session "raw").
func (r *rig) publishRaw(id string, body []byte, props map[string]any) {
	r.t.Helper()
	m := &azservicebus.Message{MessageID: &id, Body: body, ApplicationProperties: props}
	if r.sessions {
		raw := "raw"
		m.SessionID = &raw
	}
	if err := r.sender.SendMessage(context.Background(), m, nil); err != nil {
		r.t.Fatal(err)
	}
}

// onOff runs test with sessions off, then on: the receiver's behaviour per
// message (the outcome table, back-pressure, outages) is the same both ways.
func onOff(t *testing.T, test func(t *testing.T, sessions bool)) {
	for _, sessions := range []bool{false, true} {
		name := "sessions=off"
		if sessions {
			name = "sessions=on"
		}
		t.Run(name, func(t *testing.T) { test(t, sessions) })
	}
}

// nextJob waits for the Handler's next job.
func (r *rig) nextJob() dispatch.Accepted {
	r.t.Helper()
	return <-r.jobs
}

// events reads the peer's log.
func (r *rig) events() []sbpeertest.Event {
	r.t.Helper()
	evs, err := r.peer.Events()
	if err != nil {
		r.t.Fatal(err)
	}
	for _, e := range evs {
		if e.Event == "internal-error" {
			r.t.Fatalf("the peer hit an internal error: %s", e.Error)
		}
	}
	return evs
}

// waitEvent polls the peer's log until match holds for some event. It bounds
// nothing by the clock: the test binary's -timeout is the only limit.
func (r *rig) waitEvent(match func(sbpeertest.Event) bool) sbpeertest.Event {
	r.t.Helper()
	for {
		for _, e := range r.events() {
			if match(e) {
				return e
			}
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// barrier waits until the peer has processed everything sent before it: a
// message published to the other factory's subscription (without sessions),
// then its send event.
// Events are logged in order, so anything the peer did for earlier messages
// is in the log by then.
func (r *rig) barrier(tag string) {
	r.t.Helper()
	id := "barrier-" + tag
	sm, err := job(id, "fb").ServiceBusMessage(false)
	if err != nil {
		r.t.Fatal(err)
	}
	if err := r.sender.SendMessage(context.Background(), sm, nil); err != nil {
		r.t.Fatal(err)
	}
	r.waitEvent(func(e sbpeertest.Event) bool { return e.Event == "send" && e.MessageID == id })
}

func count(evs []sbpeertest.Event, match func(sbpeertest.Event) bool) int {
	return len(sbpeertest.Filter(evs, match))
}

func isEvent(kind, id string) func(sbpeertest.Event) bool {
	return func(e sbpeertest.Event) bool { return e.Event == kind && e.MessageID == id }
}

func disposition(id, outcome string) func(sbpeertest.Event) bool {
	return func(e sbpeertest.Event) bool {
		return e.Event == "disposition" && e.MessageID == id && e.Outcome == outcome && e.Result == ""
	}
}

func dump(evs []sbpeertest.Event) string {
	b, _ := json.MarshalIndent(evs, "", " ")
	return string(b)
}
