package fakellm

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"unicode/utf8"
)

// The Anthropic Messages API (https://docs.anthropic.com/en/api/messages,
// .../messages-streaming, .../messages-count-tokens) as Claude Code calls
// it: POST /v1/messages (claude adds ?beta=true), streaming server-sent
// events or one JSON message, and POST /v1/messages/count_tokens.
func init() {
	routes = append(routes,
		route{"POST /v1/messages", (*Server).anthropicMessages},
		route{"POST /v1/messages/count_tokens", (*Server).anthropicCountTokens},
	)
}

// AnthropicRequest is the part of a Messages request the tests read.
type AnthropicRequest struct {
	Model     string             `json:"model"`
	MaxTokens int                `json:"max_tokens"`
	Stream    bool               `json:"stream"`
	System    AnthropicContent   `json:"system"`
	Messages  []AnthropicMessage `json:"messages"`
	Tools     []struct {
		Name string `json:"name"`
	} `json:"tools"`
}

// AnthropicMessage is one message of a request's conversation.
type AnthropicMessage struct {
	Role    string           `json:"role"`
	Content AnthropicContent `json:"content"`
}

// AnthropicContent is a system prompt or a message's content: a string or
// a list of blocks, read as blocks either way.
type AnthropicContent []AnthropicBlock

// AnthropicBlock is one content block: text, tool_use, tool_result, ….
type AnthropicBlock struct {
	Type      string          `json:"type"`
	Text      string          `json:"text,omitempty"`
	ID        string          `json:"id,omitempty"`
	Name      string          `json:"name,omitempty"`
	Input     json.RawMessage `json:"input,omitempty"`
	ToolUseID string          `json:"tool_use_id,omitempty"`
	Content   json.RawMessage `json:"content,omitempty"`
	IsError   bool            `json:"is_error,omitempty"`
}

// UnmarshalJSON reads a string as one text block.
func (c *AnthropicContent) UnmarshalJSON(b []byte) error {
	var s string
	if json.Unmarshal(b, &s) == nil {
		*c = AnthropicContent{{Type: "text", Text: s}}
		return nil
	}
	var blocks []AnthropicBlock
	if err := json.Unmarshal(b, &blocks); err != nil {
		return err
	}
	*c = blocks
	return nil
}

// Text is the text of the blocks, and of tool results' content, joined by
// newlines.
func (c AnthropicContent) Text() string {
	var parts []string
	for _, b := range c {
		if b.Text != "" {
			parts = append(parts, b.Text)
		}
		if len(b.Content) > 0 {
			var inner AnthropicContent
			if inner.UnmarshalJSON(b.Content) == nil {
				parts = append(parts, inner.Text())
			}
		}
	}
	return strings.Join(parts, "\n")
}

// Anthropic parses the request as a Messages request.
func (r Request) Anthropic() (*AnthropicRequest, error) {
	var a AnthropicRequest
	if err := json.Unmarshal(r.Body, &a); err != nil {
		return nil, fmt.Errorf("fakellm: request %d (%s %s) is not a Messages request: %w", r.Seq, r.Method, r.Path, err)
	}
	return &a, nil
}

// anthropicStatusTypes are the API's error types per status.
var anthropicStatusTypes = map[int]string{
	400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
	404: "not_found_error", 413: "request_too_large", 429: "rate_limit_error",
	500: "api_error", 529: "overloaded_error",
}

var anthropicStatusMessages = map[int]string{
	401: "invalid x-api-key", 403: "Your API key does not have permission to use the specified resource.",
	429: "Number of request tokens has exceeded your per-minute rate limit", 500: "Internal server error", 529: "Overloaded",
}

// anthropicMessages answers POST /v1/messages from the script: a request
// that offers tools is the agent loop's next turn, any other a side query.
func (s *Server) anthropicMessages(w http.ResponseWriter, r *http.Request, rec *Request) {
	req, err := rec.Anthropic()
	if err != nil {
		rec.Answer = "400"
		writeError(w, http.StatusBadRequest, "invalid_request_error", err.Error(), nil)
		return
	}
	var (
		t     Turn
		fault *Fault
	)
	if len(req.Tools) > 0 {
		t, rec.Turn, fault = s.player.turn()
		rec.Answer = "turn"
		if rec.Turn < 0 {
			rec.Answer = "after"
		}
	} else {
		t, rec.Turn, rec.Answer = s.player.side(), -1, "side"
	}
	if fault != nil && !delay(r.Context(), fault.Delay) {
		rec.Answer = "gone"
		return
	}
	model := t.Model
	if model == "" {
		model = req.Model
	}
	switch {
	case fault == nil || fault.delayOnly():
	case fault.HTML:
		rec.Answer = "html"
		writeHTML(w, fault.Status)
		return
	case fault.Status != 0:
		rec.Answer = fmt.Sprintf("fault %d", fault.Status)
		typ, msg := fault.Type, fault.Message
		if typ == "" {
			typ = anthropicStatusTypes[fault.Status]
			if typ == "" {
				typ = "api_error"
			}
		}
		if msg == "" {
			msg = anthropicStatusMessages[fault.Status]
			if msg == "" {
				msg = http.StatusText(fault.Status)
			}
		}
		h := map[string]string{"request-id": s.id("req_fake_")}
		if fault.RetryAfter != "" {
			h["retry-after"] = fault.RetryAfter
		}
		for k, v := range fault.Header {
			h[k] = v
		}
		writeError(w, fault.Status, typ, msg, h)
		return
	}
	m := s.anthropicMessage(t, model)
	w.Header().Set("request-id", s.id("req_fake_"))
	if !req.Stream {
		b, _ := json.Marshal(m)
		w.Header().Set("Content-Type", "application/json")
		if fault != nil && fault.CutAfter > 0 {
			// A cut answer: half the body, then the connection drops.
			rec.Answer = fmt.Sprintf("cut after %d bytes", len(b)/2)
			w.Header().Set("Content-Length", fmt.Sprint(len(b)))
			_, _ = w.Write(b[:len(b)/2])
			cut(w)
		}
		if _, err := w.Write(b); err == nil {
			s.player.spend(rec.Turn)
		}
		return
	}
	w.Header().Set("Content-Type", "text/event-stream; charset=utf-8")
	w.Header().Set("Cache-Control", "no-cache")
	w.WriteHeader(http.StatusOK)
	n := 0
	limit := 0
	if fault != nil {
		limit = fault.CutAfter
	}
	f, _ := w.(http.Flusher)
	for _, ev := range AnthropicEvents(m) {
		if limit > 0 && n == limit {
			rec.Answer = fmt.Sprintf("cut after %d events", n)
			cut(w)
		}
		if _, err := io.WriteString(w, ev); err != nil {
			rec.Answer = fmt.Sprintf("client gone after %d events", n)
			return
		}
		if f != nil {
			f.Flush()
		}
		n++
	}
	s.player.spend(rec.Turn)
}

// anthropicCountTokens answers POST /v1/messages/count_tokens with an
// estimate: a token per four bytes of the request.
func (s *Server) anthropicCountTokens(w http.ResponseWriter, r *http.Request, rec *Request) {
	rec.Answer = "count"
	b, _ := json.Marshal(map[string]int{"input_tokens": len(rec.Body)/4 + 1})
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(b)
}

// AnthropicMessage is the non-streaming answer to a Messages request (and
// what its stream adds up to).
type AnthropicAnswer struct {
	ID           string           `json:"id"`
	Type         string           `json:"type"`
	Role         string           `json:"role"`
	Model        string           `json:"model"`
	Content      []AnthropicBlock `json:"content"`
	StopReason   string           `json:"stop_reason"`
	StopSequence *string          `json:"stop_sequence"`
	Usage        AnthropicUsage   `json:"usage"`
}

// AnthropicUsage is the API's usage object.
type AnthropicUsage struct {
	InputTokens              int64 `json:"input_tokens"`
	CacheCreationInputTokens int64 `json:"cache_creation_input_tokens"`
	CacheReadInputTokens     int64 `json:"cache_read_input_tokens"`
	OutputTokens             int64 `json:"output_tokens"`
}

func anthropicUsage(u Usage) AnthropicUsage {
	return AnthropicUsage{InputTokens: u.Input, CacheCreationInputTokens: u.CacheWrite, CacheReadInputTokens: u.CacheRead, OutputTokens: u.Output}
}

// anthropicMessage is turn t as a message from model, with fresh ids.
func (s *Server) anthropicMessage(t Turn, model string) AnthropicAnswer {
	m := AnthropicAnswer{
		ID: s.id("msg_fake_"), Type: "message", Role: "assistant", Model: model,
		StopReason: t.StopReason, Usage: anthropicUsage(t.Usage), Content: []AnthropicBlock{},
	}
	if t.Text != "" {
		m.Content = append(m.Content, AnthropicBlock{Type: "text", Text: t.Text})
	}
	for _, tc := range t.Tools {
		id := tc.ID
		if id == "" {
			id = s.id("toolu_fake_")
		}
		in, err := json.Marshal(tc.Input)
		if err != nil || tc.Input == nil {
			in = []byte("{}")
		}
		m.Content = append(m.Content, AnthropicBlock{Type: "tool_use", ID: id, Name: tc.Name, Input: in})
	}
	if m.StopReason == "" {
		m.StopReason = "end_turn"
		if len(t.Tools) > 0 {
			m.StopReason = "tool_use"
		}
	}
	return m
}

// AnthropicEvents is m as the API streams it, one server-sent event a
// string: message_start (the input and cache usage, output_tokens 1),
// ping, each block's content_block_start, its deltas (text_delta for text,
// input_json_delta for a tool's input, each cut in two) and
// content_block_stop, message_delta (the stop reason and the final usage),
// message_stop.
func AnthropicEvents(m AnthropicAnswer) []string {
	var evs []string
	add := func(name string, data any) {
		b, _ := json.Marshal(data)
		evs = append(evs, "event: "+name+"\ndata: "+string(b)+"\n\n")
	}
	start := m
	start.Content, start.StopReason = []AnthropicBlock{}, ""
	start.Usage.OutputTokens = min(1, m.Usage.OutputTokens)
	add("message_start", map[string]any{"type": "message_start", "message": anthropicStartMessage(start)})
	add("ping", map[string]string{"type": "ping"})
	for i, b := range m.Content {
		switch b.Type {
		case "text":
			add("content_block_start", map[string]any{"type": "content_block_start", "index": i, "content_block": map[string]string{"type": "text", "text": ""}})
			for _, part := range halves(b.Text) {
				add("content_block_delta", map[string]any{"type": "content_block_delta", "index": i, "delta": map[string]string{"type": "text_delta", "text": part}})
			}
		case "tool_use":
			add("content_block_start", map[string]any{"type": "content_block_start", "index": i, "content_block": map[string]any{"type": "tool_use", "id": b.ID, "name": b.Name, "input": map[string]any{}}})
			for _, part := range halves(string(b.Input)) {
				add("content_block_delta", map[string]any{"type": "content_block_delta", "index": i, "delta": map[string]string{"type": "input_json_delta", "partial_json": part}})
			}
		}
		add("content_block_stop", map[string]any{"type": "content_block_stop", "index": i})
	}
	add("message_delta", map[string]any{
		"type":  "message_delta",
		"delta": map[string]any{"stop_reason": m.StopReason, "stop_sequence": nil},
		"usage": m.Usage,
	})
	add("message_stop", map[string]string{"type": "message_stop"})
	return evs
}

// anthropicStartMessage is message_start's message: stop_reason null.
func anthropicStartMessage(m AnthropicAnswer) map[string]any {
	return map[string]any{
		"id": m.ID, "type": "message", "role": "assistant", "model": m.Model,
		"content": []any{}, "stop_reason": nil, "stop_sequence": nil, "usage": m.Usage,
	}
}

// halves cuts s in two at a rune boundary (one part when it is short), as
// the API streams a block in several deltas.
func halves(s string) []string {
	if len(s) < 2 {
		return []string{s}
	}
	i := len(s) / 2
	for i > 0 && !utf8.RuneStart(s[i]) {
		i--
	}
	if i == 0 {
		return []string{s}
	}
	return []string{s[:i], s[i:]}
}

// AnthropicStream is the stream of m as one byte slice.
func AnthropicStream(m AnthropicAnswer) []byte {
	var b bytes.Buffer
	for _, ev := range AnthropicEvents(m) {
		b.WriteString(ev)
	}
	return b.Bytes()
}
