package engines

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// BenchmarkProbeFlags: what the --help probe costs an `aq run --once`
// (a fake claude printing the real 2.1.197 help: one --help run and one
// hidden-flag probe) when the binary was probed before (cached: a stat and
// a small JSON read) and when it was not (cold: two processes).
func BenchmarkProbeFlags(b *testing.B) {
	self, err := os.Executable()
	if err != nil {
		b.Fatal(err)
	}
	dir := b.TempDir()
	path := filepath.Join(dir, "claude")
	if err := os.Symlink(self, path); err != nil {
		b.Fatal(err)
	}
	help, err := filepath.Abs("testdata")
	if err != nil {
		b.Fatal(err)
	}
	env := []string{"PATH=/usr/bin:/bin", fakeHelpDir + "=" + help,
		"GORACE=" + strings.TrimSpace(os.Getenv("GORACE")+" atexit_sleep_ms=0")}
	b.Run("cold", func(b *testing.B) {
		for b.Loop() {
			if _, err := ProbeFlags(b.Context(), "claude", path, env, 0, nil); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("cached", func(b *testing.B) {
		cache := NewProbeCache(filepath.Join(b.TempDir(), "probes.json"))
		if _, err := ProbeFlags(b.Context(), "claude", path, env, 0, cache); err != nil {
			b.Fatal(err)
		}
		for b.Loop() {
			if _, err := ProbeFlags(b.Context(), "claude", path, env, 0, cache); err != nil {
				b.Fatal(err)
			}
		}
	})
}
