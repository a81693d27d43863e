//go:build darwin

package process

import (
	"errors"
	"fmt"
	"os"
	"slices"

	"golang.org/x/sys/unix"
)

// waitExited is not available here: Run reaps the child first and kills the
// rest of its group afterwards.
func waitExited(int) bool { return false }

// FindTagged returns the pids of the live processes whose environment holds
// exactly the entry TagEnv=tag, in ascending order, leaving out the calling
// process. On macOS it reads each process's start-up environment with sysctl
// kern.procargs2, which the kernel allows for the caller's own processes
// (every process, for root): an engine runs as aq's user, so that is enough.
func FindTagged(tag string) ([]int, error) { return FindScoped(tag, "") }

// FindScoped is FindTagged limited to processes that also carry
// ScopeEnv=scope (any scope when scope is empty).
func FindScoped(tag, scope string) ([]int, error) {
	if tag == "" {
		return nil, errNoTag
	}
	found, _, err := scan(wants(tag, scope), 0)
	if err != nil {
		return nil, fmt.Errorf("process: find %s=%s: %w", TagEnv, tag, err)
	}
	pids := make([]int, 0, len(found))
	for _, p := range found {
		pids = append(pids, p.pid)
	}
	slices.Sort(pids)
	return pids, nil
}

// procStat is what the sweep needs of a process. pid and start (its start
// time in microseconds) together name one process: a reused pid has a
// later start.
type procStat struct {
	pid, pgid int
	start     uint64
	live      bool // not a zombie
}

// sZomb is the p_stat of a zombie (sys/proc.h SZOMB).
const sZomb = 5

func statOf(k *unix.KinfoProc) procStat {
	t := k.Proc.P_starttime
	return procStat{
		pid: int(k.Proc.P_pid), pgid: int(k.Eproc.Pgid),
		start: uint64(t.Sec)*1e6 + uint64(t.Usec),
		live:  k.Proc.P_stat != sZomb,
	}
}

// alive reports whether the process p names is still running.
func (p procStat) alive() bool {
	k, err := unix.SysctlKinfoProc("kern.proc.pid", p.pid)
	if err != nil || int(k.Proc.P_pid) != p.pid {
		return false
	}
	now := statOf(k)
	return now.live && now.start == p.start
}

// scan returns the live processes that carry want or belong to process
// group pgid (when > 0). uncertain is set when a process of ours showed no
// environment (mid-exec).
func scan(want [][]byte, pgid int) (found []procStat, uncertain bool, _ error) {
	procs, err := unix.SysctlKinfoProcSlice("kern.proc.all")
	if err != nil {
		return nil, false, err
	}
	self, uid := os.Getpid(), uint32(os.Getuid())
	for i := range procs {
		st := statOf(&procs[i])
		if st.pid <= 0 || st.pid == self || !st.live {
			continue
		}
		if pgid > 0 && st.pgid == pgid {
			found = append(found, st)
			continue
		}
		if uid != 0 && procs[i].Eproc.Ucred.Uid != uid {
			continue // its arguments are not ours to read
		}
		b, err := unix.SysctlRaw("kern.procargs2", st.pid)
		if err != nil {
			continue // gone, or not readable
		}
		_, env, ok := parseProcArgs2(b)
		switch {
		case !ok:
		case len(env) == 0:
			uncertain = true
		case environHolds(env, want):
			found = append(found, st)
		}
	}
	return found, uncertain, nil
}

// WorkingIn is not implemented on macOS (it needs proc_pidinfo); it returns
// errors.ErrUnsupported, and the job's tag sweep is the only guard.
func WorkingIn(dir string) ([]int, error) {
	return nil, fmt.Errorf("process: working directories on darwin: %w", errors.ErrUnsupported)
}
