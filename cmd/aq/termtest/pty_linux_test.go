//go:build !unit

package termtest

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/aqfleet/aq/internal/process"
)

// A raw pseudo-terminal from /dev/ptmx: aq gets its slave side as stdin,
// stdout, stderr and controlling terminal; the test reads the master side
// and never answers anything aq asks.

// openPty returns a new pty's master and slave, the slave cols×rows.
func openPty(t *testing.T, cols, rows uint16) (master, slave *os.File) {
	t.Helper()
	m, err := os.OpenFile("/dev/ptmx", os.O_RDWR|syscall.O_NOCTTY, 0)
	if err != nil {
		t.Skipf("no pseudo-terminal here: %v", err)
	}
	if err := unix.IoctlSetPointerInt(int(m.Fd()), unix.TIOCSPTLCK, 0); err != nil {
		m.Close()
		t.Fatalf("unlockpt: %v", err)
	}
	n, err := unix.IoctlGetInt(int(m.Fd()), unix.TIOCGPTN)
	if err != nil {
		m.Close()
		t.Fatalf("ptsname: %v", err)
	}
	s, err := os.OpenFile(fmt.Sprintf("/dev/pts/%d", n), os.O_RDWR|syscall.O_NOCTTY, 0)
	if err != nil {
		m.Close()
		t.Fatalf("open the pty's slave: %v", err)
	}
	if err := unix.IoctlSetWinsize(int(s.Fd()), unix.TIOCSWINSZ, &unix.Winsize{Col: cols, Row: rows}); err != nil {
		t.Fatalf("set the pty's size: %v", err)
	}
	return m, s
}

// ptyResult is one aq process that ran on a pty.
type ptyResult struct {
	Out  string // everything aq wrote to the terminal
	Code int
	Took time.Duration
}

// syncBuf is what the master side read so far.
type syncBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuf) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuf) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// runOnPty runs bin with args on a new 120×40 pty in env and dir, calls
// drive (if any) with what it printed so far and the master to type into,
// and waits for it to end (a hang guard of two minutes, not a speed
// requirement).
func runOnPty(t *testing.T, bin string, env []string, dir string, args []string, drive func(seen func() string, keys io.Writer)) ptyResult {
	t.Helper()
	master, slave := openPty(t, 120, 40)
	defer master.Close()
	cmd := exec.Command(bin, args...)
	cmd.Env, cmd.Dir = env, dir
	cmd.Stdin, cmd.Stdout, cmd.Stderr = slave, slave, slave
	// A session of its own with the pty as its controlling terminal, as a
	// shell in a terminal would start it.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true, Setctty: true, Ctty: 0}
	start := time.Now()
	if err := cmd.Start(); err != nil {
		slave.Close()
		t.Fatal(err)
	}
	slave.Close()
	var out syncBuf
	read := make(chan struct{})
	go func() {
		defer close(read)
		_, _ = io.Copy(&out, master) // ends with EIO once every slave fd is closed
	}()
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	if drive != nil {
		drive(out.String, master)
	}
	var err error
	select {
	case err = <-done:
	case <-time.After(2 * time.Minute):
		_ = process.KillGroup(cmd.Process.Pid)
		<-done
		t.Fatalf("aq %v still runs after two minutes on a pty; it printed:\n%q", args, out.String())
	}
	took := time.Since(start)
	select {
	case <-read:
	case <-time.After(5 * time.Second): // a straggler holds the slave: what was read is enough
	}
	var ee *exec.ExitError
	if err != nil && !errors.As(err, &ee) {
		t.Fatalf("aq %v: %v", args, err)
	}
	return ptyResult{Out: out.String(), Code: cmd.ProcessState.ExitCode(), Took: took}
}

// runPlain runs bin with args without a terminal (stdin /dev/null, output
// to pipes), for the time it takes there.
func runPlain(t *testing.T, bin string, env []string, dir string, args []string) (time.Duration, int) {
	t.Helper()
	cmd := exec.Command(bin, args...)
	cmd.Env, cmd.Dir = env, dir
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	process.SetGroup(cmd)
	start := time.Now()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case <-done:
	case <-time.After(2 * time.Minute):
		_ = process.KillGroup(cmd.Process.Pid)
		<-done
		t.Fatalf("aq %v still runs after two minutes:\n%s", args, out.String())
	}
	return time.Since(start), cmd.ProcessState.ExitCode()
}

// queries are the terminal queries a styling library sends and then waits
// for: the background colour (OSC 11), the foreground (OSC 10), the cursor
// position (DSR), the primary device attributes (DA1).
var queries = map[string]string{
	"background colour (OSC 11 ?)": "\x1b]11;?",
	"foreground colour (OSC 10 ?)": "\x1b]10;?",
	"cursor position (CSI 6 n)":    "\x1b[6n",
	"device attributes (CSI c)":    "\x1b[c",
}

// askedTerminal names the queries out holds.
func askedTerminal(out string) []string {
	var asked []string
	for name, q := range queries {
		if strings.Contains(out, q) {
			asked = append(asked, name)
		}
	}
	return asked
}
