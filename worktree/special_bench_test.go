package worktree

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"
)

// BenchmarkRemoveSpecialFiles: the walk aq makes of a worktree before it
// runs git there (no FIFO found: the common case), for 1000 files in ten
// directories and for 10000. docs/BENCHMARKS.md, "#32".
func BenchmarkRemoveSpecialFiles(b *testing.B) {
	for _, n := range []int{1000, 10000} {
		dir := b.TempDir()
		for i := range n {
			d := filepath.Join(dir, fmt.Sprintf("d%d", i%10))
			os.MkdirAll(d, 0o755)
			os.WriteFile(filepath.Join(d, fmt.Sprintf("f%d.go", i)), []byte("x\n"), 0o644)
		}
		b.Run(fmt.Sprintf("files=%d", n), func(b *testing.B) {
			for b.Loop() {
				if removed, err := RemoveSpecialFiles(dir); err != nil || len(removed) != 0 {
					b.Fatal(removed, err)
				}
			}
		})
	}
}
