package engines

import (
	"slices"
	"strings"

	"github.com/aqfleet/aq/internal/secrets"
)

// The engine's environment (docs/engines.md#the-engines-environment) is
// built, not inherited minus a list: from the factory's environment an
// engine gets only the variables named here — what a coding tool needs to
// run the project's build (PATH, HOME, locale, time zone, terminal, proxy
// and trust roots, the toolchains' own variables), its own credential and
// settings, and what the operator names in AQ_ENGINE_ENV. Nothing else of
// aq's reaches it: not AQ_HOME, the coordinator's URL, the repo base, the
// credentials aq ships with (GH_TOKEN, GITHUB_TOKEN), git's credential and
// transport variables, nor SSH_AUTH_SOCK. The process layer adds the job's
// tag (AQ_JOB_ID, AQ_SCOPE). The environment aq builds for git and gh when
// it ships is another one, and keeps what they need.

// BaseEnv are the variables every engine (and a job's verify command) gets
// from the factory's environment when set there.
var BaseEnv = []string{
	// The shell and the user.
	"PATH", "HOME", "USER", "LOGNAME", "SHELL", "TMPDIR",
	// Locale, time zone, terminal.
	"LANG", "LANGUAGE", "TZ", "TERM", "COLORTERM", "NO_COLOR",
	// Proxies and trust roots: a factory behind a proxy needs them for any
	// download.
	"HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "no_proxy", "all_proxy",
	"SSL_CERT_FILE", "SSL_CERT_DIR", "NODE_EXTRA_CA_CERTS", "REQUESTS_CA_BUNDLE",
	// Toolchains: where their caches and installs live, so a build does not
	// start from nothing.
	"GOPATH", "GOCACHE", "GOMODCACHE", "GOROOT", "GOPROXY", "GOFLAGS", "GOTOOLCHAIN", "GONOSUMDB", "GOPRIVATE",
	"JAVA_HOME", "MAVEN_OPTS", "GRADLE_USER_HOME",
	"CARGO_HOME", "RUSTUP_HOME",
	"NODE_OPTIONS", "NPM_CONFIG_CACHE", "NVM_DIR", "PNPM_HOME", "BUN_INSTALL",
	"PYTHONPATH", "VIRTUAL_ENV", "UV_CACHE_DIR", "PIP_CACHE_DIR",
	// A commit identity (never a credential).
	"GIT_AUTHOR_NAME", "GIT_AUTHOR_EMAIL", "GIT_COMMITTER_NAME", "GIT_COMMITTER_EMAIL",
}

// basePrefixes are prefixes of variables every engine gets (LC_*: locale).
var basePrefixes = []string{"LC_"}

// engineEnv are each engine's own variables — its credential and settings
// — given to that engine only (never to another, nor to verify). A name
// ending in '*' is a prefix.
var engineEnv = map[string][]string{
	"claude": {"ANTHROPIC_*", "CLAUDE_CODE_*", "CLAUDE_CONFIG_DIR", "DISABLE_*", "MCP_TIMEOUT", "MCP_TOOL_TIMEOUT",
		// Bedrock and Vertex (CLAUDE_CODE_USE_BEDROCK / _VERTEX).
		"AWS_REGION", "AWS_PROFILE", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_BEARER_TOKEN_BEDROCK",
		"CLOUD_ML_REGION", "GOOGLE_APPLICATION_CREDENTIALS", "GOOGLE_CLOUD_PROJECT"},
	"codex":  {"OPENAI_*", "CODEX_*"},
	"devin":  {"DEVIN_*"},
	"script": {},
}

// Environ is the environment of engine (claude, codex, devin, script; ""
// for a job's verify command, which gets the base only) built from host,
// the factory's environment: BaseEnv, the engine's own variables, and the
// names in pass (AQ_ENGINE_ENV) — never one of aq's secrets, whatever it is
// named in. Inherited agent markers (CLAUDECODE, …) are dropped as
// secrets.EngineEnv drops them. The order of host is kept.
func Environ(host []string, engine string, pass []string) []string {
	own := engineEnv[engine]
	out := make([]string, 0, len(BaseEnv)+len(own)+len(pass))
	for _, kv := range host {
		name, _, ok := strings.Cut(kv, "=")
		if !ok || name == "" {
			continue
		}
		if slices.Contains(BaseEnv, name) || hasPrefix(name, basePrefixes) || matches(name, own) || slices.Contains(pass, name) {
			out = append(out, kv)
		}
	}
	return secrets.EngineEnv(out)
}

// EnvNames are the names and prefixes (ending in '*') engine gets besides
// BaseEnv, for docs and `aq caps`.
func EnvNames(engine string) []string { return append([]string{}, engineEnv[engine]...) }

func matches(name string, patterns []string) bool {
	for _, p := range patterns {
		if pre, ok := strings.CutSuffix(p, "*"); ok {
			if strings.HasPrefix(name, pre) {
				return true
			}
		} else if name == p {
			return true
		}
	}
	return false
}

func hasPrefix(name string, prefixes []string) bool {
	for _, p := range prefixes {
		if strings.HasPrefix(name, p) {
			return true
		}
	}
	return false
}
