//go:build unix && !unit

package fleet

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/aqfleet/aq/cmd/aq/clitest"
	"github.com/aqfleet/aq/demo/coord"
	"github.com/aqfleet/aq/internal/process"
	"github.com/aqfleet/aq/internal/testenv"
)

// Live logs with real processes: a job runs under one `aq daemon`, and is
// followed with `aq job logs -f` (or the board) from another AQ_HOME — a
// host that shares nothing with the factory but the coordinator.

// operatorHome is another host's AQ_HOME in fleet mode, with an operator's
// token (the stub's enrollment token) and the factory's coordinator.
func operatorHome(t *testing.T, bin string, factoryEnv []string) *testenv.Home {
	t.Helper()
	o := testenv.NewHome(t)
	o.Bin = bin
	for _, kv := range factoryEnv {
		for _, k := range []string{"AQ_FLEET=", "AQ_FLEET_API=", "AQ_FLEET_TOKEN="} {
			if strings.HasPrefix(kv, k) {
				o.Env = append(o.Env, kv)
			}
		}
	}
	return o
}

// follower is a running `aq job logs -f`.
type followProc struct {
	cmd      *exec.Cmd
	out, err *testenv.SyncBuffer
	done     chan int
}

func startFollow(t *testing.T, h *testenv.Home, args ...string) *followProc {
	t.Helper()
	p := &followProc{cmd: h.Command(t, append([]string{"job", "logs", "-f"}, args...)...), out: &testenv.SyncBuffer{}, err: &testenv.SyncBuffer{}, done: make(chan int, 1)}
	p.cmd.Stdout, p.cmd.Stderr = p.out, p.err
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = process.KillGroup(p.cmd.Process.Pid) })
	go func() {
		_ = p.cmd.Wait()
		p.done <- p.cmd.ProcessState.ExitCode()
	}()
	return p
}

// TestLiveLogFollowedFromAnotherHost: a line the engine writes while its
// job runs under `aq daemon` shows in `aq job logs -f` started from another
// AQ_HOME, before the job goes on (the engine waits for the test); then
// the rest of the output, in order, and the job's end, after which the
// follower exits 0. An unknown job: one line, exit 2, at once.
func TestLiveLogFollowedFromAnotherHost(t *testing.T) {
	e := newDaemonEnv(t, false)
	id := testenv.ID("live-follow")
	marker := "written by the engine while " + id + " runs"
	e.submit(id, fmt.Sprintf(`echo %q
while [ ! -f %q ]; do sleep 0.05; done
echo "the engine's last line"
echo done > done.txt
`, marker, e.path(id, "go")))
	op := operatorHome(t, e.h.Bin, e.h.Env)
	fo := startFollow(t, op, id)
	d := e.startDaemon()

	e.waitFor(d, "the engine's line at the follower", func() bool { return strings.Contains(fo.out.String(), marker) })
	if st := e.jobStage(id); st != coord.StageBuilding {
		t.Fatalf("the job is %s while the engine waits", st)
	}
	testenv.WriteFile(t, e.path(id, "go"), "")
	if code := fo.wait(t); code != 0 {
		t.Fatalf("aq job logs -f: exit %d\n%s\n%s", code, fo.out, fo.err)
	}
	out := fo.out.String()
	i0, i1, i2, i3 := strings.Index(out, "engine output of attempt 1, live from factory fa"), strings.Index(out, marker), strings.Index(out, "the engine's last line"), strings.Index(out, "stage shipped")
	if i0 < 0 || i1 < i0 || i2 < i1 || i3 < i2 {
		t.Fatalf("not in order (live note %d, first line %d, last line %d, shipped %d):\n%s", i0, i1, i2, i3, out)
	}
	if strings.Contains(out, "engine output of attempt 1, from factory") {
		t.Fatalf("the artifact was shown as well:\n%s", out)
	}

	// An unknown job: one line and exit 2, at once (no wait for a job
	// that never comes).
	r := op.Run(t, "job", "logs", "-f", "no-such-job-"+id)
	if r.Code != 2 {
		t.Fatalf("unknown job: %s", r)
	}
	clitest.OneErrLine(t, r.Stderr, "the coordinator has no job no-such-job-"+id)
	if show := op.Run(t, "job", "show", "no-such-job-"+id); show.Code != r.Code {
		t.Fatalf("aq job show exits %d, aq job logs -f %d", show.Code, r.Code)
	}
	d.signal(t, syscall.SIGTERM)
	if code := d.wait(t); code != 0 {
		t.Fatalf("daemon exit %d\n%s", code, d.err)
	}
}

// TestLiveLogFencedRunRefused: a running job requeued by an operator is
// fenced by its next live log chunk (409: the run's lease renewals are 30 s
// apart, so the chunk is what tells it); its engine stops, the daemon runs
// the job again under a new lease, and the follower started from another
// host shows both runs in order and the end.
func TestLiveLogFencedRunRefused(t *testing.T) {
	e := newDaemonEnv(t, false, "AQ_FLEET_LEASE_RENEW_SEC=30")
	id := testenv.ID("live-fenced")
	ran := e.path(id, "ran")
	e.submit(id, fmt.Sprintf(`if [ -f %q ]; then echo "the second run"; echo ok > ok.txt; exit 0; fi
touch %q
i=0
while [ $i -lt 6000 ]; do echo "chatty $i"; sleep 0.05; i=$((i+1)); done
`, ran, ran))
	op := operatorHome(t, e.h.Bin, e.h.Env)
	fo := startFollow(t, op, id)
	d := e.startDaemon()
	e.waitFor(d, "the first run's output at the follower", func() bool { return strings.Contains(fo.out.String(), "chatty 5") })
	if r := op.Run(t, "job", "requeue", id); r.Code != 0 {
		t.Fatalf("requeue: %s", r)
	}
	if code := fo.wait(t); code != 0 {
		t.Fatalf("aq job logs -f: exit %d\n%s\n%s", code, fo.out, fo.err)
	}
	var fenced *coord.Event
	for _, ev := range e.stub.Events(id) {
		if ev.Kind == "fenced" && ev.Call == coord.RouteLogAppend {
			fenced = &ev
		}
	}
	if fenced == nil || fenced.Epoch != 1 {
		t.Fatalf("no live log chunk of epoch 1 refused: %v", e.kinds(id))
	}
	if n := e.stub.Stats().Routes[coord.RouteRenew].Status["409"]; n != 0 {
		t.Fatalf("%d renewals refused: the fence was learnt from a renewal, not from the live log", n)
	}
	if !strings.Contains(d.err.String(), "live log of the job stopped: the coordinator refused it (409)") {
		t.Fatalf("the daemon did not say why its live log stopped:\n%s", d.err)
	}
	_, runs := e.stub.LogText(id, 0)
	if len(runs) != 2 || !runs[0].Ended || runs[0].LeaseEpoch != 1 || runs[1].Attempt != 2 {
		t.Fatalf("runs %+v", runs)
	}
	out := fo.out.String()
	i0, i1, i2, i3 := strings.Index(out, "chatty 5"), strings.Index(out, "engine output of attempt 2, live from factory fa"), strings.Index(out, "the second run"), strings.LastIndex(out, "stage shipped")
	if i0 < 0 || i1 < i0 || i2 < i1 || i3 < i2 {
		t.Fatalf("not in order:\n%s", out)
	}
	d.signal(t, syscall.SIGTERM)
	d.wait(t)
}

// stubProc is `aq demo coordinator --state F` as a process a test kills
// (-9) and starts again on the same address.
type stubProc struct {
	t           *testing.T
	bin, state  string
	addr, token string
	cmd         *exec.Cmd
}

// TestLiveLogCoordinatorRestartLosesNothing: the coordinator (the stub as a
// process, with --state) is killed -9 while a job's engine writes and
// started again on the same address: the job ships, its live log carries
// every byte the engine wrote (what waited in the factory's log during the
// outage was sent once the stub was back), and its final artifact is the
// factory's log byte for byte — also after another kill -9 and restart.
func TestLiveLogCoordinatorRestartLosesNothing(t *testing.T) {
	bin := testenv.BuildAQ(t)
	sp := &stubProc{t: t, bin: bin, state: filepath.Join(t.TempDir(), "coord.json")}
	sp.start()
	h := testenv.NewHome(t)
	h.Bin = bin
	testenv.AddOrigin(t, h.Repo(t, "app", nil))
	// AQ_SANDBOX=off: the engine's script waits for a marker outside its
	// worktree, which a sandboxed engine cannot see. AQ_ENGINES=all: a
	// fleet factory runs script jobs only when its operator opts in (#26).
	h.Env = []string{"AQ_FLEET=1", "AQ_FLEET_API=http://" + sp.addr + "/api", "AQ_FLEET_TOKEN=" + sp.token, "AQ_FACTORY_ID=fa",
		"AQ_HEARTBEAT_SEC=1", "AQ_FLEET_LEASE_RENEW_SEC=1", "AQ_SANDBOX=off", "AQ_ENGINES=all"}
	dir := t.TempDir()
	id := testenv.ID("live-restart")
	goFile := filepath.Join(dir, "go")
	script := filepath.Join(dir, "job.sh")
	testenv.WriteFile(t, script, fmt.Sprintf(`i=0
while [ ! -f %q ]; do echo "line $i of the engine's output, long enough to add up: $(date +%%s%%N)"; i=$((i+1)); sleep 0.02; done
echo "the engine's last line"
echo done > done.txt
`, goFile))
	m := testenv.Manifest(t, t.TempDir(), id, "repo: app\nengine: script\nship: branch\nscript: /bin/sh "+script)
	if r := h.Run(t, "submit", m); r.Code != 0 {
		t.Fatalf("submit: %s", r)
	}
	e := &daemonEnv{t: t, h: h, dir: dir}
	d := e.startDaemon()
	logFile := filepath.Join(h.Dir, "logs", id, "stdout.log")
	size := func() int64 {
		st, err := os.Stat(logFile)
		if err != nil {
			return 0
		}
		return st.Size()
	}
	streamed := func() int64 {
		_, n, _, err := sp.liveText(id)
		if err != nil {
			return -1
		}
		return n
	}
	e.waitFor(d, "the live log at the coordinator", func() bool { return streamed() > 2000 })

	sp.kill9()
	before := size()
	e.waitFor(d, "the engine to write on while the coordinator is down", func() bool { return size() > before+5000 })
	sp.start()
	after := size()
	e.waitFor(d, "what waited to reach the coordinator", func() bool { return streamed() >= after })
	testenv.WriteFile(t, goFile, "")
	e.waitFor(d, "the job to ship", func() bool {
		var j coord.Job
		return sp.get("/fleet/jobs/"+id, &j) == nil && j.Stage == coord.StageShipped
	})

	want, err := os.ReadFile(logFile)
	if err != nil {
		t.Fatal(err)
	}
	text, n, ended, err := sp.liveText(id)
	if err != nil || !ended || n != int64(len(want)) || text != string(want) {
		t.Fatalf("the live log (%d bytes, ended %v, %v) is not the factory's log (%d bytes)", n, ended, err, len(want))
	}
	op := operatorHome(t, bin, h.Env)
	for round := range 2 {
		var got testenv.Result
		// The artifact goes up after the final report: wait for it.
		e.waitFor(d, "the final artifact", func() bool {
			got = op.Run(t, "job", "logs", "--stream", "stdout", id)
			return got.Code == 0 && got.Stdout != ""
		})
		if !bytes.Equal([]byte(got.Stdout), want) {
			t.Fatalf("round %d: the final artifact (%d bytes) is not the factory's log (%d bytes)", round, len(got.Stdout), len(want))
		}
		sp.kill9()
		sp.start()
	}
	d.signal(t, syscall.SIGTERM)
	if code := d.wait(t); code != 0 {
		t.Fatalf("daemon exit %d\n%s", code, d.err)
	}
}

// TestBoardTmuxLiveLog: the board's log view (enter on a running job), on
// another host than the job's factory, in a real terminal: the engine's
// line shows while the job runs, then its last line and the job's end.
func TestBoardTmuxLiveLog(t *testing.T) {
	e := newDaemonEnv(t, false)
	id := testenv.ID("live-board")
	marker := "the engine is at work on " + id
	e.submit(id, fmt.Sprintf(`echo %q
touch %q
while [ ! -f %q ]; do sleep 0.05; done
echo "the engine's last line"
echo done > done.txt
`, marker, e.path(id, "started"), e.path(id, "go")))
	d := e.startDaemon()
	e.waitFor(d, "the engine to start", func() bool { return testenv.Exists(e.path(id, "started")) })
	op := operatorHome(t, e.h.Bin, e.h.Env)

	x := testenv.StartTmux(t, op.Environ(), 120, 40, clitest.ShellQuote(op.Bin)+" status --watch --interval 300ms")
	x.WaitText("aq board · fleet", "RUNNING (1)", id)
	clitest.SelectRow(t, x, id)
	x.Keys("Enter")
	s := x.WaitText("aq log", id, "following", "engine output of attempt 1, live from factory fa", marker)
	if st := e.jobStage(id); st != coord.StageBuilding {
		t.Fatalf("the job is %s while the board shows its engine at work:\n%s", st, s)
	}
	testenv.WriteFile(t, e.path(id, "go"), "")
	s = x.WaitText("the engine's last line", "the job ended", "stage shipped")
	t.Logf("log view:\n%s", s)
	x.Keys("Escape")
	x.WaitText("RUNNING (0)")
	x.Keys("q")
	x.WaitText("EXITED 0")
	d.signal(t, syscall.SIGTERM)
	d.wait(t)
}

// wait waits for the follower to end with the job and returns its exit code.
func (p *followProc) wait(t *testing.T) int {
	t.Helper()
	select {
	case code := <-p.done:
		return code
	case <-time.After(daemonGuard):
		t.Fatalf("aq job logs -f did not end with the job:\n%s\n%s", p.out, p.err)
	}
	return -1
}

func (s *stubProc) start() {
	s.t.Helper()
	addr := s.addr
	if addr == "" {
		addr = "127.0.0.1:0"
	} else {
		testenv.WaitFor(s.t, time.Minute, "the stub's port to be free", func() bool {
			ln, err := net.Listen("tcp", addr)
			if err == nil {
				ln.Close()
			}
			return err == nil
		})
	}
	cmd := exec.Command(s.bin, "demo", "coordinator", "--listen", addr, "--state", s.state, "--reap-every", "100ms")
	cmd.Env = append(os.Environ(), "AQ_HOME="+s.t.TempDir())
	process.SetGroup(cmd)
	out, err := cmd.StdoutPipe()
	if err != nil {
		s.t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		s.t.Fatal(err)
	}
	s.cmd = cmd
	s.t.Cleanup(func() { _ = process.KillGroup(cmd.Process.Pid); _ = cmd.Wait() })
	sc := bufio.NewScanner(out)
	for sc.Scan() {
		l := sc.Text()
		if _, after, ok := strings.Cut(l, "listening on http://"); ok {
			s.addr = strings.TrimSuffix(after, "/api")
		}
		if tok, ok := strings.CutPrefix(l, "enrollment token: "); ok {
			s.token = tok
			go io.Copy(io.Discard, out)
			return
		}
	}
	s.t.Fatal("the stub did not start")
}

func (s *stubProc) kill9() {
	s.t.Helper()
	_ = s.cmd.Process.Signal(syscall.SIGKILL)
	_ = s.cmd.Wait()
}

// get is an operator's GET on the stub, decoded.
func (s *stubProc) get(path string, v any) error {
	req, _ := http.NewRequest("GET", "http://"+s.addr+path, nil)
	req.Header.Set("Authorization", "Bearer "+s.token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		return fmt.Errorf("%s: %s", path, resp.Status)
	}
	return json.NewDecoder(resp.Body).Decode(v)
}

// liveText is the stub's live log of a job's latest run: its output and
// gaps as "[gap N]", its size, and whether it ended.
func (s *stubProc) liveText(id string) (string, int64, bool, error) {
	var b strings.Builder
	var off int64
	for {
		var p coord.LogPage
		if err := s.get(fmt.Sprintf("/fleet/jobs/%s/log?offset=%d", id, off), &p); err != nil {
			return "", 0, false, err
		}
		for _, r := range p.Records {
			if r.Kind == "gap" {
				fmt.Fprintf(&b, "[gap %d]", r.Size)
				continue
			}
			b.WriteString(r.Text)
		}
		if p.Next == off {
			return b.String(), p.Next, p.Ended, nil
		}
		off = p.Next
	}
}
