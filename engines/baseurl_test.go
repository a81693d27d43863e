package engines

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestBaseURLs (#33 item 4): an engine's base URL counts wherever it is
// set — its variable, claude's settings.json "env", codex's config.toml
// (openai_base_url, model_providers.<id>.base_url) — and a settings file
// that is not one (a FIFO, garbage, too large) sets none without blocking.
func TestBaseURLs(t *testing.T) {
	home := t.TempDir()
	write := func(rel, body string) {
		p := filepath.Join(home, rel)
		if err := os.MkdirAll(filepath.Dir(p), 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write(".claude/settings.json", `{"env":{"ANTHROPIC_BASE_URL":"http://localhost:4000","OTHER":"x"},"model":"opus"}`)
	write(".codex/config.toml", "openai_base_url = \"http://127.0.0.1:5000/v1\"\nmodel_provider = \"gw\"\n[model_providers.gw]\nbase_url = \"https://gw.example.com/v1\"\n[model_providers.plain]\nname = \"x\"\n")
	env := []string{"HOME=" + home, "ANTHROPIC_BASE_URL=https://llm-gw.example.com:8443/anthropic"}
	got := func(engine string) string {
		var s []string
		for _, b := range BaseURLs(engine, env) {
			s = append(s, b.Where()+"="+b.Value+" "+b.HostPort())
		}
		return strings.Join(s, "\n")
	}
	if want := "ANTHROPIC_BASE_URL=https://llm-gw.example.com:8443/anthropic llm-gw.example.com:8443\n" +
		"ANTHROPIC_BASE_URL in " + filepath.Join(home, ".claude/settings.json") + "=http://localhost:4000 localhost:4000"; got("claude") != want {
		t.Errorf("claude:\n%s\nwant\n%s", got("claude"), want)
	}
	cfg := filepath.Join(home, ".codex/config.toml")
	if want := "openai_base_url in " + cfg + "=http://127.0.0.1:5000/v1 127.0.0.1:5000\n" +
		"model_providers.gw.base_url in " + cfg + "=https://gw.example.com/v1 gw.example.com:443"; got("codex") != want {
		t.Errorf("codex:\n%s\nwant\n%s", got("codex"), want)
	}
	if b := BaseURLs("script", env); len(b) != 0 {
		t.Errorf("script: %v", b)
	}
	// Files that are not settings: garbage, one over the bound (a FIFO:
	// TestBaseURLsFIFO).
	write(".claude/settings.json", "{not json")
	if b := BaseURLs("claude", []string{"HOME=" + home}); len(b) != 0 {
		t.Errorf("garbage settings.json: %v", b)
	}
	write(".claude/settings.json", `{"env":{"ANTHROPIC_BASE_URL":"http://localhost:1"},"pad":"`+strings.Repeat("x", maxSettingsBytes)+`"}`)
	if b := BaseURLs("claude", []string{"HOME=" + home}); len(b) != 0 {
		t.Errorf("an oversized settings.json: %v", b)
	}
}

// TestBaseURLCheck (#33, bad input): a base URL no engine could use is one
// line naming the setting and what to set; credentials in it are never
// shown.
func TestBaseURLCheck(t *testing.T) {
	for _, tc := range []struct{ value, want string }{
		{"https://llm-gw.example.com", ""},
		{"http://127.0.0.1:4000/v1", ""},
		{"http://[::1]:4000", ""},
		{"llm-gw.example.com", `ANTHROPIC_BASE_URL="llm-gw.example.com" has no scheme (http:// or https://)`},
		{"/v1/messages", `ANTHROPIC_BASE_URL="/v1/messages" has no scheme`},
		{"localhost:4000", `ANTHROPIC_BASE_URL="localhost:4000" has no scheme`},
		{"127.0.0.1:4000", `is not a URL`},
		{"ftp://gw.example.com", `has scheme "ftp", not http or https`},
		{"http://", `has no host`},
		{"http://gw.example.com:99999", `has port "99999"`},
		{"gw:s3cret@gw.example.com", `"***@gw.example.com" has no scheme`},
		{"ftp://u:s3cret@gw.example.com", `"ftp://***@gw.example.com" has scheme "ftp"`},
	} {
		err := BaseURL{Var: "ANTHROPIC_BASE_URL", Value: tc.value}.Check()
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("%q: %v, want no error", tc.value, err)
		case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("%q: %v, want %q", tc.value, err, tc.want)
		case err != nil && (strings.Contains(err.Error(), "s3cret") || !strings.Contains(err.Error(), "set it to a URL such as")):
			t.Errorf("%q: %q shows the password or not the fix", tc.value, err)
		}
	}
	if r := (BaseURL{Value: "https://u:s3cret@gw.example.com/v1"}).Redacted(); strings.Contains(r, "s3cret") {
		t.Errorf("Redacted: %q", r)
	}
	if err := CheckBaseURLs([]string{"HOME=" + t.TempDir(), "OPENAI_BASE_URL=api.openai.example/v1"}); err == nil || !strings.HasPrefix(err.Error(), "OPENAI_BASE_URL=") {
		t.Errorf("CheckBaseURLs: %v", err)
	}
}
