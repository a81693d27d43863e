package worktree

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/aqfleet/aq/internal/testenv"
)

// benchRepo is a repository of 1000 files in 10 folders.
func benchRepo(b *testing.B) string {
	b.Helper()
	dir := filepath.Join(b.TempDir(), "repo")
	testenv.Git(b, "", "init", "-q", "-b", "main", dir)
	for d := 0; d < 10; d++ {
		for f := 0; f < 100; f++ {
			testenv.WriteFile(b, filepath.Join(dir, fmt.Sprintf("pkg%d", d), fmt.Sprintf("file%03d.go", f)),
				fmt.Sprintf("package pkg%d\n\n// file %d\nvar V%d = %d\n", d, f, f, f))
		}
	}
	testenv.Git(b, dir, "add", "-A")
	testenv.Git(b, dir, "commit", "-q", "-m", "init")
	return dir
}

// changeFiles modifies 90 tracked files and adds 10 untracked ones; round
// makes the content differ from the last call.
func changeFiles(b *testing.B, wt string, round int) {
	b.Helper()
	for i := 0; i < 90; i++ {
		testenv.WriteFile(b, filepath.Join(wt, fmt.Sprintf("pkg%d", i%10), fmt.Sprintf("file%03d.go", i)), "package x // round "+strconv.Itoa(round)+"\n")
	}
	for i := 0; i < 10; i++ {
		testenv.WriteFile(b, filepath.Join(wt, "new", fmt.Sprintf("n%d.txt", i)), "round "+strconv.Itoa(round)+"\n")
	}
}

// BenchmarkCheckpoint: one checkpoint of a worktree with 100 changed files
// (90 modified, 10 untracked) in a 1000-file repository.
func BenchmarkCheckpoint(b *testing.B) {
	ctx := context.Background()
	repo := benchRepo(b)
	wt := addWorktree(b, repo, "bench", "main")
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		b.StopTimer()
		changeFiles(b, wt, i)
		b.StartTimer()
		if _, err := Checkpoint(ctx, Git{}, wt, "aq/wip/bench", "wip"); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkAddRemove: create a linked worktree of a 1000-file repository and
// remove it.
func BenchmarkAddRemove(b *testing.B) {
	ctx := context.Background()
	repo := benchRepo(b)
	wt := filepath.Join(b.TempDir(), "wt")
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if err := Add(ctx, Git{}, repo, wt, "aq/job/bench", "main"); err != nil {
			b.Fatal(err)
		}
		if err := Remove(ctx, Git{}, repo, wt); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkFloor does the same work by hand with bare git commands, the floor
// the two benchmarks above are measured against: `git add -A` + `git commit`
// (which, unlike Checkpoint, writes the worktree's index and moves its
// branch), and `git worktree add` + `git worktree remove`.
func BenchmarkFloor(b *testing.B) {
	b.Run("add-commit", func(b *testing.B) {
		repo := benchRepo(b)
		wt := addWorktree(b, repo, "bench", "main")
		b.ResetTimer()
		for i := 0; i < b.N; i++ {
			b.StopTimer()
			changeFiles(b, wt, i)
			b.StartTimer()
			testenv.Git(b, wt, "add", "-A")
			testenv.Git(b, wt, "commit", "-q", "-m", "wip")
			b.StopTimer()
			testenv.Git(b, wt, "reset", "-q", "HEAD~1") // the same 100 changes again, unstaged
			b.StartTimer()
		}
	})
	b.Run("worktree-add-remove", func(b *testing.B) {
		repo := benchRepo(b)
		wt := filepath.Join(b.TempDir(), "wt")
		b.ResetTimer()
		for i := 0; i < b.N; i++ {
			testenv.Git(b, repo, "worktree", "add", "-q", "-B", "aq/job/bench", wt, "main")
			testenv.Git(b, repo, "worktree", "remove", "--force", wt)
		}
	})
}

// benchFiles is BENCH_FILES (default 1000): the size of the repository the
// periodic-checkpoint benchmark uses.
func benchFiles() int {
	if n, err := strconv.Atoi(os.Getenv("BENCH_FILES")); err == nil && n > 0 {
		return n
	}
	return 1000
}

// sizedRepo is a repository of n files in folders of 100.
func sizedRepo(b *testing.B, n int) string {
	b.Helper()
	dir := filepath.Join(b.TempDir(), "repo")
	testenv.Git(b, "", "init", "-q", "-b", "main", dir)
	for i := 0; i < n; i++ {
		p := filepath.Join(dir, fmt.Sprintf("pkg%d", i/100), fmt.Sprintf("file%03d.go", i%100))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			b.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(fmt.Sprintf("package pkg\n\n// file %d\n", i)), 0o644); err != nil {
			b.Fatal(err)
		}
	}
	testenv.Git(b, dir, "add", "-A")
	testenv.Git(b, dir, "commit", "-q", "-m", "init")
	return dir
}

// BenchmarkCheckpointPeriodic: the periodic checkpoint of a worktree of
// BENCH_FILES files in folders of 100 (`BENCH_FILES=30000 TMPDIR=/dev/shm`),
// taken as the runner takes it while an engine runs (a Checkpointer, which
// watches the worktree on Linux), when nothing changed since the last one
// (unchanged: the common case between two intervals of an engine that is
// thinking), when 10 tracked files did (changed10), and when 100 files did
// (changed: 90 modified, 10 new). exact-* is worktree.Checkpoint, the scan
// the checkpoint after the engine makes (and every checkpoint made before
// this benchmark's figures in docs/BENCHMARKS.md "after").
func BenchmarkCheckpointPeriodic(b *testing.B) {
	ctx := context.Background()
	repo := sizedRepo(b, benchFiles())
	wt := addWorktree(b, repo, "bench", "main")
	cp := &Checkpointer{Git: Git{}, Path: wt, Watch: true}
	b.Cleanup(cp.Close)
	change10 := func(i int) {
		for f := 0; f < 10; f++ {
			testenv.WriteFile(b, filepath.Join(wt, fmt.Sprintf("pkg%d", f), fmt.Sprintf("file%03d.go", f)), "package x // ten "+strconv.Itoa(i)+"\n")
		}
	}
	take := func(exact bool) {
		var err error
		if exact {
			_, err = Checkpoint(ctx, Git{}, wt, "aq/wip/bench-exact", "wip")
		} else {
			_, err = cp.Checkpoint(ctx, "aq/wip/bench", "wip")
		}
		if err != nil {
			b.Fatal(err)
		}
	}
	take(false) // the first one is a full scan, as the runner's first is
	for _, exact := range []bool{false, true} {
		prefix := map[bool]string{false: "", true: "exact-"}[exact]
		b.Run(prefix+"unchanged", func(b *testing.B) {
			take(exact)
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				take(exact)
			}
		})
		b.Run(prefix+"changed10", func(b *testing.B) {
			for i := 0; i < b.N; i++ {
				b.StopTimer()
				change10(i)
				b.StartTimer()
				take(exact)
			}
		})
		b.Run(prefix+"changed", func(b *testing.B) {
			for i := 0; i < b.N; i++ {
				b.StopTimer()
				changeFiles(b, wt, i)
				b.StartTimer()
				take(exact)
			}
		})
	}
	b.Logf("Checkpointer: %+v", cp.Stats)
}

// BenchmarkWorktreeDisk: the disk one worktree of BENCH_FILES files (folders
// of 100) takes — what each slot's running job holds, and what each pooled
// worktree keeps — as worktree.DiskUsage measures it for aq gc's
// AQ_WORKTREE_DISK_MAX: worktree-MiB (its files and git directory, with the
// checkpoint index periodic checkpoints keep), of which gitdir-MiB is the git
// directory. One op is one measurement (aq gc pays it per worktree, only
// when a ceiling is set).
func BenchmarkWorktreeDisk(b *testing.B) {
	ctx := context.Background()
	repo := sizedRepo(b, benchFiles())
	wt := addWorktree(b, repo, "disk", "main")
	cp := &Checkpointer{Git: Git{}, Path: wt, SmallIndex: -1}
	if _, err := cp.Checkpoint(ctx, "aq/wip/disk", "wip"); err != nil {
		b.Fatal(err)
	}
	admin, err := linkedGitDir(wt)
	if err != nil {
		b.Fatal(err)
	}
	var total int64
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if total, err = DiskUsage(wt); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	gitdir, _ := DiskUsage(admin)
	b.ReportMetric(float64(total)/(1<<20), "worktree-MiB")
	b.ReportMetric(float64(gitdir)/(1<<20), "gitdir-MiB")
}

// BenchmarkGitHardening is what keeping a repository's configuration from
// running anything (harden.go) costs each git command: `git rev-parse
// HEAD` in a linked worktree as git alone runs it (plain), with the
// hardening worked out from its cache (cached: the configuration files
// unchanged since the last command, the usual case), and worked out afresh
// (cold: after a change to them, one `git config --list` more). Each op
// runs the three, interleaved; the ratios are of medians of the same run.
func BenchmarkGitHardening(b *testing.B) {
	ctx := context.Background()
	repo := benchRepo(b)
	wt := addWorktree(b, repo, "bench", "main")
	// A repository as a factory's are: something planted in its
	// configuration to pin (a filter driver, a remote's upload-pack).
	testenv.Git(b, repo, "config", "filter.planted.clean", "cat")
	testenv.Git(b, repo, "config", "remote.origin.url", "/nowhere.git")
	testenv.Git(b, repo, "config", "remote.origin.uploadpack", "git-upload-pack")
	// Files changed within racyWindow are not cached: let them age.
	time.Sleep(racyWindow + 100*time.Millisecond)
	hardened := Git{ConfigDir: b.TempDir()}
	plain := Git{unhardened: true}
	run := func(g Git) time.Duration {
		start := time.Now()
		if _, err := g.Run(ctx, wt, "rev-parse", "HEAD"); err != nil {
			b.Fatal(err)
		}
		return time.Since(start)
	}
	run(hardened) // fills the cache
	var tPlain, tCached, tCold []float64
	b.ResetTimer()
	for range b.N {
		tPlain = append(tPlain, float64(run(plain).Microseconds()))
		tCached = append(tCached, float64(run(hardened).Microseconds()))
		hardenCache.Lock()
		hardenCache.m = map[string]*hardenEntry{}
		hardenCache.Unlock()
		tCold = append(tCold, float64(run(hardened).Microseconds()))
	}
	b.StopTimer()
	mp, mc, mo := medianF(tPlain), medianF(tCached), medianF(tCold)
	b.ReportMetric(mp, "plain-µs")
	b.ReportMetric(mc, "cached-µs")
	b.ReportMetric(mo, "cold-µs")
	b.ReportMetric(mc/mp, "cached-x-plain")
	b.ReportMetric(mo/mp, "cold-x-plain")
	b.ReportMetric(mc-mp, "cached-added-µs")
}

func medianF(v []float64) float64 {
	s := slices.Clone(v)
	slices.Sort(s)
	if len(s) == 0 {
		return 0
	}
	return s[len(s)/2]
}
