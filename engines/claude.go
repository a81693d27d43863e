package engines

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"time"

	"github.com/aqfleet/aq/internal/brief"
	"github.com/aqfleet/aq/internal/process"
)

// Claude runs Claude Code headless:
//
//	claude -p --output-format stream-json --verbose [--max-turns N]
//	  [--max-budget-usd X] [--model M] --permission-mode P
//	  --session-id <uuid> [--append-system-prompt <persona>]
//
// (a repair round continuing the session before it: --resume <uuid>
// instead of --session-id; see Run)
//
// with the prompt on stdin (closed once written). stream-json prints one
// JSON event a line: system (init), assistant, user, result, and others
// that are ignored. The outcome comes from the last result event, never from
// the exit code alone:
//
//   - subtype success and is_error false: Succeeded;
//   - error_max_budget_usd (whatever is_error says): Stopped with
//     BudgetExceeded, which the runner reports as budget_exceeded;
//   - a rate limit, usage limit or exhausted credit (a rate_limit_event
//     with status rejected, or the result text, errors[], api_error_status
//     429, an assistant event's error field, or stderr): Limited, with the
//     reset time from the rejected rate_limit_event's resetsAt (Unix
//     seconds), else from the text ("resets 2pm (Europe/Berlin)", the
//     legacy "limit reached|<epoch>");
//   - an auth or overload failure (in the same places): Unavailable;
//   - any other result (success with is_error true, error_max_turns,
//     error_during_execution, …): TaskFailed;
//   - no result event, whatever the exit code (claude -p has been seen to
//     exit 0 with no output): TaskFailed, or Stopped when aq stopped it.
//
// Usage is metered live from the assistant events' message.usage (one API
// call per message id; claude repeats a message's usage on each of its
// content blocks) and priced from spec.Prices as an estimate; the result's
// usage, total_cost_usd and num_turns replace it at the end. A line that is
// not JSON is skipped and counted in Result.SkippedLines.
type Claude struct {
	// Bin is the program; default "claude", looked up on the engine's PATH.
	Bin string
	// ResultGrace is how long claude may run on after its result event
	// before it is stopped; 0 means DefaultResultGrace.
	ResultGrace time.Duration
	// VersionTimeout bounds the pre-flight's claude --version; 0 means
	// DefaultVersionTimeout.
	VersionTimeout time.Duration
	// HelpTimeout bounds each --help probe; 0 means DefaultHelpTimeout.
	HelpTimeout time.Duration
	// Probes caches the --help probe per binary; nil probes every time.
	Probes *ProbeCache

	euid func() int // os.Geteuid; tests replace it
	now  func() time.Time
}

// claudeNeeds are the flags Args can pass (HelpSpecs).
var claudeNeeds = []FlagNeed{
	{Flag: "-p", Aliases: []string{"--print"}, Required: true, Use: "the headless run"},
	{Flag: "--output-format", Required: true, Use: "stream-json, the events aq reads the outcome and usage from"},
	{Flag: "--verbose", Required: true, Use: "stream-json requires it with -p"},
	{Flag: "--permission-mode", Required: true, Use: "editing the worktree without prompts (AQ_CLAUDE_PERMISSION_MODE)"},
	{Flag: "--model", Required: true, Use: "the job's model"},
	{Flag: "--session-id", Use: "the session id aq chooses and records; without it aq records the one claude reports"},
	{Flag: "--resume", Aliases: []string{"-r"}, Use: "a repair round continuing the session of the run before it; without it the round starts a fresh session with the task and the failure in its prompt"},
	{Flag: "--max-turns", Hidden: true, Value: "1", Use: "the job's budget.turns; without it only aq's wall, USD and token budgets stop claude"},
	{Flag: "--max-budget-usd", Use: "claude stopping itself at budget.usd; without it aq's meter stops it"},
	{Flag: "--append-system-prompt", Use: "the profile's persona; without it the persona goes before the task in the prompt"},
}

var _ Engine = (*Claude)(nil)

// DefaultPermissionMode is claude's --permission-mode when the spec names
// none (aq's claude_permission_mode default).
const DefaultPermissionMode = "acceptEdits"

// Name implements Engine.
func (c *Claude) Name() string { return "claude" }

func (c *Claude) bin() string {
	if c.Bin != "" {
		return c.Bin
	}
	return "claude"
}

// Preflight finds claude on the engine's PATH, reads its version, and
// fails with *UnavailableError when no credential can exist: on Linux, no
// ANTHROPIC_API_KEY, ANTHROPIC_AUTH_TOKEN, CLAUDE_CODE_OAUTH_TOKEN or
// Bedrock/Vertex/Foundry switch in the environment, and neither
// $CLAUDE_CONFIG_DIR (~/.claude)/.credentials.json, settings.json (an
// apiKeyHelper) nor ~/.claude.json. On macOS credentials live in the
// keychain, so only the binary and version are checked.
func (c *Claude) Preflight(ctx context.Context, spec Spec) (Info, error) {
	return preflight(ctx, c.Name(), c.bin(), spec, c.VersionTimeout, c.HelpTimeout, c.Probes, claudeAuthMissing)
}

func claudeAuthMissing(env []string) string {
	for _, k := range []string{"ANTHROPIC_API_KEY", "ANTHROPIC_AUTH_TOKEN", "CLAUDE_CODE_OAUTH_TOKEN",
		"CLAUDE_CODE_USE_BEDROCK", "CLAUDE_CODE_USE_VERTEX", "CLAUDE_CODE_USE_FOUNDRY"} {
		if envValue(env, k) != "" {
			return ""
		}
	}
	if runtime.GOOS != "linux" {
		return "" // the keychain: cannot tell cheaply
	}
	home := envValue(env, "HOME")
	dir := envValue(env, "CLAUDE_CONFIG_DIR")
	if dir == "" {
		if home == "" {
			return "" // cannot tell
		}
		dir = filepath.Join(home, ".claude")
	}
	cands := []string{filepath.Join(dir, ".credentials.json"), filepath.Join(dir, "settings.json")}
	if home != "" {
		cands = append(cands, filepath.Join(home, ".claude.json"))
	}
	for _, p := range cands {
		if loginPresent(p) {
			return ""
		}
	}
	return fmt.Sprintf("no credentials: set ANTHROPIC_API_KEY (or CLAUDE_CODE_OAUTH_TOKEN from `claude setup-token`) or log in with `claude` (no %s)", filepath.Join(dir, ".credentials.json"))
}

// Args is claude's command line for spec (without the program), and the
// session id it carries ("" when the CLI has no --session-id). Optional
// flags spec.Flags lacks are left out. A spec whose Resume the CLI can
// take (canResume) continues that session: --resume <id>, and no
// --session-id, which claude refuses for a session it has (unless
// --fork-session).
func (c *Claude) Args(spec Spec) ([]string, string, error) {
	resume := c.canResume(spec) == ""
	sid := spec.SessionID
	switch {
	case resume:
		sid = spec.Resume.SessionID
	case sid == "":
		sid = newUUID()
	case !uuidPattern().MatchString(sid):
		return nil, "", fmt.Errorf("claude: session id %q is not a UUID", sid)
	}
	has := spec.Flags.Has
	args := []string{"-p", "--output-format", "stream-json", "--verbose"}
	if spec.Budget.Turns > 0 && has("--max-turns") {
		args = append(args, "--max-turns", strconv.Itoa(spec.Budget.Turns))
	}
	if spec.Budget.USD > 0 && has("--max-budget-usd") {
		args = append(args, "--max-budget-usd", strconv.FormatFloat(spec.Budget.USD, 'f', -1, 64))
	}
	if spec.Model != "" {
		args = append(args, "--model", spec.Model)
	}
	args = append(args, "--permission-mode", permissionMode(spec))
	switch {
	case resume:
		args = append(args, "--resume", sid)
	case has("--session-id"):
		args = append(args, "--session-id", sid)
	default:
		sid = ""
	}
	if p := strings.TrimSpace(spec.Persona); p != "" && has("--append-system-prompt") {
		args = append(args, "--append-system-prompt", p)
	}
	return args, sid, nil
}

// canResume says why spec's Resume cannot be taken ("" when it can, or no
// resume is asked): the CLI has no --resume, or the session id is not one
// claude makes (a UUID).
func (c *Claude) canResume(spec Spec) string {
	r := spec.Resume
	switch {
	case r == nil:
		return "no resume asked"
	case !spec.Flags.Has("--resume"):
		return "this claude has no --resume"
	case !uuidPattern().MatchString(r.SessionID):
		return fmt.Sprintf("the session id %q is not a UUID", brief.OneLine(r.SessionID, 60))
	}
	return ""
}

// prompt is what claude reads on stdin: the task, with the persona before
// it when the CLI cannot take it through --append-system-prompt; a resumed
// session only the resume prompt (it has the task and the persona).
func (c *Claude) prompt(spec Spec) string {
	if c.canResume(spec) == "" {
		return spec.Resume.Prompt
	}
	if p := strings.TrimSpace(spec.Persona); p != "" && !spec.Flags.Has("--append-system-prompt") {
		return p + "\n\n" + spec.Prompt
	}
	return spec.Prompt
}

func permissionMode(spec Spec) string {
	if spec.PermissionMode != "" {
		return spec.PermissionMode
	}
	return DefaultPermissionMode
}

// env is the engine environment: claude refuses bypassPermissions as root
// (exit 1) unless IS_SANDBOX=1, which aq sets exactly then.
func (c *Claude) env(spec Spec) []string {
	euid := os.Geteuid
	if c.euid != nil {
		euid = c.euid
	}
	if permissionMode(spec) == "bypassPermissions" && euid() == 0 {
		return withEnv(spec.Env, "IS_SANDBOX=1")
	}
	return spec.Env
}

// Run implements Engine. A repair round asked to resume a session
// (Spec.Resume) continues it with --resume when the CLI can; when claude
// says the session is gone ("No conversation found with session ID", in
// the result's errors[] and on stderr, exit 1), the round runs again fresh,
// once, with Spec.Prompt.
func (c *Claude) Run(ctx context.Context, spec Spec) (Result, error) {
	spec = engineSpec(spec)
	path, err := findEngine(c.Name(), c.bin(), spec.Env)
	if err != nil {
		return Result{}, err
	}
	if spec.Flags, err = usableFlags(ctx, c.Name(), path, spec, c.HelpTimeout, c.Probes); err != nil {
		return Result{}, err
	}
	note := ""
	if spec.Resume != nil {
		if note = c.canResume(spec); note == "" {
			res, err := c.run(ctx, spec, path)
			if err != nil || !res.resumeMissing || ctx.Err() != nil {
				res.Resumed = err == nil && !res.resumeMissing
				return res, err
			}
			note = "claude has no session " + spec.Resume.SessionID + " to resume (" + orNone(brief.OneLine(res.Detail, 200)) + ")"
		}
		spec.Resume = nil
	}
	res, err := c.run(ctx, spec, path)
	res.ResumeNote = note
	return res, err
}

// run is one claude process for spec.
func (c *Claude) run(ctx context.Context, spec Spec, path string) (Result, error) {
	args, sid, err := c.Args(spec)
	if err != nil {
		return Result{}, err
	}
	spec.Env = c.env(spec)
	spec.Prompt = c.prompt(spec)
	res, err := runStreaming(ctx, spec, c.Name(), c.bin(), Invocation{Path: path, Args: args}, c.ResultGrace,
		func(final func()) streamParser {
			p := newClaudeParser(spec.Model, spec.Prices, spec.Meter, final)
			if c.now != nil {
				p.now = c.now
			}
			return p
		})
	if err == nil && res.SessionID == "" {
		res.SessionID = sid
	}
	return res, err
}

// claudeEvent is the subset of a stream-json line aq reads.
type claudeEvent struct {
	Type    string `json:"type"`
	Subtype string `json:"subtype"`
	// system init
	SessionID string `json:"session_id"`
	Model     string `json:"model"`
	Version   string `json:"claude_code_version"`
	// APIKeySource is where claude took its credential from
	// (ANTHROPIC_API_KEY, apiKeyHelper, /login managed key, none, …).
	APIKeySource string `json:"apiKeySource"`
	// assistant
	Message *struct {
		ID      string          `json:"id"`
		Model   string          `json:"model"`
		Content json.RawMessage `json:"content"`
		Usage   *claudeUsage    `json:"usage"`
	} `json:"message"`
	ParentToolUseID *string         `json:"parent_tool_use_id"`
	Error           json.RawMessage `json:"error"` // a string in the Agent SDK types; anything else is kept as text
	// system api_retry: the status (null: no answer at all) and its kind
	Attempt     int  `json:"attempt"`
	MaxRetries  int  `json:"max_retries"`
	ErrorStatus *int `json:"error_status"`
	// result
	IsError        bool            `json:"is_error"`
	NumTurns       int             `json:"num_turns"`
	Result         string          `json:"result"`
	TotalCostUSD   *float64        `json:"total_cost_usd"`
	Usage          *claudeUsage    `json:"usage"`
	Errors         json.RawMessage `json:"errors"` // []string in the Agent SDK types
	APIErrorStatus int             `json:"api_error_status"`
	// rate_limit_event
	RateLimitInfo json.RawMessage `json:"rate_limit_info"`
}

// claudeRateLimit is a rate_limit_event's rate_limit_info (the Agent SDK's
// SDKRateLimitInfo): status allowed | allowed_warning | rejected, resetsAt
// in Unix seconds, rateLimitType five_hour | seven_day | seven_day_opus |
// seven_day_sonnet | seven_day_overage_included | overage.
type claudeRateLimit struct {
	Status                string          `json:"status"`
	ResetsAt              json.RawMessage `json:"resetsAt"`
	RateLimitType         string          `json:"rateLimitType"`
	OverageStatus         string          `json:"overageStatus"`
	OverageDisabledReason string          `json:"overageDisabledReason"`
	ErrorCode             string          `json:"errorCode"`
}

type claudeUsage struct {
	InputTokens              int64 `json:"input_tokens"`
	OutputTokens             int64 `json:"output_tokens"`
	CacheCreationInputTokens int64 `json:"cache_creation_input_tokens"`
	CacheReadInputTokens     int64 `json:"cache_read_input_tokens"`
}

// usage converts claude's counts (input_tokens excludes cache reads and
// writes) to aq's (cached and cache-write input are part of TokensIn).
func (u claudeUsage) usage() Usage {
	return Usage{
		TokensIn:         u.InputTokens + u.CacheCreationInputTokens + u.CacheReadInputTokens,
		TokensOut:        u.OutputTokens,
		TokensCached:     u.CacheReadInputTokens,
		TokensCacheWrite: u.CacheCreationInputTokens,
	}
}

type claudeCall struct {
	model string
	usage claudeUsage
	main  bool // the main agent's call, not a subagent's
}

// claudeParser turns claude's stream into a Result. stdout and stderr
// arrive on different goroutines.
type claudeParser struct {
	prices *PriceTable
	meter  Meter
	final  func()

	streamLog // mu guards the fields below
	model     string
	version   string
	sessionID string
	keySource string // the init event's apiKeySource
	calls     map[string]*claudeCall
	order     []string
	anon      int
	result    *claudeEvent
	apiError  string // the last assistant event's error field
	errText   tail   // the text of assistant events that carried an error
	// rejected is the last rate_limit_event that said rejected, unless a
	// later one said allowed again; limitNote says why an event was unread.
	rejected  *claudeRateLimit
	limitNote string
	noProgress
	refused *EgressRefusal // the proxy's refusal the failure quoted

	now func() time.Time // when "resets 3pm" is read; time.Now
}

func newClaudeParser(model string, prices *PriceTable, meter Meter, final func()) *claudeParser {
	if prices == nil {
		prices = DefaultPrices()
	}
	return &claudeParser{
		prices: prices, meter: meter, final: final, model: model,
		calls: map[string]*claudeCall{}, errText: tail{n: 5}, streamLog: streamLog{errLines: tail{n: 20}},
		now: time.Now,
	}
}

func (p *claudeParser) onStdout(line []byte) {
	var ev claudeEvent
	if err := json.Unmarshal(line, &ev); err != nil || ev.Type == "" {
		p.skip(line)
		return
	}
	var (
		observe, stall bool
		u              Usage
	)
	p.mu.Lock()
	switch ev.Type {
	case "system":
		if ev.Subtype == "api_retry" && (ev.ErrorStatus == nil || *ev.ErrorStatus != 429) {
			// A rate limit (429) is not the API out of reach: its own
			// events and result say until when.
			what := rawText(ev.Error)
			if ev.ErrorStatus != nil {
				what += " (status " + strconv.Itoa(*ev.ErrorStatus) + ")"
			} else {
				what += " (no answer)"
			}
			stall = p.retry("claude", "api_retry", fmt.Sprintf("attempt %d/%d, %s", ev.Attempt, ev.MaxRetries, strings.TrimSpace(what)))
		}
		if ev.Subtype == "init" {
			if ev.Model != "" {
				p.model = ev.Model
			}
			p.version = ev.Version
			p.sessionID = ev.SessionID
			p.keySource = ev.APIKeySource
		}
	case "assistant":
		// Only an error on the last assistant event speaks for the end of
		// the run: claude may have recovered from an earlier one.
		if e := rawText(ev.Error); e != "" {
			p.apiError = e
			p.errText.add(assistantText(ev))
		} else {
			p.apiError, p.errText = "", tail{n: 5}
		}
		if m := ev.Message; m != nil && m.Usage != nil && !strings.HasPrefix(m.Model, "<") {
			p.progress() // the API answered ("<synthetic>": claude's own error message)
		}
		if m := ev.Message; m != nil && m.Usage != nil {
			id := m.ID
			if id == "" {
				p.anon++
				id = "anon-" + strconv.Itoa(p.anon)
			}
			call := p.calls[id]
			if call == nil {
				call = &claudeCall{}
				p.calls[id] = call
				p.order = append(p.order, id)
			}
			call.model = m.Model
			call.usage = *m.Usage // each block repeats the message's usage so far
			call.main = ev.ParentToolUseID == nil || *ev.ParentToolUseID == ""
			u, observe = p.liveUsage(), true
		}
	case "rate_limit_event":
		var info claudeRateLimit
		switch err := json.Unmarshal(ev.RateLimitInfo, &info); {
		case err != nil:
			p.limitNote = "a rate_limit_event's rate_limit_info is unreadable: " + brief.OneLine(err.Error(), 120)
		case info.Status == "rejected":
			p.rejected = &info
		case info.Status == "allowed" || info.Status == "allowed_warning":
			p.rejected = nil // the limit lifted, or overage took over
		}
	case "result":
		r := ev
		p.result = &r
		if ev.SessionID != "" {
			p.sessionID = ev.SessionID
		}
		if ev.Usage != nil || ev.TotalCostUSD != nil {
			u, observe = p.finalUsage(), true
		}
	}
	p.mu.Unlock()
	if stall {
		p.stop()
	}
	if ev.Type == "result" && p.final != nil {
		p.final()
	}
	if observe && p.meter != nil {
		p.meter.Observe(u)
	}
}

// liveUsage sums the API calls seen so far, priced from the table.
func (p *claudeParser) liveUsage() Usage {
	var total Usage
	for _, id := range p.order {
		call := p.calls[id]
		u := call.usage.usage()
		model := call.model
		if model == "" || strings.HasPrefix(model, "<") { // "<synthetic>" error messages
			model = p.model
		}
		total.CostUSD += p.prices.Cost(model, u)
		total.TokensIn += u.TokensIn
		total.TokensOut += u.TokensOut
		total.TokensCached += u.TokensCached
		total.TokensCacheWrite += u.TokensCacheWrite
		if call.main {
			total.Turns++
		}
	}
	total.Estimated = true
	return total
}

// finalUsage is the result event's own accounting, falling back to the live
// sums for what it lacks.
func (p *claudeParser) finalUsage() Usage {
	u := p.liveUsage()
	r := p.result
	if r.Usage != nil {
		ru := r.Usage.usage()
		u.TokensIn, u.TokensOut, u.TokensCached, u.TokensCacheWrite = ru.TokensIn, ru.TokensOut, ru.TokensCached, ru.TokensCacheWrite
	}
	if r.TotalCostUSD != nil {
		u.CostUSD, u.Estimated = *r.TotalCostUSD, false
	}
	if r.NumTurns > 0 {
		u.Turns = r.NumTurns
	}
	return u
}

// rawText is a JSON string's value, or other JSON compacted to text; ""
// for nothing or null.
func rawText(raw json.RawMessage) string {
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s
	}
	if t := strings.TrimSpace(string(raw)); t != "null" {
		return t
	}
	return ""
}

// rawTexts is a JSON array's elements as text (rawText of each), or the
// value itself as one text.
func rawTexts(raw json.RawMessage) []string {
	var items []json.RawMessage
	if json.Unmarshal(raw, &items) != nil {
		if t := rawText(raw); t != "" {
			return []string{t}
		}
		return nil
	}
	out := make([]string, 0, len(items))
	for _, it := range items {
		if t := rawText(it); t != "" {
			out = append(out, t)
		}
	}
	return out
}

func assistantText(ev claudeEvent) string {
	if ev.Message == nil {
		return rawText(ev.Error)
	}
	var blocks []struct {
		Type string `json:"type"`
		Text string `json:"text"`
	}
	_ = json.Unmarshal(ev.Message.Content, &blocks)
	var b strings.Builder
	b.WriteString(rawText(ev.Error))
	for _, bl := range blocks {
		if bl.Text != "" {
			b.WriteString(": ")
			b.WriteString(bl.Text)
		}
	}
	return b.String()
}

// claudeNoSession is what claude says when --resume names a session it
// does not have (claude 2.1.258: a result with subtype
// error_during_execution, is_error, this in errors[] and on stderr, exit 1).
const claudeNoSession = "no conversation found"

// containsFold reports whether any of texts contains sub, ignoring case.
func containsFold(texts []string, sub string) bool {
	for _, t := range texts {
		if strings.Contains(strings.ToLower(t), sub) {
			return true
		}
	}
	return false
}

// claudeUnavailableErrors are the assistant event error values that are not
// the task's fault (Agent SDK SDKAssistantMessageError).
var claudeUnavailableErrors = map[string]string{
	"authentication_failed": "auth failed",
	"billing_error":         LimitCredits,
	"rate_limit":            LimitRate,
	"server_error":          "API error", // 5xx, timeouts, the API out of reach
}

// finish decides the outcome once the process is gone. graceStop says aq
// stopped claude only because it outlived its result event.
func (p *claudeParser) finish(pres process.Result, graceStop bool) (res Result) {
	p.mu.Lock()
	defer p.mu.Unlock()
	res = Result{
		SessionID: p.sessionID, Version: p.version, Model: p.model,
		ExitCode: pres.ExitCode, Process: pres, SkippedLines: p.skipped,
		Usage: p.liveUsage(),
	}
	if len(p.order) == 0 {
		res.Usage = Usage{}
	}
	defer func() { res.Detail = p.withSkipped(res.Detail, "stream") }()

	if p.stalled != "" && pres.Stopped && errors.Is(pres.StopCause, errNoProgress) {
		res.Outcome, res.Subtype, res.Detail, res.NoProgress = Unavailable, "no_api_progress", p.stalled, true
		return res
	}
	r := p.result
	if r == nil {
		res.resumeMissing = containsFold([]string{p.errLines.String()}, claudeNoSession)
		if pres.Stopped && !graceStop {
			res.Outcome, res.Detail = Stopped, stopDetail("claude", pres)
			return res
		}
		if kind, ex, ok := p.unavailable(nil); ok {
			res.Subtype = "no_result"
			p.classify(&res, kind, ex)
			return res
		}
		res.Outcome, res.Subtype = TaskFailed, "no_result"
		res.Detail = fmt.Sprintf("claude printed no result event (%s%s)", exitText(pres), stderrSuffix(p.errLines))
		return res
	}

	res.Subtype, res.FinalText = r.Subtype, r.Result
	res.resumeMissing = r.IsError && containsFold(append(rawTexts(r.Errors), p.errLines.String()), claudeNoSession)
	if r.Usage != nil || r.TotalCostUSD != nil || r.NumTurns > 0 {
		res.Usage = p.finalUsage()
	}
	switch {
	case r.Subtype == "success" && !r.IsError:
		res.Outcome = Succeeded
	case r.Subtype == "error_max_budget_usd":
		res.Outcome, res.BudgetExceeded = Stopped, true
		res.Detail = fmt.Sprintf("claude stopped at its --max-budget-usd after spending $%.4f", res.Usage.CostUSD)
	case r.Subtype == "error_max_turns":
		res.Outcome = TaskFailed
		res.Detail = fmt.Sprintf("claude reached --max-turns after %d turns without finishing", res.Usage.Turns)
	default:
		if kind, ex, ok := p.unavailable(r); ok {
			p.classify(&res, kind, ex)
			break
		}
		res.Outcome = TaskFailed
		why := r.Result
		if errs := rawTexts(r.Errors); len(errs) > 0 {
			why = strings.Join(errs, "; ")
		}
		res.Detail = fmt.Sprintf("claude result %s (is_error %t): %s", r.Subtype, r.IsError, orNone(brief.OneLine(why, 300)))
	}
	return res
}

// classify sets an Unavailable outcome, or Limited for a rate limit, usage
// limit or exhausted credit, with its reset time: from the last rejected
// rate_limit_event, else from the text ("resets 2pm (Europe/Berlin)",
// "…limit reached|<epoch>"). The caller holds mu.
func (p *claudeParser) classify(res *Result, kind, excerpt string) {
	if kind == kindEgressRefused && p.refused != nil {
		res.Outcome, res.Detail, res.EgressRefused = Unavailable, refusedDetail("claude", p.refused), p.refused
		return
	}
	lk := limitKind(kind)
	if lk == "" {
		res.Outcome, res.Detail = Unavailable, "claude is unavailable ("+kind+"): "+excerpt
		if strings.HasPrefix(kind, "auth") {
			res.Detail += claudeLoginHint(p.keySource)
		}
		return
	}
	lim := &Limit{Kind: lk, Note: p.limitNote}
	if rj := p.rejected; rj != nil {
		if lk == LimitRate && rj.RateLimitType != "" {
			lim.Kind = LimitUsage // a subscription window, not a per-minute limit
		}
		if rj.OverageDisabledReason == "out_of_credits" || rj.ErrorCode == "credits_required" {
			lim.Kind = LimitCredits
		}
		t, note, ok := epochReset(rj.ResetsAt)
		if ok {
			lim.ResetAt, lim.Source = t, "rate_limit_event"
		} else if note != "" {
			lim.Note = note
		}
	}
	if lim.ResetAt.IsZero() {
		texts := []string{excerpt, p.errText.String()}
		if p.result != nil {
			texts = append([]string{p.result.Result, strings.Join(rawTexts(p.result.Errors), "; ")}, texts...)
		}
		for _, t := range texts {
			at, note, ok := textReset(t, p.now(), time.UTC)
			if ok {
				lim.ResetAt, lim.Source, lim.Note = at, "text", ""
				break
			}
			if note != "" && lim.Note == "" {
				lim.Note = note
			}
		}
	}
	res.Outcome, res.Limit = Limited, lim
	res.Detail = "claude " + lim.Kind + ": " + excerpt
}

// claudeLoginHint names the login a refused or expired credential came
// from (the init event's apiKeySource), so the operator fixes that one.
func claudeLoginHint(source string) string {
	switch source {
	case "":
		return ""
	case "none":
		return " — claude's login: no API key, its OAuth login if any: log in again (`claude`, or `claude setup-token` for CLAUDE_CODE_OAUTH_TOKEN) or set ANTHROPIC_API_KEY"
	}
	return " — claude's login: " + source + ": check or replace it"
}

// unavailable looks for a not-the-task's-fault failure in what claude said
// about the failure: the result's HTTP status, its text and errors[], the
// assistant events that carried an error, stderr; and last the assistant
// error field's category.
func (p *claudeParser) unavailable(r *claudeEvent) (kind, excerpt string, ok bool) {
	texts := []string{p.errText.String(), p.errLines.String()}
	if r != nil {
		texts = append([]string{r.Result, strings.Join(rawTexts(r.Errors), "\n")}, texts...)
	}
	// The job's egress proxy refused the call: its own marker, before any
	// status (its 403 is not the API refusing the login).
	if ref, ok := egressRefusal(texts...); ok {
		p.refused = ref
		return kindEgressRefused, refusedDetail("claude", ref), true
	}
	if r != nil {
		texts = texts[2:]
		errs := strings.Join(rawTexts(r.Errors), "; ")
		why := r.Result
		if why == "" {
			why = errs
		}
		status := fmt.Sprintf("API error status %d: %s", r.APIErrorStatus, orNone(brief.OneLine(why, 200)))
		switch s := r.APIErrorStatus; {
		case s == 401 || s == 403:
			return "auth failed", status, true
		case s == 429:
			return "rate limit", status, true
		case s == 529:
			return "overloaded", status, true
		}
		texts = append([]string{r.Result, errs}, texts...)
	}
	if kind, ex, ok := unavailableReason(texts...); ok {
		return kind, ex, true
	}
	if k, found := claudeUnavailableErrors[p.apiError]; found {
		return k, orNone(brief.OneLine(p.errText.last(), 240)), true
	}
	if rj := p.rejected; rj != nil && (r == nil || r.IsError) {
		// The run failed after claude said the account's limit rejected it.
		why := "rate_limit_event rejected (" + orNone(rj.RateLimitType) + ")"
		if r != nil && r.Result != "" {
			why += ": " + brief.OneLine(r.Result, 200)
		}
		return LimitUsage, why, true
	}
	return "", "", false
}
