// Package hostile is the hostile engine of the sandbox's escape set
// (docs/sandbox.md): one script (hostile.sh) that tries every escape a
// sandboxed engine must not make — read $AQ_HOME, the factory's and the
// user's credentials, another job, another worktree, another repository;
// write outside its worktree; plant a hook and core.fsmonitor in the
// repository's shared git metadata; reach a loopback port, the
// coordinator, a host no job is allowed; see, signal and read aq; leave a
// daemonised straggler — and still does its job. The hostile-engine suite
// runs it as a real job with the sandbox and without (the control), and
// aq selftest runs it in a real sandbox on the host it checks; both judge
// what it printed here, by guarantee and level.
package hostile

import (
	"bufio"
	_ "embed"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/aqfleet/aq/internal/sandbox"
)

// Script is hostile.sh: run it with bash, with Args.
//
//go:embed hostile.sh
var Script string

// Probe is one escape the script tries.
type Probe struct {
	Name string
	// Guarantee is the sandbox's promise that denies it.
	Guarantee sandbox.Guarantee
	// Partial: the partial level (Landlock alone) denies it too.
	Partial bool
	// OnHost: the probe prints ok inside the sandbox too — its write lands
	// in the job's own home or /tmp — and is judged on the host (Args.Writes).
	OnHost bool
}

// Escapes are the script's escapes, by guarantee. (Its env_* probes —
// aq's settings and the factory's tokens in the engine's environment —
// are denied in every mode: Always.)
var Escapes = []Probe{
	{Name: "read_aq_credentials", Guarantee: sandbox.GuaranteeFiles, Partial: true},
	{Name: "read_other_job_manifest", Guarantee: sandbox.GuaranteeFiles, Partial: true},
	{Name: "read_other_job_log", Guarantee: sandbox.GuaranteeFiles, Partial: true},
	{Name: "read_other_worktree", Guarantee: sandbox.GuaranteeFiles, Partial: true},
	{Name: "read_other_repo", Guarantee: sandbox.GuaranteeFiles, Partial: true},
	{Name: "read_ssh_key", Guarantee: sandbox.GuaranteeFiles, Partial: true},
	{Name: "read_cloud_creds", Guarantee: sandbox.GuaranteeFiles, Partial: true},
	{Name: "read_gh_token", Guarantee: sandbox.GuaranteeFiles, Partial: true},
	{Name: "write_home", Guarantee: sandbox.GuaranteeFiles, Partial: true, OnHost: true},
	{Name: "write_tmp", Guarantee: sandbox.GuaranteeFiles, Partial: true, OnHost: true},
	{Name: "write_repobase", Guarantee: sandbox.GuaranteeFiles, Partial: true, OnHost: true},
	{Name: "plant_hook", Guarantee: sandbox.GuaranteeFiles, Partial: true},
	{Name: "plant_fsmonitor", Guarantee: sandbox.GuaranteeFiles, Partial: true},
	{Name: "reach_loopback", Guarantee: sandbox.GuaranteeNetwork, Partial: true},
	{Name: "reach_coordinator", Guarantee: sandbox.GuaranteeNetwork, Partial: true},
	{Name: "reach_forbidden_host", Guarantee: sandbox.GuaranteeNetwork, Partial: true},
	{Name: "see_aq", Guarantee: sandbox.GuaranteeProcesses},
	{Name: "signal_aq", Guarantee: sandbox.GuaranteeProcesses, Partial: true},
	{Name: "read_aq_environ", Guarantee: sandbox.GuaranteeProcesses, Partial: true},
}

// Always are the script's probes that fail with the sandbox and without
// it: the engine's environment is built from a documented base
// (docs/engines.md), which never holds aq's settings ($AQ_HOME) or the
// tokens aq ships with ($GH_TOKEN, $GITHUB_TOKEN).
var Always = []string{"env_aq_home", "env_gh_token"}

// Denied are the escapes of guarantee g that level must deny (judged from
// what the script printed unless OnHost).
func Denied(level sandbox.Level, g sandbox.Guarantee) []Probe {
	var out []Probe
	for _, p := range Escapes {
		if p.Guarantee == g && (level == sandbox.LevelFull || level == sandbox.LevelPartial && p.Partial) {
			out = append(out, p)
		}
	}
	return out
}

// Escaped are the probes of ps that worked by what the script printed
// (got: Parse), or that did not run at all ("" — a script cut short
// proves nothing); OnHost probes are left to the caller.
func Escaped(ps []Probe, got map[string]string) []string {
	var out []string
	for _, p := range ps {
		if p.OnHost {
			continue
		}
		if o := got[p.Name]; o != "denied" {
			if o == "" {
				o = "not run"
			}
			out = append(out, p.Name+" ("+o+")")
		}
	}
	return out
}

// Parse reads the script's "PROBE <name> <outcome>" lines.
func Parse(out string) map[string]string {
	m := map[string]string{}
	sc := bufio.NewScanner(strings.NewReader(out))
	for sc.Scan() {
		if f := strings.Fields(sc.Text()); len(f) == 3 && f[0] == "PROBE" {
			m[f[1]] = f[2]
		}
	}
	return m
}

// Args are the script's inputs.
type Args struct {
	AQHome, RepoBase, UserHome string
	// Port is a loopback listener's on the host, CoordPort the
	// coordinator's, ForbiddenPort a listener's on 127.0.0.2.
	Port, CoordPort, ForbiddenPort int
	// AQBin is aq's binary (aq is found by it among the script's
	// ancestors); AQPIDs, when set, are aq's processes instead (aq's
	// packages run in-process: aq selftest).
	AQBin  string
	AQPIDs []int
	// Nonce marks what the run leaves on the host; Repo is the job's
	// repository under RepoBase.
	Nonce, Repo string
}

// Command is the job's script: line running the script at path (relative
// to the worktree, or absolute) with a.
func (a Args) Command(path string) string {
	pids := make([]string, len(a.AQPIDs))
	for i, p := range a.AQPIDs {
		pids[i] = strconv.Itoa(p)
	}
	args := []string{"bash", path, a.AQHome, a.RepoBase, a.UserHome, strconv.Itoa(a.Port), strconv.Itoa(a.CoordPort),
		strconv.Itoa(a.ForbiddenPort), a.AQBin, a.Nonce, a.Repo, strings.Join(pids, ",")}
	for i, s := range args {
		args[i] = quote(s)
	}
	return strings.Join(args, " ")
}

// Writes are where the write probes land on the host, by probe: none may
// exist after a sandboxed run (they land in the job's own home and /tmp),
// all after an unsandboxed one.
func (a Args) Writes() map[string]string {
	return map[string]string{
		"write_home":     filepath.Join(a.UserHome, "aq-escape-"+a.Nonce),
		"write_tmp":      "/tmp/aq-escape-" + a.Nonce,
		"write_repobase": filepath.Join(a.RepoBase, "aq-escape-"+a.Nonce),
	}
}

// Plants are what the plant probes leave on the host when they work: a
// post-commit hook in the repository's shared git dir, and the marks the
// hook and the fsmonitor make if git ever runs them.
func (a Args) Plants() (hook, hookRan, fsmonitorRan string) {
	return filepath.Join(a.RepoBase, a.Repo, ".git", "hooks", "post-commit"), "/tmp/aq-hook-ran-" + a.Nonce, "/tmp/aq-fsmonitor-ran-" + a.Nonce
}

// StragglerMark is on the command line of the straggler the script
// leaves (a daemonised process that drops the job's tag and leaves its
// process group): the caller finds it on the host by it.
func (a Args) StragglerMark() string { return "straggler-" + a.Nonce }

// quote is s as one sh word.
func quote(s string) string {
	if s != "" && strings.IndexFunc(s, func(r rune) bool {
		return !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || strings.ContainsRune("/._-,:+=", r))
	}) < 0 {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}
