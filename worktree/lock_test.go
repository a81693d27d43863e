package worktree

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
)

// A second LockRepo on the same repo waits until the first is released, even
// inside one process (flock belongs to the open file, and each Lock opens
// its own). The order is asserted with channels, not timing.
func TestLockRepoBlocksUntilUnlocked(t *testing.T) {
	t.Parallel()
	dir := filepath.Join(t.TempDir(), "locks")
	first, err := LockRepo(ctxT(t), dir, "myrepo")
	if err != nil {
		t.Fatal(err)
	}

	var (
		mu     sync.Mutex
		events []string
	)
	record := func(e string) { mu.Lock(); events = append(events, e); mu.Unlock() }

	contended := make(chan bool)
	acquired := make(chan *Lock)
	go func() {
		// Prove the lock is taken at the moment we start waiting.
		_, ok, err := TryLockRepo(dir, "myrepo")
		if err != nil {
			t.Error(err)
		}
		contended <- !ok
		l, err := LockRepo(context.Background(), dir, "myrepo")
		if err != nil {
			t.Error(err)
		}
		record("second acquired")
		acquired <- l
	}()

	if !<-contended {
		t.Fatal("TryLockRepo took a lock that LockRepo holds in the same process")
	}
	select {
	case <-acquired:
		t.Fatal("second LockRepo returned while the first lock was held")
	default:
	}
	record("first released")
	if err := first.Unlock(); err != nil {
		t.Fatal(err)
	}
	second := <-acquired
	defer second.Unlock()

	mu.Lock()
	defer mu.Unlock()
	if len(events) != 2 || events[0] != "first released" || events[1] != "second acquired" {
		t.Fatalf("events = %v, want the second lock only after the first was released", events)
	}
	if first.Unlock() != nil || (*Lock)(nil).Unlock() != nil {
		t.Error("Unlock is not idempotent")
	}
}

func TestTryLockAndHeldInProcess(t *testing.T) {
	t.Parallel()
	dir := filepath.Join(t.TempDir(), "locks")

	if held, err := Held(dir, JobLockName("j1")); err != nil || held {
		t.Fatalf("Held before any lock = %v, %v", held, err)
	}
	if _, err := os.Stat(filepath.Join(dir, "jobs", "j1.lock")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("Held created the lock file: %v", err)
	}

	l, ok, err := TryLockJob(dir, "j1")
	if err != nil || !ok {
		t.Fatalf("TryLockJob = %v, %v", ok, err)
	}
	if l.Name() != "jobs/j1" || l.Path() != filepath.Join(dir, "jobs", "j1.lock") {
		t.Errorf("lock name %q path %q", l.Name(), l.Path())
	}
	if _, ok, _ := TryLockJob(dir, "j1"); ok {
		t.Error("second TryLockJob succeeded while the job lock is held")
	}
	if held, err := Held(dir, JobLockName("j1")); err != nil || !held {
		t.Errorf("Held = %v, %v while held", held, err)
	}
	// A repo called "job-j1" and the job "j1" never share a lock.
	r, ok, err := TryLockRepo(dir, "job-j1")
	if err != nil || !ok {
		t.Errorf("repo lock job-j1 blocked by job lock j1: %v %v", ok, err)
	}
	r.Unlock()

	if err := l.Unlock(); err != nil {
		t.Fatal(err)
	}
	if held, err := Held(dir, JobLockName("j1")); err != nil || held {
		t.Errorf("Held = %v, %v after Unlock", held, err)
	}

	for _, p := range []string{dir, filepath.Join(dir, "jobs")} {
		fi, err := os.Stat(p)
		if err != nil || fi.Mode().Perm() != 0o700 {
			t.Errorf("%s: mode %v, %v; want 0700", p, fi.Mode().Perm(), err)
		}
	}
	for _, bad := range []string{"", "../x", "a/../../b", "/abs", ".hidden"} {
		if _, _, err := tryLock(dir, bad); err == nil {
			t.Errorf("lock name %q accepted", bad)
		}
	}
}

func TestLockRepoReturnsCtxErrWhileWaiting(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	held, err := LockRepo(ctxT(t), dir, "r")
	if err != nil {
		t.Fatal(err)
	}
	defer held.Unlock()

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() {
		l, err := LockRepo(ctx, dir, "r")
		if l != nil {
			l.Unlock()
		}
		done <- err
	}()
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Errorf("LockRepo after cancel = %v, want context.Canceled", err)
	}

	ctx, cancel2 := context.WithTimeout(context.Background(), 3*lockPoll)
	defer cancel2()
	other, err := LockJob(ctx, dir, "x")
	if err != nil {
		t.Fatalf("free job lock: %v", err) // a different lock is free
	}
	defer other.Unlock()
	if _, err := LockRepo(ctx, dir, "r"); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("LockRepo past deadline = %v, want context.DeadlineExceeded", err)
	}
}

// Held sees a lock held by another process, and sees it free once that
// process is killed with SIGKILL: the kernel drops flock locks with the
// process, so a crashed aq never leaves a job looking in flight.
func TestHeldAcrossProcessesAndKill9(t *testing.T) {
	t.Parallel()
	dir := filepath.Join(t.TempDir(), "locks")
	name := JobLockName("crashy")

	cmd, stdin := holdLockInOtherProcess(t, dir, name)
	defer stdin.Close()

	if held, err := Held(dir, name); err != nil || !held {
		t.Errorf("Held = %v, %v while another process holds the lock", held, err)
	}
	if _, ok, _ := TryLockJob(dir, "crashy"); ok {
		t.Error("TryLockJob succeeded while another process holds the lock")
	}

	// LockJob waits for the other process; kill it -9 and the wait ends.
	got := make(chan error, 1)
	ctx := ctxT(t)
	go func() {
		l, err := LockJob(ctx, dir, "crashy")
		if err == nil {
			l.Unlock()
		}
		got <- err
	}()
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	cmd.Wait()
	if err := <-got; err != nil {
		t.Fatalf("LockJob after the holder was killed: %v", err)
	}
	if held, err := Held(dir, name); err != nil || held {
		t.Errorf("Held = %v, %v after the holder was killed -9", held, err)
	}
}

// A lock released by a graceful holder in another process unblocks LockRepo.
func TestLockRepoWaitsForOtherProcess(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	cmd, stdin := holdLockInOtherProcess(t, dir, RepoLockName("shared"), "GORACE=atexit_sleep_ms=0")
	stdin.Close() // the helper unlocks and exits
	l, err := LockRepo(ctxT(t), dir, "shared")
	if err != nil {
		t.Fatal(err)
	}
	l.Unlock()
	if err := cmd.Wait(); err != nil {
		t.Errorf("helper: %v", err)
	}
}
