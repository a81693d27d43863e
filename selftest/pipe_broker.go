package selftest

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"

	"github.com/aqfleet/aq/agent/dispatch"
	"github.com/aqfleet/aq/agent/fleet"
	"github.com/aqfleet/aq/demo"
	"github.com/aqfleet/aq/demo/coord"
	"github.com/aqfleet/aq/demo/sbpeer/sbpeerproc"
	"github.com/aqfleet/aq/internal/fixture"
	"github.com/aqfleet/aq/internal/logging"
	"github.com/aqfleet/aq/internal/process"
)

// The broker checks' topics: the dispatch topic, and one whose subscription
// matches every message (a left-over catch-all rule) for the mistargeted
// case.
const (
	brokerTopic = "fleet-dispatch"
	miscTopic   = "aq-selftest-misc"
)

func brokerScenario() *scenario {
	g := GroupPipeline
	return &scenario{name: "broker", group: g, workspace: true, checks: []Check{
		check(g, "pipeline.broker.peer", "the local AMQP peer (demo/sbpeer, Node) starts; skipped without Node or its packages (make sbpeer)"),
		check(g, "pipeline.broker.deliver", "a targeted dispatch message is received, the job accepted (POST /fleet/accept) and the message completed"),
		check(g, "pipeline.broker.conflict", "a message for a job another factory owns gets 409 on accept and is completed, not redelivered"),
		check(g, "pipeline.broker.mistargeted", "a message for another factory is dead-lettered (NotForThisFactory) without an accept"),
	}, run: runBroker}
}

func runBroker(ctx context.Context, s *session) {
	w := s.ws
	var p *peer
	defer func() {
		if p != nil {
			p.stop()
		}
	}()
	fid := "selftest-broker"
	if !s.step(ctx, "pipeline.broker.peer", 30*time.Second, func(ctx context.Context) (string, error) {
		node := s.h.lookPath("node")
		if node == "" {
			return "", skipf("Node.js is not on PATH: the broker checks need the local AMQP peer (install Node >= 18, then run make sbpeer)")
		}
		dir, why := findPeerDir(w.o.PeerDir)
		if dir == "" {
			return "", skipf("%s", why)
		}
		if !fixture.Exists(filepath.Join(dir, "node_modules", "rhea", "package.json")) {
			return "", skipf("the local AMQP peer's packages are not installed: run make sbpeer (npm ci --prefix demo/sbpeer)")
		}
		pdir, err := w.dir("sbpeer")
		if err != nil {
			return "", err
		}
		p, err = startPeer(ctx, w, node, dir, pdir, []string{brokerTopic + "/" + fid, miscTopic + "/" + fid + "-all=*"})
		if err != nil {
			return "", err
		}
		return fmt.Sprintf("sbpeer (%s) listening on %s", filepath.Join(dir, "sbpeer.js"), p.Addr()), nil
	}) {
		return
	}

	wd, err := w.newWorld(ctx, "broker")
	var st *coord.Served
	if err == nil {
		st, err = startStub(ctx, coord.Options{}, "127.0.0.1:0")
	}
	if err != nil {
		s.setupFailed(err)
		return
	}
	wd.st = st
	defer st.Kill()
	f, err := wd.newFactory(ctx, fid, nil)
	if err == nil {
		_, err = f.enroll(ctx)
	}
	var client *azservicebus.Client
	var sender, misc *azservicebus.Sender
	if err == nil {
		client, err = azservicebus.NewClientFromConnectionString(p.connectionString(), &azservicebus.ClientOptions{
			RetryOptions: azservicebus.RetryOptions{MaxRetries: 3, RetryDelay: 10 * time.Millisecond, MaxRetryDelay: 100 * time.Millisecond}})
	}
	if err == nil {
		defer func() { _ = client.Close(context.WithoutCancel(ctx)) }()
		sender, err = client.NewSender(brokerTopic, nil)
	}
	if err == nil {
		misc, err = client.NewSender(miscTopic, nil)
	}
	if err != nil {
		s.setupFailed(err)
		return
	}
	publish := func(ctx context.Context, snd *azservicebus.Sender, id, target string) error {
		m, err := dispatch.Message{JobID: id, Repo: "app", Caps: []string{"engine:script"}, Priority: 200, TargetFactoryID: target}.ServiceBusMessage(false)
		if err != nil {
			return err
		}
		return snd.SendMessage(ctx, m, nil)
	}
	rcv := &brokerRig{f: f, p: p}
	if !rcv.start(ctx, s, brokerTopic, fid) {
		return
	}
	defer rcv.stop()

	j1, j2, j3 := f.jobID("dispatched"), f.jobID("taken"), f.jobID("elsewhere")
	s.step(ctx, "pipeline.broker.deliver", 30*time.Second, func(ctx context.Context) (string, error) {
		if err := wd.submit(ctx, j1, "repo: app\nengine: script\nscript: \"true\""); err != nil {
			return "", err
		}
		if err := publish(ctx, sender, j1, fid); err != nil {
			return "", err
		}
		var acc dispatch.Accepted
		select {
		case acc = <-rcv.handled:
		case <-ctx.Done():
			return "", failf("the job was not handed over: %v", context.Cause(ctx))
		}
		if acc.Claim == nil || acc.Message.JobID != j1 || acc.Claim.Job.ID != j1 || acc.Claim.LeaseEpoch != 1 {
			return "", failf("handed over %s (claim %+v), want %s at epoch 1", acc.Message.JobID, acc.Claim, j1)
		}
		if j, _ := st.Job(j1); j.Stage != coord.StageAssigned || j.Holder != fid {
			return "", failf("the coordinator has the job %s held by %q", j.Stage, j.Holder)
		}
		if err := p.waitEvent(ctx, "the message to be completed", func(e peerEvent) bool {
			return e.Event == "disposition" && e.Outcome == "complete" && e.MessageID == j1
		}); err != nil {
			return "", err
		}
		return fmt.Sprintf("received from %s/%s, accepted (epoch 1, lag %s), completed at once", brokerTopic, fid, ms(acc.Lag)), nil
	})
	s.step(ctx, "pipeline.broker.conflict", 30*time.Second, func(ctx context.Context) (string, error) {
		if err := wd.submit(ctx, j2, "repo: app\nengine: script\nscript: \"true\""); err != nil {
			return "", err
		}
		other, err := fleet.NewClient(fleet.ClientOptions{API: st.API, Token: st.EnrollToken(), FactoryID: "selftest-other", Budgets: fastBudgets()})
		if err != nil {
			return "", err
		}
		if _, err := fleet.EnsureEnrolled(ctx, other, fleet.EnrollOptions{Path: filepath.Join(wd.dir, "other-credentials"), EnvToken: st.EnrollToken(),
			Request: fleet.EnrollRequest{FactoryID: "selftest-other", Capabilities: []string{"engine:script"}, Repos: []string{"app"}}}); err != nil {
			return "", err
		}
		other.SetOffer([]string{"os:linux", "engine:script"}, []string{"app"})
		cl, err := other.Claim(ctx, false)
		if err != nil || cl == nil || cl.Job.ID != j2 {
			return "", failf("another factory could not take %s first (%v)", j2, err)
		}
		accepts := rcv.accepts()
		if err := publish(ctx, sender, j2, fid); err != nil {
			return "", err
		}
		if err := p.waitEvent(ctx, "the message to be completed", func(e peerEvent) bool {
			return e.Event == "disposition" && e.MessageID == j2
		}); err != nil {
			return "", err
		}
		if e := p.lastEvent(func(e peerEvent) bool { return e.Event == "disposition" && e.MessageID == j2 }); e.Outcome != "complete" {
			return "", failf("the message was settled %q, want complete", e.Outcome)
		}
		if rcv.accepts() != accepts+1 {
			return "", failf("%d accepts for the message, want 1", rcv.accepts()-accepts)
		}
		select {
		case a := <-rcv.handled:
			return "", failf("the job %s was handed over although another factory owns it", a.Message.JobID)
		default:
		}
		if j, _ := st.Job(j2); j.Holder != "selftest-other" || j.LeaseEpoch != 1 {
			return "", failf("the coordinator has the job held by %q at epoch %d", j.Holder, j.LeaseEpoch)
		}
		return "accept answered 409 (owned by selftest-other): the message was completed and the job left alone", nil
	})
	rcv.stop()
	s.step(ctx, "pipeline.broker.mistargeted", 30*time.Second, func(ctx context.Context) (string, error) {
		mis := &brokerRig{f: f, p: p}
		if !mis.start(ctx, nil, miscTopic, fid+"-all") {
			return "", failf("the receiver on the catch-all subscription did not start: %v", mis.startErr)
		}
		defer mis.stop()
		if err := publish(ctx, misc, j3, "selftest-elsewhere"); err != nil {
			return "", err
		}
		if err := p.waitEvent(ctx, "the message to be dead-lettered", func(e peerEvent) bool {
			return e.Event == "dead-letter" && e.MessageID == j3
		}); err != nil {
			return "", err
		}
		e := p.lastEvent(func(e peerEvent) bool { return e.Event == "dead-letter" && e.MessageID == j3 })
		if e.Reason != dispatch.ReasonMistargeted {
			return "", failf("dead-lettered with reason %q, want %s", e.Reason, dispatch.ReasonMistargeted)
		}
		if n := mis.accepts(); n != 0 {
			return "", failf("%d accepts for a message meant for another factory", n)
		}
		return "a message for selftest-elsewhere on a catch-all subscription was dead-lettered " + dispatch.ReasonMistargeted + ", with no accept", nil
	})
}

// brokerRig is one dispatch receiver of the factory f, accepting through
// the fleet client.
type brokerRig struct {
	f        *factory
	p        *peer
	handled  chan dispatch.Accepted
	cancel   context.CancelFunc
	done     chan struct{}
	mu       sync.Mutex
	n        int
	startErr error
}

func (r *brokerRig) accepts() int { r.mu.Lock(); defer r.mu.Unlock(); return r.n }

// start runs the receiver on topic/sub until stop; it waits until the link
// is healthy. With a session, a failure to start ends the scenario.
func (r *brokerRig) start(ctx context.Context, s *session, topic, sub string) bool {
	r.handled = make(chan dispatch.Accepted, 10)
	health := make(chan dispatch.Health, 10)
	log := logging.Discard()
	if lg := r.f.wd.w.o.Log; lg != nil {
		log = lg.With("selftest", "broker")
	}
	recv, err := dispatch.New(dispatch.Options{
		Config: dispatch.Config{FactoryID: r.f.id, ConnectionString: r.p.connectionString(), Topic: topic, Subscription: sub},
		Acceptor: dispatch.AcceptFunc(func(ctx context.Context, id string) (dispatch.Accepted, error) {
			r.mu.Lock()
			r.n++
			r.mu.Unlock()
			cl, err := r.f.agent.Client.Accept(ctx, id)
			if err != nil {
				return dispatch.Accepted{}, err
			}
			return dispatch.Accepted{Claim: cl}, nil
		}),
		Handler:       func(ctx context.Context, a dispatch.Accepted) { r.handled <- a },
		Slots:         dispatch.NewSemaphore(1),
		Logger:        log,
		OnHealth:      func(h dispatch.Health) { health <- h },
		Backoff:       dispatch.Backoff{Initial: 10 * time.Millisecond, Max: 200 * time.Millisecond},
		SDKRetry:      &azservicebus.RetryOptions{MaxRetries: 1, RetryDelay: 10 * time.Millisecond, MaxRetryDelay: 50 * time.Millisecond},
		SettleTimeout: 5 * time.Second,
	})
	if err != nil {
		r.fail(s, err)
		return false
	}
	rctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	r.cancel, r.done = cancel, make(chan struct{})
	go func() {
		defer close(r.done)
		if err := recv.Run(rctx); err != nil {
			health <- dispatch.Health{Err: err}
		}
	}()
	t := time.NewTimer(20 * time.Second)
	defer t.Stop()
	for {
		select {
		case h := <-health:
			if h.Healthy {
				return true
			}
			if h.Err != nil && !strings.Contains(h.Err.Error(), "stopped") {
				continue // it reconnects with backoff
			}
		case <-t.C:
			r.stop()
			r.fail(s, fmt.Errorf("the receiver's link to %s/%s did not become healthy within 20s", topic, sub))
			return false
		case <-ctx.Done():
			r.stop()
			r.fail(s, context.Cause(ctx))
			return false
		}
	}
}

func (r *brokerRig) fail(s *session, err error) {
	r.startErr = err
	if s != nil {
		s.stop = &Result{Status: Fail, Reason: "the dispatch receiver: " + err.Error()}
	}
}

func (r *brokerRig) stop() {
	if r.cancel == nil {
		return
	}
	r.cancel()
	<-r.done
	r.cancel = nil
}

// findPeerDir finds demo/sbpeer: o.PeerDir, else above the working directory
// or the executable, in a checkout of aq.
func findPeerDir(explicit string) (string, string) {
	if explicit != "" {
		if fixture.Exists(filepath.Join(explicit, "sbpeer.js")) {
			return explicit, ""
		}
		return "", "no sbpeer.js in " + explicit
	}
	exe, _ := os.Executable()
	if dir := demo.FindPeerDir(exe); dir != "" {
		return dir, ""
	}
	return "", "the local AMQP peer (demo/sbpeer) is part of aq's source tree, which is not here: run aq selftest from a checkout (make test) to include the broker checks"
}

// peer is a running demo/sbpeer, started by the one launcher (sbpeerproc).
type peer struct{ *sbpeerproc.Peer }

type peerEvent = sbpeerproc.Event

// startPeer runs node sbpeer.js on a free loopback port, tagged like a job
// so the clean-up checks see it, and waits for its "listening" line.
func startPeer(_ context.Context, w *workspace, node, dir, work string, subs []string) (*peer, error) {
	scope := "aq-selftest-" + w.token
	tag := w.id("sbpeer", scope)
	env := append(append([]string(nil), w.engineEnv...), process.TagEnv+"="+tag, process.ScopeEnv+"="+scope)
	p, err := sbpeerproc.Launch(sbpeerproc.Options{Dir: work, Node: node, PeerDir: dir, Env: env, Subs: subs})
	if err != nil {
		return nil, err
	}
	return &peer{p}, nil
}

// connectionString is a development connection string pinned to loopback.
func (p *peer) connectionString() string { return p.ConnectionString() }

// stop ends the peer (SIGTERM, then its group killed).
func (p *peer) stop() { p.Stop() }

func (p *peer) eventsNow() []peerEvent {
	evs, _ := p.Events()
	return evs
}

func (p *peer) lastEvent(match func(peerEvent) bool) peerEvent {
	evs := p.eventsNow()
	for i := len(evs) - 1; i >= 0; i-- {
		if match(evs[i]) {
			return evs[i]
		}
	}
	return peerEvent{}
}

func (p *peer) waitEvent(ctx context.Context, what string, match func(peerEvent) bool) error {
	return fixture.WaitFor(ctx, what, func() bool { return p.lastEvent(match).Event != "" })
}
