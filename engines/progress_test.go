package engines

import (
	"errors"
	"strings"
	"testing"

	"github.com/aqfleet/aq/internal/process"
)

// TestProxyRefusalIsNotAuth (#33 item 5): the real claude calls the egress
// proxy's 403 "Failed to authenticate"; aq reads the proxy's marker first
// and says the proxy refused the host — never "auth failed". codex too.
func TestProxyRefusalIsNotAuth(t *testing.T) {
	res := finishRecorded(t, newClaudeParser("", nil, nil, nil), "claude", "real_proxy_refused", 1, false)
	if res.Outcome != Unavailable || res.EgressRefused == nil || res.EgressRefused.Host != "gw.example.com" || res.EgressRefused.Port != 443 ||
		strings.Contains(res.Detail, "auth") || !strings.Contains(res.Detail, "the job's egress proxy refused gw.example.com:443") {
		t.Errorf("claude: %s %+v %q", res.Outcome, res.EgressRefused, res.Detail)
	}
	p := newCodexParser("gpt-5.3-codex", nil, nil, nil)
	// codex's words for an HTTP error answer, with the proxy's body.
	p.onStdout([]byte(`{"type":"turn.started"}`))
	p.onStdout([]byte(`{"type":"turn.failed","error":{"message":"unexpected status 403 Forbidden: aq egress proxy: llm-gw.example.com:443 refused: llm-gw.example.com is not allowed: add it to AQ_SANDBOX_NET (docs/sandbox.md, Network)"}}`))
	res = p.finish(process.Result{ExitCode: 1}, false)
	if res.Outcome != Unavailable || res.EgressRefused == nil || res.EgressRefused.Host != "llm-gw.example.com" || strings.Contains(res.Detail, "auth") {
		t.Errorf("codex: %s %+v %q", res.Outcome, res.EgressRefused, res.Detail)
	}
}

// TestNoAPIProgress (#33 item 5): N of the engine's own retry events with
// no answer between stop the run (the abort the runner's context gets),
// and the run is Unavailable, NoProgress, naming where the engine called;
// an answer between resets the count, and a rate limit's retries (429)
// are not counted. Fed from the real CLIs' recordings.
func TestNoAPIProgress(t *testing.T) {
	env := []string{"HOME=" + t.TempDir(), "ANTHROPIC_BASE_URL=http://127.0.0.1:4000", "OPENAI_BASE_URL=http://127.0.0.1:4001/v1"}
	var aborted []error
	abort := func(err error) { aborted = append(aborted, err) }

	cp := newClaudeParser("", nil, nil, nil)
	cp.watch(2, apiEndpoint("claude", env), abort)
	feed(t, "claude/real_api_retry_no_listener.jsonl", cp.onStdout)
	if len(aborted) != 1 || !errors.Is(aborted[0], errNoProgress) {
		t.Fatalf("claude: aborted %v, want once at the second api_retry", aborted)
	}
	res := cp.finish(process.Result{ExitCode: 143, Stopped: true, StopCause: errNoProgress}, false)
	if res.Outcome != Unavailable || !res.NoProgress || res.Subtype != "no_api_progress" ||
		!strings.Contains(res.Detail, "claude made no API progress: 2 api_retry events in a row without an answer, calling http://127.0.0.1:4000 (ANTHROPIC_BASE_URL)") ||
		!strings.Contains(res.Detail, "no answer") {
		t.Errorf("claude: %s %v %q", res.Outcome, res.NoProgress, res.Detail)
	}

	// An answer between, and a 429's retries, do not count.
	aborted = nil
	cp = newClaudeParser("", nil, nil, nil)
	cp.watch(2, "x", abort)
	for _, l := range []string{
		`{"type":"system","subtype":"api_retry","attempt":1,"max_retries":10,"error_status":500,"error":"server_error"}`,
		`{"type":"assistant","message":{"id":"m1","model":"claude-sonnet-4-5","content":[{"type":"text","text":"hi"}],"usage":{"input_tokens":3,"output_tokens":1}}}`,
		`{"type":"system","subtype":"api_retry","attempt":1,"max_retries":10,"error_status":529,"error":"overloaded"}`,
		`{"type":"system","subtype":"api_retry","attempt":2,"max_retries":10,"error_status":429,"error":"rate_limit"}`,
		`{"type":"system","subtype":"api_retry","attempt":3,"max_retries":10,"error_status":429,"error":"rate_limit"}`,
	} {
		cp.onStdout([]byte(l))
	}
	if len(aborted) != 0 {
		t.Errorf("claude stopped after an answer and rate-limit retries: %v", aborted)
	}
	// A synthetic assistant message (claude's own error text) is no answer.
	cp.onStdout([]byte(`{"type":"assistant","message":{"id":"x","model":"<synthetic>","content":[{"type":"text","text":"API Error"}],"usage":{"input_tokens":0,"output_tokens":0}},"error":"server_error"}`))
	cp.onStdout([]byte(`{"type":"system","subtype":"api_retry","attempt":2,"max_retries":10,"error_status":null,"error":"unknown"}`))
	if len(aborted) != 1 {
		t.Errorf("claude: a synthetic message reset the count: aborted %v", aborted)
	}
	// Stopped for another reason (the wall), the run is that stop.
	res = cp.finish(process.Result{ExitCode: 143, Stopped: true, StopCause: errors.New("wall")}, false)
	if res.NoProgress {
		t.Errorf("a run stopped by something else: %+v", res)
	}

	aborted = nil
	xp := newCodexParser("gpt-5.3-codex", nil, nil, nil)
	xp.watch(5, apiEndpoint("codex", env), abort)
	feed(t, "codex/real_reconnecting.jsonl", xp.onStdout)
	if len(aborted) != 1 {
		t.Fatalf("codex: aborted %v, want once at the fifth Reconnecting", aborted)
	}
	res = xp.finish(process.Result{ExitCode: 143, Stopped: true, StopCause: errNoProgress}, false)
	if res.Outcome != Unavailable || !res.NoProgress || !strings.Contains(res.Detail, `codex made no API progress: 5 "Reconnecting..." events`) ||
		!strings.Contains(res.Detail, "http://127.0.0.1:4001/v1 (OPENAI_BASE_URL)") {
		t.Errorf("codex: %s %v %q", res.Outcome, res.NoProgress, res.Detail)
	}
	// Without an abort (a recorded stream, a test) nothing stops.
	np := newClaudeParser("", nil, nil, nil)
	feed(t, "claude/real_api_retry_no_listener.jsonl", np.onStdout)
	if np.stalled != "" {
		t.Errorf("stalled without an abort: %q", np.stalled)
	}
}

// TestAPIEndpoint: where an engine calls, for messages — the base URL that
// wins, without its password, and the setting; else the vendor's API.
func TestAPIEndpoint(t *testing.T) {
	home := t.TempDir()
	for _, tc := range []struct {
		engine string
		env    []string
		want   string
	}{
		{"claude", nil, "the Anthropic API"},
		{"codex", nil, "the OpenAI API"},
		{"claude", []string{"ANTHROPIC_BASE_URL=https://u:s3cret@gw.example.com/a"}, "https://u:xxxxx@gw.example.com/a (ANTHROPIC_BASE_URL)"},
		{"claude", []string{"ANTHROPIC_BASE_URL=nope"}, "the Anthropic API"},
	} {
		if got := apiEndpoint(tc.engine, append([]string{"HOME=" + home}, tc.env...)); got != tc.want {
			t.Errorf("%s %v: %q, want %q", tc.engine, tc.env, got, tc.want)
		}
	}
}
