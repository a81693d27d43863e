package hostile

import (
	"bytes"
	"os"
	"strconv"
	"syscall"
)

// Marked are the live processes of this host whose command line carries
// mark (the straggler: Args.StragglerMark), from /proc — a process in a
// sandbox's pid namespace too.
func Marked(mark string) ([]int, error) {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return nil, err
	}
	var pids []int
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		cmdline, err := os.ReadFile("/proc/" + e.Name() + "/cmdline")
		if err != nil || !bytes.Contains(cmdline, []byte(mark)) {
			continue
		}
		if st, err := os.ReadFile("/proc/" + e.Name() + "/stat"); err == nil && !bytes.Contains(st, []byte(") Z ")) {
			pids = append(pids, pid)
		}
	}
	return pids, nil
}

// KillMarked kills the processes carrying mark, and their process groups.
func KillMarked(mark string) {
	pids, _ := Marked(mark)
	for _, pid := range pids {
		_ = syscall.Kill(-pid, syscall.SIGKILL)
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
}
