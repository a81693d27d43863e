package engines

import (
	"errors"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/aqfleet/aq/internal/process"
)

func TestClaudeArgs(t *testing.T) {
	c := &Claude{}
	sid := "5f3c1d2e-8b7a-4c6d-9e0f-1a2b3c4d5e6f"
	args, got, err := c.Args(Spec{
		Model: "claude-sonnet-4-5", PermissionMode: "bypassPermissions", SessionID: sid,
		Persona: "  You are a careful Go reviewer.\n", Budget: Budget{USD: 2.5, Turns: 40, Tokens: 1e6},
	})
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"-p", "--output-format", "stream-json", "--verbose", "--max-turns", "40",
		"--max-budget-usd", "2.5", "--model", "claude-sonnet-4-5", "--permission-mode", "bypassPermissions",
		"--session-id", sid, "--append-system-prompt", "You are a careful Go reviewer."}
	if !slices.Equal(args, want) || got != sid {
		t.Errorf("Args =\n%q (session %s)\nwant\n%q", args, got, want)
	}

	args, got, err = c.Args(Spec{})
	if err != nil {
		t.Fatal(err)
	}
	want = []string{"-p", "--output-format", "stream-json", "--verbose", "--permission-mode", "acceptEdits", "--session-id", got}
	if !slices.Equal(args, want) || !uuidPattern().MatchString(got) {
		t.Errorf("minimal Args = %q, want %q with a fresh UUID", args, want)
	}
	if _, _, err := c.Args(Spec{SessionID: "job-42"}); err == nil {
		t.Error("a session id that is not a UUID was accepted")
	}
}

// TestClaudeIsSandbox: IS_SANDBOX=1 only as root with bypassPermissions
// (claude exits 1 there otherwise), never in any other case.
func TestClaudeIsSandbox(t *testing.T) {
	for _, tc := range []struct {
		euid int
		mode string
		want bool
	}{
		{0, "bypassPermissions", true},
		{1000, "bypassPermissions", false},
		{0, "acceptEdits", false},
		{0, "", false},
	} {
		c := &Claude{euid: func() int { return tc.euid }}
		env := c.env(Spec{PermissionMode: tc.mode, Env: []string{"PATH=/bin"}})
		if got := envValue(env, "IS_SANDBOX") == "1"; got != tc.want {
			t.Errorf("euid %d, mode %q: IS_SANDBOX set = %t, want %t", tc.euid, tc.mode, got, tc.want)
		}
	}

	// And it reaches the process.
	h := newFakeHost(t)
	r := h.run(t, fixture{stdout: "claude/success.jsonl"})
	r.spec.PermissionMode = "bypassPermissions"
	c := &Claude{euid: func() int { return 0 }}
	if _, err := c.Run(t.Context(), r.spec); err != nil {
		t.Fatal(err)
	}
	if envValue(r.recording(t).Env, "IS_SANDBOX") != "1" {
		t.Error("IS_SANDBOX=1 did not reach claude run as root with bypassPermissions")
	}
}

// claudeCases are the recorded outputs and how each must be classified.
// Every trap of ENGINES.md is here; removing its classification fails the
// explicit check before the golden file is compared.
var claudeCases = []struct {
	name       string
	exit       int
	stderr     bool
	want       Outcome
	wantBudget bool
	wantLimit  *Limit
}{
	{name: "success", want: Succeeded},
	{name: "success_is_error", exit: 1, want: TaskFailed}, // subtype success, is_error true
	{name: "auth_expired", exit: 1, want: Unavailable},    // OAuth token has expired, 401
	// The legacy "usage limit reached|<epoch>" text.
	{name: "usage_limit", exit: 1, want: Limited, wantLimit: &Limit{Kind: LimitUsage, ResetAt: time.Unix(1767225600, 0).UTC(), Source: "text"}},
	// error_during_execution, 429 per-minute limit: no reset time.
	{name: "rate_limited", exit: 1, want: Limited, wantLimit: &Limit{Kind: LimitRate}},
	// A rejected rate_limit_event (resetsAt) before "You've hit your limit".
	{name: "rate_limit_event", exit: 1, want: Limited, wantLimit: &Limit{Kind: LimitUsage, ResetAt: time.Unix(1778565600, 0).UTC(), Source: "rate_limit_event"}},
	// Recorded from claude 2.1.197, unauthenticated and offline: a result
	// with subtype success and is_error true, "Not logged in", exit 1.
	{name: "real_unauthenticated", exit: 1, want: Unavailable},
	// Recorded from claude 2.1.197 with an API key and no network: ten
	// api_retry events, then "Unable to connect to API", exit 1.
	{name: "real_offline_api_key", exit: 1, want: Unavailable},
	// Recorded from claude 2.1.332 with CLAUDE_CODE_MAX_RETRIES=2 against
	// a 127.0.0.1 port (testdata/README.md): nothing listening; a server
	// answering 500; one answering the egress proxy's 403 (X-Aq-Egress:
	// refused), which claude calls "Failed to authenticate" — an egress
	// refusal, never "auth failed".
	{name: "real_api_retry_no_listener", exit: 1, want: Unavailable},
	{name: "real_api_retry_500", exit: 1, want: Unavailable},
	{name: "real_proxy_refused", exit: 1, want: Unavailable},
	// Recorded from claude 2.1.332 against internal/fakellm (the API
	// fake; testdata/README.md): a turn's text and usage; a refused key
	// (401, retried twice under CLAUDE_CODE_MAX_RETRIES=2, "Invalid API key ·
	// Fix external API key"); a 429 with retry-after 1800 (not retried, no
	// reset time printed); 529 and 500 (retried, then "API Error: 529
	// Overloaded…" / "API Error: 500 …", error server_error); an HTML page
	// (a non-streaming retry, then "API returned an empty or malformed
	// response", error unknown); streams cut on every try, then the
	// non-streaming fallback that got the whole answer.
	{name: "real_2.1.332_success", want: Succeeded},
	{name: "real_2.1.332_401", exit: 1, want: Unavailable},
	{name: "real_2.1.332_429", exit: 1, want: Limited, wantLimit: &Limit{Kind: LimitRate}},
	{name: "real_2.1.332_529", exit: 1, want: Unavailable},
	{name: "real_2.1.332_500", exit: 1, want: Unavailable},
	{name: "real_2.1.332_html", exit: 1, want: Unavailable},
	{name: "real_2.1.332_cut_then_whole", want: Succeeded},
	{name: "max_turns", exit: 1, want: TaskFailed},        // error_max_turns (is_error false)
	{name: "max_budget", want: Stopped, wantBudget: true}, // error_max_budget_usd, is_error false, exit 0
	{name: "during_execution", exit: 1, want: TaskFailed}, // error_during_execution
	{name: "no_result", want: TaskFailed},                 // exit 0, no output at all
	{name: "no_result_auth", exit: 1, stderr: true, want: Unavailable},
	{name: "malformed", want: Succeeded}, // bad lines mid-stream are skipped
	// --resume of a session claude does not have (claude 2.1.258, as
	// recorded by others: see testdata/README.md).
	{name: "resume_not_found", exit: 1, stderr: true, want: TaskFailed},
}

// goldenNow is "now" for the recorded outputs whose reset time is a wall
// clock ("resets 2pm"): 2026-05-12 03:00 UTC.
var goldenNow = time.Date(2026, 5, 12, 3, 0, 0, 0, time.UTC)

func TestClaudeGolden(t *testing.T) {
	for _, tc := range claudeCases {
		t.Run(tc.name, func(t *testing.T) {
			p := newClaudeParser("", nil, nil, nil)
			p.now = func() time.Time { return goldenNow }
			res := finishRecorded(t, p, "claude", tc.name, tc.exit, tc.stderr)
			if res.Outcome != tc.want || res.BudgetExceeded != tc.wantBudget {
				t.Fatalf("Outcome = %s, BudgetExceeded = %t (%s), want %s, %t", res.Outcome, res.BudgetExceeded, res.Detail, tc.want, tc.wantBudget)
			}
			if tc.wantLimit != nil && (res.Limit == nil || *res.Limit != *tc.wantLimit) {
				t.Fatalf("Limit = %+v, want %+v", res.Limit, tc.wantLimit)
			}
			checkGolden(t, "claude/"+tc.name+".golden", res)
		})
	}
}

func TestClaudeMalformedLinesAreCounted(t *testing.T) {
	res := finishRecorded(t, newClaudeParser("", nil, nil, nil), "claude", "malformed", 0, false)
	if res.SkippedLines != 2 || !strings.Contains(res.Detail, "skipped 2") {
		t.Errorf("SkippedLines = %d, Detail = %q; want 2 skipped lines named in the detail", res.SkippedLines, res.Detail)
	}
	if want := finishRecorded(t, newClaudeParser("", nil, nil, nil), "claude", "success", 0, false).Usage; res.Usage != want {
		t.Errorf("usage with malformed lines %+v, want the same as without %+v", res.Usage, want)
	}
}

// TestClaudeLiveUsage: usage is metered while claude streams — each API
// call once, however many content blocks repeat its usage — priced as an
// estimate, then replaced by the result's own accounting.
func TestClaudeLiveUsage(t *testing.T) {
	var seen []Usage
	p := newClaudeParser("", nil, MeterFunc(func(u Usage) { seen = append(seen, u) }), nil)
	feed(t, "claude/success.jsonl", p.onStdout)
	if len(seen) != 5 {
		t.Fatalf("the meter saw %d updates, want 5 (four assistant events, one result)", len(seen))
	}
	// After msg A's second block: one call, output 112 (not 6+112).
	if u := seen[1]; u.TokensIn != 3+4215+11234 || u.TokensOut != 112 || u.TokensCached != 11234 || u.Turns != 1 || !u.Estimated {
		t.Errorf("after the first call: %+v", u)
	}
	live := seen[3]
	if live.TokensIn != 13+5437+42952 || live.TokensOut != 410 || live.Turns != 3 || !live.Estimated || live.CostUSD < 0.039 || live.CostUSD > 0.040 {
		t.Errorf("live usage before the result: %+v, want 48402 in, 410 out, 3 turns, ~$0.0395 estimated", live)
	}
	final := seen[4]
	want := Usage{TokensIn: 48402, TokensOut: 410, TokensCached: 42952, TokensCacheWrite: 5437, CostUSD: 0.0396, Turns: 4}
	if final != want {
		t.Errorf("final usage %+v, want %+v", final, want)
	}
}

// TestClaudeHangAfterResult: claude that never exits after its result event
// (anthropics/claude-code#25629) is stopped after ResultGrace and the run
// still counts as the success it reported.
func TestClaudeHangAfterResult(t *testing.T) {
	h := newFakeHost(t)
	r := h.run(t, fixture{stdout: "claude/scenario_hang_after_result.jsonl"})
	c := &Claude{ResultGrace: 50 * time.Millisecond}
	res, err := c.Run(t.Context(), r.spec)
	if err != nil {
		t.Fatal(err)
	}
	if res.Outcome != Succeeded || !res.Process.Stopped || !errors.Is(res.Process.StopCause, errResultGrace) {
		t.Errorf("Outcome = %s (stopped %t, cause %v), want success after aq stopped the lingering process", res.Outcome, res.Process.Stopped, res.Process.StopCause)
	}
	if res.Usage.CostUSD != 0.0396 || res.SessionID != "5f3c1d2e-8b7a-4c6d-9e0f-1a2b3c4d5e6f" || res.Version != "2.1.85" {
		t.Errorf("result = %+v", res)
	}
	assertNoTagged(t, r.spec.JobID)
}

// TestClaudeRunCommandLine: what the claude process actually receives.
func TestClaudeRunCommandLine(t *testing.T) {
	h := newFakeHost(t)
	r := h.run(t, fixture{stdout: "claude/success.jsonl"})
	r.spec.Model, r.spec.Persona = "claude-sonnet-4-5", "You are terse."
	r.spec.Budget = Budget{USD: 1, Turns: 30}
	res, err := (&Claude{}).Run(t.Context(), r.spec)
	if err != nil {
		t.Fatal(err)
	}
	rec := r.recording(t)
	sid := argAfter(rec.Args, "--session-id")
	want := []string{"-p", "--output-format", "stream-json", "--verbose", "--max-turns", "30", "--max-budget-usd", "1",
		"--model", "claude-sonnet-4-5", "--permission-mode", "acceptEdits", "--session-id", sid, "--append-system-prompt", "You are terse."}
	if !slices.Equal(rec.Args, want) || !uuidPattern().MatchString(sid) {
		t.Errorf("claude got %q, want %q", rec.Args, want)
	}
	if rec.Stdin != r.spec.Prompt || slices.Contains(rec.Args, r.spec.Prompt) {
		t.Errorf("the prompt must go on stdin only: stdin %q, args %q", rec.Stdin, rec.Args)
	}
	if res.Model != "claude-sonnet-4-5-20250929" {
		t.Errorf("Model = %q, want the one claude reported", res.Model)
	}
}

func TestClaudeAuthPreflight(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("credentials are in the keychain off Linux")
	}
	home := t.TempDir()
	env := []string{"HOME=" + home}
	if why := claudeAuthMissing(env); why == "" {
		t.Error("no key and no credentials file: want a reason")
	}
	if claudeAuthMissing(append(env, "ANTHROPIC_API_KEY=x")) != "" || claudeAuthMissing(append(env, "CLAUDE_CODE_OAUTH_TOKEN=x")) != "" {
		t.Error("an API key or OAuth token in the environment is enough")
	}
	if err := os.MkdirAll(filepath.Join(home, ".claude"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(home, ".claude", ".credentials.json"), []byte(`{}`), 0o600); err != nil {
		t.Fatal(err)
	}
	if why := claudeAuthMissing(env); why != "" {
		t.Errorf("with ~/.claude/.credentials.json: %s", why)
	}

	h := newFakeHost(t)
	r := h.run(t, fixture{})
	r.spec.Env = withEnv(r.spec.Env, "ANTHROPIC_API_KEY=", "HOME="+t.TempDir())
	var ue *UnavailableError
	if _, err := (&Claude{}).Preflight(t.Context(), r.spec); !errors.As(err, &ue) {
		t.Errorf("Preflight without credentials: %v, want *UnavailableError", err)
	}
}

// TestClaudeRecoveredErrorIsNotTheEnd: an assistant error claude recovered
// from does not make a later task failure look like an outage; an error on
// the last assistant event does, in whatever JSON shape it comes.
func TestClaudeRecoveredErrorIsNotTheEnd(t *testing.T) {
	lines := []string{
		`{"type":"system","subtype":"init","session_id":"s","model":"claude-sonnet-4-5"}`,
		`{"type":"assistant","message":{"id":"m1","model":"<synthetic>","content":[{"type":"text","text":"API Error: 429 rate_limit_error"}]},"parent_tool_use_id":null,"error":"rate_limit"}`,
		`{"type":"assistant","message":{"id":"m2","model":"claude-sonnet-4-5","content":[{"type":"text","text":"Retrying worked."}],"usage":{"input_tokens":10,"output_tokens":5}},"parent_tool_use_id":null}`,
		`{"type":"result","subtype":"error_during_execution","is_error":true,"num_turns":2,"session_id":"s","total_cost_usd":0.01,"errors":["Error: EACCES: permission denied"]}`,
	}
	p := newClaudeParser("", nil, nil, nil)
	for _, l := range lines {
		p.onStdout([]byte(l))
	}
	if res := p.finish(process.Result{ExitCode: 1}, false); res.Outcome != TaskFailed {
		t.Errorf("Outcome = %s (%s), want failed: the rate limit was recovered from", res.Outcome, res.Detail)
	}

	p = newClaudeParser("", nil, nil, nil)
	p.onStdout([]byte(`{"type":"assistant","message":{"id":"m1","model":"<synthetic>","content":[{"type":"text","text":"Request failed"}]},"error":{"type":"billing_error"}}`))
	p.onStdout([]byte(`{"type":"result","subtype":"success","is_error":true,"num_turns":1,"result":"Request failed","errors":[{"message":"Request failed"}]}`))
	res := p.finish(process.Result{ExitCode: 1}, false)
	if res.Outcome != Limited || res.Limit.Kind != LimitCredits || res.SkippedLines != 0 {
		t.Errorf("Outcome = %s (%+v), skipped %d (%s); want limited (out of credits) from an error object, nothing skipped", res.Outcome, res.Limit, res.SkippedLines, res.Detail)
	}
}

// TestClaudeArgsWithoutOptionalFlags: a claude whose --help lacks the
// optional flags runs without them: no turn or USD limit passed (aq's own
// budgets still apply), no session id chosen (claude's is recorded), and
// the persona goes before the task on stdin.
func TestClaudeArgsWithoutOptionalFlags(t *testing.T) {
	c := &Claude{}
	spec := Spec{
		Model: "claude-sonnet-4-5", Persona: "You are terse.", Prompt: "Fix it.", SessionID: "5f3c1d2e-8b7a-4c6d-9e0f-1a2b3c4d5e6f",
		Budget: Budget{USD: 2, Turns: 9},
		Flags:  &FlagSet{Found: []string{"-p", "--output-format", "--verbose", "--permission-mode", "--model"}},
	}
	args, sid, err := c.Args(spec)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"-p", "--output-format", "stream-json", "--verbose", "--model", "claude-sonnet-4-5", "--permission-mode", "acceptEdits"}
	if !slices.Equal(args, want) || sid != "" {
		t.Errorf("Args = %q (session %q), want %q and no session id", args, sid, want)
	}
	if got := c.prompt(spec); got != "You are terse.\n\nFix it." {
		t.Errorf("prompt = %q, want the persona before the task", got)
	}
	spec.Flags = nil // unprobed: the full command line, the persona by flag
	if got := c.prompt(spec); got != "Fix it." {
		t.Errorf("prompt with --append-system-prompt = %q", got)
	}
}
