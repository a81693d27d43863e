package queue

import (
	"errors"
	"fmt"
	"io/fs"
	"slices"
	"strings"

	"github.com/aqfleet/aq/job"
)

// Reads take no lock (see the package comment): they never block behind a
// mutation, and fall back to a shared lock only when they keep racing one.

// readTries is how many lock-free looks a read takes before it falls back to
// a shared lock.
const readTries = 4

// Get returns the job with id. An unknown id is ErrNotFound (wrapped in a
// usage error naming the id). A job whose sidecar is unreadable is shown at
// its manifest's stage with reason invalid_manifest; the next mutation moves
// it to failed.
func (q *Queue) Get(id string) (*Entry, error) {
	if err := checkID(id); err != nil {
		return nil, err
	}
	e, err := q.view(id)
	if err != nil {
		return nil, err
	}
	return &e, nil
}

func (q *Queue) view(id string) (Entry, error) {
	for range readTries {
		e, ok, err := q.viewOnce(id, false)
		if err != nil || ok {
			return e, err
		}
	}
	var (
		e     Entry
		found bool
	)
	err := q.sharedLocked(func() error {
		var err error
		e, found, err = q.viewOnce(id, true)
		return err
	})
	if err != nil {
		return Entry{}, err
	}
	if !found {
		return Entry{}, notFound(id)
	}
	return e, nil
}

// viewOnce is one look at a job without repairing anything. ok is false when
// the look was inconclusive (a move may be in progress) or, when final (no
// writer can run), when the job does not exist.
func (q *Queue) viewOnce(id string, final bool) (e Entry, ok bool, err error) {
	stage, found, err := q.locate(id)
	if err != nil || !found {
		return Entry{}, false, err
	}
	st, err := q.readSidecarFile(q.sidecar(stage, id), id, false)
	var ce *corruptError
	switch {
	case err == nil:
	case errors.As(err, &ce):
		st = q.problemView(id, stage, ce.err.Error()+"; the next queue operation moves the job to failed and keeps the file")
	case errors.Is(err, fs.ErrNotExist):
		stray, from, serr := q.findStray(id, stage, false)
		switch {
		case serr == nil && from != "":
			st = stray // a move in progress, or interrupted: the manifest's stage wins
		case !final && (serr == nil || errors.As(serr, &ce)):
			return Entry{}, false, nil // the new sidecar may be about to land
		case errors.As(serr, &ce):
			st = q.problemView(id, stage, ce.err.Error()+"; the next queue operation moves the job to failed and keeps the file")
		case serr != nil:
			return Entry{}, false, serr
		default:
			var perr error
			st, perr = q.fromManifest(id, stage)
			if perr != nil {
				st.Reason, st.Detail = job.ReasonInvalidManifest, perr.Error()+"; the next queue operation moves the job to failed"
			}
		}
	default:
		return Entry{}, false, err
	}
	st.Stage = stage
	return Entry{State: st, ManifestPath: q.md(stage, id)}, true, nil
}

// problemView is what reads show for a job whose sidecar cannot be read: what
// the parser makes of the manifest, marked invalid_manifest.
func (q *Queue) problemView(id string, stage job.Stage, detail string) State {
	st, _ := q.fromManifest(id, stage)
	st.Reason, st.Detail = job.ReasonInvalidManifest, detail
	return st
}

// List returns every job, in board order (job.Stages), then in the order Next
// takes them. A job moving while List runs is listed once, at one of its
// stages.
func (q *Queue) List() ([]Entry, error) {
	first, ok1, err := q.snapshot()
	if err != nil {
		return nil, err
	}
	second, ok2, err := q.snapshot()
	if err != nil {
		return nil, err
	}
	var entries []Entry
	if ok1 && ok2 && mapsEqual(first, second) {
		for id := range second {
			e, err := q.view(id)
			if errors.Is(err, ErrNotFound) {
				continue
			}
			if err != nil {
				return nil, err
			}
			entries = append(entries, e)
		}
	} else {
		// Jobs moved between the two looks: take one look with writers held off.
		err := q.sharedLocked(func() error {
			ids, _, err := q.snapshot()
			if err != nil {
				return err
			}
			for id := range ids {
				e, found, err := q.viewOnce(id, true)
				if err != nil {
					return err
				}
				if found {
					entries = append(entries, e)
				}
			}
			return nil
		})
		if err != nil {
			return nil, err
		}
	}
	rank := map[job.Stage]int{}
	for i, s := range job.Stages {
		rank[s] = i
	}
	slices.SortFunc(entries, func(a, b Entry) int {
		if d := rank[a.State.Stage] - rank[b.State.Stage]; d != 0 {
			return d
		}
		return compare(a.State, b.State)
	})
	return entries, nil
}

// snapshot maps each job id to the stage folder its manifest was seen in. ok
// is false when an id was seen in two folders (a move between two reads).
func (q *Queue) snapshot() (map[string]job.Stage, bool, error) {
	ids := map[string]job.Stage{}
	ok := true
	for _, s := range job.Stages {
		got, err := q.stageIDs(s)
		if err != nil {
			return nil, false, err
		}
		for _, id := range got {
			if _, dup := ids[id]; dup {
				ok = false
			}
			ids[id] = s
		}
	}
	return ids, ok, nil
}

func mapsEqual(a, b map[string]job.Stage) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			return false
		}
	}
	return true
}

// Wait says why a job waits for its deps.
type Wait struct {
	ID       string     `json:"id"`
	Stage    job.Stage  `json:"stage"`
	DepsMode string     `json:"depsMode"`
	Deps     []DepState `json:"deps"`
	// Ready: the deps allow the job to run (Next promotes a blocked job).
	Ready bool `json:"ready"`
	// Stuck: the deps can never be met without an operator (a dep is missing,
	// failed or dead-lettered).
	Stuck bool `json:"stuck"`
	// Why is one line for a person.
	Why string `json:"why"`
}

// DepState is one dep of a waiting job.
type DepState struct {
	ID      string    `json:"id"`
	Stage   job.Stage `json:"stage,omitempty"` // empty: no job has this id
	Problem string    `json:"problem,omitempty"`
}

// Waiting reports on the job's deps: where each is, which ones can never ship
// without an operator, and one line saying why the job waits.
func (q *Queue) Waiting(id string) (*Wait, error) {
	if err := checkID(id); err != nil {
		return nil, err
	}
	e, err := q.view(id)
	if err != nil {
		return nil, err
	}
	st := e.State
	mode := st.DepsMode
	if mode == "" {
		mode = job.DefaultDepsMode
	}
	w := &Wait{ID: id, Stage: st.Stage, DepsMode: mode, Ready: q.depsShipped(st.Deps, mode)}
	stuck, parts := 0, make([]string, 0, len(st.Deps))
	for _, d := range st.Deps {
		ds := DepState{ID: d}
		if !validID(d) {
			ds.Problem = "not a valid job id: fix the job's deps"
		} else if stage, found, err := q.locate(d); err != nil {
			return nil, err
		} else if !found {
			ds.Problem = "no such job: submit it, or remove it from the deps"
		} else {
			ds.Stage = stage
			switch stage {
			case job.DeadLetter:
				ds.Problem = fmt.Sprintf("dead-lettered: it will not ship unless requeued (`aq job requeue %s`)", d)
			case job.Failed:
				ds.Problem = fmt.Sprintf("failed: it will not ship unless requeued (`aq job requeue %s`)", d)
			}
		}
		if ds.Problem != "" {
			stuck++
		}
		w.Deps = append(w.Deps, ds)
		switch {
		case ds.Stage == "":
			parts = append(parts, fmt.Sprintf("%s (%s)", d, ds.Problem))
		case ds.Problem != "":
			parts = append(parts, fmt.Sprintf("%s (%s: %s)", d, ds.Stage, ds.Problem))
		default:
			parts = append(parts, fmt.Sprintf("%s (%s)", d, ds.Stage))
		}
	}
	switch {
	case w.Ready && len(st.Deps) == 0:
		w.Why = "no deps"
	case w.Ready:
		w.Why = "deps shipped: " + strings.Join(parts, ", ")
	default:
		w.Stuck = stuck > 0 && (mode != "any" || stuck == len(st.Deps))
		w.Why = fmt.Sprintf("waits for %s of: %s", mode, strings.Join(parts, ", "))
	}
	return w, nil
}
