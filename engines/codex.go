package engines

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"time"

	"github.com/aqfleet/aq/internal/brief"
	"github.com/aqfleet/aq/internal/process"
)

// Codex runs the OpenAI Codex CLI headless:
//
//	codex exec --json --sandbox S [-m M] -
//
// S is workspace-write, or what spec.CodexSandbox says: inside aq's
// sandbox the runner passes danger-full-access, the mode codex's
// documentation gives for an environment that is already sandboxed
// (codex's own workspace-write has no network).
// The prompt goes on stdin ("-" forces codex to read it from there) and
// stdin is closed once written: codex reads to EOF and would otherwise
// wait forever. --skip-git-repo-check is not passed: the job's worktree is a
// git repository (its .git is a file, which codex's check accepts), and
// keeping the check means codex refuses to run if aq ever pointed it at a
// directory that is not the job's worktree.
//
// --json prints JSONL events (codex-rs/exec/src/exec_events.rs):
// thread.started{thread_id}, turn.started, turn.completed{usage},
// turn.failed{error{message}}, item.started|updated|completed{item},
// error{message}. The outcome comes from them, whatever the exit code
// (some versions exit 0 after turn.failed):
//
//   - the last turn ended in turn.completed, with no turn.failed or error
//     after it and no turn started since: Succeeded;
//   - turn.failed or error last: Limited when its message is a usage limit,
//     rate limit or exhausted credit ("You've hit your usage limit. … Try
//     again at 3:04 PM.": the reset time is read in codex's local time
//     zone, TZ in its environment), Unavailable when it is an auth or
//     overload failure, else TaskFailed ("error" events before a
//     turn.completed are retries codex recovered from);
//   - no turn.completed at all: TaskFailed (Unavailable when stderr says
//     why in those terms), or Stopped when aq stopped it.
//
// Usage comes only from turn.completed.usage {input_tokens,
// cached_input_tokens, cache_write_input_tokens, output_tokens,
// reasoning_output_tokens} (reasoning is part of output); codex reports
// the thread's running total there, so the last one wins — also across
// `codex exec resume`: measured with codex 0.171.0 against fakellm, a
// first run whose two requests reported 1000+2000 input tokens printed
// 3000, and the resumed run's one request of 3000 printed 6000
// (testdata/codex/real_tool_call.jsonl, real_resume.jsonl). Codex reports no cost: it is metered from spec.Prices for
// the model (the price table's default when -m is not set, as codex then
// uses its own configured model), with Usage.Estimated set. A repair round
// that continues the thread (`codex exec resume`, see Run) reports the
// thread's total too: its own usage is what it adds to Resume.Usage. Codex reports
// no usage during a turn, so aq's token and USD budgets can only stop it
// between turns; the wall budget still applies throughout.
type Codex struct {
	// Bin is the program; default "codex", looked up on the engine's PATH.
	Bin string
	// ResultGrace is how long codex may run on after turn.completed before
	// it is stopped; 0 means DefaultResultGrace.
	ResultGrace time.Duration
	// VersionTimeout bounds the pre-flight's codex --version; 0 means
	// DefaultVersionTimeout.
	VersionTimeout time.Duration
	// HelpTimeout bounds each --help probe; 0 means DefaultHelpTimeout.
	HelpTimeout time.Duration
	// Probes caches the --help probe per binary; nil probes every time.
	Probes *ProbeCache

	now func() time.Time
}

// codexNeeds are the `codex exec` flags Args can pass (HelpSpecs).
var codexNeeds = []FlagNeed{
	{Flag: "--json", Required: true, Use: "JSONL events, what aq reads the outcome and usage from"},
	{Flag: "-m", Aliases: []string{"--model"}, Required: true, Use: "the job's model"},
	{Flag: "--sandbox", Aliases: []string{"-s"}, Instead: "-c", Use: "workspace-write, or danger-full-access inside aq's sandbox (AQ_CODEX_SANDBOX); without it aq passes -c sandbox_mode=\"…\""},
	{Flag: "-c", Aliases: []string{"--config"}, Use: "the stand-in for a missing --sandbox"},
}

// codexResumeHelp is how `codex exec resume` is probed: it has no
// --sandbox (the sandbox policy goes in as -c sandbox_mode=…), so a repair
// round that continues a codex session needs --json, -m and -c there.
var codexResumeHelp = HelpSpec{Sub: []string{"exec", "resume"}, Needs: []FlagNeed{
	{Flag: "--json", Required: true, Use: "JSONL events of the resumed session"},
	{Flag: "-m", Aliases: []string{"--model"}, Required: true, Use: "the job's model"},
	{Flag: "-c", Aliases: []string{"--config"}, Required: true, Use: "the sandbox policy (exec resume has no --sandbox)"},
}}

var _ Engine = (*Codex)(nil)

// Name implements Engine.
func (c *Codex) Name() string { return "codex" }

func (c *Codex) bin() string {
	if c.Bin != "" {
		return c.Bin
	}
	return "codex"
}

// Preflight finds codex on the engine's PATH, reads its version, and fails
// with *UnavailableError when no credential can exist: no CODEX_API_KEY or
// OPENAI_API_KEY, no $CODEX_HOME (~/.codex)/auth.json, and no config.toml
// there that could supply one another way (a keyring credential store or a
// model provider of its own).
func (c *Codex) Preflight(ctx context.Context, spec Spec) (Info, error) {
	return preflight(ctx, c.Name(), c.bin(), spec, c.VersionTimeout, c.HelpTimeout, c.Probes, codexAuthMissing)
}

func codexAuthMissing(env []string) string {
	if envValue(env, "CODEX_API_KEY") != "" || envValue(env, "OPENAI_API_KEY") != "" {
		return ""
	}
	home := envValue(env, "CODEX_HOME")
	if home == "" {
		h := envValue(env, "HOME")
		if h == "" {
			return "" // cannot tell
		}
		home = filepath.Join(h, ".codex")
	}
	if loginPresent(filepath.Join(home, "auth.json")) {
		return ""
	}
	if b := readSmall(filepath.Join(home, "config.toml")); b != nil {
		s := string(b)
		if strings.Contains(s, "cli_auth_credentials_store") || strings.Contains(s, "model_provider") {
			return ""
		}
	}
	return fmt.Sprintf("no credentials: set CODEX_API_KEY (or OPENAI_API_KEY) or run `codex login` (no %s)", filepath.Join(home, "auth.json"))
}

// DefaultCodexSandbox is codex's --sandbox when the spec names none.
const DefaultCodexSandbox = "workspace-write"

// Args is codex's command line for spec, without the program. A codex
// without --sandbox (as `codex exec resume` is) gets the same policy as a
// config override.
func (c *Codex) Args(spec Spec) []string {
	args := []string{"exec", "--json"}
	mode := spec.CodexSandbox
	if mode == "" {
		mode = DefaultCodexSandbox
	}
	if spec.Flags.Has("--sandbox") {
		args = append(args, "--sandbox", mode)
	} else {
		args = append(args, "-c", `sandbox_mode="`+mode+`"`)
	}
	if spec.Model != "" {
		args = append(args, "-m", spec.Model)
	}
	args = append(args, codexBaseURLArgs(spec)...)
	return append(args, "-")
}

// codexBaseURLArgs carries OPENAI_BASE_URL, when the engine's environment
// has it, to codex as `-c openai_base_url="…"`: codex 0.171.0 reads its
// base URL only from config.toml (openai_base_url), never from the
// environment (measured: with OPENAI_BASE_URL set it went to
// api.openai.com), while aq documents OPENAI_BASE_URL as codex's gateway
// setting (its sandbox allows and bridges that URL's host). A value that
// cannot be a TOML basic string as it is (a quote, a backslash, a control
// character) is not passed, nor one with credentials in it (they would be
// in codex's argv), nor anything to a codex without -c.
func codexBaseURLArgs(spec Spec) []string {
	u := envValue(spec.Env, "OPENAI_BASE_URL")
	if u == "" || strings.ContainsAny(u, "\"\\") || strings.IndexFunc(u, func(r rune) bool { return r < 0x20 || r == 0x7f }) >= 0 {
		return nil
	}
	if p, err := url.Parse(u); err != nil || p.User != nil {
		return nil
	}
	if !spec.Flags.Has("-c") {
		return nil
	}
	return []string{"-c", `openai_base_url="` + u + `"`}
}

// ResumeArgs is `codex exec resume`'s command line continuing thread id,
// without the program: the prompt on stdin ("-"), the sandbox policy as a
// config override (exec resume has no --sandbox), run from the worktree
// (it has no -C either).
func (c *Codex) ResumeArgs(spec Spec, id string) []string {
	mode := spec.CodexSandbox
	if mode == "" {
		mode = DefaultCodexSandbox
	}
	args := []string{"exec", "resume", "--json", "-c", `sandbox_mode="` + mode + `"`}
	if spec.Model != "" {
		args = append(args, "-m", spec.Model)
	}
	args = append(args, codexBaseURLArgs(spec)...)
	return append(args, id, "-")
}

// codexThreadID is what aq accepts as a thread to resume: what codex
// prints in thread.started (a UUID), never something that reads as an
// option.
var codexThreadID = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^[0-9A-Za-z][0-9A-Za-z_-]{0,127}$`) })

// Run implements Engine. A repair round asked to resume a session
// (Spec.Resume) continues the thread with `codex exec resume` when this
// codex has it (its own --help probe: --json, -m, -c); when codex says the
// thread is gone ("no rollout found for thread id …" on stderr, exit 1),
// the round runs again fresh, once, with Spec.Prompt.
func (c *Codex) Run(ctx context.Context, spec Spec) (Result, error) {
	spec = engineSpec(spec)
	path, err := findEngine(c.Name(), c.bin(), spec.Env)
	if err != nil {
		return Result{}, err
	}
	if spec.Flags, err = usableFlags(ctx, c.Name(), path, spec, c.HelpTimeout, c.Probes); err != nil {
		return Result{}, err
	}
	note := ""
	if r := spec.Resume; r != nil {
		if note = c.canResume(ctx, path, spec); note == "" {
			rs := spec
			rs.Prompt = r.Prompt
			res, err := c.run(ctx, rs, path, c.ResumeArgs(rs, r.SessionID), r.Usage)
			if err != nil || !res.resumeMissing || ctx.Err() != nil {
				res.Resumed = err == nil && !res.resumeMissing
				return res, err
			}
			note = "codex has no thread " + r.SessionID + " to resume (" + orNone(brief.OneLine(res.Detail, 200)) + ")"
		}
		spec.Resume = nil
	}
	res, err := c.run(ctx, spec, path, c.Args(spec), Usage{})
	res.ResumeNote = note
	return res, err
}

// canResume says why spec's Resume cannot be taken by the codex at path
// ("" when it can): a thread id codex does not make, or an `exec resume`
// that lacks what aq passes it.
func (c *Codex) canResume(ctx context.Context, path string, spec Spec) string {
	if !codexThreadID().MatchString(spec.Resume.SessionID) {
		return fmt.Sprintf("the thread id %q is not one codex makes", brief.OneLine(spec.Resume.SessionID, 60))
	}
	fs, err := probeHelp(ctx, c.Name(), path, codexResumeHelp, spec.Env, c.HelpTimeout, c.Probes)
	if err != nil {
		return err.Error()
	}
	if why := fs.Refusal(codexResumeHelp.Needs); why != "" {
		return "codex exec resume: " + why
	}
	return ""
}

// run is one codex process; base is the thread's usage before it (a
// resumed thread reports its running total).
func (c *Codex) run(ctx context.Context, spec Spec, path string, args []string, base Usage) (Result, error) {
	loc := locationOf(spec.Env)
	return runStreaming(ctx, spec, c.Name(), c.bin(), Invocation{Path: path, Args: args}, c.ResultGrace,
		func(final func()) streamParser {
			p := newCodexParser(spec.Model, spec.Prices, spec.Meter, final)
			p.loc, p.base = loc, base
			if c.now != nil {
				p.now = c.now
			}
			return p
		})
}

type codexEvent struct {
	Type     string `json:"type"`
	ThreadID string `json:"thread_id"`
	Usage    *struct {
		InputTokens       int64 `json:"input_tokens"`
		CachedInputTokens int64 `json:"cached_input_tokens"`
		// CacheWriteInputTokens: codex 0.171.0 prints it (0 against the
		// OpenAI API); reasoning_output_tokens, also printed, is part of
		// output_tokens.
		CacheWriteInputTokens int64 `json:"cache_write_input_tokens"`
		OutputTokens          int64 `json:"output_tokens"`
	} `json:"usage"`
	Error   json.RawMessage `json:"error"` // turn.failed: {message}; a bare string is taken too
	Message string          `json:"message"`
	Item    *struct {
		Type string `json:"type"`
		Text string `json:"text"`
	} `json:"item"`
}

// codexParser turns codex's JSONL into a Result.
type codexParser struct {
	model  string
	prices *PriceTable
	meter  Meter
	final  func()

	streamLog // mu guards the fields below
	threadID  string
	usage     Usage
	turns     int
	last      string // the last of turn.started, turn.completed, turn.failed, error
	failure   string // the message of the last turn.failed or error
	completed bool
	finalText string

	now func() time.Time // when "try again at 3:04 PM" is read; time.Now
	loc *time.Location   // the zone codex prints local times in
	// base is the thread's usage before this run (a resumed thread): codex
	// reports the thread's running total, this run spent what it adds.
	base Usage
	noProgress
}

// codexReconnecting is codex's retry event: an error event "Reconnecting...
// 2/5 (stream disconnected before completion: …)", then, once it falls back
// from WebSockets to HTTPS, "Reconnecting... waiting for network (…)"
// without end (codex 0.171.0, recorded in testdata/codex).
var codexReconnecting = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^Reconnecting\.\.\.`) })

// codexAnswered is a retry after the API did answer — a status (401, 429,
// 5xx), a body that was not an event stream, a stream cut before
// response.completed: codex retries those five times and then says what
// the API said, which is the job's reason; only retries that reached
// nothing count as no progress (the real codex 0.171.0 against the fake:
// realcli's TestCodexAPIErrors).
var codexAnswered = sync.OnceValue(func() *regexp.Regexp {
	return regexp.MustCompile(`unexpected status|last status|response\.completed|decoding response body`)
})

func newCodexParser(model string, prices *PriceTable, meter Meter, final func()) *codexParser {
	if prices == nil {
		prices = DefaultPrices()
	}
	return &codexParser{model: model, prices: prices, meter: meter, final: final, streamLog: streamLog{errLines: tail{n: 20}}, now: time.Now, loc: time.Local}
}

func (p *codexParser) onStdout(line []byte) {
	var ev codexEvent
	if err := json.Unmarshal(line, &ev); err != nil || ev.Type == "" {
		p.skip(line)
		return
	}
	var (
		observe, final, stall bool
		u                     Usage
	)
	p.mu.Lock()
	switch ev.Type {
	case "thread.started":
		p.threadID = ev.ThreadID
	case "turn.started":
		p.turns++
		p.last = ev.Type
		u, observe = p.current(), true
	case "turn.completed":
		p.progress()
		p.last, p.completed, final = ev.Type, true, true
		if ev.Usage != nil {
			p.usage = Usage{
				TokensIn:     since(ev.Usage.InputTokens, p.base.TokensIn),
				TokensCached: since(ev.Usage.CachedInputTokens, p.base.TokensCached),
				TokensOut:    since(ev.Usage.OutputTokens, p.base.TokensOut),

				TokensCacheWrite: since(ev.Usage.CacheWriteInputTokens, p.base.TokensCacheWrite),
			}
		}
		u, observe = p.current(), true
	case "turn.failed":
		p.last, final = ev.Type, true
		p.failure = codexErrorText(ev.Error)
	case "error":
		p.last = ev.Type
		p.failure = ev.Message
		if codexReconnecting().MatchString(ev.Message) && !codexAnswered().MatchString(ev.Message) {
			stall = p.retry("codex", "\"Reconnecting...\"", brief.OneLine(ev.Message, 200))
		}
	case "item.completed":
		if ev.Item != nil && ev.Item.Type == "agent_message" {
			p.finalText = ev.Item.Text
		}
		if ev.Item != nil && ev.Item.Type != "error" {
			p.progress() // an item came back: the API answered
		}
	}
	p.mu.Unlock()
	if stall {
		p.stop()
	}
	if final && p.final != nil {
		p.final()
	}
	if observe && p.meter != nil {
		p.meter.Observe(u)
	}
}

// since is what a running total added since base (the total itself when
// it did not grow past base: a codex that counts a resumed thread from
// zero).
func since(total, base int64) int64 {
	if total < base {
		return total
	}
	return total - base
}

// current is the usage so far, priced from the table.
func (p *codexParser) current() Usage {
	u := p.usage
	u.Turns = p.turns
	u.CostUSD = p.prices.Cost(p.model, u)
	u.Estimated = true
	return u
}

func (p *codexParser) finish(pres process.Result, graceStop bool) (res Result) {
	p.mu.Lock()
	defer p.mu.Unlock()
	res = Result{
		SessionID: p.threadID, Model: p.model, FinalText: p.finalText,
		ExitCode: pres.ExitCode, Process: pres, SkippedLines: p.skipped,
	}
	if p.turns > 0 || p.completed {
		res.Usage = p.current()
	}
	defer func() { res.Detail = p.withSkipped(res.Detail, "event") }()
	if p.stalled != "" && pres.Stopped && errors.Is(pres.StopCause, errNoProgress) {
		res.Outcome, res.Subtype, res.Detail, res.NoProgress = Unavailable, "no_api_progress", p.stalled, true
		return res
	}
	if p.last != "turn.completed" {
		// The job's egress proxy refused the call: its own marker, before
		// any status (its 403 is not the API refusing the login).
		if ref, ok := egressRefusal(p.failure, p.errLines.String()); ok {
			res.Subtype = p.last
			if res.Subtype == "" {
				res.Subtype = "no_turn_completed"
			}
			res.Outcome, res.Detail, res.EgressRefused = Unavailable, refusedDetail("codex", ref), ref
			return res
		}
	}
	switch {
	case p.last == "turn.completed":
		res.Outcome, res.Subtype = Succeeded, "turn.completed"
	case p.last == "turn.failed" || p.last == "error":
		res.Subtype = p.last
		if kind, ex, ok := codexUnavailable(p.failure); ok {
			p.classify(&res, kind, ex, p.failure)
		} else {
			res.Outcome = TaskFailed
			res.Detail = fmt.Sprintf("codex %s: %s", p.last, orNone(brief.OneLine(p.failure, 300)))
		}
		if pres.Stopped && !graceStop && p.last == "error" {
			// An error event codex may still have retried from: aq's stop,
			// not the error, ended the run.
			res.Outcome, res.Detail = Stopped, stopDetail("codex", pres)
		}
	case pres.Stopped && !graceStop:
		res.Outcome, res.Detail = Stopped, stopDetail("codex", pres)
	default:
		res.Subtype = "no_turn_completed"
		if p.turns == 0 && codexNoThread().MatchString(p.errLines.String()) {
			res.resumeMissing = true
		}
		if kind, ex, ok := unavailableReason(p.errLines.String()); ok {
			p.classify(&res, kind, ex, p.errLines.String())
			break
		}
		res.Outcome = TaskFailed
		res.Detail = fmt.Sprintf("codex printed no turn.completed event (%s%s)", exitText(pres), stderrSuffix(p.errLines))
		if p.completed {
			res.Detail = fmt.Sprintf("codex started another turn and exited without finishing it (%s%s)", exitText(pres), stderrSuffix(p.errLines))
		}
	}
	return res
}

// classify sets an Unavailable outcome, or Limited for a usage limit, rate
// limit or exhausted credit, with the reset time codex printed ("Try again
// at 3:04 PM.", in codex's local time zone). codex exec's JSONL carries only
// the message: CodexErrorInfo::UsageLimitExceeded does not reach it. The
// caller holds mu.
func (p *codexParser) classify(res *Result, kind, excerpt, text string) {
	lk := limitKind(kind)
	if lk == "" {
		res.Outcome, res.Detail = Unavailable, "codex is unavailable ("+kind+"): "+excerpt
		if strings.HasPrefix(kind, "auth") {
			res.Detail += "; " + codexLoginHint
		}
		return
	}
	lim := &Limit{Kind: lk}
	if at, note, ok := textReset(text, p.now(), p.loc); ok {
		lim.ResetAt, lim.Source = at, "text"
	} else {
		lim.Note = note
	}
	res.Outcome, res.Limit = Limited, lim
	res.Detail = "codex " + lk + ": " + excerpt
}

// codexLoginHint is what an auth failure's detail adds: where codex's
// login comes from.
const codexLoginHint = "check codex's login: CODEX_API_KEY (or OPENAI_API_KEY) in the engine's environment, or `codex login` ($CODEX_HOME/auth.json)"

// codexOverloaded is how codex 0.171.0 words a 5xx it gave up on after its
// retries: "We’re currently experiencing high demand, which may cause
// temporary errors." (recorded against fakellm answering 500; 503 reads
// "service unavailable" where it is not reworded).
var codexOverloaded = sync.OnceValue(func() *regexp.Regexp {
	return regexp.MustCompile(`(?i)experiencing high demand|temporary errors|service unavailable|\b50[0234] (internal|bad|service|gateway)`)
})

// codexUnavailable is unavailableReason for codex's failure text, with the
// overload codex words in its own way.
func codexUnavailable(text string) (kind, excerpt string, ok bool) {
	if kind, ex, ok := unavailableReason(text); ok {
		return kind, ex, ok
	}
	if loc := codexOverloaded().FindStringIndex(text); loc != nil {
		return "overloaded", excerptAround(text, loc[0]), true
	}
	return "", "", false
}

// codexNoThread is what `codex exec resume` prints when the thread is not
// there: "Error: thread/resume: thread/resume failed: no rollout found for
// thread id <id> (code -32600)" (codex 0.132; codex-rs/thread-store's
// read_thread.rs).
var codexNoThread = sync.OnceValue(func() *regexp.Regexp {
	return regexp.MustCompile(`(?i)no rollout found for (thread|conversation) id|thread not found`)
})

func stderrSuffix(t tail) string {
	if l := t.last(); l != "" {
		return "; stderr: " + brief.OneLine(l, 200)
	}
	return ""
}

// codexErrorText is turn.failed's error message: {"message": "..."}, or
// whatever else is there, as text.
func codexErrorText(raw json.RawMessage) string {
	var e struct {
		Message string `json:"message"`
	}
	if json.Unmarshal(raw, &e) == nil && e.Message != "" {
		return e.Message
	}
	return rawText(raw)
}
