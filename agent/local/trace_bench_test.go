package local_test

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/aqfleet/aq/agent/local"
	"github.com/aqfleet/aq/internal/telemetry"
	"github.com/aqfleet/aq/internal/telemetry/otlptest"
	"github.com/aqfleet/aq/internal/testenv"
	"github.com/aqfleet/aq/job"
)

// BenchmarkJobTracing is what tracing costs a job (docs/BENCHMARKS.md,
// "#16 Telemetry"): the same job (a no-op script engine, ship: none, a
// verify command) through two local agents, one with tracing off (no
// endpoint: the no-op tracer) and one exporting OTLP/HTTP to a receiver on
// 127.0.0.1, their jobs interleaved so both see the same load. Reports
// x-off (the traced job's median time over the untraced one's),
// overhead-ms/op (the difference of the medians), and what one traced job
// exports: spans/job and otlp-bytes/job (the protobuf bodies the collector
// received, uncompressed).
func BenchmarkJobTracing(b *testing.B) {
	n := benchFiles()
	rcv := otlptest.Start(b)
	tr, err := telemetry.Setup(context.Background(), telemetry.Options{Getenv: func(k string) string {
		if k == "OTEL_EXPORTER_OTLP_ENDPOINT" {
			return rcv.URL()
		}
		return ""
	}})
	if err != nil {
		b.Fatal(err)
	}
	front := "repo: bench\nengine: script\nship: none\nverify: test -f f\nscript: \"echo x > f\""
	homes := map[bool]*testenv.Home{false: testenv.NewHome(b), true: testenv.NewHome(b)}
	agents := map[bool]*local.Agent{}
	for on, h := range homes {
		benchRepo(b, h.RepoBase, n)
		var p local.Parts
		if on {
			p.Tracer = tr.Tracer()
		}
		agents[on] = newAgent(b, h, p)
	}
	times := map[bool][]time.Duration{}
	ctx := context.Background()
	b.ResetTimer()
	for i := range b.N {
		for _, on := range []bool{false, true} {
			b.StopTimer()
			submit(b, agents[on], "trace-bench-"+strconv.FormatBool(on)+"-"+strconv.Itoa(i), front)
			b.StartTimer()
			t0 := time.Now()
			res, err := agents[on].RunOne(ctx)
			times[on] = append(times[on], time.Since(t0))
			if err != nil || res.Stage != job.Testing {
				b.Fatalf("job %d (tracing %v): %v %+v", i, on, err, res)
			}
		}
	}
	b.StopTimer()
	if err := tr.Shutdown(context.Background()); err != nil {
		b.Fatal(err)
	}
	off, on := median(times[false]), median(times[true])
	b.ReportMetric(float64(on)/float64(off), "x-off")
	b.ReportMetric(float64(on-off)/float64(time.Millisecond), "overhead-ms/op")
	b.ReportMetric(float64(len(rcv.Spans()))/float64(b.N), "spans/job")
	b.ReportMetric(float64(rcv.Bytes())/float64(b.N), "otlp-bytes/job")
}
