package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/aqfleet/aq/agent/config"
	"github.com/aqfleet/aq/cmd/aq/clitest"
)

// runAQ runs one aq command line in-process and returns its output and code.
func runAQ(t *testing.T, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	return runAQContext(t, context.Background(), args...)
}

// runAQContext is runAQ under ctx.
func runAQContext(t *testing.T, ctx context.Context, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	var out, errb bytes.Buffer
	code = Run(ctx, args, IO{In: strings.NewReader(""), Out: &out, Err: &errb})
	return out.String(), errb.String(), code
}

func TestVersion(t *testing.T) {
	clitest.CleanEnv(t)
	out, _, code := runAQ(t, "version")
	if code != 0 || !strings.HasPrefix(out, "aq ") || !strings.Contains(out, runtime.Version()) {
		t.Fatalf("code %d out %q", code, out)
	}
	out, _, code = runAQ(t, "version", "--json")
	var v map[string]string
	if code != 0 || json.Unmarshal([]byte(out), &v) != nil || v["goVersion"] != runtime.Version() || v["version"] == "" || v["commit"] == "" {
		t.Fatalf("code %d json %q", code, out)
	}
}

// TestVersionFlag: `aq --version` and `aq -v` print what `aq version`
// prints; -v is the root's only (`aq gc -v` is gc's --verbose).
func TestVersionFlag(t *testing.T) {
	clitest.CleanEnv(t)
	want, _, code := runAQ(t, "version")
	if code != 0 {
		t.Fatalf("aq version: exit %d", code)
	}
	for _, args := range [][]string{{"--version"}, {"-v"}} {
		out, errOut, code := runAQ(t, args...)
		if code != 0 || out != want || errOut != "" {
			t.Errorf("aq %v: exit %d, stdout %q (want %q), stderr %q", args, code, out, want, errOut)
		}
	}
	// On a subcommand -v is not the version: gc's is --verbose, and the
	// others have none.
	out, _, _ := runAQ(t, "gc", "--help")
	if !strings.Contains(out, "-v, --verbose") {
		t.Errorf("aq gc --help lost -v, --verbose:\n%s", out)
	}
	if _, errOut, code := runAQ(t, "status", "-v"); code != 2 || !strings.Contains(errOut, "unknown shorthand flag: 'v'") {
		t.Errorf("aq status -v: exit %d stderr %q", code, errOut)
	}
}

// TestFlagErrorSuggestsTheCommandsHelp: a flag error names the help of the
// command it was given to — `aq --help` at the top, never `aq aq --help`.
func TestFlagErrorSuggestsTheCommandsHelp(t *testing.T) {
	clitest.CleanEnv(t)
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--bogus"}, "(run 'aq --help')"},
		{[]string{"-x"}, "(run 'aq --help')"},
		{[]string{"gc", "--bogus"}, "(run 'aq gc --help')"},
		{[]string{"job", "show", "--bogus", "x"}, "(run 'aq job show --help')"},
	} {
		_, errOut, code := runAQ(t, c.args...)
		if code != 2 || !strings.Contains(errOut, c.want) || strings.Contains(errOut, "aq aq") {
			t.Errorf("aq %v: exit %d stderr %q, want %s", c.args, code, errOut, c.want)
		}
	}
}

func TestUsageErrorsExit2WithOneLine(t *testing.T) {
	clitest.CleanEnv(t)
	for _, args := range [][]string{
		{"nosuchcommand"},
		{"version", "--nosuchflag"},
		{"version", "extra-arg"},
		{"config", "--heartbeat-sec=abc"},
	} {
		_, errOut, code := runAQ(t, args...)
		if code != 2 {
			t.Errorf("%v: exit %d, want 2 (stderr %q)", args, code, errOut)
		}
		lines := strings.Split(strings.TrimRight(errOut, "\n"), "\n")
		if len(lines) != 1 || !strings.HasPrefix(lines[0], "aq: ") || !strings.Contains(lines[0], "(") {
			t.Errorf("%v: stderr must be one 'aq: what (fix)' line, got %q", args, errOut)
		}
	}
}

func TestConfigInvalidEnvExit2(t *testing.T) {
	clitest.CleanEnv(t)
	t.Setenv("AQ_HEARTBEAT_SEC", "120")
	_, errOut, code := runAQ(t, "config")
	if code != 2 || !strings.Contains(errOut, "AQ_HEARTBEAT_SEC") {
		t.Fatalf("exit %d stderr %q", code, errOut)
	}
}

func TestConfigShowsSourcesAndMasksSecrets(t *testing.T) {
	dir := clitest.CleanEnv(t)
	tok := filepath.Join(dir, "tok")
	os.WriteFile(tok, []byte("tok-from-file-123"), 0o600)
	t.Setenv("AQ_SB_CONNECTION_STRING", "Endpoint=sb://127.0.0.1:1;SharedAccessKeyName=k;SharedAccessKey=secretkey")
	t.Setenv("POLL_SECONDS", "9")
	out, errOut, code := runAQ(t, "config", "--json", "--fleet-token-file", tok, "--heartbeat-sec", "20")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	if strings.Contains(out, "tok-from-file-123") || strings.Contains(out, "secretkey") {
		t.Fatalf("secret leaked: %s", out)
	}
	var settings []config.Setting
	if err := json.Unmarshal([]byte(out), &settings); err != nil {
		t.Fatal(err)
	}
	got := map[string]config.Setting{}
	for _, s := range settings {
		got[s.Key] = s
	}
	if s := got["fleet_token"]; s.Value != "***" || s.Source != config.FromFlag {
		t.Errorf("fleet_token %+v", s)
	}
	if s := got["sb_connection_string"]; s.Value != "***" || s.Source != config.FromEnv {
		t.Errorf("sb_connection_string %+v", s)
	}
	if s := got["heartbeat_sec"]; s.Value != "20" || s.Source != config.FromFlag {
		t.Errorf("heartbeat_sec %+v", s)
	}
	if s := got["poll_seconds"]; s.Value != "9" || s.Origin != "POLL_SECONDS" {
		t.Errorf("poll_seconds %+v", s)
	}
	if s := got["sb_topic"]; s.Source != config.FromDefault {
		t.Errorf("sb_topic %+v", s)
	}
	if len(settings) != len(config.Keys) {
		t.Errorf("config lists %d keys, want %d", len(settings), len(config.Keys))
	}
	// The human table lists every key too.
	out, _, _ = runAQ(t, "config")
	for _, k := range config.Keys {
		if !strings.Contains(out, k.Name) {
			t.Errorf("table lacks %s", k.Name)
		}
	}
}

func TestCompletion(t *testing.T) {
	clitest.CleanEnv(t)
	out, _, code := runAQ(t, "completion", "bash")
	if code != 0 || !strings.Contains(out, "bash completion") {
		t.Fatalf("exit %d, out %.80q", code, out)
	}
}

func TestErrorMessagesAreRedacted(t *testing.T) {
	clitest.CleanEnv(t)
	t.Setenv("GITHUB_TOKEN", "ghp_leakcheck123")
	// An unknown command echoes its argument; a secret passed there must not be printed.
	_, errOut, _ := runAQ(t, "ghp_leakcheck123")
	if strings.Contains(errOut, "ghp_leakcheck123") {
		t.Fatalf("secret printed: %q", errOut)
	}
}

// TestLogFormatNonsense (#34): a log format that is not one is a usage
// error with one clear line, for every command — aq version, which loads
// no configuration, included.
func TestLogFormatNonsense(t *testing.T) {
	for _, args := range [][]string{{"--log-format", "nonsense", "version"}, {"version", "--log-format=nonsense"}, {"--log-format", "nonsense"}, {"status", "--log-format", "nonsense"}} {
		clitest.CleanEnv(t)
		out, errOut, code := runAQ(t, args...)
		if code != 2 || out != "" || strings.Count(errOut, "\n") != 1 || !strings.Contains(errOut, "nonsense") || !strings.Contains(errOut, "text") {
			t.Errorf("aq %v: exit %d stdout %q stderr %q", args, code, out, errOut)
		}
	}
}
