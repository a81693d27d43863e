package telemetry_test

import (
	"context"
	"testing"

	"go.opentelemetry.io/otel/attribute"

	"github.com/aqfleet/aq/internal/telemetry"
	"github.com/aqfleet/aq/internal/telemetry/otlptest"
	"github.com/aqfleet/aq/job"
)

// BenchmarkJobSpans is the recording cost of one job's trace on the job's
// own path — a root, its nine steps, five events, an engine environment with
// TRACEPARENT — with tracing off (the no-op tracer: what every job pays when
// no endpoint is set) and on (batch export to an OTLP/HTTP receiver on
// 127.0.0.1, which happens off the job's path). Reports spans/job and
// otlp-bytes/job for "on".
func BenchmarkJobSpans(b *testing.B) {
	b.Run("off", func(b *testing.B) {
		benchSpans(b, telemetry.Off())
	})
	b.Run("on", func(b *testing.B) {
		rcv := otlptest.Start(b)
		tr, err := telemetry.Setup(context.Background(), telemetry.Options{Getenv: env("OTEL_EXPORTER_OTLP_ENDPOINT", rcv.URL())})
		if err != nil {
			b.Fatal(err)
		}
		benchSpans(b, tr)
		b.StopTimer()
		if err := tr.Shutdown(context.Background()); err != nil {
			b.Fatal(err)
		}
		b.ReportMetric(float64(len(rcv.Spans()))/float64(b.N), "spans/job")
		b.ReportMetric(float64(rcv.Bytes())/float64(b.N), "otlp-bytes/job")
	})
}

func benchSpans(b *testing.B, tr *telemetry.Tracing) {
	t := tr.Tracer()
	env := []string{"PATH=/usr/bin:/bin", "HOME=/home/aq", "LANG=C.UTF-8"}
	in := job.Insights{Engine: "claude", Model: "claude-sonnet-4", TokensIn: 120000, TokensOut: 8000, TokensCached: 90000, CostUSD: 0.42, Turns: 17}
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		if i%100 == 99 {
			// The batch queue holds 2048 spans: a burst of jobs far faster
			// than any real factory runs them would overflow it (spans
			// dropped, counted by the SDK). Export between bursts, untimed.
			b.StopTimer()
			_ = tr.ForceFlush(context.Background())
			b.StartTimer()
		}
		ctx, root := telemetry.StartJob(context.Background(), t, telemetry.JobStart{ID: "fix-login-redirect", Repo: "app", Attempt: 1, Mode: "fleet", Source: "broker", Epoch: 3})
		for _, name := range []string{telemetry.SpanPreflight, telemetry.SpanWorktree} {
			_, s := telemetry.Step(ctx, t, name)
			telemetry.EndStep(s, "")
		}
		ectx, eng := telemetry.Step(ctx, t, telemetry.SpanEngine, attribute.String(telemetry.AttrEngine, "claude"))
		_ = telemetry.EngineEnv(ectx, env)
		for range 4 {
			telemetry.Event(ctx, telemetry.EventLeaseRenew, attribute.Int64(telemetry.AttrEpoch, 3))
		}
		eng.SetAttributes(telemetry.EngineAttrs(in)...)
		eng.End()
		for _, name := range []string{telemetry.SpanCheckpoint, telemetry.SpanCheckpoint, telemetry.SpanCommit, telemetry.SpanVerify, telemetry.SpanShip} {
			_, s := telemetry.Step(ctx, t, name)
			telemetry.EndStep(s, "")
		}
		rctx, rep := telemetry.Step(ctx, t, telemetry.SpanReport)
		telemetry.Event(rctx, telemetry.EventRetry, attribute.String(telemetry.AttrCall, "PATCH /fleet/jobs/:id"), attribute.Int(telemetry.AttrAttemptN, 2))
		telemetry.EndStep(rep, "")
		telemetry.EndJob(root, telemetry.JobEnd{Stage: job.Review, Insights: in, Branch: "aq/job/fix-login-redirect", PRURL: "https://github.com/acme/app/pull/7", Report: "delivered"})
	}
}
