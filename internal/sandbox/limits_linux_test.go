package sandbox_test

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/aqfleet/aq/internal/sandbox"
	"github.com/aqfleet/aq/internal/testenv"
)

// limitsHost opens a full sandbox with limits, and fails where the limits
// should hold and do not: as root on a host with the cgroup v1 memory
// hierarchy mounted (this development machine), or where cgroup v2 is
// delegated; elsewhere it skips, saying why.
func limitsHost(t *testing.T, l sandbox.Limits) *sandbox.Host {
	t.Helper()
	h := sandbox.Open(sandbox.Options{Init: self(t), Mode: sandbox.ModeAuto, Limits: l})
	if h.Level() != sandbox.LevelFull {
		t.Skipf("no full sandbox here: %s", h.Report().MissingLine())
	}
	r := h.Report()
	if !r.Has(sandbox.GuaranteeLimits) {
		if _, err := os.Stat("/sys/fs/cgroup/memory/memory.limit_in_bytes"); err == nil && os.Geteuid() == 0 {
			t.Fatalf("root on a cgroup v1 host, and the limits do not hold: %s", r.CgroupWhy)
		}
		t.Skipf("the limits cannot hold here: %s", r.CgroupWhy)
	}
	if r.LimitsBy == "" || r.Cgroup == "" {
		t.Errorf("the report does not say how the limits hold: %+v", r)
	}
	return h
}

// python is the host's python3, which the sandbox shows (/usr).
func python(t *testing.T) string {
	t.Helper()
	for _, p := range []string{"/usr/bin/python3", "/usr/local/bin/python3"} {
		if _, err := os.Stat(p); err == nil {
			return p
		}
	}
	t.Skip("no python3 in /usr to allocate and fork with")
	return ""
}

// TestMemoryLimitHolds: an engine that allocates 256 MiB in a sandbox
// limited to 64 MiB is killed by the kernel, and the run says it was for
// memory (out_of_memory); the same allocation with no limit gets through
// (what it would have taken: the whole 256 MiB), which is what the limit
// stops.
func TestMemoryLimitHolds(t *testing.T) {
	testenv.Slow(t, "starts real sandboxes under a cgroup limit or many escapes")
	py := python(t)
	script := py + ` -c 'b = b"\x01" * (256 << 20); print("ALLOCATED", len(b) >> 20)'`
	for _, tc := range []struct {
		name   string
		limits sandbox.Limits
		oom    bool
	}{
		{"limited", sandbox.Limits{MemoryBytes: 64 << 20}, true},
		{"unlimited", sandbox.Limits{}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var h *sandbox.Host
			if tc.oom {
				h = limitsHost(t, tc.limits)
			} else {
				h = openFull(t)
			}
			l := makeLayout(t, t.TempDir())
			j, err := h.Jail(l.policy)
			if err != nil {
				t.Fatal(err)
			}
			defer j.Remove()
			out, res, err := runScript(context.Background(), j, l, script, "0", "0", nonce(t), nil)
			if err != nil {
				t.Fatal(err)
			}
			got := strings.Contains(out, "ALLOCATED 256")
			if tc.oom && (got || !res.OOM || res.Signal != "SIGKILL") {
				t.Errorf("at a 64 MiB limit: out %q, oom %v, signal %q; want killed for memory", out, res.OOM, res.Signal)
			}
			if !tc.oom && (!got || res.OOM || res.ExitCode != 0) {
				t.Errorf("unlimited: out %q, oom %v, exit %d; want the 256 MiB allocated (else the limited run proves nothing)", out, res.OOM, res.ExitCode)
			}
		})
	}
}

// TestPidsLimitHolds: an engine that forks 200 sleepers in a sandbox
// limited to 64 processes gets fewer than 64 (the rest of its forks fail);
// unlimited it gets all 200.
func TestPidsLimitHolds(t *testing.T) {
	testenv.Slow(t, "starts real sandboxes under a cgroup limit or many escapes")
	py := python(t)
	script := py + ` -c '
import os, time
n = 0
for i in range(200):
    try:
        pid = os.fork()
    except OSError:
        break
    if pid == 0:
        time.sleep(60)
        os._exit(0)
    n += 1
print("FORKED", n, flush=True)
'`
	for _, tc := range []struct {
		name   string
		limits sandbox.Limits
	}{
		{"limited", sandbox.Limits{Pids: 64}},
		{"unlimited", sandbox.Limits{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var h *sandbox.Host
			if tc.limits.Pids > 0 {
				h = limitsHost(t, tc.limits)
			} else {
				h = openFull(t)
			}
			l := makeLayout(t, t.TempDir())
			j, err := h.Jail(l.policy)
			if err != nil {
				t.Fatal(err)
			}
			defer j.Remove()
			out, _, err := runScript(context.Background(), j, l, script, "0", "0", nonce(t), nil)
			if err != nil {
				t.Fatal(err)
			}
			f := strings.Fields(out)
			if len(f) != 2 || f[0] != "FORKED" {
				t.Fatalf("out %q", out)
			}
			n, _ := strconv.Atoi(f[1])
			if tc.limits.Pids > 0 && (n >= 64 || n == 0) {
				t.Errorf("at a 64-process limit the engine forked %d", n)
			}
			if tc.limits.Pids == 0 && n != 200 {
				t.Errorf("unlimited the engine forked %d of 200 (else the limited run proves nothing)", n)
			}
		})
	}
}

// TestLimitsLeaveNoCgroup: after a limited run, the run's cgroups are
// gone.
func TestLimitsLeaveNoCgroup(t *testing.T) {
	h := limitsHost(t, sandbox.Limits{MemoryBytes: 128 << 20, Pids: 128})
	l := makeLayout(t, t.TempDir())
	j, err := h.Jail(l.policy)
	if err != nil {
		t.Fatal(err)
	}
	defer j.Remove()
	if _, _, err := runScript(context.Background(), j, l, "sleep 0.1 & wait", "0", "0", nonce(t), nil); err != nil {
		t.Fatal(err)
	}
	for _, dir := range strings.Split(h.Report().Cgroup, ", ") {
		left, _ := filepath.Glob(filepath.Join(dir, "aq-job-"+strconv.Itoa(os.Getpid())+"-*"))
		if len(left) > 0 {
			t.Errorf("cgroups left behind: %q", left)
		}
	}
}
