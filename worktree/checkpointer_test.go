package worktree

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/aqfleet/aq/internal/testenv"
)

// treeOf is the tree of commit in repo ("" for no commit).
func treeOf(t *testing.T, dir, commit string) string {
	t.Helper()
	if commit == "" {
		return ""
	}
	return testenv.Git(t, dir, "rev-parse", commit+"^{tree}")
}

// step is one kind of thing an engine does to its worktree between two
// checkpoints.
type step struct {
	name string
	do   func(t *testing.T, wt string, r *rand.Rand, n int)
}

var engineSteps = []step{
	{"modify", func(t *testing.T, wt string, r *rand.Rand, n int) {
		testenv.WriteFile(t, filepath.Join(wt, "src", "main.go"), fmt.Sprintf("package main // %d\n", n))
	}},
	{"modify same size", func(t *testing.T, wt string, r *rand.Rand, n int) {
		// Same size, rewritten at once: only a stat or an event tells.
		testenv.WriteFile(t, filepath.Join(wt, "README.md"), fmt.Sprintf("# r%05d\n", n%100000))
	}},
	{"create in a new folder", func(t *testing.T, wt string, r *rand.Rand, n int) {
		testenv.WriteFile(t, filepath.Join(wt, fmt.Sprintf("gen%d", n%4), "deep", fmt.Sprintf("f%d.txt", n)), "new\n")
	}},
	{"delete a file", func(t *testing.T, wt string, r *rand.Rand, n int) {
		matches, _ := filepath.Glob(filepath.Join(wt, "gen*", "deep", "*.txt"))
		if len(matches) > 0 {
			os.Remove(matches[r.IntN(len(matches))])
		} else {
			os.Remove(filepath.Join(wt, "src", "old.go"))
		}
	}},
	{"delete a folder", func(t *testing.T, wt string, r *rand.Rand, n int) {
		os.RemoveAll(filepath.Join(wt, fmt.Sprintf("gen%d", n%4)))
	}},
	{"rename a folder", func(t *testing.T, wt string, r *rand.Rand, n int) {
		from := filepath.Join(wt, fmt.Sprintf("gen%d", n%4))
		if testenv.Exists(from) {
			os.Rename(from, filepath.Join(wt, fmt.Sprintf("moved%d", n)))
		}
	}},
	{"ignored output", func(t *testing.T, wt string, r *rand.Rand, n int) {
		testenv.WriteFile(t, filepath.Join(wt, "build", fmt.Sprintf("o%d.bin", n)), "obj\n")
		testenv.WriteFile(t, filepath.Join(wt, fmt.Sprintf("run%d.log", n)), "log\n")
	}},
	{"chmod", func(t *testing.T, wt string, r *rand.Rand, n int) {
		if runtime.GOOS != "windows" {
			os.Chmod(filepath.Join(wt, "src", "main.go"), os.FileMode(0o644|(n%2)*0o111))
		}
	}},
	{"file becomes a folder", func(t *testing.T, wt string, r *rand.Rand, n int) {
		p := filepath.Join(wt, "shape")
		os.RemoveAll(p)
		if n%2 == 0 {
			testenv.WriteFile(t, p, "file\n")
		} else {
			testenv.WriteFile(t, filepath.Join(p, "inside"), "dir\n")
		}
	}},
	{"ignore what was recorded", func(t *testing.T, wt string, r *rand.Rand, n int) {
		// A file earlier checkpoints recorded becomes ignored, or not.
		testenv.WriteFile(t, filepath.Join(wt, "notes.tmp"), fmt.Sprintf("n%d\n", n))
		rules := "*.log\nbuild/\n"
		if n%2 == 0 {
			rules += "*.tmp\n"
		}
		testenv.WriteFile(t, filepath.Join(wt, ".gitignore"), rules)
	}},
	{"engine stages and commits", func(t *testing.T, wt string, r *rand.Rand, n int) {
		testenv.WriteFile(t, filepath.Join(wt, "committed.txt"), fmt.Sprintf("c%d\n", n))
		testenv.Git(t, wt, "add", "-A")
		testenv.Git(t, wt, "commit", "-q", "--allow-empty", "-m", fmt.Sprintf("engine %d", n))
	}},
	{"engine force-adds an ignored file", func(t *testing.T, wt string, r *rand.Rand, n int) {
		testenv.WriteFile(t, filepath.Join(wt, "keep.log"), fmt.Sprintf("k%d\n", n))
		testenv.Git(t, wt, "add", "-f", "keep.log")
	}},
	{"engine runs git status", func(t *testing.T, wt string, r *rand.Rand, n int) {
		testenv.Git(t, wt, "status", "--porcelain")
	}},
	{"nothing", func(t *testing.T, wt string, r *rand.Rand, n int) {}},
}

// TestCheckpointerMatchesCheckpoint: whatever an engine does between
// checkpoints, the Checkpointer's tree is Checkpoint's, with the watcher and
// without it.
func TestCheckpointerMatchesCheckpoint(t *testing.T) {
	testenv.Slow(t, "many real git repositories, worktrees and pushes")
	for _, c := range []struct {
		watch bool
		small int64
	}{{false, -1}, {true, -1}, {true, 0}} {
		watch := c.watch
		t.Run(fmt.Sprintf("watch=%v,small=%d", c.watch, c.small), func(t *testing.T) {
			t.Parallel()
			// 60 rounds of a dozen gits each: a deadlock guard, not a speed
			// requirement — ctxT's minute ran out twice with the whole
			// package under -race on a loaded host (load 10-14), with this
			// subtest alone done in 34 s.
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
			defer cancel()
			repo := newRepo(t)
			wt := addWorktree(t, repo, "eq", "main")
			cp := &Checkpointer{Git: Git{}, Path: wt, Watch: watch, SmallIndex: c.small}
			defer cp.Close()
			r := rand.New(rand.NewPCG(19, 1))
			for i := range 60 {
				var did []string
				for range 1 + r.IntN(3) {
					s := engineSteps[r.IntN(len(engineSteps))]
					s.do(t, wt, r, i)
					did = append(did, s.name)
				}
				got, err := cp.Checkpoint(ctx, "aq/wip/incremental", "periodic")
				if err != nil {
					t.Fatalf("round %d (%s): %v", i, strings.Join(did, ", "), err)
				}
				want, err := Checkpoint(ctx, Git{}, wt, "aq/wip/exact", "exact")
				if err != nil {
					t.Fatalf("round %d: exact: %v", i, err)
				}
				if g, w := treeOf(t, repo, got), treeOf(t, repo, want); g != w {
					t.Fatalf("round %d (%s): the Checkpointer recorded\n%s\nCheckpoint recorded\n%s", i, strings.Join(did, ", "),
						strings.Join(lsTree(t, repo, got), " "), strings.Join(lsTree(t, repo, want), " "))
				}
			}
			t.Logf("stats: %+v", cp.Stats)
			if cp.Stats.Fallback > 0 {
				t.Errorf("%d checkpoints fell back to Checkpoint's way", cp.Stats.Fallback)
			}
			if watch && runtime.GOOS == "linux" && (cp.Stats.Watched == 0 && c.small < 0 || cp.Stats.Unchanged == 0) {
				t.Errorf("the watcher was not used: %+v", cp.Stats)
			}
			if (cp.Stats.Small > 0) != (c.small == 0) {
				t.Errorf("a small worktree is one scan unless SmallIndex < 0: %+v", cp.Stats)
			}
		})
	}
}

// TestCheckpointerUnchangedRunsNoStatus: with the watcher, a checkpoint of an
// unchanged worktree is the last one, found without git status; a change of
// one file is seen; so is one made right before the call.
func TestCheckpointerUnchangedRunsNoStatus(t *testing.T) {
	testenv.Slow(t, "many real git repositories, worktrees and pushes")
	if runtime.GOOS != "linux" {
		t.Skip("the watcher is Linux's (inotify)")
	}
	ctx := ctxT(t)
	repo := newRepo(t)
	wt := addWorktree(t, repo, "u", "main")
	cp := &Checkpointer{Git: Git{}, Path: wt, Watch: true, SmallIndex: -1}
	defer cp.Close()
	testenv.WriteFile(t, filepath.Join(wt, "a.txt"), "a\n")
	first, err := cp.Checkpoint(ctx, "aq/wip/u", "1")
	if err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		again, err := cp.Checkpoint(ctx, "aq/wip/u", "again")
		if err != nil || again != first {
			t.Fatalf("unchanged checkpoint %d: %s %v, want %s", i, again, err, first)
		}
	}
	if cp.Stats.Unchanged < 2 { // the first after a full scan may still run status
		t.Errorf("unchanged checkpoints ran git status: %+v", cp.Stats)
	}
	// A change right before the call (no sleep): the cookie makes sure the
	// watcher has read it.
	for i := range 20 {
		content := fmt.Sprintf("a%d\n", i)
		testenv.WriteFile(t, filepath.Join(wt, "a.txt"), content)
		sha, err := cp.Checkpoint(ctx, "aq/wip/u", "changed")
		if err != nil {
			t.Fatal(err)
		}
		if got := testenv.Git(t, repo, "show", sha+":a.txt"); got+"\n" != content {
			t.Fatalf("round %d: the checkpoint has a.txt = %q, want %q", i, got, content)
		}
	}
}

// TestCheckpointerPartial: a file git cannot index (a nested repository with
// no commit) makes a partial checkpoint, as Checkpoint does.
func TestCheckpointerPartial(t *testing.T) {
	testenv.Slow(t, "many real git repositories, worktrees and pushes")
	ctx := ctxT(t)
	repo := newRepo(t)
	wt := addWorktree(t, repo, "p", "main")
	cp := &Checkpointer{Git: Git{}, Path: wt, Watch: true, SmallIndex: -1}
	defer cp.Close()
	if _, err := cp.Checkpoint(ctx, "aq/wip/p", "1"); err != nil {
		t.Fatal(err)
	}
	testenv.Git(t, "", "init", "-q", filepath.Join(wt, "nested"))
	testenv.WriteFile(t, filepath.Join(wt, "ok.txt"), "ok\n")
	sha, err := cp.Checkpoint(ctx, "aq/wip/p", "2")
	var pe *PartialError
	if !errors.As(err, &pe) || pe.SHA != sha || sha == "" {
		t.Fatalf("want a partial checkpoint: %s %v", sha, err)
	}
	if files := lsTree(t, repo, sha); !strings.Contains(strings.Join(files, " "), "ok.txt") {
		t.Errorf("the partial checkpoint lacks ok.txt: %v", files)
	}
}

// TestCheckpointerLeavesTheWorktreeAlone: like Checkpoint, it never changes
// the worktree's HEAD, index or files, and works while the worktree's
// index.lock is held.
func TestCheckpointerLeavesTheWorktreeAlone(t *testing.T) {
	testenv.Slow(t, "many real git repositories, worktrees and pushes")
	ctx := ctxT(t)
	repo := newRepo(t)
	wt := addWorktree(t, repo, "alone", "main")
	engineEdits(t, wt)
	lock := gitPath(t, wt, "index.lock")
	testenv.WriteFile(t, lock, "held by the engine")
	before := snapshot(t, wt)
	cp := &Checkpointer{Git: Git{}, Path: wt, Watch: true, SmallIndex: -1}
	defer cp.Close()
	for range 3 {
		if _, err := cp.Checkpoint(ctx, "aq/wip/alone", "p"); err != nil {
			t.Fatal(err)
		}
	}
	assertSameState(t, "worktree", before, snapshot(t, wt))
	if testenv.ReadFile(t, lock) != "held by the engine" {
		t.Error("the engine's index.lock was touched")
	}
}

// TestCheckpointerFollowsIgnoreRulesAndIndex: a file an earlier checkpoint
// recorded that becomes ignored is left out, and an ignored file the engine
// force-adds to its index is recorded — as Checkpoint does.
func TestCheckpointerFollowsIgnoreRulesAndIndex(t *testing.T) {
	testenv.Slow(t, "many real git repositories, worktrees and pushes")
	for _, watch := range []bool{false, true} {
		t.Run(fmt.Sprintf("watch=%v", watch), func(t *testing.T) {
			ctx := ctxT(t)
			repo := newRepo(t)
			wt := addWorktree(t, repo, "ig", "main")
			cp := &Checkpointer{Git: Git{}, Path: wt, Watch: watch, SmallIndex: -1}
			defer cp.Close()
			check := func(what string) {
				t.Helper()
				got, err := cp.Checkpoint(ctx, "aq/wip/inc", what)
				if err != nil {
					t.Fatal(err)
				}
				want, err := Checkpoint(ctx, Git{}, wt, "aq/wip/exact", what)
				if err != nil {
					t.Fatal(err)
				}
				if treeOf(t, repo, got) != treeOf(t, repo, want) {
					t.Errorf("%s: recorded %v, want %v", what, lsTree(t, repo, got), lsTree(t, repo, want))
				}
			}
			testenv.WriteFile(t, filepath.Join(wt, "notes.tmp"), "draft\n")
			check("a new file")
			testenv.WriteFile(t, filepath.Join(wt, ".gitignore"), "*.log\nbuild/\n*.tmp\n")
			testenv.WriteFile(t, filepath.Join(wt, "notes.tmp"), "draft 2\n")
			check("the new file is ignored now")
			testenv.WriteFile(t, filepath.Join(wt, "keep.log"), "kept\n")
			check("an ignored file")
			testenv.Git(t, wt, "add", "-f", "keep.log")
			check("the engine force-added it")
		})
	}
}
