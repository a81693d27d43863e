package engines

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/aqfleet/aq/internal/brief"
	"github.com/aqfleet/aq/internal/process"
)

// The --help probe: engine CLIs add, rename and remove flags between
// versions (codex removed --full-auto; claude's --max-budget-usd works only
// with -p), so aq asks each binary which of the flags it passes exist and
// builds the invocation from the answer. A CLI without a flag aq needs is
// refused with one line naming the flag; an optional flag it lacks is
// dropped with a note. The answer is cached per binary (path, size, mtime),
// so `aq run --once` does not pay the probe on every start.

// FlagNeed is one flag an engine's invocation passes.
type FlagNeed struct {
	// Flag is the flag as aq passes it (--output-format).
	Flag string `json:"flag"`
	// Aliases are other spellings the CLI may list it under (-p for
	// --print): any one of them present counts.
	Aliases []string `json:"aliases,omitempty"`
	// Required: without it aq cannot run the engine, which is refused.
	Required bool `json:"required"`
	// Hidden: some versions leave the flag out of --help (claude's
	// --max-turns). When the help does not list it, aq asks the CLI itself:
	// `<bin> <flag> <Value> --aq-probe-unknown-option` names the first
	// option it does not know.
	Hidden bool   `json:"hidden,omitempty"`
	Value  string `json:"-"` // a valid value for the hidden-flag probe, for a flag that takes one
	// Instead is the flag an optional flag's work falls back to (codex
	// --sandbox → -c sandbox_mode=…): when both are missing the engine is
	// refused as for a required flag.
	Instead string `json:"instead,omitempty"`
	// Use says what aq passes it for, and for an optional flag what aq does
	// without it.
	Use string `json:"use"`
}

func (n FlagNeed) spellings() []string { return append([]string{n.Flag}, n.Aliases...) }

// FlagSet is what the --help probe found in one engine binary.
type FlagSet struct {
	Engine string `json:"engine"`
	Path   string `json:"path"`
	// Probed are the help commands run, e.g. "codex exec --help".
	Probed []string `json:"probed"`
	// Found are the flags aq passes that the CLI has.
	Found []string `json:"found"`
	// Dropped are the optional flags it lacks: aq runs without them.
	Dropped []string `json:"dropped"`
	// Missing are the required flags it lacks: the engine is refused.
	Missing []string `json:"missing,omitempty"`
	// Notes say, one line each, what each dropped flag costs.
	Notes []string `json:"notes,omitempty"`
	// Unknown: the --help probe did not answer within its deadline (a
	// busy host): every flag is taken as present (the full command line),
	// nothing is refused, and nothing is kept in the probe cache.
	Unknown bool `json:"unknown,omitempty"`
}

// Has reports whether the CLI has flag (as aq spells it). A nil set has
// every flag: an engine run without a probe passes its full command line.
func (f *FlagSet) Has(flag string) bool {
	if f == nil {
		return true
	}
	return slices.Contains(f.Found, flag)
}

// Refusal is the one line that says why the engine cannot be used, or "".
func (f *FlagSet) Refusal(needs []FlagNeed) string {
	if f == nil || len(f.Missing) == 0 {
		return ""
	}
	var parts []string
	for _, m := range f.Missing {
		use := ""
		for _, n := range needs {
			if n.Flag == m {
				use = n.Use
			}
		}
		parts = append(parts, fmt.Sprintf("%s (%s)", m, use))
	}
	return fmt.Sprintf("%s at %s lacks %s, which aq needs: install a %s version that has it (upgrade, or downgrade if a newer release removed it)",
		f.Engine, f.Path, strings.Join(parts, ", "), f.Engine)
}

// HelpSpec is how one engine is probed: the subcommand whose --help lists
// the flags aq passes ("exec" for codex; none for claude and devin) and
// those flags.
type HelpSpec struct {
	Sub   []string
	Needs []FlagNeed
}

// HelpSpecs are the flags aq probes for, per engine. Keep them in step with
// each adapter's Args (a test holds that every flag an adapter can pass is
// listed here) and with docs/engines.md.
var HelpSpecs = map[string]HelpSpec{
	"claude": {Needs: claudeNeeds},
	"codex":  {Sub: []string{"exec"}, Needs: codexNeeds},
	"devin":  {Needs: devinNeeds},
}

// DefaultHelpTimeout bounds each --help probe (and each hidden-flag probe)
// (AQ_ENGINE_PROBE_TIMEOUT). A probe that times out leaves the flags
// unknown (FlagSet.Unknown): the engine is offered and run with its full
// flag set, and probed again next time.
const DefaultHelpTimeout = 60 * time.Second

// maxHelp bounds the help text read (claude's is about 14 KB).
const maxHelp = 256 << 10

// unknownProbe is the option the hidden-flag probe ends with: no CLI has it.
const unknownProbe = "--aq-probe-unknown-option"

// ProbeFlags runs `path [sub] --help` (and, for a hidden flag the help does
// not list, the unknown-option probe) in env, each bounded by timeout, and
// reports which flags of spec exist. A help that hangs, fails or prints
// nothing is an *UnavailableError naming the command; a required flag that
// is missing is recorded in FlagSet.Missing (see Refusal), not an error.
// With cache set, a binary whose path, size and mtime are unchanged since
// its last probe is not run again.
func ProbeFlags(ctx context.Context, name, path string, env []string, timeout time.Duration, cache *ProbeCache) (*FlagSet, error) {
	spec, ok := HelpSpecs[name]
	if !ok {
		return nil, nil
	}
	return probeHelp(ctx, name, path, spec, env, timeout, cache)
}

// probeHelp is ProbeFlags for one HelpSpec of engine name (codex's
// `exec resume` has one of its own: codexResumeHelp).
func probeHelp(ctx context.Context, name, path string, spec HelpSpec, env []string, timeout time.Duration, cache *ProbeCache) (*FlagSet, error) {
	if timeout <= 0 {
		timeout = DefaultHelpTimeout
	}
	what := helpProbeKey(spec)
	var cached FlagSet
	if cache.get(path, what, &cached) {
		return &cached, nil
	}
	// One process probes a binary at a time: the others wait, then find
	// its answer in the cache.
	unlock := cache.lock(ctx, path)
	defer unlock()
	if cache.get(path, what, &cached) {
		return &cached, nil
	}
	cmd := strings.Join(append(append([]string{filepath.Base(path)}, spec.Sub...), "--help"), " ")
	out, err := runProbe(ctx, name, path, append(append([]string(nil), spec.Sub...), "--help"), env, timeout, cmd)
	var ue *UnavailableError
	if errors.As(err, &ue) && ue.TimedOut {
		fs := &FlagSet{Engine: name, Path: path, Probed: []string{cmd}, Found: []string{}, Dropped: []string{}, Unknown: true}
		for _, n := range spec.Needs {
			fs.Found = append(fs.Found, n.Flag)
		}
		fs.Notes = []string{fmt.Sprintf("%s: `%s` did not answer within %s (a busy host?): its flags are unknown, it is offered and runs with all of them, and is probed again next time (AQ_ENGINE_PROBE_TIMEOUT)", name, cmd, timeout)}
		return fs, nil
	}
	if err != nil {
		return nil, err
	}
	found := HelpFlags(out)
	if len(found) == 0 {
		return nil, &UnavailableError{Engine: name, Why: fmt.Sprintf("`%s` lists no flags (first line: %s); is %s really %s?", cmd, orNone(brief.FirstLine(out, 200)), path, name)}
	}
	fs := &FlagSet{Engine: name, Path: path, Probed: []string{cmd}, Found: []string{}, Dropped: []string{}}
	has := map[string]bool{}
	for _, n := range spec.Needs {
		has[n.Flag] = slices.ContainsFunc(n.spellings(), func(s string) bool { return found[s] })
		if !has[n.Flag] && n.Hidden {
			has[n.Flag] = probeHidden(ctx, name, path, spec.Sub, n, env, timeout)
			fs.Probed = append(fs.Probed, strings.Join(append(append([]string{filepath.Base(path)}, spec.Sub...), n.Flag, n.Value, unknownProbe), " "))
		}
	}
	for _, n := range spec.Needs {
		switch {
		case has[n.Flag]:
			fs.Found = append(fs.Found, n.Flag)
		case n.Required, n.Instead != "" && !has[n.Instead]:
			fs.Missing = append(fs.Missing, n.Flag)
		default:
			fs.Dropped = append(fs.Dropped, n.Flag)
			fs.Notes = append(fs.Notes, fmt.Sprintf("%s has no %s: %s", name, n.Flag, n.Use))
		}
	}
	cache.put(path, what, fs)
	return fs, nil
}

// runProbe runs one probe command through the process layer (own group,
// leftovers killed, stdin closed), bounded by timeout, and returns what it
// printed on stdout and stderr. A failure is an *UnavailableError.
func runProbe(ctx context.Context, name, path string, args, env []string, timeout time.Duration, cmd string) (string, error) {
	out, res, err := runBounded(ctx, name, path, args, env, timeout)
	if err != nil {
		if errors.Is(err, exec.ErrNotFound) || errors.Is(err, fs.ErrNotExist) {
			return "", notInstalled(name, path)
		}
		return "", &UnavailableError{Engine: name, Why: fmt.Sprintf("`%s` could not run: %v", cmd, err)}
	}
	switch {
	case res.Stopped && ctx.Err() != nil:
		return "", &UnavailableError{Engine: name, Why: fmt.Sprintf("`%s` was interrupted: %v", cmd, context.Cause(ctx))}
	case res.Stopped:
		return "", &UnavailableError{Engine: name, Why: fmt.Sprintf("`%s` did not answer within %s", cmd, timeout), TimedOut: true}
	case res.ExitCode != 0:
		return "", &UnavailableError{Engine: name, Why: fmt.Sprintf("`%s` exited %d: %s", cmd, res.ExitCode, orNone(brief.FirstLine(out, 200)))}
	case strings.TrimSpace(out) == "":
		return "", &UnavailableError{Engine: name, Why: fmt.Sprintf("`%s` printed nothing", cmd)}
	}
	return out, nil
}

func runBounded(ctx context.Context, name, path string, args, env []string, timeout time.Duration) (string, process.Result, error) {
	pctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var out limitedBuffer
	out.max = maxHelp
	res, err := process.Run(pctx, process.Spec{
		Path: path, Args: args, Env: env, Stdout: &out, Stderr: &out,
		Tag: "aq-probe-" + name + "-" + newUUID(), Grace: 500 * time.Millisecond,
	})
	return out.String(), res, err
}

// probeHidden asks the CLI whether it knows a flag its --help leaves out:
// CLIs built on commander (claude) or clap (codex) reject the first option
// they do not know by name, before doing anything. So the answer naming
// the probe's own bogus option means the flag was accepted. Anything else
// (the flag named, another error, no answer in time) counts as absent.
func probeHidden(ctx context.Context, name, path string, sub []string, n FlagNeed, env []string, timeout time.Duration) bool {
	args := append(append([]string(nil), sub...), n.Flag)
	if n.Value != "" {
		args = append(args, n.Value)
	}
	args = append(args, unknownProbe)
	out, res, err := runBounded(ctx, name, path, args, env, timeout)
	if err != nil || res.Stopped {
		return false
	}
	return strings.Contains(out, unknownProbe) && !mentionsUnknown(out, n.Flag)
}

// mentionsUnknown reports whether out says flag itself is unknown.
func mentionsUnknown(out, flag string) bool {
	for _, q := range []string{"'" + flag + "'", "\"" + flag + "\"", "`" + flag + "`"} {
		if strings.Contains(out, q) {
			return true
		}
	}
	return false
}

// helpFlag finds option names in help text: a dash or two, a letter or
// digit, then letters, digits and dashes, starting a word (after a space,
// comma, bracket, bar, backquote or line start) — so "non-interactive" or
// "read-only" are not options, and "--tmux=classic" is --tmux.
var helpFlag = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile("(?:^|[\\s,\\[(|`'\"])(--?[A-Za-z0-9][A-Za-z0-9-]*)") })

// HelpFlags returns every option name a --help text mentions.
func HelpFlags(help string) map[string]bool {
	out := map[string]bool{}
	for _, m := range helpFlag().FindAllStringSubmatch(help, -1) {
		f := strings.TrimRight(m[1], "-")
		if f == "-" || f == "--" || f == "" {
			continue
		}
		out[f] = true
	}
	return out
}

// usableFlags is the engine's probe for a run or a pre-flight: spec.Flags
// when the caller has it, else a probe (through cache). A CLI that lacks a
// required flag is an *UnavailableError that names it.
func usableFlags(ctx context.Context, name, path string, spec Spec, timeout time.Duration, cache *ProbeCache) (*FlagSet, error) {
	fs := spec.Flags
	if fs == nil {
		var err error
		if fs, err = ProbeFlags(ctx, name, path, spec.Env, timeout, cache); err != nil {
			return nil, err
		}
	}
	if why := fs.Refusal(HelpSpecs[name].Needs); why != "" {
		return nil, &UnavailableError{Engine: name, Why: why, MissingFlags: fs.Missing}
	}
	return fs, nil
}
