package boundlog

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/aqfleet/aq/internal/testenv"
)

// numbered is n lines "%09d\n" from first: 10 bytes each, so where a byte
// came from can be told.
func numbered(first, n int) []byte {
	var b bytes.Buffer
	for i := first; i < first+n; i++ {
		fmt.Fprintf(&b, "%09d\n", i)
	}
	return b.Bytes()
}

// segmentsBeside counts the tail segments next to path.
func segmentsBeside(t *testing.T, path string) int {
	t.Helper()
	s, err := tailSegments(path)
	if err != nil {
		t.Fatal(err)
	}
	return len(s)
}

// TestBoundedBurst: a burst ten times the budget is stored as the head
// (the first half of the budget, exactly the first bytes written), one gap
// record saying how many bytes were left out, and the tail (the last bytes
// written, in order); on disk there are never more than the kept tail
// segments beside the file, and none after Close.
func TestBoundedBurst(t *testing.T) {
	testenv.Slow(t, "writes a burst to a real file")
	for _, tc := range []struct {
		name  string
		max   int64
		lines int
		chunk int // bytes per Write
	}{
		{"under the budget", 1 << 20, 1000, 4096},
		{"ten times the budget", 1 << 20, 1 << 20, 64 << 10},
		{"seven-byte writes", 64 << 10, 8000, 7},
		{"one huge write", 1 << 20, 400 << 10, 10 << 20},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "stdout.log")
			os.WriteFile(path, []byte("=== header ===\n"), 0o600) // an earlier run's, kept
			l, err := Open(path, tc.max)
			if err != nil {
				t.Fatal(err)
			}
			in := numbered(0, tc.lines)
			most := 0
			for w, p := 0, in; len(p) > 0; w++ {
				k := min(tc.chunk, len(p))
				if n, err := l.Write(p[:k]); err != nil || n != k {
					t.Fatalf("write: %d %v", n, err)
				}
				p = p[k:]
				if tc.chunk >= 4096 || w%997 == 0 {
					most = max(most, segmentsBeside(t, path))
				}
			}
			if most > segments {
				t.Errorf("%d tail segments on disk at once, want at most %d", most, segments)
			}
			if err := l.Close(); err != nil {
				t.Fatal(err)
			}
			if n := segmentsBeside(t, path); n != 0 {
				t.Errorf("%d segments left after Close", n)
			}
			got, _ := os.ReadFile(path)
			got, ok := bytes.CutPrefix(got, []byte("=== header ===\n"))
			if !ok {
				t.Fatal("the earlier run's header is gone")
			}
			if int64(len(in)) <= tc.max/2 {
				if !bytes.Equal(got, in) {
					t.Fatalf("under the budget the log is not what was written (%d bytes of %d)", len(got), len(in))
				}
				return
			}
			head, rest, found := bytes.Cut(got, []byte("\n=== aq: "))
			if !found {
				t.Fatalf("no gap record in %d bytes", len(got))
			}
			if !bytes.Equal(head, in[:tc.max/2]) {
				t.Errorf("the head is not the first %d bytes written", tc.max/2)
			}
			rec, tail, _ := bytes.Cut(rest, []byte(" ===\n"))
			if !bytes.HasSuffix(in, tail) || len(tail) == 0 {
				t.Errorf("the tail (%d bytes) is not the last bytes written", len(tail))
			}
			var dropped int64
			fmt.Sscanf(string(rec), "%d bytes", &dropped)
			if want := int64(len(in)) - int64(len(head)) - int64(len(tail)); dropped != want {
				t.Errorf("the gap record says %d bytes left out, want %d: %q", dropped, want, rec)
			}
			if stored := int64(len(got)); stored > tc.max+200 {
				t.Errorf("stored %d bytes for a budget of %d", stored, tc.max)
			}
			if int64(len(tail)) < (tc.max-tc.max/2)*(segments-1)/segments {
				t.Errorf("only %d bytes of tail kept", len(tail))
			}
		})
	}
}

// TestFinishAfterCrash: a run that did not reach Close (aq killed) leaves
// its head and segments; the next Open puts the gap record and the tail
// after the head before the next run's output.
func TestFinishAfterCrash(t *testing.T) {
	path := filepath.Join(t.TempDir(), "stdout.log")
	l, err := Open(path, 64<<10)
	if err != nil {
		t.Fatal(err)
	}
	in := numbered(0, 50000)
	if _, err := l.Write(in); err != nil {
		t.Fatal(err)
	}
	l.f.Close() // killed: no Close
	l.seg.Close()
	if segmentsBeside(t, path) == 0 {
		t.Fatal("no segments to finish")
	}
	l2, err := Open(path, 64<<10)
	if err != nil {
		t.Fatal(err)
	}
	l2.Write([]byte("next run\n"))
	if err := l2.Close(); err != nil {
		t.Fatal(err)
	}
	got, _ := os.ReadFile(path)
	s := string(got)
	if !strings.HasPrefix(s, string(in[:32<<10])) || !strings.Contains(s, "bytes of output left out here") || !strings.HasSuffix(s, string(in[len(in)-1000:])+"next run\n") {
		t.Errorf("after a crash the log is not head, gap, tail, then the next run (%d bytes)", len(got))
	}
	if segmentsBeside(t, path) != 0 {
		t.Error("segments left")
	}
}
