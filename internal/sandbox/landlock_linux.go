package sandbox

import (
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/landlock-lsm/go-landlock/landlock"
	ll "github.com/landlock-lsm/go-landlock/landlock/syscall"
	"golang.org/x/sys/unix"
)

// Landlock, through go-landlock (which knows each ABI's access rights and
// downgrades a ruleset to what the kernel offers): aq builds the ruleset
// and enforces it itself, on the one OS thread that then starts the engine
// (restrictThread), so neither aq nor the sandbox's init is restricted —
// only the engine and what it starts. The rules are pinned to ABI 7, the
// newest ABI this project has run against; a newer kernel enforces them
// as ABI 7 would.

// llRules is a Landlock ruleset to build.
type llRules struct {
	// RO are trees the engine may read and execute, RW trees it may also
	// write, Dev device files it may read, write and ioctl.
	RO, RW, Dev []string
	// ROFiles are single files it may read.
	ROFiles []string
	// Net: restrict TCP bind and connect, allowing connect to
	// ConnectPorts only (none: no connect) — for a sandbox without a
	// network namespace: the proxy's port, and the loopback gateways'.
	Net          bool
	ConnectPorts []int
}

// landlockABI is the kernel's Landlock ABI version, 0 when it has none.
func landlockABI() int {
	v, err := ll.LandlockGetABIVersion()
	if err != nil || v < 0 {
		return 0
	}
	return v
}

// rulesetFD builds r as a Landlock ruleset and returns its fd (-1 when the
// kernel has no Landlock) and the flags landlock_restrict_self takes.
func (r llRules) rulesetFD() (int, uint32, error) {
	cfg := landlock.Config{HandledAccessFS: landlock.V7.HandledAccessFS, Scoped: landlock.V7.Scoped}
	if r.Net {
		cfg.HandledAccessNet = landlock.V7.HandledAccessNet
	}
	cfg = cfg.BestEffort()
	var rules []landlock.Rule
	if len(r.RO) > 0 {
		rules = append(rules, landlock.RODirs(r.RO...).IgnoreIfMissing())
	}
	if len(r.ROFiles) > 0 {
		rules = append(rules, landlock.ROFiles(r.ROFiles...).IgnoreIfMissing())
	}
	if len(r.RW) > 0 {
		rules = append(rules, landlock.RWDirs(r.RW...).WithRefer().IgnoreIfMissing())
	}
	if len(r.Dev) > 0 {
		rules = append(rules, landlock.RWFiles(r.Dev...).WithIoctlDev().IgnoreIfMissing())
	}
	if r.Net {
		for _, p := range r.ConnectPorts {
			if p > 0 && p <= 65535 {
				rules = append(rules, landlock.ConnectTCP(uint16(p)))
			}
		}
	}
	return cfg.NewRulesetFD(rules...)
}

// restrictThread drops every privilege of the calling OS thread and puts
// it in the Landlock domain fd (when fd >= 0): no_new_privs, an empty
// capability bounding set, no ambient, permitted or effective
// capabilities. The caller has locked the goroutine to its thread and
// never unlocks it: the thread starts the engine and dies with the
// goroutine.
func restrictThread(fd int, flags uint32) error {
	if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
		return &StartError{Step: "no_new_privs", Err: err}
	}
	if err := dropCapabilities(); err != nil {
		return err
	}
	if fd >= 0 {
		if err := ll.LandlockRestrictSelf(fd, flags); err != nil {
			return &StartError{Step: "landlock", Err: err}
		}
	}
	return nil
}

// dropCapabilities empties the calling thread's capability sets (the
// bounding set needs CAP_SETPCAP, which only the sandbox's init has; aq
// itself keeps its bounding set when it is not privileged).
func dropCapabilities() error {
	last := 40
	if b, err := os.ReadFile("/proc/sys/kernel/cap_last_cap"); err == nil {
		if n, ok := atoi(strings.TrimSpace(string(b))); ok {
			last = n
		}
	}
	for c := 0; c <= last; c++ {
		if err := unix.Prctl(unix.PR_CAPBSET_DROP, uintptr(c), 0, 0, 0); err != nil && err != unix.EPERM && err != unix.EINVAL {
			return &StartError{Step: "drop capabilities", Err: err}
		}
	}
	if err := unix.Prctl(unix.PR_CAP_AMBIENT, unix.PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0); err != nil && err != unix.EINVAL {
		return &StartError{Step: "drop ambient capabilities", Err: err}
	}
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var data [2]unix.CapUserData
	if err := unix.Capset(&hdr, &data[0]); err != nil {
		return &StartError{Step: "drop capabilities", Err: err}
	}
	return nil
}

func atoi(s string) (int, bool) {
	n := 0
	if s == "" {
		return 0, false
	}
	for _, r := range s {
		if r < '0' || r > '9' {
			return 0, false
		}
		n = n*10 + int(r-'0')
	}
	return n, true
}

// fullRules is the Landlock ruleset on top of a full sandbox: read and
// execute everywhere the mounts show, write only where the job owns, the
// sandbox's device files; TCP is left to the network namespace (the
// engine's own loopback servers — a test's httptest — keep working).
func fullRules(v view) llRules {
	return llRules{
		RO:  []string{"/"},
		RW:  v.Writable,
		Dev: devPaths(),
	}
}

func devPaths() []string {
	out := make([]string, 0, len(devNodes)+1)
	for _, n := range devNodes {
		out = append(out, "/dev/"+n)
	}
	return append(out, "/dev/pts")
}

// partialRules is Landlock alone (no namespaces): read only what the
// Policy leaves readable — "/" minus Hidden, Home, /tmp and /var/tmp,
// granted as the siblings of what is hidden, since Landlock only allows —
// plus the toolchains and the job's git metadata; write only what the job
// owns; TCP connect only to the job's proxy.
func partialRules(p Policy, list func(dir string) ([]os.DirEntry, error)) llRules {
	p = p.Clean()
	hidden := append([]string{}, p.Hidden...)
	hidden = append(hidden, p.HiddenFiles...)
	hidden = append(hidden, "/tmp", "/var/tmp")
	if p.Home != "" {
		hidden = append(hidden, p.Home)
	}
	r := llRules{Net: true, RW: p.Writable(), Dev: devPaths()}
	if p.Net.ProxyPort > 0 {
		r.ConnectPorts = append(r.ConnectPorts, p.Net.ProxyPort)
	}
	r.ConnectPorts = append(r.ConnectPorts, p.Net.gatewayPorts()...)
	grantSiblings("/", hidden, list, &r)
	r.RO = append(r.RO, p.GitDirs...)
	r.RO = append(r.RO, p.ReadOnly...)
	r.RO = append(r.RO, p.Caches...)
	slices.Sort(r.RO)
	slices.Sort(r.ROFiles)
	return r
}

// grantSiblings grants dir read-only when nothing hidden lies in it;
// otherwise it grants each entry of dir by the same rule, leaving out
// what is hidden.
func grantSiblings(dir string, hidden []string, list func(string) ([]os.DirEntry, error), r *llRules) {
	if slices.Contains(hidden, dir) {
		return
	}
	inside := false
	for _, h := range hidden {
		if within(h, dir) {
			inside = true
			break
		}
	}
	if !inside {
		r.RO = append(r.RO, dir)
		return
	}
	entries, err := list(dir)
	if err != nil {
		return // unreadable: nothing to grant
	}
	for _, e := range entries {
		p := filepath.Join(dir, e.Name())
		if e.IsDir() {
			grantSiblings(p, hidden, list, r)
			continue
		}
		if slices.Contains(hidden, p) {
			continue
		}
		mode := e.Type()
		if mode&os.ModeSymlink != 0 {
			// A link's target is granted (or not) where it lies; a link
			// to a regular file is granted as that file.
			t, err := os.Stat(p)
			if err != nil || !t.Mode().IsRegular() {
				continue
			}
			mode = t.Mode().Type()
		}
		if !mode.IsRegular() {
			continue // a device (the Dev rules), a socket, a fifo: not read as a file
		}
		r.ROFiles = append(r.ROFiles, p)
	}
}
