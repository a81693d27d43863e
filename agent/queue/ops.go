package queue

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/aqfleet/aq/internal/aqerr"
	"github.com/aqfleet/aq/internal/atomicfile"
	"github.com/aqfleet/aq/job"
)

// Submit enqueues j with raw as its manifest (stored byte for byte): into
// blocked when its deps have not shipped (depsMode all: every dep; any: at
// least one), else into inbox. It refuses, writing nothing, an invalid id or
// dep, an id that any job in the queue has (*ExistsError), and an
// idempotencyKey that any job has (*DuplicateError). Errors are usage errors.
func (q *Queue) Submit(j *job.Job, raw []byte) (State, error) {
	if err := q.checkNew(j, raw); err != nil {
		return State{}, err
	}

	var st State
	err := q.locked(func() error {
		if stage, ok, err := q.locate(j.ID); err != nil {
			return err
		} else if ok {
			ee := &ExistsError{ID: j.ID, Stage: stage}
			return aqerr.Wrap(aqerr.Usage, ee, ee.Error(),
				fmt.Sprintf("`aq submit --replace` gives it this manifest, `aq job requeue %s` runs it again as it is; or choose another id", j.ID))
		}
		if j.IdempotencyKey != "" {
			if err := q.checkKeyLocked(j, ""); err != nil {
				return err
			}
		}
		now := q.clock()
		stage, detail := job.Inbox, "submitted"
		if !q.depsShipped(j.Deps, j.DepsMode) {
			stage, detail = job.Blocked, "submitted; waiting for deps: "+strings.Join(j.Deps, ", ")
		}
		st = newState(j, stage, now, now)
		st.History = []Transition{{At: now, To: stage, Detail: detail}}
		return q.writeNewLocked(&st, raw)
	})
	if err != nil {
		return State{}, err
	}
	return st.clone(), nil
}

// writeNewLocked writes a submitted job: both files durably to temp files,
// then the sidecar into place, then the manifest, then one directory sync.
// The job exists only once its manifest does; a sidecar left alone by a crash
// in between is not a job, and the next full repair removes it.
func (q *Queue) writeNewLocked(st *State, raw []byte) error {
	data, err := json.MarshalIndent(st, "", "  ")
	if err != nil {
		return fmt.Errorf("job %s: encode sidecar: %w", st.ID, err)
	}
	side, md := q.sidecar(st.Stage, st.ID), q.md(st.Stage, st.ID)
	tmpSide, err := writeTemp(side, append(data, '\n'))
	if err != nil {
		return fmt.Errorf("job %s: write sidecar: %w", st.ID, err)
	}
	tmpMD, err := writeTemp(md, raw)
	if err != nil {
		os.Remove(tmpSide)
		return fmt.Errorf("job %s: write manifest: %w", st.ID, err)
	}
	q.cache.drop(side)
	if err := os.Rename(tmpSide, side); err != nil {
		os.Remove(tmpSide)
		os.Remove(tmpMD)
		return fmt.Errorf("job %s: write sidecar: %w", st.ID, err)
	}
	if err := os.Rename(tmpMD, md); err != nil {
		os.Remove(tmpMD)
		os.Remove(side)
		return fmt.Errorf("job %s: write manifest: %w", st.ID, err)
	}
	atomicfile.SyncDir(filepath.Dir(md))
	return nil
}

// checkKeyLocked refuses j when a job in any stage but except has its
// idempotency key. It reads every sidecar (repairing as it goes); sidecars
// are cached, so a long-lived process pays about one stat per job.
func (q *Queue) checkKeyLocked(j *job.Job, except string) error {
	// Collect every id first: a repair may move a job to a stage already
	// scanned.
	var ids []string
	for _, stage := range job.Stages {
		got, err := q.stageIDs(stage)
		if err != nil {
			return err
		}
		ids = append(ids, got...)
	}
	seen := map[string]bool{}
	for _, id := range ids {
		if seen[id] || id == except {
			continue
		}
		seen[id] = true
		s, err := q.loadLocked(id)
		if errors.Is(err, ErrNotFound) {
			continue
		}
		if err != nil {
			// A job we cannot read might hold the key: refuse rather than duplicate.
			return fmt.Errorf("job %s: cannot check idempotencyKey %q: %w", j.ID, j.IdempotencyKey, err)
		}
		if s.IdempotencyKey == j.IdempotencyKey {
			de := &DuplicateError{ID: j.ID, Key: j.IdempotencyKey, ExistingID: s.ID, Stage: s.Stage}
			return aqerr.Wrap(aqerr.Usage, de, de.Error(),
				fmt.Sprintf("the work is already queued as %s; see `aq job show %s`", s.ID, s.ID))
		}
	}
	return nil
}

// depsShipped reports whether deps allow a job to run: all shipped (mode all
// or empty) or at least one shipped (any). No deps: true. It reads only the
// shipped folder, so it is safe with or without the lock.
func (q *Queue) depsShipped(deps []string, mode string) bool {
	if len(deps) == 0 {
		return true
	}
	shipped := 0
	for _, d := range deps {
		if !validID(d) {
			continue
		}
		if ok, _ := exists(q.md(job.Shipped, d)); ok {
			shipped++
		}
	}
	if mode == "any" {
		return shipped > 0
	}
	return shipped == len(deps)
}

// Next takes the best runnable job and moves it to building. First it
// promotes blocked jobs whose deps have shipped. Then, among inbox jobs whose
// NotBefore has passed, best first (higher priority, then oldest, then id),
// it offers each to accept (nil accepts all; the caller checks capabilities
// and engine) and takes the first accepted: Attempts+1, StartedAt now, Host
// and PID set. With nothing runnable it returns ErrNoJob. accept runs under
// the queue lock: it must be quick and must not call the Queue.
func (q *Queue) Next(accept func(State) bool) (*Entry, error) {
	var out *Entry
	err := q.locked(func() error {
		now := q.clock()
		promoteErr := q.promoteLocked(now)
		cands, loadErr := q.stageStatesLocked(job.Inbox)
		slices.SortFunc(cands, compare)
		for _, st := range cands {
			if st.NotBefore.After(now) {
				continue
			}
			if !q.depsShipped(st.Deps, st.DepsMode) {
				// Requeued or dropped in by hand before its deps shipped: wait.
				_ = q.commitMoveLocked(&st, job.Blocked, Transition{At: now, Detail: "deps have not shipped"})
				continue
			}
			if accept != nil && !accept(st.clone()) {
				continue
			}
			// How the last run ended, for this one to be told (a job
			// requeued by an operator has no reason: nothing to tell).
			st.Previous = job.PreviousOf(st.Attempts, st.Reason, st.Detail, st.Insights)
			st.Attempts++
			st.StartedAt, st.EndedAt, st.NotBefore, st.Parked = now, time.Time{}, time.Time{}, ""
			st.Host, st.PID = q.host, q.pid
			st.Reason, st.Detail = "", ""
			tr := Transition{At: now, Detail: fmt.Sprintf("attempt %d on %s (pid %d)", st.Attempts, q.host, q.pid)}
			if err := q.commitMoveLocked(&st, job.Building, tr); err != nil {
				return err
			}
			out = &Entry{State: st.clone(), ManifestPath: q.md(job.Building, st.ID)}
			return nil
		}
		if err := errors.Join(promoteErr, loadErr); err != nil {
			return fmt.Errorf("local queue: no job taken: %w", err)
		}
		return ErrNoJob
	})
	return out, err
}

// promoteLocked moves blocked jobs whose deps have shipped to the inbox.
func (q *Queue) promoteLocked(now time.Time) error {
	blocked, err := q.stageStatesLocked(job.Blocked)
	var errs []error
	for _, st := range blocked {
		if !q.depsShipped(st.Deps, st.DepsMode) {
			continue
		}
		tr := Transition{At: now, Detail: "deps shipped: " + strings.Join(st.Deps, ", ")}
		if err := q.commitMoveLocked(&st, job.Inbox, tr); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(append(errs, err)...)
}

// Update changes the job's sidecar in place (Checkpoint, Insights, Branch, ...)
// under the lock. fn may not change the id or the stage: use Move.
func (q *Queue) Update(id string, fn func(*State)) error {
	if err := checkID(id); err != nil {
		return err
	}
	return q.locked(func() error {
		st, err := q.loadLocked(id)
		if err != nil {
			return err
		}
		if err := apply(&st, fn); err != nil {
			return err
		}
		st.UpdatedAt = q.clock()
		return q.writeSidecarLocked(&st)
	})
}

// apply runs fn on st and refuses changes to what the queue owns.
func apply(st *State, fn func(*State)) error {
	if fn == nil {
		return nil
	}
	id, stage := st.ID, st.Stage
	fn(st)
	if st.ID != id || st.Stage != stage {
		err := fmt.Errorf("job %s: a queue callback may not change the job's id or stage (use Move)", id)
		st.ID, st.Stage = id, stage
		return err
	}
	return nil
}

// Move moves the job to stage to (applying fn first) and records the
// transition: the operator's tool (`aq job ship|reject`). Moving into building
// is refused: only Next starts a job. Moving to the job's current stage just
// applies fn.
func (q *Queue) Move(id string, to job.Stage, fn func(*State)) error {
	if err := checkID(id); err != nil {
		return err
	}
	if !knownStage(to) {
		return aqerr.Usagef("use one of inbox, blocked, review, testing, shipped, failed, dead_letter", "unknown stage %q", to)
	}
	return q.locked(func() error {
		st, err := q.loadLocked(id)
		if err != nil {
			return err
		}
		if to == job.Building && st.Stage != job.Building {
			return aqerr.Usagef("jobs start through `aq run`", "cannot move job %s into building", id)
		}
		if err := apply(&st, fn); err != nil {
			return err
		}
		now := q.clock()
		tr := Transition{At: now, Detail: "moved by an operator"}
		if to == job.Failed || to == job.DeadLetter {
			tr.Reason, tr.Detail = st.Reason, st.Detail
		}
		if err := q.commitMoveLocked(&st, to, tr); err != nil {
			return err
		}
		if to == job.Shipped {
			return q.promoteLocked(now)
		}
		return nil
	})
}

// runningLocked loads a job that this process is running, for Finish and Fail.
func (q *Queue) runningLocked(id, op string) (State, error) {
	st, err := q.loadLocked(id)
	if err != nil {
		return State{}, err
	}
	if st.Stage != job.Building {
		return State{}, &StageError{ID: id, Op: op, Stage: st.Stage, Want: []job.Stage{job.Building}}
	}
	if st.Host != q.host || st.PID != q.pid {
		return State{}, fmt.Errorf("%w: job %s is building on %s (pid %d), not on %s (pid %d)",
			ErrNotOwner, id, st.Host, st.PID, q.host, q.pid)
	}
	return st, nil
}

// Finish ends a successful run: building -> review (PR open), testing (verify
// passed) or shipped, with EndedAt now. Only the process that took the job may
// finish it; finishing twice is refused.
func (q *Queue) Finish(id string, to job.Stage, fn func(*State)) error {
	if err := checkID(id); err != nil {
		return err
	}
	if to != job.Review && to != job.Testing && to != job.Shipped {
		return fmt.Errorf("finish job %s: %q is not review, testing or shipped (failures go through Fail)", id, to)
	}
	return q.locked(func() error {
		st, err := q.runningLocked(id, "finish")
		if err != nil {
			return err
		}
		if err := apply(&st, fn); err != nil {
			return err
		}
		now := q.clock()
		st.EndedAt, st.NotBefore, st.Reason, st.Detail = now, time.Time{}, "", ""
		if err := q.commitMoveLocked(&st, to, Transition{At: now}); err != nil {
			return err
		}
		if to == job.Shipped {
			return q.promoteLocked(now)
		}
		return nil
	})
}

// Fail ends a failed run and applies the job's retry policy: a permanent
// reason goes to failed; a retryable failure (job.Retryable: infrastructure
// reasons get job.InfraRetries extra tries) goes to the inbox with NotBefore
// now+job.Backoff; with retries exhausted, dead_letter. fn runs first (record
// Checkpoint, Insights); Reason, Detail and EndedAt are then set. It returns
// the stage the job went to.
func (q *Queue) Fail(id string, reason job.Reason, detail string, fn func(*State)) (job.Stage, error) {
	if err := checkID(id); err != nil {
		return "", err
	}
	if !slices.Contains(job.Reasons, reason) {
		return "", fmt.Errorf("fail job %s: unknown reason %q", id, reason)
	}
	if reason.Parks() {
		return "", fmt.Errorf("fail job %s: %s parks a job, it does not fail it (use Park)", id, reason)
	}
	var to job.Stage
	err := q.locked(func() error {
		st, err := q.runningLocked(id, "fail")
		if err != nil {
			return err
		}
		if err := apply(&st, fn); err != nil {
			return err
		}
		now := q.clock()
		st.Reason, st.Detail, st.EndedAt, st.NotBefore = reason, detail, now, time.Time{}
		switch {
		case reason.Permanent():
			to = job.Failed
		case job.Retryable(reason, st.Attempts, st.Retry):
			to = job.Inbox
			st.NotBefore = now.Add(job.Backoff(reason, st.Attempts, st.Retry))
		default:
			to = job.DeadLetter
		}
		return q.commitMoveLocked(&st, to, Transition{At: now, Reason: reason, Detail: detail})
	})
	return to, err
}

// Park ends a run that the engine's account stopped (a rate or usage
// limit, exhausted credit: reason.Parks()): building → inbox, runnable
// again at until, with Parked saying what it waits for (e.g. "claude usage
// limit") and Reason and Detail set. It is not a failed attempt: the
// Attempts that Next added is taken back, so the job's retries are not
// spent however often it parks (Parks counts that). fn runs first (record
// Checkpoint, Insights). Only the process that took the job may park it.
func (q *Queue) Park(id string, reason job.Reason, parked, detail string, until time.Time, fn func(*State)) error {
	if err := checkID(id); err != nil {
		return err
	}
	if !reason.Parks() {
		return fmt.Errorf("park job %s: %q does not park a job (failures go through Fail)", id, reason)
	}
	if until.IsZero() {
		return fmt.Errorf("park job %s: no time to park it until", id)
	}
	return q.locked(func() error {
		st, err := q.runningLocked(id, "park")
		if err != nil {
			return err
		}
		if err := apply(&st, fn); err != nil {
			return err
		}
		now := q.clock()
		if st.Attempts > 0 {
			st.Attempts--
		}
		st.Parks++
		st.Reason, st.Detail, st.Parked, st.EndedAt = reason, detail, parked, now
		st.NotBefore = until.UTC().Round(0)
		tr := Transition{At: now, Reason: reason, Detail: fmt.Sprintf("parked until %s: %s", st.NotBefore.Format(time.RFC3339), detail)}
		return q.commitMoveLocked(&st, job.Inbox, tr)
	})
}

// requeueFrom are the stages an operator may requeue from.
var requeueFrom = []job.Stage{job.Failed, job.DeadLetter, job.Review, job.Testing, job.Inbox}

// Requeue puts a job back to run (operator: `aq job requeue`): from failed,
// dead_letter, review or testing to the inbox (or blocked when its deps have
// not shipped), NotBefore and Reason cleared, Attempts kept (so a dead-lettered
// job gets one more run before its retry policy applies again). An inbox job
// waiting out a backoff becomes runnable now.
func (q *Queue) Requeue(id string) error {
	if err := checkID(id); err != nil {
		return err
	}
	return q.locked(func() error {
		st, err := q.loadLocked(id)
		if err != nil {
			return err
		}
		if !slices.Contains(requeueFrom, st.Stage) {
			se := &StageError{ID: id, Op: "requeue", Stage: st.Stage, Want: requeueFrom}
			return aqerr.Wrap(aqerr.Usage, se, se.Error(), "")
		}
		now := q.clock()
		to := job.Inbox
		if !q.depsShipped(st.Deps, st.DepsMode) {
			to = job.Blocked
		}
		st.NotBefore, st.Reason, st.Detail, st.Parked = time.Time{}, "", "", ""
		return q.commitMoveLocked(&st, to, Transition{At: now, Detail: "requeued by an operator"})
	})
}

// Orphan is what Recover's caller found of a job orphaned in building: the
// checkpoint it made of the job's worktree (empty: none), and, when the aq
// that ran it gave up on a step that did not return after a stop signal
// (internal/abandon), what it abandoned.
type Orphan struct {
	Checkpoint string
	Abandoned  string
}

// Recover returns jobs orphaned in building to the queue; `aq run` calls it
// on start. It first repairs every job (see the package comment). Then, for
// each building job that inFlight reports gone (the caller checks the job's
// per-job lock), it calls orphan (nil: none), records the checkpoint it
// made and fails the job interrupted when its aq abandoned it
// (internal/abandon), else crash; an orphan error is recorded in Detail and
// never stops recovery. The job goes to the inbox, runnable at once, its
// Attempts kept as
// Next incremented them (so it shows one attempt more than before the crashed
// run), or to dead_letter when job.Retryable says its tries are spent.
// Callbacks run under the queue lock. It returns the recovered ids, sorted,
// and any repair errors (which do not stop recovery).
func (q *Queue) Recover(inFlight func(State) bool, orphan func(State) (Orphan, error)) ([]string, error) {
	if inFlight == nil {
		return nil, errors.New("queue: Recover needs an in-flight check")
	}
	var ids []string
	err := q.locked(func() error {
		repairErr := q.reconcileAllLocked()
		building, err := q.stageStatesLocked(job.Building)
		if err != nil {
			return errors.Join(repairErr, err)
		}
		var errs []error
		for _, st := range building {
			if inFlight(st.clone()) {
				continue
			}
			reason := job.ReasonCrash
			detail := fmt.Sprintf("recovered: the process running it (%s, pid %d) is gone", st.Host, st.PID)
			if orphan != nil {
				o, err := orphan(st.clone())
				if o.Abandoned != "" {
					reason, detail = job.ReasonInterrupted, "recovered: "+o.Abandoned
				}
				switch {
				case err != nil:
					detail += fmt.Sprintf("; checkpoint failed: %v", err)
				case o.Checkpoint != "":
					st.Checkpoint = o.Checkpoint
					detail += "; checkpoint " + o.Checkpoint
				}
			}
			now := q.clock()
			to := job.DeadLetter
			if job.Retryable(reason, st.Attempts, st.Retry) {
				to = job.Inbox
			}
			st.Reason, st.Detail, st.EndedAt, st.NotBefore = reason, detail, now, time.Time{}
			if err := q.commitMoveLocked(&st, to, Transition{At: now, Reason: reason, Detail: detail}); err != nil {
				errs = append(errs, err)
				continue
			}
			ids = append(ids, st.ID)
		}
		return errors.Join(append(errs, repairErr)...)
	})
	slices.Sort(ids)
	return ids, err
}
