package worktree

import (
	"context"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/aqfleet/aq/internal/testenv"
)

func TestRunTrimsOnlyTrailingNewlines(t *testing.T) {
	t.Parallel()
	repo := newRepo(t)
	testenv.WriteFile(t, filepath.Join(repo, "README.md"), "changed\n")
	out, err := Git{}.Run(ctxT(t), repo, "status", "--porcelain")
	if err != nil {
		t.Fatal(err)
	}
	if out != " M README.md" {
		t.Fatalf("status = %q, want the leading space kept and the newline trimmed", out)
	}
}

func TestGitErrorIsOneTypedLine(t *testing.T) {
	t.Parallel()
	repo := newRepo(t)
	_, err := Git{}.Run(ctxT(t), repo, "checkout", "no-such-branch")
	var ge *GitError
	if !errors.As(err, &ge) {
		t.Fatalf("err = %T %v, want *GitError", err, err)
	}
	if ge.ExitCode != 1 || ge.Dir != repo || ge.Args[0] != "checkout" || ge.Stderr == "" {
		t.Errorf("GitError = %+v", ge)
	}
	msg := err.Error()
	if strings.ContainsAny(msg, "\r\n") || !strings.HasPrefix(msg, "git checkout: error:") {
		t.Errorf("Error() = %q, want one line naming the subcommand and git's error", msg)
	}
}

// TestExitCode: one helper reads git's exit status whether the failure came
// from Run (a *GitError) or from a git started by command (an
// *exec.ExitError, as the streaming gc queries see it).
func TestExitCode(t *testing.T) {
	t.Parallel()
	repo := newRepo(t)
	_, runErr := Git{}.Run(ctxT(t), repo, "rev-parse", "--verify", "-q", "no-such-ref")
	cmd, err := Git{}.command(ctxT(t), repo, []string{"rev-parse", "--verify", "-q", "no-such-ref"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	cmdErr := cmd.Run()
	_, stdinErr := Git{}.runStdin(ctxT(t), repo, strings.NewReader("no-such-ref\n"), "merge-base", "--is-ancestor", "HEAD", "no-such-ref")
	for _, tc := range []struct {
		name string
		err  error
		want int
	}{
		{"Run", runErr, 1},
		{"command", cmdErr, 1},
		{"runStdin", stdinErr, 128},
		{"nil", nil, -1},
		{"not git's", errors.New("other"), -1},
	} {
		if got := exitCode(tc.err); got != tc.want {
			t.Errorf("%s: exitCode(%v) = %d, want %d", tc.name, tc.err, got, tc.want)
		}
	}
}

func TestGitErrorMissingDirAndCancel(t *testing.T) {
	t.Parallel()
	_, err := Git{}.Run(ctxT(t), filepath.Join(t.TempDir(), "nope"), "status")
	if !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("missing dir: err = %v, want fs.ErrNotExist", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err = Git{}.Run(ctx, t.TempDir(), "version")
	var ge *GitError
	if !errors.Is(err, context.Canceled) || !errors.As(err, &ge) {
		t.Errorf("cancelled: err = %v, want a *GitError matching context.Canceled", err)
	}
	_, err = Git{Bin: "/nonexistent/git"}.Run(ctxT(t), t.TempDir(), "version")
	if !errors.As(err, &ge) || ge.ExitCode != -1 {
		t.Errorf("missing binary: err = %v", err)
	}
}

func TestFirstMeaningfulLine(t *testing.T) {
	t.Parallel()
	for _, c := range []struct{ stderr, want string }{
		{"", ""},
		{"fatal: not a git repository\n", "fatal: not a git repository"},
		{"hint: do this\nhint: or that\nerror: pathspec 'x' did not match\n", "error: pathspec 'x' did not match"},
		{"To /tmp/o.git\n ! [rejected] main -> main (fetch first)\nerror: failed to push some refs\nhint: pull first\n", "error: failed to push some refs"},
		{"Counting objects: 10%\rCounting objects: 100%\nsomething odd\n", "Counting objects: 10%"},
		{"\n\nwarning: only a warning\n", "warning: only a warning"},
	} {
		if got := firstMeaningfulLine(c.stderr); got != c.want {
			t.Errorf("firstMeaningfulLine(%q) = %q, want %q", c.stderr, got, c.want)
		}
	}
	if got := subcommand([]string{"-c", "user.name=aq", "--no-optional-locks", "worktree", "add", "-B", "x"}); got != "worktree add" {
		t.Errorf("subcommand = %q", got)
	}
}

// The environment every git run gets: no prompts, C locale, no editor, and
// nothing inherited that points git at another repository or index.
func TestRunEnvironment(t *testing.T) {
	repo := newRepo(t)
	t.Setenv("GIT_DIR", "/somewhere/else/.git")
	t.Setenv("GIT_INDEX_FILE", "/somewhere/else/index")
	t.Setenv("GIT_TERMINAL_PROMPT", "1")
	t.Setenv("LC_ALL", "de_DE.UTF-8")
	// A "git" that prints its environment (and is git for the reading of
	// the configuration that hardening does first).
	bin := filepath.Join(t.TempDir(), "git-env")
	testenv.WriteFile(t, bin, "#!/bin/sh\nif [ \"$1\" = config ]; then exec git \"$@\"; fi\nexec env\n")
	if err := os.Chmod(bin, 0o755); err != nil {
		t.Fatal(err)
	}
	out, err := Git{Bin: bin, Env: []string{"AQ_EXTRA=1"}}.Run(ctxT(t), t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	env := map[string]string{}
	for _, kv := range strings.Split(out, "\n") {
		k, v, _ := strings.Cut(kv, "=")
		env[k] = v // last wins, as for exec
	}
	for k, want := range map[string]string{
		"GIT_TERMINAL_PROMPT": "0", "LC_ALL": "C", "GIT_EDITOR": ":", "GIT_SEQUENCE_EDITOR": ":", "AQ_EXTRA": "1",
		// Hardening (harden.go): no hook, no planted fsmonitor, only
		// these transports.
		"GIT_CONFIG_KEY_0": "core.hookspath", "GIT_CONFIG_VALUE_0": "/dev/null",
		"GIT_CONFIG_KEY_1": "core.fsmonitor", "GIT_CONFIG_VALUE_1": "false",
		"GIT_ALLOW_PROTOCOL": "file:git:http:https:ssh",
	} {
		if env[k] != want {
			t.Errorf("%s = %q, want %q", k, env[k], want)
		}
	}
	for _, k := range []string{"GIT_DIR", "GIT_INDEX_FILE"} {
		if v, ok := env[k]; ok {
			t.Errorf("%s inherited (%q)", k, v)
		}
	}
	// And git really works on the directory it is run in despite GIT_DIR.
	if _, err := (Git{}).Run(ctxT(t), repo, "rev-parse", "HEAD"); err != nil {
		t.Errorf("git with a stray GIT_DIR in aq's environment: %v", err)
	}
}

// Commits aq makes carry the repository's identity when it has one, and
// "aq <aq@localhost>" otherwise.
func TestCommitIdentity(t *testing.T) {
	testenv.Slow(t, "many real git repositories, worktrees and pushes")
	t.Parallel()
	ctx := ctxT(t)

	bare := newRepo(t) // no user.* configured anywhere (TestMain isolates global config)
	testenv.WriteFile(t, filepath.Join(bare, "x.txt"), "x\n")
	sha, changed, err := CommitAll(ctx, Git{}, bare, "aq commit")
	if err != nil || !changed {
		t.Fatal(err, changed)
	}
	if got := testenv.Git(t, bare, "log", "-1", "--format=%an <%ae>|%cn <%ce>", sha); got != "aq <aq@localhost>|aq <aq@localhost>" {
		t.Errorf("fallback identity = %q", got)
	}
	cp, err := Checkpoint(ctx, Git{}, bare, "aq/wip/x", "wip")
	if err != nil {
		t.Fatal(err)
	}
	if cp != sha {
		t.Errorf("clean checkpoint %s, want HEAD %s", cp, sha)
	}

	configured := newRepo(t)
	testenv.Git(t, configured, "config", "user.name", "Repo Owner")
	testenv.Git(t, configured, "config", "user.email", "owner@example.com")
	testenv.WriteFile(t, filepath.Join(configured, "x.txt"), "x\n")
	cp, err = Checkpoint(ctx, Git{}, configured, "aq/wip/x", "wip")
	if err != nil {
		t.Fatal(err)
	}
	if got := testenv.Git(t, configured, "log", "-1", "--format=%an <%ae>", cp); got != "Repo Owner <owner@example.com>" {
		t.Errorf("checkpoint identity = %q, want the repo's", got)
	}
	sha, _, err = CommitAll(ctx, Git{}, configured, "aq commit")
	if err != nil {
		t.Fatal(err)
	}
	if got := testenv.Git(t, configured, "log", "-1", "--format=%an <%ae>", sha); got != "Repo Owner <owner@example.com>" {
		t.Errorf("commit identity = %q, want the repo's", got)
	}

	half := newRepo(t)
	testenv.Git(t, half, "config", "user.name", "Only Name")
	testenv.WriteFile(t, filepath.Join(half, "x.txt"), "x\n")
	sha, _, err = CommitAll(ctx, Git{}, half, "aq commit")
	if err != nil {
		t.Fatal(err)
	}
	if got := testenv.Git(t, half, "log", "-1", "--format=%an <%ae>", sha); got != "Only Name <aq@localhost>" {
		t.Errorf("half-configured identity = %q", got)
	}
}
