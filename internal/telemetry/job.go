package telemetry

import (
	"context"
	"os"
	"strings"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/aqfleet/aq/internal/aqerr"
	"github.com/aqfleet/aq/job"
)

// The spans of a job's trace (docs/observability.md): the root, then one
// child per step, in the order a run takes them.
const (
	SpanJob        = "aq.job"     // claim or take → final report
	SpanPreflight  = "preflight"  // engine, shipping tools, repo (an on-demand clone)
	SpanWorktree   = "worktree"   // the repo lock, the worktree from the checkpoint or base
	SpanEngine     = "engine"     // the engine's run under its budgets
	SpanCheckpoint = "checkpoint" // a WIP checkpoint (aq.checkpoint.kind: periodic | final)
	SpanCommit     = "commit"     // the result commit on the job branch
	SpanVerify     = "verify"     // the manifest's verify: command
	SpanShip       = "ship"       // push, pull request
	SpanReport     = "report"     // the final report (fleet) or the queue's record (local)
)

// Span events.
const (
	EventLeaseRenew       = "lease.renew"        // a renewal the coordinator took
	EventLeaseRenewFailed = "lease.renew.failed" // a renewal that failed (retried until the lease's expiry is near)
	EventRetry            = "retry"              // a coordinator call tried again (aq.call, aq.attempt)
	EventSpooled          = "report.spooled"     // a report the coordinator could not take, kept in the spool
)

// Attribute keys (never a secret, never the prompt).
const (
	AttrJobID           = "aq.job.id"
	AttrRepo            = "aq.job.repo"
	AttrAttempt         = "aq.job.attempt"
	AttrMode            = "aq.mode" // local | fleet
	AttrSource          = "aq.job.source"
	AttrFactoryID       = "aq.factory.id"
	AttrEpoch           = "aq.lease.epoch"
	AttrEngine          = "aq.engine"
	AttrEngineVersion   = "aq.engine.version"
	AttrModel           = "aq.engine.model"
	AttrStage           = "aq.job.stage"
	AttrOutcome         = "aq.job.outcome" // succeeded | failed | fenced | interrupted
	AttrReason          = "aq.job.reason"
	AttrTokensIn        = "aq.engine.tokens.input"
	AttrTokensOut       = "aq.engine.tokens.output"
	AttrTokensCached    = "aq.engine.tokens.cached"
	AttrCostUSD         = "aq.engine.cost_usd"
	AttrTurns           = "aq.engine.turns"
	AttrBranch          = "aq.job.branch"
	AttrPRURL           = "aq.job.pr_url"
	AttrCheckpoint      = "aq.checkpoint.sha"
	AttrCheckpointKind  = "aq.checkpoint.kind"
	AttrCheckpointPush  = "aq.checkpoint.pushed"
	AttrReport          = "aq.report.delivery"
	AttrCall            = "aq.call"
	AttrAttemptN        = "aq.attempt"
	AttrError           = "aq.error"
	AttrLeaseRenewals   = "aq.lease.renewals"
	AttrGenAIInput      = "gen_ai.usage.input_tokens"
	AttrGenAIOutput     = "gen_ai.usage.output_tokens"
	AttrGenAIModel      = "gen_ai.request.model"
	claudeServiceName   = "claude-code"
	resourceAttrsEnvVar = "OTEL_RESOURCE_ATTRIBUTES"
)

// JobStart describes a job as its trace begins.
type JobStart struct {
	ID      string
	Repo    string
	Attempt int
	Mode    string // local | fleet
	Source  string // poll | broker | job (fleet); "" locally
	Epoch   int64  // the lease epoch (fleet)
}

// StartJob begins a job's trace: a new root (never a child of a trace aq
// itself runs in — one trace per job) whose context the job's steps, its
// lease and its reports record into.
func StartJob(ctx context.Context, tr trace.Tracer, s JobStart) (context.Context, trace.Span) {
	if _, off := tr.(noop.Tracer); off {
		return tr.Start(ctx, SpanJob) // tracing off: no attributes to build
	}
	attrs := []attribute.KeyValue{
		attribute.String(AttrJobID, s.ID), attribute.String(AttrRepo, s.Repo),
		attribute.Int(AttrAttempt, s.Attempt), attribute.String(AttrMode, s.Mode),
	}
	if s.Source != "" {
		attrs = append(attrs, attribute.String(AttrSource, s.Source))
	}
	if s.Epoch != 0 {
		attrs = append(attrs, attribute.Int64(AttrEpoch, s.Epoch))
	}
	return tr.Start(ctx, SpanJob, trace.WithNewRoot(), trace.WithSpanKind(trace.SpanKindConsumer), trace.WithAttributes(attrs...))
}

// JobEnd is how a job ended, for its root span.
type JobEnd struct {
	Stage    job.Stage  // where the job went
	Reason   job.Reason // "" on success
	Fenced   bool
	Insights job.Insights
	Branch   string
	PRURL    string
	Report   string // what became of the final report (fleet)
	Renewals int    // lease renewals (fleet)
}

// Outcome names how a job ended for metrics and traces: succeeded,
// failed, fenced (another factory owns it: fenced or lease lost) or
// interrupted (aq was stopped).
func Outcome(reason job.Reason, fenced bool) string {
	switch {
	case fenced || reason == job.ReasonFenced || reason == job.ReasonLeaseLost:
		return "fenced"
	case reason == job.ReasonInterrupted:
		return "interrupted"
	case reason != "":
		return "failed"
	}
	return "succeeded"
}

// EndJob records the end on the root span and ends it.
func EndJob(span trace.Span, e JobEnd) {
	if !span.IsRecording() {
		span.End()
		return
	}
	outcome := Outcome(e.Reason, e.Fenced)
	attrs := []attribute.KeyValue{attribute.String(AttrStage, string(e.Stage)), attribute.String(AttrOutcome, outcome)}
	if e.Reason != "" {
		attrs = append(attrs, attribute.String(AttrReason, string(e.Reason)))
	}
	attrs = append(attrs, usage(e.Insights)...)
	if e.Branch != "" {
		attrs = append(attrs, attribute.String(AttrBranch, e.Branch))
	}
	if e.PRURL != "" {
		attrs = append(attrs, attribute.String(AttrPRURL, e.PRURL))
	}
	if e.Report != "" {
		attrs = append(attrs, attribute.String(AttrReport, e.Report))
	}
	if e.Renewals > 0 {
		attrs = append(attrs, attribute.Int(AttrLeaseRenewals, e.Renewals))
	}
	span.SetAttributes(attrs...)
	if outcome != "succeeded" {
		span.SetStatus(codes.Error, string(e.Reason))
	}
	span.End()
}

// usage is a run's insights as attributes (the engine's name, model,
// tokens, cost, turns).
func usage(in job.Insights) []attribute.KeyValue {
	var a []attribute.KeyValue
	if in.Engine != "" {
		a = append(a, attribute.String(AttrEngine, in.Engine))
	}
	if in.Model != "" {
		a = append(a, attribute.String(AttrModel, in.Model))
	}
	return append(a,
		attribute.Int64(AttrTokensIn, in.TokensIn), attribute.Int64(AttrTokensOut, in.TokensOut),
		attribute.Int64(AttrTokensCached, in.TokensCached), attribute.Float64(AttrCostUSD, in.CostUSD),
		attribute.Int(AttrTurns, in.Turns))
}

// EngineAttrs are the engine span's attributes once it ran: aq's and the
// GenAI conventions' usage names.
func EngineAttrs(in job.Insights) []attribute.KeyValue {
	a := usage(in)
	if in.EngineVersion != "" {
		a = append(a, attribute.String(AttrEngineVersion, in.EngineVersion))
	}
	if in.Model != "" {
		a = append(a, attribute.String(AttrGenAIModel, in.Model))
	}
	return append(a, attribute.Int64(AttrGenAIInput, in.TokensIn), attribute.Int64(AttrGenAIOutput, in.TokensOut))
}

// Step begins a child span of the job's current span.
func Step(ctx context.Context, tr trace.Tracer, name string, attrs ...attribute.KeyValue) (context.Context, trace.Span) {
	return tr.Start(ctx, name, trace.WithAttributes(attrs...))
}

// EndStep ends a step; a failure reason marks it an error.
func EndStep(span trace.Span, reason job.Reason) {
	if reason != "" && span.IsRecording() {
		span.SetAttributes(attribute.String(AttrReason, string(reason)))
		span.SetStatus(codes.Error, string(reason))
	}
	span.End()
}

// Event adds an event to ctx's span (nothing when it records nothing).
func Event(ctx context.Context, name string, attrs ...attribute.KeyValue) {
	span := trace.SpanFromContext(ctx)
	if span.IsRecording() {
		span.AddEvent(name, trace.WithAttributes(attrs...))
	}
}

// TraceID is ctx's trace id, "" when there is none.
func TraceID(ctx context.Context) string {
	sc := trace.SpanContextFromContext(ctx)
	if !sc.IsValid() {
		return ""
	}
	return sc.TraceID().String()
}

// EngineEnv returns env with ctx's span as the W3C trace context an engine
// (or verify command) reads — TRACEPARENT and TRACESTATE, the environment
// carrier of the OTel specification — so that its own spans join the job's
// trace. Inherited values are replaced; without a span that records, they
// are removed (an engine must not join a trace aq itself ran in).
func EngineEnv(ctx context.Context, env []string) []string {
	out := make([]string, 0, len(env)+2)
	for _, kv := range env {
		name, _, _ := strings.Cut(kv, "=")
		if name == "TRACEPARENT" || name == "TRACESTATE" {
			continue
		}
		out = append(out, kv)
	}
	if !trace.SpanFromContext(ctx).IsRecording() {
		return out
	}
	carrier := propagation.MapCarrier{}
	propagation.TraceContext{}.Inject(ctx, carrier)
	if tp := carrier.Get("traceparent"); tp != "" {
		out = append(out, "TRACEPARENT="+tp)
	}
	if ts := carrier.Get("tracestate"); ts != "" {
		out = append(out, "TRACESTATE="+ts)
	}
	return out
}

// ClaudeEnv switches Claude Code's own OpenTelemetry export on in its
// environment (AQ_CLAUDE_TELEMETRY): CLAUDE_CODE_ENABLE_TELEMETRY=1, the OTLP
// exporters for its metrics, events (logs) and traces (the traces beta), over
// OTLP/HTTP to the endpoint aq's environment names (inherited), with its own
// service name (claude-code) and the job's id as a resource attribute.
// Values the operator set in aq's environment win, except the service name.
// The OTLP headers never reach an engine (they are aq's credentials).
func ClaudeEnv(env []string, jobID string) []string {
	set := map[string]string{}
	for _, kv := range env {
		k, v, _ := strings.Cut(kv, "=")
		set[k] = v
	}
	add := map[string]string{"CLAUDE_CODE_ENABLE_TELEMETRY": "1", "OTEL_SERVICE_NAME": claudeServiceName}
	for k, v := range map[string]string{
		"OTEL_METRICS_EXPORTER": "otlp", "OTEL_LOGS_EXPORTER": "otlp", "OTEL_TRACES_EXPORTER": "otlp",
		"CLAUDE_CODE_ENHANCED_TELEMETRY_BETA": "1", "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
	} {
		if set[k] == "" {
			add[k] = v
		}
	}
	ra := AttrJobID + "=" + jobID
	if cur := strings.TrimSpace(set[resourceAttrsEnvVar]); cur != "" {
		ra = cur + "," + ra
	}
	add[resourceAttrsEnvVar] = ra
	out := make([]string, 0, len(env)+len(add))
	for _, kv := range env {
		k, _, _ := strings.Cut(kv, "=")
		if _, ok := add[k]; !ok {
			out = append(out, kv)
		}
	}
	for _, k := range []string{"CLAUDE_CODE_ENABLE_TELEMETRY", "CLAUDE_CODE_ENHANCED_TELEMETRY_BETA", "OTEL_METRICS_EXPORTER", "OTEL_LOGS_EXPORTER",
		"OTEL_TRACES_EXPORTER", "OTEL_EXPORTER_OTLP_PROTOCOL", "OTEL_SERVICE_NAME", resourceAttrsEnvVar} {
		if v, ok := add[k]; ok {
			out = append(out, k+"="+v)
		}
	}
	return out
}

// CheckClaude refuses AQ_CLAUDE_TELEMETRY=1 when Claude Code would have
// nowhere to send its telemetry: it needs OTEL_EXPORTER_OTLP_ENDPOINT, the
// base URL its metrics, events and traces all go below.
func CheckClaude(getenv func(string) string) error {
	if getenv == nil {
		getenv = os.Getenv
	}
	if strings.TrimSpace(getenv("OTEL_EXPORTER_OTLP_ENDPOINT")) == "" {
		return aqerr.Usagef("set OTEL_EXPORTER_OTLP_ENDPOINT to the collector's OTLP/HTTP URL, or unset AQ_CLAUDE_TELEMETRY",
			"AQ_CLAUDE_TELEMETRY=1 turns Claude Code's telemetry on, but OTEL_EXPORTER_OTLP_ENDPOINT is not set")
	}
	return nil
}
