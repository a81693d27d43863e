//go:build unix && !unit

package fleet

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/aqfleet/aq/demo/coord"
	"github.com/aqfleet/aq/internal/testenv"
)

// These tests run the real aq binary as `aq run` in fleet mode the way a
// scaler runs a replica: against the coordinator stub and the local AMQP
// peer (the real azservicebus SDK), with real git and real processes.

// `aq run --once` with a broker receives one message, runs its job, reports,
// leaves the fleet and exits 0 — without waiting out --wait, and without a
// claim: the job came from the subscription.
func TestRunOnceFromBroker(t *testing.T) {
	t.Parallel() // its own stub, peer, home and job ids: it runs beside the others
	e := newDaemonEnv(t, true)
	id := testenv.ID("once-broker")
	e.submit(id, "echo hi > hi.txt\n")
	other := testenv.ID("once-left")
	r := e.h.Run(t, "run", "--once", "--wait", "2m")
	if r.Code != 0 {
		t.Fatalf("aq run --once: %s", r)
	}
	if got := e.jobStage(id); got != coord.StageShipped {
		t.Fatalf("job %s is %s, want shipped\n%s", id, got, r)
	}
	if !strings.Contains(r.Stdout, "job "+id+": shipped") {
		t.Fatalf("the result line is missing:\n%s", r)
	}
	st := e.stub.Stats()
	if st.Took(coord.RouteAccept) != 1 || st.Count(coord.RouteClaim) != 0 {
		t.Fatalf("accept %d, claim %d: want 1 and 0 (the job came from the broker)", st.Took(coord.RouteAccept), st.Count(coord.RouteClaim))
	}
	// One job, then exit: a job submitted after is left for the next replica.
	e.submit(other, "echo later > later.txt\n")
	if got := e.jobStage(other); got == coord.StageShipped {
		t.Fatalf("the second job ran too")
	}
	assertLeft(t, e.stub, "fa")
	if strings.Contains(r.Stderr, "SharedAccessKey=") {
		t.Fatal("the connection string reached the log")
	}
}

// A replica started for a message another replica already took finds the
// subscription empty: exit 3 once --wait has passed, having accepted
// nothing, and leaves the fleet cleanly.
func TestRunOnceNoMessageExits3(t *testing.T) {
	t.Parallel() // its own stub, peer, home and job ids: it runs beside the others
	e := newDaemonEnv(t, true)
	r := e.h.Run(t, "run", "--once", "--wait", "1s")
	if r.Code != 3 {
		t.Fatalf("aq run --once with nothing to receive: %s", r)
	}
	if !strings.Contains(r.Stderr, "no job arrived from the broker within --wait 1s") {
		t.Fatalf("want one clear line naming --wait:\n%s", r.Stderr)
	}
	if n := e.stub.Stats().Took(coord.RouteAccept); n != 0 {
		t.Fatalf("%d accepts, want 0", n)
	}
	assertLeft(t, e.stub, "fa")
}

// `aq run --drain` with a broker takes messages until none arrives within
// --wait; a failed job makes the exit 1 and the others still run.
func TestRunDrainFromBroker(t *testing.T) {
	t.Parallel() // its own stub, peer, home and job ids: it runs beside the others
	e := newDaemonEnv(t, true)
	ok1, ok2, bad := testenv.ID("drain-a"), testenv.ID("drain-b"), testenv.ID("drain-bad")
	e.submit(ok1, "echo a > a.txt\n")
	e.submit(ok2, "echo b > b.txt\n")
	e.submit(bad, "exit 7\n")
	r := e.h.Run(t, "run", "--drain", "--wait", "3s")
	if r.Code != 1 {
		t.Fatalf("aq run --drain with one failing job: %s", r)
	}
	for _, id := range []string{ok1, ok2} {
		if got := e.jobStage(id); got != coord.StageShipped {
			t.Fatalf("job %s is %s, want shipped\n%s", id, got, r)
		}
	}
	if got := e.jobStage(bad); got == coord.StageShipped || got == coord.StageAssigned || got == coord.StageBuilding {
		t.Fatalf("the failing job is %s\n%s", got, r)
	}
	if n := e.stub.Stats().Took(coord.RouteAccept); n != 3 {
		t.Fatalf("%d accepts, want 3", n)
	}
}

// `aq run --job ID` accepts that one job and runs it (no broker needed);
// a job another factory holds is exit 4, one the coordinator does not have
// exit 3 — each with one line, nothing run.
func TestRunJobByID(t *testing.T) {
	t.Parallel() // its own stub, peer, home and job ids: it runs beside the others
	e := newDaemonEnv(t, false)
	id := testenv.ID("by-id")
	e.submit(id, "echo x > x.txt\n")
	if r := e.h.Run(t, "run", "--job", id); r.Code != 0 || e.jobStage(id) != coord.StageShipped {
		t.Fatalf("aq run --job: %s (job %s)", r, e.jobStage(id))
	}
	if n := e.stub.Stats().Count(coord.RouteClaim); n != 0 {
		t.Fatalf("%d claims, want 0: --job accepts the named job", n)
	}
	for _, c := range []struct {
		name, job, want string
		code            int
	}{
		{"already finished", id, "cannot be accepted (the coordinator answered 409: job " + id + " is shipped", 4},
		{"unknown", "no-such-job", "has no job no-such-job to accept", 3},
	} {
		t.Run(c.name, func(t *testing.T) {
			r := e.h.Run(t, "run", "--job", c.job)
			if r.Code != c.code || !strings.Contains(r.Stderr, c.want) || strings.Count("\n"+r.Stderr, "\naq: ") != 1 {
				t.Fatalf("want exit %d and %q: %s", c.code, c.want, r)
			}
		})
	}
}

// Flags that do not parse or do not fit are exit 2 before anything is
// dialled.
func TestRunReplicaFlagsExit2(t *testing.T) {
	t.Parallel() // its own home, repos and processes: it runs beside the others
	e := newDaemonEnv(t, false)
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"run", "--once", "--wait", "soon"}, "--wait"},
		{[]string{"run", "--once", "--wait", "-1s"}, "--wait -1s is negative"},
		{[]string{"run", "--drain", "--job", "j"}, "--job and --drain cannot be combined"},
	} {
		r := e.h.Run(t, c.args...)
		if r.Code != 2 || !strings.Contains(r.Stderr, c.want) {
			t.Fatalf("%v: want exit 2 naming %q: %s", c.args, c.want, r)
		}
	}
	if n := len(e.stub.Stats().Routes); n != 0 {
		t.Fatalf("the coordinator was called: %+v", e.stub.Stats().Routes)
	}
	local := testenv.NewHome(t)
	local.Bin = e.h.Bin
	if r := local.Run(t, "run", "--job", "j"); r.Code != 2 || !strings.Contains(r.Stderr, "needs fleet mode") {
		t.Fatalf("--job in local mode: %s", r)
	}
}

// assertLeft checks factory id left the fleet: deregistered, offline.
func assertLeft(t *testing.T, s *coord.Server, id string) {
	t.Helper()
	for _, f := range s.AllFactories() {
		if f.ID == id {
			if !f.Deregistered || f.Health != "offline" {
				t.Fatalf("factory %s: deregistered %v, health %q; want it gone", id, f.Deregistered, f.Health)
			}
			return
		}
	}
	t.Fatalf("factory %s never enrolled", id)
}

// A pool scaled to zero is still targeted: a replica of pool "builders"
// registers the pool's offer and leaves; a job submitted while no replica
// is live is published to the pool's subscription, and a new replica — its
// own id, a fresh AQ_HOME — takes it from there and runs it.
func TestPoolReplicas(t *testing.T) {
	t.Parallel() // its own stub, peer, home and job ids: it runs beside the others
	e := newDaemonEnvSubs(t, []string{"fleet-dispatch/builders"}, "AQ_FACTORY_POOL=builders", "AQ_FACTORY_ID=replica-1")
	if r := e.h.Run(t, "run", "--once", "--wait", "1s"); r.Code != 3 {
		t.Fatalf("the first replica, with nothing to do: %s", r)
	}
	pools := e.stub.Pools()
	if len(pools) != 1 || pools[0].Name != "builders" || pools[0].Live != 0 || !slices.Contains(pools[0].Repos, "app") {
		t.Fatalf("pools after the first replica left: %+v", pools)
	}

	id := testenv.ID("pooled")
	e.submit(id, "echo pooled > pooled.txt\n")
	h2 := testenv.NewHome(t) // the next replica: another host, no state
	testenv.AddOrigin(t, h2.Repo(t, "app", nil))
	h2.Bin = e.h.Bin
	h2.Env = append(append([]string{}, e.h.Env...), "AQ_FACTORY_ID=replica-2")
	r := h2.Run(t, "run", "--once", "--wait", "30s")
	if r.Code != 0 || e.jobStage(id) != coord.StageShipped {
		t.Fatalf("the second replica: %s (job %s)", r, e.jobStage(id))
	}
	var accepted []string
	for _, ev := range e.stub.Events(id) {
		if ev.Kind == "accepted" {
			accepted = append(accepted, ev.Factory)
		}
	}
	if !slices.Equal(accepted, []string{"replica-2"}) {
		t.Fatalf("accepted by %v, want replica-2 alone", accepted)
	}
	for _, f := range e.stub.AllFactories() {
		if f.Pool != "builders" {
			t.Fatalf("factory %s advertised pool %q", f.ID, f.Pool)
		}
	}
	assertLeft(t, e.stub, "replica-2")
}

// A replica of a pool whose subscription does not exist is a deployment
// mistake: one clear line naming the subscription and the command that
// makes it, exit 2 at once (not after --wait), nothing accepted or claimed.
func TestRunOnceMissingPoolSubscription(t *testing.T) {
	t.Parallel() // its own stub, peer, home and job ids: it runs beside the others
	e := newDaemonEnvSubs(t, []string{"fleet-dispatch/builders"}, "AQ_FACTORY_POOL=nosuch", "AQ_FACTORY_ID=replica-1")
	r := e.h.Run(t, "run", "--once", "--wait", "2m")
	if r.Code != 2 {
		t.Fatalf("a replica without its subscription: %s", r)
	}
	for _, want := range []string{"fleet-dispatch/nosuch does not exist", "aq servicebus ensure-subscription --pool nosuch"} {
		if !strings.Contains(r.Stderr, want) {
			t.Errorf("stderr lacks %q:\n%s", want, r.Stderr)
		}
	}
	st := e.stub.Stats()
	if st.Took(coord.RouteAccept) != 0 || st.Count(coord.RouteClaim) != 0 {
		t.Fatalf("accepted %d, claims %d: want none", st.Took(coord.RouteAccept), st.Count(coord.RouteClaim))
	}
}

// A replica starts with no clones: AQ_REPO_URLS names where each repo is
// cloned from, the factory offers those repos, and the first job on one
// clones it (blobless) under AQ_REPO_BASE and ships. A repo whose clone
// fails is the job failed repo_unavailable (retryable), nothing left behind.
func TestRunOnceClonesOnDemand(t *testing.T) {
	t.Parallel() // its own stub, peer, home and job ids: it runs beside the others
	e := newDaemonEnv(t, true)
	testenv.Git(t, e.origin, "config", "uploadpack.allowFilter", "true")
	replica := testenv.NewHome(t) // nothing under its repo base
	replica.Bin = e.h.Bin
	urls := filepath.Join(t.TempDir(), "repo-urls")
	testenv.WriteFile(t, urls, "app file://"+e.origin+"\nghost file://"+filepath.Join(t.TempDir(), "ghost.git")+"\n")
	replica.Env = append(append([]string{}, e.h.Env...), "AQ_REPO_URLS="+urls)

	if r := replica.Run(t, "caps", "--json"); r.Code != 0 || !strings.Contains(r.Stdout, `"repo:app"`) || !strings.Contains(r.Stdout, `"repo:ghost"`) {
		t.Fatalf("aq caps does not offer the repos it can clone: %s", r)
	}
	id := testenv.ID("cloned")
	e.submit(id, "echo cloned > cloned.txt\n")
	if r := replica.Run(t, "run", "--once", "--wait", "30s"); r.Code != 0 || e.jobStage(id) != coord.StageShipped {
		t.Fatalf("the job on a repo cloned on demand: %s (job %s)", r, e.jobStage(id))
	}
	app := filepath.Join(replica.RepoBase, "app")
	if got := strings.TrimSpace(testenv.Git(t, app, "config", "remote.origin.partialclonefilter")); got != "blob:none" {
		t.Fatalf("the clone is not blobless (filter %q)", got)
	}

	ghost := testenv.ID("ghost")
	sp := filepath.Join(e.dir, ghost+".sh")
	testenv.WriteFile(t, sp, "echo boo > boo.txt\n")
	m := testenv.Manifest(t, t.TempDir(), ghost, "repo: ghost\nengine: script\nship: branch\nretry:\n  max: 1\nscript: /bin/sh "+sp)
	if r := e.h.Run(t, "submit", m); r.Code != 0 {
		t.Fatalf("submit: %s", r)
	}
	r := replica.Run(t, "run", "--once", "--wait", "30s")
	j, _ := e.stub.Job(ghost)
	if r.Code != 1 || j.Reason != "repo_unavailable" || !strings.Contains(r.Stderr, "cannot clone file://") {
		t.Fatalf("a clone that fails: %s (job %s, reason %q)", r, j.Stage, j.Reason)
	}
	if j.Stage != coord.StageQueued {
		t.Fatalf("the job is %s: a failed clone must be reported retryable (retry.max 1 requeues it)", j.Stage)
	}
	entries, _ := os.ReadDir(replica.RepoBase)
	if len(entries) != 1 || entries[0].Name() != "app" {
		t.Fatalf("the repo base holds %v after a failed clone, want app alone", entries)
	}
}

// Against today's coordinator (legacy routes: no POST /fleet/accept) with a
// broker configured: `aq run --once` says once that the broker path is off
// and claims over the poll path within --wait; with nothing to claim it
// exits 3 saying the poll path ran; `aq run --job` cannot accept a named
// job there — exit 2, one line, nothing run.
func TestRunWithBrokerAgainstLegacyCoordinator(t *testing.T) {
	t.Parallel() // its own stub, peer, home and job ids: it runs beside the others
	e := newDaemonEnvRoutes(t, coord.RoutesLegacy, []string{"fleet-dispatch/fa"})
	id := testenv.ID("legacy-once")
	e.submit(id, "echo hi > hi.txt\n")
	r := e.h.Run(t, "run", "--once", "--wait", "2m")
	if r.Code != 0 || e.jobStage(id) != coord.StageShipped || !strings.Contains(r.Stdout, "job "+id+": shipped") {
		t.Fatalf("aq run --once: %s (job %s)", r, e.jobStage(id))
	}
	if n := strings.Count(r.Stderr, "the coordinator has no POST /fleet/accept route"); n != 1 {
		t.Fatalf("the broker refusal is said %d times:\n%s", n, r.Stderr)
	}
	if n := e.stub.Stats().Count(coord.RouteClaim); n < 1 {
		t.Fatalf("%d claims", n)
	}
	r = e.h.Run(t, "run", "--once", "--wait", "1s")
	if r.Code != 3 || !strings.Contains(r.Stderr, "no job was claimed within --wait 1s") {
		t.Fatalf("nothing to claim: %s", r)
	}
	other := testenv.ID("legacy-by-id")
	e.submit(other, "echo x > x.txt\n")
	r = e.h.Run(t, "run", "--job", other)
	if r.Code != 2 || !strings.Contains(r.Stderr, "aq run --job "+other+" needs POST /fleet/accept") || strings.Count("\n"+r.Stderr, "\naq: ") != 1 {
		t.Fatalf("aq run --job: %s", r)
	}
	if got := e.jobStage(other); got != coord.StageQueued {
		t.Fatalf("the named job is %s", got)
	}
}
