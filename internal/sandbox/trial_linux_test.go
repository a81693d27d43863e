package sandbox_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/aqfleet/aq/internal/sandbox"
	"github.com/aqfleet/aq/internal/testenv"
)

// countingInit is an init that appends a line to log every time it is
// started, then is this test binary (the sandbox's init, TestMain).
func countingInit(t *testing.T, dir string) (init, log string) {
	t.Helper()
	init, log = filepath.Join(dir, "init"), filepath.Join(dir, "inits")
	testenv.WriteFile(t, init, "#!/bin/sh\necho started >> "+strconv.Quote(log)+"\nexec "+strconv.Quote(self(t))+" \"$@\"\n")
	if err := os.Chmod(init, 0o755); err != nil {
		t.Fatal(err)
	}
	return init, log
}

func starts(t *testing.T, log string) int {
	t.Helper()
	b, err := os.ReadFile(log)
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	return strings.Count(string(b), "started\n")
}

// TestTrialRemembered: a trial sandbox that started is remembered for the
// boot (Options.TrialCache), so the next process's probe starts no
// sandbox; another boot, another init binary, a cache that is not a
// regular file or a failed trial all run the trial again, and a full
// sandbox that does not start forgets it.
func TestTrialRemembered(t *testing.T) {
	dir := t.TempDir()
	init, log := countingInit(t, dir)
	cache := filepath.Join(dir, "state", "sandbox-trial")
	open := func() *sandbox.Host {
		t.Helper()
		h := sandbox.Open(sandbox.Options{Init: init, Mode: sandbox.ModeAuto, TrialCache: cache})
		if h.Level() != sandbox.LevelFull {
			t.Fatalf("level %s, want full on this host: %s", h.Level(), h.Report().MissingLine())
		}
		return h
	}
	want := func(n int, when string) {
		t.Helper()
		if got := starts(t, log); got != n {
			t.Fatalf("%s: the init started %d times, want %d", when, got, n)
		}
	}

	first := open().Report()
	want(1, "the first probe")
	fi, err := os.Stat(cache)
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("the trial is not remembered in a 0600 file: %v %v", fi, err)
	}
	if again := open().Report(); again.Mechanism != first.Mechanism || again.MissingLine() != first.MissingLine() {
		t.Errorf("remembered report %+v, want %+v", again, first)
	}
	want(1, "a second probe in the same boot")

	// Another boot (or anything else in the key) runs the trial again.
	key, _ := os.ReadFile(cache)
	if !strings.Contains(string(key), "boot ") || !strings.Contains(string(key), init) {
		t.Fatalf("the key does not name the boot and the init:\n%s", key)
	}
	testenv.WriteFile(t, cache, strings.Replace(string(key), "boot ", "boot 0", 1))
	open()
	want(2, "another boot")
	// aq replaced: the init's size or time differ.
	later := time.Now().Add(time.Minute)
	if err := os.Chtimes(init, later, later); err != nil {
		t.Fatal(err)
	}
	open()
	want(3, "another init binary")
	open()
	want(3, "the new init remembered")

	// A FIFO where the file was is not read (nor waited on): the trial
	// runs and the file is written anew.
	if err := os.Remove(cache); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mkfifo(cache, 0o600); err != nil {
		t.Fatal(err)
	}
	open()
	want(4, "a FIFO in place of the file")
	if fi, err := os.Lstat(cache); err != nil || !fi.Mode().IsRegular() {
		t.Fatalf("the FIFO was not replaced by the remembered trial: %v %v", fi, err)
	}

	// A trial that fails is not remembered.
	bad := filepath.Join(dir, "bad-init")
	testenv.WriteFile(t, bad, "#!/bin/sh\nexit 1\n")
	if err := os.Chmod(bad, 0o755); err != nil {
		t.Fatal(err)
	}
	badCache := filepath.Join(dir, "state", "bad-trial")
	if h := sandbox.Open(sandbox.Options{Init: bad, Mode: sandbox.ModeAuto, TrialCache: badCache}); h.Level() == sandbox.LevelFull {
		t.Fatalf("a failing init reached the full level: %+v", h.Report())
	}
	if _, err := os.Stat(badCache); !os.IsNotExist(err) {
		t.Errorf("a failed trial was remembered: %v", err)
	}

	// A full sandbox that does not start forgets the trial.
	h := open()
	want(4, "before a start that fails")
	l := makeLayout(t, t.TempDir())
	j, err := h.Jail(l.policy)
	if err != nil {
		t.Fatal(err)
	}
	defer j.Remove()
	if err := os.WriteFile(init, []byte("#!/bin/sh\nexit 1\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("/bin/true")
	if run, err := j.Start(cmd); err == nil {
		_ = cmd.Wait()
		run.Exit(cmd.ProcessState)
		_, _ = run.Close()
		t.Fatal("a sandbox whose init exits at once started")
	}
	if _, err := os.Stat(cache); !os.IsNotExist(err) {
		t.Errorf("a sandbox that did not start left the trial remembered: %v", err)
	}
}
