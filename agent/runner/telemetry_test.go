package runner_test

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"testing"

	"github.com/aqfleet/aq/agent/runner"
	"github.com/aqfleet/aq/engines"
	"github.com/aqfleet/aq/internal/testenv"
	"github.com/aqfleet/aq/job"
)

// fakeClaudeEnv is a claude (testenv.FakeClaude) that records its
// environment and prints a recorded stream-json run of the real claude
// (engines/testdata/claude/success.jsonl).
func fakeClaudeEnv(t *testing.T, envFile string) *engines.Claude {
	t.Helper()
	bin := testenv.FakeClaude{Script: fmt.Sprintf("env > %q\necho changed > claude.txt", envFile),
		Stream: filepath.Join(testenv.ClaudeTestdata(t), "success.jsonl")}.Write(t, t.TempDir())
	return &engines.Claude{Bin: bin}
}

// AQ_CLAUDE_TELEMETRY reaches the claude engine's environment (telemetry on,
// the OTLP exporters, its own service name, the job id as a resource
// attribute), the exporter's headers never do; off, none of it is set and
// none of the factory's OTEL_* settings reach claude (its environment is
// built: issue #26).
func TestClaudeTelemetryEnv(t *testing.T) {
	testenv.Slow(t, "runs whole jobs with real git, processes and waits")
	for _, on := range []bool{true, false} {
		t.Run(fmt.Sprint(on), func(t *testing.T) {
			envFile := filepath.Join(t.TempDir(), "env")
			f := newFixture(t, fakeClaudeEnv(t, envFile))
			f.r.Cfg.ClaudeTelemetry = on
			f.r.Env = append(f.r.Env, "ANTHROPIC_API_KEY=sk-test", "OTEL_EXPORTER_OTLP_ENDPOINT=http://127.0.0.1:4318",
				"OTEL_SERVICE_NAME=aq-factory", "OTEL_EXPORTER_OTLP_HEADERS=Authorization=Bearer otlp-secret")
			j := f.job(fmt.Sprintf("claude-otel-%v", on), "")
			j.Engine = "claude"
			out := f.run(context.Background(), j, runner.Options{})
			if out.Failed() || out.Stage != job.Testing {
				t.Fatalf("outcome %+v", out)
			}
			env := testenv.ReadFile(t, envFile)
			has := func(kv string) bool { return strings.Contains("\n"+env, "\n"+kv+"\n") }
			for _, kv := range []string{"CLAUDE_CODE_ENABLE_TELEMETRY=1", "OTEL_METRICS_EXPORTER=otlp", "OTEL_LOGS_EXPORTER=otlp", "OTEL_TRACES_EXPORTER=otlp",
				"OTEL_SERVICE_NAME=claude-code", "OTEL_RESOURCE_ATTRIBUTES=aq.job.id=" + j.ID} {
				if has(kv) != on {
					t.Errorf("telemetry %v: %s in claude's environment: %v", on, kv, has(kv))
				}
			}
			if has("OTEL_EXPORTER_OTLP_ENDPOINT=http://127.0.0.1:4318") != on || has("OTEL_SERVICE_NAME=aq-factory") {
				t.Errorf("telemetry %v: endpoint or service name wrong:\n%s", on, env)
			}
			if strings.Contains(env, "otlp-secret") {
				t.Error("the OTLP headers reached claude")
			}
		})
	}
}
