package ship

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
)

// The fake gh is this test binary, started through a symlink named "gh":
// TestMain sees its name and runs fakeGH instead of the tests. It records
// every call (argv, directory, the body file's text, the environment's
// interesting keys) to $FAKEGH_DIR/calls.jsonl and answers as gh 2.x does
// (cli/cli pkg/cmd/auth/status, pkg/cmd/pr/create, list, merge): the PR URL
// on stdout for create, a JSON array for list --json url, exit 1 with gh's
// own messages on failure. Files in $FAKEGH_DIR switch behaviours:
//
//	logged-out     auth status: not logged in (exit 1)
//	create-fails   pr create: fails with GitHub's "No commits between" error
//	auto-refused   pr merge --auto: GitHub refuses auto-merge (PR already clean)
//	merge-fails    pr merge: auto-merge disabled, and the PR not mergeable now
//	prs.json       the pull requests that exist

type fakeCall struct {
	Args []string          `json:"args"`
	Dir  string            `json:"dir"`
	Body string            `json:"body,omitempty"`
	Env  map[string]string `json:"env"`
}

type fakePR struct {
	Number int    `json:"number"`
	Head   string `json:"head"`
	Base   string `json:"base"`
	URL    string `json:"url"`
	State  string `json:"state"` // OPEN, MERGED
	Auto   string `json:"auto,omitempty"`
}

func fakeGH(args []string) int {
	dir := os.Getenv("FAKEGH_DIR")
	has := func(name string) bool { _, err := os.Stat(filepath.Join(dir, name)); return err == nil }
	call := fakeCall{Args: args, Env: map[string]string{}}
	call.Dir, _ = os.Getwd()
	for _, k := range []string{"GH_TOKEN", "AQ_FLEET_TOKEN", "AQ_SB_CONNECTION_STRING", "GH_PROMPT_DISABLED", "NO_COLOR", "GH_NO_UPDATE_NOTIFIER"} {
		if v, ok := os.LookupEnv(k); ok {
			call.Env[k] = v
		}
	}
	defer func() {
		b, _ := json.Marshal(call)
		f, err := os.OpenFile(filepath.Join(dir, "calls.jsonl"), os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o600)
		if err == nil {
			f.Write(append(b, '\n'))
			f.Close()
		}
	}()
	prs := loadPRs(dir)
	if len(args) < 2 {
		fmt.Fprintln(os.Stderr, "unknown command")
		return 1
	}
	fs := flag.NewFlagSet("gh", flag.ContinueOnError)
	fs.SetOutput(new(strings.Builder))
	var (
		hostname, head, base, title, bodyFile, repo, state, jsonFields, match string
		auto, squash, merge, rebase, del                                      bool
		limit                                                                 int
	)
	fs.StringVar(&hostname, "hostname", "", "")
	fs.StringVar(&head, "head", "", "")
	fs.StringVar(&base, "base", "", "")
	fs.StringVar(&title, "title", "", "")
	fs.StringVar(&bodyFile, "body-file", "", "")
	fs.StringVar(&repo, "repo", "", "")
	fs.StringVar(&state, "state", "open", "")
	fs.StringVar(&jsonFields, "json", "", "")
	fs.StringVar(&match, "match-head-commit", "", "")
	fs.IntVar(&limit, "limit", 30, "")
	fs.BoolVar(&auto, "auto", false, "")
	fs.BoolVar(&squash, "squash", false, "")
	fs.BoolVar(&merge, "merge", false, "")
	fs.BoolVar(&rebase, "rebase", false, "")
	fs.BoolVar(&del, "delete-branch", false, "")
	// gh takes the positional argument anywhere; the fake wants it first.
	rest := args[2:]
	var pos []string
	if len(rest) > 0 && !strings.HasPrefix(rest[0], "-") {
		pos, rest = rest[:1], rest[1:]
	}
	if err := fs.Parse(rest); err != nil {
		fmt.Fprintf(os.Stderr, "unknown flag: %v\n", err)
		return 1
	}
	if repo == "" {
		repo = "github.com/acme/widgets"
	}
	switch args[0] + " " + args[1] {
	case "auth status":
		if has("logged-out") {
			fmt.Fprintln(os.Stderr, "You are not logged into any GitHub hosts. To log in, run: gh auth login")
			return 1
		}
		h := hostname
		if h == "" {
			h = "github.com"
		}
		fmt.Printf("%s\n  ✓ Logged in to %s account aq-bot (GH_TOKEN)\n  - Active account: true\n  - Git operations protocol: https\n  - Token: gho_************************************\n", h, h)
		return 0
	case "auth token":
		// gh 2.x: the token on stdout; logged out, its error (exit 1).
		if has("logged-out") {
			fmt.Fprintln(os.Stderr, "no oauth token found for "+cmpOr(hostname, "github.com"))
			return 1
		}
		fmt.Println(cmpOr(os.Getenv("GH_TOKEN"), "gho_fakeghTokenFromTheHostsFile0123456789"))
		return 0
	case "pr create":
		b, err := os.ReadFile(bodyFile)
		if err != nil {
			fmt.Fprintf(os.Stderr, "open %s: no such file or directory\n", bodyFile)
			return 1
		}
		call.Body = string(b)
		if title == "" || head == "" || base == "" {
			fmt.Fprintln(os.Stderr, "must provide `--title` and `--body` (or `--fill` or `fill-first` or `--fillverbose`) when not running interactively")
			return 1
		}
		if has("create-fails") {
			fmt.Fprintf(os.Stderr, "pull request create failed: GraphQL: No commits between %s and %s (createPullRequest)\n", base, head)
			return 1
		}
		for _, p := range prs {
			if p.Head == head && p.Base == base && p.State == "OPEN" {
				fmt.Fprintf(os.Stderr, "a pull request for branch %q into branch %q already exists:\n%s\n", head, base, p.URL)
				return 1
			}
		}
		n := len(prs) + 1
		p := fakePR{Number: n, Head: head, Base: base, URL: fmt.Sprintf("https://%s/pull/%d", repo, n), State: "OPEN"}
		savePRs(dir, append(prs, p))
		fmt.Println(p.URL)
		return 0
	case "pr list":
		if jsonFields != "url" {
			fmt.Fprintln(os.Stderr, "the fake only knows --json url")
			return 1
		}
		out := []map[string]string{}
		for _, p := range prs {
			if (head == "" || p.Head == head) && (base == "" || p.Base == base) && (state == "all" || strings.EqualFold(p.State, state)) && len(out) < limit {
				out = append(out, map[string]string{"url": p.URL})
			}
		}
		b, _ := json.MarshalIndent(out, "", "  ")
		fmt.Println(string(b))
		return 0
	case "pr merge":
		n := 0
		for _, x := range []bool{squash, merge, rebase} {
			if x {
				n++
			}
		}
		if n != 1 {
			fmt.Fprintln(os.Stderr, "--merge, --rebase, or --squash required when not running interactively")
			return 1
		}
		if len(pos) != 1 {
			fmt.Fprintln(os.Stderr, "the fake wants the PR URL")
			return 1
		}
		if has("merge-fails") {
			if auto {
				fmt.Fprintln(os.Stderr, "GraphQL: Auto merge is not allowed for this repository (enablePullRequestAutoMerge)")
			} else {
				fmt.Fprintln(os.Stderr, "X Pull request acme/widgets#1 is not mergeable: the base branch policy prohibits the merge.")
			}
			return 1
		}
		if auto && has("auto-refused") {
			fmt.Fprintln(os.Stderr, "GraphQL: Pull request Pull request is in clean status (enablePullRequestAutoMerge)")
			return 1
		}
		for i, p := range prs {
			if p.URL == pos[0] {
				if auto {
					prs[i].Auto = "squash"
					fmt.Fprintf(os.Stderr, "! Pull request %s#%d will be automatically merged via squash when all requirements are met\n", repo, p.Number)
				} else {
					prs[i].State = "MERGED"
					fmt.Fprintf(os.Stderr, "✓ Squashed and merged pull request %s#%d\n", repo, p.Number)
				}
				savePRs(dir, prs)
				return 0
			}
		}
		fmt.Fprintf(os.Stderr, "no pull requests found for %s\n", pos[0])
		return 1
	}
	fmt.Fprintf(os.Stderr, "unknown command %q for \"gh\"\n", strings.Join(args[:2], " "))
	return 1
}

func loadPRs(dir string) []fakePR {
	b, err := os.ReadFile(filepath.Join(dir, "prs.json"))
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	var prs []fakePR
	json.Unmarshal(b, &prs)
	return prs
}

func savePRs(dir string, prs []fakePR) {
	b, _ := json.MarshalIndent(prs, "", "  ")
	os.WriteFile(filepath.Join(dir, "prs.json"), b, 0o600)
}

func cmpOr(a, b string) string {
	if a != "" {
		return a
	}
	return b
}
