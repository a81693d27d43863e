package local_test

import (
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/aqfleet/aq/internal/testenv"
)

// BenchmarkShipCheckJob measures what checking every push (#32 item 5;
// docs/BENCHMARKS.md, "#32 what ships is checked") adds to a job, whole
// process: `aq run --once` of a job that changes a file and ships its
// branch to origin (so its WIP checkpoint and its job branch are both
// pushed, both checked), by this tree's aq and by an aq built from main
// (AQBENCH_MAIN), interleaved in one run, the order alternating. The
// factory holds ten secrets (secret-named variables of its environment)
// for the scan to look for. AQ_SANDBOX=off in both: the sandbox's cost is
// its own benchmark.
//
//	git archive <main> | tar -x -C /tmp/aqmain && (cd /tmp/aqmain && go build -o /tmp/aq-main ./cmd/aq)
//	AQBENCH_MAIN=/tmp/aq-main [AQBENCH_BIN=/tmp/aq-this] go test -run '^$' -bench ShipCheckJob -benchtime 20x ./agent/local/
func BenchmarkShipCheckJob(b *testing.B) {
	mainBin := os.Getenv("AQBENCH_MAIN")
	if mainBin == "" {
		b.Skip("set AQBENCH_MAIN to an aq binary built from main (see the comment)")
	}
	checked := os.Getenv("AQBENCH_BIN") // this tree's aq, built already
	if checked == "" {
		checked = testenv.BuildAQ(b)
	}
	n := benchFiles()
	files := make(map[string]string, n)
	for i := range n {
		files[fmt.Sprintf("pkg%d/file%05d.txt", i%10, i)] = fmt.Sprintf("file %d\nline two\nline three\n", i)
	}
	env := []string{"AQ_SANDBOX=off"}
	for i := range 10 {
		env = append(env, fmt.Sprintf("BENCH_SECRET_%d_TOKEN=tok-%d-%s", i, i, strings.Repeat("x0Y1z2", 6)))
	}
	type side struct {
		name string
		h    *testenv.Home
		took []time.Duration
	}
	sides := []*side{{name: "main"}, {name: "checked"}}
	for _, s := range sides {
		s.h = testenv.NewHome(b)
		s.h.Bin = map[string]string{"main": mainBin, "checked": checked}[s.name]
		s.h.Env = append(s.h.Env, env...)
		testenv.AddOrigin(b, s.h.Repo(b, "app", files))
	}
	b.ResetTimer()
	for i := range b.N {
		for k := range sides {
			s := sides[(i+k)%2]
			b.StopTimer()
			name := fmt.Sprintf("bench-%s-%d", s.name, i)
			s.h.Submit(b, name, fmt.Sprintf("repo: app\nengine: script\nship: branch\nscript: echo %d > pkg0/new%d.txt", i, i))
			b.StartTimer()
			start := time.Now()
			if r := s.h.Run(b, "run", "--once"); r.Code != 0 {
				b.Fatalf("%s: %s", s.name, r)
			}
			s.took = append(s.took, time.Since(start))
		}
	}
	b.StopTimer()
	ms := func(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
	m, c := percentile(sides[0].took, 50), percentile(sides[1].took, 50)
	b.ReportMetric(ms(m), "main-p50-ms")
	b.ReportMetric(ms(c), "checked-p50-ms")
	b.ReportMetric(ms(c-m), "added-p50-ms")
	b.ReportMetric(float64(c)/float64(m), "x-main")
}
