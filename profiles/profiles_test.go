package profiles

import (
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/aqfleet/aq/engines"
	"github.com/aqfleet/aq/internal/mdmeta"
	"github.com/aqfleet/aq/job"
)

func write(t *testing.T, path, content string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

// TestEmbedded holds the built-in personas to what a headless engine in aq
// needs to be told.
func TestEmbedded(t *testing.T) {
	c, err := Embedded()
	if err != nil {
		t.Fatal(err)
	}
	names := c.Names()
	for _, want := range []string{"backend-dev", "frontend-dev", "test-fixer", "reviewer", "docs-writer"} {
		if _, ok := c.Get(want); !ok {
			t.Errorf("profile %s is missing (have %v)", want, names)
		}
	}
	if !sort.StringsAreSorted(names) {
		t.Errorf("List is not sorted: %v", names)
	}
	for _, p := range c.List() {
		t.Run(p.Name, func(t *testing.T) {
			if p.Source != SourceEmbedded {
				t.Errorf("source %q", p.Source)
			}
			if !slices.Contains(engines.Known(), p.Engine) {
				t.Errorf("engine %q", p.Engine)
			}
			if !slices.Contains(p.Capabilities, "has:git") {
				t.Errorf("capabilities %v lack has:git", p.Capabilities)
			}
			b := p.Budget
			if b.Wall.D() <= 0 || b.Wall.D() > 4*time.Hour || b.USD <= 0 || b.Tokens <= 0 || b.Turns <= 0 {
				t.Errorf("budget %+v: every field should have a sensible limit", b)
			}
			if len(p.Persona) < 1500 {
				t.Errorf("persona is only %d bytes: write a real prompt", len(p.Persona))
			}
			for _, must := range []string{".aq_pr.md", "aq/job/", "never push", "Stop", "acceptance criteria", "worktree", "repair round", "verify"} {
				if !strings.Contains(strings.ToLower(p.Persona), strings.ToLower(must)) {
					t.Errorf("persona does not mention %q", must)
				}
			}
		})
	}
	fe, _ := c.Get("frontend-dev")
	if !slices.Contains(fe.Capabilities, "node:>=20") {
		t.Errorf("frontend-dev capabilities %v lack node:>=20", fe.Capabilities)
	}
}

func TestLoadOverrides(t *testing.T) {
	dir := t.TempDir()
	write(t, filepath.Join(dir, "reviewer.md"), "---\nengine: claude\nmodel: claude-opus-4-1\ncapabilities: [has:git, has:gh]\nbudget: { wall: 20m, usd: 1.5 }\nverify_rounds: 1\n---\nReview strictly.\n")
	write(t, filepath.Join(dir, "data-eng.md"), "---\nname: data-eng\n---\nYou build pipelines.\n")
	write(t, filepath.Join(dir, "notes.txt"), "not a profile")
	write(t, filepath.Join(dir, ".hidden.md"), "garbage")
	if err := os.Mkdir(filepath.Join(dir, "sub"), 0o755); err != nil {
		t.Fatal(err)
	}

	c, err := Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	r, _ := c.Get("reviewer")
	want := Profile{Name: "reviewer", Engine: "claude", Model: "claude-opus-4-1", Capabilities: []string{"has:git", "has:gh"},
		Budget: job.Budget{Wall: job.Duration(20 * time.Minute), USD: 1.5}, VerifyRounds: ptr(1), Persona: "Review strictly.", Source: filepath.Join(dir, "reviewer.md")}
	if !reflect.DeepEqual(r, want) {
		t.Errorf("override:\n got %+v\nwant %+v", r, want)
	}
	d, ok := c.Get("data-eng")
	if !ok || d.Persona != "You build pipelines." || len(d.Capabilities) != 0 || d.Engine != "" {
		t.Errorf("added profile: %+v", d)
	}
	if b, _ := c.Get("backend-dev"); b.Source != SourceEmbedded {
		t.Errorf("backend-dev should stay embedded: %+v", b)
	}
	// The embedded catalog is not changed by an override.
	e, _ := Embedded()
	if r, _ := e.Get("reviewer"); r.Source != SourceEmbedded {
		t.Errorf("Load changed the embedded catalog")
	}
	if _, ok := c.Get("nope"); ok {
		t.Errorf("Get of an unknown name succeeded")
	}
}

func TestLoadMissingDir(t *testing.T) {
	for _, dir := range []string{"", filepath.Join(t.TempDir(), "absent")} {
		c, err := Load(dir)
		if err != nil {
			t.Fatalf("Load(%q): %v", dir, err)
		}
		e, _ := Embedded()
		if !reflect.DeepEqual(c.Names(), e.Names()) {
			t.Errorf("Load(%q) = %v, want the embedded profiles", dir, c.Names())
		}
	}
}

func TestLoadDirIsAFile(t *testing.T) {
	f := filepath.Join(t.TempDir(), "profiles")
	write(t, f, "x")
	if _, err := Load(f); err == nil || !strings.Contains(err.Error(), "cannot read the profile directory") {
		t.Errorf("got %v", err)
	}
}

// TestBadProfiles: each problem is an error naming FILE:LINE, and all of a
// directory's problems are reported together.
func TestBadProfiles(t *testing.T) {
	tests := []struct {
		name, file, content string
		line                int
		want                string
	}{
		{"unknown key", "a.md", "---\nengine: claude\nmodle: x\n---\nP.\n", 3, `unknown key "modle" (did you mean "model"?)`}, //nolint:misspell // the typo is the test
		{"unknown budget key", "a.md", "---\nbudget:\n  walltime: 1h\n---\nP.\n", 3, `unknown key "budget.walltime"`},
		{"name mismatch", "a.md", "---\nname: b\n---\nP.\n", 2, `name "b" does not match the file name "a.md"`},
		{"bad name", "a b.md", "---\n---\nP.\n", 1, `profile name "a b"`},
		{"unknown engine", "a.md", "---\nengine: gpt\n---\nP.\n", 2, `engine "gpt" is not known`},
		{"bad capability", "a.md", "---\ncapabilities: [gpu:1]\n---\nP.\n", 2, `unknown kind "gpu"`},
		{"engine capability", "a.md", "---\ncapabilities:\n  - has:git\n  - engine:claude\n---\nP.\n", 4, `cannot require engine:claude`},
		{"zero wall", "a.md", "---\nbudget: { wall: 0s }\n---\nP.\n", 2, `budget.wall "0s" is out of range`},
		{"negative usd", "a.md", "---\nbudget: { usd: -2 }\n---\nP.\n", 2, `budget.usd -2 is out of range`},
		{"negative verify_rounds", "a.md", "---\nverify_rounds: -1\n---\nP.\n", 2, `verify_rounds -1 is out of range (use a whole number from 0 to 10)`},
		{"verify_rounds not a number", "a.md", "---\nengine: any\nverify_rounds: many\n---\nP.\n", 3, `verify_rounds must be a whole number, not "many"`},
		{"bad model", "a.md", "---\nmodel: \"-x\"\n---\nP.\n", 2, `model "-x" must not start with "-"`},
		{"empty persona", "a.md", "---\nengine: any\n---\n\n\n", 3, `the persona (the markdown body) is empty`},
		{"no front matter", "a.md", "Just a persona.\n", 1, `no YAML front matter`},
		{"duplicate key", "a.md", "---\nengine: any\nengine: claude\n---\nP.\n", 3, `duplicate key "engine"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			path := filepath.Join(dir, tt.file)
			write(t, path, tt.content)
			c, err := Load(dir)
			if err == nil {
				t.Fatalf("accepted: %+v", c.List())
			}
			var es mdmeta.Errors
			if !errors.As(err, &es) || len(es) == 0 {
				t.Fatalf("error %T: %v", err, err)
			}
			if es[0].File != path || es[0].Line != tt.line || !strings.Contains(es[0].Error(), tt.want) {
				t.Errorf("got %v\nwant %s:%d: ...%s...", es[0], path, tt.line, tt.want)
			}
		})
	}

	// Every bad file of a directory is reported.
	dir := t.TempDir()
	write(t, filepath.Join(dir, "a.md"), "---\nfoo: 1\n---\nP.\n")
	write(t, filepath.Join(dir, "b.md"), "---\nbar: 1\n---\nP.\n")
	_, err := Load(dir)
	var es mdmeta.Errors
	if !errors.As(err, &es) || len(es) != 2 {
		t.Errorf("want two problems, got %v", err)
	}
}

func TestOversizedOverride(t *testing.T) {
	dir := t.TempDir()
	write(t, filepath.Join(dir, "big.md"), "---\nengine: any\n---\n"+strings.Repeat("x", mdmeta.MaxSize))
	if _, err := Load(dir); err == nil || !strings.Contains(err.Error(), "1 MiB") {
		t.Errorf("got %v", err)
	}
}

func TestGetReturnsACopy(t *testing.T) {
	c, err := Load("")
	if err != nil {
		t.Fatal(err)
	}
	p, _ := c.Get("frontend-dev")
	p.Capabilities[0] = "has:mutated"
	c.List()[0].Capabilities[0] = "has:mutated"
	if again, _ := c.Get("frontend-dev"); again.Capabilities[0] != "has:git" {
		t.Errorf("catalog changed through a returned profile: %v", again.Capabilities)
	}
	if first := c.List()[0]; first.Capabilities[0] == "has:mutated" {
		t.Errorf("catalog changed through List: %v", first.Capabilities)
	}
}

func ptr[T any](v T) *T { return &v }
