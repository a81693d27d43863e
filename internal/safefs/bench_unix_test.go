//go:build unix

package safefs

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// BenchmarkReadPRBody: what reading .aq_pr.md (1 KiB, at a worktree's
// root) costs the safe way — openat2 and the O_NOFOLLOW walk — against the
// os.ReadFile main used; and a login copy two directories down.
// docs/BENCHMARKS.md, "#32".
func BenchmarkReadPRBody(b *testing.B) {
	dir := b.TempDir()
	body := []byte(strings.Repeat("Fixes the thing.\n", 60))
	os.WriteFile(filepath.Join(dir, ".aq_pr.md"), body, 0o600)
	os.MkdirAll(filepath.Join(dir, ".claude", "x"), 0o700)
	os.WriteFile(filepath.Join(dir, ".claude", "x", ".credentials.json"), body, 0o600)
	for _, rel := range []string{".aq_pr.md", ".claude/x/.credentials.json"} {
		b.Run("os.ReadFile/"+rel, func(b *testing.B) {
			for b.Loop() {
				if _, err := os.ReadFile(filepath.Join(dir, rel)); err != nil {
					b.Fatal(err)
				}
			}
		})
		modes := map[string]bool{"walk": true}
		if HasOpenat2() {
			modes["openat2"] = false
		}
		for name, walk := range modes {
			b.Run("safefs-"+name+"/"+rel, func(b *testing.B) {
				for b.Loop() {
					r, err := OpenRoot("worktree", dir)
					if err != nil {
						b.Fatal(err)
					}
					r.walk = walk
					if _, err := r.ReadFile(rel, MaxPRBody); err != nil {
						b.Fatal(err)
					}
					r.Close()
				}
			})
		}
	}
}
