package sandbox

import (
	"fmt"
	"strings"
	"testing"
)

// fakeFS answers planMounts' questions from a list: a path ending in "/"
// is a directory (empty when it ends in "/0"), else a file.
func fakeFS(paths ...string) pathInfo {
	m := map[string]bool{}
	empty := map[string]bool{}
	for _, p := range paths {
		if e, ok := strings.CutSuffix(p, "/0"); ok {
			empty[e], p = true, e+"/"
		}
		m[strings.TrimSuffix(p, "/")] = strings.HasSuffix(p, "/")
	}
	return func(path string) (bool, bool, bool) {
		dir, ok := m[path]
		return ok, dir, empty[path]
	}
}

func show(ops []mountOp) []string {
	var out []string
	for _, op := range ops {
		s := string(op.Kind) + " " + op.Dst
		if op.Src != "" && op.Src != op.Dst {
			s += " <- " + op.Src
		}
		if op.RW {
			s += " rw"
		}
		out = append(out, s)
	}
	return out
}

func TestPlanMounts(t *testing.T) {
	base := Policy{
		Worktree: "/srv/aq/worktrees/app/j1",
		GitDirs:  []string{"/srv/src/app/.git", "/srv/src/app/.git/worktrees/j1"},
		Home:     "/home/u",
		JobDir:   "/srv/aq/sandbox/j1",
		Hidden:   []string{"/srv/aq", "/srv/src", "/run", "/var/run"},
		ReadOnly: []string{"/home/u/.local/bin", "/home/u/.rustup", "/usr/local/bin"},
		Caches:   []string{"/home/u/go/pkg/mod", "/home/u/.npm", "/home/u/.cache/pip"},
	}
	host := fakeFS("/home/u/", "/tmp/", "/var/tmp/", "/srv/aq/", "/srv/src/", "/run/", "/home/u/.local/bin/",
		"/home/u/.rustup/", "/usr/local/bin/", "/home/u/go/pkg/mod/", "/home/u/.cache/pip/0", "/etc/passwd", "/etc/group")
	// /dev and /proc first, then parents before children (by depth, what
	// the job owns first at one depth): the job's tmp over /tmp and
	// /var/tmp and its home over $HOME, the hidden trees, the files, what
	// is bound back into the hidden trees and the home. /var/run does not exist here, nor
	// does /home/u/.npm; /usr/local/bin is already seen read-only through
	// the root, the worktree's own git dir through the repository's; an
	// empty cache (.cache/pip) is the job's own layer alone, no overlay.
	want := []string{
		"root /",
		"dev /dev",
		"proc /proc",
		"bind /tmp <- /srv/aq/sandbox/j1/tmp rw",
		"hide /run",
		"bind /home/u <- /srv/aq/sandbox/j1/home rw",
		"bind /var/tmp <- /srv/aq/sandbox/j1/tmp rw",
		"hide /srv/aq",
		"hide /srv/src",
		"file /etc/passwd <- /srv/aq/sandbox/j1/etc/passwd",
		"file /etc/group <- /srv/aq/sandbox/j1/etc/group",
		"bind /home/u/.rustup",
		"bind /home/u/.cache/pip <- /srv/aq/sandbox/j1/cache/0/upper rw",
		"bind /srv/src/app/.git",
		"bind /home/u/.local/bin",
		"bind /srv/aq/worktrees/app/j1 rw",
		"bind /srv/aq/sandbox/j1/state rw",
		"overlay /home/u/go/pkg/mod",
	}
	v := planMounts(base, host)
	if got := show(v.Mounts); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("plan:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	if v.Home != "/home/u" {
		t.Errorf("home %q, want /home/u", v.Home)
	}
}

// TestPlanMountsUnderTmp: aq's trees under /tmp (as in tests) lie in the
// job's own /tmp: hiding them again changes nothing, and the worktree is
// still bound at its own path.
func TestPlanMountsUnderTmp(t *testing.T) {
	p := Policy{
		Worktree: "/tmp/t/aq/worktrees/app/j1",
		Home:     "/tmp/t/home",
		JobDir:   "/tmp/t/aq/sandbox/j1",
		Hidden:   []string{"/tmp/t/aq", "/tmp/t/src"},
		GitDirs:  []string{"/tmp/t/src/app/.git"},
	}
	v := planMounts(p, fakeFS("/tmp/", "/tmp/t/aq/", "/tmp/t/src/", "/tmp/t/home/"))
	got := strings.Join(show(v.Mounts), "\n")
	for _, w := range []string{"bind /tmp <- /tmp/t/aq/sandbox/j1/tmp rw", "bind /tmp/t/home <- /tmp/t/aq/sandbox/j1/home rw",
		"bind /tmp/t/aq/worktrees/app/j1 rw", "bind /tmp/t/src/app/.git"} {
		if !strings.Contains(got, w+"\n") {
			t.Errorf("plan lacks %q:\n%s", w, got)
		}
	}
	if strings.Contains(got, "hide ") {
		t.Errorf("a hide under the job's own /tmp:\n%s", got)
	}
}

// TestPlanMountsNoHome: without a home to mount over, the job's home is
// at its own path and is $HOME.
func TestPlanMountsNoHome(t *testing.T) {
	p := Policy{Worktree: "/w/wt", JobDir: "/w/aq/sandbox/j", Hidden: []string{"/w/aq"}}
	v := planMounts(p, fakeFS("/w/aq/", "/tmp/"))
	if v.Home != "/w/aq/sandbox/j/home" {
		t.Errorf("home %q", v.Home)
	}
	if !strings.Contains(strings.Join(show(v.Mounts), "\n"), "bind /w/aq/sandbox/j/home rw") {
		t.Errorf("the job's home is not bound:\n%s", strings.Join(show(v.Mounts), "\n"))
	}
	for _, w := range []string{"/w/wt", "/w/aq/sandbox/j/home", "/w/aq/sandbox/j/state", "/tmp", "/dev/shm"} {
		found := false
		for _, x := range v.Writable {
			found = found || x == w
		}
		if !found {
			t.Errorf("%s is not writable: %v", w, v.Writable)
		}
	}
}

// TestPlanMountsUnderDevShm: aq's trees under /dev/shm lie in the
// sandbox's own /dev: the worktree is bound onto it, not hidden under it.
func TestPlanMountsUnderDevShm(t *testing.T) {
	p := Policy{Worktree: "/dev/shm/aq/worktrees/app/j1", Home: "/home/u", JobDir: "/dev/shm/aq/sandbox/j1", Hidden: []string{"/dev/shm/aq"}}
	v := planMounts(p, fakeFS("/dev/shm/aq/", "/home/u/", "/tmp/"))
	got := show(v.Mounts)
	idx := func(s string) int {
		for i, g := range got {
			if g == s {
				return i
			}
		}
		return -1
	}
	dev, wt := idx("dev /dev"), idx("bind /dev/shm/aq/worktrees/app/j1 rw")
	if dev < 0 || wt < 0 || wt < dev {
		t.Errorf("the worktree is not bound onto the sandbox's /dev:\n%s", strings.Join(got, "\n"))
	}
	if idx("hide /dev/shm/aq") >= 0 {
		t.Errorf("a hide under the sandbox's own /dev:\n%s", strings.Join(got, "\n"))
	}
}

// TestPlanMountsShared: a shared directory (AQ_SANDBOX_WRITABLE) is bound
// read-write at its own path — also where the job's own /tmp or /dev
// covers it (a harness's directory under /dev/shm) — and is writable for
// Landlock on top; one that does not exist is left out.
func TestPlanMountsShared(t *testing.T) {
	p := Policy{Worktree: "/srv/aq/worktrees/app/j1", Home: "/home/u", JobDir: "/srv/aq/sandbox/j1", Hidden: []string{"/srv/aq"},
		Shared: []string{"/var/cache/ccache", "/dev/shm/harness/shared", "/tmp/scratch", "/gone"}}
	v := planMounts(p, fakeFS("/srv/aq/", "/home/u/", "/tmp/", "/var/cache/ccache/", "/dev/shm/harness/shared/", "/tmp/scratch/"))
	got := show(v.Mounts)
	pos := map[string]int{}
	for i, g := range got {
		pos[g] = i
	}
	for _, w := range []string{"bind /var/cache/ccache rw", "bind /dev/shm/harness/shared rw", "bind /tmp/scratch rw"} {
		if _, ok := pos[w]; !ok {
			t.Errorf("plan lacks %q:\n%s", w, strings.Join(got, "\n"))
		}
	}
	if pos["bind /dev/shm/harness/shared rw"] < pos["dev /dev"] || pos["bind /tmp/scratch rw"] < pos["bind /tmp <- /srv/aq/sandbox/j1/tmp rw"] {
		t.Errorf("a shared directory is mounted before what covers it:\n%s", strings.Join(got, "\n"))
	}
	if strings.Contains(strings.Join(got, "\n"), "/gone") {
		t.Errorf("a missing shared directory is planned:\n%s", strings.Join(got, "\n"))
	}
	for _, w := range []string{"/var/cache/ccache", "/dev/shm/harness/shared", "/tmp/scratch"} {
		found := false
		for _, x := range v.Writable {
			found = found || x == w
		}
		if !found {
			t.Errorf("%s is not writable for Landlock: %v", w, v.Writable)
		}
	}
}

// TestGatewayListens: a loopback gateway is bridged at its own address
// inside the sandbox, localhost at both loopback addresses; nothing else
// is.
func TestGatewayListens(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"127.0.0.1:4000", "127.0.0.1:4000"},
		{"127.0.0.2:4000", "127.0.0.2:4000"},
		{"[::1]:4000", "[::1]:4000"},
		{"[::ffff:127.0.0.1]:4000", "127.0.0.1:4000"},
		{"localhost:4000", "127.0.0.1:4000 [::1]:4000"},
		{"LocalHost:4000", "127.0.0.1:4000 [::1]:4000"},
		{"gw.example.com:443", ""},
		{"10.1.2.3:80", ""},
		{"localhost", ""},
		{"localhost:0", ""},
		{"localhost:http", ""},
	} {
		if got := strings.Join(GatewayListens(tc.in), " "); got != tc.want {
			t.Errorf("GatewayListens(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}
