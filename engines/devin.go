package engines

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"github.com/aqfleet/aq/internal/safefs"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/aqfleet/aq/internal/brief"
)

// Devin runs the Devin local CLI ("Devin for Terminal") headless, one turn:
//
//	devin -p --prompt-file <logdir>/devin-prompt-<attempt>.md
//	  --export <logdir>/devin-trajectory-<attempt>.json
//	  --permission-mode normal|bypass [--model M]
//
// The prompt goes through a file in the job's log directory, never argv
// (a long prompt would show in ps and can exceed the argument limit);
// stdin is closed. --permission-mode is bypass when the configured mode is
// claude's bypassPermissions and normal otherwise (devin's documented
// values are normal, dangerous and bypass; in normal mode it edits only
// what the user's devin permissions.allow rules let it).
//
// Devin prints its answer as plain text: no JSON events, no cost, no
// exit-code contract. So the outcome is the exit status: 0 with an answer
// is Succeeded, with Result.NoStructuredOutcome set (the runner should take
// an empty diff as a failure); 0 with no answer, or non-zero, is
// TaskFailed, or Limited when the output says usage limit, rate limit or
// out of credits (with no reset time: devin prints none aq can read), or
// Unavailable when it says auth or overload; Stopped when aq stopped it.
//
// The --export file is the conversation as an ATIF trajectory
// (schema_version "ATIF-v1.x"), written after each turn. aq reads from it:
// session_id; agent.model_name and agent.version; turns, the number of
// steps whose source is "agent" (one model call each); and usage, from
// final_metrics {total_prompt_tokens (cached included), total_cached_tokens,
// total_completion_tokens, total_cost_usd} or, without it, the sum of the
// agent steps' metrics {prompt_tokens, cached_tokens, completion_tokens,
// cost_usd} (older Devin builds keep them in metadata.metrics
// {input_tokens, cache_read_tokens, cache_creation_tokens, output_tokens},
// input excluding the cache). Tokens and cost are reported only when the
// trajectory has them: cost is never estimated for devin. Usage reaches the
// Meter once, at the end: aq's token and USD budgets cannot stop devin
// mid-run, only the wall budget can.
type Devin struct {
	// Bin is the program; default "devin", looked up on the engine's PATH.
	Bin string
	// VersionTimeout bounds the pre-flight's devin --version; 0 means
	// DefaultVersionTimeout.
	VersionTimeout time.Duration
	// HelpTimeout bounds each --help probe; 0 means DefaultHelpTimeout.
	HelpTimeout time.Duration
	// Probes caches the --help probe per binary; nil probes every time.
	Probes *ProbeCache
}

// devinNeeds are the flags Args can pass (HelpSpecs), as documented in
// docs.devin.ai/cli/reference/commands (devin's --help could not be
// recorded: the CLI is not on a public registry).
var devinNeeds = []FlagNeed{
	{Flag: "-p", Aliases: []string{"--print"}, Required: true, Use: "the one-turn headless run"},
	{Flag: "--prompt-file", Required: true, Use: "the prompt, from a file (never argv)"},
	{Flag: "--permission-mode", Required: true, Use: "normal or bypass"},
	{Flag: "--model", Required: true, Use: "the job's model"},
	{Flag: "--export", Use: "the ATIF trajectory aq reads session, turns and usage from; without it devin's usage is unknown"},
}

var _ Engine = (*Devin)(nil)

// Name implements Engine.
func (d *Devin) Name() string { return "devin" }

func (d *Devin) bin() string {
	if d.Bin != "" {
		return d.Bin
	}
	return "devin"
}

// Preflight finds devin on the engine's PATH and reads its version. Devin
// keeps its login where aq cannot cheaply tell (`devin auth status` asks
// the service), so auth is not checked: a run without it fails as
// Unavailable.
func (d *Devin) Preflight(ctx context.Context, spec Spec) (Info, error) {
	return preflight(ctx, d.Name(), d.bin(), spec, d.VersionTimeout, d.HelpTimeout, d.Probes, nil)
}

// devinFiles are the prompt and trajectory files of one run: an attempt's
// first, or one of its repair rounds (-repair<k>), in the directory devin
// reaches (StateDir in a sandbox, else LogDir; the trajectory is kept in the
// job's logs either way). Devin's CLI documents no way to continue a
// session: a repair round is a fresh run with the task and the failure in
// its prompt.
func devinFiles(spec Spec) (prompt, export string) {
	dir := spec.StateDir
	if dir == "" {
		dir = spec.LogDir
	}
	n := fmt.Sprint(spec.Attempt)
	if spec.Round > 0 {
		n += fmt.Sprintf("-repair%d", spec.Round)
	}
	return filepath.Join(dir, "devin-prompt-"+n+".md"), filepath.Join(dir, "devin-trajectory-"+n+".json")
}

// Args is devin's command line for spec, without the program.
func (d *Devin) Args(spec Spec) []string {
	prompt, export := devinFiles(spec)
	mode := "normal"
	if permissionMode(spec) == "bypassPermissions" {
		mode = "bypass"
	}
	args := []string{"-p", "--prompt-file", prompt}
	if spec.Flags.Has("--export") {
		args = append(args, "--export", export)
	}
	args = append(args, "--permission-mode", mode)
	if spec.Model != "" {
		args = append(args, "--model", spec.Model)
	}
	return args
}

// Run implements Engine.
func (d *Devin) Run(ctx context.Context, spec Spec) (Result, error) {
	spec = engineSpec(spec)
	path, err := findEngine(d.Name(), d.bin(), spec.Env)
	if err != nil {
		return Result{}, err
	}
	if spec.Flags, err = usableFlags(ctx, d.Name(), path, spec, d.HelpTimeout, d.Probes); err != nil {
		return Result{}, err
	}
	promptFile, exportFile := devinFiles(spec)
	dir := filepath.Dir(promptFile)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return Result{}, fmt.Errorf("devin: create job log dir: %w", err)
	}
	// The directory is the engine's to write (state/ in a sandbox): the
	// prompt is created there exclusively, whatever an earlier run left
	// in its place, and the stale trajectory removed, never followed.
	files, err := safefs.OpenRoot(devinTree(spec), dir)
	if err != nil {
		return Result{}, fmt.Errorf("devin: open the directory of its files: %w", err)
	}
	defer files.Close()
	if err := files.WriteFile(filepath.Base(promptFile), []byte(spec.Prompt), 0o600); err != nil {
		return Result{}, fmt.Errorf("devin: write the prompt file: %w", err)
	}
	if err := files.Remove(filepath.Base(exportFile)); err != nil {
		return Result{}, fmt.Errorf("devin: remove a stale trajectory: %w", err)
	}
	out := &devinOutput{answer: tail{n: 200}, errLines: tail{n: 20}}
	pres, err := Exec(ctx, spec, Invocation{
		Path:     path,
		Args:     d.Args(spec),
		OnStdout: out.onStdout,
		OnStderr: out.onStderr,
	})
	if err != nil {
		return Result{}, startError(d.Name(), d.bin(), err)
	}
	// The trajectory is the engine's file: a regular one within
	// safefs.MaxTrajectory, or refused (a symbolic link to a host file, a
	// FIFO) and the run's usage taken from its output alone.
	b, rerr := files.ReadFile(filepath.Base(exportFile), safefs.MaxTrajectory)
	if logged := filepath.Join(spec.LogDir, filepath.Base(exportFile)); rerr == nil && logged != exportFile {
		// The trajectory is an artifact of the job's logs, like stdout.log.
		_ = os.WriteFile(logged, b, 0o600)
	}
	traj, trajErr := parseATIF(filepath.Base(exportFile), b, rerr)
	res := devinResult(out, traj, trajErr, pres.ExitCode, pres.Stopped, spec.Model)
	res.Process = pres
	if ref, ok := safefs.AsRefused(rerr); ok {
		res.Refused = append(res.Refused, ref)
	}
	if pres.Stopped {
		res.Detail = stopDetail("devin", pres)
	}
	if spec.Meter != nil && res.Usage != (Usage{}) {
		spec.Meter.Observe(res.Usage)
	}
	res.redact(spec.Redactor)
	return res, nil
}

// devinOutput collects devin's plain-text stdout (the answer) and stderr.
type devinOutput struct {
	mu       sync.Mutex
	answer   tail
	errLines tail
}

func (o *devinOutput) onStdout(line []byte) {
	o.mu.Lock()
	o.answer.add(string(line))
	o.mu.Unlock()
}

func (o *devinOutput) onStderr(line []byte) {
	o.mu.Lock()
	o.errLines.add(string(line))
	o.mu.Unlock()
}

// devinResult decides the outcome of a finished (or stopped) devin run.
func devinResult(out *devinOutput, traj *atifTrajectory, trajErr error, exit int, stopped bool, model string) Result {
	out.mu.Lock()
	defer out.mu.Unlock()
	answer := strings.TrimSpace(out.answer.String())
	res := Result{Model: model, ExitCode: exit, FinalText: answer, NoStructuredOutcome: true}
	if traj != nil {
		res.SessionID, res.Usage = traj.SessionID, traj.usage()
		if traj.Agent.ModelName != "" {
			res.Model = traj.Agent.ModelName
		}
		res.Version = traj.Agent.Version
	}
	note := ""
	if trajErr != nil && !errors.Is(trajErr, fs.ErrNotExist) {
		note = " (trajectory unreadable: " + brief.OneLine(trajErr.Error(), 160) + ")"
	}
	switch {
	case stopped:
		res.Outcome = Stopped
	case exit == 0 && answer != "":
		res.Outcome, res.Subtype = Succeeded, "exit_0"
		res.Detail = strings.TrimSpace(note)
	default:
		res.Subtype = fmt.Sprintf("exit_%d", exit)
		if kind, ex, ok := unavailableReason(out.errLines.String(), answer); ok {
			if lk := limitKind(kind); lk != "" {
				// devin prints no reset time aq knows how to read.
				res.Outcome, res.Limit, res.Detail = Limited, &Limit{Kind: lk}, "devin "+lk+": "+ex+note
				break
			}
			res.Outcome, res.Detail = Unavailable, "devin is unavailable ("+kind+"): "+ex+note
			break
		}
		res.Outcome = TaskFailed
		if exit == 0 {
			res.Subtype = "no_answer"
			res.Detail = "devin exited 0 without an answer" + stderrSuffix(out.errLines) + note
		} else {
			res.Detail = fmt.Sprintf("devin exited %d%s%s", exit, stderrSuffix(out.errLines), note)
		}
	}
	return res
}

// atifTrajectory is the part of an ATIF trajectory (Harbor RFC 0001, v1.x)
// aq reads.
type atifTrajectory struct {
	SchemaVersion string `json:"schema_version"`
	SessionID     string `json:"session_id"`
	Agent         struct {
		Name      string `json:"name"`
		Version   string `json:"version"`
		ModelName string `json:"model_name"`
	} `json:"agent"`
	Steps []struct {
		Source   string       `json:"source"`
		Metrics  *atifMetrics `json:"metrics"`
		Metadata *struct {
			IsUserInput bool `json:"is_user_input"`
			Metrics     *struct {
				InputTokens         int64 `json:"input_tokens"`
				OutputTokens        int64 `json:"output_tokens"`
				CacheReadTokens     int64 `json:"cache_read_tokens"`
				CacheCreationTokens int64 `json:"cache_creation_tokens"`
			} `json:"metrics"`
		} `json:"metadata"`
	} `json:"steps"`
	FinalMetrics *struct {
		TotalPromptTokens     *int64   `json:"total_prompt_tokens"`
		TotalCompletionTokens *int64   `json:"total_completion_tokens"`
		TotalCachedTokens     *int64   `json:"total_cached_tokens"`
		TotalCostUSD          *float64 `json:"total_cost_usd"`
	} `json:"final_metrics"`
}

type atifMetrics struct {
	PromptTokens     *int64   `json:"prompt_tokens"`
	CompletionTokens *int64   `json:"completion_tokens"`
	CachedTokens     *int64   `json:"cached_tokens"`
	CostUSD          *float64 `json:"cost_usd"`
}

// devinTree names the directory of devin's files in a refusal: the job's
// state/ in a sandbox, its logs otherwise.
func devinTree(spec Spec) string {
	if spec.StateDir != "" {
		return "state"
	}
	return "logs"
}

// parseATIF parses the trajectory b read from the file name (readErr:
// why it could not be read).
func parseATIF(name string, b []byte, readErr error) (*atifTrajectory, error) {
	if readErr != nil {
		return nil, readErr
	}
	var t atifTrajectory
	if err := json.Unmarshal(b, &t); err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	if !strings.HasPrefix(t.SchemaVersion, "ATIF-") && len(t.Steps) == 0 {
		return nil, fmt.Errorf("%s: not an ATIF trajectory", name)
	}
	return &t, nil
}

func deref[T int64 | float64](p *T) T {
	if p == nil {
		return 0
	}
	return *p
}

// usage is what the trajectory says was spent; zero where it says nothing.
func (t *atifTrajectory) usage() Usage {
	var u, sum Usage
	for _, s := range t.Steps {
		if s.Source != "agent" || (s.Metadata != nil && s.Metadata.IsUserInput) {
			continue
		}
		u.Turns++
		switch {
		case s.Metrics != nil:
			sum.TokensIn += deref(s.Metrics.PromptTokens)
			sum.TokensCached += deref(s.Metrics.CachedTokens)
			sum.TokensOut += deref(s.Metrics.CompletionTokens)
			sum.CostUSD += deref(s.Metrics.CostUSD)
		case s.Metadata != nil && s.Metadata.Metrics != nil:
			m := s.Metadata.Metrics
			sum.TokensIn += m.InputTokens + m.CacheReadTokens + m.CacheCreationTokens
			sum.TokensCached += m.CacheReadTokens
			sum.TokensCacheWrite += m.CacheCreationTokens
			sum.TokensOut += m.OutputTokens
		}
	}
	if f := t.FinalMetrics; f != nil && (f.TotalPromptTokens != nil || f.TotalCompletionTokens != nil) {
		u.TokensIn, u.TokensCached, u.TokensOut = deref(f.TotalPromptTokens), deref(f.TotalCachedTokens), deref(f.TotalCompletionTokens)
		u.CostUSD = deref(f.TotalCostUSD)
		if f.TotalCostUSD == nil {
			u.CostUSD = sum.CostUSD
		}
		return u
	}
	sum.Turns = u.Turns
	return sum
}
