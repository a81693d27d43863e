package gc

import (
	"context"
	"fmt"
	"maps"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/aqfleet/aq/agent/gc/plan"
	"github.com/aqfleet/aq/agent/jobstate"
	"github.com/aqfleet/aq/internal/testenv"
	"github.com/aqfleet/aq/job"
	"github.com/aqfleet/aq/worktree"
)

// TestRandomHistoriesLoseNothing builds many random factories — jobs in
// every status, branches of one or several commits, merges, squash merges
// (some reverted or edited later), partial cherry-picks, WIP refs pushed or
// not, diverged on origin, dirty, detached, missing or locked worktrees,
// running jobs, held repo locks — runs gc on each, and proves with git
// rev-list that every commit that is no longer reachable from any ref (here
// or on origin) was only held by refs the policy allowed to go: WIP refs of
// shipped or long-failed jobs, and job branches whose change is in base
// (checked again here, independently). Uncommitted files of a removed
// worktree must be in its WIP ref. A second run must delete nothing.
func TestRandomHistoriesLoseNothing(t *testing.T) {
	testenv.Slow(t, "builds and collects many real worktrees")
	t.Parallel()
	iterations := 24
	if testing.Short() {
		// make unit's fast loop: seeds 1000 and 1001 (git-process bound,
		// 5–15 s each); make test runs all 24.
		iterations = 2
	}
	for i := range iterations {
		seed := uint64(1000 + i)
		t.Run(fmt.Sprint("seed", seed), func(t *testing.T) {
			t.Parallel()
			randomHistory(t, seed)
		})
	}
}

type holder struct {
	kind string // "local", "origin", "worktree"
	name string // ref name, or worktree path
}

func randomHistory(t *testing.T, seed uint64) {
	r := rand.New(rand.NewPCG(seed, seed*7+1))
	ctx := ctxT(t)
	f := newFactory(t)
	now := time.Now().UTC().Truncate(time.Second)
	recs, err := jobstate.Open(filepath.Join(f.home, "state", "jobs"))
	if err != nil {
		t.Fatal(err)
	}
	repo := f.newRepo("r")
	dead := exec.Command("true")
	if err := dead.Run(); err != nil {
		t.Fatal(err)
	}

	var (
		handDelete []string
		locks      []*worktree.Lock
		dirty      = map[string]map[string]string{} // job -> file -> content written after its checkpoint
		counter    int
	)
	t.Cleanup(func() {
		for _, l := range locks {
			l.Unlock()
		}
	})
	uniq := func(prefix string) string { counter++; return fmt.Sprintf("%s-%d-%d\n", prefix, seed, counter) }
	onOriginMain := func(fn func(clone string)) { f.onOrigin("r", fn) }

	nJobs := 5 + r.IntN(6)
	for k := range nJobs {
		id := fmt.Sprintf("j%d", k)
		// When it ended: recently, or long ago.
		ageDays := []int{0, 1, 3, 20, 40}[r.IntN(5)]
		end := now.Add(-time.Duration(ageDays)*24*time.Hour - time.Hour)
		at := end.Add(-time.Hour)
		g := worktree.Git{Env: []string{"GIT_AUTHOR_DATE=" + at.Format(time.RFC3339), "GIT_COMMITTER_DATE=" + at.Format(time.RFC3339)}}

		commitJob := r.IntN(3) > 0
		wt := f.runJob("r", id, at, map[string]string{id + ".txt": uniq(id), "src/" + id + ".go": uniq("package app // " + id)}, commitJob)
		switch r.IntN(4) {
		case 0: // a second checkpoint after more work (the WIP gets a child)
			testenv.WriteFile(t, filepath.Join(wt, id+"-more.txt"), uniq("more"))
			if _, err := worktree.Checkpoint(ctx, g, wt, plan.WIPRefPrefix+id, "again"); err != nil {
				t.Fatal(err)
			}
		case 1: // a branch of several commits (the engine committed too)
			if commitJob {
				testenv.WriteFile(t, filepath.Join(wt, id+"-second.txt"), uniq("second"))
				if _, _, err := worktree.CommitAll(ctx, g, wt, "second commit"); err != nil {
					t.Fatal(err)
				}
			}
		}
		jobBranch, wipRef := "aq/job/"+id, "aq/wip/"+id

		// Pushes, and what happens on origin.
		pushedJob := r.IntN(2) == 0
		if pushedJob {
			f.push("r", jobBranch)
		}
		if r.IntN(2) == 0 {
			f.push("r", wipRef)
		}
		if pushedJob {
			switch r.IntN(7) {
			case 0: // merged with a merge commit
				onOriginMain(func(c string) { testenv.Git(t, c, "merge", "-q", "--no-ff", "-m", "merge "+id, "origin/"+jobBranch) })
			case 1: // squash-merged
				onOriginMain(func(c string) {
					testenv.Git(t, c, "merge", "-q", "--squash", "origin/"+jobBranch)
					testenv.Git(t, c, "commit", "-q", "--allow-empty", "-m", "squash "+id)
				})
			case 2: // squash-merged, then reverted
				onOriginMain(func(c string) {
					testenv.Git(t, c, "merge", "-q", "--squash", "origin/"+jobBranch)
					testenv.Git(t, c, "commit", "-q", "--allow-empty", "-m", "squash "+id)
					if _, err := testenv.GitErr(c, "diff", "--quiet", "HEAD~1", "HEAD"); err != nil {
						testenv.Git(t, c, "revert", "--no-edit", "HEAD")
					}
				})
			case 3: // squash-merged, then its file edited on base
				onOriginMain(func(c string) {
					testenv.Git(t, c, "merge", "-q", "--squash", "origin/"+jobBranch)
					testenv.Git(t, c, "commit", "-q", "--allow-empty", "-m", "squash "+id)
					testenv.WriteFile(t, filepath.Join(c, id+".txt"), uniq("edited on base"))
					testenv.Git(t, c, "add", "-A")
					testenv.Git(t, c, "commit", "-q", "-m", "edit "+id)
				})
			case 4: // only its last commit cherry-picked
				onOriginMain(func(c string) {
					if _, err := testenv.GitErr(c, "cherry-pick", "origin/"+jobBranch); err != nil {
						testenv.Git(t, c, "cherry-pick", "--abort")
					}
				})
			}
		}
		if r.IntN(4) == 0 { // another factory checkpointed this job since: origin's WIP diverged
			onOriginMain(func(c string) {
				testenv.Git(t, c, "checkout", "-q", "-b", "tmp")
				testenv.WriteFile(t, filepath.Join(c, id+"-elsewhere.txt"), uniq("elsewhere"))
				testenv.Git(t, c, "add", "-A")
				testenv.Git(t, c, "commit", "-q", "-m", "elsewhere")
				testenv.Git(t, c, "push", "-q", "origin", "+HEAD:refs/heads/"+wipRef)
				testenv.Git(t, c, "checkout", "-q", "main")
			})
		}
		if r.IntN(3) == 0 { // base moved on, unrelated
			onOriginMain(func(c string) {
				testenv.WriteFile(t, filepath.Join(c, "base.txt"), uniq("base"))
				testenv.Git(t, c, "add", "-A")
				testenv.Git(t, c, "commit", "-q", "-m", "base work")
			})
		}

		// The worktree.
		switch r.IntN(6) {
		case 0: // removed when the job ended
			if err := worktree.Remove(ctx, worktree.Git{}, repo, wt); err != nil {
				t.Fatal(err)
			}
		case 1: // files written after its checkpoint
			dirty[id] = map[string]string{id + "-unsaved.txt": uniq("unsaved")}
			for p, c := range dirty[id] {
				testenv.WriteFile(t, filepath.Join(wt, p), c)
			}
		case 2: // detached, with a commit only its HEAD holds
			testenv.Git(t, wt, "checkout", "-q", "--detach")
			testenv.WriteFile(t, filepath.Join(wt, id+"-detached.txt"), uniq("detached"))
			testenv.Git(t, wt, "add", "-A")
			testenv.Git(t, wt, "commit", "-q", "-m", "detached work")
		case 3:
			handDelete = append(handDelete, wt)
		case 4:
			testenv.Git(t, repo, "worktree", "lock", wt)
		}

		// What aq's records say.
		rec := jobstate.Record{ID: id, Repo: "r", Base: "main", StartedAt: at, EndedAt: end}
		switch r.IntN(9) {
		case 0:
			continue // unknown job
		case 1:
			rec.Stage = job.Inbox
		case 2:
			rec.Stage, rec.EndedAt, rec.PID = job.Building, time.Time{}, dead.Process.Pid // orphan
		case 3:
			rec.Stage, rec.EndedAt = job.Building, time.Time{}
			l, err := worktree.LockJob(ctx, f.locksDir(), id) // running
			if err != nil {
				t.Fatal(err)
			}
			locks = append(locks, l)
		case 4:
			rec.Stage = job.Review
		case 5, 6:
			rec.Stage = job.Shipped
		case 7:
			rec.Stage = job.Failed
		case 8:
			rec.Stage = job.DeadLetter
		}
		if err := recs.Put(rec); err != nil {
			t.Fatal(err)
		}
	}
	// Refs that are not aq's.
	testenv.Git(t, repo, "branch", "feature", "main")
	testenv.Git(t, repo, "tag", "v1", "main")
	for _, wt := range handDelete {
		if err := os.RemoveAll(wt); err != nil {
			t.Fatal(err)
		}
	}
	if r.IntN(5) == 0 { // a job is running in the repository
		l, ok, err := worktree.TryLockRepo(f.locksDir(), "r")
		if err != nil || !ok {
			t.Fatal(err)
		}
		locks = append(locks, l)
	}

	// Before: every commit each ref and worktree holds.
	before := map[holder][]string{}
	wipBefore := testenv.RemoteRefs(t, repo, "refs/")
	originRefs := testenv.RemoteRefs(t, f.originDir("r"), "refs/")
	var detached []worktree.Entry // one on a branch holds what its branch holds
	localTips := slices.Collect(maps.Values(wipBefore))
	for _, w := range listWorktrees(t, repo) {
		if w.HEAD != "" && w.Detached {
			detached = append(detached, w)
			localTips = append(localTips, w.HEAD)
		}
	}
	local := ancestryOf(t, repo, localTips)
	for name, sha := range wipBefore {
		before[holder{"local", name}] = local.reach(sha)
	}
	for _, w := range detached {
		before[holder{"worktree", w.Path}] = local.reach(w.HEAD)
	}
	origin := ancestryOf(t, f.originDir("r"), slices.Collect(maps.Values(originRefs)))
	for name, sha := range originRefs {
		before[holder{"origin", name}] = origin.reach(sha)
	}
	originMain := originRefs["refs/heads/main"]

	g := f.gc(func(g *GC) { g.Records = recs })
	rep, err := g.Run(ctx, false)
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Errors) != 0 {
		t.Fatalf("errors: %v", rep.Errors)
	}
	decided := map[holder]Action{}
	for _, a := range rep.Actions {
		kind := a.Where
		if a.Kind == plan.KindWorktree {
			kind = "worktree"
		}
		decided[holder{kind, a.Name}] = a
	}

	// After: what is reachable anywhere.
	reach := map[string]bool{}
	for _, dir := range []string{repo, f.originDir("r")} {
		for _, c := range strings.Fields(testenv.Git(t, dir, "rev-list", "--all")) {
			reach[c] = true
		}
	}
	var heads []string
	for _, w := range listWorktrees(t, repo) {
		if w.HEAD != "" {
			heads = append(heads, w.HEAD)
		}
	}
	for c := range ancestryOf(t, repo, heads) {
		reach[c] = true
	}
	holders := map[string][]holder{}
	for h, commits := range before {
		for _, c := range commits {
			holders[c] = append(holders[c], h)
		}
	}
	lost := 0
	for c, hs := range holders {
		if reach[c] {
			continue
		}
		lost++
		for _, h := range hs {
			// A remote-tracking ref is origin's ref seen from here: the push
			// that deleted origin's ref removed it.
			if name, ok := strings.CutPrefix(h.name, "refs/remotes/origin/"); ok && h.kind == "local" {
				h = holder{"origin", "refs/heads/" + name}
			}
			a, ok := decided[h]
			if !ok || a.Result != Deleted {
				t.Fatalf("commit %.12s was lost, but %s %s, which held it, was not deleted by gc (%+v)", c, h.kind, h.name, a)
			}
			switch a.Rule {
			case plan.RuleShipped, plan.RuleExpired:
			case plan.RuleSquashed:
				if !changeInBase(t, repo, originMain, a.SHA) {
					t.Fatalf("%s was deleted as squash-merged, but its change is not in base", h.name)
				}
			default:
				t.Fatalf("commit %.12s was lost with %s %s, deleted by rule %s (%s)", c, h.kind, h.name, a.Rule, a.Reason)
			}
		}
	}

	// Unsaved files of removed worktrees are in their WIP refs.
	for id, files := range dirty {
		wt := f.wtPath("r", id)
		if _, err := os.Stat(wt); err == nil {
			continue // kept
		}
		for p, want := range files {
			got, err := testenv.GitErr(repo, "show", plan.WIPRefPrefix+id+":"+p)
			if err != nil {
				a := decided[holder{"local", plan.WIPRefPrefix + id}]
				t.Fatalf("%s's unsaved %s is in no WIP ref (WIP before %.12s, decision %s/%s: %s)", id, p, wipBefore[plan.WIPRefPrefix+id], a.Result, a.Rule, a.Detail)
			}
			if got+"\n" != want {
				t.Fatalf("%s: %s = %q, want %q", id, p, got, want)
			}
		}
	}
	t.Logf("seed %d: %d jobs; deleted %+v; kept %+v; %d commits gone (allowed)", seed, nJobs, rep.Deleted, rep.Kept, lost)

	// Idempotent.
	rep2, err := g.Run(ctx, false)
	if err != nil {
		t.Fatal(err)
	}
	if rep2.Deleted.Total() != 0 || len(rep2.Errors) != 0 {
		for _, a := range rep2.Actions {
			if a.Result != Kept {
				t.Logf("%s %s: %s: %s (%s)", a.Result, a.Label(), a.Rule, a.Reason, a.Detail)
			}
		}
		t.Fatalf("the second run deleted %+v (errors %v)", rep2.Deleted, rep2.Errors)
	}
}

// ancestry is the commits reachable from some tips in a repository, each
// with its parents: one git rev-list for all the tips (the test's checks
// were a rev-list per ref, about an eighth of its git processes).
type ancestry map[string][]string

func ancestryOf(tb testing.TB, dir string, tips []string) ancestry {
	tb.Helper()
	a := ancestry{}
	if len(tips) == 0 {
		return a
	}
	for _, line := range strings.Split(testenv.Git(tb, dir, append([]string{"rev-list", "--parents"}, tips...)...), "\n") {
		if f := strings.Fields(line); len(f) > 0 {
			a[f[0]] = f[1:]
		}
	}
	return a
}

// reach is what git rev-list tip lists: tip and its ancestors.
func (a ancestry) reach(tip string) []string {
	if _, ok := a[tip]; !ok {
		return nil
	}
	seen, todo := map[string]bool{tip: true}, []string{tip}
	var out []string
	for len(todo) > 0 {
		c := todo[len(todo)-1]
		todo = todo[:len(todo)-1]
		out = append(out, c)
		for _, p := range a[c] {
			if !seen[p] {
				seen[p] = true
				todo = append(todo, p)
			}
		}
	}
	return out
}

func listWorktrees(tb testing.TB, repo string) []worktree.Entry {
	tb.Helper()
	l, err := worktree.List(context.Background(), worktree.Git{}, repo)
	if err != nil {
		tb.Fatal(err)
	}
	return l
}

// changeInBase checks, independently of gc, that tip's change is in base:
// every commit of tip not in base has an equivalent in base (git cherry), or
// merging tip into base changes nothing.
func changeInBase(tb testing.TB, repo, base, tip string) bool {
	tb.Helper()
	if out, err := testenv.GitErr(repo, "cherry", base, tip); err == nil {
		all := true
		for _, line := range strings.Split(out, "\n") {
			if strings.HasPrefix(line, "+") {
				all = false
			}
		}
		if all {
			return true
		}
	}
	tree, err := testenv.GitErr(repo, "merge-tree", "--write-tree", base, tip)
	if err != nil {
		return false
	}
	baseTree := testenv.Git(tb, repo, "rev-parse", base+"^{tree}")
	lines := strings.Split(tree, "\n")
	return lines[0] == baseTree
}
