//go:build !unit

package limits

import (
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/aqfleet/aq/cmd/aq/clitest"
	"github.com/aqfleet/aq/internal/sandbox"
	"github.com/aqfleet/aq/internal/testenv"
	"github.com/aqfleet/aq/job"
)

// The hostile-engine suite's limits (#32 item 4): a real sandboxed job
// whose engine takes what it can — memory, processes — is bounded by the
// factory's limits, each case run again without the limit to show what it
// would have taken; the factory then runs a plain job in the same AQ_HOME.

// limitsCaps is the part of aq caps --json limitsHome reads.
type limitsCaps struct {
	Sandbox *struct {
		Holds   []sandbox.Guarantee `json:"holds"`
		Missing []sandbox.Missing   `json:"missing"`
	} `json:"sandbox"`
}

// limitsHome is binHome on a host whose memory and process limits hold
// (cgroup v2 delegated, or v1 writable: root on this machine).
func limitsHome(t *testing.T) *testenv.Home {
	t.Helper()
	clitest.FullHost(t)
	h := clitest.BinHome(t)
	var caps limitsCaps
	r := h.Run(t, "caps", "--json")
	if r.Code != 0 || json.Unmarshal([]byte(r.Stdout), &caps) != nil || caps.Sandbox == nil {
		t.Fatalf("aq caps --json: %s", r)
	}
	holds := false
	for _, g := range caps.Sandbox.Holds {
		holds = holds || g == "limits"
	}
	if !holds {
		if _, err := os.Stat("/sys/fs/cgroup/memory/memory.limit_in_bytes"); err == nil && os.Geteuid() == 0 {
			t.Fatalf("root on a cgroup v1 host and the limits do not hold: %+v", caps.Sandbox.Missing)
		}
		t.Skipf("the limits cannot hold here: %+v", caps.Sandbox.Missing)
	}
	h.Env = append(h.Env, "AQ_WORKTREE_POOL=0")
	h.Repo(t, "app", map[string]string{"README.md": "app\n"})
	return h
}

// pythonPath is the host's python3 the sandboxed engine allocates and
// forks with (the sandbox shows /usr).
func pythonPath(t *testing.T) string {
	t.Helper()
	if _, err := os.Stat("/usr/bin/python3"); err != nil {
		t.Skip("no /usr/bin/python3 for the engine to allocate and fork with")
	}
	return "/usr/bin/python3"
}

// plainJobAfter: the factory runs a plain job in the same AQ_HOME after a
// hostile one, and ships it.
func plainJobAfter(t *testing.T, h *testenv.Home, name string) {
	t.Helper()
	h.Submit(t, name, clitest.ScriptJob("app", "echo plain > plain-"+name+".txt", "ship: branch"))
	if r := h.Run(t, "run", "--once"); r.Code != 0 {
		t.Fatalf("the plain job after the hostile one: %s", r)
	}
	if v := show(t, h, name); v.State.Stage != job.Shipped {
		t.Fatalf("the plain job after the hostile one is %s (%s), want shipped", v.State.Stage, v.Reason)
	}
}

// TestHostileMemory: an engine that allocates 1 GiB at a 128 MiB limit is
// killed by the kernel, and the job fails out_of_memory (not retried past
// its budget: retry max 0); without the limit (AQ_SANDBOX_MEMORY=0) the
// same job takes its whole GiB and ships — what it would have taken.
func TestHostileMemory(t *testing.T) {
	h := limitsHome(t)
	script := "set -e\n" + pythonPath(t) + ` -c 'b = b"\x01" * (1 << 30); print("ALLOCATED", len(b) >> 20)'` + "\necho done > result.txt"
	base := append([]string(nil), h.Env...)

	h.Env = append(base, "AQ_SANDBOX_MEMORY=128MiB")
	h.Submit(t, "oom", clitest.ScriptJob("app", script, "ship: branch", "retry: {max: 0}"))
	r := h.Run(t, "run", "--once")
	v := show(t, h, "oom")
	if v.State.Stage != job.DeadLetter || v.Reason != job.ReasonOutOfMemory {
		t.Fatalf("at a 128 MiB limit the job is %s (%s), want dead_letter (retry max 0 spent) out_of_memory; aq: %s", v.State.Stage, v.Reason, r)
	}
	if out := testenv.ReadFile(t, filepath.Join(h.Dir, "logs", testenv.ID("oom"), "stdout.log")); regexp.MustCompile(`ALLOCATED`).MatchString(out) {
		t.Errorf("the engine allocated its GiB at a 128 MiB limit: %q", out)
	}

	h.Env = append(base, "AQ_SANDBOX_MEMORY=0")
	h.Submit(t, "unbounded", clitest.ScriptJob("app", script, "ship: branch", "retry: {max: 0}"))
	if r := h.Run(t, "run", "--once"); r.Code != 0 {
		t.Fatalf("without a memory limit: %s", r)
	}
	if out := testenv.ReadFile(t, filepath.Join(h.Dir, "logs", testenv.ID("unbounded"), "stdout.log")); !regexp.MustCompile(`ALLOCATED 1024`).MatchString(out) {
		t.Errorf("without a limit the engine did not take its GiB (else the limited run proves nothing): %q", out)
	}

	h.Env = base // the defaults: the host's memory divided by the slots
	plainJobAfter(t, h, "plain-after-oom")
}

// TestHostileProcesses: an engine that forks 200 sleepers at a 64-process
// limit gets fewer than 64 (the rest of its forks fail) and the sandbox
// ends them with it; without the limit (AQ_SANDBOX_PIDS=0) it gets all
// 200 — what it would have taken.
func TestHostileProcesses(t *testing.T) {
	h := limitsHome(t)
	script := pythonPath(t) + ` -c '
import os, time
n = 0
for i in range(200):
    try:
        pid = os.fork()
    except OSError:
        break
    if pid == 0:
        time.sleep(120)
        os._exit(0)
    n += 1
print("FORKED", n, flush=True)
'
echo done > result.txt`
	base := append([]string(nil), h.Env...)
	forked := func(name string) int {
		t.Helper()
		out := testenv.ReadFile(t, filepath.Join(h.Dir, "logs", testenv.ID(name), "stdout.log"))
		m := regexp.MustCompile(`FORKED (\d+)`).FindStringSubmatch(out)
		if m == nil {
			t.Fatalf("%s: the engine did not say how many it forked: %q", name, out)
		}
		n, _ := strconv.Atoi(m[1])
		return n
	}
	for _, tc := range []struct {
		name, pids string
		ok         func(n int) bool
		want       string
	}{
		{"forks", "64", func(n int) bool { return n > 0 && n < 64 }, "fewer than 64"},
		{"forks-unbounded", "0", func(n int) bool { return n == 200 }, "all 200 (else the limited run proves nothing)"},
	} {
		h.Env = append(base, "AQ_SANDBOX_PIDS="+tc.pids)
		h.Submit(t, tc.name, clitest.ScriptJob("app", script, "ship: branch", "retry: {max: 0}"))
		if r := h.Run(t, "run", "--once"); r.Code != 0 {
			t.Fatalf("%s: %s", tc.name, r)
		}
		if n := forked(tc.name); !tc.ok(n) {
			t.Errorf("AQ_SANDBOX_PIDS=%s: the engine forked %d, want %s", tc.pids, n, tc.want)
		}
	}
	h.Env = base // the defaults: 4096 processes
	plainJobAfter(t, h, "plain-after-forks")
}

// TestHostileOutputBurst: an engine that bursts 300 MB on stdout has its
// stored log bounded by AQ_LOG_MAX (here 4MiB): the head (the run's header
// first), one gap record saying how many bytes were left out — about the
// 300 MB the log would have taken whole before #32 — and the tail, the
// burst's last line at its end; no tail segment is left beside it.
func TestHostileOutputBurst(t *testing.T) {
	h := limitsHome(t)
	h.Env = append(h.Env, "AQ_LOG_MAX=4MiB")
	const burst = 300_000_000
	script := "yes 'hostile output burst ........................................' | head -c " + strconv.Itoa(burst) + "\necho\necho last-line-of-the-burst\necho done > result.txt"
	h.Submit(t, "burst", clitest.ScriptJob("app", script, "ship: branch", "retry: {max: 0}"))
	if r := h.Run(t, "run", "--once"); r.Code != 0 {
		t.Fatalf("the bursting job: %s", r)
	}
	logPath := filepath.Join(h.Dir, "logs", testenv.ID("burst"), "stdout.log")
	st, err := os.Stat(logPath)
	if err != nil {
		t.Fatal(err)
	}
	if st.Size() > 4<<20+4096 {
		t.Fatalf("stdout.log stored %d bytes at AQ_LOG_MAX=4MiB", st.Size())
	}
	out := testenv.ReadFile(t, logPath)
	m := regexp.MustCompile(`\n=== aq: (\d+) bytes of output left out here`).FindStringSubmatch(out)
	if !strings.HasPrefix(out, "=== aq job "+testenv.ID("burst")) || m == nil || !strings.HasSuffix(out, "last-line-of-the-burst\n") {
		t.Fatalf("stdout.log is not head, gap record, tail (%d bytes): %.300q", len(out), out)
	}
	if dropped, _ := strconv.Atoi(m[1]); dropped < burst-(4<<20) {
		t.Errorf("the gap record says %d bytes left out, want about %d (what the log would have taken whole)", dropped, burst)
	}
	if left, _ := filepath.Glob(logPath + ".tail-*"); len(left) != 0 {
		t.Errorf("tail segments left: %q", left)
	}
	plainJobAfter(t, h, "plain-after-burst")
}

// TestHostileDiskWriter: an engine that writes 512 MiB in its worktree at
// budget.disk: 64MiB is stopped, the job fails disk_exceeded, no branch or
// WIP ref holds the files; without the budget the same engine's 128 MiB
// are committed and shipped (what it would have taken).
func TestHostileDiskWriter(t *testing.T) {
	h := limitsHome(t)
	writer := func(mib int) string {
		return "i=0; while [ $i -lt " + strconv.Itoa(mib) + " ]; do head -c 1048576 /dev/urandom > big-$i.bin; i=$((i+1)); done\necho done > result.txt"
	}
	h.Submit(t, "disk-hog", clitest.ScriptJob("app", writer(512), "ship: branch", "retry: {max: 0}", "budget: { disk: 64MiB }"))
	r := h.Run(t, "run", "--once")
	v := show(t, h, "disk-hog")
	if v.State.Stage != job.DeadLetter || v.Reason != job.ReasonDiskExceeded {
		t.Fatalf("the disk writer is %s (%s), want dead_letter (retry max 0 spent) disk_exceeded; aq: %s", v.State.Stage, v.Reason, r)
	}
	repo := filepath.Join(h.RepoBase, "app")
	for _, ref := range []string{job.JobBranch(testenv.ID("disk-hog")), job.WIPBranch(testenv.ID("disk-hog"))} {
		if got, _ := testenv.GitErr(repo, "ls-tree", "-r", "--name-only", ref); strings.Contains(got, "big-") {
			t.Errorf("%s holds the oversized tree", ref)
		}
	}
	h.Submit(t, "disk-unbounded", clitest.ScriptJob("app", writer(128), "ship: branch", "retry: {max: 0}"))
	if r := h.Run(t, "run", "--once"); r.Code != 0 {
		t.Fatalf("without a disk budget: %s", r)
	}
	if got := testenv.Git(t, repo, "ls-tree", "-r", "--name-only", job.JobBranch(testenv.ID("disk-unbounded"))); strings.Count(got, "big-") != 128 {
		t.Errorf("without a budget the writer's 128 MiB did not ship: %d files", strings.Count(got, "big-"))
	}
	plainJobAfter(t, h, "plain-after-disk")
}
