package engines

import (
	"encoding/json"
	"fmt"
	"net"
	"net/url"
	"path/filepath"
	"sort"
	"strconv"
	"strings"

	"github.com/pelletier/go-toml/v2"

	"github.com/aqfleet/aq/internal/safefs"
)

// BaseURL is where an engine is pointed at a gateway (LiteLLM, a
// company's proxy, a test's fake API) instead of its vendor's API: claude's
// ANTHROPIC_BASE_URL, codex's OPENAI_BASE_URL, set in the engine's
// environment or in the engine's own files that aq copies into a
// sandboxed job's home (claude's settings.json "env", codex's
// config.toml). docs/engines.md, "Gateways".
type BaseURL struct {
	// Var is the setting's name: ANTHROPIC_BASE_URL, OPENAI_BASE_URL,
	// openai_base_url or model_providers.<id>.base_url (config.toml).
	Var string
	// Value is the URL as set.
	Value string
	// From is where it was set: "" for the environment, else the file.
	From string
}

// Where names the setting for a message: the variable, and the file it
// was set in when it was not the environment.
func (b BaseURL) Where() string {
	if b.From == "" {
		return b.Var
	}
	return b.Var + " in " + b.From
}

// Check says, in one line naming the setting, what is wrong with a base
// URL that no engine could use: one without a scheme, a host, or with a
// scheme other than http and https (a path alone, "host:port" without
// "http://"). Nil when it is a URL an engine can call.
func (b BaseURL) Check() error {
	u, err := url.Parse(b.Value)
	fix := " (set it to a URL such as https://llm-gateway.example.com or http://127.0.0.1:4000)"
	switch {
	case err != nil:
		return fmt.Errorf("%s=%s is not a URL%s", b.Where(), shown(b.Value), fix)
	case u.Scheme == "" || u.Host == "" && u.Opaque != "":
		return fmt.Errorf("%s=%s has no scheme (http:// or https://)%s", b.Where(), shown(b.Value), fix)
	case u.Scheme != "http" && u.Scheme != "https":
		return fmt.Errorf("%s=%s has scheme %q, not http or https%s", b.Where(), shown(b.Value), u.Scheme, fix)
	case u.Hostname() == "":
		return fmt.Errorf("%s=%s has no host%s", b.Where(), shown(b.Value), fix)
	}
	if p := u.Port(); p != "" {
		if n, err := strconv.Atoi(p); err != nil || n < 1 || n > 65535 {
			return fmt.Errorf("%s=%s has port %q (a port is 1 to 65535)%s", b.Where(), shown(b.Value), p, fix)
		}
	}
	return nil
}

// shown is a base URL as a message may show it: quoted, with whatever
// stands before an '@' (a user and password) masked.
func shown(v string) string {
	if i := strings.LastIndex(v, "@"); i >= 0 {
		start := 0
		if s := strings.Index(v, "://"); s >= 0 && s < i {
			start = s + 3
		}
		v = v[:start] + "***" + v[i:]
	}
	return strconv.Quote(v)
}

// HostPort is the base URL's host and port as "host:port" (the scheme's
// port when it names none; an IPv6 address in brackets), "" when it is
// not a usable URL (Check).
func (b BaseURL) HostPort() string {
	if b.Check() != nil {
		return ""
	}
	u, _ := url.Parse(b.Value)
	port := u.Port()
	if port == "" {
		port = "80"
		if u.Scheme == "https" {
			port = "443"
		}
	}
	return net.JoinHostPort(strings.ToLower(u.Hostname()), port)
}

// Redacted is the URL without a password, for messages and logs.
func (b BaseURL) Redacted() string {
	if u, err := url.Parse(b.Value); err == nil && b.Check() == nil {
		return u.Redacted()
	}
	return strings.Trim(shown(b.Value), `"`)
}

// baseURLVars are the variables that point each engine at a gateway.
var baseURLVars = map[string]string{"claude": "ANTHROPIC_BASE_URL", "codex": "OPENAI_BASE_URL"}

// maxSettingsBytes bounds what aq reads of an engine's settings file to
// find a base URL (they are a few kilobytes).
const maxSettingsBytes = 1 << 20

// BaseURLs are the base URLs engine is pointed at, given its environment
// (HOME and the variables that move its config directory, as LoginOf):
// the variable in env, then what the engine's own files set — claude's
// settings.json "env" ANTHROPIC_BASE_URL; codex's config.toml
// openai_base_url and each model_providers.<id>.base_url. A file that is
// missing, too large or unreadable as its format sets none (the engine
// says what is wrong with it when it runs). Empty values are no setting.
func BaseURLs(engine string, env []string) []BaseURL {
	var out []BaseURL
	if v := baseURLVars[engine]; v != "" {
		if val := envValue(env, v); val != "" {
			out = append(out, BaseURL{Var: v, Value: val})
		}
	}
	for _, f := range LoginOf(engine, env).Files {
		switch filepath.Base(f.Src) {
		case "settings.json":
			if engine != "claude" {
				continue
			}
			var s struct {
				Env map[string]any `json:"env"`
			}
			if raw := readSmall(f.Src); raw != nil && json.Unmarshal(raw, &s) == nil {
				if v, ok := s.Env["ANTHROPIC_BASE_URL"].(string); ok && v != "" {
					out = append(out, BaseURL{Var: "ANTHROPIC_BASE_URL", Value: v, From: f.Src})
				}
			}
		case "config.toml":
			if engine != "codex" {
				continue
			}
			var c struct {
				OpenAIBaseURL  string `toml:"openai_base_url"`
				ModelProviders map[string]struct {
					BaseURL string `toml:"base_url"`
				} `toml:"model_providers"`
			}
			raw := readSmall(f.Src)
			if raw == nil || toml.Unmarshal(raw, &c) != nil {
				continue
			}
			if c.OpenAIBaseURL != "" {
				out = append(out, BaseURL{Var: "openai_base_url", Value: c.OpenAIBaseURL, From: f.Src})
			}
			ids := make([]string, 0, len(c.ModelProviders))
			for id := range c.ModelProviders {
				ids = append(ids, id)
			}
			sort.Strings(ids)
			for _, id := range ids {
				if v := c.ModelProviders[id].BaseURL; v != "" {
					out = append(out, BaseURL{Var: "model_providers." + id + ".base_url", Value: v, From: f.Src})
				}
			}
		}
	}
	return out
}

// CheckBaseURLs is the first malformed base URL of the engines that take
// one (claude, codex), in env and their files, as Check says it; nil when
// every one set is usable. aq run and aq daemon call it at start (exit 2).
func CheckBaseURLs(env []string) error {
	for _, e := range []string{"claude", "codex"} {
		for _, b := range BaseURLs(e, env) {
			if err := b.Check(); err != nil {
				return err
			}
		}
	}
	return nil
}

// readSmall reads a regular file of at most maxSettingsBytes through the
// safe helper (the engine's home is its to write: no symbolic link at any
// component, no FIFO, no device); nil for anything else.
// loginPresent reports whether path is a regular file of at most
// safefs.MaxLogin bytes, checked through the safe helper: a symbolic link,
// FIFO or device there is refused, never followed.
func loginPresent(path string) bool {
	r, err := safefs.OpenRoot("home", filepath.Dir(path))
	if err != nil {
		return false
	}
	defer r.Close()
	return r.Check(filepath.Base(path), safefs.MaxLogin) == nil
}

func readSmall(path string) []byte {
	b, err := safefs.ReadFile("home", filepath.Dir(path), filepath.Base(path), maxSettingsBytes)
	if err != nil {
		return nil
	}
	return b
}
