package fakellm

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"
)

// The OpenAI Responses API as codex (0.171.0) calls it: POST /v1/responses
// with "stream": true, answered with server-sent events
//
//	response.created → (response.output_item.added → response.output_text.delta… →
//	response.output_item.done)… → response.completed{usage}
//
// as documented at platform.openai.com/docs/api-reference/responses-streaming.
// What codex sends beyond that documentation is recorded in
// testdata/responses/ (README.md there): the WebSocket upgrade it tries
// first on GET /v1/responses, GET /v1/models, and its tools.

// ResponsesScript is a scripted conversation: each POST /v1/responses
// takes the next turn. A turn with Times > 1 answers that many requests
// (an error a client retries). After the last turn the server answers 500
// with "script exhausted", so a client asking more than the test expected
// fails loudly rather than hanging.
type ResponsesScript struct {
	Turns []ResponsesTurn
	// WebSocket is how GET /v1/responses with Upgrade: websocket is
	// answered: "" (ResponsesWSRefuse) refuses it at once with 426 Upgrade
	// Required, the documented answer of a server that speaks plain HTTP
	// only; ResponsesWSNotFound answers 404.
	WebSocket string
}

// What ResponsesScript.WebSocket can say.
const (
	ResponsesWSRefuse   = ""
	ResponsesWSNotFound = "404"
)

// ResponsesTurn is one answer. An answer with Fail set is an error;
// otherwise it is output items: Calls (tool calls the client is to run,
// answered in its next request's input) and then Text (an assistant
// message), and usage.
type ResponsesTurn struct {
	Calls []ResponsesCall
	Text  string
	Usage ResponsesUsage
	// Reasoning, when set, is streamed as a reasoning item's summary.
	Reasoning string
	Fail      *ResponsesFail
	// Times is how many requests this turn answers (0 means 1).
	Times int
	// Hold, when set, blocks the answer until it is closed or the
	// request's client goes away (a slow first byte, a run a budget stops).
	Hold <-chan struct{}
}

// ResponsesCall is a tool call. Shell is a command line for the client's
// shell tool; Patch an apply_patch patch ("*** Begin Patch" …). The
// call is made with whichever of the tools the request offers fits: a
// patch as the custom (freeform) tool apply_patch, or the function
// apply_patch, else through the shell tool; a command through
// shell_command ({"command": "…"}), exec_command ({"cmd": "…"}) or shell
// ({"command": ["bash","-lc","…"]}).
type ResponsesCall struct {
	Shell string
	Patch string
}

// ResponsesUsage is response.completed's usage.
type ResponsesUsage struct {
	Input, Cached, Output, Reasoning int64
}

// ResponsesFail is an error answer.
type ResponsesFail struct {
	// Status is the HTTP status (401, 403, 429, 500, 503 …); 0 means the
	// stream starts (200) and fails later as below.
	Status int
	// RetryAfter, when set, is the retry-after header (seconds).
	RetryAfter int
	// Message is the error body's message; a default names the status.
	Message string
	// Code is the error body's code (e.g. "rate_limit_exceeded").
	Code string
	// Body, when set, is sent as is instead of a JSON error (garbage, an
	// HTML page) with ContentType (default text/html).
	Body, ContentType string
	// CutAfter, with Status 0, ends the stream after this many events of
	// a normal answer without response.completed (a stream cut mid-way).
	CutAfter int
	// Failed, with Status 0, ends the stream with response.failed carrying
	// Message and Code.
	Failed bool
}

// ResponsesRequest is one request the server saw.
type ResponsesRequest struct {
	Method, Path, Query string
	Header              http.Header
	Body                []byte
	// Turn is the index of the script turn that answered it (-1: none).
	Turn int
	At   time.Time
}

// JSON decodes the body (a POST /v1/responses) into a map; nil when it is
// not JSON.
func (r ResponsesRequest) JSON() map[string]any {
	var m map[string]any
	if json.Unmarshal(r.Body, &m) != nil {
		return nil
	}
	return m
}

// ResponsesServer is the fake: an HTTP server on 127.0.0.1.
type ResponsesServer struct {
	ln     net.Listener
	srv    *http.Server
	script ResponsesScript

	mu       sync.Mutex
	requests []ResponsesRequest
	turn     int // next turn
	used     int // requests the current turn has answered
	seq      int // ids
	wg       sync.WaitGroup
	done     chan struct{}
}

// StartResponses starts the fake on a new listener on 127.0.0.1.
func StartResponses(script ResponsesScript) (*ResponsesServer, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	return ServeResponses(ln, script), nil
}

// ServeResponses serves the fake on ln (a listener the caller opened, e.g.
// inside a network namespace of its own); Close closes ln.
func ServeResponses(ln net.Listener, script ResponsesScript) *ResponsesServer {
	s := &ResponsesServer{ln: ln, script: script, done: make(chan struct{})}
	s.srv = &http.Server{Handler: s, ReadHeaderTimeout: time.Minute}
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		_ = s.srv.Serve(ln)
	}()
	return s
}

// URL is the base URL a client is given: http://127.0.0.1:PORT/v1 (what
// OPENAI_BASE_URL takes).
func (s *ResponsesServer) URL() string { return "http://" + s.ln.Addr().String() + "/v1" }

// Close stops the server, releasing any held answer.
func (s *ResponsesServer) Close() error {
	select {
	case <-s.done:
	default:
		close(s.done)
	}
	err := s.srv.Close()
	s.wg.Wait()
	return err
}

// Requests is every request so far, in arrival order.
func (s *ResponsesServer) Requests() []ResponsesRequest {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]ResponsesRequest(nil), s.requests...)
}

// Posts is the POST /v1/responses requests so far.
func (s *ResponsesServer) Posts() []ResponsesRequest {
	var out []ResponsesRequest
	for _, r := range s.Requests() {
		if r.Method == http.MethodPost && strings.HasSuffix(r.Path, "/responses") {
			out = append(out, r)
		}
	}
	return out
}

// ServeHTTP implements http.Handler.
func (s *ResponsesServer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(io.LimitReader(r.Body, 64<<20))
	rec := ResponsesRequest{Method: r.Method, Path: r.URL.Path, Query: r.URL.RawQuery, Header: r.Header.Clone(), Body: body, Turn: -1, At: time.Now()}
	switch {
	case r.Method == http.MethodPost && strings.HasSuffix(r.URL.Path, "/responses"):
		s.mu.Lock()
		turn, idx, ok := s.next()
		rec.Turn = idx
		s.requests = append(s.requests, rec)
		s.seq++
		seq := s.seq
		s.mu.Unlock()
		if !ok {
			responsesError(w, http.StatusInternalServerError, "fakellm: script exhausted (no turn left for this request)", "server_error", 0)
			return
		}
		s.answer(w, r, turn, seq, body)
		return
	}
	s.mu.Lock()
	s.requests = append(s.requests, rec)
	s.mu.Unlock()
	switch {
	case strings.HasSuffix(r.URL.Path, "/responses") && strings.EqualFold(r.Header.Get("Upgrade"), "websocket"):
		if s.script.WebSocket == ResponsesWSNotFound {
			http.NotFound(w, r)
			return
		}
		w.Header().Set("Connection", "close")
		responsesError(w, http.StatusUpgradeRequired, "fakellm: this server speaks HTTP only (no WebSocket)", "upgrade_required", 0)
	case r.Method == http.MethodGet && strings.HasSuffix(r.URL.Path, "/models"):
		// The documented list shape ({"object":"list","data":[…]}) with the
		// "models" array codex's model manager reads beside it.
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"object":"list","data":[],"models":[]}`)
	default:
		responsesError(w, http.StatusNotFound, "fakellm: no such endpoint "+r.Method+" "+r.URL.Path, "not_found", 0)
	}
}

// next takes the turn for one request; mu held.
func (s *ResponsesServer) next() (ResponsesTurn, int, bool) {
	if s.turn >= len(s.script.Turns) {
		return ResponsesTurn{}, -1, false
	}
	t, idx := s.script.Turns[s.turn], s.turn
	s.used++
	if s.used >= max(t.Times, 1) {
		s.turn, s.used = s.turn+1, 0
	}
	return t, idx, true
}

func responsesError(w http.ResponseWriter, status int, msg, code string, retryAfter int) {
	if retryAfter > 0 {
		w.Header().Set("Retry-After", strconv.Itoa(retryAfter))
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	b, _ := json.Marshal(map[string]any{"error": map[string]any{"message": msg, "type": responsesErrType(status), "param": nil, "code": code}})
	_, _ = w.Write(b)
}

func responsesErrType(status int) string {
	switch status {
	case 401:
		return "invalid_request_error"
	case 403:
		return "permission_error"
	case 429:
		return "rate_limit_error"
	default:
		return "server_error"
	}
}

func (s *ResponsesServer) answer(w http.ResponseWriter, r *http.Request, t ResponsesTurn, seq int, body []byte) {
	if t.Hold != nil {
		select {
		case <-t.Hold:
		case <-r.Context().Done():
			return
		case <-s.done:
			return
		}
	}
	if f := t.Fail; f != nil && f.Status != 0 {
		if f.Body != "" {
			ct := f.ContentType
			if ct == "" {
				ct = "text/html"
			}
			w.Header().Set("Content-Type", ct)
			w.WriteHeader(f.Status)
			_, _ = io.WriteString(w, f.Body)
			return
		}
		msg := f.Message
		if msg == "" {
			msg = fmt.Sprintf("fakellm: scripted %d %s", f.Status, http.StatusText(f.Status))
		}
		responsesError(w, f.Status, msg, f.Code, f.RetryAfter)
		return
	}
	if f := t.Fail; f != nil && f.Body != "" {
		// 200 with garbage where the event stream should be.
		ct := f.ContentType
		if ct == "" {
			ct = "text/html"
		}
		w.Header().Set("Content-Type", ct)
		_, _ = io.WriteString(w, f.Body)
		return
	}
	var req responsesReq
	_ = json.Unmarshal(body, &req)
	events := ResponsesEvents(t, req.offered(), req.Model, seq)
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-cache")
	w.Header().Set("X-Request-Id", fmt.Sprintf("req_fake_%d", seq))
	w.WriteHeader(http.StatusOK)
	fl, _ := w.(http.Flusher)
	for i, ev := range events {
		if t.Fail != nil && t.Fail.CutAfter > 0 && i >= t.Fail.CutAfter {
			// Cut: hijack and drop the connection so the client sees an
			// unexpected end of the stream, not a clean one.
			if hj, ok := w.(http.Hijacker); ok {
				if fl != nil {
					fl.Flush()
				}
				if c, _, err := hj.Hijack(); err == nil {
					_ = c.Close()
				}
			}
			return
		}
		_, _ = w.Write(ev)
		if fl != nil {
			fl.Flush()
		}
	}
}

// responsesReq is what the fake reads of a request.
type responsesReq struct {
	Model string            `json:"model"`
	Tools []json.RawMessage `json:"tools"`
}

// ResponsesTool is a tool a request offers: its name and type
// ("function", "custom", "local_shell", "web_search" …).
type ResponsesTool struct{ Name, Type string }

func (r responsesReq) offered() []ResponsesTool {
	var out []ResponsesTool
	for _, raw := range r.Tools {
		var t struct{ Type, Name string }
		if json.Unmarshal(raw, &t) == nil {
			out = append(out, ResponsesTool{Name: t.Name, Type: t.Type})
		}
	}
	return out
}

// ResponsesTools is the tools a recorded request offered.
func ResponsesTools(body []byte) []ResponsesTool {
	var req responsesReq
	_ = json.Unmarshal(body, &req)
	return req.offered()
}

// ResponsesEvents is the SSE stream of a turn answered to a request that
// offered tools with model (seq numbers the ids), each element one event
// ("event: …\ndata: …\n\n"). A turn whose Fail has Failed ends in
// response.failed; otherwise the last event is response.completed.
func ResponsesEvents(t ResponsesTurn, tools []ResponsesTool, model string, seq int) [][]byte {
	respID := fmt.Sprintf("resp_fake_%d", seq)
	var (
		out    [][]byte
		items  []any
		seqNum int
	)
	emit := func(typ string, fields map[string]any) {
		fields["type"] = typ
		fields["sequence_number"] = seqNum
		seqNum++
		b, _ := json.Marshal(fields)
		out = append(out, []byte("event: "+typ+"\ndata: "+string(b)+"\n\n"))
	}
	resp := func(status string, output []any, usage any) map[string]any {
		return map[string]any{"id": respID, "object": "response", "created_at": 1764403200, "status": status, "model": model, "output": output, "usage": usage}
	}
	emit("response.created", map[string]any{"response": resp("in_progress", []any{}, nil)})
	emit("response.in_progress", map[string]any{"response": resp("in_progress", []any{}, nil)})
	idx := 0
	if t.Reasoning != "" {
		id := fmt.Sprintf("rs_fake_%d_%d", seq, idx)
		emit("response.output_item.added", map[string]any{"output_index": idx, "item": map[string]any{"id": id, "type": "reasoning", "summary": []any{}}})
		emit("response.reasoning_summary_part.added", map[string]any{"item_id": id, "output_index": idx, "summary_index": 0, "part": map[string]any{"type": "summary_text", "text": ""}})
		emit("response.reasoning_summary_text.delta", map[string]any{"item_id": id, "output_index": idx, "summary_index": 0, "delta": t.Reasoning})
		item := map[string]any{"id": id, "type": "reasoning", "summary": []any{map[string]any{"type": "summary_text", "text": t.Reasoning}}}
		emit("response.output_item.done", map[string]any{"output_index": idx, "item": item})
		items = append(items, item)
		idx++
	}
	for i, c := range t.Calls {
		callID := fmt.Sprintf("call_fake_%d_%d", seq, i)
		id := fmt.Sprintf("fc_fake_%d_%d", seq, i)
		item := responsesCallItem(c, tools, id, callID)
		added := map[string]any{}
		for k, v := range item {
			added[k] = v
		}
		added["status"] = "in_progress"
		if item["type"] == "custom_tool_call" {
			added["input"] = ""
		} else {
			added["arguments"] = ""
		}
		emit("response.output_item.added", map[string]any{"output_index": idx, "item": added})
		if item["type"] == "custom_tool_call" {
			emit("response.custom_tool_call_input.delta", map[string]any{"item_id": id, "output_index": idx, "delta": item["input"]})
			emit("response.custom_tool_call_input.done", map[string]any{"item_id": id, "output_index": idx, "input": item["input"]})
		} else {
			emit("response.function_call_arguments.delta", map[string]any{"item_id": id, "output_index": idx, "delta": item["arguments"]})
			emit("response.function_call_arguments.done", map[string]any{"item_id": id, "output_index": idx, "arguments": item["arguments"]})
		}
		emit("response.output_item.done", map[string]any{"output_index": idx, "item": item})
		items = append(items, item)
		idx++
	}
	if t.Text != "" {
		id := fmt.Sprintf("msg_fake_%d", seq)
		emit("response.output_item.added", map[string]any{"output_index": idx, "item": map[string]any{"id": id, "type": "message", "status": "in_progress", "role": "assistant", "content": []any{}}})
		emit("response.content_part.added", map[string]any{"item_id": id, "output_index": idx, "content_index": 0, "part": map[string]any{"type": "output_text", "text": "", "annotations": []any{}}})
		for _, d := range responsesChunks(t.Text) {
			emit("response.output_text.delta", map[string]any{"item_id": id, "output_index": idx, "content_index": 0, "delta": d})
		}
		emit("response.output_text.done", map[string]any{"item_id": id, "output_index": idx, "content_index": 0, "text": t.Text})
		part := map[string]any{"type": "output_text", "text": t.Text, "annotations": []any{}}
		emit("response.content_part.done", map[string]any{"item_id": id, "output_index": idx, "content_index": 0, "part": part})
		item := map[string]any{"id": id, "type": "message", "status": "completed", "role": "assistant", "content": []any{part}}
		emit("response.output_item.done", map[string]any{"output_index": idx, "item": item})
		items = append(items, item)
	}
	if t.Fail != nil && t.Fail.Failed {
		r := resp("failed", items, nil)
		msg := t.Fail.Message
		if msg == "" {
			msg = "fakellm: scripted response.failed"
		}
		r["error"] = map[string]any{"code": orDefault(t.Fail.Code, "server_error"), "message": msg}
		emit("response.failed", map[string]any{"response": r})
		return out
	}
	u := t.Usage
	usage := map[string]any{
		"input_tokens":          u.Input,
		"input_tokens_details":  map[string]any{"cached_tokens": u.Cached},
		"output_tokens":         u.Output,
		"output_tokens_details": map[string]any{"reasoning_tokens": u.Reasoning},
		"total_tokens":          u.Input + u.Output,
	}
	emit("response.completed", map[string]any{"response": resp("completed", items, usage)})
	return out
}

func orDefault(s, def string) string {
	if s == "" {
		return def
	}
	return s
}

// responsesChunks splits text into a few deltas, as a real stream does.
func responsesChunks(text string) []string {
	const n = 16
	var out []string
	for len(text) > n {
		cut := n
		for cut < len(text) && !isBoundary(text, cut) {
			cut++
		}
		out = append(out, text[:cut])
		text = text[cut:]
	}
	if text != "" {
		out = append(out, text)
	}
	return out
}

func isBoundary(s string, i int) bool { return i >= len(s) || s[i]&0xC0 != 0x80 }

func offers(tools []ResponsesTool, name string) (ResponsesTool, bool) {
	for _, t := range tools {
		if t.Name == name {
			return t, true
		}
	}
	return ResponsesTool{}, false
}

// responsesCallItem is the output item of call c with the tools offered.
func responsesCallItem(c ResponsesCall, tools []ResponsesTool, id, callID string) map[string]any {
	if c.Patch != "" {
		if t, ok := offers(tools, "apply_patch"); ok {
			if t.Type == "custom" {
				return map[string]any{"id": id, "type": "custom_tool_call", "status": "completed", "call_id": callID, "name": "apply_patch", "input": c.Patch}
			}
			return responsesFunction(id, callID, "apply_patch", map[string]any{"input": c.Patch})
		}
		// No apply_patch tool: the patch through the shell, as codex's
		// shell accepts "apply_patch <<'EOF'" itself.
		c = ResponsesCall{Shell: "apply_patch <<'PATCH'\n" + c.Patch + "\nPATCH"}
	}
	if _, ok := offers(tools, "shell_command"); ok {
		return responsesFunction(id, callID, "shell_command", map[string]any{"command": c.Shell})
	}
	if _, ok := offers(tools, "exec_command"); ok {
		return responsesFunction(id, callID, "exec_command", map[string]any{"cmd": c.Shell})
	}
	return responsesFunction(id, callID, "shell", map[string]any{"command": []string{"bash", "-lc", c.Shell}})
}

func responsesFunction(id, callID, name string, args map[string]any) map[string]any {
	b, _ := json.Marshal(args)
	return map[string]any{"id": id, "type": "function_call", "status": "completed", "call_id": callID, "name": name, "arguments": string(b)}
}

// ResponsesInputItem is one item of a request's input.
type ResponsesInputItem struct {
	Type, Role, CallID, Name string
	// Text is a message's text (its content parts joined) or a tool
	// output's text.
	Text string
}

// ResponsesInput is a POST /v1/responses body's input items, in order,
// plus its instructions.
func ResponsesInput(body []byte) (instructions string, items []ResponsesInputItem, err error) {
	var req struct {
		Instructions string            `json:"instructions"`
		Input        []json.RawMessage `json:"input"`
	}
	if err := json.Unmarshal(body, &req); err != nil {
		return "", nil, err
	}
	for _, raw := range req.Input {
		var it struct {
			Type    string          `json:"type"`
			Role    string          `json:"role"`
			CallID  string          `json:"call_id"`
			Name    string          `json:"name"`
			Content json.RawMessage `json:"content"`
			Output  json.RawMessage `json:"output"`
		}
		if json.Unmarshal(raw, &it) != nil {
			continue
		}
		item := ResponsesInputItem{Type: it.Type, Role: it.Role, CallID: it.CallID, Name: it.Name}
		item.Text = responsesText(it.Content) + responsesText(it.Output)
		items = append(items, item)
	}
	return req.Instructions, items, nil
}

// responsesText is the text of a content or output field: a string, or
// parts with "text".
func responsesText(raw json.RawMessage) string {
	if len(raw) == 0 {
		return ""
	}
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s
	}
	var parts []struct {
		Text string `json:"text"`
	}
	if json.Unmarshal(raw, &parts) == nil {
		var b strings.Builder
		for _, p := range parts {
			b.WriteString(p.Text)
		}
		return b.String()
	}
	var o struct {
		Content string `json:"content"`
	}
	if json.Unmarshal(raw, &o) == nil {
		return o.Content
	}
	return string(raw)
}

// ResponsesParseSSE splits an SSE body into (event, data) pairs, for tests
// that read a stream back.
func ResponsesParseSSE(r io.Reader) ([][2]string, error) {
	var (
		out       [][2]string
		ev        string
		data      bytes.Buffer
		sc        = bufio.NewScanner(r)
		sawAnyOne bool
	)
	sc.Buffer(make([]byte, 1<<20), 16<<20)
	for sc.Scan() {
		line := sc.Text()
		switch {
		case line == "":
			if sawAnyOne {
				out = append(out, [2]string{ev, data.String()})
			}
			ev, sawAnyOne = "", false
			data.Reset()
		case strings.HasPrefix(line, "event:"):
			ev, sawAnyOne = strings.TrimSpace(line[len("event:"):]), true
		case strings.HasPrefix(line, "data:"):
			if data.Len() > 0 {
				data.WriteByte('\n')
			}
			data.WriteString(strings.TrimPrefix(line[len("data:"):], " "))
			sawAnyOne = true
		}
	}
	if err := sc.Err(); err != nil {
		return out, err
	}
	if sawAnyOne {
		return out, errors.New("stream ended inside an event")
	}
	return out, nil
}
