package engines

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/aqfleet/aq/internal/process"
)

func TestTextReset(t *testing.T) {
	now := time.Date(2026, 5, 12, 3, 0, 0, 0, time.UTC) // 11:00 in Shanghai
	ny, _ := time.LoadLocation("America/New_York")
	for _, tc := range []struct {
		text string
		loc  *time.Location
		want time.Time
	}{
		{"Claude AI usage limit reached|1767225600", nil, time.Unix(1767225600, 0)},
		{"Claude AI usage limit reached|1767225600000", nil, time.Unix(1767225600, 0)}, // milliseconds
		{"You've hit your limit · resets 2pm (Asia/Shanghai)", nil, time.Date(2026, 5, 12, 6, 0, 0, 0, time.UTC)},
		{"You've hit your limit · resets 2:10pm (Europe/Moscow)", nil, time.Date(2026, 5, 12, 11, 10, 0, 0, time.UTC)},
		// 10am in Shanghai has passed at 11:00: tomorrow's.
		{"You've hit your limit · resets 10am (Asia/Shanghai)", nil, time.Date(2026, 5, 13, 2, 0, 0, 0, time.UTC)},
		{"You've hit your weekly limit · resets Apr 23 at 4pm (America/Recife)", nil, time.Date(2027, 4, 23, 19, 0, 0, 0, time.UTC)},
		{"You've hit your weekly limit · resets May 14, 4pm (UTC)", nil, time.Date(2026, 5, 14, 16, 0, 0, 0, time.UTC)},
		{"You've hit your usage limit. Try again at 3:04 PM.", time.UTC, time.Date(2026, 5, 12, 15, 4, 0, 0, time.UTC)},
		{"You've hit your usage limit. … or try again at 3:04 PM.", ny, time.Date(2026, 5, 12, 19, 4, 0, 0, time.UTC)},
		{"… or try again at Nov 26th, 2026 3:04 PM.", time.UTC, time.Date(2026, 11, 26, 15, 4, 0, 0, time.UTC)},
		{"… or try again at Jun 1st, 2026 12:30 AM.", time.UTC, time.Date(2026, 6, 1, 0, 30, 0, 0, time.UTC)},
	} {
		got, note, ok := textReset(tc.text, now, tc.loc)
		if !ok || !got.Equal(tc.want) || note != "" {
			t.Errorf("%q → %s, %q, %t; want %s", tc.text, got, note, ok, tc.want.UTC())
		}
	}
	// No reset named: nothing, and no note.
	for _, text := range []string{"You've hit your usage limit. Try again later.", "Your workspace is out of credits.", "API Error: 429 rate_limit_error", ""} {
		if got, note, ok := textReset(text, now, time.UTC); ok || note != "" {
			t.Errorf("%q → %s, %q, %t; want no reset and no note", text, got, note, ok)
		}
	}
	// A reset named but unreadable: no reset, a note that says why.
	for _, text := range []string{
		"You've hit your limit · resets soonish (Asia/Shanghai)",
		"You've hit your limit · resets 2pm (Mars/Olympus_Mons)",
		"You've hit your limit · resets 13pm (UTC)",
		"You've hit your limit · resets Feb 30 at 4pm (UTC)",
		"try again at half past three.",
		"Claude AI usage limit reached|99999999999999999",
	} {
		if got, note, ok := textReset(text, now, time.UTC); ok || note == "" {
			t.Errorf("%q → %s, %q, %t; want no reset and a note", text, got, note, ok)
		}
	}
}

func TestEpochReset(t *testing.T) {
	for raw, want := range map[string]time.Time{
		`1778565600`:             time.Unix(1778565600, 0),
		`1778565600.5`:           time.Unix(1778565600, 5e8),
		`"1778565600"`:           time.Unix(1778565600, 0),
		`1778565600000`:          time.Unix(1778565600, 0),
		`"2026-05-12T06:00:00Z"`: time.Unix(1778565600, 0),
	} {
		if got, note, ok := epochReset(json.RawMessage(raw)); !ok || !got.Equal(want) {
			t.Errorf("%s → %s, %q, %t; want %s", raw, got, note, ok, want.UTC())
		}
	}
	for _, raw := range []string{`"soon"`, `-5`, `0`, `true`, `{"at":1}`, `4102444800000000`} {
		if got, note, ok := epochReset(json.RawMessage(raw)); ok || note == "" {
			t.Errorf("%s → %s, %q, %t; want unreadable with a note", raw, got, note, ok)
		}
	}
	if _, note, ok := epochReset(nil); ok || note != "" {
		t.Errorf("no resetsAt: %q, %t; want nothing", note, ok)
	}
}

// claudeLimitRun feeds a rate_limit_event with info, then a failed result
// saying text, and finishes.
func claudeLimitRun(t *testing.T, info, text string) Result {
	t.Helper()
	p := newClaudeParser("", nil, nil, nil)
	p.now = func() time.Time { return goldenNow }
	p.onStdout([]byte(`{"type":"system","subtype":"init","session_id":"s","model":"claude-sonnet-4-5"}`))
	if info != "" {
		p.onStdout([]byte(`{"type":"rate_limit_event","rate_limit_info":` + info + `,"uuid":"u","session_id":"s"}`))
	}
	b, _ := json.Marshal(text)
	p.onStdout([]byte(`{"type":"result","subtype":"success","is_error":true,"num_turns":1,"result":` + string(b) + `,"session_id":"s","total_cost_usd":0}`))
	return p.finish(process.Result{ExitCode: 1}, false)
}

// TestClaudeRateLimitEventBadInput: the rejected event's resetsAt wins;
// without one, or with one aq cannot read, the text's reset (or none) is
// used and the note says why; a reset in the past is reported as it is
// (the runner's parking policy decides what it means).
func TestClaudeRateLimitEventBadInput(t *testing.T) {
	const text = "You've hit your limit · resets 2pm (Asia/Shanghai)"
	textReset := time.Date(2026, 5, 12, 6, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		name, info, text string
		want             time.Time
		source, note     string
	}{
		{"event", `{"status":"rejected","resetsAt":1778572800,"rateLimitType":"five_hour"}`, text, time.Unix(1778572800, 0).UTC(), "rate_limit_event", ""},
		{"no_reset", `{"status":"rejected","rateLimitType":"five_hour"}`, text, textReset, "text", ""},
		{"no_reset_anywhere", `{"status":"rejected","rateLimitType":"five_hour"}`, "You've hit your limit", time.Time{}, "", ""},
		{"past", `{"status":"rejected","resetsAt":1700000000,"rateLimitType":"five_hour"}`, text, time.Unix(1700000000, 0).UTC(), "rate_limit_event", ""},
		{"malformed", `{"status":"rejected","resetsAt":"soon","rateLimitType":"five_hour"}`, text, textReset, "text", ""},
		{"malformed_no_text", `{"status":"rejected","resetsAt":"soon","rateLimitType":"five_hour"}`, "You've hit your limit", time.Time{}, "", `reset time "soon" is not a number`},
		{"info_not_object", `"rejected"`, text, textReset, "text", ""},
		// A rejected event with a result whose words say nothing of limits:
		// the event is what the failure was.
		{"event_only", `{"status":"rejected","resetsAt":1778572800,"rateLimitType":"seven_day"}`, "Request failed", time.Unix(1778572800, 0).UTC(), "rate_limit_event", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			res := claudeLimitRun(t, tc.info, tc.text)
			if res.Outcome != Limited || res.Limit == nil {
				t.Fatalf("Outcome = %s (%s), want limited", res.Outcome, res.Detail)
			}
			if l := res.Limit; !l.ResetAt.Equal(tc.want) || l.Source != tc.source || l.Note != tc.note || l.Kind != LimitUsage {
				t.Errorf("Limit = %+v, want reset %s from %q, note %q", l, tc.want, tc.source, tc.note)
			}
		})
	}

	// allowed_warning is not a failure, and an allowed event after a
	// rejection (overage took over) lifts it: the task's own failure stands.
	res := claudeLimitRun(t, `{"status":"allowed_warning","resetsAt":1778572800,"rateLimitType":"five_hour","utilization":0.95}`, "Error: EACCES: permission denied")
	if res.Outcome != TaskFailed {
		t.Errorf("allowed_warning then a task failure: %s (%s), want failed", res.Outcome, res.Detail)
	}
	p := newClaudeParser("", nil, nil, nil)
	p.onStdout([]byte(`{"type":"rate_limit_event","rate_limit_info":{"status":"rejected","resetsAt":1778572800}}`))
	p.onStdout([]byte(`{"type":"rate_limit_event","rate_limit_info":{"status":"allowed","isUsingOverage":true}}`))
	p.onStdout([]byte(`{"type":"result","subtype":"error_during_execution","is_error":true,"num_turns":3,"errors":["Error: EACCES"]}`))
	if res := p.finish(process.Result{ExitCode: 1}, false); res.Outcome != TaskFailed {
		t.Errorf("rejected, then allowed on overage, then a task failure: %s (%s), want failed", res.Outcome, res.Detail)
	}
	// A rejected event and a success: the success stands.
	p = newClaudeParser("", nil, nil, nil)
	p.onStdout([]byte(`{"type":"rate_limit_event","rate_limit_info":{"status":"rejected","resetsAt":1778572800}}`))
	p.onStdout([]byte(`{"type":"result","subtype":"success","is_error":false,"num_turns":3,"result":"done"}`))
	if res := p.finish(process.Result{}, false); res.Outcome != Succeeded {
		t.Errorf("a rejected event, then success: %s (%s), want success", res.Outcome, res.Detail)
	}
	// Credits: overage disabled for lack of credit.
	res = claudeLimitRun(t, `{"status":"rejected","resetsAt":1778572800,"rateLimitType":"five_hour","overageDisabledReason":"out_of_credits"}`, "You're out of usage credits.")
	if res.Outcome != Limited || res.Limit.Kind != LimitCredits {
		t.Errorf("out of credits: %s %+v", res.Outcome, res.Limit)
	}
	if strings.Contains(res.Detail, "\n") {
		t.Errorf("detail spans lines: %q", res.Detail)
	}
}

// TestCodexRealOfflineStopped: the recorded offline codex never gives up
// ("Reconnecting... waiting for network"); when aq stops it (its wall
// budget), the run is Stopped, not the error codex was retrying from.
func TestCodexRealOfflineStopped(t *testing.T) {
	p := newCodexParser("", nil, nil, nil)
	feed(t, "codex/real_offline_unauthenticated.jsonl", p.onStdout)
	res := p.finish(process.Result{ExitCode: -1, Stopped: true, StopCause: wallSpent{}}, false)
	if res.Outcome != Stopped {
		t.Errorf("Outcome = %s (%s), want stopped", res.Outcome, res.Detail)
	}
}

type wallSpent struct{}

func (wallSpent) Error() string { return "wall budget 45m0s spent" }
