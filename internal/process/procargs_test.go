package process

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestParseProcArgs2(t *testing.T) {
	tests := []struct {
		file     string
		ok       bool
		argv     string
		env      string
		tag      string // a TagEnv value the environment holds exactly, or ""
		notTag   string
		scope    string
		notScope string
	}{
		{file: "engine.bin", ok: true, argv: "node|/usr/local/bin/claude|-p",
			env: "PATH=/usr/bin:/bin|AQ_JOB_ID=fix-title|AQ_SCOPE=aq-0123456789ab|HOME=/Users/ci|AQ_JOB_ID_X=decoy",
			tag: "fix-title", notTag: "fix", scope: "aq-0123456789ab", notScope: "aq-other"},
		{file: "no-env.bin", ok: true, argv: "sleep|30"},
		{file: "apple-only.bin", ok: true, argv: "sh"},
		{file: "truncated.bin"},
		{file: "short.bin"},
	}
	for _, tc := range tests {
		t.Run(tc.file, func(t *testing.T) {
			b, err := os.ReadFile(filepath.Join("testdata", "procargs2", tc.file))
			if err != nil {
				t.Fatal(err)
			}
			argv, env, ok := parseProcArgs2(b)
			if ok != tc.ok {
				t.Fatalf("ok = %v, want %v", ok, tc.ok)
			}
			if !ok {
				return
			}
			if got := join(argv); got != tc.argv {
				t.Errorf("argv = %q, want %q", got, tc.argv)
			}
			if got := join(env); got != tc.env {
				t.Errorf("env = %q, want %q", got, tc.env)
			}
			if tc.tag != "" {
				if !environHolds(env, wants(tc.tag, "")) || !environHolds(env, wants(tc.tag, tc.scope)) {
					t.Errorf("environment does not hold %s=%s (scope %s)", TagEnv, tc.tag, tc.scope)
				}
				if environHolds(env, wants(tc.notTag, "")) {
					t.Errorf("a prefix of the tag (%s) matched", tc.notTag)
				}
				if environHolds(env, wants(tc.tag, tc.notScope)) {
					t.Errorf("another scope (%s) matched", tc.notScope)
				}
			}
		})
	}
}

// Every prefix of a good buffer parses or is refused, and never panics.
func TestParseProcArgs2Prefixes(t *testing.T) {
	b, err := os.ReadFile(filepath.Join("testdata", "procargs2", "engine.bin"))
	if err != nil {
		t.Fatal(err)
	}
	for n := range len(b) {
		parseProcArgs2(b[:n])
	}
}

func join(bs [][]byte) string {
	s := make([]string, len(bs))
	for i, b := range bs {
		s[i] = string(b)
	}
	return strings.Join(s, "|")
}
