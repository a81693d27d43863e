package engines

import (
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestDefaultPrices(t *testing.T) {
	p := DefaultPrices()
	if len(p.Models) < 20 || p.Default.InputPerMTok == 0 || p.Default.OutputPerMTok == 0 || p.Note == "" {
		t.Fatalf("built-in table looks empty: %+v", p)
	}
	for name, pr := range p.Models {
		if name != strings.ToLower(name) || pr.InputPerMTok <= 0 || pr.OutputPerMTok <= pr.InputPerMTok || pr.CachedInputPerMTok > pr.InputPerMTok {
			t.Errorf("%s: implausible price %+v", name, pr)
		}
	}
	p.Models["mutated"] = Price{}
	if _, ok := DefaultPrices().Models["mutated"]; ok {
		t.Error("DefaultPrices hands out a shared table")
	}
}

func TestPriceLookup(t *testing.T) {
	p := DefaultPrices()
	for model, want := range map[string]string{
		"claude-sonnet-4-5-20250929": "claude-sonnet-4-5",
		"claude-opus-4-20250514":     "claude-opus-4",
		"claude-opus-4-5":            "claude-opus-4-5",
		"CLAUDE-HAIKU-4-5":           "claude-haiku-4-5",
		"gpt-5.3-codex":              "gpt-5.3-codex",
		"gpt-5-codex":                "gpt-5-codex",
		"gpt-5-2025-08-07":           "gpt-5",
		"gpt-5.9":                    "default", // "gpt-5" must not price "gpt-5.9"
		"swe-1.7":                    "default",
		"":                           "default",
	} {
		if _, got := p.Lookup(model); got != want {
			t.Errorf("Lookup(%q) matched %q, want %q", model, got, want)
		}
	}
}

func TestPriceCost(t *testing.T) {
	p := &PriceTable{Models: map[string]Price{
		"m":       {InputPerMTok: 2, CachedInputPerMTok: 0.2, OutputPerMTok: 10, CacheWriteInputPerMTok: 2.5},
		"nowrite": {InputPerMTok: 2, CachedInputPerMTok: 0.2, OutputPerMTok: 10},
	}}
	u := Usage{TokensIn: 1_000_000, TokensCached: 500_000, TokensCacheWrite: 100_000, TokensOut: 200_000}
	if got, want := p.Cost("m", u), 0.4*2+0.5*0.2+0.1*2.5+0.2*10; math.Abs(got-want) > 1e-9 {
		t.Errorf("Cost = %v, want %v", got, want)
	}
	if got, want := p.Cost("nowrite", u), 0.5*2+0.5*0.2+0.2*10; math.Abs(got-want) > 1e-9 {
		t.Errorf("Cost without a cache-write rate = %v, want %v (cache writes at the input rate)", got, want)
	}
	if (*PriceTable)(nil).Cost("m", u) != 0 {
		t.Error("a nil table must cost nothing")
	}
}

func TestLoadPrices(t *testing.T) {
	dir := t.TempDir()
	write := func(name, s string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(s), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	got, err := LoadPrices(write("ok.json", `{
		"note": "our negotiated rates",
		"models": {"GPT-5.3-Codex": {"inputPerMTok": 1, "cachedInputPerMTok": 0.1, "outputPerMTok": 8},
		           "my-local-model": {"inputPerMTok": 0, "cachedInputPerMTok": 0, "outputPerMTok": 0}},
		"default": {"inputPerMTok": 9, "cachedInputPerMTok": 0.9, "outputPerMTok": 90}
	}`))
	if err != nil {
		t.Fatal(err)
	}
	if p, _ := got.Lookup("gpt-5.3-codex"); p.InputPerMTok != 1 || p.OutputPerMTok != 8 {
		t.Errorf("the file's entry did not replace the built-in one: %+v", p)
	}
	if p, name := got.Lookup("my-local-model"); name != "my-local-model" || p.OutputPerMTok != 0 {
		t.Errorf("the file's new model: %+v (%s)", p, name)
	}
	if got.Default.InputPerMTok != 9 || got.Note != "our negotiated rates" {
		t.Errorf("default/note not replaced: %+v %q", got.Default, got.Note)
	}
	if p, _ := got.Lookup("claude-sonnet-4-5"); p.InputPerMTok != 3 {
		t.Errorf("built-in entries the file does not name must stay: %+v", p)
	}

	only, err := LoadPrices(write("models-only.json", `{"models": {"x": {"inputPerMTok": 1, "outputPerMTok": 2}}}`))
	if err != nil {
		t.Fatal(err)
	}
	if only.Default != DefaultPrices().Default {
		t.Errorf("a file without default replaced it: %+v", only.Default)
	}

	if d, err := LoadPrices(""); err != nil || len(d.Models) != len(DefaultPrices().Models) {
		t.Errorf("LoadPrices(\"\") = %v, %v; want the built-in table", d, err)
	}

	for name, content := range map[string]string{
		"typo.json":        `{"models": {"x": {"inputPerMTokens": 1}}}`,
		"negative.json":    `{"models": {"x": {"inputPerMTok": -1}}}`,
		"syntax.json":      `{"models": {"x": {"inputPerMTok": 1,}}}`,
		"trailing.json":    `{"models": {}} {}`,
		"empty-name.json":  `{"models": {" ": {"inputPerMTok": 1}}}`,
		"bad-default.json": `{"default": {"outputPerMTok": -3}}`,
	} {
		path := write(name, content)
		if _, err := LoadPrices(path); err == nil || !strings.Contains(err.Error(), path) {
			t.Errorf("%s: err = %v, want an error naming the file", name, err)
		}
	}
	if _, err := LoadPrices(filepath.Join(dir, "missing.json")); err == nil {
		t.Error("a missing file is an error: the user named it")
	}
}

func TestFormatProgress(t *testing.T) {
	for _, tc := range []struct {
		u    Usage
		d    time.Duration
		want string
	}{
		{Usage{TokensIn: 176_000, TokensOut: 6_400, CostUSD: 0.42131, Turns: 12}, 185 * time.Second,
			"claude  12 turns  182.4k tok (176.0k in, 6.4k out)  $0.4213  3m05s"},
		{Usage{TokensIn: 1_250_000, TokensOut: 900, CostUSD: 1.5, Turns: 1, Estimated: true}, 2*time.Hour + 3*time.Second,
			"claude  1 turn  1.3M tok (1.2M in, 900 out)  ~$1.5000  2h00m03s"},
		{Usage{}, 0, "claude  0 turns  0 tok (0 in, 0 out)  $0.0000  0m00s"},
	} {
		if got := FormatProgress("claude", tc.u, tc.d); got != tc.want {
			t.Errorf("FormatProgress = %q, want %q", got, tc.want)
		}
	}
}

func TestUnavailableReason(t *testing.T) {
	for text, want := range map[string]string{
		`API Error: 401 {"type":"error","error":{"type":"authentication_error","message":"OAuth token has expired."}}`: "auth expired",
		"Invalid API key · Please run /login":                                            "auth failed",
		"unexpected status 401 Unauthorized: Missing bearer":                             "auth failed",
		"Claude AI usage limit reached|1767225600":                                       "usage limit",
		"You've hit your usage limit. Upgrade to Pro":                                    "usage limit",
		"Credit balance is too low":                                                      "out of credits",
		"You've hit your limit · resets 2pm (Asia/Shanghai)":                             "usage limit",
		"You've hit your weekly limit · resets Apr 23 at 4pm (America/Recife)":           "usage limit",
		"You've hit your monthly spend limit. /model to switch models.":                  "out of credits",
		"Your workspace is out of credits. Add credits to continue.":                     "out of credits",
		"API Error: Unable to connect to API (ConnectionRefused)":                        "API unreachable",
		"Reconnecting... waiting for network (Connection failed: error sending request)": "API unreachable",
		"exceeded retry limit, last status: 429 Too Many Requests":                       "rate limit",
		`API Error: 529 {"type":"error","error":{"type":"overloaded_error"}}`:            "overloaded",
	} {
		if kind, _, ok := unavailableReason(text); !ok || kind != want {
			t.Errorf("%q → %q, %t; want %q", text, kind, ok, want)
		}
	}
	for _, text := range []string{
		"Prompt is too long",
		"Error: EACCES: permission denied, open 'go.sum'",
		"Your input exceeds the context window of this model.",
		"stream disconnected before completion",
		"expected 4010 items, got 4011",
	} {
		if kind, _, ok := unavailableReason(text); ok {
			t.Errorf("%q classified as %q: it is the task's failure", text, kind)
		}
	}
}
