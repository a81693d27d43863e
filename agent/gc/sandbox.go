package gc

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/aqfleet/aq/agent/gc/plan"
	"github.com/aqfleet/aq/internal/sandbox"
	"github.com/aqfleet/aq/job"
	"github.com/aqfleet/aq/worktree"
)

// The jobs' sandbox directories ($AQ_HOME/sandbox/<id>, docs/sandbox.md):
// a run removes its own at its end, so one left behind is a crash's (aq
// killed -9, the host lost) — with copies of the engine's login in it, a
// secret on disk. gc removes it once nothing will use it: its job not in
// flight and not waiting for its recovery (plan.planSandboxes), the job's
// lock held by gc while it goes, so no run of the job starts meanwhile.

// gatherSandboxes lists the directories under Cfg.SandboxDir and whether a
// live process holds each one's job. A directory that is not one (a file,
// a symlink) is aq's neither: left out.
func (g *GC) gatherSandboxes() ([]plan.SandboxState, error) {
	if g.Cfg.SandboxDir == "" {
		return nil, nil
	}
	ents, err := os.ReadDir(g.Cfg.SandboxDir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", g.Cfg.SandboxDir, err)
	}
	var out []plan.SandboxState
	for _, e := range ents {
		if !e.IsDir() {
			continue
		}
		s := plan.SandboxState{Path: filepath.Join(g.Cfg.SandboxDir, e.Name()), Job: e.Name()}
		if !job.ValidID(e.Name()) {
			out = append(out, s) // the plan keeps it: not a job id
			continue
		}
		if s.Held, err = g.jobLocked(e.Name()); err != nil {
			return nil, err
		}
		out = append(out, s)
	}
	return out, nil
}

// removeSandboxes removes the planned sandbox directories, each while gc
// holds its job's lock (a job that started since the plan keeps it).
func (g *GC) removeSandboxes(ctx context.Context, actions []Action, idx []int) {
	for _, i := range idx {
		a := &actions[i]
		if a.Action != plan.Delete {
			continue
		}
		if ctx.Err() != nil {
			a.Result, a.Detail = Kept, "gc was stopped"
			continue
		}
		lock, ok, err := worktree.TryLockJob(g.Cfg.LocksDir, a.Job)
		switch {
		case err != nil:
			a.Result, a.Detail = Failed, "cannot take the job's lock: "+err.Error()
			continue
		case !ok:
			a.Result, a.Detail = Kept, fmt.Sprintf("job %s started since the plan", a.Job)
			continue
		}
		if fi, err := os.Lstat(a.Name); err != nil || !fi.IsDir() {
			a.Result, a.Detail = Kept, "it is gone since the plan"
		} else if err := sandbox.RemoveJobDir(a.Name); err != nil {
			a.Result, a.Detail = Failed, err.Error()
		} else {
			a.Result = Deleted
			g.log().Info("gc: deleted", "what", a.Label(), "reason", a.Reason)
		}
		lock.Unlock()
	}
}
