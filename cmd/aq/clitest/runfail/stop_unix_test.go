//go:build unix

package runfail

import (
	"bytes"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/aqfleet/aq/internal/testenv"
)

// TestSignalWinsOverABlockedStep: a real aq run blocked reading a FIFO (its
// configuration file: no context reaches a read(2)) gets SIGTERM and exits
// 1 once AQ_STOP_BOUND has passed, saying what it abandoned. Before the
// stop watch (stop.go), signal.NotifyContext swallowed every signal after
// the first, and such an aq ran until it was killed -9.
func TestSignalWinsOverABlockedStep(t *testing.T) {
	bin := testenv.BuildAQ(t)
	h := testenv.NewHome(t)
	fifo := filepath.Join(t.TempDir(), "config.yaml")
	if err := unix.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "run", "--once")
	cmd.Env = append(h.Environ(), "AQ_CONFIG="+fifo, "AQ_STOP_BOUND=1s")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	// aq is blocked once it opened the FIFO: a writer's non-blocking open
	// succeeds only when there is a reader. The writer stays open and
	// writes nothing, so aq's read waits.
	var w *os.File
	testenv.WaitFor(t, time.Minute, "aq to open its configuration FIFO", func() bool {
		fd, err := unix.Open(fifo, unix.O_WRONLY|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
		if err != nil {
			return false
		}
		w = os.NewFile(uintptr(fd), fifo)
		return true
	})
	defer w.Close()
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-exited:
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.ExitCode() != 1 {
			t.Errorf("aq exited %v, want status 1", err)
		}
	case <-time.After(2 * time.Minute): // a deadlock guard, far past the 1s bound
		cmd.Process.Kill()
		t.Fatal("aq run did not exit after SIGTERM: the blocked step held it")
	}
	if !strings.Contains(stderr.String(), "aq run did not stop within 1s of SIGTERM (AQ_STOP_BOUND)") {
		t.Errorf("stderr:\n%s", stderr.String())
	}
}
