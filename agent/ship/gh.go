// Package ship opens pull requests and enables auto-merge with the GitHub CLI
// `gh` (ship: pr | merge, docs/ship.md): the tool users already have and
// are logged in to. The runner has pushed the job branch before it calls
// Ship; nothing here pushes.
//
// Behaviour of gh relied on (cli.github.com/manual, gh 2.x):
//   - `gh auth status --hostname H` exits 0 when logged in to H and 1 when not
//     ("You are not logged into any GitHub hosts. To log in, run: gh auth
//     login") or when the token is invalid. Only the exit status is used.
//   - `gh pr create` prints the new PR's URL on stdout; when an open PR for the
//     head already exists it fails ("a pull request for branch ... already
//     exists"), and `gh pr list --head B --base b --state open --json url`
//     answers `[{"url": ...}]`.
//   - `gh pr merge URL --auto --squash` enables auto-merge, or merges at once
//     when the PR is already mergeable. --delete-branch with --auto cannot
//     delete anything after a later merge (cli/cli#9073): deleting the branch
//     is then the repository's "Automatically delete head branches" setting's
//     job, and `aq gc`'s (it deletes merged and squash-merged aq/job/*
//     branches on origin). With --repo, gh never deletes the local branch
//     (which a worktree may have checked out).
package ship

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"time"

	"github.com/aqfleet/aq/agent/runner"
	"github.com/aqfleet/aq/internal/brief"
	"github.com/aqfleet/aq/internal/secrets"
	"github.com/aqfleet/aq/worktree"
)

// GH ships with the GitHub CLI.
type GH struct {
	// Bin is the gh executable (default "gh" from PATH).
	Bin string
	// Env is the environment gh starts from (default: aq's own). aq's
	// secrets are always removed; gh's credentials (GH_TOKEN, its config
	// dir) stay.
	Env []string
	// Strategy is how ship: merge merges: "squash" (default: one commit
	// per job on base, what most teams want of bot PRs), "merge" or
	// "rebase".
	Strategy string
	// Git reads the origin URL and the branch's commit.
	Git worktree.Git
}

var _ runner.Shipper = GH{}

// Timeouts for gh calls: they talk to GitHub.
const (
	authTimeout = 30 * time.Second
	callTimeout = 2 * time.Minute
)

// NotReadyError is the pre-flight's answer: gh is missing or not logged in.
// Its message names the capability (has:gh) and the fix.
type NotReadyError struct {
	Host   string
	Reason string // what is wrong
	Fix    string
	Err    error
}

func (e *NotReadyError) Error() string {
	return fmt.Sprintf("ship needs has:gh: %s (%s)", e.Reason, e.Fix)
}

func (e *NotReadyError) Unwrap() error { return e.Err }

func (g GH) bin() string {
	if g.Bin != "" {
		return g.Bin
	}
	return "gh"
}

// Ready checks that gh is installed and logged in to the host of repoDir's
// origin (github.com when origin is not a URL gh could use).
func (g GH) Ready(ctx context.Context, repoDir string) error {
	if _, err := exec.LookPath(g.bin()); err != nil {
		return &NotReadyError{Reason: fmt.Sprintf("the GitHub CLI %q is not installed or not on PATH", g.bin()),
			Fix: "install it from https://cli.github.com, then run: gh auth login", Err: err}
	}
	rem, _ := g.origin(ctx, repoDir)
	args := []string{"auth", "status"}
	host := rem.host
	if host != "" {
		args = append(args, "--hostname", host)
	}
	ctx, cancel := context.WithTimeout(ctx, authTimeout)
	defer cancel()
	_, stderr, err := g.run(ctx, repoDir, args...)
	if err == nil {
		return nil
	}
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ctx.Err() != nil {
		return &NotReadyError{Host: host, Reason: "gh auth status did not run: " + err.Error(), Fix: "check that gh works: gh auth status", Err: err}
	}
	where, fix := "any GitHub host", "run: gh auth login, or set GH_TOKEN for aq"
	if host != "" {
		where, fix = host, "run: gh auth login --hostname "+host+", or set GH_TOKEN for aq"
	}
	reason := "gh is not logged in to " + where
	if line := brief.FirstLine(stderr, 300); line != "" {
		reason += ": " + line
	}
	return &NotReadyError{Host: host, Reason: reason, Fix: fix, Err: err}
}

// Token is the token gh holds for the host of repoDir's origin (`gh auth
// token`): a secret no change may carry (runner.GHToken). "" when gh is
// not installed or not logged in.
func (g GH) Token(ctx context.Context, repoDir string) string {
	if _, err := exec.LookPath(g.bin()); err != nil {
		return ""
	}
	rem, _ := g.origin(ctx, repoDir)
	args := []string{"auth", "token"}
	if rem.host != "" {
		args = append(args, "--hostname", rem.host)
	}
	ctx, cancel := context.WithTimeout(ctx, authTimeout)
	defer cancel()
	out, _, err := g.run(ctx, repoDir, args...)
	if err != nil {
		return ""
	}
	return strings.TrimSpace(out)
}

var _ runner.GHToken = GH{}

// Ship opens the pull request of req.Branch into req.Base, or finds the one
// already open (a retried job), and for req.Merge enables auto-merge with
// branch deletion. It returns the PR's URL, also when enabling auto-merge
// failed (the error then says so).
func (g GH) Ship(ctx context.Context, req runner.ShipRequest) (string, error) {
	rem, _ := g.origin(ctx, req.RepoDir)
	body, err := os.CreateTemp("", "aq-pr-body-*.md")
	if err != nil {
		return "", fmt.Errorf("gh pr create: cannot write the PR body: %w", err)
	}
	defer os.Remove(body.Name())
	_, werr := body.WriteString(req.Body)
	if cerr := body.Close(); werr == nil {
		werr = cerr
	}
	if werr != nil {
		return "", fmt.Errorf("gh pr create: cannot write the PR body: %w", werr)
	}

	args := []string{"pr", "create", "--head", req.Branch, "--base", req.Base, "--title", req.Title, "--body-file", body.Name()}
	args = append(args, rem.repoFlag()...)
	cctx, cancel := context.WithTimeout(ctx, callTimeout)
	stdout, stderr, err := g.run(cctx, req.RepoDir, args...)
	cancel()
	prURL := findPRURL(stdout)
	if err != nil || prURL == "" {
		// A retried job: its PR may already be open.
		existing, lerr := g.findOpen(ctx, req, rem)
		if lerr != nil || existing == "" {
			if err == nil {
				err = fmt.Errorf("gh pr create printed no pull request URL (stdout %q)", brief.Clip(strings.TrimSpace(stdout), 300))
			} else {
				err = ghError("gh pr create", stderr, err)
			}
			return "", errors.Join(err, lerr)
		}
		prURL = existing
	}
	if !req.Merge {
		return prURL, nil
	}
	if err := g.merge(ctx, req, rem, prURL); err != nil {
		return prURL, fmt.Errorf("pull request %s is open, but it could not be set to merge: %w", prURL, err)
	}
	return prURL, nil
}

// findOpen returns the URL of the open PR of req.Branch into req.Base, if
// there is one.
func (g GH) findOpen(ctx context.Context, req runner.ShipRequest, rem remote) (string, error) {
	args := []string{"pr", "list", "--head", req.Branch, "--base", req.Base, "--state", "open", "--json", "url", "--limit", "1"}
	args = append(args, rem.repoFlag()...)
	ctx, cancel := context.WithTimeout(ctx, callTimeout)
	defer cancel()
	stdout, stderr, err := g.run(ctx, req.RepoDir, args...)
	if err != nil {
		return "", ghError("gh pr list", stderr, err)
	}
	var prs []struct {
		URL string `json:"url"`
	}
	if err := json.Unmarshal([]byte(stdout), &prs); err != nil {
		return "", fmt.Errorf("gh pr list --json url: unexpected output %q: %v", brief.Clip(strings.TrimSpace(stdout), 300), err)
	}
	if len(prs) == 0 {
		return "", nil
	}
	return prs[0].URL, nil
}

// merge enables auto-merge. If GitHub refuses (a PR that became mergeable
// in the meantime is refused auto-merge: "is in clean status"), it merges at
// once instead, which GitHub allows only when the PR meets every
// requirement: the same result auto-merge would reach.
func (g GH) merge(ctx context.Context, req runner.ShipRequest, rem remote, prURL string) error {
	repo := rem.repoFlag()
	if len(repo) == 0 {
		repo = repoFlagFromURL(prURL) // with --repo, gh leaves the local branch alone
	}
	flags := []string{"--" + g.strategy(), "--delete-branch"}
	if sha, ok, _ := worktree.ResolveRef(ctx, g.Git, req.RepoDir, "refs/heads/"+req.Branch); ok {
		// Merge exactly what aq pushed, never a commit pushed to the PR later.
		flags = append(flags, "--match-head-commit", sha)
	}
	flags = append(flags, repo...)
	auto := append([]string{"pr", "merge", prURL, "--auto"}, flags...)
	now := append([]string{"pr", "merge", prURL}, flags...)
	cctx, cancel := context.WithTimeout(ctx, callTimeout)
	_, stderr, err := g.run(cctx, req.RepoDir, auto...)
	cancel()
	if err == nil {
		return nil
	}
	autoErr := ghError("gh pr merge --auto", stderr, err)
	if ctx.Err() != nil {
		return autoErr
	}
	cctx, cancel = context.WithTimeout(ctx, callTimeout)
	defer cancel()
	if _, stderr2, err2 := g.run(cctx, req.RepoDir, now...); err2 != nil {
		return fmt.Errorf("%w; merging at once failed too: %v", autoErr, ghError("gh pr merge", stderr2, err2))
	}
	return nil
}

func (g GH) strategy() string {
	switch g.Strategy {
	case "merge", "rebase":
		return g.Strategy
	}
	return "squash"
}

// run runs gh in dir with the shipping environment; stdout and stderr are
// returned whatever happens.
func (g GH) run(ctx context.Context, dir string, args ...string) (stdout, stderr string, err error) {
	// gh runs git in dir (to read the remotes): that git runs nothing the
	// repository's configuration names either.
	env, err := g.Git.HardenedEnv(ctx, dir, g.environ())
	if err != nil {
		return "", "", err
	}
	cmd := exec.CommandContext(ctx, g.bin(), args...)
	cmd.Dir = dir
	cmd.Env = env
	cmd.WaitDelay = 5 * time.Second
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err = cmd.Run()
	return out.String(), errb.String(), err
}

// environ is the engine-like environment (aq's secrets removed), made
// non-interactive: gh never prompts, pages, colours or checks for updates.
func (g GH) environ() []string {
	env := g.Env
	if env == nil {
		env = os.Environ()
	}
	env = secrets.EngineEnv(env, "GH_PAGER", "PAGER", "GH_PROMPT_DISABLED", "GH_NO_UPDATE_NOTIFIER", "NO_COLOR", "CLICOLOR_FORCE", "GH_FORCE_TTY")
	return append(env,
		"GH_PROMPT_DISABLED=1",
		"GH_NO_UPDATE_NOTIFIER=1",
		"GH_PAGER=cat",
		"NO_COLOR=1",
		"GIT_TERMINAL_PROMPT=0",
	)
}

// remote is a GitHub repository named by a git remote URL.
type remote struct {
	host, owner, name string
}

// repoFlag is "--repo HOST/OWNER/REPO", or nothing when unknown (gh then
// works out the repository from the remotes of the directory it runs in).
func (r remote) repoFlag() []string {
	if r.host == "" {
		return nil
	}
	return []string{"--repo", r.host + "/" + r.owner + "/" + r.name}
}

// origin reads and parses repoDir's origin URL.
func (g GH) origin(ctx context.Context, repoDir string) (remote, error) {
	u, err := g.Git.Run(ctx, repoDir, "remote", "get-url", "origin")
	if err != nil {
		return remote{}, err
	}
	r, ok := parseRemote(u)
	if !ok {
		return remote{}, fmt.Errorf("origin %q is not a GitHub URL", u)
	}
	return r, nil
}

var scpLike = regexp.MustCompile(`^(?:[^@/]+@)?([^:/]+):([^/].*)$`)

// parseRemote understands https://host/owner/repo(.git),
// ssh://[user@]host[:port]/owner/repo(.git) and [user@]host:owner/repo(.git).
// Local paths and other URLs are not GitHub repositories.
func parseRemote(s string) (remote, bool) {
	s = strings.TrimSpace(s)
	var host, path string
	if strings.Contains(s, "://") {
		u, err := url.Parse(s)
		if err != nil || (u.Scheme != "https" && u.Scheme != "http" && u.Scheme != "ssh" && u.Scheme != "git") {
			return remote{}, false
		}
		host, path = u.Hostname(), u.Path
	} else if m := scpLike.FindStringSubmatch(s); m != nil && !strings.HasPrefix(s, "/") && !strings.HasPrefix(s, ".") {
		host, path = m[1], m[2]
	} else {
		return remote{}, false
	}
	parts := strings.Split(strings.Trim(strings.TrimSuffix(strings.TrimSuffix(path, "/"), ".git"), "/"), "/")
	if host == "" || len(parts) != 2 || parts[0] == "" || parts[1] == "" {
		return remote{}, false
	}
	return remote{host: strings.ToLower(host), owner: parts[0], name: parts[1]}, true
}

var prURLPattern = regexp.MustCompile(`https?://[^\s]+/pull/\d+`)

// findPRURL picks the PR URL from gh pr create's stdout (its last line).
func findPRURL(stdout string) string {
	all := prURLPattern.FindAllString(stdout, -1)
	if len(all) == 0 {
		return ""
	}
	return all[len(all)-1]
}

// repoFlagFromURL is --repo HOST/OWNER/REPO for a PR URL
// (https://HOST/OWNER/REPO/pull/N).
func repoFlagFromURL(prURL string) []string {
	u, err := url.Parse(prURL)
	if err != nil {
		return nil
	}
	parts := strings.Split(strings.Trim(u.Path, "/"), "/")
	if len(parts) < 4 || parts[2] != "pull" {
		return nil
	}
	return []string{"--repo", u.Hostname() + "/" + parts[0] + "/" + parts[1]}
}

// ghError makes one line of a failed gh run: what ran, and gh's own first
// line of complaint.
func ghError(what, stderr string, err error) error {
	if line := brief.FirstLine(stderr, 300); line != "" {
		return fmt.Errorf("%s: %s", what, line)
	}
	return fmt.Errorf("%s: %w", what, err)
}
