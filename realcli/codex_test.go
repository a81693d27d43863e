//go:build linux

package realcli_test

import (
	"bytes"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/aqfleet/aq/engines"
	"github.com/aqfleet/aq/internal/fakellm"
	"github.com/aqfleet/aq/internal/testenv"
	"github.com/aqfleet/aq/job"
)

// codexUsage is the usage fakellm turns add up to, as aq records it.
func codexUsage(turns ...fakellm.ResponsesTurn) engines.Usage {
	var u engines.Usage
	for _, t := range turns {
		u.TokensIn += t.Usage.Input
		u.TokensCached += t.Usage.Cached
		u.TokensOut += t.Usage.Output
	}
	u.CostUSD = engines.DefaultPrices().Cost(codexModel, u)
	return u
}

func codexSameUsage(t *testing.T, what string, got *job.Insights, want engines.Usage) {
	t.Helper()
	if got == nil {
		t.Fatalf("%s: no insights", what)
	}
	if got.TokensIn != want.TokensIn || got.TokensCached != want.TokensCached || got.TokensOut != want.TokensOut ||
		math.Abs(got.CostUSD-want.CostUSD) > 1e-9 || !got.CostEstimated {
		t.Errorf("%s: insights tokens in/cached/out %d/%d/%d cost %.6f (estimated %v), want %d/%d/%d %.6f (estimated)",
			what, got.TokensIn, got.TokensCached, got.TokensOut, got.CostUSD, got.CostEstimated,
			want.TokensIn, want.TokensCached, want.TokensOut, want.CostUSD)
	}
}

// TestCodexEditsVerifiesAndShips: the real codex, told by the fake to
// apply a patch and run a command, edits the repository; verify passes,
// the branch ships, and the insights' usage and cost are the fake's. What
// aq made codex send: the profile's persona and the task in the user
// message, the manifest's model, the API key only in Authorization, none
// of aq's own secrets.
//
// Unsandboxed (in the test's own network namespace), the fake's URL is in
// codex's config.toml; sandboxed (AQ_SANDBOX=on: codex reaches the fake on
// the factory's loopback through the sandbox's gateway bridge), it is
// OPENAI_BASE_URL in aq's environment, which aq passes to codex as -c.
func TestCodexEditsVerifiesAndShips(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name string
		env  []string
	}{
		{"unsandboxed", nil},
		{"sandboxed", []string{"AQ_SANDBOX=on", codexBaseURLFromEnv}},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			codexEditsVerifiesAndShips(t, c.env...)
		})
	}
}

func codexEditsVerifiesAndShips(t *testing.T, env ...string) {
	turns := []fakellm.ResponsesTurn{
		{Calls: []fakellm.ResponsesCall{{Patch: "*** Begin Patch\n*** Add File: hello.txt\n+hello from codex\n*** End Patch\n"}}, Usage: fakellm.ResponsesUsage{Input: 12000, Cached: 2000, Output: 300, Reasoning: 120}},
		{Calls: []fakellm.ResponsesCall{{Shell: "echo second line >> hello.txt"}}, Usage: fakellm.ResponsesUsage{Input: 13000, Cached: 11000, Output: 200, Reasoning: 50}},
		{Text: "Added hello.txt.", Usage: fakellm.ResponsesUsage{Input: 14000, Cached: 12500, Output: 80}},
	}
	r := codexNewRig(t, fakellm.ResponsesScript{Turns: turns}, map[string]string{"README.md": "app\n"}, env...)
	r.submit("ship", codexManifest("profile: test-fixer", "verify: grep -q 'second line' hello.txt"))
	res := r.run("run", "--once")
	v := r.show("ship")
	if res.Code != 0 || v.Stage != job.Shipped && v.Stage != job.Testing {
		t.Fatalf("aq run --once: %s\nstage %s reason %s: %s\nlogs:\n%s", res, v.Stage, v.Reason, v.Detail, r.logs("ship"))
	}
	id := testenv.ID("ship")
	refs := testenv.RemoteRefs(t, r.origin, "refs/heads/aq/job/")
	if refs["refs/heads/aq/job/"+id] == "" {
		t.Fatalf("the branch did not ship: origin has %v", refs)
	}
	files := testenv.TreeFiles(t, r.origin, "refs/heads/aq/job/"+id)
	if got := strings.TrimSpace(files["hello.txt"]); got != "hello from codex\nsecond line" {
		t.Errorf("hello.txt on the shipped branch: %q", got)
	}
	codexSameUsage(t, "ship", v.Insights, codexUsage(turns...))
	if v.Insights.Model != codexModel || v.Insights.Engine != "codex" || v.Insights.SessionID == "" {
		t.Errorf("insights engine %q model %q session %q", v.Insights.Engine, v.Insights.Model, v.Insights.SessionID)
	}

	posts := r.fake.Posts()
	if len(posts) != len(turns) {
		t.Fatalf("the fake saw %d posts, want %d", len(posts), len(turns))
	}
	// codex tries a WebSocket first; the fake's 426 makes it fall back to
	// HTTP at once: one upgrade request for the one codex process (a 404
	// costs six, measured).
	var upgrades int
	for _, req := range r.fake.Requests() {
		if req.Method == "GET" && strings.EqualFold(req.Header.Get("Upgrade"), "websocket") {
			upgrades++
		}
	}
	if upgrades != 1 {
		t.Errorf("%d WebSocket upgrade requests, want 1 (the fake refuses it with 426)", upgrades)
	}
	first := posts[0].JSON()
	if first["model"] != codexModel {
		t.Errorf("model %v, want %s (the manifest's)", first["model"], codexModel)
	}
	_, items, err := fakellm.ResponsesInput(posts[0].Body)
	if err != nil {
		t.Fatal(err)
	}
	var user []string
	for _, it := range items {
		if it.Role == "user" {
			user = append(user, it.Text)
		}
	}
	prompt := strings.Join(user, "\n")
	for _, want := range []string{"You are an engineer who makes failing test suites green", "Do the work for " + id} {
		if !strings.Contains(prompt, want) {
			t.Errorf("the user messages lack %q:\n%s", want, prompt)
		}
	}
	// The second and third requests carry the tools' outputs.
	_, items, _ = fakellm.ResponsesInput(posts[2].Body)
	var outputs int
	for _, it := range items {
		if it.Type == "function_call_output" || it.Type == "custom_tool_call_output" {
			outputs++
		}
	}
	if outputs != 2 {
		t.Errorf("the last request has %d tool outputs, want 2: %+v", outputs, items)
	}
	for _, req := range posts {
		if got := req.Header.Get("Authorization"); got != "Bearer "+codexAPIKey {
			t.Errorf("authorization %q", got)
		}
	}
	codexNoSecrets(t, r.fake)
}

// TestCodexRepairRoundResumesTheThread: verify fails after the first run;
// the repair round continues codex's thread (`codex exec resume`): the
// fake's next request holds the first run's whole conversation, then the
// failure; the job's usage is every request's once (codex prints the
// thread's running total on a resumed run: aq counts what it adds).
func TestCodexRepairRoundResumesTheThread(t *testing.T) {
	t.Parallel()
	first := []fakellm.ResponsesTurn{
		{Calls: []fakellm.ResponsesCall{{Shell: "echo wrong > answer.txt"}}, Usage: fakellm.ResponsesUsage{Input: 10000, Cached: 1000, Output: 100}},
		{Text: "Wrote answer.txt.", Usage: fakellm.ResponsesUsage{Input: 11000, Cached: 9000, Output: 40}},
	}
	repair := []fakellm.ResponsesTurn{
		{Calls: []fakellm.ResponsesCall{{Shell: "echo right > answer.txt"}}, Usage: fakellm.ResponsesUsage{Input: 12000, Cached: 10500, Output: 60}},
		{Text: "Fixed answer.txt.", Usage: fakellm.ResponsesUsage{Input: 12500, Cached: 11500, Output: 30}},
	}
	r := codexNewRig(t, fakellm.ResponsesScript{Turns: append(append([]fakellm.ResponsesTurn{}, first...), repair...)}, nil)
	r.submit("repair", codexManifest("verify: grep -q right answer.txt", "verify_rounds: 1"))
	res := r.run("run", "--once")
	v := r.show("repair")
	if res.Code != 0 || v.Insights == nil || v.Insights.RepairRounds != 1 {
		t.Fatalf("aq run --once: %s\nstage %s reason %s: %s\ninsights %+v\nlogs:\n%s", res, v.Stage, v.Reason, v.Detail, v.Insights, r.logs("repair"))
	}
	posts := r.fake.Posts()
	if len(posts) != 4 {
		t.Fatalf("the fake saw %d posts, want 4 (2 runs of 2)", len(posts))
	}
	// The resumed run's first request: the first run's conversation, then
	// the failure as the last user message.
	_, before, _ := fakellm.ResponsesInput(posts[1].Body)
	_, resumed, _ := fakellm.ResponsesInput(posts[2].Body)
	if len(resumed) <= len(before) {
		t.Fatalf("the resumed request has %d input items, the first run's last %d", len(resumed), len(before))
	}
	for i, it := range before {
		if resumed[i].Type != it.Type || resumed[i].Role != it.Role || resumed[i].Text != it.Text {
			t.Errorf("resumed input %d is %s/%s %q, the first run had %s/%s %q", i, resumed[i].Type, resumed[i].Role, resumed[i].Text, it.Type, it.Role, it.Text)
		}
	}
	tail := resumed[len(resumed)-1]
	if tail.Role != "user" || !strings.Contains(tail.Text, "Verify command: grep -q right answer.txt") || !strings.Contains(tail.Text, "repair round 1 of 1") {
		t.Errorf("the resumed run's last input is %s/%s:\n%s", tail.Type, tail.Role, tail.Text)
	}
	if strings.Contains(tail.Text, "Do the work for") {
		t.Errorf("a resumed round was told the task again:\n%s", tail.Text)
	}
	if posts[0].Header.Get("Session-Id") != posts[2].Header.Get("Session-Id") {
		t.Errorf("session %q, then %q: not the same thread", posts[0].Header.Get("Session-Id"), posts[2].Header.Get("Session-Id"))
	}
	all := append(append([]fakellm.ResponsesTurn{}, first...), repair...)
	codexSameUsage(t, "repair", v.Insights, codexUsage(all...))
	runs := v.Insights.Runs
	if len(runs) != 2 || runs[1].Session == "" || runs[0].VerifyPassed || !runs[1].VerifyPassed {
		t.Fatalf("runs %+v", runs)
	}
	for i, want := range []engines.Usage{codexUsage(first...), codexUsage(repair...)} {
		if runs[i].TokensIn != want.TokensIn || runs[i].TokensOut != want.TokensOut {
			t.Errorf("run %d: %d in %d out, want %d in %d out (its own requests, counted once)", i, runs[i].TokensIn, runs[i].TokensOut, want.TokensIn, want.TokensOut)
		}
	}
	id := testenv.ID("repair")
	if got := testenv.TreeFiles(t, r.origin, "refs/heads/aq/job/"+id)["answer.txt"]; strings.TrimSpace(got) != "right" {
		t.Errorf("answer.txt on the shipped branch: %q", got)
	}
}

// TestCodexRetryAfterACrash: codex dies mid-turn (kill -9 of the native
// codex process running the turn, while the fake holds its answer to the
// first request); the attempt fails, and the retry's prompt says how the
// previous attempt ended.
//
// The process to kill is the native binary the npm launcher starts (node
// bin/codex.js spawns @openai/codex-linux-x64's vendor/…/bin/codex exec;
// a Node with process.execve replaces itself with it): the shallowest
// process below aq whose executable is the native codex. A command codex
// runs was no good killer: what it found and killed was a codex helper,
// and codex finished its turn.
func TestCodexRetryAfterACrash(t *testing.T) {
	t.Parallel()
	hold := make(chan struct{})
	t.Cleanup(func() { close(hold) })
	retry := fakellm.ResponsesTurn{Text: "Done after the crash.", Usage: fakellm.ResponsesUsage{Input: 2000, Output: 20}}
	r := codexNewRig(t, fakellm.ResponsesScript{Turns: []fakellm.ResponsesTurn{
		{Hold: hold, Text: "never answered: codex is killed first"},
		retry,
	}}, nil)
	r.submit("crash", codexManifest("retry:\n  max: 1\n  backoff: 1s"))

	cmd := r.h.Command(t, "run", "--once")
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	var err error
	r.ns.Do(func() { err = cmd.Start() })
	if err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 3*time.Minute, "codex's first request", func() bool { return len(r.fake.Posts()) > 0 })
	pid, native := codexTurnProcess(t, cmd.Process.Pid)
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatalf("kill -9 %d (%s): %v", pid, native, err)
	}
	res, err := testenv.Wait(cmd, &out, &errb, 2*time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	v := r.show("crash")
	if v.Attempts != 1 || v.Stage != job.Inbox || v.Reason == "" {
		t.Fatalf("after kill -9 of codex (%s): %s\nstage %s reason %s (%s), attempts %d\nlogs:\n%s", native, res, v.Stage, v.Reason, v.Detail, v.Attempts, r.logs("crash"))
	}
	reason := v.Reason
	// The launcher re-raises its child's signal on itself: aq sees codex
	// killed, not an exit status.
	if !strings.Contains(v.Detail, "codex printed no turn.completed event (killed by SIGKILL") {
		t.Errorf("after kill -9 of codex: detail %q, want it to say codex was killed by SIGKILL", v.Detail)
	}
	if n := len(r.fake.Posts()); n != 1 {
		t.Fatalf("the fake saw %d posts in the crashed attempt, want 1 (codex killed mid-turn)", n)
	}
	codexNotShipped(t, r, "crash")

	testenv.WaitFor(t, 2*time.Minute, "the retry's backoff", func() bool { return time.Now().After(v.NotBefore) })
	res = r.run("run", "--once")
	v = r.show("crash")
	if res.Code != 0 || v.Attempts != 2 || v.Stage != job.Shipped {
		t.Fatalf("the retry: %s\nstage %s reason %s (%s), attempts %d\nlogs:\n%s", res, v.Stage, v.Reason, v.Detail, v.Attempts, r.logs("crash"))
	}
	posts := r.fake.Posts()
	if len(posts) != 2 {
		t.Fatalf("the fake saw %d posts, want 2 (the crashed one, the retry's)", len(posts))
	}
	_, items, err := fakellm.ResponsesInput(posts[1].Body)
	if err != nil {
		t.Fatal(err)
	}
	var prompt string
	for _, it := range items {
		if it.Role == "user" {
			prompt += it.Text + "\n"
		}
	}
	for _, want := range []string{"Do the work for " + testenv.ID("crash"), "This job ran before. Its attempt 1 ended: " + string(reason), "The engine stopped without finishing the task"} {
		if !strings.Contains(prompt, want) {
			t.Errorf("the retry's prompt lacks %q:\n%.3000s", want, prompt)
		}
	}
	if left := codexLeftRunning(t, r.h.Dir); len(left) != 0 {
		t.Errorf("left running: %v", left)
	}
}

// codexTurnProcess is the native codex process below the process root
// (aq): the shallowest descendant whose executable is codex's native
// binary, and its command line. It fails t when there is none or more than
// one at that depth.
func codexTurnProcess(t *testing.T, root int) (int, string) {
	t.Helper()
	children := map[int][]int{}
	procs, _ := filepath.Glob("/proc/[0-9]*")
	for _, p := range procs {
		stat, err := os.ReadFile(filepath.Join(p, "stat"))
		if err != nil {
			continue
		}
		// pid (comm) state ppid …: comm may hold spaces and parentheses.
		i := bytes.LastIndexByte(stat, ')')
		f := strings.Fields(string(stat[i+1:]))
		if i < 0 || len(f) < 2 {
			continue
		}
		pid, _ := strconv.Atoi(filepath.Base(p))
		ppid, _ := strconv.Atoi(f[1])
		children[ppid] = append(children[ppid], pid)
	}
	var tree []string
	level := []int{root}
	for depth := 0; len(level) > 0 && depth < 10; depth++ {
		var found []int
		var next []int
		for _, pid := range level {
			exe, _ := os.Readlink(fmt.Sprintf("/proc/%d/exe", pid))
			cmdline, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
			line := strings.ReplaceAll(strings.TrimRight(string(cmdline), "\x00"), "\x00", " ")
			tree = append(tree, fmt.Sprintf("%d %s: %s", pid, exe, line))
			if filepath.Base(exe) == "codex" && strings.Contains(exe, "vendor") {
				found = append(found, pid)
			}
			next = append(next, children[pid]...)
		}
		if len(found) == 1 {
			cmdline, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", found[0]))
			return found[0], strings.ReplaceAll(strings.TrimRight(string(cmdline), "\x00"), "\x00", " ")
		}
		if len(found) > 1 {
			t.Fatalf("%d native codex processes at one depth below aq: %v\n%s", len(found), found, strings.Join(tree, "\n"))
		}
		level = next
	}
	t.Fatalf("no native codex process below aq (%d):\n%s", root, strings.Join(tree, "\n"))
	return 0, ""
}

// TestCodexWallBudgetStopsIt: the API holds its answer; the job's wall
// budget stops the real codex (nothing left running), reason timeout.
func TestCodexWallBudgetStopsIt(t *testing.T) {
	t.Parallel()
	hold := make(chan struct{}) // never closed: the answer never comes
	r := codexNewRig(t, fakellm.ResponsesScript{Turns: []fakellm.ResponsesTurn{{Hold: hold, Text: "never", Times: 10}}}, nil)
	r.submit("wall", codexManifest("budget:\n  wall: 20s"))
	res := r.run("run", "--once")
	v := r.show("wall")
	if v.Reason != job.ReasonTimeout {
		t.Fatalf("%s\nstage %s reason %s (%s)\nlogs:\n%s", res, v.Stage, v.Reason, v.Detail, r.logs("wall"))
	}
	if len(r.fake.Posts()) == 0 {
		t.Errorf("codex never asked the API")
	}
	if left := codexLeftRunning(t, r.h.Dir); len(left) != 0 {
		t.Errorf("left running: %v", left)
	}
	codexNotShipped(t, r, "wall")
}

// TestCodexUSDBudget: codex reports usage only when its turn ends
// (turn.completed), so budget.usd cannot stop it mid-turn, and a run that
// finished is kept (the runner's rule for every engine); what the budget
// stops is the next run: a repair round after a failed verify is not
// started once the attempt has spent its budget — budget_exceeded, never
// shipped, the fake asked by the first run only.
func TestCodexUSDBudget(t *testing.T) {
	t.Parallel()
	turns := []fakellm.ResponsesTurn{
		// Below codex's auto-compaction threshold (a request near the
		// context window makes codex compact the thread first).
		{Calls: []fakellm.ResponsesCall{{Shell: "echo spent > spent.txt"}}, Usage: fakellm.ResponsesUsage{Input: 8000, Output: 3000}},
		{Text: "Spent a lot.", Usage: fakellm.ResponsesUsage{Input: 9000, Output: 3000}},
		{Text: "The repair round must not run.", Usage: fakellm.ResponsesUsage{Input: 1, Output: 1}},
	}
	if cost := codexUsage(turns[:2]...).CostUSD; cost < 0.02 {
		t.Fatalf("the turns cost $%.4f: too little to pass a $0.01 budget", cost)
	}
	r := codexNewRig(t, fakellm.ResponsesScript{Turns: turns}, nil)
	r.submit("usd", codexManifest("budget:\n  usd: 0.01", "verify: test -f never.txt", "verify_rounds: 1"))
	res := r.run("run", "--once")
	v := r.show("usd")
	if v.Reason != job.ReasonBudgetExceeded || !strings.Contains(v.Detail, "repair round 1 was not started") {
		t.Fatalf("%s\nstage %s reason %s (%s)\nlogs:\n%s", res, v.Stage, v.Reason, v.Detail, r.logs("usd"))
	}
	if n := len(r.fake.Posts()); n != 2 {
		t.Errorf("the fake saw %d posts, want the first run's 2", n)
	}
	codexSameUsage(t, "usd", v.Insights, codexUsage(turns[:2]...))
	codexNotShipped(t, r, "usd")
}

// codexErrorCases: the API's errors as codex 0.171.0 meets them (it
// retries each five times, ~40 s), and the job's reason.
func TestCodexAPIErrors(t *testing.T) {
	t.Parallel()
	html := "<!DOCTYPE html><html><head><title>502 Bad Gateway</title></head><body><h1>Bad Gateway</h1></body></html>"
	for _, c := range []struct {
		name   string
		fail   fakellm.ResponsesFail
		reason job.Reason
		detail []string // substrings of the job's detail
	}{
		{"401", fakellm.ResponsesFail{Status: 401, Message: "Incorrect API key provided: sk-codex-****0000.", Code: "invalid_api_key"}, job.ReasonEngineUnavailable, []string{"401 Unauthorized", "CODEX_API_KEY", "codex login"}},
		{"429", fakellm.ResponsesFail{Status: 429, RetryAfter: 2, Message: "Rate limit reached for gpt-5.5.", Code: "rate_limit_exceeded"}, job.ReasonRateLimited, []string{"429 Too Many Requests"}},
		{"500", fakellm.ResponsesFail{Status: 500}, job.ReasonEngineUnavailable, []string{"high demand"}},
		{"503", fakellm.ResponsesFail{Status: 503}, job.ReasonEngineUnavailable, nil},
		{"html", fakellm.ResponsesFail{Body: html}, job.ReasonEngineFailed, []string{"stream closed before response.completed"}},
		{"cut", fakellm.ResponsesFail{CutAfter: 4}, job.ReasonEngineFailed, []string{"stream disconnected before completion"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			f := c.fail
			r := codexNewRig(t, fakellm.ResponsesScript{Turns: []fakellm.ResponsesTurn{{Fail: &f, Text: "a long answer that may be cut off", Times: 100}}}, nil)
			name := "err" + c.name
			r.submit(name, codexManifest())
			res := r.run("run", "--once")
			v := r.show(name)
			if v.Reason != c.reason {
				t.Fatalf("%s\nstage %s reason %s (%s), want %s\nlogs:\n%s", res, v.Stage, v.Reason, v.Detail, c.reason, r.logs(name))
			}
			for _, want := range c.detail {
				if !strings.Contains(v.Detail, want) {
					t.Errorf("detail %q lacks %q", v.Detail, want)
				}
			}
			if c.reason == job.ReasonRateLimited && (v.Parked == "" || !v.NotBefore.After(time.Now().Add(-time.Minute))) {
				t.Errorf("a rate limit parks the job: parked %q until %v (stage %s)", v.Parked, v.NotBefore, v.Stage)
			}
			if n := len(r.fake.Posts()); n < 2 {
				t.Errorf("codex asked %d times: it retries", n)
			}
			if left := codexLeftRunning(t, r.h.Dir); len(left) != 0 {
				t.Errorf("left running: %v", left)
			}
			codexNotShipped(t, r, name)
			codexNoSecrets(t, r.fake)
		})
	}
}

// codexNotShipped fails t when the job's branch reached the origin.
func codexNotShipped(t *testing.T, r *codexRig, name string) {
	t.Helper()
	if ref := testenv.RemoteRefs(t, r.origin, "refs/heads/aq/job/")["refs/heads/aq/job/"+testenv.ID(name)]; ref != "" {
		t.Errorf("the job's branch shipped (%s)", ref)
	}
}
