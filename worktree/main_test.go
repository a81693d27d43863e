package worktree

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/aqfleet/aq/internal/testenv"
)

// helperEnv makes the test binary, re-executed, act as a helper process
// instead of running tests (see runHelper).
const helperEnv = "AQ_WORKTREE_TEST_HELPER"

func TestMain(m *testing.M) {
	if mode := os.Getenv(helperEnv); mode != "" {
		os.Exit(runHelper(mode))
	}
	os.Exit(testenv.Main(m))
}

// runHelper is the re-executed test binary's main.
//
//	hold-lock: take the lock AQ_LOCK_NAME in AQ_LOCKS_DIR, print "locked",
//	then hold it until stdin closes (or the process is killed).
func runHelper(mode string) int {
	switch mode {
	case "hold-lock":
		l, err := lock(context.Background(), os.Getenv("AQ_LOCKS_DIR"), os.Getenv("AQ_LOCK_NAME"))
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		fmt.Println("locked")
		io.Copy(io.Discard, os.Stdin)
		l.Unlock()
		return 0
	}
	fmt.Fprintln(os.Stderr, "unknown helper mode", mode)
	return 2
}

// holdLockInOtherProcess starts the test binary as the hold-lock helper
// (with env added) and returns once it holds lock name in dir: closing stdin
// makes it unlock and exit.
func holdLockInOtherProcess(t *testing.T, dir, name string, env ...string) (*exec.Cmd, io.WriteCloser) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(append(os.Environ(), helperEnv+"=hold-lock", "AQ_LOCKS_DIR="+dir, "AQ_LOCK_NAME="+name), env...)
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	if line, err := bufio.NewReader(stdout).ReadString('\n'); err != nil || line != "locked\n" {
		cmd.Process.Kill()
		t.Fatalf("helper said %q, %v", line, err)
	}
	return cmd, stdin
}

// newRepo makes a repository on main with a few files, a .gitignore and one
// commit, and returns its directory.
func newRepo(tb testing.TB) string {
	tb.Helper()
	return testenv.NewRepo(tb, tb.TempDir(), "repo", map[string]string{
		"README.md":   "# repo\n",
		"src/main.go": "package main\n\nfunc main() {}\n",
		"src/old.go":  "package main\n// old\n",
		".gitignore":  "*.log\nbuild/\n",
	})
}

// newRepoWithOrigin is newRepo plus a bare "origin" with main pushed.
func newRepoWithOrigin(tb testing.TB) (repo, origin string) {
	tb.Helper()
	repo = newRepo(tb)
	return repo, testenv.AddOrigin(tb, repo)
}

// addWorktree makes a linked worktree of repo on branch aq/job/<id> with
// the code under test.
func addWorktree(tb testing.TB, repo, id, start string) string {
	tb.Helper()
	wt := filepath.Join(filepath.Dir(repo), "worktrees", id)
	if err := Add(context.Background(), Git{}, repo, wt, "aq/job/"+id, start); err != nil {
		tb.Fatal(err)
	}
	return wt
}

// state is everything Checkpoint promises not to touch in a checkout.
type state struct {
	Status string // git status --porcelain (taken without optional locks)
	HEAD   string
	Branch string
	Index  string // hash of the index file's bytes
	Files  map[string]string
}

func snapshot(tb testing.TB, dir string) state {
	tb.Helper()
	s := state{
		Status: testenv.Git(tb, dir, "--no-optional-locks", "status", "--porcelain", "--untracked-files=all"),
		HEAD:   testenv.Git(tb, dir, "rev-parse", "HEAD"),
		Files:  map[string]string{},
	}
	s.Branch, _ = testenv.GitErr(dir, "symbolic-ref", "-q", "HEAD")
	idx := testenv.Git(tb, dir, "rev-parse", "--git-path", "index")
	if !filepath.IsAbs(idx) {
		idx = filepath.Join(dir, idx)
	}
	if b, err := os.ReadFile(idx); err == nil {
		sum := sha256.Sum256(b)
		s.Index = hex.EncodeToString(sum[:])
	}
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		if rel == ".git" {
			if d.IsDir() {
				return filepath.SkipDir
			}
			return nil
		}
		if d.Type().IsRegular() {
			s.Files[rel] = testenv.ReadFile(tb, p)
		}
		return nil
	})
	if err != nil {
		tb.Fatal(err)
	}
	return s
}

func assertSameState(tb testing.TB, what string, before, after state) {
	tb.Helper()
	if before.Status != after.Status || before.HEAD != after.HEAD || before.Branch != after.Branch || before.Index != after.Index {
		tb.Errorf("%s changed:\nbefore %+v\nafter  %+v", what, stripFiles(before), stripFiles(after))
	}
	if len(before.Files) != len(after.Files) {
		tb.Errorf("%s: files changed: %v -> %v", what, keys(before.Files), keys(after.Files))
	}
	for k, v := range before.Files {
		if after.Files[k] != v {
			tb.Errorf("%s: %s changed", what, k)
		}
	}
}

func stripFiles(s state) state { s.Files = nil; return s }

func keys(m map[string]string) []string {
	var ks []string
	for k := range m {
		ks = append(ks, k)
	}
	sort.Strings(ks)
	return ks
}

// lsTree lists the files in commit.
func lsTree(tb testing.TB, dir, commit string) []string {
	tb.Helper()
	out := testenv.Git(tb, dir, "-c", "core.quotepath=off", "ls-tree", "-r", "--name-only", commit)
	if out == "" {
		return nil
	}
	return strings.Split(out, "\n")
}

func parents(tb testing.TB, dir, commit string) []string {
	tb.Helper()
	f := strings.Fields(testenv.Git(tb, dir, "rev-list", "--parents", "-n1", commit))
	return f[1:]
}

func ctxT(tb testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	tb.Cleanup(cancel)
	return ctx
}
