package engines

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

func TestCodexArgs(t *testing.T) {
	c := &Codex{}
	if got, want := c.Args(Spec{Model: "gpt-5.3-codex"}), []string{"exec", "--json", "--sandbox", "workspace-write", "-m", "gpt-5.3-codex", "-"}; !slices.Equal(got, want) {
		t.Errorf("Args = %q, want %q", got, want)
	}
	if got, want := c.Args(Spec{}), []string{"exec", "--json", "--sandbox", "workspace-write", "-"}; !slices.Equal(got, want) {
		t.Errorf("Args without a model = %q, want %q", got, want)
	}
}

// codexCases are the recorded outputs and how each must be classified.
var codexCases = []struct {
	name      string
	exit      int
	stderr    bool
	want      Outcome
	wantLimit *Limit
}{
	{name: "success", want: Succeeded},
	{name: "turn_failed_exit0", exit: 0, want: TaskFailed}, // turn.failed, yet exit 0
	{name: "auth_401", exit: 1, want: Unavailable},
	// "… or try again at 3:04 PM." (codex's local time; UTC here): the next
	// 3:04 PM after goldenNow.
	{name: "usage_limit", exit: 1, want: Limited, wantLimit: &Limit{Kind: LimitUsage, ResetAt: time.Date(2026, 5, 12, 15, 4, 0, 0, time.UTC), Source: "text"}},
	{name: "usage_limit_date", exit: 1, want: Limited, wantLimit: &Limit{Kind: LimitUsage, ResetAt: time.Date(2026, 11, 26, 15, 4, 0, 0, time.UTC), Source: "text"}},
	{name: "out_of_credits", exit: 1, want: Limited, wantLimit: &Limit{Kind: LimitCredits}},
	// Recorded from codex 0.169.0 unauthenticated and offline, cut by
	// timeout(1) after two minutes of "Reconnecting... waiting for
	// network": had it exited there, the API was out of reach.
	{name: "real_offline_unauthenticated", exit: 1, stderr: true, want: Unavailable},
	// Recorded from codex 0.171.0 against a closed 127.0.0.1 port, stopped
	// by timeout(1) (testdata/README.md): "Reconnecting... n/5", then
	// "waiting for network" without end.
	{name: "real_reconnecting", exit: 124, want: Unavailable},
	{name: "retry_then_success", want: Succeeded}, // an error event codex recovered from
	{name: "stream_error", exit: 1, want: TaskFailed},
	{name: "no_events", exit: 1, stderr: true, want: TaskFailed},
	{name: "malformed", want: Succeeded},
	// exec resume of a thread codex does not have: stderr only, exit 1.
	{name: "resume_not_found", exit: 1, stderr: true, want: TaskFailed},
	// Recorded from codex 0.171.0 against fakellm (realcli): an
	// exec_command call, then a message; the "Model metadata … not found"
	// item of type error a model outside codex's catalogue adds; usage
	// with cache_write_input_tokens and reasoning_output_tokens.
	{name: "real_tool_call", want: Succeeded},
	{name: "real_resume", want: Succeeded},
	// codex 0.171.0 against fakellm's scripted errors: each retried five
	// times ("Reconnecting... n/5"), then an error and turn.failed, exit 1.
	// 401: an auth failure naming the login; 429: a rate limit without a
	// reset time (codex does not print the retry-after); 500: "high
	// demand", overloaded; an HTML page for a stream and a stream cut
	// mid-way: codex's own words, a task failure.
	{name: "real_auth_401", exit: 1, stderr: true, want: Unavailable},
	{name: "real_429", exit: 1, stderr: true, want: Limited, wantLimit: &Limit{Kind: LimitRate}},
	{name: "real_500", exit: 1, stderr: true, want: Unavailable},
	{name: "real_html", exit: 1, stderr: true, want: TaskFailed},
	{name: "real_cut", exit: 1, stderr: true, want: TaskFailed},
}

func TestCodexGolden(t *testing.T) {
	for _, tc := range codexCases {
		t.Run(tc.name, func(t *testing.T) {
			p := newCodexParser("gpt-5.3-codex", nil, nil, nil)
			p.now, p.loc = func() time.Time { return goldenNow }, time.UTC
			res := finishRecorded(t, p, "codex", tc.name, tc.exit, tc.stderr)
			if res.Outcome != tc.want {
				t.Fatalf("Outcome = %s (%s), want %s", res.Outcome, res.Detail, tc.want)
			}
			if tc.wantLimit != nil && (res.Limit == nil || *res.Limit != *tc.wantLimit) {
				t.Fatalf("Limit = %+v, want %+v", res.Limit, tc.wantLimit)
			}
			checkGolden(t, "codex/"+tc.name+".golden", res)
		})
	}
}

// TestCodexUsage: usage comes only from turn.completed, is the thread's
// running total (the last one wins), and is priced from the table.
func TestCodexUsage(t *testing.T) {
	var seen []Usage
	p := newCodexParser("gpt-5.3-codex", nil, MeterFunc(func(u Usage) { seen = append(seen, u) }), nil)
	feed(t, "codex/success.jsonl", p.onStdout)
	if len(seen) != 2 {
		t.Fatalf("meter updates %+v, want two (turn.started, turn.completed)", seen)
	}
	got := seen[1]
	want := Usage{TokensIn: 48213, TokensCached: 40832, TokensOut: 1571, Turns: 1, Estimated: true}
	want.CostUSD = (float64(48213-40832)*1.75 + 40832*0.175 + 1571*14) / 1e6
	if got != want {
		t.Errorf("usage %+v, want %+v", got, want)
	}
	p.onStdout([]byte(`{"type":"turn.started"}`))
	p.onStdout([]byte(`{"type":"turn.completed","usage":{"input_tokens":60000,"cached_input_tokens":50000,"output_tokens":2000}}`))
	if u := seen[len(seen)-1]; u.TokensIn != 60000 || u.TokensOut != 2000 || u.Turns != 2 {
		t.Errorf("after a second turn: %+v, want the new running total, not a sum", u)
	}
}

// TestCodexClosesStdin: the fake codex, like the real one, reads its
// prompt until EOF before doing anything; it finishes only because aq
// closes stdin once the prompt is written. (Were stdin left open, the run
// would hang until the deadline and end Stopped.)
func TestCodexClosesStdin(t *testing.T) {
	h := newFakeHost(t)
	r := h.run(t, fixture{stdout: "codex/success.jsonl"})
	ctx, cancel := context.WithTimeoutCause(t.Context(), time.Minute, errors.New("codex hung: was stdin left open?"))
	defer cancel()
	res, err := (&Codex{}).Run(ctx, r.spec)
	if err != nil {
		t.Fatal(err)
	}
	if res.Outcome != Succeeded || res.Process.Stopped {
		t.Fatalf("Outcome = %s (%s)", res.Outcome, res.Detail)
	}
	rec := r.recording(t)
	if rec.Stdin != r.spec.Prompt {
		t.Errorf("codex read %q from stdin, want the prompt", rec.Stdin)
	}
	if want := []string{"exec", "--json", "--sandbox", "workspace-write", "-"}; !slices.Equal(rec.Args, want) {
		t.Errorf("codex got %q, want %q", rec.Args, want)
	}
	if res.SessionID != "0199a213-81c0-7800-8aa1-bbab2a035a53" || res.FinalText == "" || !res.Usage.Estimated {
		t.Errorf("result = %+v", res)
	}
}

// TestCodexTurnFailedExitZero runs the trap end to end: exit 0 is not
// success when the events say the turn failed.
func TestCodexTurnFailedExitZero(t *testing.T) {
	h := newFakeHost(t)
	r := h.run(t, fixture{stdout: "codex/turn_failed_exit0.jsonl"})
	res, err := (&Codex{}).Run(t.Context(), r.spec)
	if err != nil {
		t.Fatal(err)
	}
	if res.ExitCode != 0 || res.Outcome != TaskFailed || res.Subtype != "turn.failed" {
		t.Errorf("exit %d, Outcome %s, Subtype %s; want exit 0 classified as a failed turn", res.ExitCode, res.Outcome, res.Subtype)
	}
}

func TestCodexHangAfterCompleted(t *testing.T) {
	h := newFakeHost(t)
	r := h.run(t, fixture{stdout: "codex/scenario_hang_after_completed.jsonl"})
	res, err := (&Codex{ResultGrace: 50 * time.Millisecond}).Run(t.Context(), r.spec)
	if err != nil {
		t.Fatal(err)
	}
	if res.Outcome != Succeeded || !errors.Is(res.Process.StopCause, errResultGrace) {
		t.Errorf("Outcome = %s (cause %v), want success after aq stopped the lingering process", res.Outcome, res.Process.StopCause)
	}
	assertNoTagged(t, r.spec.JobID)
}

func TestCodexAuthPreflight(t *testing.T) {
	home := t.TempDir()
	env := []string{"HOME=" + home}
	if codexAuthMissing(env) == "" {
		t.Error("no key and no auth.json: want a reason")
	}
	if codexAuthMissing(append(env, "OPENAI_API_KEY=x")) != "" || codexAuthMissing(append(env, "CODEX_API_KEY=x")) != "" {
		t.Error("an API key in the environment is enough")
	}
	dir := filepath.Join(home, ".codex")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "config.toml"), []byte("cli_auth_credentials_store = \"keyring\"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if why := codexAuthMissing(env); why != "" {
		t.Errorf("credentials in the keyring cannot be seen, so pass: %s", why)
	}
	other := t.TempDir()
	if err := os.WriteFile(filepath.Join(other, "auth.json"), []byte(`{}`), 0o600); err != nil {
		t.Fatal(err)
	}
	if why := codexAuthMissing([]string{"HOME=" + home, "CODEX_HOME=" + other}); why != "" {
		t.Errorf("with $CODEX_HOME/auth.json: %s", why)
	}

	h := newFakeHost(t)
	r := h.run(t, fixture{})
	r.spec.Env = withEnv(r.spec.Env, "CODEX_API_KEY=", "HOME="+t.TempDir())
	var ue *UnavailableError
	if _, err := (&Codex{}).Preflight(t.Context(), r.spec); !errors.As(err, &ue) {
		t.Errorf("Preflight without credentials: %v, want *UnavailableError", err)
	}
}

// TestCodexArgsSandboxMode: codex's --sandbox is spec.CodexSandbox
// (danger-full-access inside aq's sandbox), workspace-write by default,
// and the -c stand-in carries the same mode.
func TestCodexArgsSandboxMode(t *testing.T) {
	with := &FlagSet{Found: []string{"--sandbox", "--json", "-m"}}
	without := &FlagSet{Found: []string{"--json", "-m", "-c"}}
	for _, tc := range []struct {
		mode  string
		flags *FlagSet
		want  []string
	}{
		{"", with, []string{"exec", "--json", "--sandbox", "workspace-write", "-"}},
		{"danger-full-access", with, []string{"exec", "--json", "--sandbox", "danger-full-access", "-"}},
		{"danger-full-access", without, []string{"exec", "--json", "-c", `sandbox_mode="danger-full-access"`, "-"}},
	} {
		if got := (&Codex{}).Args(Spec{CodexSandbox: tc.mode, Flags: tc.flags}); !slices.Equal(got, tc.want) {
			t.Errorf("Args(%q) = %q, want %q", tc.mode, got, tc.want)
		}
	}
}

// TestCodexResumedThreadUsage: codex 0.171.0 (recorded against fakellm)
// prints the thread's running total in a resumed run's turn.completed —
// the first run's 3000/1100/110 tokens plus the resumed request's
// 3000/2000/70 — so the resumed run's own usage is what it adds to the
// session's usage before it, counted once.
func TestCodexResumedThreadUsage(t *testing.T) {
	first := newCodexParser("gpt-5.5", nil, nil, nil)
	res := finishRecorded(t, first, "codex", "real_tool_call", 0, false)
	if res.Outcome != Succeeded || res.Usage.TokensIn != 3000 || res.Usage.TokensCached != 1100 || res.Usage.TokensOut != 110 {
		t.Fatalf("the first run: %s %+v", res.Outcome, res.Usage)
	}
	resumed := newCodexParser("gpt-5.5", nil, nil, nil)
	resumed.base = res.Usage
	res2 := finishRecorded(t, resumed, "codex", "real_resume", 0, false)
	want := Usage{TokensIn: 3000, TokensCached: 2000, TokensOut: 70, Turns: 1, Estimated: true}
	want.CostUSD = DefaultPrices().Cost("gpt-5.5", want)
	if res2.Outcome != Succeeded || res2.Usage != want || res2.SessionID != res.SessionID {
		t.Errorf("the resumed run: %s %+v (session %s), want %+v (session %s)", res2.Outcome, res2.Usage, res2.SessionID, want, res.SessionID)
	}
	if sum := res.Usage.Plus(res2.Usage); sum.TokensIn != 6000 || sum.TokensOut != 180 {
		t.Errorf("the session's usage %+v, want the thread's total 6000 in, 180 out", sum)
	}
}

// TestCodexBaseURLFromTheEnvironment: codex 0.171.0 ignores OPENAI_BASE_URL
// in its environment (it reads openai_base_url from config.toml only), so
// aq passes the variable as a config override — to a fresh run and to a
// resumed one — when it can be one.
func TestCodexBaseURLFromTheEnvironment(t *testing.T) {
	const u = "http://127.0.0.1:4000/v1"
	withC := &FlagSet{Found: []string{"--sandbox", "--json", "-m", "-c"}}
	for _, tc := range []struct {
		name  string
		env   []string
		flags *FlagSet
		want  []string
	}{
		{"set", []string{"OPENAI_BASE_URL=" + u}, withC, []string{"exec", "--json", "--sandbox", "workspace-write", "-m", "gpt-5.5", "-c", `openai_base_url="` + u + `"`, "-"}},
		{"unset", nil, withC, []string{"exec", "--json", "--sandbox", "workspace-write", "-m", "gpt-5.5", "-"}},
		{"empty", []string{"OPENAI_BASE_URL="}, withC, []string{"exec", "--json", "--sandbox", "workspace-write", "-m", "gpt-5.5", "-"}},
		{"a quote cannot be a TOML string as it is", []string{`OPENAI_BASE_URL=http://h/"x`}, withC, []string{"exec", "--json", "--sandbox", "workspace-write", "-m", "gpt-5.5", "-"}},
		{"credentials stay out of argv", []string{"OPENAI_BASE_URL=http://user:secret@gw.example:4000/v1"}, withC, []string{"exec", "--json", "--sandbox", "workspace-write", "-m", "gpt-5.5", "-"}},
		{"a codex without -c", []string{"OPENAI_BASE_URL=" + u}, &FlagSet{Found: []string{"--sandbox", "--json", "-m"}}, []string{"exec", "--json", "--sandbox", "workspace-write", "-m", "gpt-5.5", "-"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			spec := Spec{Model: "gpt-5.5", Env: tc.env, Flags: tc.flags}
			if got := (&Codex{}).Args(spec); !slices.Equal(got, tc.want) {
				t.Errorf("Args = %q, want %q", got, tc.want)
			}
		})
	}
	got := (&Codex{}).ResumeArgs(Spec{Model: "gpt-5.5", Env: []string{"OPENAI_BASE_URL=" + u}}, "01a2264a-4bff-7340-bbcd-8fb54c60ae0f")
	want := []string{"exec", "resume", "--json", "-c", `sandbox_mode="workspace-write"`, "-m", "gpt-5.5", "-c", `openai_base_url="` + u + `"`, "01a2264a-4bff-7340-bbcd-8fb54c60ae0f", "-"}
	if !slices.Equal(got, want) {
		t.Errorf("ResumeArgs = %q, want %q", got, want)
	}
}

// TestEngineKilledSaysSo: an engine killed by a signal mid-turn (kill -9,
// the OOM killer) ends TaskFailed with the signal named, not "exit -1":
// the next attempt's prompt quotes this detail.
func TestEngineKilledSaysSo(t *testing.T) {
	h := newFakeHost(t)
	for _, c := range []struct {
		eng  Engine
		want string
	}{
		{&Codex{}, "codex printed no turn.completed event (killed by SIGKILL"},
		{&Claude{}, "claude printed no result event (killed by SIGKILL"},
	} {
		r := h.run(t, fixture{stdout: c.eng.Name() + "/scenario_killed.jsonl"})
		res, err := c.eng.Run(t.Context(), r.spec)
		if err != nil {
			t.Fatal(err)
		}
		if res.Outcome != TaskFailed || !strings.HasPrefix(res.Detail, c.want) {
			t.Errorf("%s killed -9: Outcome %s, detail %q; want a failure starting %q", c.eng.Name(), res.Outcome, res.Detail, c.want)
		}
	}
}
