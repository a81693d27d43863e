package holds

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *clock) add(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

var t0 = time.Date(2026, 5, 12, 3, 0, 0, 0, time.UTC)

func TestHolds(t *testing.T) {
	clk := &clock{t: t0}
	path := filepath.Join(t.TempDir(), "home", "engine-holds.json")
	s := Open(path, clk.now)
	tokens := []string{"engine:claude", "engine:codex", "engine:script", "os:linux", "repo:demo"}
	if got := s.Filter(tokens); !slices.Equal(got, tokens) {
		t.Fatalf("no holds, Filter = %v", got)
	}
	if err := s.Hold(Hold{Engine: "claude", Until: t0.Add(3 * time.Hour), Why: "usage limit", Job: "j1"}); err != nil {
		t.Fatal(err)
	}
	// Another process of the same home sees it.
	other := Open(path, clk.now)
	h, ok := other.Held("claude")
	if !ok || !h.Until.Equal(t0.Add(3*time.Hour)) || h.Job != "j1" || !h.Since.Equal(t0) {
		t.Fatalf("Held = %+v, %t", h, ok)
	}
	if got := other.Filter(tokens); !slices.Equal(got, []string{"engine:codex", "engine:script", "os:linux", "repo:demo"}) {
		t.Errorf("Filter = %v, want engine:claude withheld", got)
	}
	if h.String() != "claude usage limit until 2026-05-12 06:00 UTC" {
		t.Errorf("String = %q", h.String())
	}

	// A shorter hold does not cut a longer one short; a longer one extends it.
	if err := s.Hold(Hold{Engine: "claude", Until: t0.Add(time.Minute), Why: "rate limit"}); err != nil {
		t.Fatal(err)
	}
	if h, _ := s.Held("claude"); !h.Until.Equal(t0.Add(3*time.Hour)) || h.Why != "usage limit" {
		t.Errorf("a shorter hold replaced a longer one: %+v", h)
	}
	if err := s.Hold(Hold{Engine: "claude", Until: t0.Add(7 * 24 * time.Hour), Why: "usage limit"}); err != nil {
		t.Fatal(err)
	}
	if h, _ := s.Held("claude"); !h.Until.Equal(t0.Add(7 * 24 * time.Hour)) {
		t.Errorf("a longer hold did not extend: %+v", h)
	}

	// Expired: no longer held, and dropped at the next write.
	clk.add(7*24*time.Hour + time.Second)
	if _, ok := s.Held("claude"); ok {
		t.Error("an expired hold still holds")
	}
	if err := s.Hold(Hold{Engine: "codex", Until: clk.now().Add(time.Hour), Why: "out of credits"}); err != nil {
		t.Fatal(err)
	}
	b, _ := os.ReadFile(path)
	if strings.Contains(string(b), "claude") {
		t.Errorf("the expired hold was kept in the file:\n%s", b)
	}
	if err := s.Release("codex"); err != nil {
		t.Fatal(err)
	}
	if len(s.List()) != 0 {
		t.Errorf("after Release: %v", s.List())
	}
}

// TestHoldsBadInput: a corrupt file holds nothing (with an error saying
// so) and is replaced by the next hold; a hold without an engine or a
// time is refused; a nil store holds nothing.
func TestHoldsBadInput(t *testing.T) {
	path := filepath.Join(t.TempDir(), "engine-holds.json")
	if err := os.WriteFile(path, []byte("{not json"), 0o600); err != nil {
		t.Fatal(err)
	}
	s := Open(path, func() time.Time { return t0 })
	if m, err := s.Active(); len(m) != 0 || err == nil || !strings.Contains(err.Error(), "remove the file") {
		t.Errorf("corrupt file: %v, %v", m, err)
	}
	if err := s.Hold(Hold{Engine: "claude", Until: t0.Add(time.Hour), Why: "rate limit"}); err != nil {
		t.Fatal(err)
	}
	if _, ok := s.Held("claude"); !ok {
		t.Error("a hold after a corrupt file did not take")
	}
	if s.Hold(Hold{Until: t0.Add(time.Hour)}) == nil || s.Hold(Hold{Engine: "codex"}) == nil {
		t.Error("a hold without an engine or a time was accepted")
	}
	var none *Store
	if none.Hold(Hold{Engine: "claude", Until: t0}) != nil || len(none.List()) != 0 || !slices.Equal(none.Filter([]string{"engine:claude"}), []string{"engine:claude"}) {
		t.Error("a nil store must hold nothing")
	}
}
