package process

import (
	"bytes"
	"fmt"
	"os"
	"slices"
	"strconv"
	"syscall"
	"unsafe"
)

// pPID is waitid's idtype_t P_PID.
const pPID = 1

// waitExited blocks until process pid (a child of ours) has exited, without
// reaping it: waitid(P_PID, pid, WEXITED|WNOWAIT). It reports false if that
// failed, in which case the caller must reap first and clean up after.
func waitExited(pid int) bool {
	var info [128]byte // siginfo_t; not read
	for {
		_, _, e := syscall.Syscall6(syscall.SYS_WAITID, pPID, uintptr(pid),
			uintptr(unsafe.Pointer(&info)), syscall.WEXITED|syscall.WNOWAIT, 0, 0)
		switch e {
		case 0:
			return true
		case syscall.EINTR:
			continue
		default:
			return false
		}
	}
}

// FindTagged returns the pids of the live processes whose environment holds
// exactly the entry TagEnv=tag, in ascending order, leaving out the calling
// process. It reads /proc/<pid>/environ, which is the environment a process
// was started (exec'd) with: it cannot see processes it may not read (other
// users' unless aq is root, or with /proc mounted hidepid), processes in
// other pid namespaces, processes that exec'd with a scrubbed environment,
// or zombies (dead, only waiting to be reaped). A process that exits or
// cannot be read during the scan is skipped.
func FindTagged(tag string) ([]int, error) { return FindScoped(tag, "") }

// FindScoped is FindTagged limited to processes that also carry
// ScopeEnv=scope (any scope when scope is empty).
func FindScoped(tag, scope string) ([]int, error) {
	if tag == "" {
		return nil, errNoTag
	}
	pids, err := listPids()
	if err != nil {
		return nil, fmt.Errorf("process: find %s=%s: %w", TagEnv, tag, err)
	}
	want := wants(tag, scope)
	var found []int
	buf := make([]byte, 0, 16<<10)
	for _, pid := range pids {
		var ok bool
		if ok, buf = hasTag(pid, want, buf); ok {
			found = append(found, pid)
		}
	}
	return found, nil
}

// listPids returns the pids in /proc, ascending, without the calling process.
func listPids() ([]int, error) {
	d, err := os.Open("/proc")
	if err != nil {
		return nil, err
	}
	names, err := d.Readdirnames(-1)
	d.Close()
	if err != nil {
		return nil, err
	}
	self := os.Getpid()
	pids := make([]int, 0, len(names))
	for _, name := range names {
		if name[0] < '1' || name[0] > '9' {
			continue
		}
		if pid, err := strconv.Atoi(name); err == nil && pid != self {
			pids = append(pids, pid)
		}
	}
	slices.Sort(pids)
	return pids, nil
}

// readProcFile reads /proc/<pid>/<name> into buf, which it returns (perhaps
// grown) for reuse; ok is false when the file cannot be opened.
func readProcFile(pid int, name string, buf []byte) (_ []byte, ok bool) {
	buf, err := readProcFileErr(pid, name, buf)
	return buf, err == nil
}

// readProcFileErr is readProcFile with the reason a file could not be
// opened.
func readProcFileErr(pid int, name string, buf []byte) ([]byte, error) {
	fd, err := syscall.Open("/proc/"+strconv.Itoa(pid)+"/"+name, syscall.O_RDONLY|syscall.O_CLOEXEC, 0)
	if err != nil {
		return buf[:0], err // gone, or not ours to read
	}
	defer syscall.Close(fd)
	buf = buf[:0]
	for {
		if len(buf) == cap(buf) {
			buf = slices.Grow(buf, max(cap(buf), 4<<10))
		}
		n, err := syscall.Read(fd, buf[len(buf):cap(buf)])
		if err == syscall.EINTR {
			continue
		}
		if err != nil || n <= 0 {
			return buf, nil // a read error is a process exiting under us: take what we got
		}
		buf = buf[:len(buf)+n]
	}
}

// readEnviron reads pid's environment. A process whose main thread has
// exited while others run (pthread_exit in main; or, for an instant,
// another thread in the middle of an execve) is a zombie leader: its own
// environ answers ESRCH, and the environment is read through one of its
// live threads instead — the process runs, and may hold a job's tag.
func readEnviron(pid int, buf []byte) ([]byte, bool) {
	buf, err := readProcFileErr(pid, "environ", buf)
	if err != syscall.ESRCH {
		return buf, err == nil
	}
	d, err := os.Open("/proc/" + strconv.Itoa(pid) + "/task")
	if err != nil {
		return buf, false
	}
	tids, _ := d.Readdirnames(-1)
	d.Close()
	for _, tid := range tids {
		if tid == strconv.Itoa(pid) {
			continue
		}
		if b, err := readProcFileErr(pid, "task/"+tid+"/environ", buf); err == nil {
			return b, true
		}
	}
	return buf, false
}

// hasTag reports whether pid's environment holds every entry of want. buf
// is scratch space, returned (perhaps grown) for reuse.
func hasTag(pid int, want [][]byte, buf []byte) (bool, []byte) {
	tagged, _, buf := hasTagOrEmpty(pid, want, buf)
	return tagged, buf
}

// hasTagOrEmpty is hasTag that also reports an environment that read empty:
// a process in the middle of an execve shows one for an instant, and must
// not be mistaken for an untagged process.
func hasTagOrEmpty(pid int, want [][]byte, buf []byte) (bool, bool, []byte) {
	buf, ok := readEnviron(pid, buf)
	if !ok {
		return false, false, buf
	}
	if len(buf) == 0 {
		return false, true, buf
	}
	for _, w := range want {
		if !bytes.Contains(buf, w) {
			return false, false, buf
		}
	}
	for _, w := range want {
		found := false
		for env := buf; len(env) > 0 && !found; {
			var entry []byte
			entry, env, _ = bytes.Cut(env, []byte{0})
			found = bytes.Equal(entry, w)
		}
		if !found {
			return false, false, buf
		}
	}
	return true, false, buf
}

// procStat is what the sweep needs from /proc/<pid>/stat. pid and start
// (clock ticks after boot) together name one process: a reused pid has a
// later start.
type procStat struct {
	pid, pgid int
	start     uint64
	live      bool // neither a zombie nor dead
	kthread   bool // a kernel thread (no environment, never a job's)
}

// readStat reads /proc/<pid>/stat; ok is false when pid does not exist.
// buf is scratch space, returned for reuse.
func readStat(pid int, buf []byte) (st procStat, ok bool, _ []byte) {
	if buf, ok = readProcFile(pid, "stat", buf); !ok {
		return st, false, buf
	}
	st, ok = parseStat(buf)
	return st, ok, buf
}

// parseStat parses the contents of /proc/<pid>/stat:
// "pid (comm) state ppid pgrp ... starttime ...". comm may hold anything,
// spaces and parentheses included, so fields are counted from the last ')':
// state is field 3, pgrp 5, flags 9, num_threads 20, starttime 22.
func parseStat(b []byte) (st procStat, ok bool) {
	open, shut := bytes.IndexByte(b, '('), bytes.LastIndexByte(b, ')')
	if open < 1 || shut < open {
		return st, false
	}
	pid, err := strconv.Atoi(string(bytes.TrimSpace(b[:open])))
	if err != nil {
		return st, false
	}
	rest := b[shut+1:]
	var f [20][]byte // fields 3 to 22
	for n := range f {
		rest = bytes.TrimLeft(rest, " ")
		j := bytes.IndexAny(rest, " \n")
		if j < 0 {
			j = len(rest)
		}
		if j == 0 {
			return st, false
		}
		f[n], rest = rest[:j], rest[j:]
	}
	pgid, err1 := strconv.Atoi(string(f[2]))
	start, err2 := strconv.ParseUint(string(f[19]), 10, 64)
	flags, err3 := strconv.ParseUint(string(f[6]), 10, 64)    // field 9
	threads, err4 := strconv.ParseUint(string(f[17]), 10, 64) // field 20
	if err1 != nil || err2 != nil || err3 != nil || err4 != nil {
		return st, false
	}
	// A zombie is dead unless it is a leader whose threads still run (its
	// main thread exited): the state is the leader's, the count the group's.
	state := f[0][0]
	live := state != 'Z' && state != 'X' && state != 'x' || threads > 1
	const pfKthread = 0x00200000
	return procStat{pid: pid, pgid: pgid, start: start, live: live, kthread: flags&pfKthread != 0}, true
}

// Alive reports whether pid is a running process: it exists and is not a
// zombie (an exited process its parent has not reaped yet is dead; one
// whose main thread exited while other threads run is not). Any
// user's process counts: /proc/<pid>/stat is readable by all.
func Alive(pid int) bool {
	if pid <= 0 {
		return false
	}
	st, ok, _ := readStat(pid, nil)
	return ok && st.live
}

// alive reports whether the process p names is still running.
func (p procStat) alive() bool {
	now, ok, _ := readStat(p.pid, nil)
	return ok && now.live && now.start == p.start
}

// scan returns the live processes that carry want or belong to process
// group pgid (when > 0).
func scan(want [][]byte, pgid int) (found []procStat, uncertain bool, _ error) {
	pids, err := listPids()
	if err != nil {
		return nil, false, err
	}
	buf := make([]byte, 0, 16<<10)
	for _, pid := range pids {
		inGroup := false
		if pgid > 0 {
			var st procStat
			var ok bool
			st, ok, buf = readStat(pid, buf)
			if !ok || !st.live {
				continue
			}
			if inGroup = st.pgid == pgid; inGroup {
				found = append(found, st)
				continue
			}
		}
		var tagged, empty bool
		tagged, empty, buf = hasTagOrEmpty(pid, want, buf)
		if !tagged && !empty {
			continue
		}
		var st procStat
		var ok bool
		if st, ok, buf = readStat(pid, buf); !ok || !st.live || st.kthread {
			continue
		}
		if tagged {
			found = append(found, st)
		} else {
			uncertain = true // mid-exec, or started with an empty environment
		}
	}
	return found, uncertain, nil
}

// WorkingIn returns the pids of the live processes (but the caller) whose
// working directory is dir or inside it, from /proc/<pid>/cwd. A worktree
// about to be handed to another job must have none: an escaped process that
// lost its job's tag could otherwise keep writing into the next job's files.
// Processes aq may not inspect (other users', unless aq is root) are not
// seen.
func WorkingIn(dir string) ([]int, error) {
	pids, err := listPids()
	if err != nil {
		return nil, fmt.Errorf("process: working directories: %w", err)
	}
	var found []int
	for _, pid := range pids {
		cwd, err := os.Readlink("/proc/" + strconv.Itoa(pid) + "/cwd")
		if err != nil {
			continue // gone, or not ours to read
		}
		if within(cwd, dir) {
			found = append(found, pid)
		}
	}
	return found, nil
}
