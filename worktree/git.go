package worktree

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/aqfleet/aq/internal/brief"
	"github.com/aqfleet/aq/internal/process"
)

// Git runs the git CLI. The zero value runs "git" from PATH.
//
// Every run gets GIT_TERMINAL_PROMPT=0 (a missing credential fails instead of
// waiting for a person), LC_ALL=C (messages are stable), no editor and no
// pager; variables that would point git at another repository or index
// (GIT_DIR, GIT_WORK_TREE, GIT_INDEX_FILE, ...) are not inherited from aq's
// environment. Stdin is empty.
type Git struct {
	// Bin is the git executable; default "git".
	Bin string
	// Env is extra environment (KEY=value) for every run, e.g. an
	// ssh command or a credential helper's settings.
	Env []string
	// ConfigDir is where aq writes the configuration files that keep a
	// repository's own configuration from changing what git runs or
	// where it pushes (harden.go); default: aq/git under the user's cache
	// directory. Written only for a repository that needs one.
	ConfigDir string

	// unhardened runs git as the repository configures it: only the
	// benchmark that measures the hardening's cost sets it.
	unhardened bool
}

// waitDelay bounds how long a killed git's children (ssh, credential helpers,
// hooks) may keep its pipes open before Wait gives up on them.
const waitDelay = 5 * time.Second

// scrubbedEnv are inherited variables that would make git operate on some
// other repository, index or object store than the directory it is run in.
var scrubbedEnv = map[string]bool{
	"GIT_DIR":                          true,
	"GIT_WORK_TREE":                    true,
	"GIT_INDEX_FILE":                   true,
	"GIT_OBJECT_DIRECTORY":             true,
	"GIT_ALTERNATE_OBJECT_DIRECTORIES": true,
	"GIT_COMMON_DIR":                   true,
	"GIT_NAMESPACE":                    true,
	"GIT_PREFIX":                       true,
	"GIT_CEILING_DIRECTORIES":          true,
	"GIT_DISCOVERY_ACROSS_FILESYSTEM":  true,
	"GIT_QUARANTINE_PATH":              true,
}

// fixedEnv is appended last, so neither the host nor Git.Env can undo it.
var fixedEnv = []string{
	"GIT_TERMINAL_PROMPT=0",
	"GCM_INTERACTIVE=never",
	"LC_ALL=C",
	"GIT_EDITOR=:", // git treats ":" as "no editor"
	"GIT_SEQUENCE_EDITOR=:",
	"GIT_MERGE_AUTOEDIT=no",
	"GIT_PAGER=cat",
}

// Run runs git with args in dir and returns its stdout without the trailing
// newline(s). Only trailing line ends are trimmed: leading spaces are
// significant in porcelain output (" M file"). A failure is a *GitError.
func (g Git) Run(ctx context.Context, dir string, args ...string) (string, error) {
	out, err := g.run(ctx, dir, nil, args)
	return strings.TrimRight(string(out), "\r\n"), err
}

// run is Run with extra environment and untrimmed output.
func (g Git) run(ctx context.Context, dir string, env []string, args []string) ([]byte, error) {
	gerr := &GitError{Args: append([]string(nil), args...), Dir: dir, ExitCode: -1}
	if dir != "" {
		// exec reports a missing dir as a failure to start "git", which reads
		// as if git were missing; say what is really wrong.
		if _, err := os.Stat(dir); err != nil {
			gerr.Err = err
			return nil, gerr
		}
	}
	cmd, err := g.command(ctx, dir, args, env)
	if err != nil {
		return nil, err
	}
	return runCmd(ctx, cmd, dir, args)
}

// runStdin is run with stdin: git reads its input (`--stdin`) from in.
func (g Git) runStdin(ctx context.Context, dir string, in io.Reader, args ...string) ([]byte, error) {
	g = g.at(dir)
	cmd, err := g.command(ctx, dir, args, nil)
	if err != nil {
		return nil, err
	}
	cmd.Stdin = in
	return runCmd(ctx, cmd, dir, args)
}

// runCmd runs cmd, a git made by command, to its end and returns its
// stdout. A failure is a *GitError for args in dir; when ctx ended, its
// error is the context's.
func runCmd(ctx context.Context, cmd *exec.Cmd, dir string, args []string) ([]byte, error) {
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	if err == nil {
		return stdout.Bytes(), nil
	}
	gerr := &GitError{Args: append([]string(nil), args...), Dir: dir, ExitCode: exitCode(err), Stderr: stderr.String(), Err: err}
	if cerr := ctx.Err(); cerr != nil {
		gerr.Err = cerr
	}
	return stdout.Bytes(), gerr
}

// command is an *exec.Cmd for git in dir with g's environment, extra and
// the hardening that keeps git from running what the repository planted
// (harden.go), for callers that stream its output. An error means the
// hardening could not be worked out: git is not run without it.
func (g Git) command(ctx context.Context, dir string, args, extra []string) (*exec.Cmd, error) {
	bin := g.Bin
	if bin == "" {
		bin = "git"
	}
	env := g.environ(extra)
	if !g.unhardened {
		more, err := g.hardenEnv(ctx, dir, env)
		if err != nil {
			return nil, &GitError{Args: append([]string(nil), args...), Dir: dir, ExitCode: -1,
				Err: fmt.Errorf("cannot read the repository's configuration to keep git from running what it names: %w", err)}
		}
		env = append(env, more...)
	}
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Dir = dir
	cmd.Env = env
	// A cancelled git is asked to stop (SIGTERM), not killed: git then
	// removes the lock files it holds (a ref's, the index's). Killed, it
	// left them behind, and every later update of that ref failed — a
	// periodic checkpoint stopped with its job left aq/wip/<id>.lock, which
	// the final checkpoint and aq gc then met (found by the reduced chaos
	// run). SIGKILL follows after waitDelay.
	cmd.Cancel = func() error { return process.Terminate(cmd.Process) }
	cmd.WaitDelay = waitDelay
	return cmd, nil
}

func (g Git) environ(extra []string) []string {
	host := os.Environ()
	env := make([]string, 0, len(host)+len(g.Env)+len(extra)+len(fixedEnv))
	for _, kv := range host {
		k, _, _ := strings.Cut(kv, "=")
		if !scrubbedEnv[k] {
			env = append(env, kv)
		}
	}
	env = append(env, g.Env...)
	env = append(env, extra...)
	return append(env, fixedEnv...)
}

// at returns a Git that treats dir as the root of a repository or worktree:
// git does not look for a repository above it (see the package doc).
func (g Git) at(dir string) Git {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return g
	}
	parent := filepath.Dir(abs)
	if real, err := filepath.EvalSymlinks(parent); err == nil {
		parent = real
	}
	env := make([]string, 0, len(g.Env)+1)
	env = append(env, g.Env...)
	g.Env = append(env, "GIT_CEILING_DIRECTORIES="+parent)
	return g
}

// with returns a copy of g with more environment.
func (g Git) with(kv ...string) Git {
	env := make([]string, 0, len(g.Env)+len(kv))
	env = append(env, g.Env...)
	g.Env = append(env, kv...)
	return g
}

// exitCode is the exit status of a git that ran to an exit and failed: from
// a *GitError, or from the *exec.ExitError of a git run by command. It is -1
// for anything else: git did not start, a signal ended it, or err is nil.
func exitCode(err error) int {
	var ge *GitError
	if errors.As(err, &ge) {
		return ge.ExitCode
	}
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		return ee.ExitCode()
	}
	return -1
}

// Default identity for commits aq makes in a repository that has none.
const (
	DefaultUserName  = "aq"
	DefaultUserEmail = "aq@localhost"
)

// identity returns "-c user.name=... -c user.email=..." for whichever of the
// two the repository (with the host's global and system config) does not set,
// so that aq's commits carry the configured identity when there is one and
// "aq <aq@localhost>" otherwise (never an identity guessed from the hostname).
// GIT_AUTHOR_* / GIT_COMMITTER_* in the environment still win over both.
func (g Git) identity(ctx context.Context, dir string) ([]string, error) {
	out, err := g.ConfigGet(ctx, dir, "user.name", "user.email")
	if err != nil {
		return nil, err
	}
	var name, email bool
	for _, line := range strings.Split(out, "\n") {
		k, v, _ := strings.Cut(line, " ")
		switch {
		case k == "user.name" && strings.TrimSpace(v) != "":
			name = true
		case k == "user.email" && strings.TrimSpace(v) != "":
			email = true
		}
	}
	var args []string
	if !name {
		args = append(args, "-c", "user.name="+DefaultUserName)
	}
	if !email {
		args = append(args, "-c", "user.email="+DefaultUserEmail)
	}
	return args, nil
}

// GitError is a git run that failed: it could not start, exited non-zero, or
// was stopped by its context (then Err is the context's error).
type GitError struct {
	Args     []string
	Dir      string
	ExitCode int // -1 when git did not run to an exit
	Stderr   string
	Err      error // the underlying exec, os or context error
}

// Error is one line: the git subcommand and the first meaningful line of its
// stderr (an "error:" or "fatal:" line when there is one, never a "hint:").
func (e *GitError) Error() string {
	msg := firstMeaningfulLine(e.Stderr)
	if msg == "" {
		switch {
		case e.Err != nil:
			msg = e.Err.Error()
		default:
			msg = fmt.Sprintf("exit status %d", e.ExitCode)
		}
	}
	return "git " + subcommand(e.Args) + ": " + msg
}

func (e *GitError) Unwrap() error { return e.Err }

// firstMeaningfulLine picks the line of git's stderr that says what went
// wrong: the first "fatal:" or "error:" line, else the first line that is not
// blank, a hint or progress output.
func firstMeaningfulLine(stderr string) string {
	var first string
	for _, line := range strings.FieldsFunc(stderr, func(r rune) bool { return r == '\n' || r == '\r' }) {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "hint:") {
			continue
		}
		if strings.HasPrefix(line, "fatal:") || strings.HasPrefix(line, "error:") {
			return brief.Clip(line, 300)
		}
		if first == "" {
			first = line
		}
	}
	return brief.Clip(first, 300)
}

// subcommand names the git command in args for messages: "worktree add",
// "push", ... (global options such as -c k=v are skipped).
func subcommand(args []string) string {
	for i := 0; i < len(args); i++ {
		a := args[i]
		switch {
		case a == "-c" || a == "-C":
			i++
		case strings.HasPrefix(a, "-"):
		default:
			if (a == "worktree" || a == "remote") && i+1 < len(args) && !strings.HasPrefix(args[i+1], "-") {
				return a + " " + args[i+1]
			}
			return a
		}
	}
	return strings.Join(args, " ")
}
