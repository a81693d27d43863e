//go:build unix

package process

import (
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"testing"
	"time"
)

// Alive: this process is; a child that exited and was reaped is not; on
// Linux a zombie (exited, not yet reaped) is not either; pid 0 never is.
func TestAlive(t *testing.T) {
	if !Alive(os.Getpid()) {
		t.Fatal("this process is not alive")
	}
	if Alive(0) || Alive(-1) {
		t.Fatal("pid 0 or -1 alive")
	}
	reaped := exec.Command("true")
	if err := reaped.Run(); err != nil {
		t.Fatal(err)
	}
	if Alive(reaped.ProcessState.Pid()) {
		t.Fatal("a reaped child is alive")
	}
	if runtime.GOOS != "linux" {
		return
	}
	zombie := exec.Command("true")
	if err := zombie.Start(); err != nil {
		t.Fatal(err)
	}
	defer zombie.Wait()
	pid := zombie.Process.Pid
	for i := 0; Alive(pid); i++ { // until it has exited (a zombie: not reaped yet)
		if i > 1000 {
			t.Fatal("a child that exited at once still counts as alive after 10 s (zombies must not)")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if _, err := os.Stat("/proc/" + strconv.Itoa(pid)); err != nil {
		t.Fatalf("the zombie should still have its /proc entry: %v", err)
	}
}
