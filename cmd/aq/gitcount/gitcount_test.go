//go:build !unit

// Package gitcount counts the git processes of a trivial job (#35 item 1):
// the aq binary runs one job through `aq run --once` with a `git` on PATH
// that logs its arguments and executes the real git, and the test asserts
// how many there were, and of which kinds. A count, not a time: every git
// process of a job is there for a reason this test names.
package gitcount

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/aqfleet/aq/internal/testenv"
)

func TestMain(m *testing.M) { os.Exit(testenv.Main(m)) }

// gitLog is a logging git: dir/bin/git appends one line per call (its
// arguments, separated by spaces) to dir/git.log and execs the real git.
type gitLog struct {
	dir, bin, log string
}

// newGitLog writes the wrapper into dir (a directory the sandbox shows: the
// test names it in AQ_SANDBOX_WRITABLE, so a git run inside the job's sandbox
// is counted too).
func newGitLog(tb testing.TB, dir string) *gitLog {
	tb.Helper()
	real, err := exec.LookPath("git")
	if err != nil {
		tb.Skip("no git here")
	}
	real, err = filepath.EvalSymlinks(real)
	if err != nil {
		tb.Fatal(err)
	}
	g := &gitLog{dir: dir, bin: filepath.Join(dir, "bin"), log: filepath.Join(dir, "git.log")}
	if err := os.MkdirAll(g.bin, 0o755); err != nil {
		tb.Fatal(err)
	}
	// One line per call: the arguments separated by \037 (a commit
	// message's newlines become |), written by one printf with O_APPEND and
	// under PIPE_BUF, so that the lines of concurrent gits never interleave.
	script := "#!/bin/sh\nline=$(printf '%s\\037' \"$@\" | tr '\\n' '|')\nprintf '%s\\n' \"$line\" >> " + strconv.Quote(g.log) + "\nexec " + strconv.Quote(real) + " \"$@\"\n"
	testenv.WriteFile(tb, filepath.Join(g.bin, "git"), script)
	if err := os.Chmod(filepath.Join(g.bin, "git"), 0o755); err != nil {
		tb.Fatal(err)
	}
	return g
}

// calls is every logged call so far, in order, and empties the log.
func (g *gitLog) calls(tb testing.TB) []string {
	tb.Helper()
	b, err := os.ReadFile(g.log)
	if err != nil && !os.IsNotExist(err) {
		tb.Fatal(err)
	}
	_ = os.Remove(g.log)
	var out []string
	for _, l := range strings.Split(strings.TrimRight(string(b), "\n"), "\n") {
		if l != "" {
			out = append(out, l)
		}
	}
	return out
}

// trivial is one aq installation with a one-file repository whose origin is
// a local bare repository, ready to run trivial jobs (`echo x > f`, ship:
// branch) with the logging git first on PATH.
type trivial struct {
	h      *testenv.Home
	git    *gitLog
	origin string
	n      int
}

func newTrivial(tb testing.TB, bin, sandbox string, extra int) *trivial {
	tb.Helper()
	h := testenv.NewHome(tb)
	h.Bin = bin
	files := map[string]string{"README.md": "tiny\n"}
	// extra more files: the benchmark's warm job on a big repository.
	for i := range extra {
		files[fmt.Sprintf("pkg%d/file%05d.txt", i%10, i)] = fmt.Sprintf("file %d\nline two\nline three\n", i)
	}
	repo := h.Repo(tb, "tiny", files)
	origin := testenv.AddOrigin(tb, repo)
	g := newGitLog(tb, tb.TempDir())
	h.Env = append(h.Env, "PATH="+g.bin+string(os.PathListSeparator)+os.Getenv("PATH"),
		"AQ_SANDBOX="+sandbox, "AQ_SANDBOX_WRITABLE="+g.dir)
	return &trivial{h: h, git: g, origin: origin}
}

// job submits one trivial job, runs `aq run --once` and returns the git
// calls of the run alone (the submit's are dropped).
func (tr *trivial) job(tb testing.TB) []string {
	tb.Helper()
	tr.n++
	id := "gitcount-" + strconv.Itoa(tr.n)
	path := testenv.Manifest(tb, tb.TempDir(), id, "repo: tiny\nengine: script\nship: branch\nscript: \"echo x > f\"")
	if r := tr.h.Run(tb, "submit", path); r.Code != 0 {
		tb.Fatalf("aq submit: %s", r)
	}
	tr.git.calls(tb)
	if r := tr.h.Run(tb, "run", "--once"); r.Code != 0 {
		tb.Fatalf("aq run --once: %s", r)
	}
	calls := tr.git.calls(tb)
	if refs := testenv.RemoteRefs(tb, tr.origin, "refs/heads/aq/job/"+id); len(refs) == 0 {
		tb.Fatalf("the job's branch is not on origin: %v\ngit calls:\n%s", testenv.RemoteRefs(tb, tr.origin, "refs/"), show(calls))
	}
	return calls
}

// kinds counts calls by kind: the git subcommand, with the options that make
// it a different step (config --list, rev-parse, push, ls-remote …).
func kinds(calls []string) map[string]int {
	k := map[string]int{}
	for _, c := range calls {
		k[kind(c)]++
	}
	return k
}

// show is calls as a reader reads them.
func show(calls []string) string {
	return strings.ReplaceAll(strings.Join(calls, "\n"), "\037", " ")
}

// kind is a call's subcommand after git's global options (-C dir, -c k=v,
// --git-dir …), with --list kept for config.
func kind(call string) string {
	f := strings.Split(call, "\037")
	for i := 0; i < len(f); i++ {
		a := f[i]
		switch {
		case a == "-C" || a == "-c" || a == "--git-dir" || a == "--work-tree" || a == "--namespace" || a == "--exec-path" || a == "--config-env":
			i++
		case strings.HasPrefix(a, "-"):
		default:
			if a == "config" && strings.Contains(call, "--list") {
				return "config --list"
			}
			return a
		}
	}
	return "?"
}

// budget is the most git processes a trivial job may start — a warm job
// (a pooled worktree), ship: branch to a local bare origin, no verify —
// and, by kind, the most of each, each with its reason. main before #35
// (49ca55b) started 37: config --list 6, rev-parse 4, update-ref 4,
// commit-tree 2, config --get-regexp 2, ls-remote 2, push 2, rev-list 2,
// diff-tree 2, worktree 2, and one each of remote, ls-files, checkout,
// clean, cat-file, add, write-tree, read-tree, diff; the first pass of #35
// 23 (config --list 2, ls-files, rev-parse, read-tree, diff and rev-list
// besides what is below).
const budget = 17

var kindBudget = map[string]struct {
	max    int
	reason string
}{
	"config --list": {1, "the repository's configuration, read once for the hardening and cached by its files' identity; the job's worktree takes it (no worktreeConfig, no include)"},
	"ls-remote":     {1, "origin's aq/job/<id> and aq/wip/<id> in one call"},
	"cat-file":      {2, "the base and WIP refs of the run in one; after the engine, HEAD, the WIP ref, the job branch and base's tree in one (the result commit reads them there)"},
	"worktree":      {2, "the pooled worktree moved to the job's path, and back to the pool"},
	"checkout":      {1, "the pooled worktree's reset: the job branch at its start (its index bits read from the index file)"},
	"clean":         {1, "the pooled worktree's reset: untracked and ignored files"},
	"add":           {1, "the checkpoint's index"},
	"write-tree":    {1, "the checkpoint's tree"},
	"commit-tree":   {2, "the checkpoint commit and the result commit"},
	"update-ref":    {3, "the WIP ref, the job branch (compare-and-swap each), HEAD detached in the pool"},
	"diff-tree":     {1, "the change check before the push: what the checkpoint and the result change (aq made both, on base: no walk), and the result's diffstat"},
	"push":          {1, "the result and its checkpoint in one atomic push"},
}

// TestTrivialJobGitProcesses counts the git processes of a trivial warm
// job run by `aq run --once`, unsandboxed and sandboxed (the logging git is
// in AQ_SANDBOX_WRITABLE, so a git run inside the sandbox would be counted
// too): at most budget in all, each kind within its budget, and exactly one
// push. Without the lean path (#35) it counted 37; after its first pass, 23.
func TestTrivialJobGitProcesses(t *testing.T) {
	bin := testenv.BuildAQ(t)
	for _, sb := range []string{"off", "auto"} {
		t.Run("sandbox="+sb, func(t *testing.T) {
			tr := newTrivial(t, bin, sb, 0)
			tr.job(t) // the first job makes the pooled worktree
			calls := tr.job(t)
			k := kinds(calls)
			t.Logf("%d git processes: %v\n%s", len(calls), k, show(calls))
			if len(calls) > budget {
				t.Errorf("a trivial job started %d git processes, want at most %d", len(calls), budget)
			}
			for kind, n := range k {
				b, ok := kindBudget[kind]
				switch {
				case !ok:
					t.Errorf("%d × git %s: a kind of git the trivial job has no reason to run", n, kind)
				case n > b.max:
					t.Errorf("%d × git %s, want at most %d: %s", n, kind, b.max, b.reason)
				}
			}
			if k["push"] != 1 {
				t.Errorf("%d pushes, want exactly one: %s", k["push"], kindBudget["push"].reason)
			}
		})
	}
}
