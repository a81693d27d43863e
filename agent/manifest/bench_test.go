package manifest

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// BenchmarkParse: a typical manifest (the example of docs/manifest.md) with its
// profile.
func BenchmarkParse(b *testing.B) {
	data, err := os.ReadFile(filepath.Join("testdata", "full.md"))
	if err != nil {
		b.Fatal(err)
	}
	cat := testCatalog(b)
	b.SetBytes(int64(len(data)))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := Parse("full.md", data, cat); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkParseLarge: a manifest with a ~900 KiB body (a prompt with pasted
// logs and code), close to the 1 MiB limit.
func BenchmarkParseLarge(b *testing.B) {
	var body strings.Builder
	body.WriteString("# Investigate the failing nightly build\n\nThe log follows.\n\n")
	chunk := "2025-01-01T00:00:00Z ERROR worker.go:42: connection reset by peer; retrying in 5s (attempt 3/10)\n" +
		"- a list item with `code` and a [link](https://example.com)\n\n" +
		"```go\nfunc f() error { return nil }\n```\n\n"
	for body.Len() < 900<<10 {
		body.WriteString(chunk)
	}
	body.WriteString("\n## Acceptance\n- the nightly build is green\n")
	data := mf("repo: svc\nprofile: backend-dev\npriority: high\nbudget: { wall: 1h }\n", body.String())
	if len(data) > MaxSize {
		b.Fatalf("manifest is %d bytes, over the limit", len(data))
	}
	b.SetBytes(int64(len(data)))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := Parse("large.md", data, nil); err != nil {
			b.Fatal(err)
		}
	}
}
