package runner

import (
	"context"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/aqfleet/aq/job"
)

// The disk budget (#32; docs/sandbox.md, "Limits"): while the engine runs,
// what the job's run adds to the disk — its worktree's growth since the
// engine started, its sandbox directory (home, tmp, state, cache
// overlays) — is counted in allocated blocks, by a walk of those trees
// every DiskEvery; past the job's budget (budget.disk, else
// AQ_JOB_DISK_MAX), or when the free space of $AQ_HOME's file system falls
// below AQ_DISK_RESERVE (shared by every slot: checked with statfs, which
// is cheap, at every tick), the engine is stopped and the job fails
// disk_exceeded; no checkpoint of the oversized tree is taken and its
// files are removed (checkpoint, diskExceeded).

// DiskEvery is how often the disk watch looks: a writer at 1 GB/s is
// stopped within about a quarter of a second's writing (plus one walk)
// past its budget. docs/BENCHMARKS.md has what a walk costs.
var DiskEvery = 250 * time.Millisecond

// diskWatch is one engine run's disk watch.
type diskWatch struct {
	trees    []string // the worktree first
	base     int64    // the worktree's allocated bytes when the engine started
	budget   int64    // 0: none
	reserve  int64    // 0: none
	statPath string   // the file system the reserve is kept on
	walks    int
	used     int64 // the last count
}

// diskBudget is the job's disk budget: its manifest's, else the factory's.
func (ru *run) diskBudget() int64 {
	if ru.j.Budget.Disk > 0 {
		return ru.j.Budget.Disk
	}
	return ru.r.Cfg.JobDiskMax
}

// startDiskWatch watches the run's disk until the returned stop; over the
// budget or the reserve it stops the engine through stopEngine.
func (ru *run) startDiskWatch(ctx context.Context, stopEngine context.CancelCauseFunc) (stop func()) {
	w := &diskWatch{budget: ru.diskBudget(), reserve: ru.r.Cfg.DiskReserve, statPath: ru.r.Cfg.Home}
	if ru.wtPath == "" || (w.budget <= 0 && w.reserve <= 0) {
		return func() {}
	}
	w.trees = []string{ru.wtPath}
	if ru.jail != nil {
		w.trees = append(w.trees, ru.jail.Policy().JobDir)
	}
	w.base = allocated(ru.wtPath)
	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		t := time.NewTicker(DiskEvery)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			if why := w.check(); why != "" {
				ru.log.Warn("the job's disk use is over its budget: stopping the engine", "why", why)
				stopEngine(job.Stop(job.ReasonDiskExceeded, why))
				return
			}
		}
	}()
	return func() {
		cancel()
		wg.Wait()
		ru.log.Debug("disk watch", "walks", w.walks, "used", w.used, "budget", w.budget)
	}
}

// check says why the run is over its disk ("" when it is not).
func (w *diskWatch) check() string {
	below := int64(-1) // the free space when it is below the reserve
	if w.reserve > 0 {
		if free, ok := freeSpace(w.statPath); ok && free < w.reserve {
			below = free
		}
	}
	if w.budget <= 0 && below < 0 {
		return ""
	}
	w.walks++
	used := allocated(w.trees[0]) - w.base
	for _, t := range w.trees[1:] {
		used += allocated(t)
	}
	w.used = used
	// Below the reserve, a run whose own writes took the host there is
	// stopped: without them the host would be above it. A host that was
	// below the reserve anyway (full for reasons of its own) is the host's
	// problem, not this job's: its writes fail and the job is
	// host_unavailable, as before the reserve (TestWireFullDiskIsTheHosts).
	if below >= 0 && used > 0 && below+used >= w.reserve {
		return fmt.Sprintf("the host's free space (%d MiB) fell below AQ_DISK_RESERVE (%d MiB) while the job's run wrote %d MiB", below>>20, w.reserve>>20, used>>20)
	}
	if w.budget > 0 && used > w.budget {
		return fmt.Sprintf("the job's run wrote %d MiB, over its disk budget of %d MiB (budget.disk, AQ_JOB_DISK_MAX)", used>>20, w.budget>>20)
	}
	return ""
}

// allocated is the allocated bytes of the files below root (st_blocks,
// hard links counted once; symlinks not followed).
func allocated(root string) int64 {
	var n int64
	seen := map[[2]uint64]bool{}
	_ = filepath.WalkDir(root, func(_ string, d fs.DirEntry, err error) error {
		if err != nil {
			return nil // gone meanwhile, or unreadable: not counted
		}
		info, err := d.Info()
		if err != nil {
			return nil
		}
		blocks, key, linked := allocatedOf(info)
		if linked {
			if seen[key] {
				return nil
			}
			seen[key] = true
		}
		n += blocks
		return nil
	})
	return n
}

// diskExceeded removes what a run over its disk budget wrote in its
// worktree — its untracked files, and tracked ones back to HEAD — instead
// of checkpointing it: the oversized tree is neither committed nor pushed.
func (ru *run) diskExceeded(ctx context.Context) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
	defer cancel()
	for _, args := range [][]string{{"reset", "-q", "--hard", "HEAD"}, {"clean", "-ffdxq"}} {
		if _, err := ru.r.Git.Run(ctx, ru.wtPath, args...); err != nil {
			ru.log.Warn("cannot remove the files of a job over its disk budget", "worktree", ru.wtPath, "err", err)
			_ = os.RemoveAll(ru.wtPath) // the worktree is made afresh for the next attempt
			return
		}
	}
}
