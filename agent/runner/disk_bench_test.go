package runner

import (
	"io/fs"
	"path/filepath"
	"testing"
)

// BenchmarkDiskWalk is what one look of the disk watch costs on a real
// tree: this repository's checkout (the aq module, a mid-sized Go
// repository) — docs/BENCHMARKS.md, "Disk accounting".
func BenchmarkDiskWalk(b *testing.B) {
	root, err := filepath.Abs("../..")
	if err != nil {
		b.Fatal(err)
	}
	files := 0
	_ = filepath.WalkDir(root, func(_ string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() {
			files++
		}
		return nil
	})
	for b.Loop() {
		if allocated(root) <= 0 {
			b.Fatal("nothing counted")
		}
	}
	b.ReportMetric(float64(files), "files")
}
