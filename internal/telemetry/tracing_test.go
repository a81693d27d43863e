package telemetry_test

import (
	"context"
	"log/slog"
	"net"
	"net/http"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/aqfleet/aq/internal/aqerr"
	"github.com/aqfleet/aq/internal/telemetry"
	"github.com/aqfleet/aq/internal/telemetry/otlptest"
	"github.com/aqfleet/aq/internal/testenv"
	"github.com/aqfleet/aq/job"
)

func env(kv ...string) func(string) string {
	m := map[string]string{}
	for i := 0; i+1 < len(kv); i += 2 {
		m[kv[i]] = kv[i+1]
	}
	return func(k string) string { return m[k] }
}

func TestResolve(t *testing.T) {
	for _, c := range []struct {
		name string
		env  []string
		want string // the traces URL; "" off
		bad  string // a usage error naming this
	}{
		{"nothing set: off", nil, "", ""},
		{"base endpoint", []string{"OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4318"}, "http://127.0.0.1:4318/v1/traces", ""},
		{"base endpoint with a path", []string{"OTEL_EXPORTER_OTLP_ENDPOINT", "https://otel.example/otlp/"}, "https://otel.example/otlp/v1/traces", ""},
		{"traces endpoint as it is", []string{"OTEL_EXPORTER_OTLP_ENDPOINT", "http://a:4318", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "http://b:4318/custom"}, "http://b:4318/custom", ""},
		{"disabled", []string{"OTEL_SDK_DISABLED", "true", "OTEL_EXPORTER_OTLP_ENDPOINT", "http://a:4318"}, "", ""},
		{"exporter none", []string{"OTEL_TRACES_EXPORTER", "none", "OTEL_EXPORTER_OTLP_ENDPOINT", "http://a:4318"}, "", ""},
		{"http/json", []string{"OTEL_EXPORTER_OTLP_PROTOCOL", "http/json", "OTEL_EXPORTER_OTLP_ENDPOINT", "http://a:4318"}, "http://a:4318/v1/traces", ""},
		{"malformed", []string{"OTEL_EXPORTER_OTLP_ENDPOINT", "127.0.0.1:4318"}, "", "OTEL_EXPORTER_OTLP_ENDPOINT"},
		{"no host", []string{"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "http:///v1/traces"}, "", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"},
		{"not a URL", []string{"OTEL_EXPORTER_OTLP_ENDPOINT", "http://[::1"}, "", "OTEL_EXPORTER_OTLP_ENDPOINT"},
		{"credentials", []string{"OTEL_EXPORTER_OTLP_ENDPOINT", "https://user:s3cret@otel.example"}, "", "must not carry credentials"},
		{"grpc", []string{"OTEL_EXPORTER_OTLP_PROTOCOL", "grpc", "OTEL_EXPORTER_OTLP_ENDPOINT", "http://a:4317"}, "", "OTEL_EXPORTER_OTLP_PROTOCOL"},
		{"traces protocol wins", []string{"OTEL_EXPORTER_OTLP_PROTOCOL", "grpc", "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "http/protobuf", "OTEL_EXPORTER_OTLP_ENDPOINT", "http://a:4318"}, "http://a:4318/v1/traces", ""},
		{"console exporter", []string{"OTEL_TRACES_EXPORTER", "console", "OTEL_EXPORTER_OTLP_ENDPOINT", "http://a:4318"}, "", "OTEL_TRACES_EXPORTER"},
	} {
		t.Run(c.name, func(t *testing.T) {
			ep, err := telemetry.Resolve(env(c.env...))
			if c.bad != "" {
				if err == nil || aqerr.ExitCode(err) != aqerr.Usage || !strings.Contains(err.Error(), c.bad) {
					t.Fatalf("want a usage error naming %q, got %v (%+v)", c.bad, err, ep)
				}
				if strings.Contains(err.Error(), "s3cret") || strings.Contains(err.Error(), "\n") {
					t.Fatalf("the error line leaks or spans lines: %q", err)
				}
				return
			}
			if err != nil || ep.URL != c.want {
				t.Fatalf("got %+v %v, want %q", ep, err, c.want)
			}
		})
	}
}

// No endpoint: tracing is off, the tracer is a no-op (spans record
// nothing), and an engine's environment gets no TRACEPARENT — the one it
// inherited is removed.
func TestOffIsNoop(t *testing.T) {
	tr, err := telemetry.Setup(context.Background(), telemetry.Options{Getenv: env()})
	if err != nil || tr.Enabled() {
		t.Fatalf("%v %v", tr.Enabled(), err)
	}
	ctx, span := telemetry.StartJob(context.Background(), tr.Tracer(), telemetry.JobStart{ID: "j", Repo: "r", Mode: "local"})
	if span.IsRecording() || telemetry.TraceID(ctx) != "" {
		t.Fatal("a span records with tracing off")
	}
	got := telemetry.EngineEnv(ctx, []string{"PATH=/bin", "TRACEPARENT=00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"})
	if !slices.Equal(got, []string{"PATH=/bin"}) {
		t.Fatalf("engine env %v", got)
	}
	if err := tr.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
}

// A collector that is down: every export fails, the spans are dropped, and
// aq's log says so once — not once per export — while nothing waits on it.
func TestDownEndpointDropsWithOneWarning(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close() // nothing listens there now: connection refused
	logs := &testenv.SyncBuffer{}
	log := slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelInfo}))
	tr, err := telemetry.Setup(context.Background(), telemetry.Options{Getenv: env("OTEL_EXPORTER_OTLP_ENDPOINT", "http://"+addr), Log: log})
	if err != nil || !tr.Enabled() {
		t.Fatalf("%v %v", tr.Enabled(), err)
	}
	for i := range 3 {
		_, span := telemetry.StartJob(context.Background(), tr.Tracer(), telemetry.JobStart{ID: "j", Repo: "r", Attempt: i + 1, Mode: "local"})
		telemetry.EndJob(span, telemetry.JobEnd{Stage: job.Shipped})
		if err := tr.ForceFlush(context.Background()); err != nil {
			t.Fatalf("flush %d: %v", i, err)
		}
	}
	if tr.Dropped() != 3 || tr.Exported() != 0 {
		t.Fatalf("dropped %d exported %d", tr.Dropped(), tr.Exported())
	}
	if n := strings.Count(logs.String(), "cannot export traces"); n != 1 {
		t.Fatalf("%d warnings, want 1:\n%s", n, logs)
	}
	if err := tr.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
}

// A collector that refuses, then takes spans: one warning for the outage, a
// line when it works again, and the spans after it arrive.
func TestRefusingCollectorRecovers(t *testing.T) {
	rcv := otlptest.Start(t)
	rcv.Answer(func(n int) int {
		if n <= 2 {
			return http.StatusBadRequest // not retried by the exporter
		}
		return http.StatusOK
	})
	logs := &testenv.SyncBuffer{}
	log := slog.New(slog.NewTextHandler(logs, nil))
	tr, err := telemetry.Setup(context.Background(), telemetry.Options{Getenv: env("OTEL_EXPORTER_OTLP_ENDPOINT", rcv.URL()), Log: log, FactoryID: "f9", Version: "v1.2.3"})
	if err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		_, span := telemetry.StartJob(context.Background(), tr.Tracer(), telemetry.JobStart{ID: "j", Repo: "r", Attempt: i + 1, Mode: "fleet", Epoch: 7})
		telemetry.EndJob(span, telemetry.JobEnd{Stage: job.Failed, Reason: job.ReasonVerifyFailed, Insights: job.Insights{Engine: "script", CostUSD: 0.5, TokensIn: 10}})
		_ = tr.ForceFlush(context.Background())
	}
	if tr.Dropped() != 2 || tr.Exported() != 1 {
		t.Fatalf("dropped %d exported %d", tr.Dropped(), tr.Exported())
	}
	if n := strings.Count(logs.String(), "cannot export traces"); n != 1 || !strings.Contains(logs.String(), "trace export works again") {
		t.Fatalf("logs:\n%s", logs)
	}
	spans := rcv.Spans()
	if len(spans) != 1 {
		t.Fatalf("%d spans", len(spans))
	}
	s := spans[0]
	if s.Name != telemetry.SpanJob || s.ParentID != "" || !s.Error || s.Service != "aq" || s.Resource["aq.factory.id"] != "f9" || s.Resource["service.version"] != "v1.2.3" {
		t.Fatalf("span %+v", s)
	}
	for k, v := range map[string]any{"aq.job.id": "j", "aq.job.attempt": int64(3), "aq.lease.epoch": int64(7), "aq.job.outcome": "failed",
		"aq.job.reason": "verify_failed", "aq.engine": "script", "aq.engine.cost_usd": 0.5, "aq.engine.tokens.input": int64(10)} {
		if s.Attrs[k] != v {
			t.Errorf("%s = %v (%T), want %v", k, s.Attrs[k], s.Attrs[k], v)
		}
	}
	_ = tr.Shutdown(context.Background())
}

// TRACEPARENT carries the span's trace and span ids, sampled; an inherited
// one is replaced.
func TestEngineEnvTraceparent(t *testing.T) {
	rcv := otlptest.Start(t)
	tr, err := telemetry.Setup(context.Background(), telemetry.Options{Getenv: env("OTEL_EXPORTER_OTLP_ENDPOINT", rcv.URL())})
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Shutdown(context.Background())
	ctx, root := telemetry.StartJob(context.Background(), tr.Tracer(), telemetry.JobStart{ID: "j"})
	ctx, eng := telemetry.Step(ctx, tr.Tracer(), telemetry.SpanEngine)
	got := telemetry.EngineEnv(ctx, []string{"A=1", "TRACEPARENT=00-11111111111111111111111111111111-2222222222222222-01"})
	sc := eng.SpanContext()
	want := "TRACEPARENT=00-" + sc.TraceID().String() + "-" + sc.SpanID().String() + "-01"
	if !slices.Equal(got, []string{"A=1", want}) {
		t.Fatalf("env %v, want %s", got, want)
	}
	if root.SpanContext().TraceID() != sc.TraceID() || telemetry.TraceID(ctx) != sc.TraceID().String() {
		t.Fatal("the step is not in the job's trace")
	}
	eng.End()
	root.End()
}

// A job's root is a new trace even when aq runs inside one (a CI job's
// TRACEPARENT in its own context): one trace per job.
func TestStartJobIsANewRoot(t *testing.T) {
	rcv := otlptest.Start(t)
	tr, _ := telemetry.Setup(context.Background(), telemetry.Options{Getenv: env("OTEL_EXPORTER_OTLP_ENDPOINT", rcv.URL())})
	defer tr.Shutdown(context.Background())
	outerCtx, outer := tr.Tracer().Start(context.Background(), "outer")
	_, span := telemetry.StartJob(outerCtx, tr.Tracer(), telemetry.JobStart{ID: "j"})
	if span.SpanContext().TraceID() == outer.SpanContext().TraceID() {
		t.Fatal("the job's root joined the caller's trace")
	}
	span.End()
	outer.End()
}

func TestClaudeEnv(t *testing.T) {
	got := telemetry.ClaudeEnv([]string{"PATH=/bin", "OTEL_SERVICE_NAME=aq-factory", "OTEL_LOGS_EXPORTER=none", "OTEL_RESOURCE_ATTRIBUTES=deployment.environment=prod"}, "job-1")
	want := []string{"PATH=/bin", "OTEL_LOGS_EXPORTER=none", "CLAUDE_CODE_ENABLE_TELEMETRY=1", "CLAUDE_CODE_ENHANCED_TELEMETRY_BETA=1",
		"OTEL_METRICS_EXPORTER=otlp", "OTEL_TRACES_EXPORTER=otlp", "OTEL_EXPORTER_OTLP_PROTOCOL=http/protobuf",
		"OTEL_SERVICE_NAME=claude-code", "OTEL_RESOURCE_ATTRIBUTES=deployment.environment=prod,aq.job.id=job-1"}
	if !slices.Equal(got, want) {
		t.Fatalf("got  %v\nwant %v", got, want)
	}
	if err := telemetry.CheckClaude(env()); err == nil || aqerr.ExitCode(err) != aqerr.Usage || !strings.Contains(err.Error(), "OTEL_EXPORTER_OTLP_ENDPOINT") {
		t.Fatalf("CheckClaude without an endpoint: %v", err)
	}
	if err := telemetry.CheckClaude(env("OTEL_EXPORTER_OTLP_ENDPOINT", "http://a:4318")); err != nil {
		t.Fatal(err)
	}
}

func TestMain(m *testing.M) { os.Exit(testenv.Main(m)) }
