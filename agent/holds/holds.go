// Package holds keeps the engines this factory must not start until a given
// time: when an engine's account hits a rate or usage limit or runs out of
// credit, every other job for that engine would fail the same way until the
// limit resets, so the engine is held until then. A held engine's jobs are
// not taken from the local queue, its engine:<name> capability is withheld
// from fleet claims and heartbeats (so the coordinator hands them to a
// factory on another account), and a run that meets a hold parks at once.
//
// Holds live in one JSON file under $AQ_HOME, shared by every aq process of
// that home (`aq run --once` after `aq run --once`), read-modify-written
// under a file lock. An expired hold is ignored and dropped at the next
// write.
package holds

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/gofrs/flock"
)

// Hold is one engine held until a time.
type Hold struct {
	Engine string    `json:"engine"`
	Until  time.Time `json:"until"`
	// Why is what the engine hit ("usage limit", "rate limit", "out of
	// credits"), and Job the job that met it.
	Why   string    `json:"why"`
	Job   string    `json:"job,omitempty"`
	Since time.Time `json:"since"`
}

// String is the hold in words: "claude usage limit until 14:05 UTC".
func (h Hold) String() string {
	return fmt.Sprintf("%s %s until %s", h.Engine, h.Why, h.Until.UTC().Format("2006-01-02 15:04 MST"))
}

// Store is the holds of one aq home. A nil *Store holds nothing.
type Store struct {
	path string
	now  func() time.Time
	mu   sync.Mutex
}

// Open returns the store kept in file path (created on the first hold).
func Open(path string, now func() time.Time) *Store {
	if now == nil {
		now = time.Now
	}
	return &Store{path: path, now: now}
}

// Path is the store's file.
func (s *Store) Path() string { return s.path }

// Hold holds h.Engine until h.Until, or keeps an existing hold that lasts
// longer (two limits: the later reset wins).
func (s *Store) Hold(h Hold) error {
	if s == nil {
		return nil
	}
	if h.Engine == "" || h.Until.IsZero() {
		return errors.New("holds: a hold needs an engine and a time")
	}
	if h.Since.IsZero() {
		h.Since = s.now()
	}
	h.Until, h.Since = h.Until.UTC().Round(0), h.Since.UTC().Round(0)
	return s.update(func(m map[string]Hold) {
		if old, ok := m[h.Engine]; ok && old.Until.After(h.Until) {
			return
		}
		m[h.Engine] = h
	})
}

// Release lifts the hold on engine, if any (an operator who knows the
// limit is gone: a new key, credit bought).
func (s *Store) Release(engine string) error {
	if s == nil {
		return nil
	}
	return s.update(func(m map[string]Hold) { delete(m, engine) })
}

// Active returns the holds that have not expired, by engine name. A store
// whose file cannot be read holds nothing (and says why in err): a broken
// file must not stop the factory.
func (s *Store) Active() (map[string]Hold, error) {
	if s == nil {
		return map[string]Hold{}, nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	m, err := s.read()
	now := s.now()
	for k, h := range m {
		if !h.Until.After(now) {
			delete(m, k)
		}
	}
	return m, err
}

// Held returns engine's hold when it has one that has not expired.
func (s *Store) Held(engine string) (Hold, bool) {
	m, _ := s.Active()
	h, ok := m[engine]
	return h, ok
}

// List returns the active holds, by engine name.
func (s *Store) List() []Hold {
	m, _ := s.Active()
	out := make([]Hold, 0, len(m))
	for _, h := range m {
		out = append(out, h)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Engine < out[j].Engine })
	return out
}

// Filter returns tokens without the engine:<name> capability of every held
// engine: what a held factory offers the coordinator.
func (s *Store) Filter(tokens []string) []string {
	m, _ := s.Active()
	if len(m) == 0 {
		return tokens
	}
	out := make([]string, 0, len(tokens))
	for _, t := range tokens {
		if name, ok := strings.CutPrefix(t, "engine:"); ok {
			if _, held := m[name]; held {
				continue
			}
		}
		out = append(out, t)
	}
	return out
}

// read loads the file; a missing file is no holds. The caller holds mu.
func (s *Store) read() (map[string]Hold, error) {
	m := map[string]Hold{}
	b, err := os.ReadFile(s.path)
	if errors.Is(err, fs.ErrNotExist) {
		return m, nil
	}
	if err != nil {
		return m, fmt.Errorf("engine holds %s: %w", s.path, err)
	}
	var list []Hold
	if err := json.Unmarshal(b, &list); err != nil {
		return m, fmt.Errorf("engine holds %s is not valid JSON (%v): holding nothing; remove the file to clear it", s.path, err)
	}
	for _, h := range list {
		if h.Engine != "" {
			m[h.Engine] = h
		}
	}
	return m, nil
}

// update read-modify-writes the file under the file lock, dropping expired
// holds. An unreadable file is replaced.
func (s *Store) update(fn func(map[string]Hold)) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := os.MkdirAll(filepath.Dir(s.path), 0o700); err != nil {
		return fmt.Errorf("engine holds: %w", err)
	}
	lock := flock.New(s.path + ".lock")
	if err := lock.Lock(); err != nil {
		return fmt.Errorf("engine holds: lock %s: %w", s.path, err)
	}
	defer lock.Unlock()
	m, _ := s.read()
	fn(m)
	now := s.now()
	list := make([]Hold, 0, len(m))
	for _, h := range m {
		if h.Until.After(now) {
			list = append(list, h)
		}
	}
	slices.SortFunc(list, func(a, b Hold) int { return strings.Compare(a.Engine, b.Engine) })
	b, err := json.MarshalIndent(list, "", "  ")
	if err != nil {
		return err
	}
	tmp, err := os.CreateTemp(filepath.Dir(s.path), ".holds-*.tmp")
	if err != nil {
		return fmt.Errorf("engine holds: %w", err)
	}
	_, werr := tmp.Write(append(b, '\n'))
	cerr := tmp.Close()
	if err := errors.Join(werr, cerr); err != nil {
		os.Remove(tmp.Name())
		return fmt.Errorf("engine holds: %w", err)
	}
	if err := os.Rename(tmp.Name(), s.path); err != nil {
		os.Remove(tmp.Name())
		return fmt.Errorf("engine holds: %w", err)
	}
	return nil
}
