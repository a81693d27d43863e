// Package lockwait takes a file lock (gofrs/flock) the way a person at a
// terminal can follow: the wait ends when its context does (Ctrl-C,
// SIGTERM), and after a second it says what it waits for and, where the
// platform tells (Linux: /proc/locks), which process holds the lock.
package lockwait

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/gofrs/flock"
)

// Poll is how often a waiting Lock tries again.
const Poll = 50 * time.Millisecond

// NoticeAfter is how long Lock waits before it says what it waits for.
const NoticeAfter = time.Second

// Options say how to wait.
type Options struct {
	// What names the lock for a person ("the local queue's lock").
	What string
	// Shared takes a shared (read) lock instead of an exclusive one.
	Shared bool
	// Notice, when set, is told once, after NoticeAfter, what the wait is
	// for (e.g. "waiting for the local queue's lock, held by pid 4242 (aq)").
	Notice func(msg string)
}

// Interrupted is a wait its context ended.
type Interrupted struct {
	What   string
	Holder string // who held the lock, in words ("" when unknown)
	Err    error  // the context's error
}

func (e *Interrupted) Error() string {
	msg := "interrupted while waiting for " + e.What
	if e.Holder != "" {
		msg += ", held by " + e.Holder
	}
	return msg + "; nothing was changed"
}

func (e *Interrupted) Unwrap() error { return e.Err }

// Lock takes f, waiting while another process (or another Flock in this
// one) holds it, until ctx ends (an *Interrupted).
func Lock(ctx context.Context, f *flock.Flock, o Options) error {
	try := f.TryLock
	if o.Shared {
		try = f.TryRLock
	}
	start := time.Now()
	noticed := false
	for {
		ok, err := try()
		if err != nil {
			return fmt.Errorf("lock %s: %w", f.Path(), err)
		}
		if ok {
			return nil
		}
		if !noticed && o.Notice != nil && time.Since(start) >= NoticeAfter {
			noticed = true
			msg := "waiting for " + o.What
			if h := Holder(f.Path()); h != "" {
				msg += ", held by " + h
			}
			o.Notice(msg + " (Ctrl-C stops waiting)")
		}
		t := time.NewTimer(Poll)
		select {
		case <-ctx.Done():
			t.Stop()
			return &Interrupted{What: o.What, Holder: Holder(f.Path()), Err: ctx.Err()}
		case <-t.C:
		}
	}
}

// Holder names who holds the lock on path, as far as the platform tells:
// "pid 4242 (aq)"; "" when it cannot tell.
func Holder(path string) string {
	pids := holders(path)
	var out []string
	for _, pid := range pids {
		if pid == os.Getpid() {
			out = append(out, "this process")
			continue
		}
		s := "pid " + strconv.Itoa(pid)
		if name := command(pid); name != "" {
			s += " (" + name + ")"
		}
		out = append(out, s)
	}
	return strings.Join(out, ", ")
}

// IsInterrupted reports whether err is a wait its context ended.
func IsInterrupted(err error) bool {
	var e *Interrupted
	return errors.As(err, &e)
}
