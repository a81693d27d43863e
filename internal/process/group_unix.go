//go:build unix

package process

import (
	"os"
	"os/exec"
	"syscall"
)

// SetGroup makes cmd's process lead a new process group, so that KillGroup
// reaches everything it starts. For helper children (the broker peer, the
// coordinator stub, factories in the demo); engines go through Run.
func SetGroup(cmd *exec.Cmd) {
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.Setpgid = true
}

// KillGroup kills the process group led by pid (SIGKILL).
func KillGroup(pid int) error { return syscall.Kill(-pid, syscall.SIGKILL) }

// Terminate asks p to stop (SIGTERM), giving it the chance to clean up.
func Terminate(p *os.Process) error { return p.Signal(syscall.SIGTERM) }
