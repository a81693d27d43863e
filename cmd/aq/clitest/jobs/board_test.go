//go:build !unit

package jobs

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/aqfleet/aq/cmd/aq/clitest"
	"github.com/aqfleet/aq/demo/coord"
	"github.com/aqfleet/aq/internal/process"
	"github.com/aqfleet/aq/internal/testenv"
	"github.com/aqfleet/aq/job"
)

// TestBoardTmuxLocal: the board of a local queue in a real terminal — a
// running job with its phase, usage and the engine's last event, a job
// waiting and why, a failure and its reason; the live log of the running
// job; requeue through r and y, after which the job really is in the inbox;
// a resize; Ctrl-C exits 0 and gives the terminal back.
func TestBoardTmuxLocal(t *testing.T) {
	t.Parallel() // its own home, repos and processes: it runs beside the others
	testenv.Slow(t, "drives the live board in a real tmux")
	h, mark := clitest.MarkedHome(t)
	h.Repo(t, "app", nil)
	h.Repo(t, "other", nil)
	h.Submit(t, "tmux-broken", clitest.ScriptJob("app", "exit 2", "retry: {max: 0}"))
	if r := h.Run(t, "run", "--once"); r.Code != 1 {
		t.Fatalf("broken: %s", r)
	}
	h.Submit(t, "tmux-long", clitest.ScriptJob("app", `echo '::aq-usage tokens_in=1200 tokens_out=300 cost_usd=0.25 turns=2'
echo "editing the parser now"
touch "$MARK/started"
while [ ! -e "$MARK/go" ]; do sleep 0.05; done
echo done > done.txt`, "ship: branch"))
	h.Submit(t, "tmux-child", clitest.ScriptJob("other", "true", "deps: ["+testenv.ID("tmux-long")+"]"))
	aq := clitest.Start(t, h, "run", "--once")
	aq.WaitMark(mark, "started")
	// Submitted once long runs: runnable, waiting for the next aq run.
	h.Submit(t, "tmux-next", clitest.ScriptJob("other", "true"))

	long, child, broken, next := testenv.ID("tmux-long"), testenv.ID("tmux-child"), testenv.ID("tmux-broken"), testenv.ID("tmux-next")
	x := testenv.StartTmux(t, h.Environ(), 120, 40, clitest.ShellQuote(h.Bin)+" status --watch --interval 300ms")
	s := x.WaitText("aq board · local", "RUNNING (1)", long, "1.5k tok $0.2500", "editing the parser now", "RUNNABLE — next for aq run (1)", next,
		"WAITING (1)", child, "waits for all of: "+long, "FAILED (1)", broken, "engine_failed: script exited 2", "q quit")
	if !regexp.MustCompile(`(?m)^> ` + regexp.QuoteMeta(long) + `\s+app\s+script\s+engine\s+\d+s`).MatchString(s) {
		t.Fatalf("the running row (cursor, repo, engine, phase, elapsed):\n%s", s)
	}
	if !regexp.MustCompile(`(?m)^  ` + regexp.QuoteMeta(next) + `\s+other\s+script\s+priority normal`).MatchString(s) {
		t.Fatalf("the runnable row (repo, engine, priority):\n%s", s)
	}
	if !strings.Contains(s, "inbox 1  blocked 1  building 1") {
		t.Fatalf("stage counts:\n%s", s)
	}
	t.Logf("local board:\n%s", s)

	// The live log of the running job, then back.
	x.Keys("Enter")
	s = x.WaitText("aq log", long, "· usage: 1.5k tokens", "editing the parser now", "stage inbox → building")
	t.Logf("log view:\n%s", s)
	x.Keys("Escape")
	x.WaitText("RUNNING (1)", "FAILED (1)")

	// Requeue the failed job: r asks, y does it.
	clitest.SelectRow(t, x, broken)
	x.Keys("r")
	x.WaitText("requeue job " + broken + "? y/n")
	x.Keys("y")
	x.WaitText("requeued "+broken, "FAILED (0)")
	if v := show(t, h, "tmux-broken"); v.State.Stage != job.Inbox {
		t.Fatalf("after requeue on the board the job is in %s", v.State.Stage)
	}

	// Resize: redrawn to 70 columns, long lines cut.
	if out, err := x.Cmd("resize-window", "-t", "aq", "-x", "70", "-y", "20").CombinedOutput(); err != nil {
		t.Fatalf("resize-window: %v %s", err, out)
	}
	s = x.WaitScreen("the board at 70×20", func(s string) bool {
		lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
		return strings.Contains(s, "aq board") && strings.Contains(s, "q quit") && strings.Contains(s, "…") && len(lines) <= 20
	})
	for _, l := range strings.Split(s, "\n") {
		if n := len([]rune(l)); n > 70 {
			t.Fatalf("a line of %d columns after the resize to 70: %q", n, l)
		}
	}

	// Ctrl-C: exit 0, the terminal given back (the alternate screen left).
	x.Keys("C-c")
	s = x.WaitText("EXITED 0")
	if strings.Contains(s, "aq board") || strings.Contains(s, "RUNNING") {
		t.Fatalf("the board is still on the screen after Ctrl-C:\n%s", s)
	}
	testenv.WriteFile(t, filepath.Join(mark, "go"), "")
	if r := aq.Wait(); r.Code != 0 {
		t.Fatalf("long: %s", r)
	}
}

// fleetScene makes a fleet on the stub: a live factory running one job and
// holding one in review, a stale factory, a job no factory can run, and a
// dead-lettered job.
type fleetScene struct {
	running, review, unroutable, dead string
}

func makeFleetScene(t *testing.T, s *coord.Server, base, dir string) fleetScene {
	t.Helper()
	sc := fleetScene{running: testenv.ID("fl-running"), review: testenv.ID("fl-review"), unroutable: testenv.ID("fl-unroutable"), dead: testenv.ID("fl-dead")}
	for _, id := range []string{sc.running, sc.review, sc.dead} {
		m := clitest.WriteManifest(t, dir, id, "script: true\nretry: {max: 0}")
		if _, errOut, code := runAQ(t, "submit", m); code != 0 {
			t.Fatal(errOut)
		}
	}
	op := s.EnrollToken()
	tok := clitest.StubReq(t, base, "POST", "/fleet/factories/enroll", op, map[string]any{"factoryId": "live-1", "capabilities": []string{"os:linux", "engine:script", "repo:app"}, "repos": []string{"app"}, "seatLimit": 2})["token"].(string)
	clitest.StubReq(t, base, "POST", "/fleet/factories/enroll", op, map[string]any{"factoryId": "gone-2", "capabilities": []string{"os:linux"}, "seatLimit": 1})
	claim := func() (string, int64) {
		m := clitest.StubReq(t, base, "POST", "/fleet/claim", tok, map[string]any{"factoryId": "live-1", "capabilities": []string{"os:linux", "engine:script", "repo:app"}, "repos": []string{"app"}})
		j := m["job"].(map[string]any)
		return j["id"].(string), int64(m["leaseEpoch"].(float64))
	}
	for range 3 {
		id, epoch := claim()
		switch id {
		case sc.review:
			clitest.StubReq(t, base, "PATCH", "/fleet/jobs/"+id, tok, map[string]any{"stage": "review", "leaseEpoch": epoch})
		case sc.dead:
			clitest.StubReq(t, base, "POST", "/fleet/fail", tok, map[string]any{"jobId": id, "factoryId": "live-1", "leaseEpoch": epoch, "reason": "engine_failed", "retryable": true, "detail": "exit 2"})
		default:
			clitest.StubReq(t, base, "PATCH", "/fleet/jobs/"+id, tok, map[string]any{"stage": "building", "leaseEpoch": epoch})
		}
	}
	clitest.StubReq(t, base, "POST", "/fleet/factories/heartbeat", tok, map[string]any{"factoryId": "live-1", "capabilities": []string{"os:linux", "engine:script", "repo:app"}, "repos": []string{"app"},
		"load": 0.5, "seatLimit": 2, "health": "ok", "running": []map[string]any{{"jobId": sc.running, "leaseEpoch": 1}}})
	u := clitest.WriteManifest(t, dir, sc.unroutable, "script: true\ncapabilities: [has:gpu-tool]")
	if _, errOut, code := runAQ(t, "submit", u); code != 0 {
		t.Fatal(errOut)
	}
	if j, _ := s.Job(sc.dead); j.Stage != coord.StageDeadLetter {
		t.Fatalf("dead job is %s", j.Stage)
	}
	return sc
}

// TestBoardTmuxFleet: the board in fleet mode in a real terminal — jobs
// per stage from the coordinator, factories with health and load, alerts
// (a stale factory, a dead-lettered job, a job nobody can run); ship
// through s and y, after which the coordinator has the job shipped; a
// coordinator that lacks GET /fleet/factories named; one that goes away
// shown as unreachable with its last data kept.
func TestBoardTmuxFleet(t *testing.T) {
	testenv.Slow(t, "drives the live board in a real tmux")
	bin := testenv.BuildAQ(t) // first: the scene's heartbeat must be fresh when the board reads it
	s, dir, _ := clitest.FleetEnv(t)
	sc := makeFleetScene(t, s.Server, "http://"+s.Addr, dir)

	env := append(os.Environ(), "AQ_LOG_LEVEL=debug")
	x := testenv.StartTmux(t, env, 120, 40, clitest.ShellQuote(bin)+" status --watch --interval 300ms")
	scr := x.WaitText("aq board · fleet", "coordinator "+"http://"+s.Addr+"/api", "queued 1", "building 1", "review 1", "dead_letter 1",
		"FACTORIES (2)", "live-1", "1/2 running  load 0.50", "["+sc.running+"]", "gone-2", "stale",
		"ALERTS", "factory gone-2 is stale", "job "+sc.dead+" is dead-lettered", "job "+sc.unroutable+": no live factory can run it",
		"RUNNING (1)", sc.running, "on live-1", "REVIEW / TESTING", sc.review, "FAILED (1)", sc.dead)
	t.Logf("fleet board:\n%s", scr)

	// Ship the job in review: s asks, y ships it at the coordinator.
	clitest.SelectRow(t, x, sc.review)
	x.Keys("s")
	x.WaitText("ship job " + sc.review + "? y/n")
	x.Keys("y")
	x.WaitText("shipped "+sc.review, "shipped 1")
	if j, _ := s.Job(sc.review); j.Stage != coord.StageShipped {
		t.Fatalf("after ship on the board the job is %s", j.Stage)
	}
	// Requeue the dead-lettered one.
	clitest.SelectRow(t, x, sc.dead)
	x.Keys("r")
	x.WaitText("requeue job " + sc.dead + "? y/n")
	x.Keys("y")
	x.WaitText("requeued "+sc.dead, "dead_letter 0")
	if j, _ := s.Job(sc.dead); j.Stage != coord.StageQueued {
		t.Fatalf("after requeue on the board the job is %s", j.Stage)
	}

	// A coordinator without GET /fleet/factories: the board says so and
	// shows the rest. (The board stops asking for the route it lacks.)
	s.SetWithout(coord.RouteFactories)
	x.Keys("C-c")
	x.WaitText("EXITED 0")
	x2 := testenv.StartTmux(t, env, 120, 40, clitest.ShellQuote(bin)+" status --watch --interval 300ms")
	x2.WaitText("the coordinator has no GET /fleet/factories", "RUNNING (1)", sc.running)
	s.SetWithout()

	// The coordinator goes away: the board says since when and keeps the data.
	s.Kill()
	scr = x2.WaitText("coordinator unreachable since", "showing what it said at", "RUNNING (1)", sc.running, sc.unroutable)
	if strings.Contains(scr, "panic") || strings.Contains(scr, "goroutine") {
		t.Fatalf("a stack trace on the board:\n%s", scr)
	}
	x2.Keys("q")
	x2.WaitText("EXITED 0")
}

// TestStatusWatchPlainAndCost: without a terminal --watch prints the plain
// board every --interval until interrupted (exit 0); what one refresh costs
// the coordinator is counted with the stub's per-route counters: with
// nothing changing, GET /fleet/queue-state and GET /fleet/factories, and
// GET /fleet/jobs only when the queue's version moved.
func TestStatusWatchPlainAndCost(t *testing.T) {
	s, dir, _ := clitest.FleetEnv(t)
	makeFleetScene(t, s.Server, "http://"+s.Addr, dir)
	h := &testenv.Home{Dir: os.Getenv("AQ_HOME"), Bin: testenv.BuildAQ(t)}
	cmd := exec.Command(h.Bin, "status", "--watch", "--interval", "250ms")
	cmd.Env = os.Environ()
	process.SetGroup(cmd)
	var out testenv.SyncBuffer
	var errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	s.ResetStats()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = process.KillGroup(cmd.Process.Pid) })
	boards := func() int { return strings.Count(out.String(), "=== aq status at ") }
	testenv.WaitFor(t, time.Minute, "6 boards", func() bool { return boards() >= 6 })
	// A change in between: one more job read.
	m := clitest.WriteManifest(t, dir, testenv.ID("fl-late"), "script: true")
	if _, errOut, code := runAQ(t, "submit", m); code != 0 {
		t.Fatal(errOut)
	}
	n0 := boards()
	testenv.WaitFor(t, time.Minute, "4 more boards", func() bool { return boards() >= n0+4 })
	if err := cmd.Process.Signal(syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("aq status --watch after SIGINT: %v\n%s", err, errb.String())
	}
	st := s.Stats()
	refreshes := st.Count(coord.RouteQueueState)
	jobs, factories := st.Count(coord.RouteJobs), st.Count(coord.RouteFactories)
	total := st.Total() - st.Count(coord.RouteSubmit) // the test's own submit is not the board's
	if refreshes < 10 || factories != refreshes || jobs < 2 || jobs > 3 || total != refreshes+factories+jobs {
		t.Fatalf("%d refreshes: %d queue-state, %d factories, %d jobs, %d in all (%v)", boards(), refreshes, factories, jobs, total, st.Routes)
	}
	t.Logf("coordinator cost: %d refreshes → %d requests (%d queue-state, %d factories, %d jobs): %.2f per refresh",
		refreshes, total, refreshes, factories, jobs, float64(total)/float64(refreshes))
	text := out.String()
	if !strings.Contains(text, "aq board · fleet") || !strings.Contains(text, "FACTORIES (2)") || strings.Contains(text, "\x1b[") || !strings.Contains(text, testenv.ID("fl-late")) {
		t.Fatalf("plain board:\n%s", text[max(0, len(text)-3000):])
	}
}

// TestJobLogsFollowLocal: aq job logs -f follows a local job from the
// queue to its end: the stage changes and the engine's events rendered for
// a person (claude's stream-json here), ending when the job ends; --raw
// gives the engine's own lines; an unknown job is one line and exit 2.
func TestJobLogsFollowLocal(t *testing.T) {
	t.Parallel() // its own home, repos and processes: it runs beside the others
	h, mark := clitest.MarkedHome(t)
	h.Repo(t, "app", nil)
	stream := filepath.Join(mark, "stream.jsonl")
	testenv.WriteFile(t, stream, `{"type":"system","subtype":"init","model":"claude-x","session_id":"s-9","claude_code_version":"2.1.0"}
{"type":"assistant","message":{"id":"m1","model":"claude-x","content":[{"type":"text","text":"Looking at the failing test."},{"type":"tool_use","name":"Bash","input":{"command":"go test ./..."}}],"usage":{"input_tokens":1000,"output_tokens":50}}}
`)
	tail := filepath.Join(mark, "tail.jsonl")
	testenv.WriteFile(t, tail, `{"type":"result","subtype":"success","is_error":false,"num_turns":1,"result":"fixed","total_cost_usd":0.12,"usage":{"input_tokens":1000,"output_tokens":50}}
`)
	h.Submit(t, "follow-me", clitest.ScriptJob("app", `cat "$MARK/stream.jsonl"
touch "$MARK/started"
while [ ! -e "$MARK/go" ]; do sleep 0.05; done
cat "$MARK/tail.jsonl"
echo ok > ok.txt`, "ship: branch"))
	id := testenv.ID("follow-me")

	// Follow from before the job starts.
	fcmd := h.Command(t, "job", "logs", "-f", id)
	var fout testenv.SyncBuffer
	var ferr bytes.Buffer
	fcmd.Stdout, fcmd.Stderr = &fout, &ferr
	if err := fcmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = process.KillGroup(fcmd.Process.Pid) })
	done := make(chan error, 1)
	go func() { done <- fcmd.Wait() }()

	aq := clitest.Start(t, h, "run", "--once")
	aq.WaitMark(mark, "started")
	testenv.WaitFor(t, time.Minute, "the follower to show the tool call", func() bool { return strings.Contains(fout.String(), "→ Bash go test ./...") })
	select {
	case err := <-done:
		t.Fatalf("logs -f ended while the job runs: %v\n%s", err, fout.String())
	default:
	}
	testenv.WriteFile(t, filepath.Join(mark, "go"), "")
	if r := aq.Wait(); r.Code != 0 {
		t.Fatalf("run: %s", r)
	}
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("logs -f: %v %s", err, ferr.String())
		}
	case <-time.After(time.Minute):
		t.Fatalf("logs -f did not end with the job:\n%s", fout.String())
	}
	out := fout.String()
	for _, want := range []string{"stage inbox → building", "claude 2.1.0, model claude-x", "Looking at the failing test.", "→ Bash go test ./...", "· usage:", "■ result: success", "$0.1200", "stage building → shipped"} {
		if !strings.Contains(out, want) {
			t.Errorf("logs -f lacks %q:\n%s", want, out)
		}
	}
	if strings.Index(out, "→ Bash") > strings.Index(out, "■ result") {
		t.Errorf("out of order:\n%s", out)
	}
	raw := h.Run(t, "job", "logs", "-f", "--raw", id)
	if raw.Code != 0 || !strings.HasPrefix(raw.Stdout, `{"type":"system"`) || !strings.Contains(raw.Stdout, `{"type":"result"`) || strings.Contains(raw.Stdout, "=== aq job") {
		t.Fatalf("--raw: %s", raw)
	}
	bad := h.Run(t, "job", "logs", "-f", "no-such-job")
	if bad.Code != 2 {
		t.Fatalf("unknown job: %s", bad)
	}
	clitest.OneErrLine(t, bad.Stderr, `no job "no-such-job"`)
	if r := h.Run(t, "job", "logs", "--raw", id); r.Code != 2 || !strings.Contains(r.Stderr, "--raw without -f") {
		t.Fatalf("--raw alone: %s", r)
	}
}
