// Package jobstate keeps this factory's record of the fleet jobs it ran:
// one JSON file per job under $AQ_HOME/state/jobs/<id>.json. The coordinator
// owns a fleet job's truth; this record is what the factory itself knows —
// for `aq status`, `aq job show`, orphan recovery after a crash, and `aq gc`'s
// decision whether a WIP ref may go. (Local jobs have their queue sidecar.)
package jobstate

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/aqfleet/aq/internal/atomicfile"
	"github.com/aqfleet/aq/job"
)

// Record is one fleet job as this factory saw it. Field names are stable.
type Record struct {
	ID         string     `json:"id"`
	Repo       string     `json:"repo"`
	Base       string     `json:"base,omitempty"`
	Engine     string     `json:"engine,omitempty"`
	Stage      job.Stage  `json:"stage"` // the last stage this factory reported (or building while it runs)
	Reason     job.Reason `json:"reason,omitempty"`
	Detail     string     `json:"detail,omitempty"`
	LeaseEpoch int64      `json:"leaseEpoch"`
	Fenced     bool       `json:"fenced,omitempty"`
	Checkpoint string     `json:"checkpoint,omitempty"`
	Branch     string     `json:"branch,omitempty"`
	// Delivered is the result commit this factory pushed to origin's Branch,
	// recorded before the final report: a job whose result is on origin is
	// reported, never run again.
	Delivered string `json:"delivered,omitempty"`
	PR        string `json:"pr,omitempty"`
	// ReportRefused says why the coordinator refused this job's terminal
	// report (a 4xx other than 409, or an answer that is not the
	// contract's JSON): the coordinator does not have the outcome above;
	// the report is kept in $AQ_HOME/spool/dead. `aq job show` says so.
	ReportRefused string        `json:"reportRefused,omitempty"`
	Insights      *job.Insights `json:"insights,omitempty"`
	Source        string        `json:"source,omitempty"` // "broker" or "poll"
	PID           int           `json:"pid,omitempty"`    // the aq process running it
	StartedAt     time.Time     `json:"startedAt,omitzero"`
	EndedAt       time.Time     `json:"endedAt,omitzero"`
	UpdatedAt     time.Time     `json:"updatedAt"`
}

// Running reports whether the record says the job is still being worked on
// here (a crashed aq leaves such records behind: orphans).
func (r Record) Running() bool { return r.EndedAt.IsZero() }

// Store is the record directory.
type Store struct{ dir string }

// Open returns the store under dir ($AQ_HOME/state/jobs), creating it.
func Open(dir string) (*Store, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("create %s: %w", dir, err)
	}
	return &Store{dir: dir}, nil
}

var idPattern = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$`) })

func (s *Store) path(id string) (string, error) {
	if !idPattern().MatchString(id) || strings.Contains(id, "..") {
		return "", fmt.Errorf("invalid job id %q", id)
	}
	return filepath.Join(s.dir, id+".json"), nil
}

// Put writes r atomically (temp file, fsync, rename).
func (s *Store) Put(r Record) error {
	p, err := s.path(r.ID)
	if err != nil {
		return err
	}
	if r.UpdatedAt.IsZero() {
		r.UpdatedAt = time.Now().UTC()
	}
	return atomicfile.WriteJSON(p, r, 0o600)
}

// Update reads the record (or starts a new one with the id), applies fn and
// writes it back. Callers serialise updates of one job themselves (one
// goroutine owns a running job).
func (s *Store) Update(id string, fn func(*Record)) (Record, error) {
	r, err := s.Get(id)
	if errors.Is(err, fs.ErrNotExist) {
		r, err = Record{ID: id}, nil
	}
	if err != nil {
		return Record{}, err
	}
	fn(&r)
	r.UpdatedAt = time.Now().UTC()
	return r, s.Put(r)
}

// Get reads one record; fs.ErrNotExist when there is none.
func (s *Store) Get(id string) (Record, error) {
	p, err := s.path(id)
	if err != nil {
		return Record{}, err
	}
	b, err := os.ReadFile(p)
	if err != nil {
		return Record{}, err
	}
	var r Record
	if err := json.Unmarshal(b, &r); err != nil {
		return Record{}, fmt.Errorf("%s: corrupt job record: %v", p, err)
	}
	return r, nil
}

// List returns every readable record, by id. Corrupt files are skipped and
// reported in the error list (never deleted).
func (s *Store) List() ([]Record, []error) {
	ents, err := os.ReadDir(s.dir)
	if err != nil {
		return nil, []error{err}
	}
	var out []Record
	var errs []error
	for _, e := range ents {
		name := e.Name()
		if e.IsDir() || !strings.HasSuffix(name, ".json") || strings.HasPrefix(name, ".") {
			continue
		}
		r, err := s.Get(strings.TrimSuffix(name, ".json"))
		if err != nil {
			errs = append(errs, err)
			continue
		}
		out = append(out, r)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out, errs
}
