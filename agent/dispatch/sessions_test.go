package dispatch_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"

	"github.com/aqfleet/aq/agent/dispatch"
	"github.com/aqfleet/aq/demo/sbpeer/sbpeertest"
	"github.com/aqfleet/aq/internal/aqerr"
)

// timeline records which jobs run, and fails the test the moment two jobs
// of one repo run at once.
type timeline struct {
	t       *testing.T
	mu      sync.Mutex
	running map[string]string // repo → job
	maxRun  int               // most jobs running at once, all repos
	now     int
	order   map[string][]string // repo → jobs in the order they started
	gate    map[string]chan struct{}
	started chan string
	sessEv  map[string]int
}

func newTimeline(t *testing.T) *timeline {
	return &timeline{t: t, running: map[string]string{}, order: map[string][]string{}, gate: map[string]chan struct{}{},
		started: make(chan string, 100), sessEv: map[string]int{}}
}

// gateOf is the channel job id's Handler waits on.
func (tl *timeline) gateOf(id string) chan struct{} {
	tl.mu.Lock()
	defer tl.mu.Unlock()
	g, ok := tl.gate[id]
	if !ok {
		g = make(chan struct{})
		tl.gate[id] = g
	}
	return g
}

// handler runs a job until its gate is closed.
func (tl *timeline) handler(ctx context.Context, a dispatch.Accepted) {
	m := a.Message
	tl.mu.Lock()
	if other, busy := tl.running[m.Repo]; busy {
		tl.mu.Unlock()
		tl.t.Errorf("%s started while %s of the same repo %s runs", m.JobID, other, m.Repo)
		return
	}
	tl.running[m.Repo] = m.JobID
	tl.now++
	tl.maxRun = max(tl.maxRun, tl.now)
	tl.order[m.Repo] = append(tl.order[m.Repo], m.JobID)
	tl.mu.Unlock()
	tl.started <- m.JobID
	select {
	case <-tl.gateOf(m.JobID):
	case <-ctx.Done():
		tl.t.Errorf("%s: the job's context was cancelled", m.JobID)
	}
	tl.mu.Lock()
	delete(tl.running, m.Repo)
	tl.now--
	tl.mu.Unlock()
}

func (tl *timeline) finish(id string) { close(tl.gateOf(id)) }

func (tl *timeline) waitStarted(ids ...string) {
	tl.t.Helper()
	want := map[string]bool{}
	for _, id := range ids {
		want[id] = true
	}
	for len(want) > 0 {
		id := <-tl.started
		if !want[id] {
			tl.t.Fatalf("%s started; waiting for %v", id, ids)
		}
		delete(want, id)
	}
}

// Session implements dispatch.SessionMetrics.
func (tl *timeline) Session(e string) {
	tl.mu.Lock()
	defer tl.mu.Unlock()
	tl.sessEv[e]++
}

func (tl *timeline) sessions(e string) int {
	tl.mu.Lock()
	defer tl.mu.Unlock()
	return tl.sessEv[e]
}

// sessionMetrics is a Metrics that counts sessions into a timeline.
type sessionMetrics struct {
	dispatch.MetricsFuncs
	tl *timeline
}

func (m sessionMetrics) Session(e string) { m.tl.Session(e) }

// poolReceiver runs a factory that is a replica of pool p (subscription p,
// which requires sessions) against peer.
type poolReceiver struct {
	recv   *dispatch.Receiver
	cancel context.CancelFunc
	done   chan error
}

func startPoolReceiver(t *testing.T, peer *sbpeertest.Peer, factory string, slots int, tl *timeline, mutate func(*dispatch.Options)) *poolReceiver {
	t.Helper()
	o := dispatch.Options{
		Config:   dispatch.Config{FactoryID: factory, Pool: "p", ConnectionString: peer.ConnectionString(), Topic: topic, Sessions: true},
		Acceptor: newAcceptor(),
		Handler:  tl.handler,
		Slots:    dispatch.NewSemaphore(slots),
		Metrics:  sessionMetrics{tl: tl},
		Backoff:  dispatch.Backoff{Initial: 10 * time.Millisecond, Max: 200 * time.Millisecond},
		SDKRetry: &azservicebus.RetryOptions{MaxRetries: 1, RetryDelay: 10 * time.Millisecond, MaxRetryDelay: 50 * time.Millisecond},
		// Idle sessions are let go at once, so a repo's session moves
		// between receivers as much as it can.
		SessionIdle: 50 * time.Millisecond,
	}
	if mutate != nil {
		mutate(&o)
	}
	recv, err := dispatch.New(o)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	pr := &poolReceiver{recv: recv, cancel: cancel, done: make(chan error, 1)}
	go func() { pr.done <- recv.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		tl.mu.Lock()
		for _, g := range tl.gate {
			select {
			case <-g:
			default:
				close(g)
			}
		}
		tl.mu.Unlock()
		<-pr.done
	})
	return pr
}

// poolPeer is a peer with the pool's subscription p (sessions) and fb.
func poolPeer(t *testing.T, o sbpeertest.Options) (*sbpeertest.Peer, *rig) {
	t.Helper()
	o.Subs = []string{topic + "/p=p", topic + "/fb"}
	o.Sessions = []string{topic + "/p"}
	r := newRig(t, rigOptions{peer: o, noStart: true})
	return r.peer, r
}

func (r *rig) publishTo(id, repo, target string, sessions bool) {
	r.t.Helper()
	sm, err := dispatch.Message{JobID: id, ProductID: "p1", Repo: repo, TargetFactoryID: target}.ServiceBusMessage(sessions)
	if err != nil {
		r.t.Fatal(err)
	}
	if err := r.sender.SendMessage(context.Background(), sm, nil); err != nil {
		r.t.Fatal(err)
	}
}

func (r *rig) accepts(session string) []sbpeertest.Event {
	return sbpeertest.Filter(r.events(), func(e sbpeertest.Event) bool { return e.Event == "session-accept" && e.Session == session })
}

func (r *rig) delivery(id string) sbpeertest.Event {
	r.t.Helper()
	return r.waitEvent(isEvent("deliver", id))
}

// Two factories share a pool's subscription with sessions keyed by repo:
// one repo's jobs run one at a time, in the order they were published, on
// whichever factory holds the repo's session — never two at once — while
// other repos' jobs run beside them.
func TestSessionsSerialiseARepoAcrossFactories(t *testing.T) {
	peer, r := poolPeer(t, sbpeertest.Options{})
	tl := newTimeline(t)
	startPoolReceiver(t, peer, "fa", 2, tl, nil)
	startPoolReceiver(t, peer, "fb", 2, tl, nil)
	for _, j := range [][2]string{{"app-1", "app"}, {"lib-1", "lib"}, {"app-2", "app"}, {"web-1", "web"}, {"app-3", "app"}, {"lib-2", "lib"}} {
		r.publishTo(j[0], j[1], "p", true)
	}
	tl.waitStarted("app-1", "lib-1", "web-1")
	r.barrier("three-running")
	for _, id := range []string{"app-2", "app-3", "lib-2"} {
		if n := count(r.events(), isEvent("deliver", id)); n != 0 {
			t.Fatalf("%s was delivered while its repo's job runs", id)
		}
	}
	tl.finish("app-1")
	tl.waitStarted("app-2")
	tl.finish("lib-1")
	tl.waitStarted("lib-2")
	tl.finish("app-2")
	tl.waitStarted("app-3")
	for _, id := range []string{"app-3", "lib-2", "web-1"} {
		tl.finish(id)
	}
	tl.mu.Lock()
	order, maxRun := strings.Join(tl.order["app"], " "), tl.maxRun
	tl.mu.Unlock()
	if order != "app-1 app-2 app-3" {
		t.Fatalf("app ran %s, want app-1 app-2 app-3", order)
	}
	if maxRun < 3 {
		t.Fatalf("at most %d jobs ran at once; three repos should have run side by side", maxRun)
	}
	// Every delivery of app went to the link holding app's session at the time.
	holder := map[string]string{}
	for _, e := range r.events() {
		switch {
		case e.Event == "session-accept":
			holder[e.Link] = e.Session
		case e.Event == "session-release":
			delete(holder, e.Link)
		case e.Event == "deliver" && strings.HasPrefix(e.Queue, topic+"/Subscriptions/p"):
			repo, _, _ := strings.Cut(e.MessageID, "-")
			if holder[e.Link] != repo {
				t.Fatalf("%s delivered on link %s, which holds session %q", e.MessageID, e.Link, holder[e.Link])
			}
		}
	}
}

// A held session's lock is renewed while its job runs past the lock
// duration: it never expires, and the repo's next message comes to the same
// holder after the job, in order.
func TestSessionRenewedWhileJobRuns(t *testing.T) {
	peer, r := poolPeer(t, sbpeertest.Options{LockDuration: 1500 * time.Millisecond})
	tl := newTimeline(t)
	startPoolReceiver(t, peer, "fa", 1, tl, func(o *dispatch.Options) { o.SessionIdle = time.Second })
	r.publishTo("app-1", "app", "p", true)
	tl.waitStarted("app-1")
	acc := r.waitEvent(func(e sbpeertest.Event) bool { return e.Event == "session-accept" && e.Session == "app" })
	// Three renewals: the job has run for more than two lock durations.
	waitRenewals(t, r, acc.Link, 0, 3)
	r.publishTo("app-2", "app", "p", true)
	tl.finish("app-1")
	tl.waitStarted("app-2")
	tl.finish("app-2")
	evs := r.events()
	if n := count(evs, func(e sbpeertest.Event) bool { return e.Event == "session-lock-expired" }); n != 0 {
		t.Fatalf("a session lock expired while renewed:\n%s", dump(evs))
	}
	if d := r.delivery("app-2"); d.Link != acc.Link {
		t.Fatalf("app-2 went to link %s, not the session's holder %s", d.Link, acc.Link)
	}
}

// A session lock lost mid-job: the job goes on under its lease (its Handler
// is neither cancelled nor cut short) and the receiver takes nothing more
// from that session; the repo's next message waits for the session — with
// no other receiver, until this one takes the session again after its job;
// with another, that one takes the session and gets it.
func TestSessionLockLostMidJob(t *testing.T) {
	t.Run("alone", func(t *testing.T) {
		peer, r := poolPeer(t, sbpeertest.Options{LockDuration: 2 * time.Second})
		tl := newTimeline(t)
		startPoolReceiver(t, peer, "fa", 1, tl, nil)
		r.publishTo("app-1", "app", "p", true)
		tl.waitStarted("app-1")
		first := r.waitEvent(func(e sbpeertest.Event) bool { return e.Event == "session-accept" && e.Session == "app" })
		r.waitEvent(disposition("app-1", "complete")) // complete-on-claim: nothing of app-1 left to lose
		if err := peer.ExpireSessionLock(topic+"/p", "app"); err != nil {
			t.Fatal(err)
		}
		expired := r.waitEvent(func(e sbpeertest.Event) bool { return e.Event == "session-lock-expired" })
		r.publishTo("app-2", "app", "p", true)
		r.barrier("after-expiry")
		if n := count(r.events(), isEvent("deliver", "app-2")); n != 0 {
			t.Fatal("app-2 was delivered while app-1, whose session lock was lost, still runs on the only slot")
		}
		tl.finish("app-1")
		tl.waitStarted("app-2")
		tl.finish("app-2")
		d := r.delivery("app-2")
		var holder sbpeertest.Event
		for _, a := range r.accepts("app") {
			if a.Link == d.Link {
				holder = a
			}
		}
		if holder.Link == "" || holder.Link == first.Link || holder.T.Before(expired.T) {
			t.Fatalf("app-2 went to link %s (accepted %v); want a new holder of the session after the expiry at %v", d.Link, holder.T, expired.T)
		}
	})
	t.Run("another factory takes the session", func(t *testing.T) {
		peer, r := poolPeer(t, sbpeertest.Options{LockDuration: 2 * time.Second})
		tl := newTimeline(t)
		startPoolReceiver(t, peer, "fa", 1, tl, nil)
		r.publishTo("app-1", "app", "p", true)
		tl.waitStarted("app-1")
		first := r.waitEvent(func(e sbpeertest.Event) bool { return e.Event == "session-accept" && e.Session == "app" })
		r.waitEvent(disposition("app-1", "complete")) // complete-on-claim: nothing of app-1 left to lose
		fbTL := newTimeline(t)
		startPoolReceiver(t, peer, "fb", 1, fbTL, nil)
		r.waitEvent(func(e sbpeertest.Event) bool {
			return e.Event == "session-wait" && e.Link != first.Link && !e.T.Before(first.T)
		})
		if err := peer.ExpireSessionLock(topic+"/p", "app"); err != nil {
			t.Fatal(err)
		}
		r.publishTo("app-2", "app", "p", true)
		fbTL.waitStarted("app-2") // the session's next holder runs it; app-1 still runs on fa
		d := r.delivery("app-2")
		if d.Link == first.Link {
			t.Fatal("app-2 went to the holder that lost the session")
		}
		// fa's renewal finds the session held elsewhere: lost, counted once.
		for tl.sessions(dispatch.SessionLost) == 0 {
			time.Sleep(20 * time.Millisecond)
		}
		tl.finish("app-1") // it ran to its end, under its lease
		fbTL.finish("app-2")
		for tl.sessions(dispatch.SessionReleased) == 0 {
			time.Sleep(20 * time.Millisecond)
		}
		if n := count(r.events(), func(e sbpeertest.Event) bool { return e.Event == "deliver" && e.Link == first.Link }); n != 1 {
			t.Fatalf("%d deliveries on the link that lost the session, want 1 (app-1)", n)
		}
	})
}

// Bad input: a subscription that requires sessions with AQ_SB_SESSIONS off,
// and AQ_SB_SESSIONS on with a subscription without sessions: the broker
// refuses the receiver, and Run stops with one clear configuration line
// (exit 2 in the daemon), the connection string never in it.
func TestSessionsKindMismatch(t *testing.T) {
	for _, tc := range []struct {
		sessions bool
		want     string
	}{
		{false, "requires sessions but AQ_SB_SESSIONS is off"},
		{true, "AQ_SB_SESSIONS=1 but subscription fleet-dispatch/Subscriptions/fa does not require sessions"},
	} {
		t.Run(fmt.Sprintf("sessions=%v", tc.sessions), func(t *testing.T) {
			o := sbpeertest.Options{Subs: []string{topic + "/fa"}}
			if !tc.sessions {
				o.Sessions = []string{topic + "/fa"}
			}
			r := newRig(t, rigOptions{peer: o, noStart: true, mutate: func(opts *dispatch.Options) { opts.Sessions = tc.sessions }})
			err := r.recv.Run(context.Background())
			if aqerr.ExitCode(err) != aqerr.Usage || !strings.Contains(err.Error(), tc.want) || strings.Contains(err.Error(), "\n") ||
				strings.Contains(err.Error(), "SharedAccessKey") {
				t.Fatalf("Run: %v (code %d), want one usage line with %q", err, aqerr.ExitCode(err), tc.want)
			}
		})
	}
}

// Bad input: a message without a SessionId on a subscription that requires
// sessions never reaches aq — the broker dead-letters it ("Session id is
// null.") — and the sessions after it run.
func TestSessionlessMessageOnSessionSubscription(t *testing.T) {
	r := newRig(t, rigOptions{sessions: true})
	r.publishTo("no-session", "app", "fa", false)
	r.publish(job("j1", "fa"))
	if got := r.nextJob(); got.Message.JobID != "j1" {
		t.Fatalf("got %s", got.Message.JobID)
	}
	dl := r.waitEvent(isEvent("dead-letter", "no-session"))
	if dl.Reason != "Session id is null." {
		t.Fatalf("dead-letter %+v", dl)
	}
	if r.acc.Calls("no-session") != 0 {
		t.Fatal("aq asked the coordinator for a message it never received")
	}
}

// A drain with a session held: the job in hand finishes, the session held
// (its lock renewed) until then, and only then is the session released and
// Run returns.
func TestSessionsDrainHoldsTheSessionUntilTheJobEnds(t *testing.T) {
	peer, r := poolPeer(t, sbpeertest.Options{LockDuration: 1500 * time.Millisecond})
	tl := newTimeline(t)
	pr := startPoolReceiver(t, peer, "fa", 1, tl, nil)
	r.publishTo("app-1", "app", "p", true)
	tl.waitStarted("app-1")
	acc := r.waitEvent(func(e sbpeertest.Event) bool { return e.Event == "session-accept" && e.Session == "app" })
	pr.cancel()
	// Two renewals after the drain began: the session is still held.
	waitRenewals(t, r, acc.Link, len(r.events()), 2)
	if n := count(r.events(), func(e sbpeertest.Event) bool { return e.Event == "session-release" }); n != 0 {
		t.Fatal("the session was released while its job runs")
	}
	select {
	case err := <-pr.done:
		t.Fatalf("Run returned (%v) while a job runs", err)
	default:
	}
	tl.finish("app-1")
	if err := <-pr.done; err != nil {
		t.Fatal(err)
	}
	pr.done <- nil // for the cleanup
	r.waitEvent(func(e sbpeertest.Event) bool { return e.Event == "session-release" && e.Link == acc.Link })
}

// waitRenewals waits for n renewals of link's session lock logged after the
// first since events, failing as soon as a session lock expires instead.
func waitRenewals(t *testing.T, r *rig, link string, since, n int) {
	t.Helper()
	for {
		evs := r.events()[since:]
		if e := sbpeertest.Filter(evs, func(e sbpeertest.Event) bool { return e.Event == "session-lock-expired" }); len(e) > 0 {
			t.Fatalf("a session lock expired while it should have been renewed: %+v", e[0])
		}
		if count(evs, func(e sbpeertest.Event) bool { return e.Event == "session-renew" && e.Link == link }) >= n {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
}
