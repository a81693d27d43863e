package process

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"syscall"
	"testing"
	"time"
)

func TestParseStat(t *testing.T) {
	// as captured from a real zombie: fields 10 to 25
	tail := " 0 0 0 0 0 0 0 20 0 1 0 70706 0 0 18446744073709551615\n"
	tests := []struct {
		in   string
		want procStat
		ok   bool
	}{
		{"23781 (process.test) S 1 23775 9840 0 -1 4228108 47" + tail, procStat{23781, 23775, 70706, true, false}, true},
		{"23781 (process.test) Z 1 23775 9840 0 -1 4228108 47" + tail, procStat{23781, 23775, 70706, false, false}, true},
		// a leader whose main thread exited while another runs (2 threads)
		{"23781 (a.out) Z 1 23775 9840 0 -1 4228108 47 0 0 0 0 0 0 0 20 0 2 0 70706 0 0 18446744073709551615\n", procStat{23781, 23775, 70706, true, false}, true},
		{"7 (a) Z 1 2 (b) c) R 1 42 9840 0 -1 4228108 47" + tail, procStat{7, 42, 70706, true, false}, true},
		{"2 (kthreadd) S 0 0 0 0 -1 2129984 0" + tail, procStat{2, 0, 70706, true, true}, true},
		{"7 (sh) R 1 42 9840 0 -1 4228108 47 0 0", procStat{}, false}, // cut short
		{"7 sh R 1 42", procStat{}, false},
		{"", procStat{}, false},
	}
	for _, tt := range tests {
		got, ok := parseStat([]byte(tt.in))
		if got != tt.want || ok != tt.ok {
			t.Errorf("parseStat(%q) = %+v, %v; want %+v, %v", tt.in, got, ok, tt.want, tt.ok)
		}
	}
}

func TestReadStatSelf(t *testing.T) {
	st, ok, _ := readStat(os.Getpid(), nil)
	if !ok || !st.live || st.pid != os.Getpid() || st.pgid != syscall.Getpgrp() || st.start == 0 {
		t.Errorf("readStat(self) = %+v, %v", st, ok)
	}
	if !st.alive() {
		t.Error("self is not alive")
	}
	if (procStat{pid: st.pid, start: st.start + 1}).alive() {
		t.Error("a process with another start time counts as self")
	}
}

// An unreadable environment (a kernel thread's, a process that just exited)
// is not tagged, whatever the reused buffer held before.
func TestHasTagUnreadable(t *testing.T) {
	want := wants("job-1", "")
	stale := append([]byte("A=1\x00"), want[0]...)
	if ok, _ := hasTag(1<<30, want, stale); ok {
		t.Error("a missing process counts as tagged")
	}
	if ok, _ := hasTag(2, want, stale); ok { // kthreadd: no environment to read
		t.Error("a kernel thread counts as tagged")
	}
}

// A scoped sweep finds only the processes of its scope: two aq homes may run
// jobs with the same id on one host.
func TestScopedFind(t *testing.T) {
	tag := fmt.Sprintf("scoped-%d-%d", os.Getpid(), time.Now().UnixNano())
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	start := func(scope string) *exec.Cmd {
		cmd := exec.CommandContext(ctx, "sleep", "30")
		cmd.Env = withTag([]string{"PATH=/usr/bin:/bin"}, tag, scope, "r1")
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
		return cmd
	}
	a := start("home-a")
	start("home-b")
	// A child in the middle of its exec shows an empty environment for a
	// moment: wait (bounded) until both have exec'd sleep.
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		if all, _ := FindTagged(tag); len(all) == 2 {
			break
		}
	}
	got, err := FindScoped(tag, "home-a")
	if err != nil || len(got) != 1 || got[0] != a.Process.Pid {
		t.Fatalf("FindScoped(home-a) = %v, %v; want [%d]", got, err, a.Process.Pid)
	}
	all, _ := FindTagged(tag)
	if len(all) != 2 {
		t.Fatalf("FindTagged = %v, want both", all)
	}
	if n, err := KillScoped(ctx, tag, "home-b", 0); err != nil || n != 1 {
		t.Fatalf("KillScoped(home-b) = %d, %v", n, err)
	}
	if left, _ := FindTagged(tag); len(left) != 1 || left[0] != a.Process.Pid {
		t.Fatalf("after killing home-b: %v", left)
	}
}

// TestSweepSeesProcessesMidExec: an escaped child that is in the middle of
// an execve when the sweep scans has an empty /proc/<pid>/environ for an
// instant; the sweep must look again rather than miss it. The race is
// narrow, so the scenario is repeated.
func TestSweepSeesProcessesMidExec(t *testing.T) {
	if _, err := exec.LookPath("setsid"); err != nil {
		t.Skip("setsid is not installed")
	}
	for i := 0; i < 20; i++ {
		tag := fmt.Sprintf("midexec-%d-%d-%d", os.Getpid(), time.Now().UnixNano(), i)
		cmd := exec.Command("/bin/sh", "-c", "setsid /bin/sh -c 'exec sleep 30' </dev/null >/dev/null 2>&1 &")
		cmd.Env = withTag([]string{"PATH=/usr/bin:/bin"}, tag, "", "r1")
		if err := cmd.Run(); err != nil {
			t.Fatal(err)
		}
		// The leader has exited; its escaped grandchild may be mid-exec.
		n, err := sweep(context.Background(), wants(tag, ""), 0, 0)
		if err != nil {
			t.Fatal(err)
		}
		left, _ := FindTagged(tag)
		if len(left) > 0 {
			t.Fatalf("iteration %d: the sweep (which found %d) left %v alive", i, n, left)
		}
	}
}

// TestSweepFindsALeaderThatExited: a process whose main thread has exited
// while another runs on (pthread_exit in main) looks like a zombie in
// /proc/<pid>/stat, and its environ answers ESRCH; it is alive, and a job's
// sweep must find it by its tag through a live thread, and kill it.
func TestSweepFindsALeaderThatExited(t *testing.T) {
	cc, err := exec.LookPath("cc")
	if err != nil {
		t.Skip("no C compiler to build testdata/leaderexits.c")
	}
	bin := filepath.Join(t.TempDir(), "leaderexits")
	if out, err := exec.Command(cc, "-pthread", "-o", bin, "testdata/leaderexits.c").CombinedOutput(); err != nil {
		t.Fatalf("cc: %v\n%s", err, out)
	}
	tag := fmt.Sprintf("leader-%d-%d", os.Getpid(), time.Now().UnixNano())
	cmd := exec.Command(bin)
	cmd.Env = withTag([]string{"PATH=/usr/bin:/bin"}, tag, "", "r1")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	t.Cleanup(func() { _ = cmd.Process.Kill(); <-done })
	pid := cmd.Process.Pid
	for { // until the main thread has exited
		b, ok := readProcFile(pid, "stat", nil)
		if !ok {
			t.Fatal("the process is gone")
		}
		if f := bytes.Fields(b[bytes.LastIndexByte(b, ')')+1:]); len(f) > 17 && string(f[0]) == "Z" && string(f[17]) == "2" {
			break
		}
		time.Sleep(5 * time.Millisecond)
	}
	if !Alive(pid) {
		t.Error("Alive: a process whose threads run counts as dead")
	}
	if found, err := FindTagged(tag); err != nil || !slices.Equal(found, []int{pid}) {
		t.Fatalf("FindTagged = %v, %v; want [%d]", found, err, pid)
	}
	n, err := KillTagged(context.Background(), tag, time.Second)
	if err != nil || n != 1 {
		t.Fatalf("KillTagged = %d, %v", n, err)
	}
	select {
	case <-done:
	case <-time.After(time.Minute):
		t.Fatal("the sweep left the process alive")
	}
}

// TestWorkingIn finds a process by its working directory (or one below it),
// and not by another directory that merely shares a prefix.
func TestWorkingIn(t *testing.T) {
	root := t.TempDir()
	dir := filepath.Join(root, "wt")
	sub := filepath.Join(dir, "deep")
	if err := os.MkdirAll(sub, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(dir+"-other", 0o755); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("sleep", "30")
	cmd.Dir = sub
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { cmd.Process.Kill(); cmd.Wait() }()
	for _, c := range []struct {
		dir  string
		want bool
	}{{dir, true}, {sub, true}, {dir + "-other", false}, {filepath.Join(dir, "de"), false}} {
		pids, err := WorkingIn(c.dir)
		if err != nil {
			t.Fatal(err)
		}
		if got := slices.Contains(pids, cmd.Process.Pid); got != c.want {
			t.Errorf("WorkingIn(%s) has the process: %v, want %v (%v)", c.dir, got, c.want, pids)
		}
	}
}
