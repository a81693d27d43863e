package engines

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/gofrs/flock"
)

// ProbeCache remembers what probing an engine CLI found — the first line
// of its --version, the flags its --help lists — so that a binary that did
// not change (the same resolved path, size and modification time) is not
// run again: a daemon's capability refresh every few minutes, `aq run
// --once` replicas one after another on one home, every job's pre-flight.
// An upgrade (npm replacing the file, a symlink re-pointed) is probed
// afresh. Only successful probes are kept.
//
// Several aq processes may share the file: it is read at each lookup,
// written by atomic rename, and every entry is a pure function of its
// binary, so the worst a race costs is one probe more. A nil *ProbeCache
// caches nothing.
type ProbeCache struct {
	path string
	mu   sync.Mutex
}

// NewProbeCache returns a cache kept in file path ("" keeps nothing).
func NewProbeCache(path string) *ProbeCache {
	if path == "" {
		return nil
	}
	return &ProbeCache{path: path}
}

// probeEntry is one probe's answer: Stamp says which binary it was (its
// resolved path, size and mtime, and the cache's format version).
type probeEntry struct {
	Stamp string          `json:"stamp"`
	Value json.RawMessage `json:"value"`
}

// probeCacheVersion changes when what a probe records changes meaning.
const probeCacheVersion = "2"

// stamp identifies bin as it is now: its resolved path (a symlink's target:
// an npm upgrade replaces it), size and mtime.
func stamp(bin string) (real, st string, ok bool) {
	real, err := filepath.EvalSymlinks(bin)
	if err != nil {
		return "", "", false
	}
	fi, err := os.Stat(real)
	if err != nil {
		return "", "", false
	}
	return real, fmt.Sprintf("v%s|%d|%d", probeCacheVersion, fi.Size(), fi.ModTime().UnixNano()), true
}

func (c *ProbeCache) load() map[string]probeEntry {
	out := map[string]probeEntry{}
	b, err := os.ReadFile(c.path)
	if err != nil {
		return out
	}
	if json.Unmarshal(b, &out) != nil {
		return map[string]probeEntry{} // unreadable: probe again and rewrite it
	}
	return out
}

// get decodes into v what the probe what of bin found, when bin did not
// change since; false when there is nothing (usable) kept.
func (c *ProbeCache) get(bin, what string, v any) bool {
	if c == nil {
		return false
	}
	real, st, ok := stamp(bin)
	if !ok {
		return false
	}
	c.mu.Lock()
	e, hit := c.load()[real+"|"+what]
	c.mu.Unlock()
	return hit && e.Stamp == st && json.Unmarshal(e.Value, v) == nil
}

// put records v as what the probe what of bin found, replacing an older
// entry of the same binary path (an upgraded binary). A write failure only
// costs a probe.
func (c *ProbeCache) put(bin, what string, v any) {
	if c == nil {
		return
	}
	real, st, ok := stamp(bin)
	if !ok {
		return
	}
	val, err := json.Marshal(v)
	if err != nil {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	entries := c.load()
	entries[real+"|"+what] = probeEntry{Stamp: st, Value: val}
	b, err := json.MarshalIndent(entries, "", "  ")
	if err != nil {
		return
	}
	if err := os.MkdirAll(filepath.Dir(c.path), 0o700); err != nil {
		return
	}
	tmp, err := os.CreateTemp(filepath.Dir(c.path), ".probes-*.tmp")
	if err != nil {
		return
	}
	_, werr := tmp.Write(append(b, '\n'))
	cerr := tmp.Close()
	if werr != nil || cerr != nil || os.Rename(tmp.Name(), c.path) != nil {
		_ = os.Remove(tmp.Name())
	}
}

// Version returns the first line of bin's --version: the cache's when bin
// did not change since it was last probed, else what probe says (kept
// when it succeeds).
func (c *ProbeCache) Version(ctx context.Context, bin string, probe func() (string, error)) (string, error) {
	var v string
	if c.get(bin, "--version", &v) {
		return v, nil
	}
	unlock := c.lock(ctx, bin)
	defer unlock()
	if c.get(bin, "--version", &v) {
		return v, nil
	}
	v, err := probe()
	if err == nil {
		c.put(bin, "--version", v)
	}
	return v, err
}

// lock takes the probe lock of bin — a file beside the cache, one per
// binary (its resolved path), held with flock — so that one process at a
// time probes it: four aq processes starting together on a busy host run
// its --help once, not four times at once. It waits as long as ctx allows
// (a probe holds it at most its deadline); on any failure to lock it goes
// on unlocked (the worst is a probe more). The returned func unlocks.
func (c *ProbeCache) lock(ctx context.Context, bin string) func() {
	if c == nil {
		return func() {}
	}
	real, err := filepath.EvalSymlinks(bin)
	if err != nil {
		real = bin
	}
	sum := sha256.Sum256([]byte(real))
	path := c.path + "." + hex.EncodeToString(sum[:8]) + ".lock"
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return func() {}
	}
	l := flock.New(path)
	if ok, err := l.TryLockContext(ctx, 50*time.Millisecond); err != nil || !ok {
		return func() {}
	}
	return func() { _ = l.Unlock() }
}

// helpProbeKey names a --help probe of spec: the subcommand and the flags
// looked for (a new HelpSpec is a new probe).
func helpProbeKey(spec HelpSpec) string {
	var flags []string
	for _, n := range spec.Needs {
		flags = append(flags, n.spellings()...)
	}
	return "help|" + strings.Join(spec.Sub, " ") + "|" + strings.Join(flags, ",")
}
