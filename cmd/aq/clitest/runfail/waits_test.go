//go:build unix

package runfail

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/aqfleet/aq/cmd/aq/clitest"
	"github.com/aqfleet/aq/internal/process"
	"github.com/aqfleet/aq/internal/testenv"
)

// Finding 10: aq validate on a FIFO hung for 15 minutes and ignored SIGTERM
// and SIGINT. A path that is not a regular file is refused at once, without
// being opened for reading, in one line.
func TestValidateRefusesAFIFO(t *testing.T) {
	h := clitest.BinHome(t)
	fifo := filepath.Join(t.TempDir(), "job.md")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Skip("mkfifo:", err)
	}
	for _, c := range []struct {
		cmd  string
		code int
	}{{"validate", 2}, {"submit", 2}} {
		cmd := h.Command(t, c.cmd, fifo)
		var out, errb bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &errb
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		r, err := testenv.Wait(cmd, &out, &errb, 30*time.Second)
		if err != nil {
			t.Fatalf("aq %s on a FIFO did not return: %v", c.cmd, err)
		}
		if r.Code != c.code || !strings.Contains(r.Stderr, fifo+": is a named pipe (FIFO), not a manifest file") {
			t.Fatalf("aq %s on a FIFO: want exit %d and the reason: %s", c.cmd, c.code, r)
		}
	}
}

// Finding 10: aq status waited silently on a held queue lock and ignored
// SIGTERM and SIGINT. After a second it says what it waits for and which
// process holds the lock; a signal ends the wait at once, in one line,
// nothing changed.
func TestQueueLockWaitSaysWhoAndObeysSignals(t *testing.T) {
	flockBin, err := exec.LookPath("flock")
	if err != nil {
		t.Skip("util-linux flock is not installed")
	}
	h := clitest.BinHome(t)
	if r := h.Run(t, "status"); r.Code != 0 { // makes the queue and its lock file
		t.Fatalf("aq status: %s", r)
	}
	lock := filepath.Join(h.Dir, "queue", ".lock")
	for _, sig := range []syscall.Signal{syscall.SIGTERM, syscall.SIGINT} {
		t.Run(sig.String(), func(t *testing.T) {
			holder := exec.Command(flockBin, "-x", lock, "sleep", "120")
			process.SetGroup(holder)
			if err := holder.Start(); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = process.KillGroup(holder.Process.Pid); _ = holder.Wait() })
			testenv.WaitFor(t, time.Minute, "flock to hold the queue's lock", func() bool {
				b, _ := os.ReadFile("/proc/locks")
				return bytes.Contains(b, []byte(" "+strconv.Itoa(holder.Process.Pid)+" "))
			})

			cmd := h.Command(t, "status")
			out, errb := &testenv.SyncBuffer{}, &testenv.SyncBuffer{}
			cmd.Stdout, cmd.Stderr = out, errb
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			done := make(chan struct{})
			go func() { _ = cmd.Wait(); close(done) }()
			t.Cleanup(func() { _ = process.KillGroup(cmd.Process.Pid); <-done })
			want := "aq: waiting for the local queue's lock (" + lock + "), held by pid " + strconv.Itoa(holder.Process.Pid) + " (flock)"
			deadline := time.Now().Add(30 * time.Second)
			for !strings.Contains(errb.String(), want) {
				select {
				case <-done:
					t.Fatalf("aq status ended while the lock was held:\n%s", errb)
				default:
				}
				if time.Now().After(deadline) {
					t.Fatalf("aq status does not say what it waits for (want %q):\n%s", want, errb)
				}
				time.Sleep(20 * time.Millisecond)
			}
			if err := cmd.Process.Signal(sig); err != nil {
				t.Fatal(err)
			}
			select {
			case <-done:
			case <-time.After(30 * time.Second):
				t.Fatalf("aq status ignored %s while waiting for the lock:\n%s", sig, errb)
			}
			if code := cmd.ProcessState.ExitCode(); code != 1 || !strings.Contains(errb.String(), "aq: interrupted while waiting for the local queue's lock") ||
				!strings.Contains(errb.String(), "nothing was changed") {
				t.Fatalf("exit %d; want 1 and one line saying the wait was interrupted:\n%s", code, errb)
			}
		})
	}
}
