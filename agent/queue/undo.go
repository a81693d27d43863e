package queue

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"

	"github.com/aqfleet/aq/internal/aqerr"
	"github.com/aqfleet/aq/internal/atomicfile"
	"github.com/aqfleet/aq/job"
)

// Undoing a mistake (`aq submit --replace`, `aq job rm`): a job that is not
// running can be given a new manifest, keeping its history, or removed.
// Neither touches git: a removed or replaced job's worktree, checkpoint and
// branches are left to aq gc's rules, which never delete unmerged work
// (docs/gc.md).

// ReplaceFrom are the stages a job may be replaced from: it does not run and
// its work is not done. A job in review, testing or shipped has a result;
// one in building has a process.
var ReplaceFrom = []job.Stage{job.Inbox, job.Blocked, job.Failed, job.DeadLetter}

// ErrRunning matches (errors.Is) the refusal to replace or remove a job in
// building.
var ErrRunning = errors.New("the job is running")

// Replace gives the job j.ID a new manifest (raw, stored byte for byte) and
// the fields that come from it, and puts it back to run: into the inbox, or
// blocked while its deps have not shipped. Its history, attempts, times,
// insights, branch and PR are kept, and a transition records the
// replacement; its reason, backoff and park are cleared. The checkpoint is
// kept when the repository is the same (the next run resumes from it, as
// after a requeue), dropped when the manifest names another repository.
// A job in building is refused (ErrRunning), as is one in review, testing or
// shipped (*StageError), an id no job has (ErrNotFound), and an
// idempotencyKey another job has (*DuplicateError): all usage errors, and
// nothing is changed. It returns the new state and the stage it came from.
func (q *Queue) Replace(j *job.Job, raw []byte) (State, job.Stage, error) {
	if err := q.checkNew(j, raw); err != nil {
		return State{}, "", err
	}
	var (
		st   State
		from job.Stage
	)
	err := q.locked(func() error {
		old, err := q.loadLocked(j.ID)
		if err != nil {
			return err
		}
		from = old.Stage
		if err := refuseBusy(old, "replace"); err != nil {
			return err
		}
		if !slices.Contains(ReplaceFrom, old.Stage) {
			se := &StageError{ID: j.ID, Op: "replace", Stage: old.Stage, Want: ReplaceFrom}
			fix := fmt.Sprintf("its work is done: `aq job rm %s` first, or submit the new manifest under another id", j.ID)
			if old.Stage != job.Shipped {
				fix = fmt.Sprintf("its work waits at the ship gate: `aq job reject %s` first, or submit the new manifest under another id", j.ID)
			}
			return aqerr.Wrap(aqerr.Usage, se, se.Error(), fix)
		}
		if j.IdempotencyKey != "" {
			if err := q.checkKeyLocked(j, j.ID); err != nil {
				return err
			}
		}
		now := q.clock()
		st = newState(j, old.Stage, old.CreatedAt, now)
		st.Attempts, st.Parks, st.History = old.Attempts, old.Parks, old.History
		st.StartedAt, st.EndedAt, st.Host, st.PID = old.StartedAt, old.EndedAt, old.Host, old.PID
		st.Insights, st.Branch, st.PR = old.Insights, old.Branch, old.PR
		if old.Repo == j.Repo {
			st.Checkpoint = old.Checkpoint
		}
		to := job.Inbox
		if !q.depsShipped(j.Deps, st.DepsMode) {
			to = job.Blocked
		}
		detail := "replaced by a new manifest"
		if j.Source != "" {
			detail += " (" + filepath.Base(j.Source) + ")"
		}
		// The manifest first, in the job's current stage: it is the job's
		// truth (a crash before the sidecar follows leaves the new manifest
		// with the old fields, which a second --replace puts right).
		if err := q.writeManifestLocked(old.Stage, j.ID, raw); err != nil {
			return err
		}
		tr := Transition{At: now, Detail: detail}
		if to == old.Stage {
			tr.From, tr.To = old.Stage, to
			st.History = append(slices.Clone(st.History), tr)
		}
		return q.commitMoveLocked(&st, to, tr)
	})
	if err != nil {
		return State{}, from, err
	}
	return st.clone(), from, nil
}

// Remove deletes the job id from the queue: its manifest, then its sidecar.
// A job in building is refused (ErrRunning). Nothing else is touched: its
// logs stay under $AQ_HOME/logs/<id>, its worktree and refs go to aq gc's
// rules. It returns the job's state as it was, and the ids of the jobs that
// depend on it and have not shipped (they now wait for a job that is not
// there).
func (q *Queue) Remove(id string) (State, []string, error) {
	if err := checkID(id); err != nil {
		return State{}, nil, err
	}
	var (
		st         State
		dependents []string
	)
	err := q.locked(func() error {
		var err error
		st, err = q.loadLocked(id)
		if err != nil {
			return err
		}
		if err := refuseBusy(st, "remove"); err != nil {
			return err
		}
		md, side := q.md(st.Stage, id), q.sidecar(st.Stage, id)
		// The manifest first: the job exists exactly when it does. A sidecar
		// left by a crash in between has no job, and the next repair removes it.
		if err := os.Remove(md); err != nil {
			return fmt.Errorf("job %s: remove the manifest: %w", id, err)
		}
		q.cache.drop(side)
		if err := os.Remove(side); err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("job %s: remove the sidecar: %w", id, err)
		}
		atomicfile.SyncDir(filepath.Dir(md))
		for _, stage := range []job.Stage{job.Inbox, job.Blocked} {
			others, err := q.stageStatesLocked(stage)
			if err != nil {
				continue // only a note: the removal is done
			}
			for _, o := range others {
				if slices.Contains(o.Deps, id) {
					dependents = append(dependents, o.ID)
				}
			}
		}
		return nil
	})
	if err != nil {
		return State{}, nil, err
	}
	slices.Sort(dependents)
	return st.clone(), dependents, nil
}

// refuseBusy refuses to op a job that runs.
func refuseBusy(st State, op string) error {
	if st.Stage != job.Building {
		return nil
	}
	who := ""
	if st.Host != "" {
		who = fmt.Sprintf(" on %s (pid %d)", st.Host, st.PID)
	}
	return aqerr.Wrap(aqerr.Usage, ErrRunning, fmt.Sprintf("cannot %s job %s: it is running%s", op, st.ID, who),
		"wait for it to end (`aq job logs -f "+st.ID+"`), or stop the aq running it; nothing was changed")
}

// writeManifestLocked replaces the manifest of a job in stage with raw:
// a temp file renamed over it, then the folder synced.
func (q *Queue) writeManifestLocked(stage job.Stage, id string, raw []byte) error {
	md := q.md(stage, id)
	tmp, err := writeTemp(md, raw)
	if err != nil {
		return fmt.Errorf("job %s: write manifest: %w", id, err)
	}
	if err := os.Rename(tmp, md); err != nil {
		os.Remove(tmp)
		return fmt.Errorf("job %s: write manifest: %w", id, err)
	}
	atomicfile.SyncDir(filepath.Dir(md))
	return nil
}

// checkNew is Submit's and Replace's check of a job before the lock.
func (q *Queue) checkNew(j *job.Job, raw []byte) error {
	if j == nil {
		return aqerr.Usagef("", "no job to submit")
	}
	if err := checkID(j.ID); err != nil {
		return err
	}
	for _, d := range j.Deps {
		if err := checkID(d); err != nil {
			return aqerr.Usagef("fix the job's deps", "job %s: dep %q is not a valid job id", j.ID, d)
		}
		if d == j.ID {
			return aqerr.Usagef("remove it from deps", "job %s depends on itself", j.ID)
		}
	}
	switch j.DepsMode {
	case "", "all", "any":
	default:
		return aqerr.Usagef("use all or any", "job %s: depsMode %q is not all or any", j.ID, j.DepsMode)
	}
	if len(raw) == 0 {
		return aqerr.Usagef("submit the manifest file's contents", "job %s: the manifest is empty", j.ID)
	}
	return nil
}
