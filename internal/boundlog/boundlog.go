// Package boundlog is a log file whose size an engine cannot blow up
// (docs/sandbox.md, "Limits"; #32): its head and its tail are kept, what
// lies between becomes one gap record.
//
// The first half of the budget goes to the file itself, as it always did —
// the head, which a follower (aq job logs -f, the live log) reads as it is
// written. Past it, output goes to rolling tail segments on disk beside the
// file (<file>.tail-<n>, a quarter of the other half each, the newest four
// kept: nothing but the segment being written is held open, nothing in
// memory). Close appends the gap record, saying how many bytes were left
// out, then the segments, to the file and removes them: the stored log — the
// artifact — is head, gap, tail. A run that did not reach Close (aq killed)
// leaves its segments; the next Open of the file finishes them first.
package boundlog

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
)

// DefaultMax is AQ_LOG_MAX's default: what one run may store in a log.
const DefaultMax = 32 << 20

// minMax keeps a budget from being too small to hold a head and a tail.
const minMax = 64 << 10

// segments is how many tail segments are kept.
const segments = 4

// GapRecord is the line that stands for the bytes left out between the
// head and the tail.
func GapRecord(dropped, max int64) string {
	return fmt.Sprintf("\n=== aq: %d bytes of output left out here (AQ_LOG_MAX %d: the head and the tail are kept) ===\n", dropped, max)
}

// File is an open bounded log. It is safe for concurrent Writes.
type File struct {
	mu      sync.Mutex
	path    string
	max     int64
	f       *os.File // the head (the file itself)
	head    int64    // bytes the head may still take
	seg     *os.File // the tail segment being written (nil none)
	segSize int64    // its size
	segs    []int    // the kept segments' numbers, oldest first
	sizes   []int64  // their output bytes (their header line not counted)
	next    int      // the next segment's number
	dropped int64    // bytes of dropped segments
	err     error
}

// Open opens path for appending, bounded to max bytes of this run's output
// (<= 0: DefaultMax). Segments a run before left (it did not reach Close)
// are finished into the file first.
func Open(path string, max int64) (*File, error) {
	if max <= 0 {
		max = DefaultMax
	}
	max = maxOf(max, minMax)
	if err := Finish(path, max); err != nil {
		return nil, err
	}
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return nil, err
	}
	return &File{path: path, max: max, f: f, head: max / 2}, nil
}

func maxOf(a, b int64) int64 {
	if a > b {
		return a
	}
	return b
}

// segMax is the most one tail segment holds.
func (l *File) segMax() int64 { return (l.max - l.max/2) / segments }

// Write appends p: to the head while it has room, else to the tail.
func (l *File) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.err != nil {
		return 0, l.err
	}
	n := len(p)
	if l.head > 0 {
		k := min(int64(len(p)), l.head)
		if _, err := l.f.Write(p[:k]); err != nil {
			l.err = err
			return 0, err
		}
		l.head -= k
		p = p[k:]
	}
	for len(p) > 0 {
		if l.seg == nil || l.segSize >= l.segMax() {
			if err := l.roll(); err != nil {
				l.err = err
				return n - len(p), err
			}
		}
		k := min(int64(len(p)), l.segMax()-l.segSize)
		if _, err := l.seg.Write(p[:k]); err != nil {
			l.err = err
			return n - len(p), err
		}
		l.segSize += k
		p = p[k:]
	}
	return n, nil
}

// roll closes the segment being written, starts the next, and drops the
// oldest past the kept number.
func (l *File) roll() error {
	if l.seg != nil {
		if err := l.seg.Close(); err != nil {
			return err
		}
		l.seg = nil
	}
	if len(l.sizes) > 0 {
		l.sizes[len(l.sizes)-1] = l.segSize
	}
	for len(l.segs) >= segments {
		if err := os.Remove(segPath(l.path, l.segs[0])); err != nil && !errors.Is(err, os.ErrNotExist) {
			return err
		}
		l.dropped += l.sizes[0]
		l.segs, l.sizes = l.segs[1:], l.sizes[1:]
	}
	f, err := os.OpenFile(segPath(l.path, l.next), os.O_CREATE|os.O_WRONLY|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	// The number of bytes dropped before this segment rides at its start
	// (a header line), so Finish can say so after a crash.
	if _, err := fmt.Fprintf(f, "%s%d\n", segHeader, l.dropped); err != nil {
		f.Close()
		return err
	}
	l.seg, l.segSize = f, 0
	l.segs, l.sizes = append(l.segs, l.next), append(l.sizes, 0)
	l.next++
	return nil
}

// segHeader begins a segment's first line: the bytes dropped before it.
const segHeader = "aq-dropped-before "

func segPath(path string, n int) string { return fmt.Sprintf("%s.tail-%06d", path, n) }

// Close finishes the log: the gap record and the tail after the head, the
// segments removed.
func (l *File) Close() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	var err error
	if l.seg != nil {
		err = l.seg.Close()
		l.seg = nil
	}
	err = errors.Join(err, l.f.Close())
	return errors.Join(err, Finish(l.path, l.max))
}

// Finish appends the tail segments beside path (a run's, at its Close, or
// those a crashed run left) to it behind their gap record, and removes
// them; nothing when there are none.
func Finish(path string, max int64) error {
	segs, err := tailSegments(path)
	if err != nil || len(segs) == 0 {
		return err
	}
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	defer f.Close()
	// The newest segment's header counts every byte dropped: segments are
	// dropped only when the next one starts.
	dropped := int64(-1)
	if in, err := os.Open(segs[len(segs)-1]); err == nil {
		dropped, _ = readSegHeader(in)
		in.Close()
	}
	if _, err := io.WriteString(f, GapRecord(dropped, max)); err != nil {
		return err
	}
	for _, s := range segs {
		in, err := os.Open(s)
		if err != nil {
			return err
		}
		_, err = readSegHeader(in)
		if err == nil {
			_, err = io.Copy(f, in)
		}
		in.Close()
		if err != nil {
			return err
		}
	}
	var rmErr error
	for _, s := range segs {
		rmErr = errors.Join(rmErr, os.Remove(s))
	}
	return rmErr
}

// readSegHeader reads a segment's header line, leaving in after it (at
// its start when it has none): the bytes dropped before it, -1 unknown.
func readSegHeader(in *os.File) (int64, error) {
	hdr := make([]byte, len(segHeader)+21)
	n, _ := io.ReadFull(in, hdr)
	line, _, ok := strings.Cut(string(hdr[:n]), "\n")
	if d, found := strings.CutPrefix(line, segHeader); ok && found {
		dropped, _ := strconv.ParseInt(d, 10, 64)
		_, err := in.Seek(int64(len(line)+1), io.SeekStart)
		return dropped, err
	}
	_, err := in.Seek(0, io.SeekStart)
	return -1, err
}

// tailSegments are the segments beside path, oldest first.
func tailSegments(path string) ([]string, error) {
	ents, err := os.ReadDir(filepath.Dir(path))
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil, nil
		}
		return nil, err
	}
	prefix := filepath.Base(path) + ".tail-"
	var out []string
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), prefix) && e.Type().IsRegular() {
			out = append(out, filepath.Join(filepath.Dir(path), e.Name()))
		}
	}
	slices.Sort(out) // zero-padded numbers: oldest first
	return out, nil
}
