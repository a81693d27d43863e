package lockwait

import (
	"context"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"

	"github.com/gofrs/flock"
)

// A held lock: the wait says, after a second, what it waits for (and on
// Linux who holds it), ends with its context as *Interrupted, and takes the
// lock once it is free.
func TestLockWaitsAsAPersonCanFollow(t *testing.T) {
	path := filepath.Join(t.TempDir(), ".lock")
	held := flock.New(path)
	if err := held.Lock(); err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var notes []string
	ctx, cancel := context.WithCancel(context.Background())
	noticed := make(chan struct{})
	done := make(chan error, 1)
	go func() {
		done <- Lock(ctx, flock.New(path), Options{What: "the test's lock", Notice: func(m string) {
			mu.Lock()
			notes = append(notes, m)
			mu.Unlock()
			close(noticed)
		}})
	}()
	<-noticed
	cancel()
	err := <-done
	if !IsInterrupted(err) || !strings.Contains(err.Error(), "interrupted while waiting for the test's lock") {
		t.Fatalf("err %v", err)
	}
	mu.Lock()
	if len(notes) != 1 || !strings.HasPrefix(notes[0], "waiting for the test's lock") {
		t.Fatalf("notes %q", notes)
	}
	if runtime.GOOS == "linux" && !strings.Contains(notes[0], "held by this process") {
		t.Errorf("the holder is not named: %q", notes[0])
	}
	mu.Unlock()
	held.Unlock()
	l := flock.New(path)
	if err := Lock(context.Background(), l, Options{What: "the test's lock"}); err != nil {
		t.Fatal(err)
	}
	l.Unlock()
}
