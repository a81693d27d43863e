//go:build !linux && !darwin

package sandbox

import (
	"errors"
	"os/exec"
	"runtime"

	"github.com/aqfleet/aq/internal/process"
)

// hostPlatform and jailPlatform hold nothing here: no sandbox starts on
// this platform (noSandboxWhy; docs/sandbox.md).
type hostPlatform struct{}

type jailPlatform struct{}

func (jailPlatform) home(j *Jail) string { return j.p.JobHome() }
func (jailPlatform) tmp(j *Jail) string  { return j.p.JobTmp() }

func (j *Jail) prepare() error { return makeJobDir(j.p) }

// probe: nothing to enforce with on this platform.
func probe(o Options) (Report, hostPlatform) {
	r := Report{Level: LevelNone}
	why := noSandboxWhy
	missing := make([]Missing, 0, len(Guarantees))
	for _, g := range Guarantees {
		missing = append(missing, Missing{Guarantee: g, Why: why})
	}
	r.finish(missing)
	return r, hostPlatform{}
}

// Start is never reached: the level is none, so no Jail exists.
func (j *Jail) Start(cmd *exec.Cmd) (process.Jailed, error) {
	return nil, &StartError{Step: "start", Err: errors.New("no sandbox on " + runtime.GOOS)}
}

// MaybeInit: a sandbox's init only exists on Linux.
func MaybeInit() (int, bool) { return 0, false }
