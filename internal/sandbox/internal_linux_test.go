package sandbox

import (
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// fakeDirs lists directories from a map of dir → entries ("name/" a
// directory).
type fakeEntry struct {
	name string
	dir  bool
}

func (e fakeEntry) Name() string { return e.name }
func (e fakeEntry) IsDir() bool  { return e.dir }
func (e fakeEntry) Type() fs.FileMode {
	switch {
	case e.dir:
		return fs.ModeDir
	case strings.HasPrefix(e.name, "@"): // a fifo, as /etc/initctl can be
		return fs.ModeNamedPipe
	}
	return 0
}
func (e fakeEntry) Info() (fs.FileInfo, error) { return nil, fs.ErrInvalid }

func fakeDirs(tree map[string][]string) func(string) ([]os.DirEntry, error) {
	return func(dir string) ([]os.DirEntry, error) {
		var out []os.DirEntry
		for _, n := range tree[dir] {
			out = append(out, fakeEntry{name: strings.TrimSuffix(n, "/"), dir: strings.HasSuffix(n, "/")})
		}
		return out, nil
	}
}

// TestPartialRules: Landlock can only allow, so what is hidden is hidden
// by granting its siblings, level by level.
func TestPartialRules(t *testing.T) {
	p := Policy{
		Worktree: "/srv/aq/worktrees/app/j1", JobDir: "/srv/aq/sandbox/j1", Home: "/home/u",
		Hidden:      []string{"/srv/aq", "/run"},
		HiddenFiles: []string{"/etc/shadow"},
		GitDirs:     []string{"/srv/src/app/.git"},
		ReadOnly:    []string{"/home/u/.local/bin"},
		Net:         Net{ProxyPort: 41234},
	}
	tree := map[string][]string{
		"/":     {"usr/", "etc/", "srv/", "home/", "run/", "tmp/", "vmlinuz"},
		"/etc":  {"passwd", "shadow", "ssl/", "@initctl"},
		"/srv":  {"aq/", "src/", "www/"},
		"/home": {"u/", "v/"},
	}
	r := partialRules(p, fakeDirs(tree))
	wantRO := []string{"/etc/ssl", "/home/u/.local/bin", "/home/v", "/srv/src", "/srv/src/app/.git", "/srv/www", "/usr"}
	if !slices.Equal(r.RO, wantRO) {
		t.Errorf("read-only %v, want %v", r.RO, wantRO)
	}
	if want := []string{"/etc/passwd", "/vmlinuz"}; !slices.Equal(r.ROFiles, want) {
		t.Errorf("read-only files %v, want %v", r.ROFiles, want)
	}
	if want := []string{"/srv/aq/worktrees/app/j1", "/srv/aq/sandbox/j1/home", "/srv/aq/sandbox/j1/tmp", "/srv/aq/sandbox/j1/state"}; !slices.Equal(r.RW, want) {
		t.Errorf("read-write %v, want %v", r.RW, want)
	}
	if !r.Net || !slices.Equal(r.ConnectPorts, []int{41234}) {
		t.Errorf("net %v ports %v", r.Net, r.ConnectPorts)
	}
	// The loopback gateways' ports open too (on any address: Landlock
	// filters ports only); a gateway not on loopback goes by the proxy.
	p.Net.Gateways = []string{"localhost:4000", "127.0.0.1:5000", "[::1]:4000", "gw.example.com:443", "10.1.2.3:80"}
	if r := partialRules(p, fakeDirs(tree)); !slices.Equal(r.ConnectPorts, []int{41234, 4000, 5000}) {
		t.Errorf("with gateways: ports %v, want the proxy's, 4000, 5000", r.ConnectPorts)
	}
}

// TestJobCgroupFiles: a job's cgroup gets its limits, and its end tells an
// out-of-memory kill apart (a cgroupfs tree in a temp dir: this host has no
// cgroup v2 memory or pids controller to try them on).
func TestJobCgroupFiles(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "aq-job-1")
	removed := ""
	remove := func(d string) error {
		removed = d
		return os.RemoveAll(d)
	}
	g := makeJobCgroup(dir, Limits{MemoryBytes: 512 << 20, Pids: 256}, remove)
	if err := g.failed(); err != nil {
		t.Fatal(err)
	}
	read := func(name string) string {
		b, _ := os.ReadFile(filepath.Join(dir, name))
		return string(b)
	}
	if read("memory.max") != strconv.Itoa(512<<20) || read("pids.max") != "256" {
		t.Errorf("limits: memory.max %q pids.max %q", read("memory.max"), read("pids.max"))
	}
	if g.fd() < 0 {
		t.Error("no directory fd to start the process in")
	}
	g.started()
	os.WriteFile(filepath.Join(dir, "memory.events"), []byte("low 0\nhigh 0\nmax 3\noom 1\noom_kill 1\noom_group_kill 0\n"), 0o644)
	oom, err := g.close()
	if err != nil || !oom {
		t.Errorf("close: oom %v err %v, want an OOM kill", oom, err)
	}
	if read("cgroup.kill") != "" && removed != dir {
		t.Errorf("the cgroup was not killed and removed (removed %q)", removed)
	}
	if _, err := os.Stat(dir); err == nil {
		t.Error("the job's cgroup is still there")
	}

	g2 := makeJobCgroup(filepath.Join(t.TempDir(), "aq-job-2"), Limits{Pids: 64}, os.RemoveAll)
	os.WriteFile(filepath.Join(g2.dir, "memory.events"), []byte("oom 0\noom_kill 0\n"), 0o644)
	if oom, err := g2.close(); oom || err != nil {
		t.Errorf("no OOM: %v %v", oom, err)
	}
}

// TestCheckCgroup: delegation needs the memory and pids controllers and a
// writable cgroup.
func TestCheckCgroup(t *testing.T) {
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "cgroup.subtree_control"), nil, 0o644)
	os.WriteFile(filepath.Join(dir, "cgroup.controllers"), []byte("cpu io\n"), 0o644)
	if c, why := checkCgroup(dir); c != nil || !strings.Contains(why, "memory or pids") {
		t.Errorf("without controllers: %v %q", c, why)
	}
	os.WriteFile(filepath.Join(dir, "cgroup.controllers"), []byte("cpu io memory pids\n"), 0o644)
	if c, why := checkCgroup(dir); c == nil {
		t.Errorf("delegated: %q", why)
	}
}

// TestCgroupOnHost puts a process in a cgroup of its own on this host's
// cgroup v2 mount (no controllers here: the placement, the kill and the
// removal are what can be tried), as the sandbox's init is placed.
func TestCgroupOnHost(t *testing.T) {
	mount := cgroup2Mount()
	if mount == "" || unix.Access(mount, unix.W_OK) != nil {
		t.Skip("no writable cgroup v2 mount")
	}
	dir := filepath.Join(mount, "aq-test-"+strconv.Itoa(os.Getpid()))
	g := makeJobCgroup(dir, Limits{}, unix.Rmdir)
	if err := g.failed(); err != nil {
		t.Skipf("cannot make a cgroup here: %v", err)
	}
	cmd := exec.Command("/bin/sh", "-c", "sleep 1000 & sleep 1000")
	cmd.SysProcAttr = &syscall.SysProcAttr{UseCgroupFD: true, CgroupFD: g.fd()}
	if err := cmd.Start(); err != nil {
		_, _ = g.close()
		t.Fatal(err)
	}
	g.started()
	b, _ := os.ReadFile("/proc/" + strconv.Itoa(cmd.Process.Pid) + "/cgroup")
	if !strings.Contains(string(b), filepath.Base(dir)) {
		t.Errorf("the process is not in its cgroup: %s", b)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	if _, err := g.close(); err != nil {
		t.Errorf("close: %v", err)
	}
	select {
	case <-done:
	case <-time.After(time.Minute):
		t.Fatal("cgroup.kill left the process running")
	}
	if _, err := os.Stat(dir); err == nil {
		t.Error("the cgroup was not removed")
	}
}

func TestCacheLayerSize(t *testing.T) {
	var si unix.Sysinfo_t
	if err := unix.Sysinfo(&si); err != nil {
		t.Fatal(err)
	}
	host := int64(si.Totalram) * int64(si.Unit) / 4 // a quarter of the host's memory
	for _, tc := range []struct {
		name string
		p    Policy
		want int64
	}{
		{"its own bound", Policy{CacheLayerMax: 5 << 20, Limits: Limits{MemoryBytes: 1 << 30}}, 5 << 20},
		{"half the memory limit", Policy{Limits: Limits{MemoryBytes: 1 << 30}}, 512 << 20},
		{"the host's quarter", Policy{}, host},
	} {
		if got := cacheLayerSize(tc.p); got != tc.want {
			t.Errorf("%s: %d, want %d", tc.name, got, tc.want)
		}
	}
}

// TestFreshJobDirUnmountsACrashedRunsLayers: a run that crashed left its
// caches' tmpfs mounted in its job's directory; the next run's fresh
// directory (and aq gc) unmounts it before removing the tree.
func TestFreshJobDirUnmountsACrashedRunsLayers(t *testing.T) {
	if os.Getuid() != 0 {
		t.Skip("needs root to mount a tmpfs")
	}
	dir := filepath.Join(t.TempDir(), "job")
	layers := filepath.Join(dir, "cache")
	if err := os.MkdirAll(layers, 0o700); err != nil {
		t.Fatal(err)
	}
	ok, err := mountCacheLayer(layers, 1<<20)
	if !ok || err != nil {
		t.Fatalf("mount: %v %v", ok, err)
	}
	if err := os.WriteFile(filepath.Join(layers, "left"), []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := FreshJobDir(dir); err != nil {
		t.Fatalf("FreshJobDir over a crashed run's layers: %v", err)
	}
	if mi, _ := os.ReadFile("/proc/self/mountinfo"); strings.Contains(string(mi), layers) {
		t.Errorf("the crashed run's tmpfs at %s is still mounted", layers)
	}
	if ents, err := os.ReadDir(dir); err != nil || len(ents) != 0 {
		t.Errorf("the fresh job directory holds %v (%v)", ents, err)
	}
}
