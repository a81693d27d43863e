package fakellm

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata/")

func golden(t *testing.T, name string, got []byte) {
	t.Helper()
	path := filepath.Join("testdata", name)
	if *update {
		if err := os.WriteFile(path, got, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run go test -update to write it)", err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("%s differs from the golden file:\n got:\n%s\nwant:\n%s", name, got, want)
	}
}

func start(t *testing.T, s Script) *Server {
	t.Helper()
	srv, err := Start(s)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = srv.Close() })
	return srv
}

// messagesBody is a Messages request as claude sends one: tools offered,
// streaming or not.
func messagesBody(stream bool, tools bool) string {
	b := map[string]any{
		"model": "claude-sonnet-4-5", "max_tokens": 32000, "stream": stream,
		"system":   []map[string]any{{"type": "text", "text": "You are Claude Code"}},
		"messages": []map[string]any{{"role": "user", "content": "fix the bug"}},
	}
	if tools {
		b["tools"] = []map[string]any{{"name": "Read"}, {"name": "Edit"}}
	}
	out, _ := json.Marshal(b)
	return string(out)
}

func post(t *testing.T, srv *Server, path, body string) *http.Response {
	t.Helper()
	req, err := http.NewRequest("POST", srv.URL+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("x-api-key", "sk-marker")
	req.Header.Set("anthropic-version", "2023-06-01")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { resp.Body.Close() })
	return resp
}

// sse reads a stream of server-sent events into (event, data) pairs,
// failing on anything the format does not allow, and says whether the
// stream ended cleanly.
func sse(t *testing.T, r io.Reader) (evs [][2]string, err error) {
	t.Helper()
	sc := bufio.NewScanner(r)
	var name, data string
	for sc.Scan() {
		line := sc.Text()
		switch {
		case line == "":
			if name == "" || data == "" {
				t.Fatalf("an event without a name or data: %q %q", name, data)
			}
			evs = append(evs, [2]string{name, data})
			name, data = "", ""
		case strings.HasPrefix(line, "event: "):
			name = strings.TrimPrefix(line, "event: ")
		case strings.HasPrefix(line, "data: "):
			data = strings.TrimPrefix(line, "data: ")
			if !json.Valid([]byte(data)) {
				t.Fatalf("event %s: data is not JSON: %s", name, data)
			}
		default:
			t.Fatalf("not a server-sent event line: %q", line)
		}
	}
	return evs, sc.Err()
}

// assemble builds the message a stream carries the way the SDKs do:
// message_start's message, each block from its start and deltas (tool input
// from the concatenated input_json_delta), message_delta's stop reason and
// usage.
func assemble(t *testing.T, evs [][2]string) AnthropicAnswer {
	t.Helper()
	var m AnthropicAnswer
	partial := map[int]string{}
	for _, ev := range evs {
		var e struct {
			Type         string          `json:"type"`
			Message      AnthropicAnswer `json:"message"`
			Index        int             `json:"index"`
			ContentBlock AnthropicBlock  `json:"content_block"`
			Delta        struct {
				Type        string  `json:"type"`
				Text        string  `json:"text"`
				PartialJSON string  `json:"partial_json"`
				StopReason  *string `json:"stop_reason"`
			} `json:"delta"`
			Usage *AnthropicUsage `json:"usage"`
		}
		if err := json.Unmarshal([]byte(ev[1]), &e); err != nil {
			t.Fatal(err)
		}
		if e.Type != ev[0] {
			t.Fatalf("event %s carries type %s", ev[0], e.Type)
		}
		switch e.Type {
		case "message_start":
			m = e.Message
		case "content_block_start":
			if e.Index != len(m.Content) {
				t.Fatalf("block %d starts at %d", e.Index, len(m.Content))
			}
			b := e.ContentBlock
			if b.Type == "tool_use" {
				b.Input = nil
			}
			m.Content = append(m.Content, b)
		case "content_block_delta":
			switch e.Delta.Type {
			case "text_delta":
				m.Content[e.Index].Text += e.Delta.Text
			case "input_json_delta":
				partial[e.Index] += e.Delta.PartialJSON
			default:
				t.Fatalf("delta type %q", e.Delta.Type)
			}
		case "content_block_stop":
			if p, ok := partial[e.Index]; ok {
				m.Content[e.Index].Input = json.RawMessage(p)
			}
		case "message_delta":
			m.StopReason = *e.Delta.StopReason
			m.Usage = *e.Usage
		}
	}
	return m
}

var editTurn = Turn{
	Text:  "I'll read the file, then fix it — ünïcode.",
	Tools: []ToolCall{{Name: "Read", Input: map[string]string{"file_path": "/repo/a.go"}}, {Name: "Bash", Input: map[string]any{"command": "go test ./...", "timeout": 60000}}},
	Usage: Usage{Input: 120, Output: 45, CacheWrite: 1000, CacheRead: 2000},
}

func TestAnthropicStreamGolden(t *testing.T) {
	srv := &Server{ids: map[string]int{}}
	for _, tc := range []struct {
		name string
		turn Turn
	}{
		{"anthropic-tools.sse", editTurn},
		{"anthropic-text.sse", Turn{Text: "Done.", Usage: Usage{Input: 10, Output: 3}}},
		{"anthropic-empty.sse", Turn{StopReason: "max_tokens"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			golden(t, tc.name, AnthropicStream(srv.anthropicMessage(tc.turn, "claude-sonnet-4-5")))
		})
	}
}

func TestAnthropicStreamAddsUpToTheMessage(t *testing.T) {
	srv := start(t, Script{Turns: []Turn{editTurn, editTurn}})
	resp := post(t, srv, "/v1/messages?beta=true", messagesBody(true, true))
	if ct := resp.Header.Get("Content-Type"); !strings.HasPrefix(ct, "text/event-stream") {
		t.Fatalf("Content-Type %q", ct)
	}
	evs, err := sse(t, resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range evs {
		names = append(names, e[0])
	}
	wantNames := "message_start ping content_block_start content_block_delta content_block_delta content_block_stop content_block_start content_block_delta content_block_delta content_block_stop content_block_start content_block_delta content_block_delta content_block_stop message_delta message_stop"
	if got := strings.Join(names, " "); got != wantNames {
		t.Fatalf("events:\n got %s\nwant %s", got, wantNames)
	}
	streamed := assemble(t, evs)

	whole := post(t, srv, "/v1/messages", messagesBody(false, true))
	var m AnthropicAnswer
	if err := json.NewDecoder(whole.Body).Decode(&m); err != nil {
		t.Fatal(err)
	}
	// The two answers differ in their ids only.
	streamed.ID, m.ID = "", ""
	for i := range m.Content {
		streamed.Content[i].ID, m.Content[i].ID = "", ""
	}
	sb, _ := json.Marshal(streamed)
	mb, _ := json.Marshal(m)
	if !bytes.Equal(sb, mb) {
		t.Errorf("the stream adds up to\n%s\nthe JSON answer is\n%s", sb, mb)
	}
	if m.Usage != (AnthropicUsage{InputTokens: 120, OutputTokens: 45, CacheCreationInputTokens: 1000, CacheReadInputTokens: 2000}) {
		t.Errorf("usage %+v", m.Usage)
	}
	if m.StopReason != "tool_use" || m.Content[1].Name != "Read" || string(m.Content[1].Input) != `{"file_path":"/repo/a.go"}` {
		t.Errorf("message %s", mb)
	}
	if srv.Played() != 2 {
		t.Errorf("played %d turns, want 2", srv.Played())
	}
}

func TestAnthropicFaults(t *testing.T) {
	for _, tc := range []struct {
		name       string
		fault      Fault
		status     int
		errType    string
		header     string // name: value the answer must carry
		bodyPrefix string
	}{
		{"401", Fault{Status: 401}, 401, "authentication_error", "", ""},
		{"403", Fault{Status: 403}, 403, "permission_error", "", ""},
		{"429 retry-after", Fault{Status: 429, RetryAfter: "17"}, 429, "rate_limit_error", "Retry-After: 17", ""},
		{"529", Fault{Status: 529}, 529, "overloaded_error", "", ""},
		{"500", Fault{Status: 500}, 500, "api_error", "", ""},
		{"own type", Fault{Status: 400, Type: "invalid_request_error", Message: "prompt is too long"}, 400, "invalid_request_error", "", ""},
		{"html", Fault{HTML: true, Status: 502}, 502, "", "Content-Type: text/html; charset=utf-8", "<!DOCTYPE html>"},
		{"html 200", Fault{HTML: true}, 200, "", "Content-Type: text/html; charset=utf-8", "<!DOCTYPE html>"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := tc.fault
			f.Times = 2
			srv := start(t, Script{Turns: []Turn{{Text: "after the fault", Fault: &f}}})
			for i := range 2 {
				resp := post(t, srv, "/v1/messages", messagesBody(false, true))
				body, _ := io.ReadAll(resp.Body)
				if resp.StatusCode != tc.status {
					t.Fatalf("request %d: status %d, want %d: %s", i, resp.StatusCode, tc.status, body)
				}
				if tc.header != "" {
					k, v, _ := strings.Cut(tc.header, ": ")
					if got := resp.Header.Get(k); got != v {
						t.Errorf("%s: %q, want %q", k, got, v)
					}
				}
				if tc.errType != "" {
					var e struct {
						Type  string `json:"type"`
						Error struct{ Type, Message string }
					}
					if err := json.Unmarshal(body, &e); err != nil || e.Type != "error" || e.Error.Type != tc.errType || e.Error.Message == "" {
						t.Errorf("body %s (%v), want an error of type %s", body, err, tc.errType)
					}
					if resp.Header.Get("request-id") == "" {
						t.Error("no request-id header")
					}
				}
				if !strings.HasPrefix(string(body), tc.bodyPrefix) {
					t.Errorf("body %q", body)
				}
			}
			// The third request gets the turn: the fault did not move the
			// script on.
			resp := post(t, srv, "/v1/messages", messagesBody(false, true))
			var m AnthropicAnswer
			if err := json.NewDecoder(resp.Body).Decode(&m); err != nil || resp.StatusCode != 200 || len(m.Content) != 1 || m.Content[0].Text != "after the fault" {
				t.Fatalf("after the fault: %d %+v %v", resp.StatusCode, m, err)
			}
			var answers []string
			for _, r := range srv.Requests() {
				answers = append(answers, r.Answer)
			}
			if answers[2] != "turn" || answers[0] == "turn" || answers[0] != answers[1] {
				t.Errorf("recorded answers %q", answers)
			}
		})
	}
}

func TestAnthropicStreamCut(t *testing.T) {
	srv := start(t, Script{Turns: []Turn{{Text: "a long answer cut short", Usage: Usage{Input: 5, Output: 5}, Fault: &Fault{CutAfter: 3, Times: 1}}}})
	resp := post(t, srv, "/v1/messages", messagesBody(true, true))
	evs, err := sse(t, resp.Body)
	if err == nil || !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Errorf("reading a cut stream: %v, want an unexpected EOF", err)
	}
	if len(evs) != 3 || evs[2][0] != "content_block_start" {
		t.Errorf("the cut stream carried %d events: %v", len(evs), evs)
	}
	// The retry gets the whole turn.
	evs, err = sse(t, post(t, srv, "/v1/messages", messagesBody(true, true)).Body)
	if err != nil || evs[len(evs)-1][0] != "message_stop" {
		t.Fatalf("the retry: %v, %v", err, evs)
	}
	if m := assemble(t, evs); m.Content[0].Text != "a long answer cut short" {
		t.Errorf("the retry's answer %+v", m)
	}
	// A non-streaming request gets half its body.
	srv2 := start(t, Script{Turns: []Turn{{Text: "cut", Fault: &Fault{CutAfter: 1}}}})
	resp = post(t, srv2, "/v1/messages", messagesBody(false, true))
	if b, err := io.ReadAll(resp.Body); !errors.Is(err, io.ErrUnexpectedEOF) || json.Valid(b) {
		t.Errorf("a cut JSON answer: %q, %v", b, err)
	}
	if got := srv.Requests()[0].Answer; got != "cut after 3 events" {
		t.Errorf("recorded %q", got)
	}
}

func TestAnthropicSlowFirstByte(t *testing.T) {
	// A delay the client gives up on: the request is recorded as gone and
	// the turn is not spent.
	srv := start(t, Script{Turns: []Turn{{Text: "slow", Fault: &Fault{Delay: time.Hour}}}})
	ctx, cancel := context.WithCancel(context.Background())
	req, _ := http.NewRequestWithContext(ctx, "POST", srv.URL+"/v1/messages", strings.NewReader(messagesBody(true, true)))
	errc := make(chan error, 1)
	go func() {
		resp, err := http.DefaultClient.Do(req)
		if err == nil {
			resp.Body.Close()
		}
		errc <- err
	}()
	deadline := time.Now().Add(time.Minute)
	for srv.Pending() == 0 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond) // until the handler holds the turn
	}
	cancel()
	if err := <-errc; !errors.Is(err, context.Canceled) {
		t.Fatalf("the client got %v before the first byte, want its own cancellation", err)
	}
	waitAnswer(t, srv, 1, "gone")
	if srv.Played() != 0 {
		t.Errorf("the turn nobody received counts as played (%d)", srv.Played())
	}
}

func waitAnswer(t *testing.T, srv *Server, n int, want string) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for time.Now().Before(deadline) {
		if rs := srv.Requests(); len(rs) >= n {
			if rs[n-1].Answer != want {
				t.Fatalf("request %d answered %q, want %q", n, rs[n-1].Answer, want)
			}
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatalf("request %d was not recorded", n)
}

func TestScriptSideQueriesAndAfter(t *testing.T) {
	srv := start(t, Script{
		Turns: []Turn{{Text: "one"}},
		After: &Turn{Text: "all done"},
	})
	texts := func(body string) string {
		var m AnthropicAnswer
		if err := json.NewDecoder(post(t, srv, "/v1/messages", body).Body).Decode(&m); err != nil {
			t.Fatal(err)
		}
		return m.Content[0].Text
	}
	// A request without tools (a title, a summary) is a side query: it does
	// not take the turn.
	if got := texts(messagesBody(false, false)); got != "OK" {
		t.Errorf("side query answered %q", got)
	}
	if got := texts(messagesBody(false, true)); got != "one" {
		t.Errorf("turn 0 answered %q", got)
	}
	for range 2 {
		if got := texts(messagesBody(false, true)); got != "all done" {
			t.Errorf("after the turns: %q", got)
		}
	}
	var turns []int
	for _, r := range srv.Requests() {
		turns = append(turns, r.Turn)
	}
	if !reflect.DeepEqual(turns, []int{-1, 0, -1, -1}) {
		t.Errorf("turns %v", turns)
	}
}

func TestRecorderAndOtherEndpoints(t *testing.T) {
	srv := start(t, Script{})
	resp := post(t, srv, "/v1/messages/count_tokens", messagesBody(false, true))
	var ct struct {
		InputTokens int `json:"input_tokens"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&ct); err != nil || ct.InputTokens <= 0 {
		t.Errorf("count_tokens: %v %+v", err, ct)
	}
	resp = post(t, srv, "/v1/unknown", "{}")
	if resp.StatusCode != 404 {
		t.Errorf("an unknown path answered %d", resp.StatusCode)
	}
	resp = post(t, srv, "/v1/messages", "<not json>")
	if resp.StatusCode != 400 {
		t.Errorf("a body that is not JSON answered %d", resp.StatusCode)
	}
	rs := srv.Requests()
	if len(rs) != 3 || rs[0].Seq != 1 || rs[2].Seq != 3 || rs[1].Path != "/v1/unknown" || rs[1].Answer != "404" {
		t.Fatalf("recorded %+v", rs)
	}
	for _, r := range rs {
		if !r.Contains("sk-marker") {
			t.Errorf("request %d: the x-api-key header is not found by Contains", r.Seq)
		}
		if r.Contains("") || r.Contains("no-such-marker") {
			t.Errorf("request %d: Contains finds what is not there", r.Seq)
		}
	}
	if !rs[0].Contains("fix the bug") {
		t.Error("Contains does not look in the body")
	}
	a, err := rs[0].Anthropic()
	if err != nil || a.Model != "claude-sonnet-4-5" || a.Messages[0].Content.Text() != "fix the bug" || a.System.Text() != "You are Claude Code" {
		t.Errorf("parsed %+v, %v", a, err)
	}
}

func TestCloseEndsHeldConnections(t *testing.T) {
	srv, err := Start(Script{Turns: []Turn{{Fault: &Fault{Delay: time.Hour}}}})
	if err != nil {
		t.Fatal(err)
	}
	errc := make(chan error, 1)
	go func() {
		resp, err := http.Post(srv.URL+"/v1/messages", "application/json", strings.NewReader(messagesBody(true, true)))
		if err == nil {
			resp.Body.Close()
		}
		errc <- err
	}()
	for srv.Pending() == 0 {
		time.Sleep(10 * time.Millisecond)
	}
	if err := srv.Close(); err != nil {
		t.Fatal(err)
	}
	if err := <-errc; err == nil {
		t.Error("the held request was answered after Close")
	}
}

func TestDelayOnlyOnce(t *testing.T) {
	// A delay with Times 1 holds back the first request's answer only: the
	// retry of a client that gave up is answered at once.
	srv := start(t, Script{Turns: []Turn{{Text: "late", Fault: &Fault{Delay: time.Hour, Times: 1}}}})
	ctx, cancel := context.WithCancel(context.Background())
	req, _ := http.NewRequestWithContext(ctx, "POST", srv.URL+"/v1/messages", strings.NewReader(messagesBody(false, true)))
	go func() {
		for srv.Pending() == 0 {
			time.Sleep(10 * time.Millisecond)
		}
		cancel()
	}()
	if resp, err := http.DefaultClient.Do(req); err == nil {
		resp.Body.Close()
		t.Fatal("the delayed request was answered")
	}
	var m AnthropicAnswer
	if err := json.NewDecoder(post(t, srv, "/v1/messages", messagesBody(false, true)).Body).Decode(&m); err != nil || m.Content[0].Text != "late" {
		t.Fatalf("the retry: %+v %v", m, err)
	}
	if srv.Played() != 1 {
		t.Errorf("played %d", srv.Played())
	}
}
