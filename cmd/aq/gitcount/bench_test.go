package gitcount

import (
	"os"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/aqfleet/aq/internal/testenv"
)

// BenchmarkTrivialJob times a trivial warm job's whole `aq run --once`
// (docs/BENCHMARKS.md, "#35 A lean git path"), unsandboxed and sandboxed,
// and counts its git processes. With BENCH_AQ_OLD naming another aq binary
// (built from main: `go build -o /tmp/aq-main ./cmd/aq` there), both
// binaries run alternately in one run, each job of one followed by one of
// the other, and the ratio of their medians is reported (new over old):
// the machine's load falls on both alike. One op is one job of each.
//
//	BENCH_AQ_OLD=/tmp/aq-main go test -run '^$' -bench TrivialJob -benchtime 20x ./cmd/aq/gitcount/
//
// BENCH_FILES=20000 makes the repository that many files larger: the warm
// job on a big repository (the test itself always uses one file).
func BenchmarkTrivialJob(b *testing.B) {
	bins := map[string]string{"new": testenv.BuildAQ(b)}
	if old := os.Getenv("BENCH_AQ_OLD"); old != "" {
		bins["old"] = old
	}
	for _, sb := range []string{"off", "auto"} {
		b.Run("sandbox="+sb, func(b *testing.B) {
			names := slices.Sorted(func(yield func(string) bool) {
				for n := range bins {
					if !yield(n) {
						return
					}
				}
			})
			envs := map[string]*trivial{}
			times := map[string][]time.Duration{}
			gits := map[string]int{}
			for _, n := range names {
				tr := newTrivial(b, bins[n], sb, benchFiles())
				tr.job(b) // the pooled worktree
				// Counted once, with the logging git; timed without it.
				gits[n] = len(tr.job(b))
				tr.h.Env = slices.DeleteFunc(tr.h.Env, func(kv string) bool { return len(kv) > 5 && kv[:5] == "PATH=" })
				envs[n] = tr
			}
			b.ResetTimer()
			for i := range b.N {
				order := slices.Clone(names)
				if i%2 == 1 {
					slices.Reverse(order)
				}
				for _, n := range order {
					b.StopTimer()
					tr := envs[n]
					tr.n++
					id := "bench-" + strconv.Itoa(tr.n)
					path := testenv.Manifest(b, b.TempDir(), id, "repo: tiny\nengine: script\nship: branch\nscript: \"echo x > f\"")
					if r := tr.h.Run(b, "submit", path); r.Code != 0 {
						b.Fatalf("aq submit: %s", r)
					}
					b.StartTimer()
					t0 := time.Now()
					r := tr.h.Run(b, "run", "--once")
					times[n] = append(times[n], time.Since(t0))
					if r.Code != 0 {
						b.Fatalf("%s aq run --once: %s", n, r)
					}
				}
			}
			b.StopTimer()
			for _, n := range names {
				b.ReportMetric(ms(median(times[n])), n+"-ms")
				b.ReportMetric(float64(gits[n]), "git-"+n)
			}
			if _, ok := bins["old"]; ok {
				b.ReportMetric(float64(median(times["new"]))/float64(median(times["old"])), "new/old")
			}
		})
	}
}

// benchFiles is BENCH_FILES, 0 when unset.
func benchFiles() int {
	n, _ := strconv.Atoi(os.Getenv("BENCH_FILES"))
	return max(n, 0)
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

func median(ds []time.Duration) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	if len(s) == 0 {
		return 0
	}
	return s[len(s)/2]
}
