//go:build unix && !unit

package localrun

import (
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/aqfleet/aq/cmd/aq/clitest"
	"github.com/aqfleet/aq/internal/telemetry/otlptest"
	"github.com/aqfleet/aq/internal/testenv"
)

// TestRunTracesLocalJob: `aq run --once` with OTEL_EXPORTER_OTLP_ENDPOINT
// pointing at an OTLP/HTTP receiver on 127.0.0.1 exports one trace for the
// job — the root from take to record, a child per step in order (periodic
// checkpoints too), the usage and outcome on the root — before it exits;
// the engine saw TRACEPARENT naming its own span in the job's trace, and
// never the exporter's credentials (which the collector did get).
func TestRunTracesLocalJob(t *testing.T) {
	t.Parallel() // its own home, repos and processes: it runs beside the others
	h, mark := clitest.MarkedHome(t)
	h.Repo(t, "app", nil)
	rcv := otlptest.Start(t)
	h.Env = append(h.Env, "OTEL_EXPORTER_OTLP_ENDPOINT="+rcv.URL(), "OTEL_SERVICE_NAME=aq-test",
		"OTEL_EXPORTER_OTLP_HEADERS=Authorization=Bearer otlp-secret-tok", "AQ_CHECKPOINT_INTERVAL=100ms",
		"TRACEPARENT=00-11111111111111111111111111111111-2222222222222222-01") // aq's own: no job joins it
	// The engine writes a file, waits for the periodic checkpoint to record
	// it (the WIP ref appears), reports usage and leaves its environment.
	h.Submit(t, "traced", clitest.ScriptJob("app", `echo "$TRACEPARENT" > "$MARK/traceparent"
env > "$MARK/env"
echo work > out.txt
i=0
while ! git rev-parse -q --verify "refs/heads/aq/wip/$AQ_JOB_ID" >/dev/null && [ $i -lt 1200 ]; do sleep 0.05; i=$((i+1)); done
echo '::aq-usage tokens_in=1200 tokens_out=300 tokens_cached=7 cost_usd=0.125 turns=4'`, "verify: test -f out.txt", "ship: branch"))
	if r := h.Run(t, "run", "--once"); r.Code != 0 {
		t.Fatalf("aq run --once: %s", r)
	}
	id := testenv.ID("traced")
	root, ok := rcv.Root("aq.job", "aq.job.id", id)
	if !ok {
		t.Fatalf("no root span for %s among %d spans", id, len(rcv.Spans()))
	}
	trace := rcv.Trace(root.TraceID)
	kids := otlptest.Children(trace, root.SpanID)
	names := otlptest.Names(kids)
	// Periodic checkpoints run beside the engine; the rest in order.
	var steps []string
	periodic := 0
	for _, k := range kids {
		if k.Name == "checkpoint" && k.Attrs["aq.checkpoint.kind"] == "periodic" {
			periodic++
			continue
		}
		steps = append(steps, k.Name)
	}
	if want := []string{"preflight", "worktree", "engine", "checkpoint", "commit", "verify", "ship", "report"}; !slices.Equal(steps, want) {
		t.Fatalf("steps %v, want %v (all: %v)", steps, want, names)
	}
	if periodic < 1 {
		t.Fatalf("no periodic checkpoint span: %v", names)
	}
	if len(trace) != len(kids)+1 {
		t.Fatalf("%d spans in the trace, %d of them the root's children", len(trace), len(kids))
	}
	for k, want := range map[string]any{"aq.job.repo": "app", "aq.mode": "local", "aq.job.attempt": int64(1), "aq.job.stage": "shipped",
		"aq.job.outcome": "succeeded", "aq.engine": "script", "aq.engine.tokens.input": int64(1200), "aq.engine.tokens.output": int64(300),
		"aq.engine.cost_usd": 0.125, "aq.engine.turns": int64(4), "aq.job.branch": "aq/job/" + id} {
		if root.Attrs[k] != want {
			t.Errorf("root %s = %v (%T), want %v", k, root.Attrs[k], root.Attrs[k], want)
		}
	}
	if root.Service != "aq-test" || root.Error {
		t.Errorf("root service %q error %v", root.Service, root.Error)
	}
	var engine otlptest.Span
	for _, k := range kids {
		if k.Name == "engine" {
			engine = k
		}
		if k.Error {
			t.Errorf("step %s is an error span", k.Name)
		}
	}
	if engine.Attrs["gen_ai.usage.input_tokens"] != int64(1200) || engine.Attrs["aq.engine.result"] != "success" {
		t.Errorf("engine span attrs %v", engine.Attrs)
	}
	// The engine joined the job's trace, as a child of its own span.
	tp := strings.TrimSpace(testenv.ReadFile(t, filepath.Join(mark, "traceparent")))
	if want := fmt.Sprintf("00-%s-%s-01", root.TraceID, engine.SpanID); tp != want {
		t.Fatalf("the engine's TRACEPARENT %q, want %q", tp, want)
	}
	env := testenv.ReadFile(t, filepath.Join(mark, "env"))
	if strings.Contains(env, "otlp-secret-tok") || strings.Contains(env, "OTEL_EXPORTER_OTLP_HEADERS") {
		t.Fatal("the exporter's credentials reached the engine")
	}
	if hs := rcv.Headers(); len(hs) == 0 || hs[0].Get("Authorization") != "Bearer otlp-secret-tok" {
		t.Fatalf("the collector did not get the configured headers: %v", hs)
	}
	// Never the prompt, never a secret, in any attribute.
	for _, s := range trace {
		for k, v := range s.Attrs {
			if str, ok := v.(string); ok && (strings.Contains(str, "Do the work") || strings.Contains(str, "otlp-secret-tok")) {
				t.Errorf("span %s attribute %s = %q", s.Name, k, str)
			}
		}
	}
}

// Bad OTEL_* input is one clear line and exit 2, before any job is taken.
func TestRunBadOTELEndpoint(t *testing.T) {
	t.Parallel() // its own home, repos and processes: it runs beside the others
	h := clitest.BinHome(t)
	h.Repo(t, "app", nil)
	h.Submit(t, "untouched", clitest.ScriptJob("app", "echo x > x.txt", "ship: branch"))
	for _, c := range []struct{ env, want string }{
		{"OTEL_EXPORTER_OTLP_ENDPOINT=localhost:4318", "OTEL_EXPORTER_OTLP_ENDPOINT"},
		{"OTEL_EXPORTER_OTLP_PROTOCOL=grpc", "OTLP/HTTP only"},
	} {
		hh := *h
		hh.Env = append(append([]string{}, h.Env...), "OTEL_EXPORTER_OTLP_ENDPOINT=http://127.0.0.1:4318", c.env)
		r := hh.Run(t, "run", "--once")
		if r.Code != 2 || !strings.Contains(r.Stderr, c.want) || strings.Count(strings.TrimSpace(r.Stderr), "\n") != 0 {
			t.Errorf("%s: %s", c.env, r)
		}
	}
	// Claude's telemetry asked for without an endpoint.
	hh := *h
	hh.Env = append(append([]string{}, h.Env...), "AQ_CLAUDE_TELEMETRY=1")
	if r := hh.Run(t, "run", "--once"); r.Code != 2 || !strings.Contains(r.Stderr, "AQ_CLAUDE_TELEMETRY") {
		t.Errorf("claude telemetry without an endpoint: %s", r)
	}
	if v := show(t, h, "untouched"); v.Stage != "inbox" {
		t.Fatalf("a job moved: %+v", v)
	}
}

// A collector that is down: the job runs and ships as without tracing; the
// log says once that spans are dropped.
func TestRunOTLPEndpointDown(t *testing.T) {
	t.Parallel() // its own home, repos and processes: it runs beside the others
	h := clitest.BinHome(t)
	h.Repo(t, "app", nil)
	h.Submit(t, "untraced", clitest.ScriptJob("app", "echo x > x.txt", "ship: branch"))
	h.Env = append(h.Env, "OTEL_EXPORTER_OTLP_ENDPOINT=http://127.0.0.1:1") // nothing listens on port 1
	r := h.Run(t, "run", "--once")
	if r.Code != 0 {
		t.Fatalf("aq run --once: %s", r)
	}
	if n := strings.Count(r.Stderr, "cannot export traces"); n != 1 {
		t.Fatalf("%d warnings about dropped spans, want 1:\n%s", n, r.Stderr)
	}
	if v := show(t, h, "untraced"); v.Stage != "shipped" {
		t.Fatalf("job %+v", v)
	}
}
