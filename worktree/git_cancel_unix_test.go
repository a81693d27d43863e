//go:build unix

package worktree

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/aqfleet/aq/internal/testenv"
)

// A git cancelled while it holds a lock (here the index's: `commit -a`
// holds it while its pre-commit hook runs) is asked to stop, and removes its lock as it goes: a
// killed git left index.lock (or a ref's .lock) behind, and every later
// update met it — found by the reduced chaos run (a periodic checkpoint
// stopped with its job left aq/wip/<id>.lock for the final checkpoint and
// aq gc).
func TestCancelledGitLeavesNoLock(t *testing.T) {
	repo := newRepo(t)
	// aq's git runs no hook of the repository's (harden.go); one aq names
	// itself with -c runs.
	hooks := t.TempDir()
	hook := filepath.Join(hooks, "pre-commit")
	started := filepath.Join(t.TempDir(), "started")
	testenv.WriteFile(t, hook, "#!/bin/sh\ntouch '"+started+"'\nexec sleep 5 </dev/null >/dev/null 2>&1\n")
	if err := os.Chmod(hook, 0o755); err != nil {
		t.Fatal(err)
	}
	testenv.WriteFile(t, filepath.Join(repo, "README.md"), "changed\n")
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		_, err := Git{}.Run(ctx, repo, "-c", "core.hooksPath="+hooks, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-a", "-q", "-m", "held")
		done <- err
	}()
	testenv.WaitFor(t, time.Minute, "the pre-commit hook to run (git holding index.lock)", func() bool { return testenv.Exists(started) })
	if !testenv.Exists(filepath.Join(repo, ".git", "index.lock")) {
		t.Fatal("git does not hold index.lock during the hook: the test proves nothing")
	}
	cancel()
	if err := <-done; err == nil {
		t.Fatal("the cancelled commit succeeded")
	}
	if testenv.Exists(filepath.Join(repo, ".git", "index.lock")) {
		t.Fatal("the cancelled git left index.lock behind")
	}
}
