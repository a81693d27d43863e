//go:build unix

package process_test

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/aqfleet/aq/internal/process"
)

// startAQ runs the test binary as an aq (mode "aq") with one engine whose
// grandchild escaped its group; it returns the aq and the engine's pids.
func startAQ(t *testing.T, tag string, supervised bool) (aq *exec.Cmd, engine, escaped int) {
	t.Helper()
	self, _ := os.Executable()
	sup := "0"
	if supervised {
		sup = "1"
	}
	aq = exec.Command(self, tag, sup)
	aq.Env = append(os.Environ(), childModeEnv+"=aq")
	out, err := aq.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := aq.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = aq.Process.Kill()
		_ = aq.Wait()
		_, _ = process.KillScoped(t.Context(), tag, "supervise-test", 0)
	})
	line, _ := bufio.NewReader(out).ReadString('\n')
	if _, err := fmt.Sscanf(strings.TrimSpace(line), "pids %d %d", &engine, &escaped); err != nil {
		t.Fatalf("engine did not start: %q", line)
	}
	return aq, engine, escaped
}

// kill -9 of aq mid-job: within the ladder's time (2 graces) plus the
// sweep's, no process of the job is left — the engine, its group and the
// grandchild that escaped the group. Without a supervisor they live on,
// which is the hole this closes.
func TestEngineDiesWithItsAQ(t *testing.T) {
	for _, supervised := range []bool{true, false} {
		t.Run(fmt.Sprintf("supervised=%v", supervised), func(t *testing.T) {
			tag := fmt.Sprintf("sup-%d-%v-%d", os.Getpid(), supervised, time.Now().UnixNano())
			aq, engine, escaped := startAQ(t, tag, supervised)
			if err := aq.Process.Signal(syscall.SIGKILL); err != nil {
				t.Fatal(err)
			}
			_ = aq.Wait()
			// The limit aq documents: 2 ladder graces (200 ms here) plus the
			// sweep's SIGTERM grace and its kill wait, with room for a
			// loaded machine; a deadline guard, not a timing assertion.
			limit := 15 * time.Second
			if !supervised {
				limit = 2 * time.Second // long enough for a supervisor to have acted
			}
			deadline := time.Now().Add(limit)
			gone := func() bool {
				left, _ := process.FindScoped(tag, "supervise-test")
				return len(left) == 0 && !process.Alive(engine) && !process.Alive(escaped)
			}
			for !gone() && time.Now().Before(deadline) {
				time.Sleep(20 * time.Millisecond)
			}
			if supervised && !gone() {
				left, _ := process.FindScoped(tag, "supervise-test")
				t.Fatalf("after kill -9 of aq the job's processes live on: %v (engine %d alive %v, escaped %d alive %v)",
					left, engine, process.Alive(engine), escaped, process.Alive(escaped))
			}
			if !supervised && gone() {
				t.Fatalf("without a supervisor the engine was expected to outlive aq (the test could not tell the difference)")
			}
		})
	}
}

// A supervisor told "done" exits at once and touches nothing.
func TestSupervisorDoneLeavesTheGroupAlone(t *testing.T) {
	tag := fmt.Sprintf("sup-done-%d-%d", os.Getpid(), time.Now().UnixNano())
	self, _ := os.Executable()
	sleeper := exec.Command(self)
	sleeper.Env = append(os.Environ(), childModeEnv+"=sleep", process.TagEnv+"="+tag)
	process.SetGroup(sleeper)
	if err := sleeper.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = process.KillGroup(sleeper.Process.Pid); _ = sleeper.Wait() })
	sup := exec.Command(self)
	sup.Env = []string{process.SuperviseEnv + fmt.Sprintf(`={"pgid":%d,"tag":%q,"grace":100000000}`, sleeper.Process.Pid, tag)}
	sup.Stdin = strings.NewReader("d")
	if err := sup.Run(); err != nil {
		t.Fatalf("supervisor: %v", err)
	}
	if !process.Alive(sleeper.Process.Pid) {
		t.Fatal("a supervisor told done killed the group")
	}
	// The same supervisor whose pipe closes without "done" stops it.
	sup = exec.Command(self)
	sup.Env = []string{process.SuperviseEnv + fmt.Sprintf(`={"pgid":%d,"tag":%q,"grace":100000000}`, sleeper.Process.Pid, tag)}
	sup.Stdin = strings.NewReader("")
	if err := sup.Run(); err != nil {
		t.Fatalf("supervisor: %v", err)
	}
	_ = sleeper.Wait()
	if process.Alive(sleeper.Process.Pid) {
		t.Fatal("a supervisor whose aq is gone left the group running")
	}
}

// A supervisor whose aq died sweeps its own run's processes, never the
// next run's of the same job: recovery may take the job again, and start
// its engine with the same tag, while the dead aq's supervisor is still on
// its ladder (TestRunKill9MidJob's re-run was killed by SIGINT so).
func TestSupervisorSparesTheNextRun(t *testing.T) {
	tag := fmt.Sprintf("sup-next-%d-%d", os.Getpid(), time.Now().UnixNano())
	self, _ := os.Executable()
	// Each sleeper is ready (its signal dispositions in place: a child
	// started with SIGINT ignored executes itself again first) before the
	// supervisor looks: this test is about which run it stops, not about
	// a process caught in the middle of an execve (proc_linux_test.go).
	sleeper := func(run string) *exec.Cmd {
		c := exec.Command(self)
		c.Env = append(os.Environ(), childModeEnv+"=ready-sleep", process.TagEnv+"="+tag, process.RunEnv+"="+run)
		process.SetGroup(c)
		err := startWaitReady(c)
		if c.Process != nil {
			t.Cleanup(func() { _ = process.KillGroup(c.Process.Pid); _ = c.Wait() })
		}
		if err != nil {
			t.Fatalf("sleeper %s: %v", run, err)
		}
		return c
	}
	straggler, next := sleeper("run-1"), sleeper("run-2")
	sup := exec.Command(self)
	sup.Env = []string{process.SuperviseEnv + fmt.Sprintf(`={"tag":%q,"run":"run-1","grace":100000000}`, tag)}
	sup.Stdin = strings.NewReader("") // its aq is gone
	if err := sup.Run(); err != nil {
		t.Fatalf("supervisor: %v", err)
	}
	_ = straggler.Wait()
	if process.Alive(straggler.Process.Pid) {
		t.Fatal("the dead aq's run left a straggler")
	}
	if !process.Alive(next.Process.Pid) {
		t.Fatal("the dead aq's supervisor killed the next run of the same job")
	}
}

// A malformed supervision order is one line and exit 2.
func TestSupervisorBadOrders(t *testing.T) {
	self, _ := os.Executable()
	cmd := exec.Command(self)
	cmd.Env = []string{process.SuperviseEnv + "={not json"}
	out, err := cmd.CombinedOutput()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 2 || strings.Count(strings.TrimSpace(string(out)), "\n") != 0 {
		t.Fatalf("bad orders: err %v, output %q", err, out)
	}
}

// Orphan recovery stops a job's leftovers with the live path's ladder: an
// engine that cleans up on SIGINT gets to (StopScoped). KillScoped's
// SIGTERM, which recovery used before, kills it without its clean-up.
func TestStopScopedLetsAnOrphanCleanUp(t *testing.T) {
	for _, ladder := range []bool{true, false} {
		t.Run(fmt.Sprintf("ladder=%v", ladder), func(t *testing.T) {
			tag := fmt.Sprintf("orphan-%d-%v-%d", os.Getpid(), ladder, time.Now().UnixNano())
			marker := t.TempDir() + "/cleaned"
			self, _ := os.Executable()
			eng := exec.Command(self, marker)
			eng.Env = append(os.Environ(), childModeEnv+"=cleanup-on-int", process.TagEnv+"="+tag, process.ScopeEnv+"=orphans")
			process.SetGroup(eng)
			out, _ := eng.StdoutPipe()
			if err := eng.Start(); err != nil {
				t.Fatal(err)
			}
			done := make(chan struct{})
			go func() { _ = eng.Wait(); close(done) }()
			t.Cleanup(func() { _ = process.KillGroup(eng.Process.Pid); <-done })
			if line, _ := bufio.NewReader(out).ReadString('\n'); line != "ready\n" {
				t.Fatalf("engine not ready: %q", line)
			}
			stop := process.KillScoped
			if ladder {
				stop = process.StopScoped
			}
			n, err := stop(t.Context(), tag, "orphans", time.Second)
			if err != nil || n != 1 {
				t.Fatalf("stop = %d, %v; want the one engine", n, err)
			}
			<-done
			_, statErr := os.Stat(marker)
			if cleaned := statErr == nil; cleaned != ladder {
				t.Fatalf("engine cleaned up: %v, want %v", cleaned, ladder)
			}
		})
	}
}
