package sandbox

import (
	"fmt"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
)

// The macOS sandbox: a Seatbelt profile (SBPL, the language sandbox-exec
// -p takes) generated from the same Policy as the Linux sandbox, with the
// same file and network policy (docs/sandbox.md, "macOS and Windows"):
//
//   - closed by default; the engine may fork and exec, and signal and
//     inspect only processes of its own sandbox;
//   - files: the host readable, but not what is hidden ($AQ_HOME, the repo
//     base, /run, the user's home, the host's and the user's temporary
//     directories; single hidden files, whatever covers them) — save the metadata of the
//     directories on the way to what the job may reach inside them, the
//     toolchains and caches (read-only), the job's git metadata
//     (read-only, and never writable, whatever else says so), and the
//     job's own: its worktree, home, temporary and state directories, the
//     only places it may write (devices and ttys aside);
//   - network: TCP to the job's egress proxy on localhost, nothing else.
//
// SBPL takes the last rule that matches, so the profile lists the broad
// grants first and what narrows them after. Seatbelt matches the paths a
// file resolves to (/tmp is /private/tmp on macOS): Seatbelt is given the
// policy's paths through resolve (the darwin launcher resolves symbolic
// links; tests pass what they need). It is a pure function of its inputs,
// golden-tested on every platform (testdata/seatbelt).

// seatbeltTemp are the temporary directories the job does not see (its
// own is Policy.JobTmp): the host's /tmp and /var/tmp, and macOS's
// per-user temporary and cache directories, which hold other programs'
// (and aq's own) files.
var seatbeltTemp = []string{"/tmp", "/var/tmp", "/private/var/folders"}

// seatbeltSysctls are the sysctls the engine may read: the hardware and
// the system's version, as runtimes (Go, Node, the JVM, Python) ask for
// them; not the process table (kern.proc.*, kern.procargs2), so other
// processes' names, arguments and environments stay out of reach.
var seatbeltSysctls = []string{
	"hw.", "machdep.cpu.", "kern.argmax", "kern.boottime", "kern.hostname", "kern.maxfiles", "kern.maxfilesperproc",
	"kern.maxproc", "kern.osproductversion", "kern.osrelease", "kern.ostype", "kern.osversion", "kern.osvariant_status",
	"kern.usrstack64", "kern.version", "sysctl.proc_cputype", "sysctl.proc_native", "vm.loadavg",
}

// seatbeltServices are the Mach services the engine may look up: the
// user and group database (getpwuid), TLS trust evaluation (an HTTPS
// client checking a certificate through the proxy), the system's logs and
// notifications. Not com.apple.SecurityServer: that is the keychain.
var seatbeltServices = []string{
	"com.apple.system.opendirectoryd.libinfo", "com.apple.system.opendirectoryd.membership",
	"com.apple.trustd", "com.apple.trustd.agent", "com.apple.ocspd",
	"com.apple.system.notification_center", "com.apple.system.logger", "com.apple.logd",
}

// seatbeltDevices are the device files the engine may write (and the
// ttys below /dev, by pattern): what a shell and a build write to.
var seatbeltDevices = []string{"/dev/null", "/dev/zero", "/dev/tty", "/dev/ptmx", "/dev/dtracehelper"}

// Seatbelt is the SBPL profile that enforces p on macOS. resolve maps a
// policy path to the path Seatbelt sees (symbolic links resolved); nil
// keeps paths as they are.
func Seatbelt(p Policy, resolve func(string) string) string {
	p = p.Clean()
	if resolve == nil {
		resolve = func(s string) string { return s }
	}
	res := func(paths ...string) []string {
		var out []string
		for _, s := range paths {
			if s == "" {
				continue
			}
			r := filepath.Clean(resolve(s))
			if !slices.Contains(out, r) {
				out = append(out, r)
			}
		}
		slices.Sort(out)
		return out
	}
	home := p.Home
	if home == "/" {
		home = "" // a home at / hides nothing more than the rest does
	}
	hidden := res(append(append(append([]string{}, p.Hidden...), home), seatbeltTemp...)...)
	hiddenFiles := res(p.HiddenFiles...)
	readOnly := res(append(append(append([]string{}, p.ReadOnly...), p.Caches...), p.GitDirs...)...)
	writable := res(p.Writable()...)
	gitDirs := res(p.GitDirs...)

	var b strings.Builder
	w := func(format string, args ...any) { fmt.Fprintf(&b, format+"\n", args...) }
	w("(version 1)")
	w(";; aq: the sandbox of one job's engine (docs/sandbox.md), generated from its policy.")
	w("(deny default)")
	w("")
	w(";; Processes: fork and exec; signals and process information within this sandbox only.")
	w("(allow process-fork)")
	w("(allow process-exec)")
	w("(allow signal (target same-sandbox))")
	w("(allow process-info* (target same-sandbox))")
	w("(allow sysctl-read")
	for _, s := range seatbeltSysctls {
		if strings.HasSuffix(s, ".") {
			w("  (sysctl-name-prefix %s)", sbString(s))
		} else {
			w("  (sysctl-name %s)", sbString(s))
		}
	}
	w(")")
	w("(allow mach-lookup")
	for _, s := range seatbeltServices {
		w("  (global-name %s)", sbString(s))
	}
	w(")")
	w("(allow user-preference-read)")
	w("(allow ipc-posix-sem)")
	w("(allow pseudo-tty)")
	w("")
	w(";; Files: the host readable ...")
	w("(allow file-read*)")
	w(";; ... but what the job must not see: aq's trees, other repositories, the user's home, the temporary directories.")
	rule(&b, "deny file-read*", "subpath", hidden)
	w(";; The directories on the way to what the job reaches inside those: their own metadata only.")
	rule(&b, "allow file-read-metadata", "literal", ancestors(append(append([]string{}, readOnly...), writable...), hidden))
	w(";; Toolchains, caches and the job's git metadata: read-only.")
	rule(&b, "allow file-read*", "subpath", readOnly)
	w(";; The job's own — its worktree, home, temporary and state directories: the only places it writes.")
	rule(&b, "allow file-read* file-write*", "subpath", writable)
	w(";; Single files hidden inside readable trees (a registry token, /etc/shadow), whatever covers them.")
	rule(&b, "deny file-read* file-write*", "literal", hiddenFiles)
	w(";; The job's git metadata stays read-only, whatever covers it: nothing planted there runs later.")
	rule(&b, "deny file-write*", "subpath", gitDirs)
	w(";; Devices and terminals.")
	w("(allow file-write-data file-ioctl")
	for _, d := range seatbeltDevices {
		w("  (literal %s)", sbString(d))
	}
	w("  (subpath \"/dev/fd\")")
	w("  (regex #\"^/dev/ttys[0-9]+$\"))")
	w("")
	if p.Net.ProxyPort > 0 {
		w(";; Network: the job's egress proxy on localhost, nothing else.")
		w("(allow network-outbound (remote tcp %s))", sbString("localhost:"+strconv.Itoa(p.Net.ProxyPort)))
		if gw := p.Net.gatewayPorts(); len(gw) > 0 {
			w(";; The engine's gateways on the host's loopback (NO_PROXY sends them direct).")
			for _, port := range gw {
				w("(allow network-outbound (remote tcp %s))", sbString("localhost:"+strconv.Itoa(port)))
			}
		}
	} else {
		w(";; Network: none (the job has no egress proxy).")
	}
	return b.String()
}

// rule writes (verb (kind "path") ...) for paths, nothing when there are
// none.
func rule(b *strings.Builder, verb, kind string, paths []string) {
	if len(paths) == 0 {
		return
	}
	fmt.Fprintf(b, "(%s", verb)
	for _, p := range paths {
		fmt.Fprintf(b, "\n  (%s %s)", kind, sbString(p))
	}
	b.WriteString(")\n")
}

// ancestors are the directories strictly above each of paths that lie
// in (or are) a hidden tree: to reach a path, realpath and getcwd stat
// each directory on the way.
func ancestors(paths, hidden []string) []string {
	var out []string
	for _, p := range paths {
		for d := filepath.Dir(p); d != "/" && d != "."; d = filepath.Dir(d) {
			in := false
			for _, h := range hidden {
				in = in || within(d, h)
			}
			if in && !slices.Contains(out, d) {
				out = append(out, d)
			}
		}
	}
	slices.Sort(out)
	return out
}

// sbString is s as an SBPL string literal.
func sbString(s string) string {
	return `"` + strings.NewReplacer(`\`, `\\`, `"`, `\"`).Replace(s) + `"`
}
