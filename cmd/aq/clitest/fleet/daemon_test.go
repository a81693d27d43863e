//go:build unix && !unit

package fleet

import (
	"context"
	"encoding/json"
	"fmt"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/aqfleet/aq/agent/daemon"
	"github.com/aqfleet/aq/agent/runner"
	"github.com/aqfleet/aq/cmd/aq/cli"
	"github.com/aqfleet/aq/demo/coord"
	"github.com/aqfleet/aq/demo/coord/coordtest"
	"github.com/aqfleet/aq/demo/sbpeer/sbpeertest"
	"github.com/aqfleet/aq/internal/process"
	"github.com/aqfleet/aq/internal/sandbox"
	"github.com/aqfleet/aq/internal/testenv"
	"github.com/aqfleet/aq/job"
)

// These tests run the real aq binary as `aq daemon` against the coordinator
// stub (and the local AMQP peer), and signal and kill it as an operator or
// systemd would.

const daemonGuard = 3 * time.Minute // a deadlock guard, never a speed limit

// daemonEnv is a stub, a home with repo app (bare origin) and the aq binary.
type daemonEnv struct {
	t      testing.TB
	stub   *coord.Server
	h      *testenv.Home
	origin string
	peer   *sbpeertest.Peer
	dir    string // scripts and signal files
}

func newDaemonEnv(t testing.TB, broker bool, env ...string) *daemonEnv {
	var subs []string
	if broker {
		subs = []string{"fleet-dispatch/fa"}
	}
	return newDaemonEnvSubs(t, subs, env...)
}

// newDaemonEnvSubs is newDaemonEnv with a broker whose topic has these
// subscriptions (none: no broker).
func newDaemonEnvSubs(t testing.TB, subs []string, env ...string) *daemonEnv {
	t.Helper()
	return newDaemonEnvRoutes(t, coord.RoutesFull, subs, env...)
}

// newDaemonEnvRoutes is newDaemonEnvSubs with the stub serving a route set
// (legacy: the coordinator in service today, which publishes nothing).
func newDaemonEnvRoutes(t testing.TB, routes string, subs []string, env ...string) *daemonEnv {
	t.Helper()
	testenv.Slow(t, "runs the aq binary") // before the stub, the peer and the repo, not after
	broker := len(subs) > 0
	e := &daemonEnv{t: t, h: testenv.NewHome(t), dir: t.TempDir()}
	e.origin = testenv.AddOrigin(t, e.h.Repo(t, "app", nil))
	co := coord.Options{MaxBackoff: 50 * time.Millisecond, ReapEvery: 100 * time.Millisecond, Routes: routes}
	if broker {
		e.peer = sbpeertest.Start(t, sbpeertest.Options{Subs: subs})
	}
	if broker && routes != coord.RoutesLegacy {
		pub, err := coord.NewPublisher(coord.PublisherOptions{ConnectionString: e.peer.ConnectionString(), Rescan: 100 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		co.Publisher = pub
	}
	s := coordtest.Start(t, co)
	e.stub = s.Server
	// AQ_SANDBOX=off: the jobs' engines (blocking) signal the test through
	// files outside their worktrees, which a sandbox keeps from the host.
	e.h.Env = append([]string{
		"AQ_FLEET=1", "AQ_FLEET_API=" + s.API, "AQ_FLEET_TOKEN=" + s.EnrollToken(), "AQ_FACTORY_ID=fa", "AQ_ENGINES=all",
		"AQ_HEARTBEAT_SEC=1", "AQ_FLEET_LEASE_RENEW_SEC=1", "AQ_SANDBOX=off",
	}, env...)
	if broker {
		e.h.Env = append(e.h.Env, "AQ_SB_CONNECTION_STRING="+e.peer.ConnectionString())
	}
	e.h.Bin = testenv.BuildAQ(t)
	return e
}

// proc is one running aq daemon.
type proc struct {
	cmd      *exec.Cmd
	out, err *testenv.SyncBuffer
	done     chan struct{}
	code     int
}

// One SIGTERM: the running job finishes and is reported, no new claim is
// made (a job submitted meanwhile stays queued), and aq exits 0.
func TestDaemonFirstSignalDrains(t *testing.T) {
	t.Parallel() // its own stub, peer, home and job ids: it runs beside the others
	e := newDaemonEnv(t, false)
	p := e.startDaemon()
	e.waitStage(p, daemon.StageRunning)
	id := testenv.ID("d-drain")
	e.submit(id, e.blocking(id, false))
	e.waitStarted(p, id)
	claims := e.stub.Stats().Count(coord.RouteClaim)
	p.signal(t, syscall.SIGTERM)
	e.waitStage(p, daemon.StageDraining)
	later := testenv.ID("d-drain-later")
	e.submit(later, "echo later > later.txt\n")
	testenv.WriteFile(t, e.path(id, "go"), "")
	if code := p.wait(t); code != 0 {
		t.Fatalf("exit %d\n%s", code, p.err)
	}
	if e.jobStage(id) != coord.StageShipped || e.jobStage(later) != coord.StageQueued {
		t.Fatalf("stages %s, %s", e.jobStage(id), e.jobStage(later))
	}
	if n := e.stub.Stats().Count(coord.RouteClaim); n != claims {
		t.Fatalf("%d claims after SIGTERM", n-claims)
	}
	if st := e.status(); st.Stage != daemon.StageStopped || st.Alive() {
		t.Fatalf("status %+v", st)
	}
}

// Two SIGTERMs: the running job is stopped through the kill ladder,
// checkpointed (its WIP ref is on origin), failed through /fleet/fail, and
// its lease is released at once; aq exits 0.
func TestDaemonSecondSignalCheckpointsAndFails(t *testing.T) {
	t.Parallel() // its own stub, peer, home and job ids: it runs beside the others
	e := newDaemonEnv(t, false)
	p := e.startDaemon()
	e.waitStage(p, daemon.StageRunning)
	id := testenv.ID("d-abort")
	e.submit(id, e.blocking(id, false))
	e.waitStarted(p, id)
	p.signal(t, syscall.SIGTERM)
	e.waitStage(p, daemon.StageDraining)
	p.signal(t, syscall.SIGTERM)
	if code := p.wait(t); code != 0 {
		t.Fatalf("exit %d\n%s", code, p.err)
	}
	j, _ := e.stub.Job(id)
	if j.Stage != coord.StageQueued || j.Holder != "" || !j.LeaseExpiresAt.IsZero() || j.Reason != string(job.ReasonInterrupted) {
		t.Fatalf("the lease was not released: %+v", j)
	}
	if n := e.stub.Stats().Count(coord.RouteFail); n != 1 {
		t.Fatalf("%d /fleet/fail calls", n)
	}
	sha := testenv.RemoteRefs(t, e.origin, "refs/heads/aq/wip/")["refs/heads/aq/wip/"+id]
	if sha == "" || j.Checkpoint != sha {
		t.Fatalf("WIP on origin %q, checkpoint %q", sha, j.Checkpoint)
	}
	if files := testenv.TreeFiles(t, e.origin, sha); !strings.Contains(files["wip.txt"], "wip of "+id) {
		t.Fatalf("checkpoint files %v", files)
	}
	if pid := readPID(t, e.path(id, "pid")); process.Alive(pid) {
		t.Fatalf("the engine (pid %d) still runs", pid)
	}
}

// A third signal exits at once, while the second stage still waits on an
// engine that ignores SIGINT and SIGTERM (the ladder's SIGKILL is seconds
// away): nothing was reported yet, exit 1.
func TestDaemonThirdSignalExitsAtOnce(t *testing.T) {
	t.Parallel() // its own stub, peer, home and job ids: it runs beside the others
	e := newDaemonEnv(t, false, "AQ_KILL_GRACE=30s")
	p := e.startDaemon()
	e.waitStage(p, daemon.StageRunning)
	id := testenv.ID("d-third")
	e.submit(id, e.blocking(id, true))
	e.waitStarted(p, id)
	t.Cleanup(func() { _, _ = process.KillScoped(context.Background(), id, runner.Scope(e.h.Dir), 0) })
	p.signal(t, syscall.SIGTERM)
	e.waitStage(p, daemon.StageDraining)
	p.signal(t, syscall.SIGTERM)
	e.waitStage(p, daemon.StageAborting)
	p.signal(t, syscall.SIGTERM)
	if code := p.wait(t); code != 1 {
		t.Fatalf("exit %d, want 1\n%s", code, p.err)
	}
	if !strings.Contains(p.err.String(), "aq: stopped at once on a third signal") {
		t.Fatalf("stderr:\n%s", p.err)
	}
	if n := e.stub.Stats().Count(coord.RouteFail); n != 0 {
		t.Fatalf("%d /fleet/fail calls before the third signal's exit", n)
	}
}

// A heartbeat answered 401 (the factory's token revoked) stops the daemon
// with one clear line and exit 5.
func TestDaemonHeartbeat401Exits5(t *testing.T) {
	t.Parallel() // its own stub, peer, home and job ids: it runs beside the others
	e := newDaemonEnv(t, false)
	p := e.startDaemon()
	e.waitStage(p, daemon.StageRunning)
	if err := e.stub.RevokeFactory("fa"); err != nil {
		t.Fatal(err)
	}
	if code := p.wait(t); code != 5 {
		t.Fatalf("exit %d, want 5\n%s", code, p.err)
	}
	var last string
	for _, l := range strings.Split(strings.TrimSpace(p.err.String()), "\n") {
		if strings.HasPrefix(l, "aq: ") {
			last = l
		}
	}
	if !strings.Contains(last, "refused this factory's credentials (401") || !strings.Contains(last, "AQ_FLEET_TOKEN") {
		t.Fatalf("the error line: %q\nstderr:\n%s", last, p.err)
	}
	if strings.Contains(p.err.String(), e.stub.EnrollToken()) {
		t.Fatal("a token reached stderr")
	}
}

func readPID(t *testing.T, path string) int {
	t.Helper()
	pid, err := strconv.Atoi(strings.TrimSpace(testenv.ReadFile(t, path)))
	if err != nil {
		t.Fatal(err)
	}
	return pid
}

// kill -9 mid-job, then a restart: the engine's supervisor stops it with
// its aq; at the restart, before any new work, the orphan's worktree is
// checkpointed and the WIP ref pushed, and /fleet/fail (crash, retryable)
// sent at the recorded epoch; then the job runs again here, resuming from
// the checkpoint. aq status shows the killed daemon as not running, and the
// live one with its job, epoch, heartbeat and source.
func TestDaemonKill9ThenRestartRecovers(t *testing.T) {
	t.Parallel() // its own stub, peer, home and job ids: it runs beside the others
	e := newDaemonEnv(t, false)
	p := e.startDaemon()
	e.waitStage(p, daemon.StageRunning)
	id := testenv.ID("d-kill9")
	// First run: wip.txt, then wait forever; later runs finish.
	e.submit(id, fmt.Sprintf(`echo run >> %q
if [ "$(wc -l < %q)" -gt 1 ]; then echo "work of %s" > result.txt; exit 0; fi
echo $$ > %q
echo "wip of %s" > wip.txt
while :; do sleep 0.05; done
`, e.path(id, "runs"), e.path(id, "runs"), id, e.path(id, "pid"), id))
	e.waitStarted(p, id)
	e.waitFor(p, "the job in the status file", func() bool { st := e.status(); return st != nil && st.Busy == 1 })

	// aq status while it runs: slots, the job with its epoch, the heartbeat, the source.
	r := e.h.Run(t, "status", "--json")
	var b struct {
		Daemon *cli.DaemonStatus `json:"daemon"`
	}
	if r.Code != 0 || json.Unmarshal([]byte(r.Stdout), &b) != nil || b.Daemon == nil {
		t.Fatalf("status: %s", r)
	}
	if d := b.Daemon; !d.Alive || d.Slots != 1 || d.Source != "poll" || d.LastHeartbeat.IsZero() || len(d.Running) != 1 ||
		d.Running[0].JobID != id || d.Running[0].LeaseEpoch != 1 {
		t.Fatalf("daemon status %+v", d)
	}
	// How the daemon runs engines (its AQ_SANDBOX=off), as it offers it.
	if sb := b.Daemon.Sandbox; sb == nil || sb.Mode != sandbox.ModeOff || sb.Level != sandbox.LevelNone {
		t.Fatalf("the daemon's sandbox in its status: %+v", sb)
	}
	if r := e.h.Run(t, "status"); !strings.Contains(r.Stdout, "daemon: running") || !strings.Contains(r.Stdout, id) {
		t.Fatalf("status text:\n%s", r.Stdout)
	}

	if err := p.cmd.Process.Kill(); err != nil { // SIGKILL to aq alone
		t.Fatal(err)
	}
	p.wait(t)
	engine := readPID(t, e.path(id, "pid"))
	// No engine runs on without its aq (a deadline guard, not a timing).
	for deadline := time.Now().Add(15 * time.Second); process.Alive(engine); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the engine (pid %d) outlived its aq", engine)
		}
	}
	if r := e.h.Run(t, "status"); !strings.Contains(r.Stdout, "daemon: not running") {
		t.Fatalf("status after kill -9:\n%s", r.Stdout)
	}

	p2 := e.startDaemon()
	e.waitFor(p2, id+" shipped", func() bool { return e.jobStage(id) == coord.StageShipped })
	k := e.kinds(id)
	fail := slices.Index(k, "fail:queued")
	if fail < 0 || slices.Index(k, "claimed") > fail || !slices.Contains(k[fail:], "claimed") {
		t.Fatalf("audit %v: want claimed, fail:queued (recovery, before new work), claimed", k)
	}
	for _, ev := range e.stub.Events(id) {
		if ev.Kind == "fail" && (ev.Epoch != 1 || ev.Detail != string(job.ReasonCrash)) {
			t.Fatalf("recovery's fail: %+v", ev)
		}
	}
	if process.Alive(engine) {
		t.Fatalf("the orphan's engine (pid %d) still runs", engine)
	}
	files := testenv.TreeFiles(t, e.origin, "refs/heads/"+job.JobBranch(id))
	if !strings.Contains(files["wip.txt"], "wip of "+id) || !strings.Contains(files["result.txt"], "work of "+id) {
		t.Fatalf("the re-run did not resume from the checkpoint: %v", files)
	}
	p2.signal(t, syscall.SIGTERM)
	if code := p2.wait(t); code != 0 {
		t.Fatalf("exit %d\n%s", code, p2.err)
	}
}

// On the broker path the real binary receives its job from the stub's
// targeted message: accepted, never claimed.
func TestDaemonBrokerPath(t *testing.T) {
	t.Parallel() // its own stub, peer, home and job ids: it runs beside the others
	e := newDaemonEnv(t, true, "AQ_FLEET_GATE=1")
	p := e.startDaemon()
	e.waitFor(p, "the broker path", func() bool { st := e.status(); return st != nil && st.Source == "broker" })
	id := testenv.ID("d-broker")
	e.submit(id, "echo hi > hi.txt\n")
	e.waitFor(p, id+" shipped", func() bool { return e.jobStage(id) == coord.StageShipped })
	st := e.stub.Stats()
	if st.Took(coord.RouteAccept) != 1 || st.Count(coord.RouteClaim) != 0 || st.Count(coord.RouteQueueState) != 0 {
		t.Fatalf("stub counters %+v", st.Routes)
	}
	if strings.Contains(p.err.String(), "SharedAccessKey=") {
		t.Fatal("the connection string reached the log")
	}
	p.signal(t, syscall.SIGINT)
	if code := p.wait(t); code != 0 {
		t.Fatalf("exit %d\n%s", code, p.err)
	}
}

func (e *daemonEnv) startDaemon(args ...string) *proc {
	e.t.Helper()
	p := &proc{cmd: e.h.Command(e.t, append([]string{"daemon"}, args...)...), out: &testenv.SyncBuffer{}, err: &testenv.SyncBuffer{}, done: make(chan struct{})}
	p.cmd.Stdout, p.cmd.Stderr = p.out, p.err
	if err := p.cmd.Start(); err != nil {
		e.t.Fatal(err)
	}
	go func() {
		_ = p.cmd.Wait()
		p.code = p.cmd.ProcessState.ExitCode()
		close(p.done)
	}()
	e.t.Cleanup(func() {
		select {
		case <-p.done:
		default:
			_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
			<-p.done
		}
	})
	return p
}

func (p *proc) signal(t testing.TB, s syscall.Signal) {
	t.Helper()
	if err := p.cmd.Process.Signal(s); err != nil {
		t.Fatal(err)
	}
}

// wait waits for the daemon to exit and returns its exit code.
func (p *proc) wait(t testing.TB) int {
	t.Helper()
	select {
	case <-p.done:
		return p.code
	case <-time.After(daemonGuard):
		t.Fatalf("aq daemon still running (deadlock?)\nstderr:\n%s", p.err)
	}
	return -1
}

func (e *daemonEnv) waitFor(p *proc, what string, cond func() bool) {
	e.t.Helper()
	deadline := time.Now().Add(daemonGuard)
	for !cond() {
		select {
		case <-p.done:
			if !cond() {
				e.t.Fatalf("aq daemon exited %d while waiting for %s\nstderr:\n%s", p.code, what, p.err)
			}
			return
		default:
		}
		if time.Now().After(deadline) {
			e.t.Fatalf("timed out waiting for %s\nstderr:\n%s", what, p.err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func (e *daemonEnv) status() *daemon.Status {
	st, _ := daemon.ReadStatus(filepath.Join(e.h.Dir, "state"))
	return st
}

func (e *daemonEnv) waitStage(p *proc, s daemon.Stage) {
	e.t.Helper()
	e.waitFor(p, "daemon stage "+string(s), func() bool { st := e.status(); return st != nil && st.Stage == s })
}

func (e *daemonEnv) path(id, what string) string { return filepath.Join(e.dir, id+"."+what) }

// submit writes a script job for id (its body is the script) and submits it
// with aq submit.
func (e *daemonEnv) submit(id, script string) {
	e.t.Helper()
	sp := filepath.Join(e.dir, id+".sh")
	testenv.WriteFile(e.t, sp, script)
	m := testenv.Manifest(e.t, e.t.TempDir(), id, "repo: app\nengine: script\nship: branch\nscript: /bin/sh "+sp)
	if r := e.h.Run(e.t, "submit", m); r.Code != 0 {
		e.t.Fatalf("submit %s: %s", id, r)
	}
}

// blocking is a script that records its pid, writes wip.txt, and waits for
// the go file; with ignoreSignals it ignores SIGINT and SIGTERM (only SIGKILL
// ends it), so the kill ladder runs to its end.
func (e *daemonEnv) blocking(id string, ignoreSignals bool) string {
	trap := ""
	if ignoreSignals {
		trap = "trap '' INT TERM\n"
	}
	return fmt.Sprintf(`%secho $$ > %q
echo "wip of %s" > wip.txt
echo run >> %q
while [ ! -f %q ]; do sleep 0.02; done
echo "work of %s" > result.txt
`, trap, e.path(id, "pid"), id, e.path(id, "runs"), e.path(id, "go"), id)
}

func (e *daemonEnv) waitStarted(p *proc, id string) {
	e.t.Helper()
	e.waitFor(p, id+" to start", func() bool { return testenv.Exists(e.path(id, "pid")) })
}

func (e *daemonEnv) jobStage(id string) string {
	j, _ := e.stub.Job(id)
	return j.Stage
}

func (e *daemonEnv) kinds(id string) []string {
	var out []string
	for _, ev := range e.stub.Events(id) {
		s := ev.Kind
		if ev.Kind == "stage" || ev.Kind == "fail" {
			s += ":" + ev.Stage
		}
		out = append(out, s)
	}
	return out
}
