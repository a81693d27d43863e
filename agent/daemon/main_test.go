package daemon_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"
	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus/admin"

	"github.com/aqfleet/aq/agent/caps"
	"github.com/aqfleet/aq/agent/config"
	"github.com/aqfleet/aq/agent/daemon"
	"github.com/aqfleet/aq/agent/dispatch"
	"github.com/aqfleet/aq/agent/fleet"
	"github.com/aqfleet/aq/agent/jobstate"
	"github.com/aqfleet/aq/agent/manifest"
	"github.com/aqfleet/aq/demo/coord"
	"github.com/aqfleet/aq/demo/coord/coordtest"
	"github.com/aqfleet/aq/demo/sbpeer/sbpeertest"
	"github.com/aqfleet/aq/internal/secrets"
	"github.com/aqfleet/aq/internal/testenv"
	"github.com/aqfleet/aq/profiles"
)

func TestMain(m *testing.M) { os.Exit(testenv.Main(m)) }

// guard bounds every wait: a deadlock guard, never a speed requirement.
const guard = 2 * time.Minute

const topic = "fleet-dispatch"

// fastBudgets are retry budgets for tests.
func fastBudgets() fleet.Budgets {
	return fleet.Budgets{
		Enroll: 5 * time.Second, Heartbeat: 500 * time.Millisecond, QueueState: 2 * time.Second, Claim: 5 * time.Second,
		Accept: 5 * time.Second, Renew: 5 * time.Second, Release: time.Second, Report: 2 * time.Second,
		FinalReport: 5 * time.Second, Drain: 2 * time.Second, Submit: 5 * time.Second,
		MinWait: 5 * time.Millisecond, MaxWait: 50 * time.Millisecond, PerTry: 2 * time.Second,
	}
}

// rig is one coordinator stub (optionally publishing to a local AMQP peer),
// a set of repos with bare origins, and one in-process daemon.
type rig struct {
	t       testing.TB
	o       rigOptions
	limits  daemon.Limits
	stub    *coord.Server
	api     string
	peer    *sbpeertest.Peer
	pub     *coord.Publisher
	origins map[string]string
	dir     string // scratch: scripts and their signal files
	home    string
	base    string
	cfg     *config.Config
	logs    *testenv.SyncBuffer
	d       *daemon.Daemon
	// admin is the daemon's management client (BrokerTuning.Admin).
	admin *admin.Client

	evMu   sync.Mutex
	events []daemon.JobEvent
	sent   []coord.Sent

	sendAs func(id, msgID string)

	cancel context.CancelFunc
	done   chan struct{}
	runErr error
}

type rigOptions struct {
	factory  string
	slots    int
	gate     bool
	broker   bool
	metrics  bool
	repos    []string
	leaseTTL time.Duration
	// noPublisher: a broker (peer) but the stub does not publish.
	noPublisher bool
	coord       func(*coord.Options)
	config      func(*config.Config)
	parts       func(*fleet.Parts)
	// heartbeat overrides the 1 s cadence.
	heartbeat time.Duration
	// peerAdmin: the peer serves the management API's depth read.
	peerAdmin bool
	// routes is the stub's route set (coord.RoutesFull when empty).
	routes string
}

// eachRouteSet runs fn once per route set of the stub — full (docs/contract.md)
// and legacy (the coordinator in service today) — so the daemon's fleet
// path is held to both (a table over route sets, not copies of tests). The
// runs are parallel: each makes its own rig (fn must not share state
// across them).
func eachRouteSet(t *testing.T, fn func(t *testing.T, routes string)) {
	for _, rs := range coord.RouteSets {
		t.Run(rs, func(t *testing.T) {
			t.Parallel()
			fn(t, rs)
		})
	}
}

// failKinds are the audit entries a failure reported with stage leaves:
// /fleet/fail's, or (legacy) the fallback PATCH's and the release's.
func failKinds(routes, stage string) []string {
	if routes == coord.RoutesLegacy {
		return []string{"stage:" + stage, "released"}
	}
	return []string{"fail:" + stage}
}

func newRig(t testing.TB, o rigOptions) *rig {
	t.Helper()
	testenv.Slow(t, "runs a whole factory: the stub, git repositories, the daemon's loops and its jobs")
	if o.factory == "" {
		o.factory = "fa"
	}
	if o.slots == 0 {
		o.slots = 1
	}
	if len(o.repos) == 0 {
		o.repos = []string{"app"}
	}
	r := &rig{t: t, o: o, origins: map[string]string{}, dir: t.TempDir(), logs: &testenv.SyncBuffer{}}
	root := t.TempDir()
	r.home, r.base = filepath.Join(root, "home"), filepath.Join(root, "src")
	for _, name := range o.repos {
		w := filepath.Join(t.TempDir(), name)
		testenv.NewRepo(t, filepath.Dir(w), name, nil)
		r.origins[name] = testenv.AddOrigin(t, w)
		testenv.Git(t, root, "clone", "-q", r.origins[name], filepath.Join(r.base, name))
	}
	if o.broker {
		r.peer = sbpeertest.Start(t, sbpeertest.Options{Subs: []string{topic + "/" + o.factory, topic + "/other"}, Admin: o.peerAdmin})
	}
	co := coord.Options{MaxBackoff: 50 * time.Millisecond, ReapEvery: 100 * time.Millisecond, LeaseTTL: o.leaseTTL, Routes: o.routes}
	if o.broker && !o.noPublisher {
		pub, err := coord.NewPublisher(coord.PublisherOptions{
			ConnectionString: r.peer.ConnectionString(), Topic: topic, Rescan: 100 * time.Millisecond,
			Backoff:       dispatch.Backoff{Initial: 20 * time.Millisecond, Max: 200 * time.Millisecond},
			ClientOptions: &azservicebus.ClientOptions{RetryOptions: azservicebus.RetryOptions{MaxRetries: 1, RetryDelay: 10 * time.Millisecond, MaxRetryDelay: 50 * time.Millisecond}},
			OnSent: func(s coord.Sent) {
				r.evMu.Lock()
				r.sent = append(r.sent, s)
				r.evMu.Unlock()
			},
		})
		if err != nil {
			t.Fatal(err)
		}
		r.pub = pub
		co.Publisher = pub
	}
	if o.coord != nil {
		o.coord(&co)
	}
	s := coordtest.Start(t, co)
	r.stub, r.api = s.Server, s.API

	hb := o.heartbeat
	if hb == 0 {
		hb = time.Second
	}
	r.cfg = &config.Config{
		Home: r.home, RepoBase: r.base, Fleet: true, FleetAPI: r.api, FleetToken: s.EnrollToken(), FactoryID: o.factory,
		FleetRoute: true, FleetGate: o.gate, Heartbeat: hb, LeaseRenew: 200 * time.Millisecond, Poll: 50 * time.Millisecond,
		Slots: o.slots, WorktreePool: 1, KillGrace: 200 * time.Millisecond, ClaudePermissionMode: "acceptEdits", LogFormat: "text", LogLevel: "debug",
		SBTopic: topic, SBSubscription: o.factory,
		Engines: config.EngineNames, // script jobs: opted in (AQ_ENGINES=all)
	}
	if o.broker {
		r.cfg.SBConnectionString = r.peer.ConnectionString()
	}
	if o.metrics {
		r.cfg.MetricsAddr = "127.0.0.1:0"
	}
	if o.config != nil {
		o.config(r.cfg)
	}
	return r
}

// host is the capabilities the daemon advertises.
func (r *rig) host() func(context.Context) (*caps.Host, error) {
	tokens := []string{"os:linux", "arch:amd64", "engine:script", "has:git"}
	for _, name := range r.o.repos {
		tokens = append(tokens, "repo:"+name)
	}
	return func(context.Context) (*caps.Host, error) { return caps.FromTokens(tokens), nil }
}

// build makes the daemon (not started).
func (r *rig) build() *daemon.Daemon {
	r.t.Helper()
	b := fastBudgets()
	parts := fleet.Parts{Budgets: &b, Host: r.host()}
	if r.o.parts != nil {
		r.o.parts(&parts)
	}
	log := slog.New(slog.NewTextHandler(r.logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	d, err := daemon.New(daemon.Options{
		Config: r.cfg, Log: log, Redactor: secrets.NewRedactor(nil), Parts: parts,
		Broker: daemon.BrokerTuning{
			Backoff:  dispatch.Backoff{Initial: 20 * time.Millisecond, Max: 200 * time.Millisecond},
			SDKRetry: &azservicebus.RetryOptions{MaxRetries: 1, RetryDelay: 10 * time.Millisecond, MaxRetryDelay: 50 * time.Millisecond},
			Admin:    r.admin,
		},
		ConnectGrace: 10 * time.Second,
		Limits:       r.limits,
		OnJobEvent: func(e daemon.JobEvent) {
			r.evMu.Lock()
			r.events = append(r.events, e)
			r.evMu.Unlock()
		},
	})
	if err != nil {
		r.t.Fatal(err)
	}
	r.d = d
	return d
}

// start builds (if needed) and runs the daemon in the background; its
// context's cancel is a drain.
func (r *rig) start() {
	r.t.Helper()
	if r.d == nil {
		r.build()
	}
	ctx, cancel := context.WithCancel(context.Background())
	r.cancel, r.done = cancel, make(chan struct{})
	go func() {
		defer close(r.done)
		r.runErr = r.d.Run(ctx)
	}()
	r.t.Cleanup(func() {
		if r.cancel != nil {
			r.d.Abort()
			r.wait()
		}
	})
}

// wait waits for Run to return and gives its error.
func (r *rig) wait() error {
	r.t.Helper()
	select {
	case <-r.done:
	case <-time.After(guard):
		r.t.Fatalf("the daemon did not stop (deadlock?)\n%s", r.logs)
	}
	r.cancel = nil
	return r.runErr
}

// drain is the first signal; it returns Run's error.
func (r *rig) drain() error {
	r.t.Helper()
	r.d.Drain()
	return r.wait()
}

func (r *rig) waitFor(what string, cond func() bool) {
	r.t.Helper()
	deadline := time.Now().Add(guard)
	for !cond() {
		if time.Now().After(deadline) {
			r.t.Fatalf("timed out waiting for %s\nlogs:\n%s", what, r.logs)
		}
		select {
		case <-r.done:
			if !cond() {
				r.t.Fatalf("the daemon stopped (%v) while waiting for %s\nlogs:\n%s", r.runErr, what, r.logs)
			}
			return
		default:
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func (r *rig) waitLive(want string) {
	r.t.Helper()
	r.waitFor("dispatch source "+want, func() bool { return r.d.Live() == want })
}

// heartbeats is the stub's count of heartbeats.
func (r *rig) heartbeats() int64 { return r.stub.Stats().Count(coord.RouteHeartbeat) }

// waitHeartbeats waits until n more heartbeats reached the stub: the test's
// clock (the daemon's own cadence), never a wall-clock limit.
func (r *rig) waitHeartbeats(n int64) {
	r.t.Helper()
	from := r.heartbeats()
	r.waitFor(fmt.Sprintf("%d heartbeats", n), func() bool { return r.heartbeats() >= from+n })
}

// script writes a shell script and returns the manifest's script: value.
func (r *rig) script(name, body string) string {
	p := filepath.Join(r.dir, name+".sh")
	testenv.WriteFile(r.t, p, body)
	return "/bin/sh " + p
}

// blocking is a script that touches <id>.started, appends a line to
// <id>.runs, waits for <id>.go, then writes result.txt.
func (r *rig) blocking(id string) string {
	// "started" only once the WIP file is written: tests stop the job as soon
	// as it has started and expect that file in the checkpoint.
	return r.script(id, fmt.Sprintf(`echo run >> %q
echo "wip of %s" > wip.txt
touch %q
while [ ! -f %q ]; do sleep 0.02; done
echo "work of %s" > result.txt
`, r.path(id, "runs"), id, r.path(id, "started"), r.path(id, "go"), id))
}

// quick is a script that appends a line to <id>.runs and writes result.txt.
func (r *rig) quick(id string) string {
	return r.script(id, fmt.Sprintf("echo run >> %q\necho \"work of %s\" > result.txt\n", r.path(id, "runs"), id))
}

func (r *rig) path(id, what string) string { return filepath.Join(r.dir, id+"."+what) }

func (r *rig) release(id string) { testenv.WriteFile(r.t, r.path(id, "go"), "") }

func (r *rig) waitStarted(id string) {
	r.t.Helper()
	r.waitFor(id+" to start", func() bool { return testenv.Exists(r.path(id, "started")) })
}

// runs counts how often a job's script ran.
func (r *rig) runs(id string) int {
	b, err := os.ReadFile(r.path(id, "runs"))
	if err != nil {
		return 0
	}
	return strings.Count(string(b), "run\n")
}

func manifestText(id, repo, front string) string {
	return fmt.Sprintf("---\nid: %s\nrepo: %s\nengine: script\nship: branch\n%s\n---\n# Job %s\n\nDo the work for %s.\n", id, repo, strings.TrimRight(front, "\n"), id, id)
}

// submit posts a job as an operator would (aq submit).
func (r *rig) submit(id, repo, script string) {
	r.t.Helper()
	text := manifestText(id, repo, "script: "+script)
	cat, err := profiles.Embedded()
	if err != nil {
		r.t.Fatal(err)
	}
	j, err := manifest.Parse(id+".md", []byte(text), cat)
	if err != nil {
		r.t.Fatal(err)
	}
	// No keep-alive: the test's own connections must not count as the
	// daemon's goroutines.
	hc := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
	c, err := fleet.NewClient(fleet.ClientOptions{API: r.api, Token: r.stub.EnrollToken(), Budgets: fastBudgets(), HTTP: hc})
	if err != nil {
		r.t.Fatal(err)
	}
	if _, err := c.Submit(context.Background(), j, []byte(text)); err != nil {
		r.t.Fatalf("submit %s: %v", id, err)
	}
}

func (r *rig) stage(id string) string {
	j, _ := r.stub.Job(id)
	return j.Stage
}

func (r *rig) waitStage(id string, stages ...string) {
	r.t.Helper()
	r.waitFor(id+" in "+strings.Join(stages, "|"), func() bool {
		st := r.stage(id)
		for _, s := range stages {
			if st == s {
				return true
			}
		}
		return false
	})
}

// record is this factory's record of a job.
func (r *rig) record(id string) jobstate.Record {
	r.t.Helper()
	st, err := jobstate.Open(filepath.Join(r.home, "state", "jobs"))
	if err != nil {
		r.t.Fatal(err)
	}
	rec, _ := st.Get(id)
	return rec
}

// closedRecord waits for the job's record to be closed (the final report
// was sent: the stub may show the stage a moment before) and returns it.
func (r *rig) closedRecord(id string) jobstate.Record {
	r.t.Helper()
	r.waitFor(id+"'s record closed", func() bool { return !r.record(id).Running() })
	return r.record(id)
}

// kinds of a job's audit trail at the stub.
func (r *rig) kinds(id string) []string {
	var out []string
	for _, e := range r.stub.Events(id) {
		s := e.Kind
		if e.Kind == "stage" || e.Kind == "fail" {
			s += ":" + e.Stage
		}
		out = append(out, s)
	}
	return out
}

// jobEvents returns the daemon's events of kind for job id.
func (r *rig) jobEvents(id, kind string) []daemon.JobEvent {
	r.evMu.Lock()
	defer r.evMu.Unlock()
	var out []daemon.JobEvent
	for _, e := range r.events {
		if e.JobID == id && (kind == "" || e.Kind == kind) {
			out = append(out, e)
		}
	}
	return out
}

// status reads the status file.
func (r *rig) status() *daemon.Status {
	r.t.Helper()
	var st *daemon.Status
	r.waitFor("the status file", func() bool {
		var err error
		st, err = daemon.ReadStatus(filepath.Join(r.home, "state"))
		return err == nil
	})
	return st
}

// get fetches a URL of the metrics server.
func (r *rig) get(path string) (int, string) {
	r.t.Helper()
	r.waitFor("the metrics server", func() bool { return r.d.MetricsAddr() != "" })
	hc := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
	resp, err := hc.Get("http://" + r.d.MetricsAddr() + path)
	if err != nil {
		r.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// peerEvents reads the peer's log.
func (r *rig) peerEvents() []sbpeertest.Event {
	r.t.Helper()
	evs, err := r.peer.Events()
	if err != nil {
		r.t.Fatal(err)
	}
	return evs
}

func count(evs []sbpeertest.Event, kind, id string) int {
	return len(sbpeertest.Filter(evs, func(e sbpeertest.Event) bool {
		return e.Event == kind && (id == "" || strings.HasPrefix(e.MessageID, id+":") || e.MessageID == id)
	}))
}

func dumpJSON(v any) string {
	b, _ := json.MarshalIndent(v, "", " ")
	return string(b)
}

// testSender connects a publisher of the test's own to the peer and returns
// a function that publishes the first dispatch of a job to this factory.
func (r *rig) testSender() func(id string) {
	r.t.Helper()
	c, err := azservicebus.NewClientFromConnectionString(r.peer.ConnectionString(), nil)
	if err != nil {
		r.t.Fatal(err)
	}
	snd, err := c.NewSender(topic, nil)
	if err != nil {
		r.t.Fatal(err)
	}
	r.t.Cleanup(func() { _ = c.Close(context.Background()) })
	send := func(id, target, msgID string) {
		r.t.Helper()
		j, _ := r.stub.Job(id)
		m := dispatch.Message{JobID: id, ProductID: j.ProductID, Repo: j.Repo, Caps: j.Capabilities, Priority: j.Priority, TargetFactoryID: target}
		sm, err := m.ServiceBusMessageWithID(msgID, false)
		if err != nil {
			r.t.Fatal(err)
		}
		if err := snd.SendMessage(context.Background(), sm, nil); err != nil {
			r.t.Fatal(err)
		}
	}
	send("warm-up", "other", "warm-up:0") // the links are up before the test counts anything
	r.sendAs = func(id, msgID string) { send(id, r.o.factory, msgID) }
	return func(id string) { send(id, r.o.factory, dispatch.DispatchMessageID(id, 0, 0)) }
}

// testSenderWithID publishes with a MessageID of the test's choice (after
// testSender).
func (r *rig) testSenderWithID() func(id, msgID string) { return r.sendAs }

// factoryRecord is the stub's record of this factory.
func (r *rig) factoryRecord() coord.Factory {
	for _, f := range r.stub.AllFactories() {
		if f.ID == r.o.factory {
			return f
		}
	}
	r.t.Fatalf("factory %s is not enrolled", r.o.factory)
	return coord.Factory{}
}
