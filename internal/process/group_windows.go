//go:build windows

package process

import (
	"os"
	"os/exec"
	"syscall"
)

// SetGroup starts cmd in a new process group (CREATE_NEW_PROCESS_GROUP), the
// unit a console control event reaches.
func SetGroup(cmd *exec.Cmd) {
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.CreationFlags |= syscall.CREATE_NEW_PROCESS_GROUP
}

// KillGroup ends the process pid (TerminateProcess). Windows has no signal
// for a group: helper children started with SetGroup have no children of
// their own; engines run in a Job Object instead (see Run).
func KillGroup(pid int) error {
	p, err := os.FindProcess(pid)
	if err != nil {
		return err
	}
	return p.Kill()
}

// Terminate ends p: Windows has no SIGTERM for a process without a console.
func Terminate(p *os.Process) error { return p.Kill() }
