//go:build unix

package engines

import (
	"os/exec"
	"syscall"
)

// newSession starts cmd in a session of its own (setsid), outside the
// engine's process group, when setsid is set: an escaped grandchild.
func newSession(cmd *exec.Cmd, setsid bool) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: setsid}
}
