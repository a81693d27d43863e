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

// Limits through cgroup v2: where the host delegates aq's cgroup to it
// (systemd: Delegate=yes) with the memory and pids controllers, each
// sandboxed run gets a cgroup of its own below aq's — the process starts
// in it (clone3 CLONE_INTO_CGROUP), so nothing it starts escapes it — with
// memory.max (and memory.swap.max 0, so the limit is not spilled to swap)
// and pids.max. When the run ends, memory.events says whether the kernel
// killed for memory (reported as its own reason), cgroup.kill ends what
// is left, and the cgroup is removed. cgroup v2 forbids processes in a
// cgroup whose controllers are delegated to children, so aq first moves
// the processes of its cgroup into a leaf of it ("aq").

// cgroupParent is aq's delegated cgroup.
type cgroupParent struct {
	dir string
	// remove removes an (empty) cgroup: rmdir on cgroupfs.
	remove func(dir string) error
	once   sync.Once
	err    error
	seq    int
	mu     sync.Mutex
}

// findCgroup finds aq's cgroup v2 and whether it is delegated with the
// controllers limits need; it changes nothing.
func findCgroup() (*cgroupParent, string) {
	own, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		return nil, "cannot read /proc/self/cgroup"
	}
	var rel string
	for _, line := range strings.Split(string(own), "\n") {
		if p, ok := strings.CutPrefix(line, "0::"); ok {
			rel = p
		}
	}
	if rel == "" {
		return nil, "no cgroup v2 (the host runs cgroup v1)"
	}
	mount := cgroup2Mount()
	if mount == "" {
		return nil, "no cgroup v2 mount"
	}
	return checkCgroup(filepath.Join(mount, rel))
}

// checkCgroup says whether dir is a cgroup aq can make limited children
// in.
func checkCgroup(dir string) (*cgroupParent, string) {
	ctl, err := os.ReadFile(filepath.Join(dir, "cgroup.controllers"))
	if err != nil {
		return nil, "cannot read " + filepath.Join(dir, "cgroup.controllers")
	}
	have := strings.Fields(string(ctl))
	var lack []string
	for _, c := range []string{"memory", "pids"} {
		if !slices.Contains(have, c) {
			lack = append(lack, c)
		}
	}
	if len(lack) > 0 {
		return nil, fmt.Sprintf("cgroup v2 at %s has no %s controller (the host keeps it in cgroup v1, or does not delegate it)", dir, strings.Join(lack, " or "))
	}
	if unix.Access(filepath.Join(dir, "cgroup.subtree_control"), unix.W_OK) != nil || unix.Access(dir, unix.W_OK) != nil {
		return nil, fmt.Sprintf("cgroup v2 is not delegated to aq (%s is not writable: run aq in a systemd unit with Delegate=yes)", dir)
	}
	return &cgroupParent{dir: dir, remove: unix.Rmdir}, ""
}

// cgroup2Mount is where cgroup v2 is mounted ("" none).
func cgroup2Mount() string {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return ""
	}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		// id parent maj:min root mountpoint options [optional...] - fstype source super
		pre, post, ok := strings.Cut(sc.Text(), " - ")
		if !ok {
			continue
		}
		if f := strings.Fields(post); len(f) > 0 && f[0] == "cgroup2" {
			if g := strings.Fields(pre); len(g) >= 5 {
				return g[4]
			}
		}
	}
	return ""
}

// delegate moves the processes of the parent cgroup into its leaf "aq" and
// turns the memory and pids controllers on for its children; once.
func (c *cgroupParent) delegate() error {
	c.once.Do(func() {
		leaf := filepath.Join(c.dir, "aq")
		if err := os.Mkdir(leaf, 0o755); err != nil && !errors.Is(err, fs.ErrExist) {
			c.err = err
			return
		}
		procs, err := os.ReadFile(filepath.Join(c.dir, "cgroup.procs"))
		if err != nil {
			c.err = err
			return
		}
		for _, pid := range strings.Fields(string(procs)) {
			// A process that has exited meanwhile is fine to miss.
			_ = os.WriteFile(filepath.Join(leaf, "cgroup.procs"), []byte(pid), 0o644)
		}
		if err := os.WriteFile(filepath.Join(c.dir, "cgroup.subtree_control"), []byte("+memory +pids"), 0o644); err != nil {
			c.err = fmt.Errorf("turn on the memory and pids controllers in %s: %w", c.dir, err)
		}
	})
	return c.err
}

// jobCgroup is one run's cgroup v2. A nil *jobCgroup is no cgroup.
type jobCgroup struct {
	dir    string
	f      *os.File
	remove func(string) error
	err    error
}

// make makes the cgroup of one run of j, with j's limits.
func (c *cgroupParent) make(j *Jail) runLimits {
	if err := c.delegate(); err != nil {
		return &jobCgroup{err: err}
	}
	c.mu.Lock()
	c.seq++
	dir := filepath.Join(c.dir, fmt.Sprintf("%s%d-%d", jobCgroupPrefix, os.Getpid(), c.seq))
	c.mu.Unlock()
	return makeJobCgroup(dir, j.p.Limits, c.remove)
}

func makeJobCgroup(dir string, l Limits, remove func(string) error) *jobCgroup {
	g := &jobCgroup{dir: dir, remove: remove}
	if err := os.Mkdir(dir, 0o755); err != nil {
		g.err = err
		return g
	}
	write := func(name, val string) error {
		return os.WriteFile(filepath.Join(dir, name), []byte(val), 0o644)
	}
	if l.MemoryBytes > 0 {
		if err := write("memory.max", strconv.FormatInt(l.MemoryBytes, 10)); err != nil {
			g.err = err
		}
		if _, err := os.Stat(filepath.Join(dir, "memory.swap.max")); err == nil {
			_ = write("memory.swap.max", "0")
		}
	}
	if l.Pids > 0 {
		if err := write("pids.max", strconv.Itoa(l.Pids)); err != nil {
			g.err = errors.Join(g.err, err)
		}
	}
	if g.err == nil {
		g.f, g.err = os.Open(dir)
	}
	return g
}

func (c *cgroupParent) describe() (string, string) { return "cgroup v2", c.dir }

// enterThread: a v2 run is started in its cgroup (fd), not by its thread.
func (g *jobCgroup) enterThread() error { return nil }

// place: a v2 run's process started in its cgroup.
func (g *jobCgroup) place(int) error { return nil }

// fd is the cgroup's directory fd for CLONE_INTO_CGROUP, -1 for none.
func (g *jobCgroup) fd() int {
	if g == nil || g.f == nil || g.err != nil {
		return -1
	}
	return int(g.f.Fd())
}

// started lets go of the directory fd once the process is in.
func (g *jobCgroup) started() {
	if g != nil && g.f != nil {
		g.f.Close()
		g.f = nil
	}
}

// failed is the error of a cgroup that could not be made: the run must
// not start without the limits it was given.
func (g *jobCgroup) failed() error {
	if g == nil || g.err == nil {
		return nil
	}
	err := g.err
	_, _ = g.close()
	return &StartError{Step: "cgroup", Err: err}
}

// close reports whether the kernel killed in the cgroup for memory, kills
// what is left and removes it.
func (g *jobCgroup) close() (oom bool, err error) {
	if g == nil {
		return false, nil
	}
	g.started()
	if g.dir == "" {
		return false, g.err
	}
	if ev, rerr := os.ReadFile(filepath.Join(g.dir, "memory.events")); rerr == nil {
		oom = eventCount(ev, "oom_kill") > 0
	}
	_ = os.WriteFile(filepath.Join(g.dir, "cgroup.kill"), []byte("1"), 0o644)
	// cgroup.kill is asynchronous: the cgroup can be removed once empty.
	var rmErr error
	for i := 0; i < 200; i++ {
		if rmErr = g.remove(g.dir); rmErr == nil || errors.Is(rmErr, fs.ErrNotExist) {
			rmErr = nil
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	return oom, errors.Join(g.err, rmErr)
}

// eventCount reads "name N" from a cgroup events file.
func eventCount(ev []byte, name string) int64 {
	for _, line := range strings.Split(string(ev), "\n") {
		if k, v, ok := strings.Cut(line, " "); ok && k == name {
			n, _ := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
			return n
		}
	}
	return 0
}
