package egress

import (
	"fmt"
	"net/url"
	"slices"
	"sort"
	"strings"
)

// sets are the named opt-in sets of AQ_SANDBOX_NET ("@name"). Nothing here
// is allowed by default: a job that installs dependencies needs its
// ecosystem's set (or @registries) named. docs/sandbox.md lists them; a
// test holds the two the same.
var sets = map[string][]string{
	"npm":      {"registry.npmjs.org", "registry.yarnpkg.com"},
	"pypi":     {"pypi.org", "files.pythonhosted.org"},
	"go":       {"proxy.golang.org", "sum.golang.org"},
	"crates":   {"crates.io", "index.crates.io", "static.crates.io"},
	"maven":    {"repo.maven.apache.org", "repo1.maven.org", "plugins.gradle.org", "plugins-artifacts.gradle.org", "services.gradle.org", "downloads.gradle.org"},
	"rubygems": {"rubygems.org", "index.rubygems.org"},
	"nuget":    {"api.nuget.org"},
	"github":   {"github.com", "api.github.com", "codeload.github.com", "objects.githubusercontent.com", "raw.githubusercontent.com"},
}

// registrySets make up @registries: the package registries of the common
// ecosystems (not @github: fetching code from any repository is a wider
// door than fetching published packages).
var registrySets = []string{"npm", "pypi", "go", "crates", "maven", "rubygems", "nuget"}

func init() {
	var all []string
	for _, s := range registrySets {
		all = append(all, sets[s]...)
	}
	sets["registries"] = all
}

// SetNames are the sets' tokens ("@go", "@npm", …), sorted.
func SetNames() []string {
	var names []string
	for n := range sets {
		names = append(names, "@"+n)
	}
	sort.Strings(names)
	return names
}

// SetHosts are the hosts of set name ("@npm" or "npm"); nil when there is
// no such set.
func SetHosts(name string) []string {
	return slices.Clone(sets[strings.TrimPrefix(strings.ToLower(name), "@")])
}

// engineHosts are each engine's own endpoints: its model API and the
// hosts its login refreshes tokens at. An engine's telemetry (claude's
// statsig and sentry, …) is not among them: it is refused and counted
// like any other host unless allowed.
var engineHosts = map[string][]string{
	// Claude Code: the Messages API; claude.ai and the console for an
	// OAuth login's token refresh.
	"claude": {"api.anthropic.com", "claude.ai", "console.anthropic.com", "platform.claude.com"},
	// Codex CLI: the OpenAI API (CODEX_API_KEY), ChatGPT's backend and
	// auth for a ChatGPT login.
	"codex": {"api.openai.com", "chatgpt.com", "auth.openai.com"},
	// Devin CLI: Cognition's service.
	"devin": {"devin.ai", "*.devin.ai"},
	// The script engine is the job's own command: nothing of its own.
	"script": nil,
}

// baseURLEnv is the variable through which each engine is pointed at a
// gateway instead of its vendor's API: its host is then the engine's
// endpoint too.
var baseURLEnv = map[string][]string{
	"claude": {"ANTHROPIC_BASE_URL"},
	"codex":  {"OPENAI_BASE_URL"},
}

// EngineHosts are engine's built-in endpoints, as AQ_SANDBOX_NET entries
// (nil for an engine aq has none for).
func EngineHosts(engine string) []string {
	return slices.Clone(engineHosts[engine])
}

// EngineHostSet is AQ_SANDBOX_ENGINE_HOSTS: for the engines it names, the
// endpoints that replace the built-in ones (a gateway in front of the
// vendor's API, a regional endpoint).
type EngineHostSet map[string][]string

// ParseEngineHosts reads "engine=host host;engine=host": for each engine
// named, its endpoints, in AQ_SANDBOX_NET's syntax (space- or
// comma-separated), replacing the built-in list. An engine named with no
// host has none.
func ParseEngineHosts(spec string) (EngineHostSet, error) {
	out := EngineHostSet{}
	for _, part := range strings.Split(spec, ";") {
		part = strings.TrimSpace(part)
		if part == "" {
			continue
		}
		name, hosts, ok := strings.Cut(part, "=")
		name = strings.TrimSpace(name)
		if !ok || name == "" {
			return nil, fmt.Errorf("entry %q is not engine=hosts (e.g. claude=llm-gateway.example.com:443; engines are separated by ;)", part)
		}
		list := strings.FieldsFunc(hosts, func(r rune) bool { return r == ' ' || r == ',' || r == '\t' })
		if _, err := ParseRules(strings.Join(list, ",")); err != nil {
			return nil, fmt.Errorf("engine %s: %w", name, err)
		}
		out[name] = list
	}
	return out, nil
}

// For is the endpoints engine's proxy allows: the set's list for it when it
// names the engine, else the built-in one, plus the host of the engine's
// base-URL variable when env (the engine's environment) sets one.
func (s EngineHostSet) For(engine string, env []string) []string {
	hosts, ok := s[engine]
	if !ok {
		hosts = engineHosts[engine]
	}
	hosts = slices.Clone(hosts)
	for _, k := range baseURLEnv[engine] {
		for _, kv := range env {
			v, ok := strings.CutPrefix(kv, k+"=")
			if !ok || v == "" {
				continue
			}
			if u, err := url.Parse(v); err == nil && u.Hostname() != "" {
				hosts = append(hosts, u.Host)
			}
		}
	}
	return hosts
}
