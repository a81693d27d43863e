package sandbox

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/aqfleet/aq/internal/process"
)

// macOS: the engine runs under sandbox-exec with the Seatbelt profile
// generated from its Policy (seatbelt.go) — the partial level: the files
// and the network as on Linux, signals and process information scoped to
// the sandbox; but no pid namespace (a daemonised straggler that drops the
// job's tag can outlive a killed aq: the supervisor stops what keeps it)
// and no cgroups (docs/sandbox.md, docs/platforms.md — not yet run on a
// Mac).

// sandboxExec is the launcher, by absolute path (never found on PATH).
const sandboxExec = "/usr/bin/sandbox-exec"

type hostPlatform struct{}

type jailPlatform struct{}

func (jailPlatform) home(j *Jail) string { return j.p.JobHome() }
func (jailPlatform) tmp(j *Jail) string  { return j.p.JobTmp() }

func (j *Jail) prepare() error {
	if err := makeJobDir(j.p); err != nil {
		return &StartError{Step: "make the job's directory", Err: err}
	}
	return nil
}

// probe finds whether sandbox-exec is there and takes a profile: a trial
// run of /usr/bin/true under one generated from a policy of the same
// shape as a job's.
func probe(o Options) (Report, hostPlatform) {
	none := func(why string) (Report, hostPlatform) {
		r := Report{Level: LevelNone}
		missing := make([]Missing, 0, len(Guarantees))
		for _, g := range Guarantees {
			missing = append(missing, Missing{Guarantee: g, Why: why})
		}
		r.finish(missing)
		return r, hostPlatform{}
	}
	if o.Init == "" {
		return none("no aq executable to sandbox engines for (aq's packages run in-process)")
	}
	if err := trialSeatbelt(); err != nil {
		return none(err.Error())
	}
	r := Report{Level: LevelPartial, Mechanism: "seatbelt"}
	r.finish([]Missing{
		{Guarantee: GuaranteeProcesses, Why: "Seatbelt scopes signals and process information to the sandbox, but macOS has no pid namespace to hide other processes"},
		{Guarantee: GuaranteeStragglers, Why: "no pid namespace on macOS: a daemonised process that drops the job's tag can outlive aq killed -9 (the supervisor stops those that keep it)"},
		{Guarantee: GuaranteeLimits, Why: "macOS has no cgroups"},
	})
	return r, hostPlatform{}
}

// trialSeatbelt runs /usr/bin/true under a profile of a trial policy.
func trialSeatbelt() error {
	if _, err := os.Stat(sandboxExec); err != nil {
		return fmt.Errorf("no %s: %w", sandboxExec, err)
	}
	dir, err := os.MkdirTemp("", "aq-sandbox-probe-")
	if err != nil {
		return fmt.Errorf("cannot make a directory for the trial sandbox: %w", err)
	}
	defer removeTree(dir)
	p := Policy{Worktree: filepath.Join(dir, "wt"), JobDir: filepath.Join(dir, "job"), Hidden: []string{dir}, Net: Net{ProxyPort: 1}}
	if err := makeJobDir(p); err != nil {
		return fmt.Errorf("cannot make a directory for the trial sandbox: %w", err)
	}
	var out bytes.Buffer
	cmd := exec.Command(sandboxExec, "-p", Seatbelt(p, canonical), "/usr/bin/true")
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("a trial Seatbelt sandbox did not start (%v: %s)", err, strings.TrimSpace(out.String()))
	}
	return nil
}

// Start starts cmd under sandbox-exec with the jail's profile.
func (j *Jail) Start(cmd *exec.Cmd) (process.Jailed, error) {
	if cmd.Err != nil {
		return nil, cmd.Err
	}
	if _, err := exec.LookPath(cmd.Path); err != nil {
		return nil, &StartError{Step: "find the engine", Err: err}
	}
	cmd.Env = j.Env(cmd.Env)
	cmd.Args = append([]string{sandboxExec, "-p", Seatbelt(j.p, canonical), cmd.Path}, cmd.Args[1:]...)
	cmd.Path = sandboxExec
	if err := cmd.Start(); err != nil {
		return nil, &StartError{Step: "start sandbox-exec", Err: err}
	}
	return seatbeltRun{}, nil
}

// seatbeltRun is an engine under sandbox-exec, which execs it: its end is
// the engine's.
type seatbeltRun struct{}

func (seatbeltRun) Exit(st *os.ProcessState) (int, string) {
	if ws, ok := st.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		return -1, signalName(ws.Signal())
	}
	return st.ExitCode(), ""
}

func (seatbeltRun) Close() (bool, error) { return false, nil }

// MaybeInit: the sandbox's init only exists on Linux.
func MaybeInit() (int, bool) { return 0, false }

// canonical is path with its symbolic links resolved, as Seatbelt matches
// it (/tmp is /private/tmp): the deepest part that exists is resolved,
// the rest kept.
func canonical(path string) string {
	rest := ""
	for p := filepath.Clean(path); ; p = filepath.Dir(p) {
		if r, err := filepath.EvalSymlinks(p); err == nil {
			return filepath.Join(r, rest)
		} else if !errors.Is(err, os.ErrNotExist) || p == filepath.Dir(p) {
			return path
		}
		rest = filepath.Join(filepath.Base(p), rest)
	}
}
