package sandbox

import (
	"net"
	"net/netip"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
)

// Policy is what one job's engine (and its verify command) may touch. It is
// the same on every platform; each platform enforces it its own way
// (docs/sandbox.md): Linux with namespaces and Landlock, macOS with a
// Seatbelt profile generated from it. Paths are absolute and clean.
//
// In words: the engine sees the host read-only, except Hidden (empty and
// unreadable) and Home (replaced by the job's own home); it writes only to
// its Worktree and the job's own directories (JobDir: home, tmp, state);
// the job's git metadata (GitDirs) stays readable but read-only, so nothing
// it plants there runs later; toolchains under Home or a hidden path
// (ReadOnly) stay readable; package caches (Caches) are shared read-only
// with a writable layer of the job's own; and its only route out is the
// job's egress proxy (Net).
type Policy struct {
	// Worktree is the job's worktree: read-write, at its own path (git's
	// worktree .git file names absolute paths).
	Worktree string `json:"worktree"`
	// GitDirs are the job's git metadata outside the worktree: the
	// repository's common git dir and the worktree's own git dir.
	// Read-only.
	GitDirs []string `json:"gitDirs,omitempty"`
	// Home is the user's home as the host knows it ($HOME; "" when
	// unknown). Nothing of it is readable but ReadOnly and Caches entries
	// below it: where the platform can, the job's home (JobHome) is seen at
	// this path, so tools that find their state from $HOME (rustup, pyenv,
	// go) keep working.
	Home string `json:"home,omitempty"`
	// JobDir is the job's own directory on the host, under $AQ_HOME: the
	// engine's home (JobHome), its temporary directory (JobTmp), the state
	// aq and the engine exchange (StateDir), and the writable layers of the
	// caches. It lives as long as the run (the attempt and its repair
	// rounds) and is removed after it.
	JobDir string `json:"jobDir"`
	// Hidden are unreadable (seen empty): $AQ_HOME, the repo base, /run,
	// … — except the Worktree, GitDirs and JobDir paths below them.
	Hidden []string `json:"hidden,omitempty"`
	// HiddenFiles are single files made unreadable inside a readable tree
	// (a cargo registry token inside ~/.cargo; /etc/shadow for a factory
	// that runs as root).
	HiddenFiles []string `json:"hiddenFiles,omitempty"`
	// ReadOnly are readable even where they lie under Home or a Hidden
	// path: toolchains, the engine's own binary.
	ReadOnly []string `json:"readOnly,omitempty"`
	// Shared are host directories every job's engine may also write
	// (AQ_SANDBOX_WRITABLE: a shared build cache, a harness's log), at
	// their own paths; one that does not exist is left out.
	Shared []string `json:"shared,omitempty"`
	// Caches are package caches below Home (the Go module and build
	// caches, npm's, pip's, cargo's registry, …): shared read-only, with a
	// writable layer of the job's own where the platform can (Linux:
	// overlayfs), else of the job's own only.
	Caches []string `json:"caches,omitempty"`
	// Net is the engine's one route out.
	Net Net `json:"net"`
	// Limits are the job's cgroup limits (zero: none).
	Limits Limits `json:"limits"`
	// CacheLayerMax bounds the tmpfs the caches' writable layers live on
	// where aq can mount one (Linux, full level): 0 is half the job's
	// memory limit, or a quarter of the host's memory without one.
	CacheLayerMax int64 `json:"cacheLayerMax,omitempty"`
}

// Net says how the engine reaches the network: only through the job's
// egress proxy, which decides host by host (internal/egress). With neither
// field set the engine has no network at all.
type Net struct {
	// ProxySocket is the unix socket of the job's proxy on the host. Inside
	// a network namespace the sandbox bridges 127.0.0.1:ProxyBridgePort to
	// it.
	ProxySocket string `json:"proxySocket,omitempty"`
	// ProxyPort is the proxy's TCP port on 127.0.0.1, for a sandbox without
	// a network namespace of its own (Landlock alone, macOS): the only port
	// the engine may connect to.
	ProxyPort int `json:"proxyPort,omitempty"`
	// Gateways are destinations on the host's loopback the engine reaches
	// at their own address and port, as "host:port": "127.0.0.1:4000",
	// "[::1]:4000", "localhost:4000" (127.0.0.1 and ::1) — an engine's
	// gateway (its base URL), AQ_SANDBOX_NET's loopback entries
	// (egress.Rules.Loopbacks). NO_PROXY sends loopback direct: inside a
	// network namespace the sandbox's init listens there and carries each
	// connection through the job's proxy (which decides, as for any
	// destination); without one (Landlock alone, macOS) the engine may
	// connect to their ports, on any address (Landlock filters ports
	// only). Entries that are not loopback are ignored.
	Gateways []string `json:"gateways,omitempty"`
}

// GatewayListens are the addresses inside a network namespace of its own
// at which the sandbox bridges gateway ("host:port", Net.Gateways): the
// address itself for a loopback address, 127.0.0.1 and ::1 for localhost;
// none for anything else.
func GatewayListens(gateway string) []string {
	host, port, err := net.SplitHostPort(gateway)
	if err != nil {
		return nil
	}
	if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
		return nil
	}
	if strings.EqualFold(host, "localhost") {
		return []string{"127.0.0.1:" + port, "[::1]:" + port}
	}
	a, err := netip.ParseAddr(host)
	if err != nil || !a.Unmap().IsLoopback() || a.Zone() != "" {
		return nil
	}
	return []string{net.JoinHostPort(a.Unmap().String(), port)}
}

// gatewayPorts are the ports of the loopback gateways, sorted, for a
// sandbox that filters connections by port alone.
func (n Net) gatewayPorts() []int {
	var out []int
	for _, g := range n.Gateways {
		if len(GatewayListens(g)) == 0 {
			continue
		}
		_, port, _ := net.SplitHostPort(g)
		p, _ := strconv.Atoi(port)
		out = append(out, p)
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// ProxyBridgePort is where the engine finds its proxy inside a network
// namespace of its own (HTTPS_PROXY=http://127.0.0.1:3128).
const ProxyBridgePort = 3128

// Limits are what the job's process tree may use (cgroup v2). Zero fields
// are unlimited.
type Limits struct {
	MemoryBytes int64 `json:"memoryBytes,omitempty"`
	Pids        int   `json:"pids,omitempty"`
}

// JobHome is the job's home on the host.
func (p Policy) JobHome() string { return filepath.Join(p.JobDir, "home") }

// JobTmp is the job's temporary directory on the host.
func (p Policy) JobTmp() string { return filepath.Join(p.JobDir, "tmp") }

// StateDir is a directory aq and the engine both reach at this same path:
// what aq hands the engine in files (devin's prompt) and what the engine
// leaves for aq (devin's trajectory).
func (p Policy) StateDir() string { return filepath.Join(p.JobDir, "state") }

// Writable lists what the engine may write, as host paths: its worktree,
// the job's home, temporary and state directories, and the shared ones.
func (p Policy) Writable() []string {
	return append([]string{p.Worktree, p.JobHome(), p.JobTmp(), p.StateDir()}, p.Shared...)
}

// Clean returns p with every path cleaned, empty and duplicate entries
// dropped, and the lists sorted, so two equal policies compare (and
// generate) the same.
func (p Policy) Clean() Policy {
	clean := func(s string) string {
		if s == "" {
			return ""
		}
		return filepath.Clean(s)
	}
	list := func(in []string) []string {
		var out []string
		for _, s := range in {
			if s = clean(s); s != "" && !slices.Contains(out, s) {
				out = append(out, s)
			}
		}
		slices.Sort(out)
		return out
	}
	p.Worktree, p.Home, p.JobDir = clean(p.Worktree), clean(p.Home), clean(p.JobDir)
	p.GitDirs, p.Hidden, p.HiddenFiles = list(p.GitDirs), list(p.Hidden), list(p.HiddenFiles)
	p.ReadOnly, p.Caches, p.Shared = list(p.ReadOnly), list(p.Caches), list(p.Shared)
	p.Net.ProxySocket = clean(p.Net.ProxySocket)
	p.Net.Gateways = list(p.Net.Gateways)
	return p
}

// within reports whether path is dir or below it (both clean and
// absolute).
func within(path, dir string) bool {
	if dir == "/" {
		return strings.HasPrefix(path, "/")
	}
	return path == dir || strings.HasPrefix(path, dir+"/")
}

// Visible reports whether path — absolute, as the host names it — is seen
// inside the sandbox as the host has it. When it is not, why says so in
// words a person can act on ("/tmp is the job's own inside the sandbox").
// It is what `aq validate` and `aq submit` warn with for a script: file or
// a verify program outside the repository, and what a job's "command not
// found" failure explains itself with (docs/sandbox.md).
func (p Policy) Visible(path string) (ok bool, why string) {
	if !filepath.IsAbs(path) {
		return true, "" // relative: the worktree's, which the job sees
	}
	path = filepath.Clean(path)
	for _, f := range p.HiddenFiles {
		if path == filepath.Clean(f) {
			return false, path + " is hidden inside the sandbox"
		}
	}
	// The job's own trees, and what is shown at the host's path on purpose.
	seen := append(append([]string{p.Worktree, p.JobDir}, p.GitDirs...), p.Shared...)
	seen = append(append(seen, p.ReadOnly...), p.Caches...)
	for _, d := range seen {
		if d != "" && within(path, filepath.Clean(d)) {
			return true, ""
		}
	}
	for _, h := range p.Hidden {
		if h != "" && within(path, filepath.Clean(h)) {
			return false, filepath.Clean(h) + " is hidden inside the sandbox"
		}
	}
	if p.Home != "" && p.Home != "/" && within(path, filepath.Clean(p.Home)) {
		return false, filepath.Clean(p.Home) + " (the home) is the job's own inside the sandbox"
	}
	for _, t := range []string{"/tmp", "/var/tmp"} {
		if within(path, t) {
			return false, t + " is the job's own inside the sandbox"
		}
	}
	return true, ""
}
