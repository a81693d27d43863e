package engines

import (
	"context"
	"errors"
	"fmt"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"unicode"
)

// Script runs a user command (`engine: script`, `script: ...`) with the prompt
// on stdin. It is how tests and any other tool plug into aq.
//
// The command is the job author's own command line and runs through /bin/sh
// -c, as CI systems run theirs; aq never interpolates anything into it.
//
// A script may report usage and outcome on stdout, one directive a line:
//
//	::aq-usage tokens_in=1200 tokens_out=300 tokens_cached=0 cost_usd=0.02 turns=3
//	::aq-unavailable <why>
//
// Usage is cumulative (each line replaces the previous totals) and feeds the
// budget meter live. ::aq-unavailable marks the run as an infrastructure
// failure (engine_unavailable) whatever the exit status. Otherwise exit 0 is
// success and anything else a task failure; exit 127 (the shell's "command not
// found") means the command does not exist (no_engine).
type Script struct {
	// Shell runs the command; default /bin/sh.
	Shell string
}

var _ Engine = (*Script)(nil)

// Name implements Engine.
func (s *Script) Name() string { return "script" }

func (s *Script) shell() string {
	if s.Shell != "" {
		return s.Shell
	}
	return "/bin/sh"
}

// Preflight checks there is a command and, when its first word is a bare
// command name, that it is on PATH (so a typo is no_engine before any
// worktree is made). Paths are checked when the command runs, in the worktree.
func (s *Script) Preflight(ctx context.Context, spec Spec) (Info, error) {
	sh, err := exec.LookPath(s.shell())
	if err != nil {
		return Info{}, notInstalled("script", s.shell())
	}
	cmd := strings.TrimSpace(spec.Script)
	if cmd == "" {
		return Info{}, fmt.Errorf("%w: script (the manifest has engine: script but no script: command)", ErrNotInstalled)
	}
	if first := firstWord(cmd); first != "" && !strings.ContainsRune(first, '/') && !isShellWord(first) {
		if _, err := lookPathIn(first, spec.Env); err != nil {
			return Info{}, fmt.Errorf("%w: script command %q is not on PATH (install it or fix script:)", ErrNotInstalled, first)
		}
	}
	return Info{Name: "script", Path: sh, Version: "sh"}, nil
}

// Run implements Engine.
func (s *Script) Run(ctx context.Context, spec Spec) (Result, error) {
	var (
		mu          sync.Mutex
		usage       Usage
		unavailable string
	)
	pres, err := Exec(ctx, spec, Invocation{
		Path:  s.shell(),
		Args:  []string{"-c", spec.Script},
		Stdin: strings.NewReader(spec.Prompt),
		OnStdout: func(line []byte) {
			l := string(line)
			switch {
			case strings.HasPrefix(l, "::aq-usage "):
				u, ok := parseUsage(strings.TrimPrefix(l, "::aq-usage "))
				if !ok {
					return
				}
				mu.Lock()
				usage = u
				mu.Unlock()
				if spec.Meter != nil {
					spec.Meter.Observe(u)
				}
			case strings.HasPrefix(l, "::aq-unavailable"):
				mu.Lock()
				unavailable = strings.TrimSpace(strings.TrimPrefix(l, "::aq-unavailable"))
				if unavailable == "" {
					unavailable = "the script reported the engine unavailable"
				}
				mu.Unlock()
			}
		},
	})
	if err != nil {
		if errors.Is(err, exec.ErrNotFound) {
			return Result{}, notInstalled("script", s.shell())
		}
		return Result{}, err
	}
	mu.Lock()
	defer mu.Unlock()
	res := Result{Usage: usage, ExitCode: pres.ExitCode, Process: pres, Version: "sh"}
	switch {
	case pres.Stopped:
		res.Outcome, res.Detail = Stopped, "stopped by aq"
	case unavailable != "":
		res.Outcome, res.Detail = Unavailable, unavailable
	case pres.ExitCode == 127:
		return res, fmt.Errorf("%w: script command not found (exit 127): fix script: or install the command", ErrNotInstalled)
	case pres.ExitCode == 0:
		res.Outcome, res.Subtype = Succeeded, "exit_0"
	default:
		res.Outcome, res.Subtype = TaskFailed, "exit_"+strconv.Itoa(pres.ExitCode)
		res.Detail = fmt.Sprintf("script exited %d", pres.ExitCode)
		if pres.Signal != "" {
			res.Detail = "script killed by " + pres.Signal
		}
	}
	return res, nil
}

func parseUsage(s string) (Usage, bool) {
	var u Usage
	ok := false
	for _, f := range strings.Fields(s) {
		k, v, found := strings.Cut(f, "=")
		if !found {
			continue
		}
		switch k {
		case "tokens_in":
			u.TokensIn, ok = atoi64(v), true
		case "tokens_out":
			u.TokensOut, ok = atoi64(v), true
		case "tokens_cached":
			u.TokensCached, ok = atoi64(v), true
		case "turns":
			u.Turns, ok = int(atoi64(v)), true
		case "cost_usd":
			if c, err := strconv.ParseFloat(v, 64); err == nil {
				u.CostUSD, ok = c, true
			}
		}
	}
	return u, ok
}

func atoi64(s string) int64 {
	n, _ := strconv.ParseInt(s, 10, 64)
	return n
}

func firstWord(cmd string) string {
	f := strings.FieldsFunc(cmd, func(r rune) bool { return unicode.IsSpace(r) || r == ';' || r == '|' || r == '&' })
	if len(f) == 0 {
		return ""
	}
	return f[0]
}

// isShellWord reports words the shell handles itself (builtins, assignments,
// syntax), which PATH lookup must not judge.
func isShellWord(w string) bool {
	if strings.ContainsAny(w, "=$`'\"(){}<>*?[]!~") {
		return true
	}
	switch w {
	case "cd", "exit", "true", "false", "echo", "printf", "test", "[", "set", "export", "exec", "if", "for", "while", "case", "read", "eval", ".", ":", "trap", "wait", "kill":
		return true
	}
	return false
}

// lookPathIn is exec.LookPath against the PATH in env (the engine's), not
// aq's own.
func lookPathIn(name string, env []string) (string, error) {
	path := envValue(env, "PATH")
	if path == "" {
		return exec.LookPath(name)
	}
	for _, dir := range strings.Split(path, ":") {
		if dir == "" {
			dir = "."
		}
		p := dir + "/" + name
		if _, err := exec.LookPath(p); err == nil {
			return p, nil
		}
	}
	return "", exec.ErrNotFound
}
