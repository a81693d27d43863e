package engines

import (
	"bytes"
	"encoding/json"
	"fmt"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"

	"github.com/aqfleet/aq/internal/brief"
)

// A Transcript renders an engine's output log (stdout.log, as Exec writes
// it: aq's attempt headers, then the engine's own lines) for a person, one
// line at a time: what the engine said, the tools it called and on what,
// the usage and cost as they accrue, and how the run ended. It reuses the
// adapters' parsers for usage and cost — the same accounting the runner
// meters budgets with — so `aq job logs -f`, the board and the runner never
// disagree about what a run spent.
//
// Which engine printed the log is read from the lines themselves (claude's
// stream-json, codex's JSONL, a script's ::aq-usage directives, anything
// else as plain text), unless NewTranscript is told. A Transcript is safe for
// concurrent use.
type Transcript struct {
	hint   string
	model  string
	prices *PriceTable

	mu      sync.Mutex
	kind    string // the engine of the current attempt: claude, codex, script, text ("" until known)
	parser  streamParser
	usage   Usage
	hasUse  bool
	last    string
	ended   bool // the current attempt printed its final event
	attempt int  // the current attempt's number, from its header (0: none seen)
	// round and rounds are the current run's repair round (0: the
	// attempt's first run) and the rounds its job allows, from its header;
	// prior is what the attempt's earlier runs spent.
	round, rounds int
	prior         Usage
	// mU is what the parser last fed its meter; mSeen says it did during
	// the current line (the parsers meter synchronously, under t.mu).
	mU    Usage
	mSeen bool
}

// Note is one rendered event.
type Note struct {
	// Kind: attempt (aq's header for a new run), system, text (the
	// engine's words), tool (a tool call and its target), tool-error,
	// usage, result, error.
	Kind string `json:"kind"`
	Text string `json:"text"`
	// Usage is the run's cumulative usage, on usage and result notes.
	Usage *Usage `json:"usage,omitempty"`
}

// String is the note as one line for a terminal.
func (n Note) String() string {
	switch n.Kind {
	case "attempt":
		return "── " + n.Text + " ──"
	case "text":
		return n.Text
	case "tool":
		return "→ " + n.Text
	case "tool-error":
		return "✗ " + n.Text
	case "usage":
		return "· " + n.Text
	case "result":
		return "■ " + n.Text
	case "error":
		return "! " + n.Text
	}
	return "· " + n.Text
}

// NewTranscript returns a transcript of engine's output (claude, codex,
// devin, script; "" or any: read from the output). model prices usage that
// the engine reports without a cost; prices nil is the built-in table.
func NewTranscript(engine, model string, prices *PriceTable) *Transcript {
	if prices == nil {
		prices = DefaultPrices()
	}
	if engine == "any" {
		engine = ""
	}
	return &Transcript{hint: engine, model: model, prices: prices}
}

// headerLine matches the line Exec writes before each run (Header): job,
// attempt, the repair round and the rounds allowed when it is one, what
// ran, when.
var headerLine = sync.OnceValue(func() *regexp.Regexp {
	return regexp.MustCompile(`^=== aq job (\S+) attempt (\d+)(?: repair (\d+)/(\d+))?: (\S+) at (\S+) ===$`)
})

// IsHeader reports whether line is aq's own attempt header in a job log (not
// the engine's output).
func IsHeader(line []byte) bool { return headerLine().Match(bytes.TrimSpace(line)) }

// Line reads one line of the log and returns what it says (nothing for a
// line that says nothing new to a person).
func (t *Transcript) Line(line []byte) []Note {
	line = bytes.TrimRight(line, "\r\n")
	if len(bytes.TrimSpace(line)) == 0 {
		return nil
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if m := headerLine().FindSubmatch(bytes.TrimSpace(line)); m != nil {
		attempt, _ := strconv.Atoi(string(m[2]))
		round, _ := strconv.Atoi(string(m[3]))
		rounds, _ := strconv.Atoi(string(m[4]))
		if attempt == t.attempt && round > 0 {
			// A repair round of the same attempt: it spends the attempt's
			// budget, so its usage adds to the runs before it.
			t.prior = t.prior.Plus(t.usage)
		} else {
			t.prior = Usage{}
		}
		t.attempt, t.round, t.rounds = attempt, round, rounds
		t.kind, t.parser, t.ended = "", nil, false
		t.usage, t.hasUse = Usage{}, t.hasUse && round > 0
		bin := filepath.Base(string(m[5]))
		if t.hint == "" {
			switch {
			case strings.Contains(bin, "claude"):
				t.kind = "claude"
			case strings.Contains(bin, "codex"):
				t.kind = "codex"
			}
		}
		what := "attempt " + string(m[2])
		if round > 0 {
			what += fmt.Sprintf(" repair %d/%d", round, rounds)
		}
		return t.note(Note{Kind: "attempt", Text: fmt.Sprintf("%s: %s at %s", what, bin, m[6])})
	}
	if t.kind == "" {
		t.kind = t.detect(line)
	}
	switch t.kind {
	case "claude":
		return t.claude(line)
	case "codex":
		return t.codex(line)
	case "script":
		return t.script(line)
	}
	return t.note(Note{Kind: "text", Text: brief.OneLine(string(line), 2000)})
}

// detect names the engine from its first line (or the hint).
func (t *Transcript) detect(line []byte) string {
	switch t.hint {
	case "claude", "codex", "script":
		return t.hint
	case "devin":
		return "text"
	}
	var probe struct {
		Type string `json:"type"`
	}
	if json.Unmarshal(line, &probe) == nil && probe.Type != "" {
		if strings.Contains(probe.Type, ".") || probe.Type == "error" {
			return "codex"
		}
		return "claude"
	}
	if bytes.HasPrefix(line, []byte("::aq-")) {
		return "script"
	}
	return "" // undecided: plain text for now
}

// Usage is the current attempt's cumulative usage (its repair rounds'
// included), and whether the engine reported any.
func (t *Transcript) Usage() (Usage, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.prior.Plus(t.usage), t.hasUse
}

// Round is the repair round the log is at (0: the attempt's first run) and
// the rounds its job allows, from the last header.
func (t *Transcript) Round() (round, rounds int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.round, t.rounds
}

// Last is the last thing the engine did, on one line ("" before anything).
func (t *Transcript) Last() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.last
}

// Attempt is the number of the attempt the log is at (its last header; 0
// before any).
func (t *Transcript) Attempt() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.attempt
}

// Ended reports whether the current attempt printed its final event
// (claude's result, codex's turn.completed or turn.failed).
func (t *Transcript) Ended() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.ended
}

// note records n as the last event (usage notes excepted) and returns it.
func (t *Transcript) note(ns ...Note) []Note {
	for _, n := range ns {
		if n.Kind != "usage" {
			t.last = brief.OneLine(n.String(), 200)
		}
	}
	return ns
}

// feed hands line to the attempt's parser (made by mk on its first line)
// and reports whether the usage moved.
func (t *Transcript) feed(line []byte, mk func(m Meter) streamParser) bool {
	if t.parser == nil {
		t.parser = mk(MeterFunc(func(x Usage) { t.mU, t.mSeen = x, true }))
	}
	t.mSeen = false
	t.parser.onStdout(line)
	if !t.mSeen || t.mU == t.usage {
		return false
	}
	t.usage, t.hasUse = t.mU, true
	return true
}

// usageText is usage on one line: tokens, cost (~ when estimated), turns.
func usageText(u Usage) string {
	cost := fmt.Sprintf("$%.4f", u.CostUSD)
	if u.Estimated {
		cost = "~" + cost
	}
	return fmt.Sprintf("%s tokens (%s in, %s out), %s, %d turn(s)", humanCount(u.Tokens()), humanCount(u.TokensIn), humanCount(u.TokensOut), cost, u.Turns)
}

// claudeBlock is one content block of a claude message.
type claudeBlock struct {
	Type    string          `json:"type"`
	Text    string          `json:"text"`
	Name    string          `json:"name"`
	Input   json.RawMessage `json:"input"`
	Content json.RawMessage `json:"content"`
	IsError bool            `json:"is_error"`
}

func (t *Transcript) claude(line []byte) []Note {
	var ev claudeEvent
	if err := json.Unmarshal(line, &ev); err != nil || ev.Type == "" {
		return t.note(Note{Kind: "text", Text: brief.OneLine(string(line), 2000)})
	}
	var out []Note
	switch ev.Type {
	case "system":
		if ev.Subtype == "init" {
			s := "claude"
			if ev.Version != "" {
				s += " " + ev.Version
			}
			if ev.Model != "" {
				s += ", model " + ev.Model
			}
			if ev.SessionID != "" {
				s += ", session " + ev.SessionID
			}
			out = append(out, Note{Kind: "system", Text: s})
		}
	case "assistant", "user":
		if e := rawText(ev.Error); e != "" && ev.Type == "assistant" {
			out = append(out, Note{Kind: "error", Text: "API error: " + brief.OneLine(e, 300)})
		}
		if ev.Message != nil {
			var blocks []claudeBlock
			if json.Unmarshal(ev.Message.Content, &blocks) != nil {
				// user messages may carry a plain string
				if s := rawText(ev.Message.Content); s != "" && ev.Type == "assistant" {
					out = append(out, Note{Kind: "text", Text: brief.OneLine(s, 2000)})
				}
			}
			sub := ev.ParentToolUseID != nil && *ev.ParentToolUseID != ""
			for _, b := range blocks {
				switch {
				case b.Type == "text" && ev.Type == "assistant" && strings.TrimSpace(b.Text) != "":
					txt := brief.OneLine(b.Text, 2000)
					if sub {
						txt = "(subagent) " + txt
					}
					out = append(out, Note{Kind: "text", Text: txt})
				case b.Type == "tool_use":
					out = append(out, Note{Kind: "tool", Text: toolText(b.Name, b.Input)})
				case b.Type == "tool_result" && b.IsError:
					out = append(out, Note{Kind: "tool-error", Text: "tool failed: " + brief.OneLine(rawTextOrBlocks(b.Content), 240)})
				}
			}
		}
	case "result":
		out = append(out, Note{Kind: "result"})
	}
	moved := t.feed(line, func(m Meter) streamParser { return newClaudeParser(t.model, t.prices, m, nil) })
	if ev.Type == "result" {
		t.ended = true
	} else if moved {
		u := t.usage
		out = append(out, Note{Kind: "usage", Text: "usage: " + usageText(u), Usage: &u})
	}
	for i := range out {
		if out[i].Kind == "result" {
			u := t.usage
			r := ev.Subtype
			if ev.IsError {
				r += " (is_error)"
			}
			out[i].Text = "result: " + r + ", " + usageText(u)
			if ev.Result != "" {
				out[i].Text += " — " + brief.OneLine(ev.Result, 300)
			}
			out[i].Usage = &u
		}
	}
	return t.note(out...)
}

// rawTextOrBlocks is a tool result's content: a string, or the text of its
// blocks.
func rawTextOrBlocks(raw json.RawMessage) string {
	var blocks []claudeBlock
	if json.Unmarshal(raw, &blocks) == nil {
		var parts []string
		for _, b := range blocks {
			if b.Text != "" {
				parts = append(parts, b.Text)
			}
		}
		return strings.Join(parts, " ")
	}
	return rawText(raw)
}

// toolText names a tool call and its target: the file, command, pattern or
// address it works on.
func toolText(name string, input json.RawMessage) string {
	var in map[string]any
	_ = json.Unmarshal(input, &in)
	for _, k := range []string{"file_path", "notebook_path", "path", "command", "pattern", "url", "query", "description", "prompt"} {
		if v, ok := in[k].(string); ok && strings.TrimSpace(v) != "" {
			return name + " " + brief.OneLine(v, 200)
		}
	}
	return name
}

// codexItem is the part of a codex item a person reads.
type codexItem struct {
	Type     string `json:"type"`
	Text     string `json:"text"`
	Command  string `json:"command"`
	ExitCode *int   `json:"exit_code"`
	Status   string `json:"status"`
	Changes  []struct {
		Path string `json:"path"`
		Kind string `json:"kind"`
	} `json:"changes"`
	Server  string `json:"server"`
	Tool    string `json:"tool"`
	Query   string `json:"query"`
	Message string `json:"message"`
}

func (t *Transcript) codex(line []byte) []Note {
	var ev struct {
		Type     string          `json:"type"`
		ThreadID string          `json:"thread_id"`
		Item     *codexItem      `json:"item"`
		Message  string          `json:"message"`
		Error    json.RawMessage `json:"error"`
	}
	if err := json.Unmarshal(line, &ev); err != nil || ev.Type == "" {
		t.observeCodex(line)
		return t.note(Note{Kind: "text", Text: brief.OneLine(string(line), 2000)})
	}
	var out []Note
	switch ev.Type {
	case "thread.started":
		out = append(out, Note{Kind: "system", Text: "codex thread " + ev.ThreadID})
	case "turn.failed":
		out = append(out, Note{Kind: "result", Text: "turn failed: " + brief.OneLine(codexErrorText(ev.Error), 300)})
	case "error":
		out = append(out, Note{Kind: "error", Text: brief.OneLine(ev.Message, 300)})
	case "item.started", "item.completed":
		if it := ev.Item; it != nil {
			if n, ok := codexItemNote(ev.Type, it); ok {
				out = append(out, n)
			}
		}
	}
	out = append(out, t.observeCodex(line)...)
	switch ev.Type {
	case "turn.completed":
		u := t.usage
		t.ended = true
		out = append(out, Note{Kind: "result", Text: "turn completed, " + usageText(u), Usage: &u})
	case "turn.failed":
		t.ended = true
	case "turn.started":
		t.ended = false
	}
	return t.note(out...)
}

// observeCodex feeds line to the codex parser; a usage note when it moved
// (turn.completed carries its usage in the result note instead).
func (t *Transcript) observeCodex(line []byte) []Note {
	moved := t.feed(line, func(m Meter) streamParser { return newCodexParser(t.model, t.prices, m, nil) })
	if !moved || t.usage.Tokens() == 0 || bytes.Contains(line, []byte(`"turn.completed"`)) {
		return nil
	}
	u := t.usage
	return []Note{{Kind: "usage", Text: "usage: " + usageText(u), Usage: &u}}
}

func codexItemNote(evType string, it *codexItem) (Note, bool) {
	done := evType == "item.completed"
	switch it.Type {
	case "agent_message":
		if done && strings.TrimSpace(it.Text) != "" {
			return Note{Kind: "text", Text: brief.OneLine(it.Text, 2000)}, true
		}
	case "reasoning":
		if done && strings.TrimSpace(it.Text) != "" {
			return Note{Kind: "system", Text: "thinking: " + brief.OneLine(it.Text, 300)}, true
		}
	case "command_execution":
		if !done {
			return Note{Kind: "tool", Text: "command " + brief.OneLine(it.Command, 200)}, true
		}
		if it.ExitCode != nil && *it.ExitCode != 0 {
			return Note{Kind: "tool-error", Text: fmt.Sprintf("command exited %d: %s", *it.ExitCode, brief.OneLine(it.Command, 200))}, true
		}
	case "file_change":
		if done {
			var parts []string
			for _, c := range it.Changes {
				parts = append(parts, c.Kind+" "+c.Path)
			}
			return Note{Kind: "tool", Text: "edit " + strings.Join(parts, ", ")}, true
		}
	case "mcp_tool_call":
		if !done {
			return Note{Kind: "tool", Text: "mcp " + it.Server + "/" + it.Tool}, true
		}
	case "web_search":
		if !done {
			return Note{Kind: "tool", Text: "web search " + brief.OneLine(it.Query, 200)}, true
		}
	case "error":
		return Note{Kind: "error", Text: brief.OneLine(it.Message, 300)}, true
	}
	return Note{}, false
}

func (t *Transcript) script(line []byte) []Note {
	l := string(line)
	switch {
	case strings.HasPrefix(l, "::aq-usage "):
		u, ok := parseUsage(strings.TrimPrefix(l, "::aq-usage "))
		if !ok || u == t.usage {
			return nil
		}
		t.usage, t.hasUse = u, true
		return []Note{{Kind: "usage", Text: "usage: " + usageText(u), Usage: &u}}
	case strings.HasPrefix(l, "::aq-unavailable"):
		return t.note(Note{Kind: "error", Text: "unavailable: " + strings.TrimSpace(strings.TrimPrefix(l, "::aq-unavailable"))})
	}
	return t.note(Note{Kind: "text", Text: brief.OneLine(l, 2000)})
}
