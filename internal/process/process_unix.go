//go:build unix

package process

import (
	"os"
	"os/exec"
	"strconv"
	"syscall"
)

// ladderSteps are the kill ladder's signals, in order, to the whole group.
var ladderSteps = unixLadder

var ladderSignals = [...]syscall.Signal{syscall.SIGINT, syscall.SIGTERM, syscall.SIGKILL}

// inNewGroup makes the child lead a new process group (Setpgid, Pgid 0).
func inNewGroup(cmd *exec.Cmd) { SetGroup(cmd) }

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
