// Package telemetry owns aq's OpenTelemetry tracing: the tracer provider
// built from the standard OTEL_* environment (OTLP over HTTP), which is off —
// a no-op tracer, no goroutine, no allocation per span — when no endpoint is
// set; the names and attributes of a job's trace (one trace per job: a root
// span from claim to final report, a child per step); and the W3C trace
// context handed to an engine in its environment (TRACEPARENT), so that an
// engine's own spans join the job's trace.
//
// An exporter that cannot reach its collector never affects a job: spans are
// exported from the SDK's batch goroutine, and a failed export drops them
// with one warning (per outage) in aq's log.
package telemetry

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"os"
	"path"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/aqfleet/aq/internal/aqerr"
	"github.com/aqfleet/aq/internal/brief"
)

// ScopeName is the instrumentation scope of aq's spans.
const ScopeName = "github.com/aqfleet/aq"

// Options configure Setup.
type Options struct {
	// Getenv reads the OTEL_* variables that decide whether tracing is on
	// and where spans go; nil: os.Getenv. (Headers, timeout, compression and
	// certificates are read from the process environment by the exporter.)
	Getenv func(string) string
	Log    *slog.Logger
	// Version is aq's version (service.version).
	Version string
	// FactoryID names this factory (aq.factory.id on the resource).
	FactoryID string
	// Exporter replaces the OTLP exporter (benchmarks, tests); the endpoint
	// variables must still be set for tracing to be on.
	Exporter sdktrace.SpanExporter
	// BatchTimeout overrides the batch processor's schedule delay (tests;
	// 0: OTEL_BSP_SCHEDULE_DELAY, default 5 s).
	BatchTimeout time.Duration
}

// Tracing is aq's tracer provider. The zero value and Off are tracing off.
type Tracing struct {
	tp       *sdktrace.TracerProvider
	tracer   trace.Tracer
	exp      *exporter
	endpoint string
	log      *slog.Logger
	once     sync.Once
}

// Off is tracing off: a no-op tracer.
func Off() *Tracing { return &Tracing{} }

// Endpoint is where traces go when tracing is on: the traces URL the
// environment gives, or "" when it is off.
type Endpoint struct {
	URL      string // the OTLP/HTTP traces URL (…/v1/traces)
	Variable string // the variable it came from
}

// Resolve reads the standard variables and says where traces go (a zero
// Endpoint: tracing is off). A value aq cannot use is a usage error (exit 2)
// that names the variable and how to fix it.
//
//   - OTEL_SDK_DISABLED=true or OTEL_TRACES_EXPORTER=none: off;
//   - OTEL_TRACES_EXPORTER other than otlp: refused (aq exports OTLP only);
//   - OTEL_EXPORTER_OTLP_TRACES_ENDPOINT (used as it is) or, else,
//     OTEL_EXPORTER_OTLP_ENDPOINT (a base URL: /v1/traces is appended);
//     neither set: off. It must be an http(s) URL with a host and no
//     credentials (those go in OTEL_EXPORTER_OTLP_HEADERS);
//   - OTEL_EXPORTER_OTLP_[TRACES_]PROTOCOL: http/protobuf (the default) or
//     http/json; grpc is refused (aq speaks OTLP over HTTP).
func Resolve(getenv func(string) string) (Endpoint, error) {
	if getenv == nil {
		getenv = os.Getenv
	}
	if strings.EqualFold(strings.TrimSpace(getenv("OTEL_SDK_DISABLED")), "true") {
		return Endpoint{}, nil
	}
	switch exp := strings.ToLower(strings.TrimSpace(getenv("OTEL_TRACES_EXPORTER"))); exp {
	case "", "otlp":
	case "none":
		return Endpoint{}, nil
	default:
		return Endpoint{}, aqerr.Usagef("use otlp (or none to turn tracing off)", "OTEL_TRACES_EXPORTER=%q: aq exports traces over OTLP only", exp)
	}
	name, raw := "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", strings.TrimSpace(getenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"))
	if raw == "" {
		name, raw = "OTEL_EXPORTER_OTLP_ENDPOINT", strings.TrimSpace(getenv("OTEL_EXPORTER_OTLP_ENDPOINT"))
	}
	if raw == "" {
		return Endpoint{}, nil
	}
	u, err := url.Parse(raw)
	switch {
	case err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "":
		return Endpoint{}, aqerr.Usagef("use the collector's OTLP/HTTP URL, e.g. http://127.0.0.1:4318, or unset it to turn tracing off",
			"%s=%q is not an http(s) URL with a host", name, shown(raw))
	case u.User != nil:
		return Endpoint{}, aqerr.Usagef("put credentials in OTEL_EXPORTER_OTLP_HEADERS", "%s must not carry credentials", name)
	}
	for _, p := range []string{"OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL"} {
		v := strings.TrimSpace(getenv(p))
		if v == "" {
			continue
		}
		if v != "http/protobuf" && v != "http/json" {
			return Endpoint{}, aqerr.Usagef("use http/protobuf and the collector's OTLP/HTTP port (4318)", "%s=%q: aq exports traces over OTLP/HTTP only", p, v)
		}
		break // the traces variable wins
	}
	if name == "OTEL_EXPORTER_OTLP_ENDPOINT" {
		// A base URL: the signal's path goes below it (OTLP exporter spec).
		u.Path = path.Join("/", u.Path, "v1/traces")
	} else if u.Path == "" {
		u.Path = "/"
	}
	return Endpoint{URL: u.String(), Variable: name}, nil
}

// shown is a bad endpoint value for an error line: cut short, without what
// could be credentials.
func shown(raw string) string {
	if i := strings.LastIndex(raw, "@"); i >= 0 {
		raw = "…" + raw[i:]
	}
	if len(raw) > 80 {
		raw = raw[:80] + "…"
	}
	return raw
}

// Setup builds the tracer provider the environment asks for: off (no-op)
// when no endpoint is set, else a batch-exporting provider sending OTLP/HTTP
// to the endpoint, its resource named by OTEL_SERVICE_NAME (default "aq")
// and OTEL_RESOURCE_ATTRIBUTES. Nothing is dialled until spans are exported.
func Setup(ctx context.Context, o Options) (*Tracing, error) {
	log := o.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	ep, err := Resolve(o.Getenv)
	if err != nil || ep.URL == "" {
		return Off(), err
	}
	inner := o.Exporter
	if inner == nil {
		// Headers, timeout, compression and certificates come from the
		// standard variables, read by the exporter itself.
		inner, err = otlptracehttp.New(ctx, otlptracehttp.WithEndpointURL(ep.URL))
		if err != nil {
			return Off(), aqerr.Wrap(aqerr.Usage, err, fmt.Sprintf("cannot set up the OTLP trace exporter for %s: %v", ep.Variable, err), "check the OTEL_EXPORTER_OTLP_* variables")
		}
	}
	exp := &exporter{inner: inner, log: log, endpoint: ep.URL}
	attrs := []attribute.KeyValue{semconv.ServiceName("aq")}
	if o.Version != "" {
		attrs = append(attrs, semconv.ServiceVersion(o.Version))
	}
	if o.FactoryID != "" {
		attrs = append(attrs, attribute.String(AttrFactoryID, o.FactoryID))
	}
	// Later detectors win: OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES
	// override aq's defaults.
	res, rerr := resource.New(ctx, resource.WithAttributes(attrs...), resource.WithHost(), resource.WithTelemetrySDK(), resource.WithFromEnv())
	if rerr != nil {
		log.Warn("some trace resource attributes could not be read; the others are used", "err", rerr)
		if res == nil {
			res = resource.NewSchemaless(attrs...)
		}
	}
	var bopts []sdktrace.BatchSpanProcessorOption
	if o.BatchTimeout > 0 {
		bopts = append(bopts, sdktrace.WithBatchTimeout(o.BatchTimeout))
	}
	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp, bopts...), sdktrace.WithResource(res))
	log.Info("tracing on: one trace per job", "endpoint", ep.URL, "from", ep.Variable)
	return &Tracing{tp: tp, tracer: tp.Tracer(ScopeName), exp: exp, endpoint: ep.URL, log: log}, nil
}

// Enabled reports whether spans are recorded and exported.
func (t *Tracing) Enabled() bool { return t != nil && t.tp != nil }

// Tracer is the tracer jobs record their spans with (a no-op one when off).
func (t *Tracing) Tracer() trace.Tracer {
	if t == nil || t.tracer == nil {
		return noop.NewTracerProvider().Tracer(ScopeName)
	}
	return t.tracer
}

// Exported and Dropped count the spans the exporter sent and the spans it
// dropped (the collector could not take them).
func (t *Tracing) Exported() int64 {
	if t == nil || t.exp == nil {
		return 0
	}
	return t.exp.exported.Load()
}

// Dropped: see Exported.
func (t *Tracing) Dropped() int64 {
	if t == nil || t.exp == nil {
		return 0
	}
	return t.exp.dropped.Load()
}

// Shutdown exports the spans still buffered and stops the provider, within
// ctx (bound it: a collector that does not answer must not hold aq's exit).
// Spans it cannot export in time are dropped. Safe to call more than once.
func (t *Tracing) Shutdown(ctx context.Context) error {
	if !t.Enabled() {
		return nil
	}
	var err error
	t.once.Do(func() {
		err = t.tp.Shutdown(ctx)
		t.log.Debug("tracing stopped", "spans_exported", t.Exported(), "spans_dropped", t.Dropped(), "err", err)
	})
	return err
}

// ForceFlush exports the spans buffered now (tests, benchmarks).
func (t *Tracing) ForceFlush(ctx context.Context) error {
	if !t.Enabled() {
		return nil
	}
	return t.tp.ForceFlush(ctx)
}

// exporter wraps the OTLP exporter: an export that fails drops its spans
// with one warning per outage (the first failure after a success, or at
// all), never an error to the SDK (whose global handler would print it with
// a logger of its own).
type exporter struct {
	inner    sdktrace.SpanExporter
	log      *slog.Logger
	endpoint string
	failing  atomic.Bool
	exported atomic.Int64
	dropped  atomic.Int64
}

var _ sdktrace.SpanExporter = (*exporter)(nil)

func (e *exporter) ExportSpans(ctx context.Context, spans []sdktrace.ReadOnlySpan) error {
	err := e.inner.ExportSpans(ctx, spans)
	if err == nil {
		e.exported.Add(int64(len(spans)))
		if e.failing.CompareAndSwap(true, false) {
			e.log.Info("trace export works again", "endpoint", e.endpoint)
		}
		return nil
	}
	e.dropped.Add(int64(len(spans)))
	if e.failing.CompareAndSwap(false, true) {
		e.log.Warn("cannot export traces: their spans are dropped (jobs are not affected; said once until an export succeeds)",
			"endpoint", e.endpoint, "spans", len(spans), "err", brief.Clip(brief.Head(err.Error()), 300))
	} else {
		e.log.Debug("trace export failed again; spans dropped", "spans", len(spans), "err", brief.Clip(brief.Head(err.Error()), 300))
	}
	return nil
}

func (e *exporter) Shutdown(ctx context.Context) error {
	if err := e.inner.Shutdown(ctx); err != nil && !errors.Is(err, context.DeadlineExceeded) {
		return err
	}
	return nil
}
