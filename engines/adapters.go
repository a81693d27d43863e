package engines

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io/fs"
	"os/exec"
	"regexp"
	"strings"
	"sync"
	"time"

	"github.com/aqfleet/aq/internal/brief"
	"github.com/aqfleet/aq/internal/process"
	"github.com/aqfleet/aq/internal/secrets"
)

// What the claude, codex and devin adapters share: finding the binary on the
// engine's PATH, the cheap --version probe, recognising "not the task's
// fault" failures in engine text, and the one-line progress format.

// DefaultVersionTimeout bounds the --version probe of a pre-flight
// (AQ_ENGINE_PROBE_TIMEOUT): generous, as a cold start of a large CLI on a
// busy host takes long, and one that times out only leaves the version
// unknown.
const DefaultVersionTimeout = 60 * time.Second

// DefaultResultGrace is how long an engine may keep running after it printed
// its final event (claude's result, codex's turn.completed) before aq stops
// it through the kill ladder. Claude has been seen to hang there
// (anthropics/claude-code#25629); the outcome is already known.
const DefaultResultGrace = 30 * time.Second

// errResultGrace is the cause an adapter cancels its own run with when the
// engine outlives DefaultResultGrace after its final event.
var errResultGrace = errors.New("the engine kept running after its final event")

// findEngine resolves bin against the PATH in env (the engine's own),
// returning ErrNotInstalled (→ no_engine) when it is not there.
func findEngine(name, bin string, env []string) (string, error) {
	if strings.ContainsRune(bin, '/') {
		if _, err := exec.LookPath(bin); err != nil {
			return "", notInstalled(name, bin)
		}
		return bin, nil
	}
	p, err := lookPathIn(bin, env)
	if err != nil {
		return "", notInstalled(name, bin)
	}
	return p, nil
}

// preflight is the pre-flight the coding engines share: the binary on the
// engine's PATH, its --version, its --help (the flags aq passes: a missing
// required one refuses the engine), and, when authMissing is set, whether
// any credential can exist (authMissing says why none can, or "").
func preflight(ctx context.Context, name, bin string, spec Spec, timeout, helpTimeout time.Duration, cache *ProbeCache, authMissing func(env []string) string) (Info, error) {
	spec = engineSpec(spec)
	path, err := findEngine(name, bin, spec.Env)
	if err != nil {
		return Info{}, err
	}
	v, err := cache.Version(ctx, path, func() (string, error) { return probeVersion(ctx, name, path, spec, timeout) })
	var ue *UnavailableError
	if errors.As(err, &ue) && ue.TimedOut {
		// A busy host, not a missing engine: its version is unknown for
		// now (not kept: probed again next time).
		v, err = "unknown ("+ue.Why+")", nil
	}
	if err != nil {
		return Info{}, err
	}
	spec.Flags = nil // the binary on PATH now, not what a caller probed before
	flags, err := usableFlags(ctx, name, path, spec, helpTimeout, cache)
	if err != nil {
		return Info{}, err
	}
	if authMissing != nil {
		if why := authMissing(spec.Env); why != "" {
			return Info{}, &UnavailableError{Engine: name, Why: why}
		}
	}
	return Info{Name: name, Path: path, Version: v, Flags: flags}, nil
}

// streamParser reads an engine that prints JSON events (claude, codex).
type streamParser interface {
	onStdout(line []byte)
	onStderr(line []byte)
	// finish decides the outcome once the process is gone. graceStop says
	// aq stopped the engine only because it outlived its final event.
	finish(pres process.Result, graceStop bool) Result
}

// runStreaming runs an event-printing engine: the prompt on stdin, each
// output line to the parser that newParser makes, and the kill ladder once
// the engine outlives grace after its final event (the parser calls final
// on it). The result's detail and final text are redacted.
func runStreaming(ctx context.Context, spec Spec, name, bin string, inv Invocation, grace time.Duration, newParser func(final func()) streamParser) (Result, error) {
	runCtx, final, stop, abort := graceAfterFinal(ctx, grace)
	defer stop()
	p := newParser(final)
	if w, ok := p.(interface {
		watch(max int, endpoint string, abort func(error))
	}); ok {
		w.watch(spec.MaxAPIRetries, apiEndpoint(name, spec.Env), abort)
	}
	inv.Stdin, inv.OnStdout, inv.OnStderr = strings.NewReader(spec.Prompt), p.onStdout, p.onStderr
	pres, err := Exec(runCtx, spec, inv)
	if err != nil {
		return Result{}, startError(name, bin, err)
	}
	res := p.finish(pres, stoppedByGrace(ctx, pres))
	res.redact(spec.Redactor)
	return res, nil
}

// redact masks secrets in the text an engine gave (Detail, FinalText).
func (r *Result) redact(rd *secrets.Redactor) {
	r.Detail, r.FinalText = rd.String(r.Detail), rd.String(r.FinalText)
}

// streamLog is what the claude and codex parsers share: their lock, the
// last lines of stderr, and the stdout lines that were not events.
type streamLog struct {
	mu       sync.Mutex
	errLines tail
	skipped  int
	lastSkip string
}

func (s *streamLog) onStderr(line []byte) {
	s.mu.Lock()
	s.errLines.add(string(line))
	s.mu.Unlock()
}

// skip counts a stdout line that is not an event.
func (s *streamLog) skip(line []byte) {
	s.mu.Lock()
	s.skipped++
	s.lastSkip = brief.OneLine(string(line), 120)
	s.mu.Unlock()
}

// withSkipped appends to detail how many lines were skipped (what names
// them: "stream", "event"), when any were; the caller holds mu.
func (s *streamLog) withSkipped(detail, what string) string {
	if s.skipped == 0 {
		return detail
	}
	return strings.TrimSpace(detail + fmt.Sprintf(" (skipped %d unparseable %s line(s), last: %q)", s.skipped, what, s.lastSkip))
}

// startError maps an Exec start failure: a binary that vanished between
// pre-flight and run is ErrNotInstalled.
func startError(name, bin string, err error) error {
	if errors.Is(err, exec.ErrNotFound) || errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("%w: %w", notInstalled(name, bin), err)
	}
	return err
}

// probeVersion runs `path --version` in the engine's environment, bounded by
// timeout, through the process layer (own group, leftovers killed) but not
// through Exec's job logs, and returns the first line it printed.
func probeVersion(ctx context.Context, name, path string, spec Spec, timeout time.Duration) (string, error) {
	if timeout <= 0 {
		timeout = DefaultVersionTimeout
	}
	parent := ctx
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	// stdout and stderr apart: the version is stdout's first line, and a
	// warning on stderr is not it (codex 0.171.0 with its home under /tmp
	// warns "WARNING: proceeding, even though we could not create PATH
	// aliases: …" on stderr before "codex-cli 0.171.0" on stdout).
	var out, errOut limitedBuffer
	out.max, errOut.max = 4<<10, 4<<10
	tag := "aq-preflight-" + name + "-" + spec.JobID
	if spec.JobID == "" {
		tag += newUUID()
	}
	res, err := process.Run(ctx, process.Spec{
		Path: path, Args: []string{"--version"}, Dir: spec.Dir, Env: spec.Env,
		Stdout: &out, Stderr: &errOut, Tag: tag, Grace: 500 * time.Millisecond,
	})
	if err != nil {
		if errors.Is(err, exec.ErrNotFound) || errors.Is(err, fs.ErrNotExist) {
			return "", notInstalled(name, path)
		}
		return "", &UnavailableError{Engine: name, Why: fmt.Sprintf("%s --version could not run: %v", path, err)}
	}
	first := brief.FirstLine(out.String(), 200)
	if first == "" {
		first = brief.FirstLine(errOut.String(), 200)
	}
	switch {
	case res.Stopped && parent.Err() == nil:
		return "", &UnavailableError{Engine: name, Why: fmt.Sprintf("%s --version did not answer within %s", path, timeout), TimedOut: true}
	case res.Stopped:
		return "", &UnavailableError{Engine: name, Why: fmt.Sprintf("%s --version was interrupted", path)}
	case res.ExitCode != 0:
		return "", &UnavailableError{Engine: name, Why: fmt.Sprintf("%s --version exited %d: %s", path, res.ExitCode, orNone(versionFailure(out.String()+"\n"+errOut.String())))}
	case first == "":
		return "", &UnavailableError{Engine: name, Why: path + " --version printed nothing"}
	}
	return first, nil
}

// versionFailure is the line of a failed --version's output that says
// why: an uncaught error's own line where Node printed its trace around it
// (its first line is the throwing file:line — codex's npm launcher without
// its native binary prints "file:///…/bin/codex.js:108", then "Error:
// Missing optional dependency @openai/codex-linux-x64. Reinstall Codex: npm
// install -g @openai/codex@latest"), else the first line.
func versionFailure(out string) string {
	for line := range strings.Lines(out) {
		if line = strings.TrimSpace(line); errorLine().MatchString(line) {
			return brief.Clip(line, 200)
		}
	}
	return brief.FirstLine(out, 200)
}

// errorLine is an error's own line in a trace: "Error: …", "TypeError: …".
var errorLine = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^(?:[A-Z][A-Za-z]*)?Error: \S`) })

// exitText is how an engine's process ended: "exit 1", or "killed by
// SIGKILL" (its exit status is then -1, which says nothing).
func exitText(pres process.Result) string {
	if pres.Signal != "" {
		return "killed by " + pres.Signal
	}
	return fmt.Sprintf("exit %d", pres.ExitCode)
}

func orNone(s string) string {
	if s == "" {
		return "(no output)"
	}
	return s
}

// limitedBuffer keeps the first max bytes written to it. It is safe for
// concurrent use (stdout and stderr may share it).
type limitedBuffer struct {
	mu  sync.Mutex
	max int
	buf bytes.Buffer
}

func (b *limitedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if room := b.max - b.buf.Len(); room > 0 {
		b.buf.Write(p[:min(len(p), room)])
	}
	return len(p), nil
}

func (b *limitedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// tail keeps the last n lines handed to it (stderr, devin's answer). The
// zero value keeps nothing; callers hold their own lock.
type tail struct {
	n     int
	lines []string
}

func (t *tail) add(line string) {
	if t.n <= 0 {
		return
	}
	t.lines = append(t.lines, brief.Clip(line, 2000))
	if len(t.lines) > t.n {
		t.lines = append(t.lines[:0:0], t.lines[len(t.lines)-t.n:]...)
	}
}

func (t *tail) String() string { return strings.Join(t.lines, "\n") }

func (t *tail) last() string {
	if len(t.lines) == 0 {
		return ""
	}
	return t.lines[len(t.lines)-1]
}

// envValue returns the last value of key in env.
func envValue(env []string, key string) string {
	v := ""
	for _, kv := range env {
		if k, val, ok := strings.Cut(kv, "="); ok && k == key {
			v = val
		}
	}
	return v
}

// withEnv returns a copy of env with each KEY=VALUE in set replacing any
// entry of that key.
func withEnv(env []string, set ...string) []string {
	drop := map[string]bool{}
	for _, kv := range set {
		k, _, _ := strings.Cut(kv, "=")
		drop[k] = true
	}
	out := make([]string, 0, len(env)+len(set))
	for _, kv := range env {
		k, _, _ := strings.Cut(kv, "=")
		if !drop[k] {
			out = append(out, kv)
		}
	}
	return append(out, set...)
}

// engineSpec is spec with the environment every engine gets: aq's secrets
// and inherited agent markers (CLAUDECODE, …) removed. The runner already
// passes secrets.EngineEnv; doing it again here costs nothing and keeps a
// caller that forgot from leaking aq's tokens or nesting markers.
func engineSpec(spec Spec) Spec {
	spec.Env = secrets.EngineEnv(spec.Env)
	return spec
}

// unavailablePatterns recognise failures that are not the task's fault:
// expired or missing credentials, usage and rate limits, exhausted credit,
// an overloaded API. They are only ever applied to text an engine gave as
// the reason it failed, never to a successful run's output.
var unavailablePatterns = sync.OnceValue(func() []unavailablePattern {
	return []unavailablePattern{
		{regexp.MustCompile(`(?i)oauth token (has )?expired|token (has )?expired|token_expired|could not be refreshed|refresh_token|re-?authenticate|log ?in again|sign in again`), "auth expired"},
		{regexp.MustCompile(`(?i)authentication_error|authentication_failed|failed to authenticate|invalid api key|invalid x-api-key|invalid bearer|please run /login|not logged in|not authenticated|login required|missing bearer|\bunauthori[sz]ed\b|\b401\b`), "auth failed"},
		{regexp.MustCompile(`(?i)out of credits|out of (usage|extra) (credits|usage)|credit balance is too low|insufficient_quota|billing_error|payment required|\b402\b|spend (cap|limit)|credits_required`), LimitCredits},
		{regexp.MustCompile(`(?i)usage limit|usage_limit|hit your ([\w']+ ){0,3}limit|limit reached|quota exceeded|exceeded your current quota`), LimitUsage},
		{regexp.MustCompile(`(?i)rate limit|rate_limit|too many requests|\b429\b`), LimitRate},
		{regexp.MustCompile(`(?i)overloaded|\b529\b`), "overloaded"},
		// The API out of reach (offline, DNS, a proxy): claude retries ten
		// times then says "API Error: Unable to connect to API
		// (ConnectionRefused)"; codex says "Reconnecting... waiting for
		// network (Connection failed: error sending request)" (both recorded).
		{regexp.MustCompile(`(?i)unable to connect to api|connection ?refused|econnrefused|enotfound|getaddrinfo|failed to lookup address|waiting for network|error sending request`), "API unreachable"},
		// Something between the engine and the API answered instead of it (an
		// HTML page, a cut body): claude 2.1.332 says "API Error: API returned
		// an empty or malformed response (HTTP 200) — check for a proxy or
		// gateway intercepting the request." (recorded against
		// internal/fakellm). Not the task's fault: another factory's way out
		// may be fine.
		{regexp.MustCompile(`(?i)empty or malformed response|malformed response from (the )?api`), "API answered garbage"},
	}
})

// unavailablePattern is one of them: the words, and the kind they name.
type unavailablePattern struct {
	re   *regexp.Regexp
	kind string
}

// unavailableReason reports whether any of texts says the engine cannot work
// now for a reason that is not the task's (→ engine_unavailable), and what.
func unavailableReason(texts ...string) (kind, excerpt string, ok bool) {
	for _, p := range unavailablePatterns() {
		for _, t := range texts {
			if loc := p.re.FindStringIndex(t); loc != nil {
				return p.kind, excerptAround(t, loc[0]), true
			}
		}
	}
	return "", "", false
}

// excerptAround returns about 240 bytes of s around index i, on one line.
func excerptAround(s string, i int) string {
	from := max(0, i-80)
	if from > 0 {
		if sp := strings.IndexByte(s[from:i], ' '); sp >= 0 {
			from += sp + 1 // start on a word
		}
	}
	to := min(len(s), i+160)
	ex := strings.Join(strings.Fields(s[from:to]), " ")
	if from > 0 {
		ex = "…" + ex
	}
	if to < len(s) {
		ex += "…"
	}
	return ex
}

// newUUID returns a random (version 4) UUID.
func newUUID() string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // never fails (crypto/rand)
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:16])
}

var uuidPattern = sync.OnceValue(func() *regexp.Regexp {
	return regexp.MustCompile(`^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$`)
})

// graceAfterFinal stops a run whose engine outlives grace after its final
// event: it returns a context for the run and a function to call when that
// event arrives. stop releases the timer; call it when the run is over.
//
// abort stops the run at once with a cause (errNoProgress).
func graceAfterFinal(ctx context.Context, grace time.Duration) (runCtx context.Context, final func(), stop func(), abort func(error)) {
	if grace <= 0 {
		grace = DefaultResultGrace
	}
	runCtx, cancel := context.WithCancelCause(ctx)
	var (
		mu    sync.Mutex
		timer *time.Timer
		done  bool
	)
	final = func() {
		mu.Lock()
		defer mu.Unlock()
		if timer == nil && !done {
			timer = time.AfterFunc(grace, func() { cancel(errResultGrace) })
		}
	}
	stop = func() {
		mu.Lock()
		done = true
		if timer != nil {
			timer.Stop()
		}
		mu.Unlock()
		cancel(nil)
	}
	abort = func(cause error) { cancel(cause) }
	return runCtx, final, stop, abort
}

// stoppedByGrace reports whether the kill ladder ran only because the engine
// outlived its final event (and not because the caller stopped the run).
func stoppedByGrace(parent context.Context, pres process.Result) bool {
	return pres.Stopped && errors.Is(pres.StopCause, errResultGrace) && parent.Err() == nil
}

// stopDetail says why aq stopped a run, for Result.Detail.
func stopDetail(name string, pres process.Result) string {
	d := "stopped by aq"
	if pres.StopCause != nil {
		d += ": " + pres.StopCause.Error()
	}
	if pres.LadderStep != "" {
		d += " (" + pres.LadderStep + ")"
	}
	return name + " " + d
}

// FormatProgress is the one-line live progress of a running engine, e.g.
//
//	claude  12 turns  182.4k tok (176.0k in, 6.4k out)  $0.4213  3m05s
//
// A cost metered from the price table rather than reported by the engine is
// prefixed with "~".
func FormatProgress(name string, u Usage, elapsed time.Duration) string {
	cost := fmt.Sprintf("$%.4f", u.CostUSD)
	if u.Estimated {
		cost = "~" + cost
	}
	turns := "1 turn"
	if u.Turns != 1 {
		turns = fmt.Sprintf("%d turns", u.Turns)
	}
	return fmt.Sprintf("%s  %s  %s tok (%s in, %s out)  %s  %s",
		name, turns, humanCount(u.Tokens()), humanCount(u.TokensIn), humanCount(u.TokensOut), cost, humanDuration(elapsed))
}

func humanCount(n int64) string {
	switch {
	case n < 0:
		return "-" + humanCount(-n)
	case n < 1000:
		return fmt.Sprintf("%d", n)
	case n < 1_000_000:
		return fmt.Sprintf("%.1fk", float64(n)/1e3)
	default:
		return fmt.Sprintf("%.1fM", float64(n)/1e6)
	}
}

func humanDuration(d time.Duration) string {
	if d < 0 {
		d = 0
	}
	d = d.Round(time.Second)
	h, m, s := int(d/time.Hour), int(d/time.Minute)%60, int(d/time.Second)%60
	if h > 0 {
		return fmt.Sprintf("%dh%02dm%02ds", h, m, s)
	}
	return fmt.Sprintf("%dm%02ds", m, s)
}
