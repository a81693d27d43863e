package gc

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/aqfleet/aq/agent/gc/plan"
	"github.com/aqfleet/aq/job"
	"github.com/aqfleet/aq/worktree"
)

// Snapshot is what Gather found: the plan's input, and what Execute needs
// to act on it.
type Snapshot struct {
	State    plan.State
	Warnings []string
	repos    map[string]*repoInfo
}

type repoInfo struct {
	name      string
	dir       string
	exists    bool // a repository under AQ_REPO_BASE
	remoteOK  bool // the remote was listed: its refs may be deleted
	worktrees map[string]plan.WorktreeState
}

// aqRefs is the namespace gc collects; nothing outside it is ever listed.
const aqRefs = "refs/heads/aq/"

// errNoRepo: a candidate repository is not under AQ_REPO_BASE and left
// nothing behind.
var errNoRepo = errors.New("no such repository")

// Gather collects the plan's input. A repository that cannot be read is a
// warning (its candidates are left out, so nothing of it is deleted); only a
// failure to read aq's own records is an error.
func (g *GC) Gather(ctx context.Context) (*Snapshot, error) {
	snap := &Snapshot{repos: map[string]*repoInfo{}}
	jobs, err := g.gatherJobs()
	if err != nil {
		return nil, err
	}
	snap.State.Jobs = jobs
	if snap.State.Sandboxes, err = g.gatherSandboxes(); err != nil {
		return nil, err
	}

	names, err := g.candidateRepos(jobs)
	if err != nil {
		return nil, err
	}
	for _, name := range names {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		rs, info, warns, err := g.gatherRepo(ctx, name, jobs)
		snap.Warnings = append(snap.Warnings, warns...)
		if errors.Is(err, errNoRepo) {
			continue // a job's repository that was never cloned here: nothing to clean
		}
		if err != nil {
			if ctx.Err() != nil {
				return nil, ctx.Err()
			}
			snap.Warnings = append(snap.Warnings, fmt.Sprintf("%s: left alone: %v", name, err))
			continue
		}
		snap.State.Repos = append(snap.State.Repos, rs)
		snap.repos[name] = info
	}
	for _, w := range snap.Warnings {
		g.log().Warn("gc: " + w)
	}
	return snap, nil
}

// candidateRepos are the repositories directly under AQ_REPO_BASE that have
// an aq/ ref, a worktree directory under $AQ_HOME/worktrees/<repo> or a job
// aq knows of; plus worktree directories of repositories that are gone.
func (g *GC) candidateRepos(jobs map[string]plan.JobState) ([]string, error) {
	set := map[string]bool{}
	if ents, err := os.ReadDir(g.Cfg.WorktreesDir); err == nil {
		for _, e := range ents {
			if e.IsDir() {
				set[e.Name()] = true
			}
		}
	} else if !errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("read %s: %w", g.Cfg.WorktreesDir, err)
	}
	// Repositories with a pool (<worktrees>/.pool/<repo>).
	for _, p := range listDirs(filepath.Join(g.Cfg.WorktreesDir, worktree.PoolDirName)) {
		set[filepath.Base(p)] = true
	}
	for _, j := range jobs {
		if j.Repo != "" {
			set[j.Repo] = true
		}
	}
	if ents, err := os.ReadDir(g.Cfg.RepoBase); err == nil {
		for _, e := range ents {
			dir := filepath.Join(g.Cfg.RepoBase, e.Name())
			if set[e.Name()] || !e.IsDir() || !worktree.IsRepo(dir) {
				continue
			}
			if hasAQRefs(dir) {
				set[e.Name()] = true
			}
		}
	} else if !errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("read AQ_REPO_BASE %s: %w", g.Cfg.RepoBase, err)
	}
	names := make([]string, 0, len(set))
	for n := range set {
		if validName(n) {
			names = append(names, n)
		}
	}
	sort.Strings(names)
	return names, nil
}

// hasAQRefs looks for refs/heads/aq/ without running git: a loose ref
// directory, or a line in packed-refs. A false "yes" only costs one `git
// for-each-ref` later.
func hasAQRefs(dir string) bool {
	gitDir := filepath.Join(dir, ".git")
	if fi, err := os.Stat(gitDir); err != nil || !fi.IsDir() {
		return true // a bare repository, a gitfile or a reftable: let git tell
	}
	if _, err := os.Stat(filepath.Join(gitDir, "refs", "heads", "aq")); err == nil {
		return true
	}
	b, err := os.ReadFile(filepath.Join(gitDir, "packed-refs"))
	if err != nil {
		return false
	}
	return strings.Contains(string(b), " "+aqRefs)
}

func validName(n string) bool {
	return n != "" && n != "." && n != ".." && !strings.HasPrefix(n, ".") && !strings.ContainsAny(n, `/\`)
}

// gatherRepo collects one repository.
func (g *GC) gatherRepo(ctx context.Context, name string, jobs map[string]plan.JobState) (plan.RepoState, *repoInfo, []string, error) {
	dir := filepath.Join(g.Cfg.RepoBase, name)
	info := &repoInfo{name: name, dir: dir, worktrees: map[string]plan.WorktreeState{}}
	rs := plan.RepoState{Name: name}
	var warns []string
	wtRoot := filepath.Join(g.Cfg.WorktreesDir, name)
	poolDir := worktree.PoolDir(g.Cfg.WorktreesDir, name)

	if !worktree.IsRepo(dir) {
		// Its worktrees outlived it: report them, touch nothing.
		for _, p := range listDirs(wtRoot) {
			rs.Worktrees = append(rs.Worktrees, plan.WorktreeState{Path: p, Job: filepath.Base(p)})
		}
		for _, p := range listDirs(poolDir) {
			rs.Worktrees = append(rs.Worktrees, plan.WorktreeState{Path: p, Pooled: true})
		}
		if len(rs.Worktrees) == 0 {
			return rs, info, nil, errNoRepo
		}
		warns = append(warns, fmt.Sprintf("%s: worktrees under %s belong to no repository under AQ_REPO_BASE; left alone", name, wtRoot))
		return rs, info, warns, nil
	}
	info.exists = true
	gt := g.Git

	locked, err := worktree.Held(g.Cfg.LocksDir, worktree.RepoLockName(name))
	if err != nil {
		return rs, nil, nil, err
	}
	rs.Locked = locked

	refs, err := worktree.ListRefInfo(ctx, gt, dir, aqRefs)
	if err != nil {
		return rs, nil, nil, err
	}
	entries, err := worktree.List(ctx, gt, dir)
	if err != nil {
		return rs, nil, nil, err
	}

	// aq's worktrees: registered ones under wtRoot, and directories there
	// that git does not know.
	checkedOut := map[string]string{}
	root, poolRoot := canon(wtRoot), canon(poolDir)
	seen := map[string]bool{}
	for _, e := range entries {
		if e.Branch != "" {
			checkedOut["refs/heads/"+e.Branch] = e.Path
		}
		c := canon(e.Path)
		if filepath.Dir(c) == poolRoot && !e.Bare {
			seen[c] = true
			w := plan.WorktreeState{Path: e.Path, Pooled: true, Branch: e.Branch, HEAD: e.HEAD,
				Registered: true, Locked: e.Locked, Missing: e.Prunable}
			if fi, err := os.Lstat(e.Path); err == nil {
				w.PooledAt = fi.ModTime()
			} else if errors.Is(err, fs.ErrNotExist) {
				w.Missing = true
			}
			rs.Worktrees = append(rs.Worktrees, w)
			continue
		}
		if filepath.Dir(c) != root || e.Bare {
			continue
		}
		seen[c] = true
		w := plan.WorktreeState{Path: e.Path, Job: filepath.Base(c), Branch: e.Branch, HEAD: e.HEAD,
			Registered: true, Locked: e.Locked, Missing: e.Prunable}
		if _, err := os.Lstat(e.Path); errors.Is(err, fs.ErrNotExist) {
			w.Missing = true
		}
		j, known := jobs[w.Job]
		if !known && validName(w.Job) {
			// A job this host has no record of may still hold its lock (a
			// run of another aq): then it is in flight, whatever the plan
			// would think of an unknown job's worktree.
			if held, err := worktree.Held(g.Cfg.LocksDir, worktree.JobLockName(w.Job)); err != nil || held {
				j = plan.JobState{InFlight: true, Repo: name}
				jobs[w.Job] = j
			}
		}
		if !w.Missing && !w.Locked && !rs.Locked && !j.InFlight {
			if w.Dirty, err = worktree.Dirty(ctx, gt, e.Path); err != nil {
				return rs, nil, nil, fmt.Errorf("worktree %s: %w", e.Path, err)
			}
		}
		rs.Worktrees = append(rs.Worktrees, w)
	}
	for _, p := range listDirs(wtRoot) {
		if !seen[canon(p)] {
			rs.Worktrees = append(rs.Worktrees, plan.WorktreeState{Path: p, Job: filepath.Base(p)})
		}
	}
	// Folders in the pool git does not know: set aside by a failed discard,
	// or forgotten.
	for _, p := range listDirs(poolDir) {
		if !seen[canon(p)] {
			rs.Worktrees = append(rs.Worktrees, plan.WorktreeState{Path: p, Pooled: true,
				SetAside: strings.HasPrefix(filepath.Base(p), ".discard-")})
		}
	}
	// Their disk, only when there is a ceiling to hold (a walk of every
	// file).
	if g.Cfg.Policy.DiskMax > 0 {
		for i, w := range rs.Worktrees {
			if !w.Missing {
				rs.Worktrees[i].Bytes, _ = worktree.DiskUsage(w.Path)
			}
		}
	}
	for _, w := range rs.Worktrees {
		info.worktrees[w.Path] = w
	}

	// Bases: each job's own, else the repository's default branch.
	defBase := g.defaultBase(ctx, dir)
	baseOf := func(ref string) string {
		if _, id := plan.RefJob(ref); id != "" {
			if b := jobs[id].Base; b != "" {
				return b
			}
		}
		return defBase
	}

	// The remote: fetch the bases (merges happen there), list its aq/ refs.
	var remote []worktree.Ref
	remoteName := g.remote()
	if !g.Cfg.Offline && worktree.HasRemote(ctx, gt, dir, remoteName) {
		bases := map[string]bool{defBase: true}
		for _, r := range refs {
			bases[baseOf(r.Name)] = true
		}
		for _, b := range slices.Sorted(maps.Keys(bases)) {
			src := "refs/heads/" + b
			if err := worktree.Fetch(ctx, gt, dir, remoteName, "+"+src+":refs/remotes/"+remoteName+"/"+b); err != nil {
				if ctx.Err() != nil {
					return rs, nil, nil, ctx.Err()
				}
				g.log().Debug("gc: cannot fetch base", "repo", name, "base", b, "err", err)
			}
		}
		remote, err = worktree.ListRemoteRefs(ctx, gt, dir, remoteName, aqRefs+"*")
		if err != nil {
			if ctx.Err() != nil {
				return rs, nil, nil, ctx.Err()
			}
			warns = append(warns, fmt.Sprintf("%s: cannot list %s's aq/ refs, so none of them is deleted: %v", name, remoteName, err))
		} else {
			info.remoteOK = true
		}
	}

	facts, err := g.refFacts(ctx, dir, refs, remote, baseOf)
	if err != nil {
		return rs, nil, nil, err
	}
	for _, r := range refs {
		st := facts.state(r.Name, r.SHA, baseOf(r.Name))
		st.CheckedOut = checkedOut[r.Name]
		rs.Refs = append(rs.Refs, st)
	}
	for _, r := range remote {
		rs.Remote = append(rs.Remote, facts.state(r.Name, r.SHA, baseOf(r.Name)))
	}
	return rs, info, warns, nil
}

// defaultBase is the repository's default branch: origin's HEAD, else the
// main checkout's branch, else aq's default.
func (g *GC) defaultBase(ctx context.Context, dir string) string {
	if out, err := g.Git.Run(ctx, dir, "symbolic-ref", "-q", "--short", "refs/remotes/"+g.remote()+"/HEAD"); err == nil && out != "" {
		return strings.TrimPrefix(out, g.remote()+"/")
	}
	if out, err := g.Git.Run(ctx, dir, "symbolic-ref", "-q", "--short", "HEAD"); err == nil && out != "" && !strings.HasPrefix(out, "aq/") {
		return out
	}
	return job.DefaultBase
}

// facts are what git says about tips, by (sha, base).
type facts struct {
	present  map[string]bool // the commit is in this clone
	times    map[string]time.Time
	merged   map[[2]string]bool
	squashed map[[2]string]string
}

func (f *facts) state(name, sha, base string) plan.RefState {
	st := plan.RefState{Name: name, SHA: sha, Base: base}
	if !f.present[sha] {
		st.Absent = true
		return st
	}
	st.Time = f.times[sha]
	st.Merged = f.merged[[2]string{sha, base}]
	if !st.Merged {
		if kind, _ := plan.RefJob(name); kind == plan.KindJobBranch {
			st.Squashed = f.squashed[[2]string{sha, base}]
		}
	}
	return st
}

// refFacts asks git, in a fixed number of processes per base, which tips
// are merged into their base, which job branches are squash-merged, and
// each tip's committer time.
func (g *GC) refFacts(ctx context.Context, dir string, local []worktree.RefInfo, remote []worktree.Ref, baseOf func(string) string) (*facts, error) {
	gt := g.Git
	f := &facts{present: map[string]bool{}, times: map[string]time.Time{}, merged: map[[2]string]bool{}, squashed: map[[2]string]string{}}
	localSHA := map[string]bool{}
	for _, r := range local {
		f.present[r.SHA], f.times[r.SHA] = true, r.Time
		localSHA[r.SHA] = true
	}
	// Origin tips this clone may not have.
	var other []string
	seen := map[string]bool{}
	for _, r := range remote {
		if !localSHA[r.SHA] && !seen[r.SHA] {
			seen[r.SHA] = true
			other = append(other, r.SHA)
		}
	}
	if len(other) > 0 {
		times, err := worktree.CommitTimes(ctx, gt, dir, other)
		if err != nil {
			return nil, err
		}
		for sha, t := range times {
			f.present[sha], f.times[sha] = true, t
		}
	}

	// Group tips by base.
	type tip struct{ name, sha string }
	byBase := map[string][]tip{}
	for _, r := range local {
		byBase[baseOf(r.Name)] = append(byBase[baseOf(r.Name)], tip{r.Name, r.SHA})
	}
	for _, r := range remote {
		if f.present[r.SHA] && !localSHA[r.SHA] {
			byBase[baseOf(r.Name)] = append(byBase[baseOf(r.Name)], tip{r.Name, r.SHA})
		}
	}
	for _, base := range slices.Sorted(maps.Keys(byBase)) {
		tips := g.baseTips(ctx, dir, base)
		if len(tips) == 0 {
			continue // no such branch here: nothing is known to be merged into it
		}
		// Local refs: one for-each-ref --merged per tip.
		for _, t := range tips {
			merged, err := worktree.MergedInto(ctx, gt, dir, t, aqRefs)
			if err != nil {
				return nil, err
			}
			for _, r := range byBase[base] {
				if localSHA[r.sha] && merged[r.name] {
					f.merged[[2]string{r.sha, base}] = true
				}
			}
		}
		// Origin-only tips: one merge-base each (rare: a branch someone else
		// pushed to).
		for _, r := range byBase[base] {
			if localSHA[r.sha] || f.merged[[2]string{r.sha, base}] {
				continue
			}
			for _, t := range tips {
				ok, err := worktree.IsAncestor(ctx, gt, dir, r.sha, t)
				if err != nil {
					return nil, err
				}
				if ok {
					f.merged[[2]string{r.sha, base}] = true
					break
				}
			}
		}
		// Squash merges of job branches.
		var cands []string
		isCand := map[string]bool{}
		for _, r := range byBase[base] {
			kind, _ := plan.RefJob(r.name)
			if kind == plan.KindJobBranch && !f.merged[[2]string{r.sha, base}] && !isCand[r.sha] {
				isCand[r.sha] = true
				cands = append(cands, r.sha)
			}
		}
		found, err := worktree.SquashMerged(ctx, gt, dir, tips, cands, g.Squash)
		if err != nil {
			return nil, err
		}
		for sha, how := range found {
			f.squashed[[2]string{sha, base}] = how
		}
	}
	return f, nil
}

// baseTips is the commit base names: origin's copy (just fetched) when
// there is one — what is merged there is merged for everyone — else the
// local branch. (A list, for the day there are several.)
func (g *GC) baseTips(ctx context.Context, dir, base string) []string {
	for _, ref := range []string{"refs/remotes/" + g.remote() + "/" + base, "refs/heads/" + base} {
		if sha, ok, err := worktree.ResolveRef(ctx, g.Git, dir, ref); err == nil && ok {
			return []string{sha}
		}
	}
	return nil
}

// listDirs lists the directories in dir (none if it does not exist).
func listDirs(dir string) []string {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil
	}
	var out []string
	for _, e := range ents {
		if e.IsDir() {
			out = append(out, filepath.Join(dir, e.Name()))
		}
	}
	return out
}

// canon is p absolute with symlinks resolved as far as they exist, so that
// paths git reports and paths aq joined compare equal.
func canon(p string) string {
	abs, err := filepath.Abs(p)
	if err != nil {
		return p
	}
	if real, err := filepath.EvalSymlinks(abs); err == nil {
		return real
	}
	if real, err := filepath.EvalSymlinks(filepath.Dir(abs)); err == nil {
		return filepath.Join(real, filepath.Base(abs))
	}
	return abs
}
