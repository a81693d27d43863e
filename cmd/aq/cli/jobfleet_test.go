package cli

import (
	"path/filepath"
	"strings"
	"testing"

	"github.com/aqfleet/aq/cmd/aq/clitest"
	"github.com/aqfleet/aq/internal/testenv"
)

var idFleetLogs = testenv.ID("fleet-logs")

// TestJobLogsFollowFleetFromAnotherHost: a job that ran on another factory
// is followed from the coordinator: its events, then the engine output its
// factory uploaded as an artifact, rendered for a person (or raw).
func TestJobLogsFollowFleetFromAnotherHost(t *testing.T) {
	testenv.Slow(t, "runs commands end to end with real git and a coordinator")
	s, dir, _ := clitest.FleetEnv(t)
	stream := `{"type":"system","subtype":"init","model":"claude-x","session_id":"s-1","claude_code_version":"2.1.0"}
{"type":"assistant","message":{"id":"m1","model":"claude-x","content":[{"type":"tool_use","name":"Edit","input":{"file_path":"src/main.go"}}],"usage":{"input_tokens":100,"output_tokens":20}}}
{"type":"result","subtype":"success","is_error":false,"num_turns":1,"result":"done","total_cost_usd":0.5,"usage":{"input_tokens":100,"output_tokens":20}}`
	testenv.WriteFile(t, filepath.Join(dir, "stream.jsonl"), stream+"\n")
	m := clitest.WriteManifest(t, dir, idFleetLogs, "script: cat "+filepath.Join(dir, "stream.jsonl")+"; echo x > x.txt\nship: branch")
	if _, errOut, code := runAQ(t, "submit", m); code != 0 {
		t.Fatal(errOut)
	}
	if _, errOut, code := runAQ(t, "run", "--once"); code != 0 {
		t.Fatal(errOut)
	}
	// Another host: a fresh AQ_HOME, the factory's token as an operator's.
	t.Setenv("AQ_HOME", filepath.Join(dir, "operator-home"))
	out, errOut, code := runAQ(t, "job", "logs", "-f", idFleetLogs)
	if code != 0 {
		t.Fatalf("logs -f: %d %q", code, errOut)
	}
	for _, want := range []string{"◆ ", "stage shipped", "engine output of attempt 1, live from factory cli-factory", "→ Edit src/main.go", "■ result: success", "$0.5000"} {
		if !strings.Contains(out, want) {
			t.Errorf("logs -f lacks %q:\n%s", want, out)
		}
	}
	out, _, code = runAQ(t, "job", "logs", "-f", "--raw", idFleetLogs)
	if code != 0 || !strings.Contains(out, `{"type":"result","subtype":"success"`) || strings.Contains(out, "→ Edit") {
		t.Fatalf("--raw: %d\n%s", code, out)
	}
	out, _, code = runAQ(t, "job", "logs", "--stream", "stdout", idFleetLogs)
	if code != 0 || !strings.Contains(out, `"claude_code_version":"2.1.0"`) {
		t.Fatalf("logs from the artifacts: %d %q", code, out)
	}
	if len(s.Artifacts(idFleetLogs)) == 0 {
		t.Fatal("no artifacts")
	}
}
