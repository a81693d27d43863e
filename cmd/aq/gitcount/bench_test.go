//go:build !unit

package gitcount

import (
	"maps"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/aqfleet/aq/internal/testenv"
)

// BenchmarkTrivialJob times a trivial warm job's whole `aq run --once`
// (docs/BENCHMARKS.md, "#35 A lean git path"), unsandboxed and sandboxed,
// and counts its git processes. With BENCH_AQ_OLD naming another aq binary
// (built from main: `go build -o /tmp/aq-main ./cmd/aq` there), both
// binaries run too. Every side — each binary, unsandboxed and sandboxed —
// runs one job per op, in an order that turns each op, so that the
// machine's load falls on all alike; it reports each side's median, new
// over old for each mode, and what the sandbox adds to a binary's whole
// job (sandboxed minus unsandboxed median: #35 item 2, the probe and the
// sandbox's start included).
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
	modes := []string{"off", "auto"}
	type side struct {
		bin, mode string
		tr        *trivial
		times     []time.Duration
		gits      int
	}
	var sides []*side
	for _, n := range slices.Sorted(maps.Keys(bins)) {
		for _, m := range modes {
			tr := newTrivial(b, bins[n], m, benchFiles())
			tr.job(b) // the pooled worktree
			// Counted once, with the logging git; timed without it.
			s := &side{bin: n, mode: m, tr: tr, gits: len(tr.job(b))}
			tr.h.Env = slices.DeleteFunc(tr.h.Env, func(kv string) bool { return strings.HasPrefix(kv, "PATH=") })
			sides = append(sides, s)
		}
	}
	b.ResetTimer()
	for i := range b.N {
		for k := range sides {
			s := sides[(i+k)%len(sides)]
			b.StopTimer()
			s.tr.n++
			id := "bench-" + strconv.Itoa(s.tr.n)
			path := testenv.Manifest(b, b.TempDir(), id, "repo: tiny\nengine: script\nship: branch\nscript: \"echo x > f\"")
			if r := s.tr.h.Run(b, "submit", path); r.Code != 0 {
				b.Fatalf("aq submit: %s", r)
			}
			b.StartTimer()
			t0 := time.Now()
			r := s.tr.h.Run(b, "run", "--once")
			s.times = append(s.times, time.Since(t0))
			if r.Code != 0 {
				b.Fatalf("%s %s aq run --once: %s", s.bin, s.mode, r)
			}
		}
	}
	b.StopTimer()
	med := map[string]time.Duration{}
	for _, s := range sides {
		med[s.bin+"/"+s.mode] = median(s.times)
		b.ReportMetric(ms(median(s.times)), s.bin+"-"+s.mode+"-ms")
		if s.mode == "off" {
			b.ReportMetric(float64(s.gits), "git-"+s.bin)
		}
	}
	for n := range bins {
		b.ReportMetric(ms(med[n+"/auto"]-med[n+"/off"]), n+"-sandbox-added-ms")
	}
	if _, ok := bins["old"]; ok {
		for _, m := range modes {
			b.ReportMetric(float64(med["new/"+m])/float64(med["old/"+m]), "new/old-"+m)
		}
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
