package caps

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/aqfleet/aq/internal/atomicfile"
)

// ProbeCache remembers what a probe of a binary printed (the first line of
// `<bin> --version`), keyed by the binary's resolved path and the probe's
// arguments, and valid while the binary's size and modification time are
// unchanged: a binary that did not change is not run again — a daemon's
// capability refresh every few minutes, `aq run --once` replicas starting
// one after another on one home. An upgrade (npm replacing the file, a
// symlink re-pointed) changes the key or the stamp and is probed afresh.
// Only successful probes are kept. Safe for concurrent use; opened on a
// file, it persists across processes (Save).
type ProbeCache struct {
	file string

	mu    sync.Mutex
	m     map[string]probeEntry
	dirty bool
}

type probeEntry struct {
	Size    int64     `json:"size"`
	ModTime time.Time `json:"modTime"`
	Out     string    `json:"out"`
}

// ProbeCacheFile is the probe cache's file name under $AQ_HOME/state.
const ProbeCacheFile = "probes.json"

// NewProbeCache is an empty cache in memory.
func NewProbeCache() *ProbeCache { return &ProbeCache{m: map[string]probeEntry{}} }

// OpenProbeCache loads the cache kept in file ($AQ_HOME/state/probes.json);
// a missing, unreadable or corrupt file is an empty cache (it only saves
// probes).
func OpenProbeCache(file string) *ProbeCache {
	c := NewProbeCache()
	c.file = file
	if b, err := os.ReadFile(file); err == nil {
		var m map[string]probeEntry
		if json.Unmarshal(b, &m) == nil && m != nil {
			c.m = m
		}
	}
	return c
}

// Save writes the cache to its file when it changed (0600, atomically).
func (c *ProbeCache) Save() error {
	if c == nil || c.file == "" {
		return nil
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.dirty {
		return nil
	}
	if err := os.MkdirAll(filepath.Dir(c.file), 0o700); err != nil {
		return err
	}
	if err := atomicfile.WriteJSON(c.file, c.m, 0o600); err != nil {
		return err
	}
	c.dirty = false
	return nil
}

// Len is the number of probes kept.
func (c *ProbeCache) Len() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.m)
}

// key and stamp of bin for a probe with args; ok false when bin cannot be
// stat'ed (the probe then runs, uncached).
func probeKey(bin string, args []string) (key string, fi os.FileInfo, ok bool) {
	real, err := filepath.EvalSymlinks(bin)
	if err != nil {
		return "", nil, false
	}
	fi, err = os.Stat(real)
	if err != nil {
		return "", nil, false
	}
	return real + "\x00" + strings.Join(args, "\x00"), fi, true
}

// probe returns what run printed for bin, from the cache when bin is
// unchanged; a successful run is kept.
func (c *ProbeCache) probe(bin string, args []string, run func() (string, error)) (string, error) {
	if c == nil {
		return run()
	}
	key, fi, ok := probeKey(bin, args)
	if ok {
		c.mu.Lock()
		e, hit := c.m[key]
		c.mu.Unlock()
		if hit && e.Size == fi.Size() && e.ModTime.Equal(fi.ModTime()) {
			return e.Out, nil
		}
	}
	out, err := run()
	if err == nil && ok {
		c.mu.Lock()
		c.m[key] = probeEntry{Size: fi.Size(), ModTime: fi.ModTime(), Out: out}
		c.dirty = true
		c.mu.Unlock()
	}
	return out, err
}
