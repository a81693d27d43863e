package fakellm

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

var responsesUpdate = flag.Bool("update-responses", false, "rewrite testdata/responses/*.sse")

// responsesRecorded is the first request codex 0.171.0 sent (recorded).
func responsesRecorded(t *testing.T, name string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", "responses", "codex-0.171.0-"+name+".json"))
	if err != nil {
		t.Fatal(err)
	}
	var rec struct {
		Body json.RawMessage `json:"body"`
	}
	if err := json.Unmarshal(b, &rec); err != nil {
		t.Fatal(err)
	}
	return rec.Body
}

func TestResponsesEventsGolden(t *testing.T) {
	tools := ResponsesTools(responsesRecorded(t, "exec-first"))
	cases := []struct {
		name string
		turn ResponsesTurn
	}{
		{"text", ResponsesTurn{Text: "Done: the file is there.", Usage: ResponsesUsage{Input: 1200, Cached: 200, Output: 40, Reasoning: 8}}},
		{"shell_call", ResponsesTurn{Reasoning: "Run it.", Calls: []ResponsesCall{{Shell: "echo hi > f.txt"}}, Usage: ResponsesUsage{Input: 1000, Output: 20}}},
		{"apply_patch_call", ResponsesTurn{Calls: []ResponsesCall{{Patch: "*** Begin Patch\n*** Add File: a.txt\n+a\n*** End Patch"}}, Usage: ResponsesUsage{Input: 900, Cached: 100, Output: 30}}},
		{"failed", ResponsesTurn{Text: "partial", Fail: &ResponsesFail{Failed: true, Code: "server_error", Message: "The model failed."}}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got := bytes.Join(ResponsesEvents(c.turn, tools, "gpt-5.5", 1), nil)
			path := filepath.Join("testdata", "responses", c.name+".sse")
			if *responsesUpdate {
				if err := os.WriteFile(path, got, 0o644); err != nil {
					t.Fatal(err)
				}
			}
			want, err := os.ReadFile(path)
			if err != nil {
				t.Fatalf("%v (go test -run Golden -update-responses writes it)", err)
			}
			if !bytes.Equal(got, want) {
				t.Errorf("%s differs from the golden file:\n%s", c.name, got)
			}
			evs, err := ResponsesParseSSE(bytes.NewReader(got))
			if err != nil {
				t.Fatal(err)
			}
			last := evs[len(evs)-1][0]
			if want := "response.completed"; c.turn.Fail != nil {
				want = "response.failed"
				if last != want {
					t.Errorf("last event %q, want %q", last, want)
				}
			} else if last != want {
				t.Errorf("last event %q, want %q", last, want)
			}
			for _, ev := range evs {
				var d struct{ Type string }
				if err := json.Unmarshal([]byte(ev[1]), &d); err != nil || d.Type != ev[0] {
					t.Errorf("event %q: data type %q (%v)", ev[0], d.Type, err)
				}
			}
		})
	}
}

// TestResponsesCallFitsTheOfferedTools: a call is made with a tool the
// request offers, as codex's tool names depend on the model.
func TestResponsesCallFitsTheOfferedTools(t *testing.T) {
	recorded := ResponsesTools(responsesRecorded(t, "exec-first"))
	cases := []struct {
		name  string
		tools []ResponsesTool
		call  ResponsesCall
		want  string // type name args-or-input
	}{
		{"recorded, a command", recorded, ResponsesCall{Shell: "ls"}, `function_call exec_command {"cmd":"ls"}`},
		{"recorded, a patch", recorded, ResponsesCall{Patch: "P"}, `custom_tool_call apply_patch P`},
		{"shell_command", []ResponsesTool{{"shell_command", "function"}}, ResponsesCall{Shell: "ls"}, `function_call shell_command {"command":"ls"}`},
		{"shell only", []ResponsesTool{{"shell", "function"}}, ResponsesCall{Shell: "ls"}, `function_call shell {"command":["bash","-lc","ls"]}`},
		{"apply_patch as a function", []ResponsesTool{{"apply_patch", "function"}}, ResponsesCall{Patch: "P"}, `function_call apply_patch {"input":"P"}`},
		{"no apply_patch: through the shell", []ResponsesTool{{"exec_command", "function"}}, ResponsesCall{Patch: "P"}, `function_call exec_command {"cmd":"apply_patch \u003c\u003c'PATCH'\nP\nPATCH"}`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			it := responsesCallItem(c.call, c.tools, "id", "call")
			got := it["type"].(string) + " " + it["name"].(string) + " "
			if s, ok := it["arguments"].(string); ok {
				got += s
			} else {
				got += it["input"].(string)
			}
			if got != c.want {
				t.Errorf("got  %s\nwant %s", got, c.want)
			}
		})
	}
}

func responsesPost(t *testing.T, s *ResponsesServer, body []byte) (*http.Response, []byte, error) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, s.URL()+"/responses", bytes.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer sk-fake")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp, b, err
}

func TestResponsesServerAnswers(t *testing.T) {
	body := responsesRecorded(t, "exec-first")
	html := "<html><body>502 Bad Gateway</body></html>"
	cases := []struct {
		name       string
		turn       ResponsesTurn
		status     int
		retryAfter string
		wantBody   string // a substring
		cut        bool
		lastEvent  string
	}{
		{name: "stream", turn: ResponsesTurn{Text: "hello", Usage: ResponsesUsage{Input: 10, Output: 2}}, status: 200, lastEvent: "response.completed", wantBody: `"input_tokens":10`},
		{name: "401", turn: ResponsesTurn{Fail: &ResponsesFail{Status: 401, Message: "Incorrect API key provided", Code: "invalid_api_key"}}, status: 401, wantBody: `"code":"invalid_api_key"`},
		{name: "403", turn: ResponsesTurn{Fail: &ResponsesFail{Status: 403}}, status: 403, wantBody: "permission_error"},
		{name: "429", turn: ResponsesTurn{Fail: &ResponsesFail{Status: 429, RetryAfter: 30, Code: "rate_limit_exceeded"}}, status: 429, retryAfter: "30", wantBody: "rate_limit_exceeded"},
		{name: "500", turn: ResponsesTurn{Fail: &ResponsesFail{Status: 500}}, status: 500, wantBody: "server_error"},
		{name: "503", turn: ResponsesTurn{Fail: &ResponsesFail{Status: 503}}, status: 503, wantBody: "Service Unavailable"},
		{name: "html", turn: ResponsesTurn{Fail: &ResponsesFail{Status: 502, Body: html}}, status: 502, wantBody: html},
		{name: "html with 200", turn: ResponsesTurn{Fail: &ResponsesFail{Body: html}}, status: 200, wantBody: html},
		{name: "cut", turn: ResponsesTurn{Text: "a long answer that is cut", Fail: &ResponsesFail{CutAfter: 3}}, status: 200, cut: true},
		{name: "failed", turn: ResponsesTurn{Fail: &ResponsesFail{Failed: true, Message: "boom"}}, status: 200, lastEvent: "response.failed", wantBody: "boom"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			s, err := StartResponses(ResponsesScript{Turns: []ResponsesTurn{c.turn}})
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			resp, got, err := responsesPost(t, s, body)
			if c.cut {
				if err == nil {
					t.Fatalf("a cut stream read to a clean end: %s", got)
				}
				if bytes.Contains(got, []byte("response.completed")) {
					t.Errorf("a cut stream has response.completed")
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if resp.StatusCode != c.status {
				t.Errorf("status %d, want %d", resp.StatusCode, c.status)
			}
			if got := resp.Header.Get("Retry-After"); got != c.retryAfter {
				t.Errorf("retry-after %q, want %q", got, c.retryAfter)
			}
			if !strings.Contains(string(got), c.wantBody) {
				t.Errorf("body %s\nwant it to contain %s", got, c.wantBody)
			}
			if c.lastEvent != "" {
				evs, err := ResponsesParseSSE(bytes.NewReader(got))
				if err != nil || len(evs) == 0 || evs[len(evs)-1][0] != c.lastEvent {
					t.Errorf("events %v (%v), want the last %s", evs, err, c.lastEvent)
				}
			}
			if n := len(s.Posts()); n != 1 {
				t.Errorf("%d posts recorded, want 1", n)
			}
		})
	}
}

func TestResponsesServerScript(t *testing.T) {
	s, err := StartResponses(ResponsesScript{Turns: []ResponsesTurn{
		{Fail: &ResponsesFail{Status: 500}, Times: 2},
		{Text: "ok"},
	}})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	var got []int
	for range 4 {
		resp, _, err := responsesPost(t, s, []byte(`{"model":"gpt-5.5","input":[]}`))
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, resp.StatusCode)
	}
	if want := []int{500, 500, 200, 500}; !equalInts(got, want) {
		t.Errorf("statuses %v, want %v (the fourth: script exhausted)", got, want)
	}
	var turns []int
	for _, r := range s.Posts() {
		turns = append(turns, r.Turn)
	}
	if want := []int{0, 0, 1, -1}; !equalInts(turns, want) {
		t.Errorf("turns %v, want %v", turns, want)
	}
	if h := s.Posts()[0].Header.Get("Authorization"); h != "Bearer sk-fake" {
		t.Errorf("recorded authorization %q", h)
	}
}

func equalInts(a, b []int) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// TestResponsesWebSocketIsRefusedAtOnce: codex's upgrade attempt on GET
// /v1/responses gets 426 (one attempt, then it falls back to HTTP) or,
// scripted, 404 (it retries five times first).
func TestResponsesWebSocketIsRefusedAtOnce(t *testing.T) {
	for _, c := range []struct {
		ws   string
		want int
	}{{ResponsesWSRefuse, http.StatusUpgradeRequired}, {ResponsesWSNotFound, http.StatusNotFound}} {
		s, err := StartResponses(ResponsesScript{WebSocket: c.ws})
		if err != nil {
			t.Fatal(err)
		}
		req, _ := http.NewRequest(http.MethodGet, s.URL()+"/responses", nil)
		req.Header.Set("Connection", "Upgrade")
		req.Header.Set("Upgrade", "websocket")
		req.Header.Set("Sec-WebSocket-Version", "13")
		req.Header.Set("Sec-WebSocket-Key", "2gVAOg7+mX0cIaqlW16GYQ==")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != c.want {
			t.Errorf("WebSocket %q: status %d, want %d", c.ws, resp.StatusCode, c.want)
		}
		if n := len(s.Requests()); n != 1 || len(s.Posts()) != 0 {
			t.Errorf("recorded %d requests, %d posts; want 1, 0", n, len(s.Posts()))
		}
		s.Close()
	}
}

// TestResponsesHoldEndsWithTheClient: a held answer (a slow first byte)
// lets go when the client gives up, and Close does not wait for it.
func TestResponsesHoldEndsWithTheClient(t *testing.T) {
	hold := make(chan struct{})
	s, err := StartResponses(ResponsesScript{Turns: []ResponsesTurn{{Hold: hold, Text: "late"}}})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ctx, cancel := context.WithCancel(context.Background())
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, s.URL()+"/responses", strings.NewReader(`{}`))
	errc := make(chan error, 1)
	go func() {
		resp, err := http.DefaultClient.Do(req)
		if err == nil {
			resp.Body.Close()
		}
		errc <- err
	}()
	for len(s.Posts()) == 0 {
		time.Sleep(5 * time.Millisecond)
	}
	select {
	case err := <-errc:
		t.Fatalf("a held answer came back: %v", err)
	default:
	}
	cancel()
	if err := <-errc; !errors.Is(err, context.Canceled) {
		t.Errorf("err %v, want context.Canceled", err)
	}
}

func TestResponsesInputReadsTheRecordedRequest(t *testing.T) {
	_, items, err := ResponsesInput(responsesRecorded(t, "resume"))
	if err != nil {
		t.Fatal(err)
	}
	var kinds []string
	for _, it := range items {
		k := it.Type
		if it.Role != "" {
			k += "/" + it.Role
		}
		kinds = append(kinds, k)
	}
	got := strings.Join(kinds, " ")
	want := "message/developer message/developer message/user message/user function_call function_call_output message/assistant message/user"
	if got != want {
		t.Errorf("input items\n got %s\nwant %s", got, want)
	}
	if last := items[len(items)-1].Text; last != "Verify failed: fix it\n" {
		t.Errorf("the last input %q", last)
	}
}
