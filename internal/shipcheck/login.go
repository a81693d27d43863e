package shipcheck

import (
	"bufio"
	"bytes"
	"encoding/json"
	"regexp"
	"strings"
)

// secretKey names the fields of a login file that hold a credential:
// claude's accessToken and refreshToken, codex's tokens.* and
// OPENAI_API_KEY, devin's token fields, a primaryApiKey.
var secretKey = regexp.MustCompile(`(?i)token|key|secret|password|credential`)

// LoginValues are the credentials in an engine's login file — JSON
// (claude, codex) or TOML (devin): the string values, at any depth, of
// fields whose name says they hold one (a token, a key, a secret, a
// password), at least MinSecretLen long. Identity fields (an account id,
// an email) are left out: they are not secret and would flag innocent
// code.
func LoginValues(data []byte) []string {
	var out []string
	add := func(v string) {
		v = strings.TrimSpace(v)
		if len(v) >= MinSecretLen {
			out = append(out, v)
		}
	}
	var doc any
	if json.Unmarshal(data, &doc) == nil {
		var walk func(key string, v any)
		walk = func(key string, v any) {
			switch x := v.(type) {
			case map[string]any:
				for k, e := range x {
					walk(k, e)
				}
			case []any:
				for _, e := range x {
					walk(key, e)
				}
			case string:
				if secretKey.MatchString(key) {
					add(x)
				}
			}
		}
		walk("", doc)
		return out
	}
	// TOML: key = "value" (or 'value') lines, whatever their table.
	sc := bufio.NewScanner(bytes.NewReader(data))
	sc.Buffer(make([]byte, 0, 64*1024), 1<<20)
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), "=")
		k = strings.Trim(strings.TrimSpace(k), `"'`)
		v = strings.TrimSpace(v)
		if !ok || !secretKey.MatchString(k) || len(v) < 2 || (v[0] != '"' && v[0] != '\'') {
			continue
		}
		if end := strings.IndexByte(v[1:], v[0]); end >= 0 {
			add(v[1 : 1+end])
		}
	}
	return out
}
