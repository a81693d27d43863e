//go:build linux || darwin

package process

import (
	"context"
	"fmt"
	"os"
	"slices"
	"syscall"
	"time"
)

// signal sends sig to the process p names, not to another that reused its
// pid: the handle is taken first (a pidfd, on Linux 5.3 and later), then the
// identity checked, then the handle signalled.
func (p procStat) signal(sig syscall.Signal) {
	h, err := os.FindProcess(p.pid)
	if err != nil {
		return
	}
	defer h.Release()
	if p.alive() {
		_ = h.Signal(sig)
	}
}

// killWait is how long a process may take to disappear after SIGKILL before
// the sweep gives up on it (one in uninterruptible sleep, say on a dead NFS
// mount, can outlast any wait).
const killWait = 5 * time.Second

// rescanWindow is how long the sweep keeps looking while some process's
// environment reads empty (an execve in progress) before it trusts that no
// tagged process is left. A process really started with an empty
// environment cannot hold the tag, so this only delays, never blocks.
const rescanWindow = 100 * time.Millisecond

// maxPoll caps the interval between two scans while waiting for processes to
// exit.
const maxPoll = 50 * time.Millisecond

// target is a process the sweep is killing.
type target struct {
	procStat
	inGroup bool      // in the group that already had SIGKILL
	seen    time.Time // when it was found (and sent SIGTERM)
	killed  time.Time // when it was sent SIGKILL; zero before
}

// sweep kills and waits for every process carrying tag and, when pgid > 0,
// every live member of process group pgid (which the caller has already sent
// SIGKILL). Tagged processes outside the group get SIGTERM, and SIGKILL grace
// later, or at once when ctx is done. It returns how many tagged processes it
// found outside the group, once all are gone.
func sweep(ctx context.Context, want [][]byte, grace time.Duration, pgid int) (int, error) {
	tag := string(want[0]) // "AQ_JOB_ID=<id>", for messages
	targets := map[int]*target{}
	escaped := 0
	var quietSince time.Time // first scan that found no target but an empty environment
	poll := time.Millisecond
	for {
		found, uncertain, err := scan(want, pgid)
		if err != nil {
			return escaped, fmt.Errorf("process: find %s: %w", tag, err)
		}
		now, hurry := time.Now(), ctx.Err() != nil
		for _, p := range found {
			if t := targets[p.pid]; t != nil && t.start == p.start {
				continue
			}
			t := &target{procStat: p, inGroup: pgid > 0 && p.pgid == pgid, seen: now}
			targets[p.pid] = t
			if !t.inGroup {
				escaped++
				if !hurry {
					t.signal(syscall.SIGTERM)
				}
			}
		}

		var stuck []int
		for pid, t := range targets {
			switch {
			case !t.alive():
				delete(targets, pid)
			case t.killed.IsZero() && (t.inGroup || hurry || now.Sub(t.seen) >= grace):
				t.killed = now
				t.signal(syscall.SIGKILL)
			case !t.killed.IsZero() && now.Sub(t.killed) > killWait:
				stuck = append(stuck, pid)
			}
		}
		if len(targets) == 0 {
			// A process whose environment read empty may have been in the
			// middle of an execve: look again a few times before trusting
			// that none is left (a process really started with an empty
			// environment cannot hold the tag, so this is bounded).
			if !uncertain {
				return escaped, nil
			}
			if quietSince.IsZero() {
				quietSince = now
			} else if now.Sub(quietSince) >= rescanWindow {
				return escaped, nil
			}
		} else {
			quietSince = time.Time{}
		}
		if len(stuck) > 0 {
			slices.Sort(stuck)
			return escaped, fmt.Errorf("process: %s: pids %v still alive %v after SIGKILL", tag, stuck, killWait)
		}

		wake := ctx.Done() // cuts a grace period short
		if hurry {
			wake = nil // no grace left to cut: do not spin
		}
		t := time.NewTimer(poll)
		select {
		case <-t.C:
		case <-wake:
			t.Stop()
		}
		poll = min(2*poll, maxPoll)
	}
}

// stopLadder sends the ladder's gentle steps (SIGINT, then SIGTERM, grace
// apart) to every process carrying want, then lets sweep SIGKILL what is
// left and wait for it. A process that appears meanwhile is caught by the
// sweep.
func stopLadder(ctx context.Context, want [][]byte, grace time.Duration) (int, error) {
	found, _, err := scan(want, 0)
	if err != nil {
		return 0, fmt.Errorf("process: find %s: %w", want[0], err)
	}
	seen := len(found)
	for _, sig := range ladderSignals[:len(ladderSignals)-1] {
		if len(found) == 0 || ctx.Err() != nil {
			break
		}
		for _, p := range found {
			p.signal(sig)
		}
		for deadline := time.Now().Add(grace); time.Now().Before(deadline) && ctx.Err() == nil; time.Sleep(maxPoll) {
			if found = stillAlive(found); len(found) == 0 {
				break
			}
		}
		found = stillAlive(found)
	}
	n, err := sweep(ctx, want, 0, 0)
	return max(seen, n), err
}

func stillAlive(ps []procStat) []procStat {
	var out []procStat
	for _, p := range ps {
		if p.alive() {
			out = append(out, p)
		}
	}
	return out
}
