package local_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/aqfleet/aq/agent/config"
	"github.com/aqfleet/aq/agent/local"
	"github.com/aqfleet/aq/agent/manifest"
	"github.com/aqfleet/aq/internal/sandbox"
	"github.com/aqfleet/aq/internal/secrets"
	"github.com/aqfleet/aq/internal/testenv"
	"github.com/aqfleet/aq/job"
)

// The per-job overhead benchmark (docs/BENCHMARKS.md, "Per-job overhead").
//
// BENCH_FILES sets the size of the repository (default 1000 files); TMPDIR
// where the repositories live (the figures in the doc were taken on tmpfs and
// on ext4).

func benchFiles() int {
	if n, err := strconv.Atoi(os.Getenv("BENCH_FILES")); err == nil && n > 0 {
		return n
	}
	return 1000
}

// benchRepo makes a repository of n files of three lines each, in ten
// directories, under base.
func benchRepo(b *testing.B, base string, n int) string {
	b.Helper()
	files := make(map[string]string, n)
	for i := range n {
		files[fmt.Sprintf("pkg%d/file%05d.txt", i%10, i)] = fmt.Sprintf("file %d\nline two\nline three\n", i)
	}
	return testenv.NewRepo(b, base, "bench", files)
}

// floorJob does by hand what aq does for one job, and nothing else: `git
// worktree add` of a new branch from main, the engine command in it, `git add
// -A` and `git commit`.
func floorJob(b *testing.B, repo, wt, branch, script string) {
	env := append(os.Environ(), testenv.Identity...)
	run := func(dir, name string, args ...string) {
		cmd := exec.Command(name, args...)
		cmd.Dir, cmd.Env = dir, env
		if out, err := cmd.CombinedOutput(); err != nil {
			b.Fatalf("%s %v: %v\n%s", name, args, err, out)
		}
	}
	run(repo, "git", "worktree", "add", "--quiet", "-b", branch, wt, "main")
	run(wt, "/bin/sh", "-c", script)
	run(wt, "git", "add", "-A")
	run(wt, "git", "commit", "--quiet", "-m", "job "+branch)
}

// floorClock times floor jobs interleaved with aq's, on a repository of the
// same size, so that aq's time can be put over the floor's measured under the
// same load. Each floor job's worktree is removed after it was timed (the
// floor never reuses one; removing it keeps a large repository's copies from
// filling tmpfs).
type floorClock struct {
	repo, wts string
	script    string
	floor, aq []time.Duration
}

func newFloorClock(b *testing.B, files int, script string) *floorClock {
	return &floorClock{repo: benchRepo(b, b.TempDir(), files), wts: b.TempDir(), script: script}
}

// job runs one floor job.
func (f *floorClock) job(b *testing.B) {
	n := len(f.floor)
	wt := filepath.Join(f.wts, strconv.Itoa(n))
	t0 := time.Now()
	floorJob(b, f.repo, wt, "floor/"+strconv.Itoa(n), f.script)
	f.floor = append(f.floor, time.Since(t0))
	testenv.Git(b, f.repo, "worktree", "remove", "--force", wt)
}

// add records one aq job's time.
func (f *floorClock) add(d time.Duration) { f.aq = append(f.aq, d) }

// report adds x-floor (aq's median time over the floor's), overhead-ms (the
// difference of the medians) and floor-ms (the floor's median). Medians, not
// means: one slow file-system moment must not decide the figure.
func (f *floorClock) report(b *testing.B) {
	aq, floor := median(f.aq), median(f.floor)
	b.ReportMetric(float64(aq)/float64(floor), "x-floor")
	b.ReportMetric(float64(aq-floor)/float64(time.Millisecond), "overhead-ms/op")
	b.ReportMetric(float64(floor)/float64(time.Millisecond), "floor-ms/op")
}

func median(ds []time.Duration) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	if len(s) == 0 {
		return 0
	}
	return s[len(s)/2]
}

// BenchmarkJobOverhead compares one job through aq with the floor of doing the
// same by hand, on the same repository, with a no-op engine (`echo x > f`):
//
//	floor    git worktree add + the engine command + git add -A + git commit
//	aq       one job through the local agent in-process, as `aq run` runs each
//	         job: queue take, job and repo locks, worktree, engine under the
//	         process layer, WIP checkpoint, result commit, diffstat, queue
//	         record. Reports x-floor (aq's median over the floor's),
//	         overhead-ms/op (the difference) and floor-ms/op, floor jobs being
//	         run interleaved (untimed) in the same benchmark.
//	aq-once  `aq run --once` as a process per job: all of the above plus
//	         process start, configuration, capability detection (tool probes)
//	         and orphan recovery. Also reports x-floor.
//
// Each of aq and aq-once has two cases: first, the first job on a repository
// (no worktree of an earlier job exists: they are all removed, untimed,
// before each job), and warm, every later job (one job runs untimed before
// the timer starts). Submitting the job is not timed: the floor has no queue.
//
// BENCH_FILES sets the repository's size (default 1000; the figures in
// docs/BENCHMARKS.md also use 30000 and 100000, which take minutes and are
// only run when asked).
func BenchmarkJobOverhead(b *testing.B) {
	benchOverhead(b, "echo x > f")
}

// BenchmarkJobOverheadSlowEngine is BenchmarkJobOverhead with an engine that
// takes a second (`sleep 1.1; echo x > f`), as every real one does: git then
// no longer re-hashes every freshly checked-out file (their timestamps are no
// longer in the same second as the index's), which is what a no-op engine
// makes both sides pay. overhead-ms/op is the figure to read.
func BenchmarkJobOverheadSlowEngine(b *testing.B) {
	benchOverhead(b, "sleep 1.1; echo x > f")
}

func benchOverhead(b *testing.B, script string) {
	n := benchFiles()
	front := "repo: bench\nengine: script\nship: none\nscript: " + strconv.Quote(script)
	b.Run("floor", func(b *testing.B) {
		root := b.TempDir()
		repo := benchRepo(b, root, n)
		b.ResetTimer()
		for i := range b.N {
			wt := filepath.Join(root, "wt", strconv.Itoa(i))
			floorJob(b, repo, wt, "floor/"+strconv.Itoa(i), script)
			b.StopTimer()
			testenv.Git(b, repo, "worktree", "remove", "--force", wt)
			b.StartTimer()
		}
	})
	for _, warm := range []bool{false, true} {
		name := map[bool]string{false: "first", true: "warm"}[warm]
		b.Run("aq/"+name, func(b *testing.B) {
			h := testenv.NewHome(b)
			repo := benchRepo(b, h.RepoBase, n)
			floor := newFloorClock(b, n, script)
			a := newAgent(b, h)
			ctx := context.Background()
			if warm {
				submit(b, a, "bench-warmup", front)
				if _, err := a.RunOne(ctx); err != nil {
					b.Fatal(err)
				}
			}
			b.ResetTimer()
			for i := range b.N {
				b.StopTimer()
				submit(b, a, "bench-"+strconv.Itoa(i), front)
				if !warm {
					removeWorktrees(b, repo, h.Dir)
				}
				floor.job(b)
				b.StartTimer()
				t0 := time.Now()
				res, err := a.RunOne(ctx)
				floor.add(time.Since(t0))
				if err != nil || res.Stage != job.Testing || res.Outcome.Commit == "" {
					b.Fatalf("job %d: err %v, result %+v", i, err, res)
				}
			}
			floor.report(b)
		})
		b.Run("aq-once/"+name, func(b *testing.B) {
			h := testenv.NewHome(b)
			repo := benchRepo(b, h.RepoBase, n)
			floor := newFloorClock(b, n, script)
			a := newAgent(b, h)
			h.Command(b, "version") // build the binary outside the timer
			if warm {
				submit(b, a, "bench-warmup", front)
				if out, err := h.Command(b, "run", "--once").CombinedOutput(); err != nil {
					b.Fatalf("aq run --once: %v\n%s", err, out)
				}
			}
			b.ResetTimer()
			for i := range b.N {
				b.StopTimer()
				submit(b, a, "bench-"+strconv.Itoa(i), front)
				if !warm {
					removeWorktrees(b, repo, h.Dir)
				}
				floor.job(b)
				cmd := h.Command(b, "run", "--once")
				b.StartTimer()
				t0 := time.Now()
				out, err := cmd.CombinedOutput()
				floor.add(time.Since(t0))
				if err != nil {
					b.Fatalf("aq run --once: %v\n%s", err, out)
				}
			}
			floor.report(b)
		})
	}
}

// removeWorktrees removes every worktree of repo under home (the jobs' and
// any kept for reuse), so that the next job is a repository's first.
func removeWorktrees(b *testing.B, repo, home string) {
	b.Helper()
	prefix := filepath.Join(home, "worktrees") + string(filepath.Separator)
	for _, line := range strings.Split(testenv.Git(b, repo, "worktree", "list", "--porcelain"), "\n") {
		if p, ok := strings.CutPrefix(line, "worktree "); ok && strings.HasPrefix(p, prefix) {
			testenv.Git(b, repo, "worktree", "remove", "--force", p)
		}
	}
}

// submit enqueues a manifest through the agent's queue, as `aq submit` does.
// The job's id is testenv.ID(name).
func submit(tb testing.TB, a *local.Agent, name, front string) {
	tb.Helper()
	path := testenv.Manifest(tb, tb.TempDir(), testenv.ID(name), front)
	raw, err := os.ReadFile(path)
	if err != nil {
		tb.Fatal(err)
	}
	j, err := manifest.ParseFile(path, nil)
	if err != nil {
		tb.Fatal(err)
	}
	if _, err := a.Queue.Submit(j, raw); err != nil {
		tb.Fatal(err)
	}
}

// BenchmarkSandboxJobStart is the sandbox's cost per job
// (docs/BENCHMARKS.md, "#23 The sandbox"): one op is one warm job (a
// pooled worktree, the no-op engine, ship: none) through the local agent
// as `aq run` runs it, once sandboxed (AQ_SANDBOX=auto: full here) and once
// unsandboxed (AQ_SANDBOX=off), interleaved so both meet the same load,
// each with the test binary as aq (the sandbox's init, the engine's
// supervisor). It reports each side's p50 and p99 in ms and what the
// sandbox adds at both: the whole of it — the job's directory, the
// engine's and verify's sandboxes, their removal.
func BenchmarkSandboxJobStart(b *testing.B) {
	exe, err := os.Executable()
	if err != nil {
		b.Fatal(err)
	}
	front := "repo: bench\nengine: script\nship: none\nverify: test -f f\nscript: \"echo x > f\""
	type side struct {
		a     *local.Agent
		times []time.Duration
	}
	mk := func(mode sandbox.Mode) *side {
		h := testenv.NewHome(b)
		benchRepo(b, h.RepoBase, benchFiles())
		cfg := &config.Config{Home: h.Dir, RepoBase: h.RepoBase, KillGrace: 200 * time.Millisecond, Poll: time.Second,
			WorktreePool: 1, Supervisor: exe, Sandbox: mode}
		a, err := local.New(cfg, testLogger(b), secrets.FromEnviron(), local.Parts{})
		if err != nil {
			b.Fatal(err)
		}
		s := &side{a: a}
		submit(b, a, "warm-"+string(mode), front) // the pool's worktree, untimed
		if _, err := a.RunOne(context.Background()); err != nil {
			b.Fatal(err)
		}
		return s
	}
	sides := map[sandbox.Mode]*side{sandbox.ModeAuto: mk(sandbox.ModeAuto), sandbox.ModeOff: mk(sandbox.ModeOff)}
	if lvl := sides[sandbox.ModeAuto].a.Runner.Sandbox.Level(); lvl != sandbox.LevelFull {
		b.Skipf("this host sandboxes at level %s, not full", lvl)
	}
	b.ResetTimer()
	for i := range b.N {
		order := []sandbox.Mode{sandbox.ModeAuto, sandbox.ModeOff}
		if i%2 == 1 {
			order[0], order[1] = order[1], order[0]
		}
		for _, mode := range order {
			s := sides[mode]
			b.StopTimer()
			submit(b, s.a, "sb-"+string(mode)+"-"+strconv.Itoa(i), front)
			b.StartTimer()
			t0 := time.Now()
			res, err := s.a.RunOne(context.Background())
			s.times = append(s.times, time.Since(t0))
			if err != nil || res.Stage != job.Testing && res.Stage != job.Review {
				b.Fatalf("%s job %d: err %v, result %+v", mode, i, err, res)
			}
		}
	}
	b.StopTimer()
	ms := func(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
	on, off := sides[sandbox.ModeAuto].times, sides[sandbox.ModeOff].times
	b.ReportMetric(ms(percentile(off, 50)), "off-p50-ms")
	b.ReportMetric(ms(percentile(off, 99)), "off-p99-ms")
	b.ReportMetric(ms(percentile(on, 50)), "sandboxed-p50-ms")
	b.ReportMetric(ms(percentile(on, 99)), "sandboxed-p99-ms")
	b.ReportMetric(ms(percentile(on, 50)-percentile(off, 50)), "added-p50-ms")
	b.ReportMetric(ms(percentile(on, 99)-percentile(off, 99)), "added-p99-ms")
}

// percentile is the p-th percentile of ds (nearest rank).
func percentile(ds []time.Duration, p int) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	if len(s) == 0 {
		return 0
	}
	i := max((len(s)*p+99)/100, 1)
	return s[i-1]
}
