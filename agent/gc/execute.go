package gc

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/aqfleet/aq/agent/gc/plan"
	"github.com/aqfleet/aq/worktree"
)

// Execute carries out plan, repository by repository: worktrees first (so
// that the job branches they had checked out can go in the same run), then
// local refs, then origin's. Every deletion re-checks what it depends on at
// that moment (see the package doc); what changed since the plan is kept,
// not an error.
func (g *GC) Execute(ctx context.Context, snap *Snapshot, decided plan.Decisions) *Report {
	rep := &Report{Errors: []string{}, Warnings: snap.Warnings}
	byRepo := map[string][]int{}
	var order []string
	actions := make([]Action, len(decided.Items))
	var sandboxes []int
	for i, d := range decided.Items {
		actions[i] = Action{Decision: d, Result: Kept}
		if d.Kind == plan.KindSandbox {
			sandboxes = append(sandboxes, i)
			continue
		}
		if _, ok := byRepo[d.Repo]; !ok {
			order = append(order, d.Repo)
		}
		byRepo[d.Repo] = append(byRepo[d.Repo], i)
	}
	for _, name := range order {
		ex := &repoExec{g: g, info: snap.repos[name], actions: actions, idx: byRepo[name], rep: rep}
		ex.run(ctx)
	}
	g.removeSandboxes(ctx, actions, sandboxes)
	g.removeStaleCgroups(ctx, rep)
	for _, a := range actions {
		switch a.Result {
		case Deleted:
			rep.Deleted.add(a.Decision)
		case Failed:
			rep.Kept.add(a.Decision)
			rep.Errors = append(rep.Errors, fmt.Sprintf("%s: %s", a.Subject(), a.Detail))
		default:
			rep.Kept.add(a.Decision)
		}
		if a.CheckpointSHA != "" {
			rep.Checkpointed++
		}
	}
	rep.Actions = actions
	return rep
}

type repoExec struct {
	g       *GC
	info    *repoInfo
	actions []Action
	idx     []int
	rep     *Report
}

func (ex *repoExec) deletes(keep func(plan.Decision) bool) []int {
	var out []int
	for _, i := range ex.idx {
		if d := ex.actions[i].Decision; d.Action == plan.Delete && keep(d) {
			out = append(out, i)
		}
	}
	return out
}

func (ex *repoExec) kept(i int, format string, args ...any) {
	ex.actions[i].Result, ex.actions[i].Detail = Kept, fmt.Sprintf(format, args...)
}

func (ex *repoExec) failed(i int, err error) {
	ex.actions[i].Result, ex.actions[i].Detail = Failed, err.Error()
}

func (ex *repoExec) deleted(i int) {
	a := &ex.actions[i]
	a.Result = Deleted
	ex.g.log().Info("gc: deleted", "repo", a.Repo, "what", a.Label(), "reason", a.Reason)
}

func (ex *repoExec) run(ctx context.Context) {
	if ex.info == nil || !ex.info.exists {
		for _, i := range ex.deletes(func(plan.Decision) bool { return true }) {
			ex.kept(i, "the repository is gone")
		}
		return
	}
	wts := ex.deletes(func(d plan.Decision) bool {
		return d.Kind == plan.KindWorktree || d.Kind == plan.KindPooled
	})
	if len(wts) > 0 {
		// Holding the repo lock, no job can start in this repository while
		// its worktrees go (a runner waits for it, as for any job).
		lock, ok, err := worktree.TryLockRepo(ex.g.Cfg.LocksDir, ex.info.name)
		switch {
		case err != nil:
			for _, i := range wts {
				ex.failed(i, fmt.Errorf("cannot take the repo lock: %w", err))
			}
		case !ok:
			for _, i := range wts {
				ex.kept(i, "a job started in %s since the plan (its repo lock is held)", ex.info.name)
			}
		default:
			defer lock.Unlock()
			ex.removeWorktrees(ctx, wts)
		}
	}
	ex.deleteLocalRefs(ctx)
	ex.deleteRemoteRefs(ctx)
}

// removeWorktrees removes the planned worktrees; the caller holds the repo
// lock.
func (ex *repoExec) removeWorktrees(ctx context.Context, idx []int) {
	g, gt, dir := ex.g, ex.g.Git, ex.info.dir
	var missing []int
	var now map[string]worktree.Entry // the worktrees as they are now, for pooled ones
	for _, i := range idx {
		if ctx.Err() != nil {
			ex.kept(i, "gc was stopped")
			continue
		}
		a := &ex.actions[i]
		if a.Kind == plan.KindPooled {
			if now == nil {
				now = map[string]worktree.Entry{}
				entries, err := worktree.List(ctx, gt, dir)
				if err != nil {
					ex.failed(i, err)
					continue
				}
				for _, e := range entries {
					now[canon(e.Path)] = e
				}
			}
			if ex.removePooled(ctx, i, now) {
				missing = append(missing, i)
			}
			continue
		}
		if held, err := worktree.Held(g.Cfg.LocksDir, worktree.JobLockName(a.Job)); err != nil || held {
			ex.kept(i, "job %s started since the plan", a.Job)
			continue
		}
		if a.Rule == plan.RuleMissing {
			if _, err := os.Lstat(a.Name); err == nil {
				ex.kept(i, "its directory is back")
				continue
			}
			if a.Checkpoint && a.SHA != "" {
				// Its detached HEAD is in no branch: keep it reachable.
				ref := plan.WIPRefPrefix + a.Job
				before, _, _ := worktree.ResolveRef(ctx, gt, dir, ref)
				msg := fmt.Sprintf("aq checkpoint: %s (detached HEAD of a worktree deleted by hand, kept by aq gc)\n\naq-job: %s", a.Job, a.Job)
				sha, err := worktree.Preserve(ctx, gt, dir, ref, a.SHA, msg)
				if err != nil {
					ex.failed(i, fmt.Errorf("cannot keep its detached HEAD %.12s, so it stays registered: %w", a.SHA, err))
					continue
				}
				if sha != before {
					a.CheckpointSHA = sha
					a.Detail = fmt.Sprintf("detached HEAD kept in %s at %.12s", ref[len("refs/heads/"):], sha)
				}
			}
			missing = append(missing, i)
			continue
		}
		dirty, err := worktree.Dirty(ctx, gt, a.Name)
		if err != nil {
			ex.failed(i, fmt.Errorf("cannot tell whether it holds uncommitted work, so it is kept: %w", err))
			continue
		}
		if dirty || a.Checkpoint {
			ref := plan.WIPRefPrefix + a.Job
			before, _, _ := worktree.ResolveRef(ctx, gt, dir, ref)
			sha, err := g.checkpoint(ctx, a.Name, a.Job)
			if err != nil {
				ex.failed(i, fmt.Errorf("cannot checkpoint its work, so it is kept: %w", err))
				continue
			}
			if sha != "" && sha != before {
				a.CheckpointSHA = sha
				a.Detail = fmt.Sprintf("work saved to %s at %.12s", ref[len("refs/heads/"):], sha)
			}
		}
		if err := worktree.Remove(ctx, gt, dir, a.Name); err != nil {
			ex.failed(i, err)
			continue
		}
		ex.deleted(i)
	}
	// Then `git worktree prune`: it unregisters the worktrees whose
	// directories were deleted by hand.
	if err := worktree.Prune(ctx, gt, dir); err != nil {
		for _, i := range missing {
			ex.failed(i, err)
		}
	} else {
		for _, i := range missing {
			ex.deleted(i)
		}
	}
	_ = os.Remove(filepath.Join(g.Cfg.WorktreesDir, ex.info.name)) // only if now empty
	_ = os.Remove(worktree.PoolDir(g.Cfg.WorktreesDir, ex.info.name))
	_ = os.Remove(filepath.Join(g.Cfg.WorktreesDir, worktree.PoolDirName))
}

// removePooled removes one planned pooled worktree (the caller holds the
// repo lock), after checking it is still what the plan saw: registered at
// that path (a job may have taken it) and pooled at the same time (it may
// have gone out and come back). It reports true for a missing one, which
// `git worktree prune` unregisters.
func (ex *repoExec) removePooled(ctx context.Context, i int, now map[string]worktree.Entry) (prune bool) {
	g, a := ex.g, &ex.actions[i]
	pool := worktree.Pool{Dir: worktree.PoolDir(g.Cfg.WorktreesDir, ex.info.name)}
	if !strings.HasPrefix(canon(a.Name), canon(pool.Dir)+string(filepath.Separator)) {
		ex.failed(i, fmt.Errorf("%s is not in the pool folder %s", a.Name, pool.Dir))
		return false
	}
	e, registered := now[canon(a.Name)]
	planned := ex.info.worktrees[a.Name]
	switch {
	case a.Rule == plan.RuleMissing:
		if _, err := os.Lstat(a.Name); err == nil {
			ex.kept(i, "its directory is back")
			return false
		}
		return true
	case a.Rule == plan.RuleSetAside:
		if registered {
			ex.kept(i, "it is a worktree again")
			return false
		}
		if err := os.RemoveAll(a.Name); err != nil {
			ex.failed(i, fmt.Errorf("cannot delete it (delete it by hand): %w", err))
			return false
		}
		ex.deleted(i)
		return false
	case !registered || e.Prunable:
		ex.kept(i, "a job took it since the plan")
		return false
	}
	if fi, err := os.Lstat(a.Name); err != nil || !fi.ModTime().Equal(planned.PooledAt) {
		ex.kept(i, "a job used it since the plan")
		return false
	}
	if err := pool.Discard(ctx, g.Git, ex.info.dir, a.Name); err != nil {
		ex.failed(i, err)
		return false
	}
	ex.deleted(i)
	return false
}

// checkpoint saves a worktree's work to aq/wip/<job>. A checkpoint that
// left files out is an error: removing the worktree would lose them.
func (g *GC) checkpoint(ctx context.Context, path, id string) (string, error) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Minute)
	defer cancel()
	msg := fmt.Sprintf("aq checkpoint: %s (saved by aq gc before removing its worktree)\n\naq-job: %s", id, id)
	sha, err := worktree.Checkpoint(ctx, g.Git, path, plan.WIPRefPrefix+id, msg)
	var partial *worktree.PartialError
	if errors.As(err, &partial) {
		return "", fmt.Errorf("checkpoint %s is missing some files: %w", partial.SHA, partial.Err)
	}
	return sha, err
}

func (ex *repoExec) deleteLocalRefs(ctx context.Context) {
	idx := ex.deletes(func(d plan.Decision) bool {
		return d.Kind != plan.KindWorktree && d.Kind != plan.KindPooled && d.Where == plan.WhereLocal
	})
	ex.deleteRefs(ctx, idx, func(refs []worktree.Ref) ([]worktree.RefResult, error) {
		return worktree.DeleteRefs(ctx, ex.g.Git, ex.info.dir, refs)
	}, "")
}

func (ex *repoExec) deleteRemoteRefs(ctx context.Context) {
	idx := ex.deletes(func(d plan.Decision) bool { return d.Where == plan.WhereOrigin })
	if len(idx) > 0 && !ex.info.remoteOK {
		for _, i := range idx {
			ex.kept(i, "%s could not be read", ex.g.remote())
		}
		return
	}
	ex.deleteRefs(ctx, idx, func(refs []worktree.Ref) ([]worktree.RefResult, error) {
		return worktree.DeleteRemoteRefs(ctx, ex.g.Git, ex.info.dir, ex.g.remote(), refs)
	}, ex.g.remote()+" ")
}

func (ex *repoExec) deleteRefs(ctx context.Context, idx []int, del func([]worktree.Ref) ([]worktree.RefResult, error), where string) {
	var refs []worktree.Ref
	var todo []int
	for _, i := range idx {
		a := ex.actions[i]
		if held, err := worktree.Held(ex.g.Cfg.LocksDir, worktree.JobLockName(a.Job)); err != nil || held {
			ex.kept(i, "job %s started since the plan", a.Job)
			continue
		}
		refs = append(refs, worktree.Ref{Name: a.Name, SHA: a.SHA})
		todo = append(todo, i)
	}
	if len(refs) == 0 {
		return
	}
	results, err := del(refs)
	if err != nil {
		for _, i := range todo {
			ex.failed(i, err)
		}
		return
	}
	for k, res := range results {
		i := todo[k]
		switch res.Outcome {
		case worktree.RefDeleted:
			ex.deleted(i)
		case worktree.RefGone:
			ex.kept(i, "already gone from %s", orLocal(where))
		case worktree.RefChanged:
			ex.kept(i, "it moved to %.12s since the plan", res.Now)
		case worktree.RefCheckedOut:
			ex.kept(i, "it is checked out in a worktree")
		default:
			ex.failed(i, res.Err)
		}
	}
}

func orLocal(where string) string {
	if where == "" {
		return "this clone"
	}
	return where[:len(where)-1]
}

// removeStaleCgroups removes the job cgroups of aq processes that are gone
// (an aq killed -9 mid-run leaves its runs' cgroups behind).
func (g *GC) removeStaleCgroups(ctx context.Context, rep *Report) {
	if g.StaleCgroups == nil || ctx.Err() != nil {
		return
	}
	removed, err := g.StaleCgroups(g.alive)
	for _, d := range removed {
		g.log().Info("gc: deleted", "what", "job cgroup "+d, "reason", "the aq process that made it is gone")
	}
	rep.Deleted.Cgroups += len(removed)
	if err != nil {
		rep.Errors = append(rep.Errors, "job cgroups: "+err.Error())
	}
}
