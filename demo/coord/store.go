package coord

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"slices"
	"sort"
	"sync"
	"time"

	"github.com/aqfleet/aq/internal/atomicfile"
)

// errConflict: the job's revision moved between read and write (CAS lost).
var errConflict = errors.New("revision conflict")

// maxEvents bounds each job's audit trail.
const maxEvents = 500

// state is everything the stub keeps, and what its state file holds.
type state struct {
	V           int                 `json:"v"`
	EnrollToken string              `json:"enrollToken"`
	Version     int64               `json:"version"` // the queue-state version
	Jobs        map[string]*Job     `json:"jobs"`
	Factories   map[string]*Factory `json:"factories"`
	Events      map[string][]Event  `json:"events"`
	Seq         int64               `json:"seq"`
}

// store is the in-memory state behind one mutex. Reads hand out copies;
// writes go through cas, which applies a change only if the job's revision
// is still the one the change was computed from.
type store struct {
	mu    sync.Mutex
	st    state
	file  string
	onChg func(Event)
	pend  []Event // change events to hand to onChg after unlock
	kick  func()  // after every change of a job (live log long polls)
}

func newStore(file string) (*store, error) {
	s := &store{file: file, st: state{V: 1, Jobs: map[string]*Job{}, Factories: map[string]*Factory{}, Events: map[string][]Event{}}}
	if file == "" {
		return s, nil
	}
	b, err := os.ReadFile(file)
	if errors.Is(err, fs.ErrNotExist) {
		return s, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read stub state %s: %w", file, err)
	}
	if err := json.Unmarshal(b, &s.st); err != nil {
		return nil, fmt.Errorf("stub state %s is corrupt: %w", file, err)
	}
	if s.st.Jobs == nil {
		s.st.Jobs = map[string]*Job{}
	}
	if s.st.Factories == nil {
		s.st.Factories = map[string]*Factory{}
	}
	if s.st.Events == nil {
		s.st.Events = map[string][]Event{}
	}
	return s, nil
}

// persistLocked rewrites the state file (temp, fsync, rename, fsync dir):
// an answer is sent only after its change is on disk, so a killed stub
// restarts with every change it acknowledged.
func (s *store) persistLocked() error {
	if s.file == "" {
		return nil
	}
	b, err := json.Marshal(&s.st)
	if err != nil {
		return err
	}
	return atomicfile.WriteFile(s.file, b, 0o600)
}

func cloneJob(j *Job) Job {
	c := *j
	c.Capabilities = slices.Clone(j.Capabilities)
	c.Deps = slices.Clone(j.Deps)
	if j.Last != nil {
		l := *j.Last
		c.Last = &l
	}
	return c
}

func cloneFactory(f *Factory) Factory {
	c := *f
	c.Capabilities = slices.Clone(f.Capabilities)
	c.Repos = slices.Clone(f.Repos)
	c.Engines = slices.Clone(f.Engines)
	c.Running = slices.Clone(f.Running)
	return c
}

// job returns a copy of job id.
func (s *store) job(id string) (Job, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	j, ok := s.st.Jobs[id]
	if !ok {
		return Job{}, false
	}
	return cloneJob(j), true
}

// jobs returns copies of every job, by id.
func (s *store) jobs() []Job {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]Job, 0, len(s.st.Jobs))
	for _, j := range s.st.Jobs {
		out = append(out, cloneJob(j))
	}
	sort.Slice(out, func(a, b int) bool { return out[a].ID < out[b].ID })
	return out
}

// cas replaces job j.ID with j if its stored revision is still j.Rev, then
// bumps the revision (and the queue-state version when the stage changed),
// records ev (if any) and persists. A job not yet stored is created when
// j.Rev is 0.
func (s *store) cas(j Job, now time.Time, evs ...Event) (Job, error) {
	s.mu.Lock()
	old, exists := s.st.Jobs[j.ID]
	switch {
	case !exists && j.Rev != 0, exists && old.Rev != j.Rev:
		s.mu.Unlock()
		return Job{}, errConflict
	}
	j.Rev++
	j.UpdatedAt = now
	if !exists || old.Stage != j.Stage || (old.Holder != "" && j.Holder == "" && j.Stage == StageQueued) {
		s.st.Version++ // a lease freed on a queued job makes it claimable too
	}
	nj := cloneJob(&j)
	s.st.Jobs[j.ID] = &nj
	for _, ev := range evs {
		s.eventLocked(ev, now)
	}
	if err := s.persistLocked(); err != nil {
		// Memory and disk must not disagree: undo.
		if exists {
			s.st.Jobs[j.ID] = old
		} else {
			delete(s.st.Jobs, j.ID)
		}
		s.mu.Unlock()
		return Job{}, fmt.Errorf("persist stub state: %w", err)
	}
	fire := s.takePendingLocked()
	s.mu.Unlock()
	s.fire(fire)
	if s.kick != nil {
		s.kick()
	}
	return cloneJob(&nj), nil
}

// remove deletes job j.ID, its audit trail and what else is keyed by it,
// if its stored revision is still j.Rev (errConflict otherwise), bumps the
// queue-state version and persists.
func (s *store) remove(j Job) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	old, ok := s.st.Jobs[j.ID]
	if !ok || old.Rev != j.Rev {
		return errConflict
	}
	evs := s.st.Events[j.ID]
	delete(s.st.Jobs, j.ID)
	delete(s.st.Events, j.ID)
	s.st.Version++
	if err := s.persistLocked(); err != nil {
		s.st.Jobs[j.ID], s.st.Events[j.ID] = old, evs
		s.st.Version--
		return fmt.Errorf("persist stub state: %w", err)
	}
	return nil
}

// event records ev without changing a job (a refused call).
func (s *store) event(ev Event, now time.Time) {
	s.mu.Lock()
	s.eventLocked(ev, now)
	_ = s.persistLocked()
	s.pend = nil // refusals are not changes
	s.mu.Unlock()
}

func (s *store) eventLocked(ev Event, now time.Time) {
	s.st.Seq++
	ev.Seq, ev.At = s.st.Seq, now
	l := append(s.st.Events[ev.JobID], ev)
	if len(l) > maxEvents {
		l = l[len(l)-maxEvents:]
	}
	s.st.Events[ev.JobID] = l
	if s.onChg != nil && ev.Kind != "fenced" {
		s.pend = append(s.pend, ev)
	}
}

func (s *store) takePendingLocked() []Event {
	p := s.pend
	s.pend = nil
	return p
}

func (s *store) fire(evs []Event) {
	for _, ev := range evs {
		s.onChg(ev)
	}
}

func (s *store) events(id string) []Event {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.st.Events[id])
}

func (s *store) version() int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.st.Version
}

// updateFactory applies fn to factory id (created when missing and create
// is set) and persists.
func (s *store) updateFactory(id string, create bool, fn func(*Factory)) (Factory, bool, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	f, ok := s.st.Factories[id]
	if !ok {
		if !create {
			return Factory{}, false, nil
		}
		f = &Factory{ID: id}
		s.st.Factories[id] = f
	}
	fn(f)
	if err := s.persistLocked(); err != nil {
		return Factory{}, true, err
	}
	return cloneFactory(f), true, nil
}

func (s *store) factories() []Factory {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]Factory, 0, len(s.st.Factories))
	for _, f := range s.st.Factories {
		out = append(out, cloneFactory(f))
	}
	sort.Slice(out, func(a, b int) bool { return out[a].ID < out[b].ID })
	return out
}

// factoryByTokenHash finds the factory whose token hashes to h.
func (s *store) factoryByTokenHash(h string) (Factory, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, f := range s.st.Factories {
		if f.TokenHash == h {
			return cloneFactory(f), true
		}
	}
	return Factory{}, false
}
