//go:build windows

package process

import (
	"fmt"
	"os"
	"os/exec"
	"unsafe"

	"golang.org/x/sys/windows"
)

// ladderSteps on Windows: CTRL_BREAK to the engine's console process group
// (the engine may clean up), then TerminateJobObject, which ends every
// process in the job at once. Windows has no SIGTERM between the two.
var ladderSteps = windowsLadder

// inNewGroup starts the child in a new console process group, the unit a
// CTRL_BREAK event reaches.
func inNewGroup(cmd *exec.Cmd) { SetGroup(cmd) }

// jobGroup is a Job Object holding the engine and everything it starts.
// JOB_OBJECT_LIMIT_KILL_ON_JOB_CLOSE ends the whole tree when the last handle
// closes — when Run is done with it, and when aq itself dies, however it
// dies: no engine outlives its aq on Windows.
type jobGroup struct {
	job windows.Handle
	pid uint32
}

// holdGroup puts the started child into a new Job Object. A process the
// child starts in the instant between its start and the assignment escapes
// the job (Go's os/exec cannot start a process suspended); engines start
// their children later than that.
func holdGroup(cmd *exec.Cmd) (group, error) {
	job, err := windows.CreateJobObject(nil, nil)
	if err != nil {
		return nil, fmt.Errorf("create job object: %w", err)
	}
	info := windows.JOBOBJECT_EXTENDED_LIMIT_INFORMATION{}
	info.BasicLimitInformation.LimitFlags = windows.JOB_OBJECT_LIMIT_KILL_ON_JOB_CLOSE
	if _, err := windows.SetInformationJobObject(job, windows.JobObjectExtendedLimitInformation,
		uintptr(unsafe.Pointer(&info)), uint32(unsafe.Sizeof(info))); err != nil {
		_ = windows.CloseHandle(job)
		return nil, fmt.Errorf("set job object limits: %w", err)
	}
	pid := uint32(cmd.Process.Pid)
	h, err := windows.OpenProcess(windows.PROCESS_SET_QUOTA|windows.PROCESS_TERMINATE, false, pid)
	if err != nil {
		_ = windows.CloseHandle(job)
		return nil, fmt.Errorf("open the engine process: %w", err)
	}
	defer windows.CloseHandle(h)
	if err := windows.AssignProcessToJobObject(job, h); err != nil {
		_ = windows.CloseHandle(job)
		return nil, fmt.Errorf("assign the engine to its job object: %w", err)
	}
	return &jobGroup{job: job, pid: pid}, nil
}

func (g *jobGroup) step(i int) {
	if i == 0 {
		_ = windows.GenerateConsoleCtrlEvent(windows.CTRL_BREAK_EVENT, g.pid)
		return
	}
	g.kill()
}

func (g *jobGroup) kill()  { _ = windows.TerminateJobObject(g.job, 1) }
func (g *jobGroup) close() { _ = windows.CloseHandle(g.job) }

// exitSignal: Windows processes end with an exit code, not a signal.
func exitSignal(*os.ProcessState) string { return "" }

// Alive reports whether a process with this pid is running.
func Alive(pid int) bool {
	if pid <= 0 {
		return false
	}
	h, err := windows.OpenProcess(windows.PROCESS_QUERY_LIMITED_INFORMATION, false, uint32(pid))
	if err != nil {
		return false
	}
	defer windows.CloseHandle(h)
	var code uint32
	if err := windows.GetExitCodeProcess(h, &code); err != nil {
		return false
	}
	const stillActive = 259 // STILL_ACTIVE
	return code == stillActive
}
