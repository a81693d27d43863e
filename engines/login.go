package engines

import (
	"os"
	"path/filepath"

	"github.com/aqfleet/aq/internal/sandbox"
)

// Login is what an engine needs of the user's home to log in and work in
// a home of its own (the job's, in aq's sandbox: docs/sandbox.md): the
// files to copy there, and the variables that point it at them.
type Login struct {
	Files []sandbox.LoginFile
	// Env are variables to set in the sandbox, each to a path relative to
	// the job's home: the engine's own config directory when the user had
	// moved it (CLAUDE_CONFIG_DIR, CODEX_HOME).
	Env []HomeVar
}

// HomeVar is a variable set to a path below the job's home.
type HomeVar struct{ Name, Rel string }

// loginRefresh are, per engine, the fields of its rotating login file a
// token refresh may change (sandbox.LoginFile.Refresh): the write-back
// takes the engine's copy only when nothing else in it changed.
//
//   - claude .credentials.json: the OAuth access token, refresh token and
//     expiry;
//   - codex auth.json: its tokens and when it last refreshed them;
//   - devin credentials.toml: its format is not documented; any field
//     named like a token or its expiry, at any depth.
var loginRefresh = map[string][]string{
	"claude": {"claudeAiOauth.accessToken", "claudeAiOauth.refreshToken", "claudeAiOauth.expiresAt"},
	"codex":  {"tokens.**", "last_refresh"},
	"devin":  {"**.access_token", "**.refresh_token", "**.token", "**.expires_at", "**.expires_in", "**.expiry"},
}

// LoginOf says what engine needs of the user's home, given the engine's
// environment (HOME, and the variables that move its config directory):
//
//   - claude: $CLAUDE_CONFIG_DIR (~/.claude) .credentials.json — its OAuth
//     tokens, which it refreshes and whose refresh token rotates, so the
//     copy is written back — and settings.json, and ~/.claude.json;
//   - codex: $CODEX_HOME (~/.codex) auth.json (refreshed: written back) and
//     config.toml;
//   - devin: $XDG_DATA_HOME (~/.local/share)/devin/credentials.toml and
//     $XDG_CONFIG_HOME (~/.config)/devin/config.json;
//   - script: nothing.
func LoginOf(engine string, env []string) Login {
	home := envValue(env, "HOME")
	if home == "" {
		home, _ = os.UserHomeDir()
	}
	under := func(v, def string) (string, bool) {
		if d := envValue(env, v); d != "" {
			return d, true
		}
		return filepath.Join(home, def), false
	}
	var l Login
	file := func(src, rel string, rotates bool) {
		l.Files = append(l.Files, sandbox.LoginFile{Src: src, Rel: rel, Rotates: rotates, Refresh: loginRefresh[engine]})
	}
	switch engine {
	case "claude":
		dir, moved := under("CLAUDE_CONFIG_DIR", ".claude")
		file(filepath.Join(dir, ".credentials.json"), ".claude/.credentials.json", true)
		file(filepath.Join(dir, "settings.json"), ".claude/settings.json", false)
		if moved {
			file(filepath.Join(dir, ".claude.json"), ".claude/.claude.json", false)
			l.Env = append(l.Env, HomeVar{"CLAUDE_CONFIG_DIR", ".claude"})
		} else {
			file(filepath.Join(home, ".claude.json"), ".claude.json", false)
		}
	case "codex":
		dir, moved := under("CODEX_HOME", ".codex")
		file(filepath.Join(dir, "auth.json"), ".codex/auth.json", true)
		file(filepath.Join(dir, "config.toml"), ".codex/config.toml", false)
		if moved {
			l.Env = append(l.Env, HomeVar{"CODEX_HOME", ".codex"})
		}
	case "devin":
		data, _ := under("XDG_DATA_HOME", ".local/share")
		cfg, _ := under("XDG_CONFIG_HOME", ".config")
		file(filepath.Join(data, "devin", "credentials.toml"), ".local/share/devin/credentials.toml", true)
		file(filepath.Join(cfg, "devin", "config.json"), ".config/devin/config.json", false)
	}
	return l
}
