//go:build linux

package chaos

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"

	"github.com/aqfleet/aq/agent/gc"
)

// GCResult is `aq gc` on one factory: its plan, its run, the dry run after
// (which must find nothing more to delete), and what changed on disk.
type GCResult struct {
	Factory string
	Plan    gc.Report // --dry-run --json before
	Run     gc.Report // --json
	After   gc.Report // --dry-run --json after
	RunExit int
	RunErr  string
	// Worktrees left under $AQ_HOME/worktrees/<repo>/<job> after gc, and
	// linked worktrees git still lists in the factory's clones.
	WorktreeDirs []string
	Linked       []string
	// Deleted are the refs gc deleted, in this factory's clones ("repo ref
	// sha"); LocalWIP the aq/wip refs left in them (repo → job → sha).
	Deleted  []DeletedRef
	LocalWIP map[string]map[string]string
	// Lost are commits reachable before gc and not after, per repository
	// ("where/repo" → shas), and the part of them that only the deleted
	// refs reached (attributed to each deleted ref).
	Lost map[string][]string
}

// DeletedRef is a ref that existed before gc and not after.
type DeletedRef struct {
	Where string `json:"where"` // fN (a factory's clone) or origin
	Repo  string `json:"repo"`
	Ref   string `json:"ref"`
	SHA   string `json:"sha"`
	// OnlyFrom are the commits that only this ref reached before gc
	// (now unreachable): what its deletion dropped.
	OnlyFrom []string `json:"onlyFrom,omitempty"`
	// InBase: the tip is an ancestor of origin's main.
	InBase bool `json:"inBase"`
}

// repoSnap is a repository's aq/ refs (its own, and its copies of origin's)
// and every commit reachable from any ref or HEAD.
type repoSnap struct {
	refs    map[string]string
	commits map[string]bool
}

func (r *harness) snap(dir string) (repoSnap, error) {
	s := repoSnap{refs: map[string]string{}, commits: map[string]bool{}}
	out, err := r.sb.git(dir, "for-each-ref", "--format=%(refname) %(objectname)", "refs/heads/aq/", "refs/remotes/origin/aq/")
	if err != nil {
		return s, err
	}
	for _, l := range nonEmptyLines(out) {
		ref, sha, _ := strings.Cut(l, " ")
		s.refs[ref] = sha
	}
	out, err = r.sb.git(dir, "rev-list", "--all")
	if err != nil {
		return s, err
	}
	for _, l := range nonEmptyLines(out) {
		s.commits[l] = true
	}
	return s, nil
}

// runGC runs aq gc on every factory (after they stopped), with snapshots of
// every clone and origin before and after.
func (r *harness) runGC(ctx context.Context) []GCResult {
	originsBefore := map[string]repoSnap{}
	for name, bare := range r.sb.origins {
		s, err := r.snap(bare)
		if err != nil {
			r.problem("snapshot of origin %s: %v", name, err)
		}
		originsBefore[name] = s
	}
	var out []GCResult
	for _, f := range r.facts {
		res := GCResult{Factory: f.id, Lost: map[string][]string{}, LocalWIP: map[string]map[string]string{}}
		before := map[string]repoSnap{}
		for name := range r.sb.origins {
			s, err := r.snap(filepath.Join(f.src, name))
			if err != nil {
				r.problem("snapshot of %s/%s: %v", f.id, name, err)
			}
			before[name] = s
		}
		var err error
		if res.Plan, _, err = r.aqGC(ctx, f, "--dry-run", "--json"); err != nil {
			r.problem("aq gc --dry-run on %s: %v", f.id, err)
		}
		var code int
		res.Run, code, err = r.aqGC(ctx, f, "--json")
		res.RunExit = code
		if err != nil {
			res.RunErr = err.Error()
		}
		for name := range r.sb.origins {
			dir := filepath.Join(f.src, name)
			after, err := r.snap(dir)
			if err != nil {
				r.problem("snapshot of %s/%s: %v", f.id, name, err)
				continue
			}
			res.Deleted = append(res.Deleted, r.deleted(f.id, name, dir, before[name], after)...)
			if lost := minus(before[name].commits, after.commits); len(lost) > 0 {
				res.Lost[f.id+"/"+name] = lost
			}
			for ref, sha := range after.refs {
				if id, ok := strings.CutPrefix(ref, "refs/heads/aq/wip/"); ok {
					if res.LocalWIP[name] == nil {
						res.LocalWIP[name] = map[string]string{}
					}
					res.LocalWIP[name][id] = sha
				}
			}
			if wl, err := r.sb.git(dir, "worktree", "list", "--porcelain"); err == nil {
				for _, l := range nonEmptyLines(wl) {
					if p, ok := strings.CutPrefix(l, "worktree "); ok && p != dir {
						res.Linked = append(res.Linked, f.id+": "+p)
					}
				}
			}
		}
		repos, _ := os.ReadDir(filepath.Join(f.home, "worktrees"))
		for _, rd := range repos {
			jobs, _ := os.ReadDir(filepath.Join(f.home, "worktrees", rd.Name()))
			for _, j := range jobs {
				res.WorktreeDirs = append(res.WorktreeDirs, filepath.Join(rd.Name(), j.Name()))
			}
		}
		out = append(out, res)
	}
	// Origins: what every gc together deleted there (attributed to the
	// first result, which holds the origins' part).
	if len(out) > 0 {
		for name, bare := range r.sb.origins {
			after, err := r.snap(bare)
			if err != nil {
				r.problem("snapshot of origin %s: %v", name, err)
				continue
			}
			out[0].Deleted = append(out[0].Deleted, r.deleted("origin", name, bare, originsBefore[name], after)...)
			if lost := minus(originsBefore[name].commits, after.commits); len(lost) > 0 {
				out[0].Lost["origin/"+name] = lost
			}
		}
	}
	// The dry run after every gc: nothing left that the policy would delete.
	for i, f := range r.facts {
		var err error
		if out[i].After, _, err = r.aqGC(ctx, f, "--dry-run", "--json"); err != nil {
			r.problem("aq gc --dry-run (after) on %s: %v", f.id, err)
		}
	}
	return out
}

// deleted lists the aq/ refs of before missing from after, with the commits
// only each of them reached.
func (r *harness) deleted(where, repo, dir string, before, after repoSnap) []DeletedRef {
	var out []DeletedRef
	for ref, sha := range before.refs {
		if _, ok := after.refs[ref]; ok {
			continue
		}
		d := DeletedRef{Where: where, Repo: repo, Ref: ref, SHA: sha}
		if o, err := r.sb.git(dir, "rev-list", sha, "--not", "--all"); err == nil {
			d.OnlyFrom = nonEmptyLines(o)
		}
		base := r.sb.origins[repo]
		if _, err := r.sb.git(base, "merge-base", "--is-ancestor", sha, "refs/heads/main"); err == nil {
			d.InBase = true
		}
		out = append(out, d)
	}
	sort.Slice(out, func(a, b int) bool { return out[a].Ref < out[b].Ref })
	return out
}

func minus(a, b map[string]bool) []string {
	var out []string
	for k := range a {
		if !b[k] {
			out = append(out, k)
		}
	}
	sort.Strings(out)
	return out
}

// aqGC runs aq gc on f with args and decodes its JSON.
func (r *harness) aqGC(ctx context.Context, f *factory, args ...string) (gc.Report, int, error) {
	cmd := exec.CommandContext(ctx, r.cfg.AQ, append([]string{"gc"}, args...)...)
	// The factories are stopped for good: their pools of warm worktrees
	// go too (pooling off), so that nothing is left to check.
	cmd.Env = append(append([]string(nil), f.env...), "CHAOS_PHASE=gc", "AQ_WORKTREE_POOL=0")
	cmd.Dir = f.src
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	code := cmd.ProcessState.ExitCode()
	var rep gc.Report
	if jerr := json.Unmarshal(out.Bytes(), &rep); jerr != nil {
		return rep, code, fmt.Errorf("exit %d, output not JSON (%v): %s %s", code, jerr, tail(out.String(), 300), tail(errb.String(), 300))
	}
	if err != nil {
		return rep, code, fmt.Errorf("exit %d: %s", code, tail(errb.String(), 500))
	}
	return rep, code, nil
}
