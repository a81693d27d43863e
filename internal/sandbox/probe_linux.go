package sandbox

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"github.com/aqfleet/aq/internal/atomicfile"
	"github.com/aqfleet/aq/internal/safefs"
)

// probe finds what this host can do: the Landlock ABI, whether a full
// sandbox starts (a trial: the real init in new namespaces, building a
// minimal view, bringing up loopback), and the cgroups to hold limits with
// (v2 delegated, else v1 writable). When the
// trial fails, the usual causes are read from their sysctls to say why.
func probe(o Options) (Report, hostPlatform) {
	r := Report{Level: LevelFull, LandlockABI: landlockABI()}
	var missing []Missing
	r.UserNS = trialRemembered(o)
	var plat hostPlatform
	cg, cgWhy := findLimiter()
	if cg != nil {
		r.LimitsBy, r.Cgroup = cg.describe()
		plat.cgroup = cg
	} else {
		r.CgroupWhy = cgWhy
		missing = append(missing, Missing{Guarantee: GuaranteeLimits, Why: cgWhy})
	}
	switch {
	case r.UserNS == "":
		r.Mechanism = "namespaces"
		if r.LandlockABI > 0 {
			r.Mechanism = "namespaces+landlock"
		}
	case r.LandlockABI > 0 && o.Init != "":
		r.Level, r.Mechanism = LevelPartial, "landlock"
		net := "Landlock limits TCP connect to the proxy's port only; UDP and other protocols are not filtered (no network namespace: " + r.UserNS + ")"
		if r.LandlockABI < 4 {
			net = fmt.Sprintf("Landlock ABI %d cannot restrict the network at all (ABI 4, Linux 6.7, can; %s)", r.LandlockABI, r.UserNS)
		}
		procs := "other processes are visible, though not traceable or signalable (no pid namespace: " + r.UserNS + ")"
		if r.LandlockABI < 6 {
			procs = fmt.Sprintf("other processes are visible and can be signalled: Landlock ABI %d cannot scope signals (ABI 6, Linux 6.12, can; %s)", r.LandlockABI, r.UserNS)
		}
		missing = append(missing,
			Missing{Guarantee: GuaranteeNetwork, Why: net},
			Missing{Guarantee: GuaranteeProcesses, Why: procs},
			Missing{Guarantee: GuaranteeStragglers, Why: "a daemonised process that drops the job's tag can outlive aq killed -9 (no pid namespace: " + r.UserNS + ")"})
	default:
		r.Level = LevelNone
		why := r.UserNS
		if o.Init != "" {
			why += "; and no Landlock (Linux 5.13+ with landlock in the lsm= boot list)"
		}
		for _, g := range fullGuarantees {
			missing = append(missing, Missing{Guarantee: g, Why: why})
		}
	}
	r.finish(missing)
	return r, plat
}

// trialRemembered is trialUserNS, skipped when o.TrialCache remembers a
// trial that started under the same trialKey: a factory's `aq run --once`
// after `aq run --once` pays for one trial a boot, not one a process (a
// sandbox start of its own, docs/BENCHMARKS.md "#35 item 2"). What is
// remembered only ever claims the full level: every job's sandbox is
// still made for real, and one that does not start forgets it
// (forgetTrial).
func trialRemembered(o Options) string {
	key := trialKey(o.Init)
	if o.TrialCache != "" && key != "" {
		b, err := safefs.ReadFile("state", filepath.Dir(o.TrialCache), filepath.Base(o.TrialCache), 4096)
		if err == nil && string(b) == key {
			return ""
		}
	}
	why := trialUserNS(o.Init)
	if why == "" && o.TrialCache != "" && key != "" {
		_ = os.MkdirAll(filepath.Dir(o.TrialCache), 0o700)
		_ = atomicfile.WriteFile(o.TrialCache, []byte(key), 0o600) // not remembered: the next probe runs the trial
	}
	return why
}

// forgetTrial drops what TrialCache remembers, after a full sandbox did
// not start.
func forgetTrial(o Options) {
	if o.TrialCache != "" {
		_ = os.Remove(o.TrialCache)
	}
}

// trialKey is what a trial's outcome depends on and may change without a
// reboot: the boot itself, the user, the init binary (aq replaced) and
// the sysctls that block user namespaces (explainUserNS). "" when the
// boot cannot be told (nothing is remembered then).
func trialKey(init string) string {
	boot := readProc("/proc/sys/kernel/random/boot_id")
	if boot == "" || init == "" {
		return ""
	}
	fi, err := os.Stat(init)
	if err != nil {
		return ""
	}
	var b strings.Builder
	fmt.Fprintf(&b, "boot %s\nuid %d\ninit %s %d %d\n", boot, os.Getuid(), init, fi.Size(), fi.ModTime().UnixNano())
	for _, p := range []string{sysctlMaxUserNS, sysctlUnprivClone, sysctlAppArmorUserNS} {
		fmt.Fprintf(&b, "%s %s\n", p, readProc(p))
	}
	return b.String()
}

// The sysctls that may block user namespaces (explainUserNS, trialKey).
const (
	sysctlMaxUserNS      = "/proc/sys/user/max_user_namespaces"
	sysctlUnprivClone    = "/proc/sys/kernel/unprivileged_userns_clone"
	sysctlAppArmorUserNS = "/proc/sys/kernel/apparmor_restrict_unprivileged_userns"
)

// readProc is a /proc file's value, trimmed; "" when it cannot be read.
func readProc(p string) string {
	b, err := os.ReadFile(p)
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
}

// trialUserNS starts a trial sandbox and says why it failed ("" when it
// started).
func trialUserNS(init string) string {
	if init == "" {
		return "no aq executable to run the sandbox's init with (aq's packages run in-process)"
	}
	dir, err := os.MkdirTemp("", "aq-sandbox-probe-")
	if err != nil {
		return "cannot make a directory for the trial sandbox: " + err.Error()
	}
	defer func() { _ = removeTree(dir) }() // a trial's leftovers in the temp dir are harmless
	h := &Host{opts: Options{Init: init}, report: Report{Level: LevelFull}}
	j := &Jail{h: h, level: LevelFull, p: Policy{Worktree: dir, JobDir: dir}.Clean()}
	if err := makeJobDir(j.p); err != nil {
		return "cannot make a directory for the trial sandbox: " + err.Error()
	}
	j.plat.view = view{Mounts: []mountOp{{Kind: mRoot, Src: "/", Dst: "/"}, {Kind: mHide, Dst: "/tmp"}, {Kind: mProc, Dst: "/proc"}}}
	cmd := exec.Command("/bin/true")
	run, err := j.startFull(cmd, true)
	if err != nil {
		return explainUserNS(err)
	}
	_ = cmd.Wait()
	run.Exit(cmd.ProcessState)
	_, _ = run.Close()
	return ""
}

// explainUserNS names the usual cause of a trial that failed: the sysctls
// that block user namespaces, else the error itself.
func explainUserNS(err error) string {
	var causes []string
	if readProc(sysctlMaxUserNS) == "0" {
		causes = append(causes, "user.max_user_namespaces=0")
	}
	if os.Getuid() != 0 && readProc(sysctlUnprivClone) == "0" {
		causes = append(causes, "kernel.unprivileged_userns_clone=0")
	}
	if os.Getuid() != 0 && readProc(sysctlAppArmorUserNS) == "1" {
		causes = append(causes, "kernel.apparmor_restrict_unprivileged_userns=1 (Ubuntu 23.10+: allow aq in an AppArmor profile, docs/sandbox.md)")
	}
	msg := err.Error()
	var se *StartError
	if errors.As(err, &se) {
		msg = se.Step + ": " + se.Err.Error()
	}
	if len(causes) > 0 {
		return "user namespaces are blocked (" + strings.Join(causes, ", ") + ")"
	}
	return "a trial sandbox did not start (" + msg + ")"
}
