package engines

import (
	"slices"
	"strings"
	"testing"
)

// TestEnviron (issue #26, finding 4): an engine's environment is built from
// the documented base, its own credential and AQ_ENGINE_ENV — nothing else
// of the factory's: not aq's settings, not the credentials aq ships with,
// not git's credential or transport variables, not SSH_AUTH_SOCK, not
// another engine's key.
func TestEnviron(t *testing.T) {
	host := []string{
		"PATH=/usr/bin", "HOME=/home/f", "LANG=C.UTF-8", "LC_ALL=C.UTF-8", "TZ=UTC", "TERM=xterm", "HTTPS_PROXY=http://proxy:3128",
		"GOPATH=/go", "GOCACHE=/cache/go", "JAVA_HOME=/jdk", "CARGO_HOME=/cargo", "NODE_OPTIONS=--max-old-space-size=4096",
		"AQ_HOME=/home/f/.aq", "AQ_FLEET_API=https://coord/api", "AQ_REPO_BASE=/src", "AQ_FLEET_TOKEN=aqf_secret",
		"AQ_REPO_URLS=https://github.com/org/{repo}.git", "GH_TOKEN=gho_x", "GITHUB_TOKEN=ghp_x", "SSH_AUTH_SOCK=/tmp/agent.sock",
		"GIT_ASKPASS=/usr/bin/askpass", "GIT_SSH_COMMAND=ssh -i key", "GIT_CONFIG_GLOBAL=/etc/aq/gitconfig", "GIT_CONFIG_PARAMETERS='credential.helper=store'",
		"SSH_ASKPASS=/usr/bin/ssh-askpass", "AWS_SECRET_ACCESS_KEY=aws", "ANTHROPIC_API_KEY=sk-ant", "CLAUDE_CONFIG_DIR=/c",
		"OPENAI_API_KEY=sk-oai", "CODEX_HOME=/codex", "DEVIN_API_KEY=dv", "CLAUDECODE=1", "MY_TOOL_HOME=/t", "GIT_AUTHOR_NAME=aq",
		"AQ_OTHER_TOKEN=x", "SOMETHING=else",
	}
	base := []string{"PATH", "HOME", "LANG", "LC_ALL", "TZ", "TERM", "HTTPS_PROXY", "GOPATH", "GOCACHE", "JAVA_HOME", "CARGO_HOME", "NODE_OPTIONS", "GIT_AUTHOR_NAME"}
	never := []string{"AQ_HOME", "AQ_FLEET_API", "AQ_REPO_BASE", "AQ_FLEET_TOKEN", "AQ_REPO_URLS", "GH_TOKEN", "GITHUB_TOKEN", "SSH_AUTH_SOCK",
		"GIT_ASKPASS", "GIT_SSH_COMMAND", "GIT_CONFIG_GLOBAL", "GIT_CONFIG_PARAMETERS", "SSH_ASKPASS", "CLAUDECODE", "SOMETHING", "AQ_OTHER_TOKEN"}
	names := func(env []string) []string {
		var out []string
		for _, kv := range env {
			k, _, _ := strings.Cut(kv, "=")
			out = append(out, k)
		}
		return out
	}
	for _, c := range []struct {
		engine string
		pass   []string
		own    []string // given to this engine besides the base
		not    []string // other engines' (or verify's) variables it must not get
	}{
		{"claude", nil, []string{"ANTHROPIC_API_KEY", "CLAUDE_CONFIG_DIR", "AWS_SECRET_ACCESS_KEY"}, []string{"OPENAI_API_KEY", "CODEX_HOME", "DEVIN_API_KEY", "MY_TOOL_HOME"}},
		{"codex", nil, []string{"OPENAI_API_KEY", "CODEX_HOME"}, []string{"ANTHROPIC_API_KEY", "AWS_SECRET_ACCESS_KEY", "DEVIN_API_KEY"}},
		{"devin", nil, []string{"DEVIN_API_KEY"}, []string{"ANTHROPIC_API_KEY", "OPENAI_API_KEY"}},
		{"script", []string{"MY_TOOL_HOME", "AQ_FLEET_TOKEN"}, []string{"MY_TOOL_HOME"}, []string{"ANTHROPIC_API_KEY", "OPENAI_API_KEY", "DEVIN_API_KEY"}},
		{"", nil, nil, []string{"ANTHROPIC_API_KEY", "OPENAI_API_KEY", "DEVIN_API_KEY", "MY_TOOL_HOME"}},
	} {
		t.Run("engine "+c.engine, func(t *testing.T) {
			got := names(Environ(host, c.engine, c.pass))
			for _, n := range append(append([]string{}, base...), c.own...) {
				if !slices.Contains(got, n) {
					t.Errorf("%s is missing: %v", n, got)
				}
			}
			for _, n := range append(append([]string{}, never...), c.not...) {
				if slices.Contains(got, n) {
					t.Errorf("%s reached the engine: %v", n, got)
				}
			}
		})
	}
}
