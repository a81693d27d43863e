//go:build unix

package process

import (
	"os"
	"os/exec"
	"os/signal"
	"strconv"
	"sync"
	"syscall"
)

// ladderSteps are the kill ladder's signals, in order, to the whole group.
var ladderSteps = unixLadder

var ladderSignals = [...]syscall.Signal{syscall.SIGINT, syscall.SIGTERM, syscall.SIGKILL}

// inNewGroup makes the child lead a new process group (Setpgid, Pgid 0),
// with the default disposition of the ladder's signals.
func inNewGroup(cmd *exec.Cmd) {
	defaultLadderSignals()
	SetGroup(cmd)
}

var ladderDefaults sync.Once

// defaultLadderSignals makes sure an engine starts with the default
// disposition of the signals the ladder sends before SIGKILL. A process
// inherits an ignored signal across exec — an aq started in the background
// of a shell without job control has SIGINT ignored — and so would its
// engines: the ladder's polite SIGINT would be lost and every stop would
// wait out the grace for SIGTERM. Go's exec gives a child the default
// disposition of every signal this process handles (os/signal), and keeps
// the others as they are; so aq handles those it found ignored, and drops
// them — for aq itself nothing changes (a signal it ignored, it still does
// not act on).
func defaultLadderSignals() {
	ladderDefaults.Do(func() {
		var ignored []os.Signal
		for _, s := range ladderSignals[:len(ladderSignals)-1] {
			if signal.Ignored(s) {
				ignored = append(ignored, s)
			}
		}
		if len(ignored) > 0 {
			signal.Notify(make(chan os.Signal, 1), ignored...)
		}
	})
}

// pgroup is a POSIX process group, led by the engine.
type pgroup int

func holdGroup(cmd *exec.Cmd) (group, error) { return pgroup(cmd.Process.Pid), nil }

func (g pgroup) step(i int) { _ = syscall.Kill(-int(g), ladderSignals[i]) }
func (g pgroup) kill()      { _ = syscall.Kill(-int(g), syscall.SIGKILL) } // ESRCH if none left
func (g pgroup) close()     {}

// exitSignal names the signal that ended the process, "" if it exited.
func exitSignal(st *os.ProcessState) string {
	if ws, ok := st.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		return signalName(ws.Signal())
	}
	return ""
}

var signalNames = map[syscall.Signal]string{
	syscall.SIGABRT: "SIGABRT", syscall.SIGALRM: "SIGALRM", syscall.SIGBUS: "SIGBUS",
	syscall.SIGFPE: "SIGFPE", syscall.SIGHUP: "SIGHUP", syscall.SIGILL: "SIGILL",
	syscall.SIGINT: "SIGINT", syscall.SIGKILL: "SIGKILL", syscall.SIGPIPE: "SIGPIPE",
	syscall.SIGQUIT: "SIGQUIT", syscall.SIGSEGV: "SIGSEGV", syscall.SIGSYS: "SIGSYS",
	syscall.SIGTERM: "SIGTERM", syscall.SIGTRAP: "SIGTRAP", syscall.SIGUSR1: "SIGUSR1",
	syscall.SIGUSR2: "SIGUSR2", syscall.SIGXCPU: "SIGXCPU", syscall.SIGXFSZ: "SIGXFSZ",
}

// signalName is the conventional name of sig ("SIGTERM"); syscall's String
// gives a description ("terminated") instead.
func signalName(sig syscall.Signal) string {
	if n, ok := signalNames[sig]; ok {
		return n
	}
	return "SIG" + strconv.Itoa(int(sig))
}
