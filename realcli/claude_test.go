package realcli_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math"
	"net"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/aqfleet/aq/demo/coord"
	"github.com/aqfleet/aq/engines"
	"github.com/aqfleet/aq/internal/fakellm"
	"github.com/aqfleet/aq/internal/testenv"
	"github.com/aqfleet/aq/job"
)

const model = "claude-sonnet-4-5"

// editTurns are the turns of a run that reads greet.txt, edits it (claude's
// Edit refuses a file its session has not Read) and runs a command with
// Bash, then says it is done; each reports a usage of its own.
func editTurns(wt string) []fakellm.Turn {
	f := filepath.Join(wt, "greet.txt")
	return []fakellm.Turn{
		{Text: "Reading the file first.", Tools: []fakellm.ToolCall{{Name: "Read", Input: map[string]any{"file_path": f}}},
			Usage: fakellm.Usage{Input: 1200, Output: 40, CacheWrite: 3000, CacheRead: 0}},
		{Tools: []fakellm.ToolCall{{Name: "Edit", Input: map[string]any{"file_path": f, "old_string": "hello", "new_string": "hello, world"}}},
			Usage: fakellm.Usage{Input: 300, Output: 60, CacheWrite: 200, CacheRead: 3000}},
		{Tools: []fakellm.ToolCall{{Name: "Bash", Input: map[string]any{"command": "mkdir -p out && cp greet.txt out/copy.txt", "description": "copy the greeting"}}},
			Usage: fakellm.Usage{Input: 200, Output: 30, CacheWrite: 100, CacheRead: 3200}},
		{Text: "Done: greet.txt says hello, world.", Usage: fakellm.Usage{Input: 100, Output: 20, CacheRead: 3300}},
	}
}

func sum(ts []fakellm.Turn) fakellm.Usage {
	var u fakellm.Usage
	for _, t := range ts {
		u = u.Plus(t.Usage)
	}
	return u
}

// TestClaudeShips: the real claude, through a whole aq job (local mode,
// AQ_SANDBOX=off in the test's own network namespace), reads, edits and
// runs a command against the fake; verify passes; the branch ships with the
// edit; the job's insights carry exactly the usage the fake reported and
// the cost claude computed from it (which aq's price table agrees with);
// the requests carried the profile's persona as a system prompt, the task,
// the manifest's model, and none of aq's secrets.
func TestClaudeShips(t *testing.T) {
	t.Parallel()
	shipCase(t, newRig(t), "ships")
}

// TestClaudeShipsSandboxed: the ship case with claude in aq's sandbox, as
// the factory runs it by default (AQ_SANDBOX=on here: a host that cannot
// sandbox fails it rather than running unsandboxed): the fake on the host's
// loopback is reached at the same URL through the sandbox's bridge.
func TestClaudeShipsSandboxed(t *testing.T) {
	t.Parallel()
	shipCase(t, newSandboxedRig(t), "ships-sandboxed")
}

// shipCase runs the ship case as job name: each case its own, since both
// run at once and each checks that no process of its job is left.
func shipCase(t *testing.T, r *rig, name string) {
	r.h.Repo(t, "app", map[string]string{"greet.txt": "hello\n"})
	origin := testenv.AddOrigin(t, filepath.Join(r.h.RepoBase, "app"))
	id := testenv.ID(name)
	turns := editTurns(r.h.Worktree("app", id))
	r.serve(fakellm.Script{Turns: turns})
	r.submit(name, "repo: app\nengine: claude\nmodel: "+model+"\nprofile: backend-dev\nship: branch\nverify: grep -q 'hello, world' greet.txt && test -f out/copy.txt\nretry: {max: 0}",
		"# Greet the world\n\nChange the greeting in greet.txt to say hello to the world. TASK-MARKER-3141.")

	res := r.run("run", "--once")
	v := r.show(id)
	if res.Code != 0 || v.Stage == "failed" {
		t.Fatalf("aq run --once: %s\njob: %s\nlog:\n%s", res, v.Raw, r.logs(id))
	}
	if got := testenv.TreeFiles(t, origin, "aq/job/"+id); got["greet.txt"] != "hello, world" || got["out/copy.txt"] != "hello, world" {
		t.Errorf("the shipped branch holds %q", got)
	}
	if r.fake.Played() != len(turns) {
		t.Errorf("the fake answered %d of its %d turns", r.fake.Played(), len(turns))
	}
	want := sum(turns)
	in := v.Insights
	if in == nil {
		t.Fatalf("no insights: %s", v.Raw)
	}
	if in.Engine != "claude" || in.Model != model || !strings.HasPrefix(in.EngineVersion, "2.") || in.SessionID == "" {
		t.Errorf("insights: engine %q version %q model %q session %q", in.Engine, in.EngineVersion, in.Model, in.SessionID)
	}
	if in.TokensIn != want.Input+want.CacheWrite+want.CacheRead || in.TokensOut != want.Output || in.TokensCached != want.CacheRead {
		t.Errorf("insights tokens in %d out %d cached %d; the fake reported %+v (in %d)", in.TokensIn, in.TokensOut, in.TokensCached, want, want.Input+want.CacheWrite+want.CacheRead)
	}
	wantCost := engines.DefaultPrices().Cost(model, engines.Usage{
		TokensIn: want.Input + want.CacheWrite + want.CacheRead, TokensOut: want.Output,
		TokensCached: want.CacheRead, TokensCacheWrite: want.CacheWrite,
	})
	if in.CostEstimated || math.Abs(in.CostUSD-wantCost) > 1e-9 {
		t.Errorf("insights cost $%.6f (estimated %t); the fake's usage at %s's prices is $%.6f", in.CostUSD, in.CostEstimated, model, wantCost)
	}
	if in.Turns != len(turns) {
		t.Errorf("insights turns %d, want %d", in.Turns, len(turns))
	}

	reqs := r.turns()
	if len(reqs) != len(turns) {
		t.Fatalf("%d turn requests, want %d", len(reqs), len(turns))
	}
	first := reqs[0]
	if first.Model != model {
		t.Errorf("the request's model %q, want the manifest's %q", first.Model, model)
	}
	if sys := first.System.Text(); !strings.Contains(sys, "backend") {
		t.Errorf("the system prompt lacks the profile's persona:\n%.2000s", sys)
	}
	if task := first.Messages[len(first.Messages)-1].Content.Text(); !strings.Contains(task, "TASK-MARKER-3141") {
		t.Errorf("the first request's last message lacks the task:\n%.2000s", task)
	}
	// Each later turn carries the tool result of the one before.
	for i, q := range reqs[1:] {
		last := q.Messages[len(q.Messages)-1]
		if last.Role != "user" || len(last.Content) == 0 || last.Content[0].Type != "tool_result" || last.Content[0].IsError {
			t.Errorf("turn %d's last message is not a successful tool result: %+v", i+1, last)
		}
	}
	r.noSecrets()
	r.noneLeft(t, id)
}

// TestClaudeRepairRoundResumes: a failed verify sends the job back to the
// real claude as a repair round that resumes the session (--resume): the
// fake sees the first run's conversation followed by the failure's tail;
// the job ships after the round; the round's usage is counted once.
func TestClaudeRepairRoundResumes(t *testing.T) {
	t.Parallel()
	r := newRig(t)
	r.h.Repo(t, "app", map[string]string{"greet.txt": "hello\n"})
	testenv.AddOrigin(t, filepath.Join(r.h.RepoBase, "app"))
	id := testenv.ID("repair")
	fixed := filepath.Join(r.h.Worktree("app", id), "fixed.txt")
	turns := []fakellm.Turn{
		// The first run says it is done without doing the work.
		{Text: "FIRST-RUN-ANSWER: nothing to do.", Usage: fakellm.Usage{Input: 500, Output: 50, CacheWrite: 1000}},
		// The round writes the file verify wants.
		{Tools: []fakellm.ToolCall{{Name: "Write", Input: map[string]any{"file_path": fixed, "content": "fixed\n"}}},
			Usage: fakellm.Usage{Input: 700, Output: 70, CacheRead: 1000}},
		{Text: "Fixed.", Usage: fakellm.Usage{Input: 90, Output: 9, CacheRead: 1700}},
	}
	r.serve(fakellm.Script{Turns: turns})
	r.submit("repair", "repo: app\nengine: claude\nmodel: "+model+"\nship: branch\nverify: test -f fixed.txt || { echo VERIFY-TAIL-MARKER fixed.txt is missing; exit 3; }\nverify_rounds: 1\nretry: {max: 0}",
		"# Fix it\n\nMake verify pass. TASK-MARKER-2718.")

	res := r.run("run", "--once")
	v := r.show(id)
	if res.Code != 0 || v.Stage == "failed" {
		t.Fatalf("aq run --once: %s\njob: %s\nlog:\n%s", res, v.Raw, r.logs(id))
	}
	reqs := r.turns()
	if len(reqs) != len(turns) {
		t.Fatalf("%d turn requests, want %d", len(reqs), len(turns))
	}
	round := reqs[1]
	var all []string
	for _, m := range round.Messages {
		all = append(all, m.Role+": "+m.Content.Text())
	}
	convo := strings.Join(all, "\n")
	iTask, iFirst, iTail := strings.Index(convo, "TASK-MARKER-2718"), strings.Index(convo, "FIRST-RUN-ANSWER"), strings.LastIndex(convo, "VERIFY-TAIL-MARKER")
	if iTask < 0 || iFirst < iTask || iTail < iFirst {
		t.Errorf("the round's request does not carry the task, then the first run's answer, then verify's tail (%d %d %d):\n%.4000s", iTask, iFirst, iTail, convo)
	}
	in := v.Insights
	if in == nil || in.RepairRounds != 1 || len(in.Runs) != 2 {
		t.Fatalf("insights: %s", v.Raw)
	}
	want := sum(turns)
	if in.TokensIn != want.Input+want.CacheWrite+want.CacheRead || in.TokensOut != want.Output {
		t.Errorf("insights tokens in %d out %d; the fake reported %+v over the two runs", in.TokensIn, in.TokensOut, want)
	}
	round1 := sum(turns[1:])
	if got := in.Runs[1]; got.TokensOut != round1.Output || got.TokensIn != round1.Input+round1.CacheWrite+round1.CacheRead {
		t.Errorf("the round's run: in %d out %d, the fake reported %+v for it", got.TokensIn, got.TokensOut, round1)
	}
	if in.Runs[0].TokensOut+in.Runs[1].TokensOut != in.TokensOut {
		t.Errorf("the runs' output tokens %d + %d do not add up to the attempt's %d", in.Runs[0].TokensOut, in.Runs[1].TokensOut, in.TokensOut)
	}
	r.noSecrets()
	r.noneLeft(t, id)
}

// TestClaudeRetryAfterCrash: aq is killed (-9) while the real claude waits
// on the API; the next `aq run --once` recovers the job, and the retry's
// prompt tells claude how the attempt before it ended.
func TestClaudeRetryAfterCrash(t *testing.T) {
	t.Parallel()
	r := newRig(t)
	r.h.Repo(t, "app", nil)
	testenv.AddOrigin(t, filepath.Join(r.h.RepoBase, "app"))
	r.serve(fakellm.Script{Turns: []fakellm.Turn{
		{Text: "thinking", Fault: &fakellm.Fault{Delay: time.Hour, Times: 1}},
	}})
	id := r.submit("crash", "repo: app\nengine: claude\nmodel: "+model+"\nship: branch\nretry: {max: 2, backoff: 1s}", "# Crash\n\nTASK-MARKER-1618.")

	cmd := r.h.Command(t, "run", "--once")
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	var err error
	r.do(func() { err = cmd.Start() })
	if err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 3*time.Minute, "claude's first request", func() bool { return r.fake.Pending() > 0 })
	if err := cmd.Process.Kill(); err != nil { // SIGKILL: aq dies at once
		t.Fatal(err)
	}
	_, _ = testenv.Wait(cmd, &out, &errb, time.Minute)
	// The supervisor stops claude once aq is gone.
	testenv.WaitFor(t, 2*time.Minute, "claude to end with aq", func() bool { return r.fake.Pending() == 0 })

	var res testenv.Result
	// The crash's backoff (at least 30 s for an infrastructure reason)
	// first: aq run --once finds no runnable job until it passes.
	testenv.WaitFor(t, 4*time.Minute, "the retry to run", func() bool {
		res = r.run("run", "--once")
		if len(r.turns()) >= 2 {
			return true
		}
		time.Sleep(2 * time.Second)
		return false
	})
	v := r.show(id)
	if v.Stage == "failed" || v.Stage == "dead_letter" {
		t.Fatalf("after the retry: %s\njob: %s\nlog:\n%s", res, v.Raw, r.logs(id))
	}
	reqs := r.turns()
	last := reqs[len(reqs)-1]
	prompt := last.Messages[len(last.Messages)-1].Content.Text()
	if !strings.Contains(prompt, "TASK-MARKER-1618") || !strings.Contains(prompt, "This job ran before") || !strings.Contains(prompt, "crash") {
		t.Errorf("the retry's prompt does not say how attempt 1 ended:\n%.3000s", prompt)
	}
	r.noneLeft(t, id)
}

// budgetCase is a job stopped by one of its budgets.
type budgetCase struct {
	name, budget string
	turns        []fakellm.Turn
	reason       string
	detail       string
}

// TestClaudeBudgets: budget.turns (claude's --max-turns), budget.usd
// (--max-budget-usd) and budget.wall stop the real claude; the job fails
// with the right reason, nothing shipped, nothing left running.
func TestClaudeBudgets(t *testing.T) {
	t.Parallel()
	bash := func(i int) fakellm.Turn {
		return fakellm.Turn{Tools: []fakellm.ToolCall{{Name: "Bash", Input: map[string]any{"command": fmt.Sprintf("echo %d", i), "description": "count"}}},
			Usage: fakellm.Usage{Input: 100, Output: 10}}
	}
	var many []fakellm.Turn
	for i := range 8 {
		many = append(many, bash(i))
	}
	expensive := []fakellm.Turn{
		// $3/MTok in, $15/MTok out: 2M output tokens is $30.
		{Tools: []fakellm.ToolCall{{Name: "Bash", Input: map[string]any{"command": "echo one", "description": "one"}}}, Usage: fakellm.Usage{Input: 1000, Output: 2_000_000}},
		bash(1), bash(2), bash(3),
	}
	slow := []fakellm.Turn{{Text: "never", Fault: &fakellm.Fault{Delay: time.Hour}}}
	for _, tc := range []budgetCase{
		{"turns", "budget: {turns: 2}", many, "engine_failed", "max-turns"},
		{"usd", "budget: {usd: 1}", expensive, "budget_exceeded", "$"},
		{"wall", "budget: {wall: 20s}", slow, "timeout", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			r := newRig(t)
			r.h.Repo(t, "app", nil)
			origin := testenv.AddOrigin(t, filepath.Join(r.h.RepoBase, "app"))
			r.serve(fakellm.Script{Turns: tc.turns})
			id := r.submit("budget-"+tc.name, "repo: app\nengine: claude\nmodel: "+model+"\nship: branch\nretry: {max: 0}\n"+tc.budget, "# Spend\n\nWork until stopped.")
			res := r.run("run", "--once")
			v := r.show(id)
			if v.Reason != tc.reason || !strings.Contains(v.Detail, tc.detail) {
				t.Errorf("reason %q detail %q, want %q with %q\n%s\nlog:\n%s", v.Reason, v.Detail, tc.reason, tc.detail, res, r.logs(id))
			}
			if refs := testenv.RemoteRefs(t, origin, "refs/heads/aq/job/"); len(refs) != 0 {
				t.Errorf("a job stopped by its budget shipped: %v", refs)
			}
			r.noneLeft(t, id)
		})
	}
}

// TestClaudeAPIErrors: what the real claude makes of the API's errors, and
// what aq makes of claude (recorded in engines/testdata/claude/real_2.1.332_*):
// a refused key (claude retries even a 401) is engine_unavailable naming the
// login; a 429 is not retried and claude prints no reset time (its
// retry-after is not in the stream), so the job parks for aq's default wait
// and claude is held; 529 and 500 are retried (CLAUDE_CODE_MAX_RETRIES=2:
// three requests), then engine_unavailable; an HTML page and answers cut on
// every request (streams, and the non-streaming retry claude falls back to)
// fail the job engine_unavailable with claude's own error line. Never
// shipped, nothing left running.
func TestClaudeAPIErrors(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		fault  fakellm.Fault
		reason string
		detail []string // each must be in the job's detail
		tries  int      // requests the fake must have seen, at least
	}{
		{"401", fakellm.Fault{Status: 401}, "engine_unavailable", []string{"auth failed", "Invalid API key", "claude's login: ANTHROPIC_API_KEY"}, 3},
		{"403", fakellm.Fault{Status: 403}, "engine_unavailable", []string{"auth failed", "ANTHROPIC_API_KEY"}, 1},
		{"429", fakellm.Fault{Status: 429, RetryAfter: "1800"}, "rate_limited", []string{"429"}, 1},
		{"529", fakellm.Fault{Status: 529}, "engine_unavailable", []string{"overloaded", "API Error: 529"}, 3},
		{"500", fakellm.Fault{Status: 500}, "engine_unavailable", []string{"API Error: 500"}, 3},
		{"html", fakellm.Fault{HTML: true}, "engine_unavailable", []string{"API answered garbage", "malformed response"}, 2},
		{"cut", fakellm.Fault{CutAfter: 4}, "engine_unavailable", nil, 3},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			r := newRig(t)
			r.h.Repo(t, "app", nil)
			origin := testenv.AddOrigin(t, filepath.Join(r.h.RepoBase, "app"))
			f := tc.fault
			r.serve(fakellm.Script{Turns: []fakellm.Turn{{Text: "unreachable", Fault: &f}}})
			id := r.submit("api-"+tc.name, "repo: app\nengine: claude\nmodel: "+model+"\nship: branch\nretry: {max: 0}", "# Try\n\nTry.")
			before := time.Now()
			res := r.run("run", "--once")
			v := r.show(id)
			t.Logf("%s: aq exit %d, stage %s, reason %s, detail %q; the fake saw %d requests", tc.name, res.Code, v.Stage, v.Reason, v.Detail, len(r.fake.Requests()))
			if v.Reason != tc.reason {
				t.Errorf("reason %q, want %q\n%s\nlog:\n%s", v.Reason, tc.reason, res, r.logs(id))
			}
			for _, d := range tc.detail {
				if !strings.Contains(v.Detail, d) {
					t.Errorf("detail %q lacks %q", v.Detail, d)
				}
			}
			if n := len(r.fake.Requests()); n < tc.tries {
				t.Errorf("the fake saw %d requests, want at least %d", n, tc.tries)
			}
			if tc.reason == "rate_limited" {
				// Parked (not failed): back in the inbox until aq's default
				// wait, claude held until then.
				if v.Stage != "inbox" || v.NotBefore.Before(before.Add(job.DefaultParkWait-time.Minute)) || v.NotBefore.After(time.Now().Add(job.DefaultParkWait+time.Minute)) {
					t.Errorf("parked job: stage %s, not before %s (want about %s from now)", v.Stage, v.NotBefore, job.DefaultParkWait)
				}
				if res.Code != 3 || !strings.Contains(res.Stderr, "parked") {
					t.Errorf("aq run --once on a rate-limited claude: %s", res)
				}
			}
			if refs := testenv.RemoteRefs(t, origin, "refs/heads/aq/job/"); len(refs) != 0 {
				t.Errorf("a failed job shipped: %v", refs)
			}
			r.noSecrets()
			r.noneLeft(t, id)
		})
	}
}

// TestClaudeShipsFleet: the ship case in fleet mode — the coordinator stub
// (in the test's namespace too), `aq submit` to it, `aq run --once` takes
// the lease and runs the real claude against the fake; the stub gets the
// shipped stage, the branch and insights with the fake's usage; the fleet's
// token reached no request.
func TestClaudeShipsFleet(t *testing.T) {
	t.Parallel()
	r := newRig(t)
	base := r.h.RepoBase
	origin := testenv.AddOrigin(t, testenv.NewRepo(t, base, "app", map[string]string{"greet.txt": "hello\n"}))
	var (
		s   *coord.Served
		err error
	)
	r.do(func() {
		var ln net.Listener
		if ln, err = net.Listen("tcp", "127.0.0.1:0"); err == nil {
			s, err = coord.ServeOn(context.Background(), ln, coord.Options{}, nil)
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Kill)
	r.h.Env = append(r.h.Env, "AQ_FLEET=1", "AQ_FLEET_API="+s.API, "AQ_FLEET_TOKEN="+s.EnrollToken(),
		"AQ_FACTORY_ID=realcli-factory", "AQ_HEARTBEAT_SEC=1", "AQ_FLEET_LEASE_RENEW_SEC=1",
		"AQ_SB_CONNECTION_STRING=") // the poll path: no broker here
	id := testenv.ID("ships-fleet")
	turns := editTurns(r.h.Worktree("app", id))
	r.serve(fakellm.Script{Turns: turns})
	path := filepath.Join(t.TempDir(), id+".md")
	testenv.WriteFile(t, path, "---\nid: "+id+"\nrepo: app\nengine: claude\nmodel: "+model+"\nship: branch\nverify: grep -q 'hello, world' greet.txt\nretry: {max: 0}\n---\n# Greet the world\n\nSay hello to the world in greet.txt.\n")
	if res := r.run("submit", path); res.Code != 0 {
		t.Fatalf("aq submit: %s", res)
	}
	res := r.run("run", "--once")
	j, ok := s.Job(id)
	if res.Code != 0 || !ok || j.Stage != "shipped" && j.Stage != "testing" && j.Stage != "review" {
		t.Fatalf("aq run --once in fleet mode: %s\nstub job: %+v\nlog:\n%s", res, j, r.logs(id))
	}
	if got := testenv.TreeFiles(t, origin, "aq/job/"+id); got["greet.txt"] != "hello, world" {
		t.Errorf("the shipped branch holds %q", got)
	}
	var in struct {
		Engine    string  `json:"engine"`
		TokensIn  int64   `json:"tokensIn"`
		TokensOut int64   `json:"tokensOut"`
		CostUSD   float64 `json:"costUsd"`
	}
	if err := json.Unmarshal(j.Insights, &in); err != nil {
		t.Fatalf("the stub's insights %s: %v", j.Insights, err)
	}
	want := sum(turns)
	if in.Engine != "claude" || in.TokensIn != want.Input+want.CacheWrite+want.CacheRead || in.TokensOut != want.Output || in.CostUSD <= 0 {
		t.Errorf("the coordinator's insights %s; the fake reported %+v", j.Insights, want)
	}
	for _, req := range r.fake.Requests() {
		if req.Contains(s.EnrollToken()) {
			t.Errorf("request %d carries the fleet's token", req.Seq)
		}
	}
	r.noSecrets()
	r.noneLeft(t, id)
}
