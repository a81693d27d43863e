//go:build unix && !unit

package fleet

import (
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/aqfleet/aq/agent/daemon"
	"github.com/aqfleet/aq/cmd/aq/clitest"
	"github.com/aqfleet/aq/demo/coord"
	"github.com/aqfleet/aq/demo/coord/coordtest"
	"github.com/aqfleet/aq/demo/sbpeer/sbpeertest"
	"github.com/aqfleet/aq/internal/testenv"
)

// sessionFleet is the stub (publishing with SessionId = repo), the peer
// with pool p's subscription requiring sessions, and one home per factory —
// each a replica of pool p with clones of the repos app, lib and web.
type sessionFleet struct {
	t     *testing.T
	stub  *coord.Server
	peer  *sbpeertest.Peer
	homes map[string]*testenv.Home
	first string // the factory whose home submits
	dir   string
}

const sessionPool = "p"

func newSessionFleet(t *testing.T, slots int, factories ...string) *sessionFleet {
	t.Helper()
	testenv.Slow(t, "runs the aq binary") // before the peer and the stub, not after
	clitest.CleanEnv(t)
	f := &sessionFleet{t: t, homes: map[string]*testenv.Home{}, first: factories[0], dir: t.TempDir()}
	f.peer = sbpeertest.Start(t, sbpeertest.Options{Subs: []string{"fleet-dispatch/" + sessionPool}, Sessions: []string{"fleet-dispatch/" + sessionPool}})
	pub, err := coord.NewPublisher(coord.PublisherOptions{ConnectionString: f.peer.ConnectionString(), Rescan: 100 * time.Millisecond,
		Sessions: true, Redispatch: -1})
	if err != nil {
		t.Fatal(err)
	}
	s := coordtest.Start(t, coord.Options{MaxBackoff: 50 * time.Millisecond, ReapEvery: 100 * time.Millisecond, Publisher: pub})
	f.stub = s.Server
	origins := map[string]string{}
	bin := testenv.BuildAQ(t)
	for i, id := range factories {
		h := testenv.NewHome(t)
		h.Bin = bin
		for _, repo := range []string{"app", "lib", "web"} {
			if i == 0 {
				origins[repo] = testenv.AddOrigin(t, h.Repo(t, repo, nil))
			} else {
				testenv.Git(t, h.RepoBase, "clone", "-q", origins[repo], repo)
			}
		}
		// AQ_SANDBOX=off: the jobs' engines wait for files outside their
		// worktrees, which a sandbox keeps from the host.
		h.Env = []string{
			"AQ_SANDBOX=off",
			"AQ_FLEET=1", "AQ_FLEET_API=" + s.API, "AQ_FLEET_TOKEN=" + s.EnrollToken(), "AQ_FACTORY_ID=" + id, "AQ_ENGINES=all",
			"AQ_FACTORY_POOL=" + sessionPool, "AQ_HEARTBEAT_SEC=1", "AQ_FLEET_LEASE_RENEW_SEC=1",
			"AQ_SB_CONNECTION_STRING=" + f.peer.ConnectionString(), "AQ_SB_SESSIONS=1", "AQ_SLOTS=" + strconv.Itoa(slots),
			"AQ_METRICS_ADDR=127.0.0.1:0",
		}
		f.homes[id] = h
	}
	return f
}

func (f *sessionFleet) start(id string) *proc {
	f.t.Helper()
	e := &daemonEnv{t: f.t, h: f.homes[id]}
	p := e.startDaemon()
	e.waitFor(p, id+" on the broker path", func() bool { st := e.status(); return st != nil && st.Source == "broker" })
	return p
}

func (f *sessionFleet) status(id string) *daemon.Status {
	st, _ := daemon.ReadStatus(filepath.Join(f.homes[id].Dir, "state"))
	return st
}

func (f *sessionFleet) path(id, what string) string { return filepath.Join(f.dir, id+"."+what) }

// submit submits job id on repo: a script that records its start, then
// waits for its go file (block) or not.
func (f *sessionFleet) submit(id, repo string, block bool) {
	f.t.Helper()
	script := fmt.Sprintf("echo started > %q\necho %s > result.txt\n", f.path(id, "started"), id)
	if block {
		script += fmt.Sprintf("while [ ! -f %q ]; do sleep 0.02; done\n", f.path(id, "go"))
	}
	sp := f.path(id, "sh")
	testenv.WriteFile(f.t, sp, script)
	h := f.homes[f.first]
	m := testenv.Manifest(f.t, f.t.TempDir(), testenv.ID(id), "repo: "+repo+"\nengine: script\nship: branch\nscript: /bin/sh "+sp)
	if r := h.Run(f.t, "submit", m); r.Code != 0 {
		f.t.Fatalf("submit %s: %s", id, r)
	}
}

func (f *sessionFleet) release(id string) { testenv.WriteFile(f.t, f.path(id, "go"), "go\n") }

// waitFor waits for cond (a deadlock guard, never a speed limit), failing
// early when a daemon exits.
func (f *sessionFleet) waitFor(what string, procs []*proc, cond func() bool) {
	f.t.Helper()
	deadline := time.Now().Add(daemonGuard)
	for !cond() {
		for _, p := range procs {
			select {
			case <-p.done:
				f.t.Fatalf("a daemon exited %d while waiting for %s\nstderr:\n%s", p.code, what, p.err)
			default:
			}
		}
		if time.Now().After(deadline) {
			f.t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func (f *sessionFleet) stage(id string) string {
	j, _ := f.stub.Job(testenv.ID(id))
	return j.Stage
}

// jobRun is one job's run as the stub's audit trail has it: from the accept
// that gave a factory its lease to the report that ended it.
type jobRun struct {
	job, repo, factory string
	from, to           time.Time
}

// runs reads each job's run from the stub's events (one run each here).
func (f *sessionFleet) runs(jobs map[string]string) []jobRun {
	f.t.Helper()
	var out []jobRun
	for id, repo := range jobs {
		r := jobRun{job: id, repo: repo}
		for _, ev := range f.stub.Events(testenv.ID(id)) {
			switch {
			case ev.Kind == "accepted":
				if !r.from.IsZero() {
					f.t.Fatalf("%s was accepted twice: %+v", id, f.stub.Events(testenv.ID(id)))
				}
				r.from, r.factory = ev.At, ev.Factory
			case ev.Kind == "stage" && ev.Stage == coord.StageShipped:
				r.to = ev.At
			}
		}
		if r.from.IsZero() || r.to.IsZero() {
			f.t.Fatalf("%s: no accept or no shipped report in %+v", id, f.stub.Events(testenv.ID(id)))
		}
		out = append(out, r)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].from.Before(out[j].from) })
	return out
}

func overlap(a, b jobRun) bool { return a.from.Before(b.to) && b.from.Before(a.to) }

// stopAll drains the daemons (SIGTERM) and checks they exit 0.
func stopAll(t *testing.T, procs ...*proc) {
	t.Helper()
	for _, p := range procs {
		p.signal(t, syscall.SIGTERM)
	}
	for _, p := range procs {
		if code := p.wait(t); code != 0 {
			t.Fatalf("exit %d\n%s", code, p.err)
		}
	}
}

// The proof, with the real binary: two aq daemons are replicas of one pool
// whose subscription requires sessions; the stub publishes every job with
// SessionId = its repo. Three jobs of repo app and one each of lib and web,
// all submitted at once: the stub's audit trail shows app's jobs ran one
// after another, in order (never two at once, across both factories),
// while lib and web ran at the same time as app.
func TestDaemonSessionsSerialiseARepoFleetWide(t *testing.T) {
	f := newSessionFleet(t, 2, "fa", "fb")
	pa, pb := f.start("fa"), f.start("fb")
	procs := []*proc{pa, pb}
	// Both wait for a session before the first job is published.
	f.waitFor("both factories waiting for a session", procs, func() bool {
		evs, _ := f.peer.Events()
		return len(sbpeertest.Filter(evs, func(e sbpeertest.Event) bool { return e.Event == "session-wait" })) >= 2
	})
	jobs := map[string]string{"app-1": "app", "app-2": "app", "app-3": "app", "lib-1": "lib", "web-1": "web"}
	for _, id := range []string{"app-1", "lib-1", "app-2", "web-1", "app-3"} {
		f.submit(id, jobs[id], true)
	}
	started := func(id string) bool { return testenv.Exists(f.path(id, "started")) }
	f.waitFor("app-1, lib-1 and web-1 running", procs, func() bool { return started("app-1") && started("lib-1") && started("web-1") })
	if started("app-2") || started("app-3") {
		t.Fatal("a second job of app started while app-1 runs")
	}
	for _, step := range [][2]string{{"app-1", "app-2"}, {"app-2", "app-3"}} {
		f.release(step[0])
		f.waitFor(step[1]+" running", procs, func() bool { return started(step[1]) })
	}
	for _, id := range []string{"app-3", "lib-1", "web-1"} {
		f.release(id)
	}
	f.waitFor("every job shipped", procs, func() bool {
		for id := range jobs {
			if f.stage(id) != coord.StageShipped {
				return false
			}
		}
		return true
	})

	runs := f.runs(jobs)
	var app []string
	factories := map[string]bool{}
	parallel := false
	for i, a := range runs {
		factories[a.factory] = true
		if a.repo == "app" {
			app = append(app, a.job)
		}
		for _, b := range runs[i+1:] {
			switch {
			case a.repo == b.repo && overlap(a, b):
				t.Fatalf("%s (%s, %v–%v) and %s (%s, %v–%v) of repo %s ran at once", a.job, a.factory, a.from, a.to, b.job, b.factory, b.from, b.to, a.repo)
			case a.repo != b.repo && overlap(a, b):
				parallel = true
			}
		}
	}
	if strings.Join(app, " ") != "app-1 app-2 app-3" {
		t.Fatalf("app's jobs ran in the order %v", app)
	}
	if !parallel {
		t.Fatalf("no two jobs of different repos ran at once: %+v", runs)
	}
	if !factories["fa"] || !factories["fb"] {
		t.Fatalf("the jobs ran on %v; want both factories", factories)
	}
	if st := f.stub.Stats(); st.Count(coord.RouteClaim) != 0 {
		t.Fatalf("a factory polled: %+v", st.Routes)
	}
	// The daemon counts the sessions it held.
	if n := sessionsMetric(t, f.status("fa"), "accepted") + sessionsMetric(t, f.status("fb"), "accepted"); n < 3 {
		t.Fatalf("aq_dispatch_sessions_total{event=accepted} adds up to %v, want at least 3 (app, lib, web)", n)
	}
	stopAll(t, procs...)
}

var reSessions = regexp.MustCompile(`(?m)^aq_dispatch_sessions_total\{event="(\w+)"\} (\S+)$`)

func sessionsMetric(t *testing.T, st *daemon.Status, event string) float64 {
	t.Helper()
	if st == nil || st.MetricsAddr == "" {
		t.Fatal("no metrics address in the status")
	}
	resp, err := http.Get("http://" + st.MetricsAddr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	for _, m := range reSessions.FindAllStringSubmatch(string(b), -1) {
		if m[1] == event {
			v, _ := strconv.ParseFloat(m[2], 64)
			return v
		}
	}
	t.Fatalf("no aq_dispatch_sessions_total{event=%q} in /metrics", event)
	return 0
}

// A session lock lost mid-job (the peer expires it): the job goes on under
// its lease and ships; the repo's next job, published meanwhile, waits for
// the session — it is accepted only after the session was taken again,
// after the first job ended (one slot, one factory).
func TestDaemonSessionLockLostMidJob(t *testing.T) {
	f := newSessionFleet(t, 1, "fa")
	p := f.start("fa")
	procs := []*proc{p}
	f.submit("app-1", "app", true)
	started := func(id string) bool { return testenv.Exists(f.path(id, "started")) }
	f.waitFor("app-1 running", procs, func() bool { return started("app-1") })
	events := func() []sbpeertest.Event {
		evs, err := f.peer.Events()
		if err != nil {
			t.Fatal(err)
		}
		return evs
	}
	// Its message is completed at claim: nothing of app-1 is left in the broker.
	f.waitFor("app-1's message completed", procs, func() bool {
		return len(sbpeertest.Filter(events(), func(e sbpeertest.Event) bool {
			return e.Event == "disposition" && e.Outcome == "complete" && strings.HasPrefix(e.MessageID, testenv.ID("app-1"))
		})) == 1
	})
	if err := f.peer.ExpireSessionLock("fleet-dispatch/"+sessionPool, "app"); err != nil {
		t.Fatal(err)
	}
	var expired time.Time
	for _, e := range events() {
		if e.Event == "session-lock-expired" {
			expired = e.T
		}
	}
	f.submit("app-2", "app", false)
	f.waitFor("app-2 published", procs, func() bool {
		return len(sbpeertest.Filter(events(), func(e sbpeertest.Event) bool {
			return e.Event == "send" && strings.HasPrefix(e.MessageID, testenv.ID("app-2"))
		})) == 1
	})
	if started("app-2") || f.stage("app-2") != coord.StageQueued {
		t.Fatalf("app-2 is %s while app-1 runs", f.stage("app-2"))
	}
	f.release("app-1")
	f.waitFor("both shipped", procs, func() bool {
		return f.stage("app-1") == coord.StageShipped && f.stage("app-2") == coord.StageShipped
	})
	runs := f.runs(map[string]string{"app-1": "app", "app-2": "app"})
	if runs[0].job != "app-1" || overlap(runs[0], runs[1]) {
		t.Fatalf("runs %+v", runs)
	}
	for _, ev := range f.stub.Events(testenv.ID("app-1")) {
		if ev.Kind == "reaped" || ev.Kind == "fenced" || ev.Kind == "fail" || ev.Kind == "released" {
			t.Fatalf("app-1 did not run to its end under its lease: %+v", f.stub.Events(testenv.ID("app-1")))
		}
	}
	// app-2 went to a holder of the session that took it after the expiry.
	evs := events()
	var deliver sbpeertest.Event
	for _, e := range evs {
		if e.Event == "deliver" && strings.HasPrefix(e.MessageID, testenv.ID("app-2")) {
			deliver = e
		}
	}
	ok := false
	for _, e := range evs {
		if e.Event == "session-accept" && e.Session == "app" && e.Link == deliver.Link && e.T.After(expired) {
			ok = true
		}
	}
	if !ok {
		t.Fatalf("app-2 was delivered on link %s, which did not take the session after its lock expired at %v", deliver.Link, expired)
	}
	stopAll(t, p)
}

// Bad input: a factory without AQ_SB_SESSIONS on a subscription that
// requires sessions stops at once with one line saying so (exit 2); the
// broker refused its receiver, nothing was taken.
func TestDaemonSessionsOffOnASessionSubscription(t *testing.T) {
	f := newSessionFleet(t, 1, "fa")
	h := f.homes["fa"]
	h.Env = append(h.Env, "AQ_SB_SESSIONS=0")
	e := &daemonEnv{t: t, h: h}
	p := e.startDaemon()
	if code := p.wait(t); code != 2 {
		t.Fatalf("exit %d, want 2\n%s", code, p.err)
	}
	lines := strings.Split(strings.TrimSpace(p.err.String()), "\n")
	last := lines[len(lines)-1]
	if !strings.HasPrefix(last, "aq: subscription fleet-dispatch/Subscriptions/p requires sessions but AQ_SB_SESSIONS is off") ||
		!strings.Contains(last, "set AQ_SB_SESSIONS=1") || strings.Contains(p.err.String(), "SharedAccessKey=") {
		t.Fatalf("last line %q", last)
	}
}
