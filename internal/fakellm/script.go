package fakellm

import (
	"sync"
	"time"
)

// A Script is the conversation a Server plays: its Turns in order, one for
// each model request of the engine's agent loop, then After for every
// request past the last.
//
// Which requests are turns is the API's to say (anthropic.go: a Messages
// request that offers tools); the others — a CLI's side queries, a title,
// a summary — are answered with Side and recorded, and do not move the
// script on.
type Script struct {
	Turns []Turn
	// After answers the requests after the last turn; nil: a plain "Done."
	// ending the conversation.
	After *Turn
	// Side answers requests that are not turns; nil: a short "OK".
	Side *Turn
}

// A Turn is one model answer: its text, the tool calls it makes, the usage
// it reports, or a Fault instead.
type Turn struct {
	Text  string
	Tools []ToolCall
	Usage Usage
	// StopReason is the answer's stop reason; "" is tool_use when the turn
	// calls tools, else end_turn.
	StopReason string
	// Model is the model the answer names; "" echoes the request's.
	Model string
	// Fault, when set, is what goes wrong with this turn's answer for its
	// first Fault.Times requests (every request when Times is 0); the
	// request after them gets the turn. A faulted request does not move the
	// script on: the engine's retry meets the same turn.
	Fault *Fault
}

// A ToolCall is a tool the answer calls, with its input (marshalled to
// JSON). ID "" gets a fresh one.
type ToolCall struct {
	Name  string
	Input any
	ID    string
}

// Usage is what an answer reports it cost, in the neutral form every API
// file translates: input tokens (not counting the cache's), output tokens,
// tokens written to the prompt cache and read from it.
type Usage struct {
	Input, Output, CacheWrite, CacheRead int64
}

// Plus is u and v added up.
func (u Usage) Plus(v Usage) Usage {
	return Usage{u.Input + v.Input, u.Output + v.Output, u.CacheWrite + v.CacheWrite, u.CacheRead + v.CacheRead}
}

// A Fault is an answer a real API gives when something is wrong.
type Fault struct {
	// Status is the HTTP status of an error answer (401, 403, 429, 500,
	// 529, …), with the API's own error body; 0 answers 200.
	Status int
	// Type and Message are the error's type and message; "" takes the
	// API's usual ones for Status.
	Type, Message string
	// RetryAfter is the retry-after header's value ("" none).
	RetryAfter string
	// Header is further response headers.
	Header map[string]string
	// HTML answers an HTML page (a proxy's or a load balancer's) instead of
	// the API's format, with Status (200 when 0).
	HTML bool
	// CutAfter, with Status 0, streams the turn's answer and cuts the
	// connection after this many events (a stream cut mid-way); a
	// non-streaming request gets half its JSON body, then the cut (claude
	// retries a cut stream without streaming).
	CutAfter int
	// Delay holds the first byte back this long (a slow first byte); alone
	// it delays the turn's normal answer (for the first Times requests).
	Delay time.Duration
	// Times is how many requests the fault answers before the turn is
	// answered; 0 is every request.
	Times int
}

// player is a Script being played. It is safe for concurrent use.
type player struct {
	mu     sync.Mutex
	script Script
	next   int // the turn the next request gets
	faults int // how many requests the current turn's fault answered
}

// turn is the answer for the next turn request: the turn, its index (-1 for
// After), and the fault to give instead (nil: answer the turn; a delay-only
// fault: answer it late). The script moves on when the answer is given
// (spend), not before: a request that got a fault, or whose client gave up
// waiting, leaves the turn for the engine's retry.
func (p *player) turn() (Turn, int, *Fault) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.next >= len(p.script.Turns) {
		if p.script.After != nil {
			return *p.script.After, -1, nil
		}
		return Turn{Text: "Done.", Usage: Usage{Input: 1, Output: 1}}, -1, nil
	}
	t, i := p.script.Turns[p.next], p.next
	if f := t.Fault; f != nil && (f.Times == 0 || p.faults < f.Times) {
		p.faults++
		return t, i, f
	}
	return t, i, nil
}

// spend moves the script past turn i once its answer was given.
func (p *player) spend(i int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if i >= 0 && i == p.next {
		p.next++
		p.faults = 0
	}
}

// side is the answer for a request that is not a turn.
func (p *player) side() Turn {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.script.Side != nil {
		return *p.script.Side
	}
	return Turn{Text: "OK", Usage: Usage{Input: 1, Output: 1}}
}

// played is how many of the turns were answered.
func (p *player) played() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.next
}

// delayOnly says the fault only slows the answer down.
func (f *Fault) delayOnly() bool {
	return f.Status == 0 && !f.HTML && f.CutAfter == 0
}
