// Package engines owns the coding engines aq drives — claude, codex, devin and
// script — behind one interface, and the one place where an engine process is
// started (Exec): its own process group, the prompt on stdin, stdout and
// stderr streamed to redacted log files, the AQ_JOB_ID tag, the kill ladder.
//
// Each adapter turns its engine's machine-readable output into one normalised
// Result, deciding the outcome from what the engine printed, not from its exit
// code alone (docs/engines.md). The package is a leaf: it never imports
// agent/ or cmd/.
package engines

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/aqfleet/aq/internal/process"
	"github.com/aqfleet/aq/internal/safefs"
	"github.com/aqfleet/aq/internal/secrets"
)

// Engine is one coding engine.
type Engine interface {
	// Name is the manifest's engine: value (claude, codex, devin, script).
	Name() string
	// Preflight is a cheap check before any worktree is made: the binary is
	// present, its version readable, its auth present where the engine can
	// tell. It returns ErrNotInstalled (→ no_engine) or an *UnavailableError
	// (→ engine_unavailable).
	Preflight(ctx context.Context, spec Spec) (Info, error)
	// Run runs the engine once. A returned error means it could not start
	// (wraps ErrNotInstalled when the binary is gone); every outcome of a run
	// that started is in Result.
	Run(ctx context.Context, spec Spec) (Result, error)
}

// Info describes an installed engine.
type Info struct {
	Name    string `json:"name"`
	Path    string `json:"path"`
	Version string `json:"version"`
	// Flags is what the --help probe found (nil for an engine aq does not
	// probe: script).
	Flags *FlagSet `json:"flags,omitempty"`
}

// Spec is everything an engine needs for one run.
type Spec struct {
	JobID string
	// Scope names the aq home running the job (AQ_SCOPE); see process.Spec.
	Scope   string
	Dir     string // the job's worktree: the engine's working directory
	Prompt  string // the task; includes the persona unless the engine takes it separately
	Persona string // the profile's persona (claude: --append-system-prompt)
	Model   string
	Script  string // engine: script — the command to run
	Budget  Budget
	// SessionID is chosen by aq (claude --session-id) and recorded.
	SessionID string
	// PermissionMode is claude's --permission-mode (devin's bypass when it
	// is bypassPermissions); "" is DefaultPermissionMode.
	PermissionMode string
	// CodexSandbox is codex's --sandbox; "" is workspace-write. Inside
	// aq's sandbox the runner passes danger-full-access: codex's own
	// sandbox would only take the network away again (docs/sandbox.md).
	CodexSandbox string
	// LogDir receives stdout.log and stderr.log (appended, redacted).
	LogDir string
	// LogMax bounds what one run stores in each log (AQ_LOG_MAX; 0: the
	// default): its head and tail kept, a gap record between
	// (internal/boundlog).
	LogMax int64
	// Attempt numbers the run in the log headers.
	Attempt int
	// Round numbers a repair round of the attempt (0: its first run) and
	// Rounds the repair rounds the job allows; a round's log header says
	// "repair Round/Rounds".
	Round, Rounds int
	// Resume asks a repair round to continue the engine's own session of
	// the run before it (docs/engines.md, "Repair rounds"): an engine that
	// can (claude --resume, codex exec resume) runs Resume.Prompt in that
	// session and sets Result.Resumed; one that cannot, or whose session is
	// gone, runs Prompt from the start and says why in Result.ResumeNote.
	Resume *Resume
	// Env is the engine's environment: the host's minus aq's secrets.
	Env []string
	// Grace is the wait between steps of the kill ladder.
	Grace time.Duration
	// Supervisor stops the engine if aq dies first (process.Spec.Supervisor).
	Supervisor string
	// Jail, when set, is the job's sandbox: the engine runs inside it
	// (process.Spec.Jail, internal/sandbox).
	Jail process.Jail
	// StateDir is where aq hands the engine files and the engine leaves
	// files for aq (devin's prompt and trajectory): a directory both reach
	// at this path, in the sandbox and out. "" is LogDir.
	StateDir string
	// Meter receives usage while the engine runs; may be nil.
	Meter Meter
	// Redactor masks secrets in the job logs.
	Redactor *secrets.Redactor
	// Prices meters engines that report tokens but no cost (codex).
	Prices *PriceTable
	// MaxAPIRetries is how many of the engine's retry events in a row, with
	// no answer of its API between, stop the run (0: DefaultMaxAPIRetries).
	MaxAPIRetries int
	// Flags is the engine's --help probe (Info.Flags from Preflight): the
	// invocation leaves out optional flags the CLI lacks. nil: Run probes
	// (through the engine's cache) itself.
	Flags *FlagSet
}

// Resume is the session a repair round continues.
type Resume struct {
	// SessionID is the session the run before reported (Result.SessionID).
	SessionID string
	// Prompt is what the continued session is told: only the failure, as
	// the session has the task already.
	Prompt string
	// Usage is what the session had reported when the run before ended.
	// codex reports its thread's running total, so a resumed run's own
	// usage is what it adds to this.
	Usage Usage
}

// Budget is what one run may spend. Zero means unlimited. Engines that take
// limits as flags (claude --max-turns, --max-budget-usd) pass them on; aq
// enforces USD and tokens itself through the Meter in every case.
type Budget struct {
	USD    float64
	Tokens int64
	Turns  int
}

// Usage is what a run has spent so far (cumulative).
type Usage struct {
	TokensIn     int64   `json:"tokensIn"`
	TokensOut    int64   `json:"tokensOut"`
	TokensCached int64   `json:"tokensCached"`
	CostUSD      float64 `json:"costUsd"`
	Turns        int     `json:"turns"`
	// Estimated is true when CostUSD was computed from a price table rather
	// than reported by the engine.
	Estimated bool `json:"estimated,omitempty"`

	// TokensCacheWrite is the part of TokensIn written to a prompt cache
	// (claude's cache_creation_input_tokens), which some models charge
	// above the plain input rate. 0 when the engine does not report it.
	TokensCacheWrite int64 `json:"tokensCacheWrite,omitempty"`
}

// Tokens is the total the token budget is measured against: input + output
// (cached input is part of input as the engines report it).
func (u Usage) Tokens() int64 { return u.TokensIn + u.TokensOut }

// Plus is u and v summed: two runs' spending (Estimated when either was).
func (u Usage) Plus(v Usage) Usage {
	return Usage{
		TokensIn: u.TokensIn + v.TokensIn, TokensOut: u.TokensOut + v.TokensOut, TokensCached: u.TokensCached + v.TokensCached,
		CostUSD: u.CostUSD + v.CostUSD, Turns: u.Turns + v.Turns, Estimated: u.Estimated || v.Estimated,
		TokensCacheWrite: u.TokensCacheWrite + v.TokensCacheWrite,
	}
}

// Meter is fed cumulative usage by an engine while it runs; the runner uses
// it to enforce budgets and show progress.
type Meter interface {
	Observe(Usage)
}

// MeterFunc adapts a function to Meter.
type MeterFunc func(Usage)

// Observe calls f.
func (f MeterFunc) Observe(u Usage) { f(u) }

// Outcome is how a run ended, as far as the engine is concerned.
type Outcome string

const (
	// Succeeded: the engine says it finished the task.
	Succeeded Outcome = "success"
	// TaskFailed: the engine ran and could not finish the task (→ engine_failed).
	TaskFailed Outcome = "failed"
	// Unavailable: auth expired or missing, 401, an overloaded API — not
	// the task's fault, retryable (→ engine_unavailable).
	Unavailable Outcome = "unavailable"
	// Limited: the engine's account hit a rate or usage limit or ran out of
	// credit — not the task's fault, and pointless to run again before the
	// limit resets: Result.Limit says which and until when (→ the job is
	// parked, not failed).
	Limited Outcome = "limited"
	// Stopped: aq stopped the engine (timeout, budget, lease, signal); the
	// runner knows why from Result.Process.StopCause.
	Stopped Outcome = "stopped"
)

// Result is one run, normalised across engines.
type Result struct {
	Outcome   Outcome `json:"outcome"`
	Subtype   string  `json:"subtype,omitempty"` // the engine's own word (claude result subtype, codex error type)
	Usage     Usage   `json:"usage"`
	SessionID string  `json:"sessionId,omitempty"`
	FinalText string  `json:"finalText,omitempty"`
	Version   string  `json:"version,omitempty"`
	Model     string  `json:"model,omitempty"`
	ExitCode  int     `json:"exitCode"`
	// Detail says in one line why the outcome is what it is.
	Detail string `json:"detail,omitempty"`
	// BudgetExceeded is set with Outcome Stopped when the engine stopped
	// itself at a budget aq passed it (claude --max-budget-usd →
	// error_max_budget_usd): the runner reports budget_exceeded, as it does
	// when its own Meter stops the engine.
	BudgetExceeded bool `json:"budgetExceeded,omitempty"`
	// NoStructuredOutcome says the engine printed no machine-readable
	// outcome (devin's local CLI): Succeeded then only means it exited 0
	// with an answer, and a run that changed no file should count as
	// engine_failed rather than as a success with nothing to ship.
	NoStructuredOutcome bool `json:"noStructuredOutcome,omitempty"`
	// SkippedLines counts output lines the adapter could not parse (a
	// malformed JSON line mid-stream); they are skipped, not fatal.
	SkippedLines int `json:"skippedLines,omitempty"`
	// Limit is set with Outcome Limited.
	Limit *Limit `json:"limit,omitempty"`
	// NoProgress is set with Outcome Unavailable when aq stopped the run
	// because the engine's API made no progress (DefaultMaxAPIRetries retry
	// events in a row): the endpoint is unreachable, and other jobs of the
	// engine would meet it too (the runner holds the engine).
	NoProgress bool `json:"noProgress,omitempty"`
	// EgressRefused is set with Outcome Unavailable when the engine's API
	// call was refused by aq's egress proxy (its marker in the engine's
	// error): an egress refusal, not a login failure.
	EgressRefused *EgressRefusal `json:"egressRefused,omitempty"`
	// Resumed says the run continued the session Spec.Resume named.
	Resumed bool `json:"resumed,omitempty"`
	// ResumeNote says why a run asked to resume a session started fresh
	// instead (the CLI cannot resume, or the session is gone).
	ResumeNote string `json:"resumeNote,omitempty"`
	// resumeMissing: the engine said the session to resume does not exist.
	resumeMissing bool
	// Process is what the process layer saw (exit, signals, the ladder).
	Process process.Result `json:"-"`
	// Refused are the files of the engine's the adapter would not read or
	// write (a trajectory that is a symbolic link, a FIFO, too big:
	// internal/safefs); the runner records each in the job's insights.
	Refused []*safefs.Refused `json:"-"`
}

// ErrNotInstalled means the engine's binary is not on PATH (→ no_engine).
var ErrNotInstalled = errors.New("engine not installed")

// UnavailableError means the engine is installed but cannot work now: no or
// expired credentials, a --help that hangs or fails, a CLI that lacks a
// flag aq needs (→ engine_unavailable).
type UnavailableError struct {
	Engine string
	Why    string
	// MissingFlags are the required flags the CLI lacks, when that is why.
	MissingFlags []string
	// TimedOut: a probe (--version, --help) did not answer within its
	// deadline — on a busy host, not a sign the engine is missing.
	TimedOut bool
}

func (e *UnavailableError) Error() string { return e.Engine + " is unavailable: " + e.Why }

// notInstalled wraps ErrNotInstalled with the engine name and how to fix it.
func notInstalled(name, bin string) error {
	return fmt.Errorf("%w: %s (no %q on PATH; install it or choose another engine)", ErrNotInstalled, name, bin)
}
