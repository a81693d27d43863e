package sandbox

import (
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// TestCgroupV1Dir finds aq's cgroup of a v1 hierarchy from
// /proc/self/cgroup and /proc/self/mountinfo: at the hierarchy's root, in
// a container whose mount shows only its own part, beside the v2 mount,
// and none where the controller is not mounted.
func TestCgroupV1Dir(t *testing.T) {
	info := `25 24 0:22 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
29 25 0:26 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
33 25 0:30 / /sys/fs/cgroup/pids rw,relatime - cgroup cgroup rw,pids
35 25 0:32 / /sys/fs/cgroup/cpu,cpuacct rw,relatime - cgroup cgroup rw,cpu,cpuacct
36 25 0:33 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
`
	container := `40 39 0:26 /docker/abc /sys/fs/cgroup/memory ro,relatime - cgroup cgroup rw,memory
`
	for _, tc := range []struct {
		name, own, info, ctl, want string
	}{
		{"root", "4:memory:/process_api/j1\n8:pids:/\n0::/\n", info, "memory", "/sys/fs/cgroup/memory/process_api/j1"},
		{"pids at its root", "4:memory:/process_api/j1\n8:pids:/\n0::/\n", info, "pids", "/sys/fs/cgroup/pids"},
		{"joined controllers", "3:cpu,cpuacct:/a\n", info, "cpuacct", "/sys/fs/cgroup/cpu,cpuacct/a"},
		{"container", "4:memory:/docker/abc\n", container, "memory", "/sys/fs/cgroup/memory"},
		{"another part", "4:memory:/elsewhere\n", container, "memory", ""},
		{"not mounted", "4:memory:/a\n", "36 25 0:33 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n", "memory", ""},
		{"v2 only", "0::/user.slice\n", info, "memory", ""},
	} {
		if got := cgroupV1Dir([]byte(tc.own), []byte(tc.info), tc.ctl); got != tc.want {
			t.Errorf("%s: %q, want %q", tc.name, got, tc.want)
		}
	}
}

// TestCheckCgroupV1: v1 limits need both hierarchies, their files and
// write access; swap accounting is noticed.
func TestCheckCgroupV1(t *testing.T) {
	mem, pids := t.TempDir(), t.TempDir()
	if c, why := checkCgroupV1(mem, ""); c != nil || !strings.Contains(why, "pids hierarchy") {
		t.Errorf("without pids: %v %q", c, why)
	}
	if c, why := checkCgroupV1(mem, pids); c != nil || !strings.Contains(why, "cannot read") {
		t.Errorf("without the controllers' files: %v %q", c, why)
	}
	os.WriteFile(filepath.Join(mem, "memory.limit_in_bytes"), nil, 0o644)
	os.WriteFile(filepath.Join(pids, "cgroup.procs"), nil, 0o644)
	c, why := checkCgroupV1(mem, pids)
	if c == nil || c.memsw {
		t.Fatalf("writable: %v %q", c, why)
	}
	if how, where := c.describe(); how != "cgroup v1" || where != mem+", "+pids {
		t.Errorf("describe: %q %q", how, where)
	}
	os.WriteFile(filepath.Join(mem, "memory.memsw.limit_in_bytes"), nil, 0o644)
	if c, _ := checkCgroupV1(mem, pids); c == nil || !c.memsw {
		t.Errorf("swap accounting not noticed: %+v", c)
	}
}

// TestJobCgroupV1Files: a run's v1 cgroups get their limits (memsw after
// the memory limit), and the end tells an out-of-memory kill apart by
// memory.oom_control's oom_kill, or on kernels before it by the limit
// reached at its peak (a cgroupfs tree in temp dirs).
func TestJobCgroupV1Files(t *testing.T) {
	for _, tc := range []struct {
		name, oomControl, failcnt, maxUsage string
		oom                                 bool
	}{
		{"oom_kill", "oom_kill_disable 0\nunder_oom 0\noom_kill 1\n", "81", "536870912", true},
		{"no kill", "oom_kill_disable 0\nunder_oom 0\noom_kill 0\n", "81", "536870912", false},
		{"old kernel, at the limit", "oom_kill_disable 0\nunder_oom 0\n", "3", "536870912", true},
		{"old kernel, below it", "oom_kill_disable 0\nunder_oom 0\n", "0", "1048576", false},
	} {
		mem, pids := filepath.Join(t.TempDir(), "aq-job-1-1"), filepath.Join(t.TempDir(), "aq-job-1-1")
		var removed []string
		g := makeJobCgroupV1(mem, pids, Limits{MemoryBytes: 512 << 20, Pids: 256}, true, func(d string) error {
			removed = append(removed, d)
			return os.RemoveAll(d)
		})
		if err := g.failed(); err != nil {
			t.Fatal(err)
		}
		read := func(dir, name string) string {
			b, _ := os.ReadFile(filepath.Join(dir, name))
			return string(b)
		}
		if read(mem, "memory.limit_in_bytes") != strconv.Itoa(512<<20) || read(mem, "memory.memsw.limit_in_bytes") != strconv.Itoa(512<<20) || read(pids, "pids.max") != "256" {
			t.Errorf("limits: %q %q %q", read(mem, "memory.limit_in_bytes"), read(mem, "memory.memsw.limit_in_bytes"), read(pids, "pids.max"))
		}
		if g.fd() != -1 {
			t.Error("a v1 run has no cgroup fd to start in")
		}
		if err := g.place(4242); err != nil || read(mem, "cgroup.procs") != "4242" || read(pids, "cgroup.procs") != "4242" {
			t.Errorf("place: %v, procs %q %q", err, read(mem, "cgroup.procs"), read(pids, "cgroup.procs"))
		}
		os.Remove(filepath.Join(mem, "cgroup.procs"))
		os.Remove(filepath.Join(pids, "cgroup.procs"))
		os.WriteFile(filepath.Join(mem, "memory.oom_control"), []byte(tc.oomControl), 0o644)
		os.WriteFile(filepath.Join(mem, "memory.failcnt"), []byte(tc.failcnt+"\n"), 0o644)
		os.WriteFile(filepath.Join(mem, "memory.max_usage_in_bytes"), []byte(tc.maxUsage+"\n"), 0o644)
		oom, err := g.close()
		if err != nil || oom != tc.oom {
			t.Errorf("%s: close: oom %v err %v, want oom %v", tc.name, oom, err, tc.oom)
		}
		if len(removed) != 2 || removed[0] != mem || removed[1] != pids {
			t.Errorf("%s: removed %q", tc.name, removed)
		}
	}
	// A limit that cannot be written fails the run before it starts, and
	// what was made is removed.
	mem, pids := filepath.Join(t.TempDir(), "m"), filepath.Join(t.TempDir(), "p")
	g := makeJobCgroupV1(mem, pids, Limits{Pids: 64}, false, os.RemoveAll)
	os.RemoveAll(pids)
	os.WriteFile(pids, nil, 0o644) // not a directory any more: the next write fails
	g.err = g.join("cgroup.procs", 1)
	if err := g.failed(); err == nil || !strings.Contains(err.Error(), "cgroup") {
		t.Errorf("failed: %v", err)
	}
	if testExists(mem) {
		t.Error("the memory cgroup of a run that failed to start is still there")
	}
}

func testExists(p string) bool { _, err := os.Lstat(p); return err == nil }

// hostV1 is this host's writable cgroup v1 (skips where there is none).
func hostV1(t *testing.T) *cgroupV1 {
	t.Helper()
	c, why := findCgroupV1()
	if c == nil {
		t.Skipf("no writable cgroup v1 here: %s", why)
	}
	return c
}

// TestEnterThreadV1 is the partial level's placement on this host's real
// cgroup v1: the thread that forks joins the run's cgroups, so the child
// (and what it starts) is inside before it runs a thing; the end kills
// what is left and removes the cgroups.
func TestEnterThreadV1(t *testing.T) {
	c := hostV1(t)
	name := "aq-test-" + strconv.Itoa(os.Getpid())
	g := makeJobCgroupV1(filepath.Join(c.memory, name), filepath.Join(c.pids, name), Limits{MemoryBytes: 256 << 20, Pids: 32}, c.memsw, unix.Rmdir)
	if err := g.failed(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = g.close() })
	cmd := exec.Command("/bin/sh", "-c", "sleep 1000 & exec sleep 1000")
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread ends with this goroutine
		if err := g.enterThread(); err != nil {
			errc <- err
			return
		}
		errc <- cmd.Start()
	}()
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	g.started()
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	b, _ := os.ReadFile("/proc/" + strconv.Itoa(cmd.Process.Pid) + "/cgroup")
	for _, ctl := range []string{"memory", "pids"} {
		if !strings.Contains(string(b), ":"+ctl+":") || !strings.Contains(string(b), name) {
			t.Errorf("the child is not in its %s cgroup: %s", ctl, b)
		}
	}
	if own, _ := os.ReadFile("/proc/self/cgroup"); strings.Contains(string(own), name) {
		t.Errorf("aq's own threads joined the run's cgroup: %s", own)
	}
	if oom, err := g.close(); oom || err != nil {
		t.Errorf("close: oom %v err %v", oom, err)
	}
	<-done
	for _, d := range []string{filepath.Join(c.memory, name), filepath.Join(c.pids, name)} {
		if testExists(d) {
			t.Errorf("%s is still there", d)
		}
	}
}

// TestRemoveStaleCgroups is aq gc's part on this host's real cgroup v1:
// the job cgroups of an aq that died (aq-job-<its pid>-<n>), a process
// still in one, are killed and removed; a live aq's are kept.
func TestRemoveStaleCgroups(t *testing.T) {
	c := hostV1(t)
	dead := exec.Command("/bin/true")
	if err := dead.Run(); err != nil {
		t.Fatal(err)
	}
	stale := jobCgroupPrefix + strconv.Itoa(dead.Process.Pid) + "-1"
	live := jobCgroupPrefix + strconv.Itoa(os.Getpid()) + "-999"
	gs := []*jobCgroupV1{
		makeJobCgroupV1(filepath.Join(c.memory, stale), filepath.Join(c.pids, stale), Limits{Pids: 32}, c.memsw, unix.Rmdir),
		makeJobCgroupV1(filepath.Join(c.memory, live), filepath.Join(c.pids, live), Limits{Pids: 32}, c.memsw, unix.Rmdir),
	}
	for _, g := range gs {
		if err := g.failed(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _, _ = g.close() })
	}
	left := exec.Command("/bin/sleep", "1000")
	if err := left.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { _ = left.Wait(); close(done) }()
	if err := gs[0].place(left.Process.Pid); err != nil {
		t.Fatal(err)
	}
	alive := func(pid int) bool { return pid == os.Getpid() }
	removed, err := removeStaleCgroups([]string{c.memory, c.pids}, alive)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{filepath.Join(c.memory, stale), filepath.Join(c.pids, stale)}
	if !slices.Equal(removed, want) {
		t.Errorf("removed %q, want %q", removed, want)
	}
	<-done // killed
	for _, d := range want {
		if testExists(d) {
			t.Errorf("%s is still there", d)
		}
	}
	if !testExists(filepath.Join(c.memory, live)) {
		t.Error("a live aq's job cgroup was removed")
	}
}
