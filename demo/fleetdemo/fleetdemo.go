// Package fleetdemo is act 2 of `aq demo`: the fleet on one machine. It
// starts the coordinator stub (in this process, on 127.0.0.1), the local
// Service Bus peer when Node is there (else the factories use the gated poll
// path, and it says so), and two factories as real `aq daemon` child
// processes, each with its own AQ_HOME and its own clones of three repos
// whose bare origins they share. It submits a handful of jobs run by a
// scripted engine at chosen moments, and narrates what happens from real
// signals — the stub's audit trail and request counters, the peer's event
// log, the daemons' status files, the engines' marker files, the origins'
// refs — not from a script of expectations: targeted dispatch, parallel work
// on different repos, same-repo serialization, a factory killed with kill -9
// mid-job, the reaper reclaiming its lease, the other factory resuming from
// the pushed WIP checkpoint, the killed factory restarting as a zombie and
// being fenced, a failing job releasing its lease at once, and `aq gc`
// cleaning up. It ends with a summary and a list of named checks; Summary.
// Passed is true only if every expected event happened.
//
// Everything it starts is stopped before Run returns, also when ctx is
// cancelled (Ctrl-C): the daemons (SIGTERM, then again, then SIGKILL), the
// engines they left (by their AQ_JOB_ID/AQ_SCOPE tag), the peer, the stub.
package fleetdemo

import (
	"context"
	"embed"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/aqfleet/aq/agent/dispatch"
	"github.com/aqfleet/aq/agent/runner"
	"github.com/aqfleet/aq/demo"
	"github.com/aqfleet/aq/demo/coord"
	"github.com/aqfleet/aq/demo/sbpeer/sbpeerproc"
	"github.com/aqfleet/aq/internal/process"
)

//go:embed jobs/*.md
var jobFiles embed.FS

// Timings of the fleet. The lease TTL is short so that the reaper acts
// within seconds; it must leave the runner's WIP push its margin (5 s before
// expiry) between two renewals (every 2 s).
const (
	leaseTTL   = 10 * time.Second
	staleAfter = 4 * time.Second
	reapEvery  = 250 * time.Millisecond
	heartbeat  = 1 // AQ_HEARTBEAT_SEC
	renewEvery = 2 // AQ_FLEET_LEASE_RENEW_SEC
	slots      = 2
	topic      = dispatch.DefaultTopic
	// guard bounds every wait on a signal: a deadlock guard, never a
	// timing assumption.
	guard = 90 * time.Second
)

var (
	factoryIDs = []string{"factory-a", "factory-b"}
	repoNames  = []string{"api", "web", "docs"}
)

// Options configure a run.
type Options struct {
	// Dir is the workspace; empty: a new temp dir, removed at the end
	// unless Keep.
	Dir  string
	Keep bool
	// Out receives the narration.
	Out io.Writer
	// AQ is the aq binary the factories run (default: this executable).
	AQ string
	// Env is the environment the children start from (default: this
	// process's). Its AQ_* variables are dropped; the demo sets its own.
	Env []string
	// PeerDir is demo/sbpeer (default: found from the working directory or
	// the aq binary).
	PeerDir string
	// NoBroker runs the gated poll path even when Node is present.
	NoBroker bool
	// Routes is the stub's route set: coord.RoutesFull (default) or
	// coord.RoutesLegacy — the coordinator in service today, without POST
	// /fleet/accept and /fleet/fail: the factories are still given the
	// broker (when Node is there), refuse it at start and take jobs over the
	// gated poll path, and a failure goes out as a fenced PATCH followed by
	// lease/release.
	Routes string
	// Log receives the in-process stub's logs (nil: coordinator.log in the
	// workspace).
	Log *slog.Logger
}

// Summary is what the demo saw and checked. Field names are stable (`aq
// demo --json`).
type Summary struct {
	Workspace string `json:"workspace"`
	// Path is how jobs reached the factories: broker (Service Bus peer) or
	// poll (the gated poll path); PathNote says why poll.
	Path       string       `json:"path"`
	PathNote   string       `json:"pathNote,omitempty"`
	Routes     string       `json:"routes"` // the stub's route set: full or legacy
	API        string       `json:"api"`
	Factories  []FactoryRow `json:"factories"`
	Jobs       []JobRow     `json:"jobs"`
	Requests   []RouteRow   `json:"requests"`
	Total      int64        `json:"requestsTotal"`
	GC         []GCRow      `json:"gc"`
	Checks     []Check      `json:"checks"`
	DurationMS int64        `json:"durationMs"`
}

// FactoryRow is one factory.
type FactoryRow struct {
	ID   string `json:"id"`
	Home string `json:"home"`
	PIDs []int  `json:"pids"` // one per start
}

// JobRow is one job: where it ended and every attempt.
type JobRow struct {
	ID       string    `json:"id"`
	Repo     string    `json:"repo"`
	Stage    string    `json:"stage"`
	Reason   string    `json:"reason,omitempty"`
	Attempts []Attempt `json:"attempts"`
}

// Attempt is one lease of a job: who held it, at which epoch, how it got it
// and how it ended — from the stub's audit trail.
type Attempt struct {
	Epoch   int64  `json:"epoch"`
	Factory string `json:"factory"`
	Via     string `json:"via"`              // claimed (poll) | accepted (broker)
	Target  string `json:"target,omitempty"` // the broker message's targetFactoryId
	Result  string `json:"result"`
}

// RouteRow is one route of the stub's request counters.
type RouteRow struct {
	Route    string           `json:"route"`
	Requests int64            `json:"requests"`
	Status   map[string]int64 `json:"status"`
}

// GCRow is one `aq gc --json` run.
type GCRow struct {
	Factory string         `json:"factory"`
	Run     int            `json:"run"`
	Deleted map[string]int `json:"deleted"`
	Kept    map[string]int `json:"kept"`
	Errors  []string       `json:"errors,omitempty"`
}

// Check is one expected event.
type Check = demo.Check

// Passed reports whether every check passed.
func (s *Summary) Passed() bool { return demo.AllPassed(s.Checks) }

// run is one demo run.
type run struct {
	o     Options
	out   io.Writer
	aq    string
	ws    string
	sig   string
	jobs  string
	env   []string // the children's base environment
	start time.Time

	stub   *coord.Served
	api    string
	pub    *coord.Publisher
	peer   *sbpeerproc.Peer
	broker bool
	why    string
	// refuse: legacy routes with the peer up — the factories are given the
	// broker and must refuse it (no POST /fleet/accept).
	refuse bool

	facs  map[string]*factory
	order []string

	log     *slog.Logger
	logFile *os.File

	sentMu sync.Mutex
	sent   []coord.Sent

	ob observations
}

// Run runs the fleet demo. It returns an error only when it could not set
// up or was interrupted; a run whose checks failed returns a Summary with
// Passed false.
func Run(ctx context.Context, o Options) (*Summary, error) {
	r := &run{o: o, out: o.Out, start: time.Now(), facs: map[string]*factory{}}
	if r.out == nil {
		r.out = io.Discard
	}
	aq, err := demo.Binary(o.AQ)
	if err != nil {
		return nil, err
	}
	r.aq = aq
	ws, cleanup, err := demo.Workspace(o.Dir, "aq-fleet-demo-", o.Keep)
	if err != nil {
		return nil, err
	}
	defer cleanup()
	r.ws = ws
	sum := &Summary{Workspace: r.ws}

	defer r.teardown(ctx) // whatever happens: no child outlives Run
	err = r.setup(ctx)
	if err == nil {
		sum.Path, sum.PathNote, sum.API, sum.Routes = r.path(), r.why, r.api, r.routes()
		err = r.phases(ctx)
	}
	if err != nil {
		r.ob.aborted = err
		if r.sig != "" { // let held engines finish, so the daemons drain quickly
			_ = r.touch("gate-1")
			_ = r.touch("gate-2")
		}
		if ctx.Err() != nil {
			r.say("")
			r.say("interrupted: stopping everything the demo started")
		} else {
			r.say("")
			r.say("!! %v", err)
		}
	}
	r.stopAll(ctx)
	r.summarize(sum)
	if ctx.Err() != nil {
		return sum, fmt.Errorf("the demo was interrupted; everything it started was stopped: %w", context.Cause(ctx))
	}
	if r.ob.setupErr != nil {
		return sum, r.ob.setupErr
	}
	r.printSummary(sum)
	if !sum.Passed() {
		for _, id := range r.order {
			if t := r.facs[id].tail(12); t != "" {
				r.say("")
				r.say("last lines of %s's log (%s):", id, r.facs[id].logPath)
				for _, l := range strings.Split(t, "\n") {
					r.say("   %s", l)
				}
			}
		}
	}
	if o.Keep || o.Dir != "" {
		r.say("")
		r.say("workspace kept: %s (each factory: AQ_HOME=%s AQ_REPO_BASE=%s aq status)", r.ws,
			filepath.Join(r.ws, "factory-a", "home"), filepath.Join(r.ws, "factory-a", "src"))
	}
	sum.DurationMS = time.Since(r.start).Milliseconds()
	return sum, nil
}

func (r *run) say(format string, a ...any) { fmt.Fprintf(r.out, format+"\n", a...) }

// routes is the stub's route set.
func (r *run) routes() string {
	if r.o.Routes == "" {
		return coord.RoutesFull
	}
	return r.o.Routes
}

// legacy reports whether the stub serves today's coordinator's routes.
func (r *run) legacy() bool { return r.routes() == coord.RoutesLegacy }

func (r *run) path() string {
	if r.broker {
		return dispatch.LiveBroker
	}
	return dispatch.LivePoll
}

// setup makes the workspace, the repos, the stub, the peer and the two
// daemons, and waits until both take work.
func (r *run) setup(ctx context.Context) (err error) {
	defer func() {
		if err != nil && ctx.Err() == nil {
			r.ob.setupErr = err
		}
	}()
	r.say("aq fleet demo — two factories on one machine: the coordinator stub, the Service Bus peer, two aq daemons")
	r.say("workspace %s", r.ws)
	r.say("")
	r.sig, r.jobs = filepath.Join(r.ws, "signals"), filepath.Join(r.ws, "jobs")
	for _, d := range []string{r.sig, r.jobs, filepath.Join(r.ws, "xdg"), filepath.Join(r.ws, "operator", "src")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return err
		}
	}
	if err := os.WriteFile(filepath.Join(r.ws, "gitconfig"), nil, 0o644); err != nil {
		return err
	}
	names, _ := fs.Glob(jobFiles, "jobs/*.md")
	for _, n := range names {
		b, _ := jobFiles.ReadFile(n)
		if err := os.WriteFile(filepath.Join(r.jobs, jobFileName(n)), b, 0o644); err != nil {
			return err
		}
	}
	r.env = demo.ChildEnv(r.o.Env, r.ws)

	r.say("1. The fleet")
	if err := r.makeRepos(ctx); err != nil {
		return err
	}
	r.say("   repos             %s: bare origins in %s, cloned into each factory's AQ_REPO_BASE",
		strings.Join(repoNames, ", "), filepath.Join(r.ws, "origins"))

	// The broker: the Service Bus peer, when Node and its packages are here.
	peerDir := r.o.PeerDir
	if peerDir == "" {
		peerDir = demo.FindPeerDir(r.aq)
	}
	switch {
	case r.o.NoBroker:
		r.why = "the broker is turned off (NoBroker)"
	default:
		r.why = demo.PeerMissing(r.env, peerDir)
	}
	if r.why == "" {
		p, err := startPeer(peerDir, r.ws, r.env, topic, factoryIDs)
		if err != nil {
			r.why = "the Service Bus peer did not start: " + err.Error()
		} else {
			r.peer, r.broker = p, true
		}
	}
	if r.legacy() {
		// Today's coordinator publishes nothing and has no POST
		// /fleet/accept: a factory given the broker must refuse it.
		r.refuse, r.broker = r.broker, false
		r.why = "the coordinator has no POST /fleet/accept (--routes legacy: the coordinator in service today)"
	}
	r.log = r.o.Log
	if r.log == nil {
		lf, err := os.Create(filepath.Join(r.ws, "coordinator.log"))
		if err != nil {
			return err
		}
		r.logFile = lf
		r.log = slog.New(slog.NewTextHandler(lf, nil))
	}
	if r.broker {
		pub, err := coord.NewPublisher(coord.PublisherOptions{ConnectionString: r.peer.ConnectionString(), Topic: topic, Log: r.log,
			OnSent: func(s coord.Sent) {
				r.sentMu.Lock()
				r.sent = append(r.sent, s)
				r.sentMu.Unlock()
			}})
		if err != nil {
			return err
		}
		r.pub = pub
	}

	// The coordinator stub, in this process.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	stub, err := coord.ServeOn(ctx, ln, coord.Options{LeaseTTL: leaseTTL, StaleAfter: staleAfter, ReapEvery: reapEvery, Publisher: r.pub, Log: r.log, Routes: r.routes()}, nil)
	if err != nil {
		return err
	}
	r.stub = stub // stopped by teardown, after the daemons
	r.api = stub.API
	r.say("   coordinator stub  %s (in this process; lease TTL %s, reaper every %s, a factory is stale after %s)", r.api, leaseTTL, reapEvery, staleAfter)
	if r.broker {
		r.say("   Service Bus peer  node %s on 127.0.0.1:%d (AMQP 1.0); topic %s, one subscription per factory with the rule targetFactoryId = '<id>'",
			filepath.Join(peerDir, "sbpeer.js"), r.peer.Port(), topic)
		r.say("                     the stub publishes one targeted message per queued job; the factories receive with the azservicebus SDK")
	} else {
		r.say("   no Service Bus:   %s — the factories take jobs over the gated poll path (AQ_FLEET_GATE=1) instead", r.why)
	}
	if r.legacy() {
		r.say("   route set legacy: the stub serves exactly the coordinator in service today: no %s",
			strings.Join(coord.ProposedRoutes, ", "))
		if r.refuse {
			r.say("                     each factory is still given the Service Bus peer (AQ_SB_CONNECTION_STRING) and must refuse it at start")
		}
	}

	// The factories.
	for _, id := range factoryIDs {
		f := &factory{id: id, dir: filepath.Join(r.ws, id)}
		f.home, f.base, f.logPath = filepath.Join(f.dir, "home"), filepath.Join(f.dir, "src"), filepath.Join(f.dir, "daemon.log")
		if err := r.cloneRepos(ctx, f.base); err != nil {
			return err
		}
		f.env = append(append([]string{}, r.env...),
			"AQ_HOME="+f.home, "AQ_REPO_BASE="+f.base, "AQ_FACTORY_ID="+id,
			"AQ_FLEET=1", "AQ_FLEET_API="+r.api, "AQ_FLEET_TOKEN="+stub.EnrollToken(),
			// The act's jobs are script jobs: its factories opt in to
			// script (AQ_ENGINES), which a fleet factory does not offer by
			// default, and pass the scripts the two variables they read
			// (AQ_ENGINE_ENV).
			"AQ_ENGINES=all", "AQ_ENGINE_ENV=AQ_FACTORY_ID,AQ_DEMO_SIGNALS",
			fmt.Sprintf("AQ_SLOTS=%d", slots), fmt.Sprintf("AQ_HEARTBEAT_SEC=%d", heartbeat),
			fmt.Sprintf("AQ_FLEET_LEASE_RENEW_SEC=%d", renewEvery), "AQ_POLL_SECONDS=1", "AQ_FLEET_GATE=1",
			"AQ_KILL_GRACE=500ms", "AQ_DEMO_SIGNALS="+r.sig,
			// The jobs' engines signal the demo through AQ_DEMO_SIGNALS, a
			// folder outside their worktrees that a sandbox keeps from the
			// host.
			"AQ_SANDBOX=off")
		if r.broker || r.refuse {
			f.env = append(f.env, "AQ_SB_CONNECTION_STRING="+r.peer.ConnectionString())
		}
		r.facs[id] = f
		r.order = append(r.order, id)
		if err := f.start(r.aq); err != nil {
			return err
		}
	}
	for _, id := range r.order {
		f := r.facs[id]
		var st = f.status()
		err := r.waitFor(ctx, id+" to enroll and take work", func() bool {
			st = f.status()
			if !f.running() {
				return true
			}
			return st != nil && st.PID == f.pid() && st.Stage == "running" && !st.LastHeartbeat.IsZero() && st.Source == r.path()
		})
		if err != nil {
			return err
		}
		if !f.running() {
			return fmt.Errorf("%s's aq daemon exited (%s); its log: %s", id, f.state, f.logPath)
		}
		r.say("   %-17s aq daemon pid %d, AQ_HOME %s; enrolled (token in AQ_HOME/credentials), %d slots, heartbeat every %ds, jobs from: %s",
			id, f.pid(), f.home, st.Slots, heartbeat, st.Source)
		if r.refuse {
			if st.Broker != nil && st.Broker.Refused != "" {
				if r.ob.refused == nil {
					r.ob.refused = map[string]string{}
				}
				r.ob.refused[id] = st.Broker.Refused
				r.say("   %-17s broker refused at start: %s (its status file; the log says it once)", "", st.Broker.Refused)
			}
		}
	}
	return nil
}

// jobFileName strips the ordering prefix: jobs/1-api-health.md → api-health.md.
func jobFileName(n string) string {
	b := filepath.Base(n)
	if _, rest, ok := strings.Cut(b, "-"); ok {
		return rest
	}
	return b
}

// stopAll stops the daemons (drain; a second SIGTERM and SIGKILL only if
// they do not), records how they exited and whether anything was left
// running, then stops the peer.
func (r *run) stopAll(ctx context.Context) {
	drain := 30 * time.Second
	switch {
	case ctx.Err() != nil:
		drain = 2 * time.Second // interrupted: stop the jobs soon
	case r.ob.aborted != nil:
		drain = 10 * time.Second
	}
	if r.ob.stopped == nil {
		r.ob.stopped = map[string]int{}
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	for _, id := range r.order {
		f := r.facs[id]
		if !f.running() {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			code := f.stop(drain)
			mu.Lock()
			r.ob.stopped[f.id] = code
			mu.Unlock()
		}()
	}
	wg.Wait()
	// Anything that still carries one of the demo's job tags, in either home.
	r.ob.leftovers, r.ob.leftoverErr = nil, nil
	for _, id := range r.order {
		scope := runner.Scope(r.facs[id].home)
		for _, j := range jobIDs() {
			pids, err := process.FindScoped(j, scope)
			if err != nil {
				r.ob.leftoverErr = err
				continue
			}
			for _, p := range pids {
				r.ob.leftovers = append(r.ob.leftovers, fmt.Sprintf("%s's %s engine (pid %d)", id, j, p))
			}
		}
	}
	r.peer.Stop()
}

// teardown is the safety net behind stopAll: whatever is still running is
// killed, the stub is closed.
func (r *run) teardown(ctx context.Context) {
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
	defer cancel()
	for _, id := range r.order {
		f := r.facs[id]
		if f.running() {
			f.stop(time.Second)
		}
		for _, j := range jobIDs() {
			_, _ = process.KillScoped(cctx, j, runner.Scope(f.home), 200*time.Millisecond)
		}
	}
	r.peer.Stop()
	if r.stub != nil {
		_ = r.stub.Shutdown(cctx)
	}
	if r.logFile != nil {
		r.logFile.Close()
	}
}

// jobIDs are the ids of the embedded jobs.
func jobIDs() []string {
	names, _ := fs.Glob(jobFiles, "jobs/*.md")
	out := make([]string, 0, len(names))
	for _, n := range names {
		out = append(out, strings.TrimSuffix(jobFileName(n), ".md"))
	}
	sort.Strings(out)
	return out
}

// waitFor polls cond until it holds, ctx is done, or the guard passes.
func (r *run) waitFor(ctx context.Context, what string, cond func() bool) error {
	return r.waitForUpTo(ctx, guard, what, cond)
}

func (r *run) waitForUpTo(ctx context.Context, limit time.Duration, what string, cond func() bool) error {
	deadline := time.Now().Add(limit)
	t := time.NewTicker(50 * time.Millisecond)
	defer t.Stop()
	for !cond() {
		if time.Now().After(deadline) {
			return &timeoutError{what: what, after: limit}
		}
		select {
		case <-ctx.Done():
			return context.Cause(ctx)
		case <-t.C:
		}
	}
	return nil
}

type timeoutError struct {
	what  string
	after time.Duration
}

func (e *timeoutError) Error() string {
	return fmt.Sprintf("gave up waiting for %s after %s (a deadlock guard)", e.what, e.after)
}
