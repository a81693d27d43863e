package ship

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/aqfleet/aq/agent/runner"
	"github.com/aqfleet/aq/internal/testenv"
	"github.com/aqfleet/aq/worktree"
)

func TestMain(m *testing.M) {
	if filepath.Base(os.Args[0]) == "gh" {
		os.Exit(fakeGH(os.Args[1:]))
	}
	os.Setenv("GIT_CONFIG_NOSYSTEM", "1")
	os.Exit(m.Run())
}

// fake is a fake gh on its own PATH directory with its own state.
type fake struct {
	t     *testing.T
	bin   string // the "gh" symlink
	state string
	repo  string // a git repository whose origin is on github.com
}

func newFake(t *testing.T, origin string) *fake {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	root := t.TempDir()
	f := &fake{t: t, bin: filepath.Join(root, "bin", "gh"), state: filepath.Join(root, "state"), repo: filepath.Join(root, "repo")}
	for _, d := range []string{filepath.Dir(f.bin), f.state} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink(exe, f.bin); err != nil {
		t.Fatal(err)
	}
	run := func(dir string, args ...string) {
		cmd := exec.Command("git", args...)
		cmd.Dir = dir
		cmd.Env = append(os.Environ(), "GIT_AUTHOR_NAME=t", "GIT_AUTHOR_EMAIL=t@e", "GIT_COMMITTER_NAME=t", "GIT_COMMITTER_EMAIL=t@e")
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("git %v: %v %s", args, err, out)
		}
	}
	run("", "init", "-q", "-b", "main", f.repo)
	run(f.repo, "commit", "-q", "--allow-empty", "-m", "init")
	run(f.repo, "branch", "aq/job/fix-login")
	if origin != "" {
		run(f.repo, "remote", "add", "origin", origin)
	}
	return f
}

func (f *fake) gh() GH {
	env := append(os.Environ(), "FAKEGH_DIR="+f.state, "GH_TOKEN=gho_secret_for_gh", "AQ_FLEET_TOKEN=fleet-secret")
	return GH{Bin: f.bin, Env: env}
}

func (f *fake) touch(name string) {
	if err := os.WriteFile(filepath.Join(f.state, name), nil, 0o600); err != nil {
		f.t.Fatal(err)
	}
}

func (f *fake) calls() []fakeCall {
	f.t.Helper()
	file, err := os.Open(filepath.Join(f.state, "calls.jsonl"))
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		f.t.Fatal(err)
	}
	defer file.Close()
	var calls []fakeCall
	sc := bufio.NewScanner(file)
	sc.Buffer(nil, 1<<24)
	for sc.Scan() {
		var c fakeCall
		if err := json.Unmarshal(sc.Bytes(), &c); err != nil {
			f.t.Fatal(err)
		}
		calls = append(calls, c)
	}
	return calls
}

func (f *fake) head() string {
	sha, _, err := worktree.ResolveRef(context.Background(), worktree.Git{}, f.repo, "refs/heads/aq/job/fix-login")
	if err != nil {
		f.t.Fatal(err)
	}
	return sha
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	return ctx
}

func req(f *fake, merge bool) runner.ShipRequest {
	return runner.ShipRequest{RepoDir: f.repo, Branch: "aq/job/fix-login", Base: "main", Title: "Fix the login redirect loop",
		Body: "body", Merge: merge}
}

func TestReady(t *testing.T) {
	testenv.Slow(t, "ships through real repositories and pushes")
	t.Parallel()
	ctx := ctxT(t)
	f := newFake(t, "git@github.com:acme/widgets.git")
	if err := f.gh().Ready(ctx, f.repo); err != nil {
		t.Fatalf("logged in: %v", err)
	}
	if got := f.calls()[0].Args; !slices.Equal(got, []string{"auth", "status", "--hostname", "github.com"}) {
		t.Errorf("argv %q", got)
	}

	f.touch("logged-out")
	err := f.gh().Ready(ctx, f.repo)
	var nr *NotReadyError
	if !errors.As(err, &nr) {
		t.Fatalf("logged out: %v", err)
	}
	for _, want := range []string{"has:gh", "not logged in to github.com", "gh auth login --hostname github.com", "You are not logged into any GitHub hosts"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("%q does not say %q", err, want)
		}
	}

	err = GH{Bin: "gh-is-not-installed-here"}.Ready(ctx, f.repo)
	if !errors.As(err, &nr) || !strings.Contains(err.Error(), "has:gh") || !strings.Contains(err.Error(), "https://cli.github.com") {
		t.Fatalf("gh missing: %v", err)
	}
}

// Without a GitHub origin, gh is asked about every host it knows.
// TestToken: gh's token for origin's host is a secret the change scan
// looks for (runner.GHToken); none when gh is logged out or missing.
func TestToken(t *testing.T) {
	testenv.Slow(t, "ships through real repositories and pushes")
	t.Parallel()
	ctx := ctxT(t)
	f := newFake(t, "git@github.com:acme/widgets.git")
	if got := f.gh().Token(ctx, f.repo); got != "gho_secret_for_gh" { // newFake gives gh GH_TOKEN
		t.Errorf("Token = %q", got)
	}
	if got := f.calls()[0].Args; !slices.Equal(got, []string{"auth", "token", "--hostname", "github.com"}) {
		t.Errorf("argv %q", got)
	}
	f.touch("logged-out")
	if got := f.gh().Token(ctx, f.repo); got != "" {
		t.Errorf("logged out: Token = %q", got)
	}
	if got := (GH{Bin: "gh-is-not-installed-here"}).Token(ctx, f.repo); got != "" {
		t.Errorf("no gh: Token = %q", got)
	}
}

func TestReadyWithoutGitHubOrigin(t *testing.T) {
	testenv.Slow(t, "ships through real repositories and pushes")
	t.Parallel()
	f := newFake(t, "/srv/git/widgets.git")
	if err := f.gh().Ready(ctxT(t), f.repo); err != nil {
		t.Fatal(err)
	}
	if got := f.calls()[0].Args; !slices.Equal(got, []string{"auth", "status"}) {
		t.Errorf("argv %q", got)
	}
}

// ship: pr — the PR is opened against base with the body in a file, never
// in argv; gh runs in the repository without aq's secrets.
func TestShipPR(t *testing.T) {
	testenv.Slow(t, "ships through real repositories and pushes")
	t.Parallel()
	f := newFake(t, "https://github.com/acme/widgets.git")
	r := req(f, false)
	r.Body = "## What\n\nFixes the \"loop\" & more; `rm -rf /` is just text.\n" + strings.Repeat("long line of body text\n", 20000)
	url, err := f.gh().Ship(ctxT(t), r)
	if err != nil {
		t.Fatal(err)
	}
	if url != "https://github.com/acme/widgets/pull/1" {
		t.Errorf("url %q", url)
	}
	calls := f.calls()
	if len(calls) != 1 {
		t.Fatalf("calls: %+v", calls)
	}
	c := calls[0]
	wantPrefix := []string{"pr", "create", "--head", "aq/job/fix-login", "--base", "main", "--title", "Fix the login redirect loop", "--body-file"}
	if !slices.Equal(c.Args[:len(wantPrefix)], wantPrefix) || !slices.Equal(c.Args[len(wantPrefix)+1:], []string{"--repo", "github.com/acme/widgets"}) {
		t.Errorf("argv %q", c.Args)
	}
	if c.Body != r.Body {
		t.Errorf("body: got %d bytes, want %d", len(c.Body), len(r.Body))
	}
	for _, a := range c.Args {
		if strings.Contains(a, "long line of body") {
			t.Fatal("the body is on the command line")
		}
	}
	if _, err := os.Stat(c.Args[len(wantPrefix)]); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the body file %s was left behind", c.Args[len(wantPrefix)])
	}
	if c.Dir != f.repo {
		if real, _ := filepath.EvalSymlinks(f.repo); c.Dir != real {
			t.Errorf("gh ran in %s, want %s", c.Dir, f.repo)
		}
	}
	if c.Env["GH_TOKEN"] != "gho_secret_for_gh" || c.Env["AQ_FLEET_TOKEN"] != "" || c.Env["GH_PROMPT_DISABLED"] != "1" {
		t.Errorf("gh's environment: %v (want GH_TOKEN kept, aq's secrets gone, prompts off)", c.Env)
	}
}

// ship: merge — after the PR, auto-merge with branch deletion, squash by
// default, pinned to the commit aq pushed; --repo keeps gh from deleting the
// local branch a worktree holds.
func TestShipMerge(t *testing.T) {
	testenv.Slow(t, "ships through real repositories and pushes")
	t.Parallel()
	f := newFake(t, "https://github.com/acme/widgets.git")
	url, err := f.gh().Ship(ctxT(t), req(f, true))
	if err != nil {
		t.Fatal(err)
	}
	calls := f.calls()
	if len(calls) != 2 {
		t.Fatalf("calls: %+v", calls)
	}
	want := []string{"pr", "merge", url, "--auto", "--squash", "--delete-branch", "--match-head-commit", f.head(), "--repo", "github.com/acme/widgets"}
	if !slices.Equal(calls[1].Args, want) {
		t.Errorf("merge argv\n got %q\nwant %q", calls[1].Args, want)
	}
	prs := loadPRs(f.state)
	if len(prs) != 1 || prs[0].Auto != "squash" {
		t.Errorf("prs %+v", prs)
	}

	g := f.gh()
	g.Strategy = "rebase"
	r := req(f, true)
	r.Branch = "aq/job/other"
	if _, err := g.Ship(ctxT(t), r); err != nil {
		t.Fatal(err)
	}
	last := f.calls()[len(f.calls())-1].Args
	if !slices.Contains(last, "--rebase") || slices.Contains(last, "--squash") || slices.Contains(last, "--match-head-commit") {
		t.Errorf("rebase merge argv %q (no local branch aq/job/other: no pin)", last)
	}
}

// A retried job: its PR is already open; Ship finds and returns it.
func TestShipPRAlreadyExists(t *testing.T) {
	testenv.Slow(t, "ships through real repositories and pushes")
	t.Parallel()
	f := newFake(t, "https://github.com/acme/widgets.git")
	savePRs(f.state, []fakePR{
		{Number: 7, Head: "aq/job/fix-login", Base: "main", URL: "https://github.com/acme/widgets/pull/7", State: "OPEN"},
		{Number: 8, Head: "aq/job/fix-login", Base: "release", URL: "https://github.com/acme/widgets/pull/8", State: "OPEN"},
	})
	url, err := f.gh().Ship(ctxT(t), req(f, true))
	if err != nil {
		t.Fatal(err)
	}
	if url != "https://github.com/acme/widgets/pull/7" {
		t.Fatalf("url %q", url)
	}
	calls := f.calls()
	if len(calls) != 3 || calls[0].Args[1] != "create" || calls[1].Args[1] != "list" || calls[2].Args[1] != "merge" {
		t.Fatalf("calls %+v", calls)
	}
	if !slices.Equal(calls[1].Args, []string{"pr", "list", "--head", "aq/job/fix-login", "--base", "main", "--state", "open", "--json", "url", "--limit", "1", "--repo", "github.com/acme/widgets"}) {
		t.Errorf("list argv %q", calls[1].Args)
	}
}

// GitHub refuses auto-merge for a PR that is already mergeable: it is
// merged at once instead.
func TestShipMergeWhenAutoMergeRefused(t *testing.T) {
	testenv.Slow(t, "ships through real repositories and pushes")
	t.Parallel()
	f := newFake(t, "https://github.com/acme/widgets.git")
	f.touch("auto-refused")
	if _, err := f.gh().Ship(ctxT(t), req(f, true)); err != nil {
		t.Fatal(err)
	}
	calls := f.calls()
	if len(calls) != 3 || !slices.Contains(calls[1].Args, "--auto") || slices.Contains(calls[2].Args, "--auto") {
		t.Fatalf("calls %+v", calls)
	}
	if prs := loadPRs(f.state); prs[0].State != "MERGED" {
		t.Errorf("prs %+v", prs)
	}
}

// Auto-merge impossible and the PR not mergeable now: the error says so and
// names the PR, which stays open.
func TestShipMergeFails(t *testing.T) {
	testenv.Slow(t, "ships through real repositories and pushes")
	t.Parallel()
	f := newFake(t, "https://github.com/acme/widgets.git")
	f.touch("merge-fails")
	url, err := f.gh().Ship(ctxT(t), req(f, true))
	if err == nil || url != "https://github.com/acme/widgets/pull/1" {
		t.Fatalf("url %q err %v", url, err)
	}
	for _, want := range []string{url, "Auto merge is not allowed", "base branch policy prohibits the merge"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("%q does not say %q", err, want)
		}
	}
}

// A PR that cannot be opened (and none is open) fails with gh's reason.
func TestShipCreateFails(t *testing.T) {
	testenv.Slow(t, "ships through real repositories and pushes")
	t.Parallel()
	f := newFake(t, "https://github.com/acme/widgets.git")
	f.touch("create-fails")
	_, err := f.gh().Ship(ctxT(t), req(f, false))
	if err == nil || !strings.Contains(err.Error(), "No commits between main and aq/job/fix-login") {
		t.Fatalf("err %v", err)
	}
}

func TestParseRemote(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{
		"https://github.com/acme/widgets.git":         "github.com/acme/widgets",
		"https://github.com/acme/widgets":             "github.com/acme/widgets",
		"https://x-access-token@GitHub.com/acme/w/":   "github.com/acme/w",
		"git@github.com:acme/widgets.git":             "github.com/acme/widgets",
		"ssh://git@ghe.example.com:2222/team/api.git": "ghe.example.com/team/api",
		"github.com:acme/widgets":                     "github.com/acme/widgets",
		"/srv/git/widgets.git":                        "",
		"./widgets":                                   "",
		"file:///srv/git/widgets.git":                 "",
		"https://github.com/acme":                     "",
		"https://gitlab.com/group/sub/project.git":    "",
	} {
		r, ok := parseRemote(in)
		got := ""
		if ok {
			got = strings.Join(r.repoFlag()[1:], "")
		}
		if got != want {
			t.Errorf("parseRemote(%q) = %q, want %q", in, got, want)
		}
	}
	if got := repoFlagFromURL("https://ghe.example.com/team/api/pull/12"); !slices.Equal(got, []string{"--repo", "ghe.example.com/team/api"}) {
		t.Errorf("repoFlagFromURL = %q", got)
	}
	if got := findPRURL("Warning: 2 uncommitted changes\nhttps://github.com/acme/widgets/pull/3\n"); got != "https://github.com/acme/widgets/pull/3" {
		t.Errorf("findPRURL = %q", got)
	}
}
