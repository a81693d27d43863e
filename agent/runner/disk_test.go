//go:build unix

package runner_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/aqfleet/aq/agent/runner"
	"github.com/aqfleet/aq/internal/testenv"
	"github.com/aqfleet/aq/job"
)

// diskWriter writes 96 files of 1 MiB in its worktree, then says it is
// done.
const diskWriter = `i=0; while [ $i -lt 96 ]; do head -c 1048576 /dev/urandom > big-$i.bin; i=$((i+1)); done
echo done > result.txt`

// TestDiskBudgetStopsTheWriter (#32): an engine writing 96 MiB at a 16 MiB
// budget.disk is stopped, the job fails disk_exceeded, its files are
// removed from the worktree and no checkpoint holds them; without the
// budget the same engine writes all 96 MiB and succeeds (what it would
// have taken).
func TestDiskBudgetStopsTheWriter(t *testing.T) {
	testenv.Slow(t, "runs whole jobs with real git, processes and waits")
	for _, tc := range []struct {
		name string
		disk int64
	}{
		{"budget", 16 << 20},
		{"unbounded", 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			f := newFixture(t)
			f.r.Cfg.DiskReserve = 1 << 20 // far below this host's free space: never the cause
			j := f.job("disk-"+tc.name, diskWriter)
			j.Budget.Disk = tc.disk
			out := f.run(context.Background(), j, runner.Options{})
			wt := filepath.Join(f.home.Dir, "worktrees", "app", j.ID)
			left, _ := filepath.Glob(filepath.Join(wt, "big-*.bin"))
			if tc.disk == 0 {
				files, _ := testenv.GitErr(f.repo, "ls-tree", "--name-only", out.Commit)
				if out.Reason != "" || strings.Count(files, "big-") != 96 {
					t.Fatalf("without a budget: reason %q, %d files of 96 in its commit", out.Reason, strings.Count(files, "big-"))
				}
				return
			}
			if out.Reason != job.ReasonDiskExceeded || !strings.Contains(out.Detail, "over its disk budget of 16 MiB") {
				t.Fatalf("reason %q detail %q, want disk_exceeded", out.Reason, out.Detail)
			}
			if len(left) != 0 || testenv.Exists(filepath.Join(wt, "result.txt")) {
				t.Errorf("the oversized tree's files are still in the worktree: %d", len(left))
			}
			if got, _ := testenv.GitErr(f.repo, "ls-tree", "-r", "--name-only", job.WIPBranch(j.ID)); strings.Contains(got, "big-") {
				t.Errorf("a checkpoint holds the oversized tree: %s", got)
			}
		})
	}
}

// TestDiskReserve (#32): a run whose writes take the host's free space
// below AQ_DISK_RESERVE is stopped disk_exceeded, whatever its own budget
// (here none). The reserve is 32 MiB under the free space at the start: the
// writer's 96 MiB cross it (a host below the reserve without the job's
// writes is the host's problem: TestWireFullDiskIsTheHosts).
func TestDiskReserve(t *testing.T) {
	testenv.Slow(t, "runs whole jobs with real git, processes and waits")
	f := newFixture(t)
	var st syscall.Statfs_t
	if err := syscall.Statfs(f.home.RepoBase, &st); err != nil {
		t.Fatal(err)
	}
	f.r.Cfg.DiskReserve = int64(st.Bavail)*int64(st.Bsize) - 32<<20
	out := f.run(context.Background(), f.job("disk-reserve", diskWriter), runner.Options{})
	if out.Reason != job.ReasonDiskExceeded || !strings.Contains(out.Detail, "AQ_DISK_RESERVE") {
		t.Fatalf("reason %q detail %q, want disk_exceeded naming AQ_DISK_RESERVE", out.Reason, out.Detail)
	}
	if _, err := os.Stat(filepath.Join(f.home.Dir, "worktrees", "app", testenv.ID("disk-reserve"), "result.txt")); err == nil {
		t.Error("the writer ran to its end")
	}
}
