package selftest

import (
	"errors"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/aqfleet/aq/internal/fixture"
	"github.com/aqfleet/aq/internal/sandbox"
	"github.com/aqfleet/aq/internal/sandbox/hostile"
)

// TestSandboxChecksCanFail: the sandbox checks fail on what an escape
// leaves — a probe that worked, one that never ran, a write on the host, a
// planted hook, a connection a listener took — and skip (saying why) a
// guarantee the level does not hold at all; a run where every escape was
// denied passes. (The real sandbox's run is TestRunAllPassOrSkip's; the
// probes working without one is the hostile-engine suite's control.)
func TestSandboxChecksCanFail(t *testing.T) {
	dir := t.TempDir()
	args := hostile.Args{UserHome: filepath.Join(dir, "home"), RepoBase: filepath.Join(dir, "src"), Repo: "app", Nonce: "n" + fixture.RandomHex(3)}
	denied := func() map[string]string {
		m := map[string]string{}
		for _, p := range hostile.Escapes {
			m[p.Name] = "denied"
		}
		return m
	}
	full := sandbox.Report{Level: sandbox.LevelFull, Holds: []sandbox.Guarantee{sandbox.GuaranteeFiles, sandbox.GuaranteeNetwork, sandbox.GuaranteeProcesses, sandbox.GuaranteeStragglers}}
	partial := sandbox.Report{Level: sandbox.LevelPartial, Holds: []sandbox.Guarantee{sandbox.GuaranteeFiles},
		Missing: []sandbox.Missing{{Guarantee: sandbox.GuaranteeProcesses, Why: "no pid namespace"}}}
	for _, tc := range []struct {
		name   string
		r      sandbox.Report
		g      sandbox.Guarantee
		edit   func(run *hostileRun)
		status Status
		reason string
	}{
		{"all denied", full, sandbox.GuaranteeFiles, nil, Pass, ""},
		{"a read worked", full, sandbox.GuaranteeFiles, func(r *hostileRun) { r.probes["read_ssh_key"] = "ok" }, Fail, "read_ssh_key (ok)"},
		{"a probe never ran", full, sandbox.GuaranteeFiles, func(r *hostileRun) { delete(r.probes, "read_other_repo") }, Fail, "read_other_repo (not run)"},
		{"a write landed on the host", full, sandbox.GuaranteeFiles, func(r *hostileRun) {
			if err := fixture.WriteFile(r.args.Writes()["write_home"], "x"); err != nil {
				t.Fatal(err)
			}
		}, Fail, "write_home: a write landed on the host"},
		{"a hook planted", full, sandbox.GuaranteeFiles, func(r *hostileRun) {
			hook, _, _ := r.args.Plants()
			if err := fixture.WriteFile(hook, "#!/bin/sh"); err != nil {
				t.Fatal(err)
			}
		}, Fail, "plant_hook: a hook was planted"},
		{"a listener took a connection", full, sandbox.GuaranteeNetwork, func(r *hostileRun) { r.accepted.Add(1) }, Fail, "accepted 1 connections"},
		{"aq seen", full, sandbox.GuaranteeProcesses, func(r *hostileRun) { r.probes["see_aq"] = "ok" }, Fail, "see_aq (ok)"},
		{"aq seen at partial is no escape", partial, sandbox.GuaranteeProcesses, func(r *hostileRun) { r.probes["see_aq"] = "ok" }, Pass, "partly held at the partial level: no pid namespace"},
		{"aq signalled at partial", partial, sandbox.GuaranteeProcesses, func(r *hostileRun) { r.probes["signal_aq"] = "ok" }, Fail, "signal_aq (ok)"},
		{"none holds nothing", sandbox.Report{Level: sandbox.LevelNone}, sandbox.GuaranteeNetwork, nil, Skip, "the none level does not hold network"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a := args
			a.Nonce += strings.ReplaceAll(tc.name, " ", "-")
			run := &hostileRun{args: a, probes: denied(), accepted: new(atomic.Int64)}
			if tc.edit != nil {
				tc.edit(run)
			}
			msg, err := judgeGuarantee(tc.r, tc.r.Level, tc.g, run)
			got, reason := Pass, msg
			var se *skipError
			switch {
			case errors.As(err, &se):
				got, reason = Skip, se.reason
			case err != nil:
				got, reason = Fail, err.Error()
			}
			if got != tc.status || !strings.Contains(reason, tc.reason) {
				t.Errorf("%s %q, want %s with %q", got, reason, tc.status, tc.reason)
			}
		})
	}
}
