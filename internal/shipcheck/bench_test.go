package shipcheck_test

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/aqfleet/aq/internal/shipcheck"
	"github.com/aqfleet/aq/internal/testenv"
	"github.com/aqfleet/aq/worktree"
)

// BenchmarkCheck is one push's check (docs/BENCHMARKS.md, "#32 what ships
// is checked"): a commit that changes 20 text files of 10 KiB and adds a
// 4 MiB binary, in a repository of 1000 files, against 30 secrets (each
// in its 7 to 9 forms). MB/s is the scan's throughput over the new blobs.
func BenchmarkCheck(b *testing.B) {
	files := map[string]string{}
	for i := range 1000 {
		files[fmt.Sprintf("pkg%d/f%04d.txt", i%10, i)] = fmt.Sprintf("file %d\n", i)
	}
	repo := testenv.NewRepo(b, b.TempDir(), "r", files)
	testenv.AddOrigin(b, repo)
	var total int64
	line := strings.Repeat("some ordinary text of a source file ", 3) + "\n"
	for i := range 20 {
		c := strings.Repeat(line, 10<<10/len(line))
		os.WriteFile(filepath.Join(repo, fmt.Sprintf("pkg%d/f%04d.txt", i%10, i)), []byte(c), 0o644)
		total += int64(len(c))
	}
	bin := bytes.Repeat([]byte{0, 1, 2, 3, 250, 'a', 'b', '\n'}, 4<<20/8)
	os.WriteFile(filepath.Join(repo, "blob.bin"), bin, 0o644)
	total += int64(len(bin))
	testenv.Git(b, repo, "add", "-A")
	testenv.Git(b, repo, "commit", "-q", "-m", "change")
	tip := testenv.Git(b, repo, "rev-parse", "HEAD")
	var p shipcheck.Policy
	for i := range 30 {
		p.Secrets = append(p.Secrets, shipcheck.Secret{Value: fmt.Sprintf("secret-%02d-%s", i, strings.Repeat("Qx7/+", 6)), Source: "bench"})
	}
	b.SetBytes(total)
	b.ResetTimer()
	for range b.N {
		res, err := shipcheck.CheckRange(context.Background(), worktree.Git{}, repo, shipcheck.Range{Tip: tip, Remote: "origin"}, p)
		if err != nil || res.Commits != 1 || res.Refused() {
			b.Fatalf("%+v %v", res, err)
		}
	}
}
