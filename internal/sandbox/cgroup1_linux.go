package sandbox

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// Limits through cgroup v1, the fallback where there is no delegated
// cgroup v2 but aq may write the memory and pids hierarchies (root on a
// cgroup v1 host). Each run gets a memory and a pids cgroup of its own
// below aq's in each hierarchy, with memory.limit_in_bytes (and
// memory.memsw.limit_in_bytes the same, where swap is accounted, so the
// limit is not spilled to swap) and pids.max. v1 has no CLONE_INTO_CGROUP:
// the sandbox's init is placed in both before it is given its orders (it
// starts nothing before), and at the partial level the thread that forks
// the engine joins them first (a v1 cgroup holds threads), so nothing the
// run starts is outside. When the run ends memory.oom_control's oom_kill
// says whether the kernel killed for memory, what is left is killed (v1 has
// no cgroup.kill) and the cgroups are removed.

// cgroupV1 is aq's own cgroup in the memory and pids hierarchies.
type cgroupV1 struct {
	memory, pids string
	// memsw: the kernel accounts swap (memory.memsw.limit_in_bytes).
	memsw bool
	mu    sync.Mutex
	seq   int
}

// findCgroupV1 finds aq's memory and pids cgroups v1 and whether aq may
// make cgroups in them; it changes nothing.
func findCgroupV1() (*cgroupV1, string) {
	own, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		return nil, "cannot read /proc/self/cgroup"
	}
	info, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return nil, "cannot read /proc/self/mountinfo"
	}
	mem, pids := cgroupV1Dir(own, info, "memory"), cgroupV1Dir(own, info, "pids")
	return checkCgroupV1(mem, pids)
}

// cgroupV1Dir is where this process's cgroup of the v1 hierarchy with
// controller ctl is ("" none): own is /proc/self/cgroup, info
// /proc/self/mountinfo.
func cgroupV1Dir(own, info []byte, ctl string) string {
	var rel string
	found := false
	for _, line := range strings.Split(string(own), "\n") {
		// hierarchy-id:controllers:path
		f := strings.SplitN(line, ":", 3)
		if len(f) == 3 && slices.Contains(strings.Split(f[1], ","), ctl) {
			rel, found = f[2], true
		}
	}
	if !found {
		return ""
	}
	sc := bufio.NewScanner(bytes.NewReader(info))
	for sc.Scan() {
		// id parent maj:min root mountpoint options [optional...] - fstype source super
		pre, post, ok := strings.Cut(sc.Text(), " - ")
		if !ok {
			continue
		}
		f, g := strings.Fields(post), strings.Fields(pre)
		if len(f) < 3 || f[0] != "cgroup" || len(g) < 5 || !slices.Contains(strings.Split(f[2], ","), ctl) {
			continue
		}
		root, mount := g[3], g[4]
		sub, ok := strings.CutPrefix(rel, root)
		if !ok || (sub != "" && root != "/" && !strings.HasPrefix(sub, "/")) {
			continue // this mount shows another part of the hierarchy
		}
		return filepath.Join(mount, sub)
	}
	return ""
}

// checkCgroupV1 says whether aq can make limited cgroups below its memory
// and pids cgroups v1 (mem, pids; "" when the hierarchy is not mounted).
func checkCgroupV1(mem, pids string) (*cgroupV1, string) {
	var lack []string
	if mem == "" {
		lack = append(lack, "memory")
	}
	if pids == "" {
		lack = append(lack, "pids")
	}
	if len(lack) > 0 {
		return nil, "no cgroup v1 " + strings.Join(lack, " or ") + " hierarchy is mounted"
	}
	for _, f := range []string{filepath.Join(mem, "memory.limit_in_bytes"), filepath.Join(pids, "cgroup.procs")} {
		if _, err := os.Stat(f); err != nil {
			return nil, "cgroup v1: cannot read " + f
		}
	}
	for _, d := range []string{mem, pids} {
		if unix.Access(d, unix.W_OK) != nil {
			return nil, fmt.Sprintf("cgroup v1 is not writable by aq (%s: run aq as root, or delegate cgroup v2 with systemd's Delegate=yes)", d)
		}
	}
	_, err := os.Stat(filepath.Join(mem, "memory.memsw.limit_in_bytes"))
	return &cgroupV1{memory: mem, pids: pids, memsw: err == nil}, ""
}

func (c *cgroupV1) describe() (string, string) { return "cgroup v1", c.memory + ", " + c.pids }

// make makes the memory and pids cgroups of one run of j, with j's limits.
func (c *cgroupV1) make(j *Jail) runLimits {
	c.mu.Lock()
	c.seq++
	name := fmt.Sprintf("%s%d-%d", jobCgroupPrefix, os.Getpid(), c.seq)
	c.mu.Unlock()
	return makeJobCgroupV1(filepath.Join(c.memory, name), filepath.Join(c.pids, name), j.p.Limits, c.memsw, unix.Rmdir)
}

// jobCgroupPrefix begins the name of every job cgroup aq makes: aq gc
// finds a crash's leftovers by it (aq-job-<aq's pid>-<n>).
const jobCgroupPrefix = "aq-job-"

// jobCgroupV1 is one run's memory and pids cgroups v1.
type jobCgroupV1 struct {
	dirs   []string // the memory cgroup first
	remove func(string) error
	err    error
	// tid is the thread that joined (enterThread) until started moves it
	// back to aq's cgroups (0: none).
	tid int
}

func makeJobCgroupV1(mem, pids string, l Limits, memsw bool, remove func(string) error) *jobCgroupV1 {
	g := &jobCgroupV1{remove: remove}
	for _, d := range []string{mem, pids} {
		if err := os.Mkdir(d, 0o755); err != nil {
			g.err = err
			return g
		}
		g.dirs = append(g.dirs, d)
	}
	write := func(dir, name, val string) {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(val), 0o644); err != nil {
			g.err = errors.Join(g.err, err)
		}
	}
	if l.MemoryBytes > 0 {
		v := strconv.FormatInt(l.MemoryBytes, 10)
		write(mem, "memory.limit_in_bytes", v)
		if memsw { // after memory.limit_in_bytes: memsw may not be below it
			write(mem, "memory.memsw.limit_in_bytes", v)
		}
	}
	if l.Pids > 0 {
		write(pids, "pids.max", strconv.Itoa(l.Pids))
	}
	return g
}

func (g *jobCgroupV1) failed() error {
	if g.err == nil {
		return nil
	}
	err := g.err
	_, _ = g.close()
	return &StartError{Step: "cgroup", Err: err}
}

func (g *jobCgroupV1) fd() int { return -1 }

// started moves the thread that forked the run back to aq's cgroups (the
// parents): its child stays in the run's. The thread may be Go's main
// thread, which outlives its goroutine, and a thread of aq's left in the
// run's cgroup would keep it from being removed.
func (g *jobCgroupV1) started() {
	if g.tid == 0 {
		return
	}
	for _, d := range g.dirs {
		// A thread that has ended meanwhile is fine to miss (ESRCH).
		_ = os.WriteFile(filepath.Join(filepath.Dir(d), "tasks"), []byte(strconv.Itoa(g.tid)), 0o644)
	}
	g.tid = 0
}

// enterThread writes the calling thread's id into each cgroup's tasks.
func (g *jobCgroupV1) enterThread() error {
	g.tid = unix.Gettid()
	return g.join("tasks", g.tid)
}

// place writes pid (all its threads) into each cgroup's cgroup.procs.
func (g *jobCgroupV1) place(pid int) error { return g.join("cgroup.procs", pid) }

func (g *jobCgroupV1) join(file string, id int) error {
	for _, d := range g.dirs {
		if err := os.WriteFile(filepath.Join(d, file), []byte(strconv.Itoa(id)), 0o644); err != nil {
			return &StartError{Step: "cgroup", Err: fmt.Errorf("join %s: %w", d, err)}
		}
	}
	return nil
}

// close reads whether the kernel killed for memory, kills what is left and
// removes the cgroups.
func (g *jobCgroupV1) close() (oom bool, err error) {
	g.started()
	if len(g.dirs) > 0 {
		oom = oomKilledV1(g.dirs[0])
	}
	var rmErr error
	for _, d := range g.dirs {
		rmErr = errors.Join(rmErr, killRemoveV1(d, g.remove))
	}
	g.dirs = nil
	return oom, errors.Join(g.err, rmErr)
}

// oomKilledV1 reports whether the kernel killed in the memory cgroup dir
// for memory: memory.oom_control's oom_kill (Linux 4.13+); before it, the
// limit reached (memory.failcnt) with the usage's peak at the limit.
func oomKilledV1(dir string) bool {
	ctl, err := os.ReadFile(filepath.Join(dir, "memory.oom_control"))
	if err != nil {
		return false
	}
	if bytes.Contains(ctl, []byte("oom_kill ")) {
		return eventCount(ctl, "oom_kill") > 0
	}
	read := func(name string) int64 {
		b, _ := os.ReadFile(filepath.Join(dir, name))
		n, _ := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
		return n
	}
	limit := read("memory.limit_in_bytes")
	return read("memory.failcnt") > 0 && limit > 0 && read("memory.max_usage_in_bytes") >= limit
}

// killRemoveV1 kills every process left in the cgroup dir (v1 has no
// cgroup.kill: one by one, until none is left — the pids limit bounds a
// fork loop) and removes it.
func killRemoveV1(dir string, remove func(string) error) error {
	var err error
	for i := 0; i < 500; i++ {
		procs, _ := os.ReadFile(filepath.Join(dir, "cgroup.procs"))
		for _, p := range strings.Fields(string(procs)) {
			// Never aq itself (a thread of its that has not left yet).
			if pid, perr := strconv.Atoi(p); perr == nil && pid > 0 && pid != os.Getpid() {
				_ = unix.Kill(pid, unix.SIGKILL)
			}
		}
		if err = remove(dir); err == nil || errors.Is(err, fs.ErrNotExist) {
			return nil
		}
		time.Sleep(10 * time.Millisecond)
	}
	return fmt.Errorf("remove %s: %w", dir, err)
}
