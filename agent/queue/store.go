package queue

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/aqfleet/aq/internal/atomicfile"
	"github.com/aqfleet/aq/internal/hostfault"
	"github.com/aqfleet/aq/job"
)

// This file holds the on-disk mechanics: atomic writes, the sidecar cache,
// locating a job, moving it, and repairing what a crash or a person left
// behind. Functions named *Locked must be called holding the queue lock.

// writeTemp writes data, durably, to a new temp file beside path, to be
// renamed onto path: Submit's two-file commit (single files go through
// atomicfile.WriteFile). Temp names start with "." so scans never take them
// for jobs.
func writeTemp(path string, data []byte) (string, error) {
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".tmp*")
	if err != nil {
		return "", err
	}
	_, err = f.Write(data)
	if err == nil {
		err = f.Chmod(0o644)
	}
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		os.Remove(f.Name())
		return "", err
	}
	return f.Name(), nil
}

func exists(path string) (bool, error) {
	_, err := os.Lstat(path)
	if err == nil {
		return true, nil
	}
	if errors.Is(err, fs.ErrNotExist) {
		return false, nil
	}
	return false, err
}

// corruptError: a sidecar that is not valid JSON or names another job.
type corruptError struct {
	path string
	err  error
}

func (e *corruptError) Error() string { return e.err.Error() }

// sidecarCache remembers parsed sidecars by path so that a long-lived process
// does not re-read every inbox sidecar on each Next. It is used only under the
// queue lock, where an entry is trusted when both hold:
//   - no other Queue has taken the lock since this one last did (each Queue
//     stamps its token into the lock file when it takes the lock; a foreign
//     stamp clears the cache), so no other writer changed any file;
//   - the file is the same one (inode, size, mtime), which catches edits made
//     by hand.
//
// Lock-free reads neither use nor fill it.
type sidecarCache struct {
	mu sync.Mutex
	m  map[string]cached
}

type cached struct {
	info os.FileInfo
	st   State
}

func (c *sidecarCache) get(path string, info os.FileInfo) (State, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	e, ok := c.m[path]
	if !ok || !os.SameFile(e.info, info) || !e.info.ModTime().Equal(info.ModTime()) || e.info.Size() != info.Size() {
		return State{}, false
	}
	return e.st.clone(), true
}

func (c *sidecarCache) put(path string, info os.FileInfo, st State) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.m == nil {
		c.m = map[string]cached{}
	}
	c.m[path] = cached{info: info, st: st.clone()}
}

func (c *sidecarCache) drop(path string) {
	c.mu.Lock()
	delete(c.m, path)
	c.mu.Unlock()
}

func (c *sidecarCache) clear() {
	c.mu.Lock()
	c.m = nil
	c.mu.Unlock()
}

// claimCache runs when the lock is taken: if another Queue held the lock since
// this one did, forget everything cached, and stamp this Queue's token.
func (q *Queue) claimCache() {
	f, err := os.OpenFile(q.lock.Path(), os.O_RDWR, 0)
	if err != nil {
		q.cache.clear()
		return
	}
	defer f.Close()
	buf := make([]byte, len(q.token)+1)
	n, _ := f.ReadAt(buf, 0)
	if string(buf[:n]) == q.token {
		return
	}
	q.cache.clear()
	if _, err := f.WriteAt([]byte(q.token), 0); err == nil {
		_ = f.Truncate(int64(len(q.token)))
	}
}

// readSidecarFile reads and checks the sidecar at path for job id. A missing
// file is fs.ErrNotExist; an unreadable one is a *corruptError.
// cached: use the cache (only under the lock).
func (q *Queue) readSidecarFile(path, id string, cached bool) (State, error) {
	if cached {
		info, err := os.Stat(path)
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				q.cache.drop(path)
			}
			return State{}, err
		}
		if st, ok := q.cache.get(path, info); ok {
			return st, nil
		}
	}
	f, err := os.Open(path)
	if err != nil {
		return State{}, err
	}
	defer f.Close()
	info, err := f.Stat()
	if err != nil {
		return State{}, err
	}
	data, err := io.ReadAll(f)
	if err != nil {
		return State{}, err
	}
	var st State
	if err := json.Unmarshal(data, &st); err != nil {
		return State{}, &corruptError{path, fmt.Errorf("%s is not valid JSON: %v", q.rel(path), err)}
	}
	if st.ID != id {
		return State{}, &corruptError{path, fmt.Errorf("%s belongs to job %q, not %q", q.rel(path), st.ID, id)}
	}
	if cached {
		q.cache.put(path, info, st)
	}
	return st, nil
}

// writeSidecarLocked writes st to its stage folder.
func (q *Queue) writeSidecarLocked(st *State) error {
	data, err := json.MarshalIndent(st, "", "  ")
	if err != nil {
		return fmt.Errorf("job %s: encode sidecar: %w", st.ID, err)
	}
	return q.writeSidecarBytes(st.Stage, st.ID, append(data, '\n'))
}

func (q *Queue) writeSidecarBytes(stage job.Stage, id string, data []byte) error {
	path := q.sidecar(stage, id)
	q.cache.drop(path)
	if err := atomicfile.WriteFile(path, data, 0o644); err != nil {
		return fmt.Errorf("job %s: write sidecar: %w", id, err)
	}
	return nil
}

// locate finds the stage whose folder holds <id>.md.
func (q *Queue) locate(id string) (job.Stage, bool, error) {
	for _, s := range job.Stages {
		ok, err := exists(q.md(s, id))
		if err != nil {
			return "", false, err
		}
		if ok {
			return s, true, nil
		}
	}
	return "", false, nil
}

// commitMoveLocked moves the job to stage to and writes st there, recording a
// transition (tr's At, Reason and Detail). From == to only rewrites the sidecar.
func (q *Queue) commitMoveLocked(st *State, to job.Stage, tr Transition) error {
	from := st.Stage
	st.Stage = to
	st.UpdatedAt = tr.At
	if from != to {
		tr.From, tr.To = from, to
		st.History = append(st.History, tr)
	}
	// Encode first: a state that cannot be written must not move the job.
	data, err := json.MarshalIndent(st, "", "  ")
	if err != nil {
		st.Stage = from
		return fmt.Errorf("job %s: encode sidecar: %w", st.ID, err)
	}
	data = append(data, '\n')
	if from == to {
		return q.writeSidecarBytes(to, st.ID, data)
	}
	src, dst := q.md(from, st.ID), q.md(to, st.ID)
	if ok, err := exists(dst); err != nil || ok {
		st.Stage = from
		if err == nil {
			err = fmt.Errorf("job %s: %s already exists; refusing to overwrite it (remove the stale copy by hand)", st.ID, q.rel(dst))
		}
		return err
	}
	if err := os.Rename(src, dst); err != nil {
		st.Stage = from
		return fmt.Errorf("job %s: move to %s: %w", st.ID, to, err)
	}
	if err := q.writeSidecarBytes(to, st.ID, data); err != nil {
		if hostfault.Is(err) {
			// The file system takes no writes (full, read-only, failing):
			// the move stands on the rename alone — the manifest's folder
			// is the job's stage; the old sidecar, left where it was, is
			// adopted by the next operation that can write (loadAtLocked).
			// Putting the manifest back would strand the job in building.
			return &MovedUnrecordedError{ID: st.ID, To: to, Err: err}
		}
		// Put the manifest back so the old sidecar is right again; if even that
		// fails, the next locked operation adopts the old sidecar.
		if os.Rename(dst, src) == nil {
			st.Stage = from
		}
		return err
	}
	// The old sidecar is superseded. Its removal is not synced: if a crash
	// loses it, the next full repair removes it again.
	old := q.sidecar(from, st.ID)
	q.cache.drop(old)
	if err := os.Remove(old); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("job %s: remove old sidecar: %w", st.ID, err)
	}
	return nil
}

// MovedUnrecordedError is a move that the file system let happen only as
// a rename: the job is in To (its manifest's folder), but its state, the
// transition's reason and detail included, could not be written (the
// host's file system is full, read-only or failing). Nothing is lost that
// was recorded before; the next operation that can write reconciles it.
type MovedUnrecordedError struct {
	ID  string
	To  job.Stage
	Err error
}

func (e *MovedUnrecordedError) Error() string {
	return fmt.Sprintf("job %s is in %s, but its state could not be recorded: %v", e.ID, e.To, e.Err)
}

func (e *MovedUnrecordedError) Unwrap() error { return e.Err }

// loadLocked returns the job's state at its manifest's stage, repairing on
// the way: a sidecar left in another stage is adopted, a missing one is
// synthesised, a corrupt one is quarantined (the job goes to failed).
func (q *Queue) loadLocked(id string) (State, error) {
	stage, ok, err := q.locate(id)
	if err != nil {
		return State{}, err
	}
	if !ok {
		return State{}, notFound(id)
	}
	return q.loadAtLocked(id, stage)
}

// loadAtLocked is loadLocked for a job whose manifest is known to be in stage
// (seen there under the lock, so it cannot have moved).
func (q *Queue) loadAtLocked(id string, stage job.Stage) (State, error) {
	path := q.sidecar(stage, id)
	st, err := q.readSidecarFile(path, id, true)
	var ce *corruptError
	switch {
	case err == nil:
		if st.Stage != stage { // edited by hand: the manifest's folder wins
			now := q.clock()
			st.History = append(st.History, Transition{At: now, From: st.Stage, To: stage,
				Detail: fmt.Sprintf("reconciled: the sidecar said %s but the manifest is in %s", st.Stage, stage)})
			st.Stage, st.UpdatedAt = stage, now
			if err := q.writeSidecarLocked(&st); err != nil {
				return State{}, err
			}
		}
		return st, nil
	case errors.As(err, &ce):
		return q.quarantineLocked(id, stage, ce)
	case !errors.Is(err, fs.ErrNotExist):
		return State{}, err
	}

	// No sidecar beside the manifest: a move was interrupted after the rename
	// (the sidecar is still in the old stage), or the manifest came by hand.
	stray, from, strayErr := q.findStray(id, stage, true)
	if strayErr != nil {
		if errors.As(strayErr, &ce) {
			return q.quarantineLocked(id, stage, ce)
		}
		return State{}, strayErr
	}
	if from == "" {
		return q.synthesiseLocked(id, stage)
	}
	now := q.clock()
	stray.History = append(stray.History, Transition{At: now, From: stray.Stage, To: stage,
		Detail: fmt.Sprintf("reconciled an interrupted move: the sidecar was still in %s", from)})
	stray.Stage, stray.UpdatedAt = stage, now
	if err := q.writeSidecarLocked(&stray); err != nil {
		return State{}, err
	}
	old := q.sidecar(from, id)
	q.cache.drop(old)
	if err := os.Remove(old); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return State{}, err
	}
	return stray, nil
}

// findStray looks for the job's sidecar in stages other than stage and returns
// the most recently updated readable one. With none readable but one corrupt,
// it returns that one's *corruptError. from is "" when there is none.
func (q *Queue) findStray(id string, stage job.Stage, cached bool) (st State, from job.Stage, err error) {
	var corrupt error
	for _, s := range job.Stages {
		if s == stage {
			continue
		}
		got, rerr := q.readSidecarFile(q.sidecar(s, id), id, cached)
		var ce *corruptError
		switch {
		case rerr == nil:
			if from == "" || got.UpdatedAt.After(st.UpdatedAt) {
				st, from = got, s
			}
		case errors.As(rerr, &ce):
			if corrupt == nil {
				corrupt = rerr
			}
		case !errors.Is(rerr, fs.ErrNotExist):
			return State{}, "", rerr
		}
	}
	if from == "" && corrupt != nil {
		return State{}, "", corrupt
	}
	return st, from, nil
}

// fromManifest builds a state for a manifest that has no sidecar: from the
// parser when there is one, else minimal fields. A parse error (or a manifest
// whose id is not its file name) is returned with the minimal state.
func (q *Queue) fromManifest(id string, stage job.Stage) (State, error) {
	now := q.clock()
	path := q.md(stage, id)
	created := now
	if info, err := os.Lstat(path); err == nil {
		created = info.ModTime().UTC().Round(0)
	}
	st := State{ID: id, Title: id, Stage: stage, Engine: job.DefaultEngine, Priority: job.PriorityNormal,
		DepsMode: job.DefaultDepsMode, CreatedAt: created, UpdatedAt: now}
	if q.parse == nil {
		return st, nil
	}
	j, err := q.parse(path)
	switch {
	case err != nil:
		return st, fmt.Errorf("the manifest %s could not be read: %v", q.rel(path), err)
	case j == nil:
		return st, fmt.Errorf("the manifest %s could not be read", q.rel(path))
	case j.ID != "" && j.ID != id:
		return st, fmt.Errorf("the manifest says id %q but its file is %s.md", j.ID, id)
	}
	for _, d := range j.Deps {
		if !validID(d) {
			return st, fmt.Errorf("the manifest %s names an invalid dep %q", q.rel(path), d)
		}
	}
	if j.ID == "" {
		c := *j
		c.ID = id
		j = &c
	}
	return newState(j, stage, created, now), nil
}

// synthesiseLocked gives a manifest without any sidecar a fresh one, or moves
// it to failed when it cannot be read.
func (q *Queue) synthesiseLocked(id string, stage job.Stage) (State, error) {
	st, perr := q.fromManifest(id, stage)
	if perr != nil {
		return q.failInvalidLocked(st, perr.Error()+"; fix it, then `aq job requeue "+id+"`")
	}
	st.History = []Transition{{At: st.UpdatedAt, To: stage, Detail: "the sidecar was missing: made from the manifest"}}
	if err := q.writeSidecarLocked(&st); err != nil {
		return State{}, err
	}
	return st, nil
}

// quarantineLocked keeps an unreadable sidecar as failed/<id>.json.corrupt and
// moves the job to failed with a fresh sidecar. The manifest is not touched
// but for the rename.
func (q *Queue) quarantineLocked(id string, stage job.Stage, ce *corruptError) (State, error) {
	dst, err := q.freeName(job.Failed, id+".json.corrupt")
	if err != nil {
		return State{}, err
	}
	q.cache.drop(ce.path)
	if err := os.Rename(ce.path, dst); err != nil {
		return State{}, fmt.Errorf("job %s: keep the corrupt sidecar: %w", id, err)
	}
	st, _ := q.fromManifest(id, stage) // best effort: the parser restores the job's fields
	return q.failInvalidLocked(st, fmt.Sprintf("%s; kept as %s; the manifest is intact: `aq job requeue %s` runs it again",
		ce.err, q.rel(dst), id))
}

// failInvalidLocked records st (a state with no sidecar on disk yet, at the
// manifest's stage) and moves the job to failed with reason invalid_manifest.
func (q *Queue) failInvalidLocked(st State, detail string) (State, error) {
	now := q.clock()
	st.Reason, st.Detail, st.EndedAt, st.NotBefore = job.ReasonInvalidManifest, detail, now, time.Time{}
	st.History = []Transition{{At: now, To: st.Stage, Detail: "the sidecar was missing or unreadable: made anew"}}
	if err := q.commitMoveLocked(&st, job.Failed, Transition{At: now, Reason: job.ReasonInvalidManifest, Detail: detail}); err != nil {
		return State{}, err
	}
	return st, nil
}

// freeName is <stage>/<name>, or <name>.2, .3, ... when taken: kept files are
// never overwritten.
func (q *Queue) freeName(stage job.Stage, name string) (string, error) {
	base := filepath.Join(q.dir, string(stage), name)
	p := base
	for i := 2; ; i++ {
		ok, err := exists(p)
		if err != nil {
			return "", err
		}
		if !ok {
			return p, nil
		}
		p = fmt.Sprintf("%s.%d", base, i)
	}
}

// stageIDs lists the job ids whose manifests are in stage's folder.
func (q *Queue) stageIDs(stage job.Stage) ([]string, error) {
	ents, err := os.ReadDir(filepath.Join(q.dir, string(stage)))
	if err != nil {
		return nil, err
	}
	var ids []string
	for _, e := range ents {
		if id, ok := strings.CutSuffix(e.Name(), ".md"); ok && validID(id) && !e.IsDir() {
			ids = append(ids, id)
		}
	}
	return ids, nil
}

// stageStatesLocked loads (repairing as needed) every job in stage. Jobs that
// a repair moved elsewhere are left out; per-job errors are collected, not
// fatal, so one bad file cannot stop the queue.
func (q *Queue) stageStatesLocked(stage job.Stage) ([]State, error) {
	ids, err := q.stageIDs(stage)
	if err != nil {
		return nil, err
	}
	var states []State
	var errs []error
	for _, id := range ids {
		st, err := q.loadAtLocked(id, stage)
		if err != nil {
			if !errors.Is(err, ErrNotFound) {
				errs = append(errs, err)
			}
			continue
		}
		if st.Stage == stage {
			states = append(states, st)
		}
	}
	return states, errors.Join(errs...)
}

// reconcileAllLocked repairs every job in every stage, and removes what is
// provably garbage: temp files of interrupted writes, and readable sidecars
// whose job has its sidecar beside its manifest elsewhere or has no manifest
// at all. Unreadable files that belong to no job are left alone.
func (q *Queue) reconcileAllLocked() error {
	var errs []error
	for _, stage := range job.Stages {
		dir := filepath.Join(q.dir, string(stage))
		ents, err := os.ReadDir(dir)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		for _, e := range ents {
			name := e.Name()
			if e.IsDir() {
				continue
			}
			if strings.HasPrefix(name, ".") && strings.Contains(name, ".tmp") {
				// Only writers create temp files, and they hold the lock we hold.
				if err := os.Remove(filepath.Join(dir, name)); err != nil && !errors.Is(err, fs.ErrNotExist) {
					errs = append(errs, err)
				}
				continue
			}
			if id, ok := strings.CutSuffix(name, ".md"); ok && validID(id) {
				if _, err := q.loadLocked(id); err != nil && !errors.Is(err, ErrNotFound) {
					errs = append(errs, err)
				}
				continue
			}
			if id, ok := strings.CutSuffix(name, ".json"); ok && validID(id) {
				if err := q.dropStaleLocked(stage, id); err != nil {
					errs = append(errs, err)
				}
			}
		}
	}
	return errors.Join(errs...)
}

// dropStaleLocked removes stage/<id>.json when it is provably superseded.
func (q *Queue) dropStaleLocked(stage job.Stage, id string) error {
	if ok, err := exists(q.md(stage, id)); err != nil || ok {
		return err // beside its manifest: not stale
	}
	path := q.sidecar(stage, id)
	if _, err := q.readSidecarFile(path, id, true); err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil
		}
		var ce *corruptError
		if errors.As(err, &ce) {
			return nil // unreadable and nobody's: keep it for a person to look at
		}
		return err
	}
	if _, ok, err := q.locate(id); err != nil {
		return err
	} else if ok {
		// Make sure the job's own sidecar exists (adopting this one if it is
		// the only copy) before removing anything.
		if _, err := q.loadLocked(id); err != nil {
			return err
		}
	}
	// The repair may have used this file, or put the manifest beside it.
	if ok, err := exists(path); err != nil || !ok {
		return err
	}
	if ok, err := exists(q.md(stage, id)); err != nil || ok {
		return err
	}
	q.cache.drop(path)
	if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	return nil
}
