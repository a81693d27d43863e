package plan

import (
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/aqfleet/aq/internal/testenv"
	"github.com/aqfleet/aq/worktree"
)

var updateGolden = flag.Bool("update", false, "rewrite testdata/gc/*.plan.{json,txt} from Plan's current output")

var (
	t0   = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	day  = 24 * time.Hour
	pol  = Policy{WIPRetention: 14 * day}
	sha1 = strings.Repeat("1", 40)
	sha2 = strings.Repeat("2", 40)
)

func find(t *testing.T, d Decisions, where, name string) Decision {
	t.Helper()
	for _, x := range d.Items {
		if x.Name == name && x.Where == where {
			return x
		}
	}
	t.Fatalf("no decision for %s %s in %+v", where, name, d.Items)
	return Decision{}
}

// Each row is one candidate in one situation, and the rule that must decide
// it.
func TestPlanRules(t *testing.T) {
	t.Parallel()
	wt := "/h/worktrees/r/j"
	ref := func(kind, id string, mod func(*RefState)) RefState {
		r := RefState{Name: "refs/heads/aq/" + kind + "/" + id, SHA: sha1, Base: "main", Time: t0.Add(-30 * day)}
		if mod != nil {
			mod(&r)
		}
		return r
	}
	job := func(status JobStatus, ended time.Duration, mod func(*JobState)) map[string]JobState {
		j := JobState{Status: status, EndedAt: t0.Add(-ended)}
		if mod != nil {
			mod(&j)
		}
		return map[string]JobState{"j": j}
	}
	inFlight := func(j *JobState) { j.InFlight = true }
	tests := []struct {
		name   string
		repo   RepoState
		jobs   map[string]JobState
		where  string
		target string
		action Action
		rule   Rule
		cp     bool
	}{
		// Refs outside aq's namespace, whatever else is true of them.
		{name: "non-aq branch", repo: RepoState{Refs: []RefState{{Name: "refs/heads/main", SHA: sha1, Merged: true}}},
			target: "refs/heads/main", action: Keep, rule: RuleOutsideAQ},
		{name: "non-aq on origin", repo: RepoState{Remote: []RefState{{Name: "refs/heads/feature", SHA: sha1, Merged: true}}},
			where: WhereOrigin, target: "refs/heads/feature", action: Keep, rule: RuleOutsideAQ},
		{name: "aq other", repo: RepoState{Refs: []RefState{{Name: "refs/heads/aq/notes", SHA: sha1, Merged: true}}},
			target: "refs/heads/aq/notes", action: Keep, rule: RuleNotJobRef},
		{name: "bad job id", repo: RepoState{Refs: []RefState{{Name: "refs/heads/aq/job/a/b", SHA: sha1, Merged: true}}},
			target: "refs/heads/aq/job/a/b", action: Keep, rule: RuleNotJobRef},

		// Job branches.
		{name: "merged job branch", repo: RepoState{Refs: []RefState{ref("job", "j", func(r *RefState) { r.Merged = true })}},
			jobs: job(JobShipped, day, nil), target: "refs/heads/aq/job/j", action: Delete, rule: RuleMerged},
		{name: "merged, job unknown", repo: RepoState{Refs: []RefState{ref("job", "j", func(r *RefState) { r.Merged = true })}},
			target: "refs/heads/aq/job/j", action: Delete, rule: RuleMerged},
		{name: "squash-merged", repo: RepoState{Refs: []RefState{ref("job", "j", func(r *RefState) { r.Squashed = worktree.SquashPatchID })}},
			jobs: job(JobAwaiting, day, nil), target: "refs/heads/aq/job/j", action: Delete, rule: RuleSquashed},
		{name: "unmerged", repo: RepoState{Refs: []RefState{ref("job", "j", nil)}},
			jobs: job(JobShipped, 90*day, nil), target: "refs/heads/aq/job/j", action: Keep, rule: RuleNotMerged},
		{name: "unmerged, failed long ago: never by age", repo: RepoState{Refs: []RefState{ref("job", "j", nil)}},
			jobs: job(JobFailed, 900*day, nil), target: "refs/heads/aq/job/j", action: Keep, rule: RuleNotMerged},
		{name: "merged but in flight", repo: RepoState{Refs: []RefState{ref("job", "j", func(r *RefState) { r.Merged = true })}},
			jobs: job(JobBuilding, 0, inFlight), target: "refs/heads/aq/job/j", action: Keep, rule: RuleInFlight},
		{name: "merged but checked out in a kept worktree",
			repo: RepoState{Locked: true, Refs: []RefState{ref("job", "j", func(r *RefState) { r.Merged = true; r.CheckedOut = wt })},
				Worktrees: []WorktreeState{{Path: wt, Job: "j", Branch: "aq/job/j", Registered: true}}},
			jobs: job(JobShipped, day, nil), target: "refs/heads/aq/job/j", action: Keep, rule: RuleCheckedOut},
		{name: "merged and checked out in a worktree this plan removes",
			repo: RepoState{Refs: []RefState{ref("job", "j", func(r *RefState) { r.Merged = true; r.CheckedOut = wt })},
				Worktrees: []WorktreeState{{Path: wt, Job: "j", Branch: "aq/job/j", Registered: true}}},
			jobs: job(JobShipped, day, nil), target: "refs/heads/aq/job/j", action: Delete, rule: RuleMerged},
		{name: "origin merged job branch", repo: RepoState{Remote: []RefState{ref("job", "j", func(r *RefState) { r.Merged = true })}},
			jobs: job(JobShipped, day, nil), where: WhereOrigin, target: "refs/heads/aq/job/j", action: Delete, rule: RuleMerged},
		{name: "origin tip absent", repo: RepoState{Remote: []RefState{ref("job", "j", func(r *RefState) { r.Absent = true })}},
			jobs: job(JobShipped, day, nil), where: WhereOrigin, target: "refs/heads/aq/job/j", action: Keep, rule: RuleAbsent},

		// WIP refs.
		{name: "wip of shipped job", repo: RepoState{Refs: []RefState{ref("wip", "j", nil)}},
			jobs: job(JobShipped, day, nil), target: "refs/heads/aq/wip/j", action: Delete, rule: RuleShipped},
		{name: "wip of shipped job, checkpoint after its end", repo: RepoState{Refs: []RefState{ref("wip", "j", func(r *RefState) { r.Time = t0.Add(-time.Hour) })}},
			jobs: job(JobShipped, day, nil), target: "refs/heads/aq/wip/j", action: Keep, rule: RuleRetained},
		{name: "wip of shipped job, late checkpoint past retention", repo: RepoState{Refs: []RefState{ref("wip", "j", func(r *RefState) { r.Time = t0.Add(-20 * day) })}},
			jobs: job(JobShipped, 30*day, nil), target: "refs/heads/aq/wip/j", action: Delete, rule: RuleExpired},
		{name: "wip of recently failed job", repo: RepoState{Refs: []RefState{ref("wip", "j", func(r *RefState) { r.Time = t0.Add(-3 * day) })}},
			jobs: job(JobFailed, 2*day, nil), target: "refs/heads/aq/wip/j", action: Keep, rule: RuleRetained},
		{name: "wip of long-failed job", repo: RepoState{Refs: []RefState{ref("wip", "j", nil)}},
			jobs: job(JobFailed, 15*day, nil), target: "refs/heads/aq/wip/j", action: Delete, rule: RuleExpired},
		{name: "wip of failed job, retention exactly reached", repo: RepoState{Refs: []RefState{ref("wip", "j", nil)}},
			jobs: job(JobFailed, 14*day, nil), target: "refs/heads/aq/wip/j", action: Delete, rule: RuleExpired},
		{name: "wip of failed job, end unknown", repo: RepoState{Refs: []RefState{ref("wip", "j", func(r *RefState) { r.Time = time.Time{} })}},
			jobs: map[string]JobState{"j": {Status: JobFailed}}, target: "refs/heads/aq/wip/j", action: Keep, rule: RuleUnknownAge},
		{name: "wip of queued job", repo: RepoState{Refs: []RefState{ref("wip", "j", nil)}},
			jobs: job(JobQueued, 90*day, nil), target: "refs/heads/aq/wip/j", action: Keep, rule: RulePending},
		{name: "wip of orphaned job", repo: RepoState{Refs: []RefState{ref("wip", "j", nil)}},
			jobs: job(JobBuilding, 0, nil), target: "refs/heads/aq/wip/j", action: Keep, rule: RuleOrphaned},
		{name: "wip of running job, shipped before", repo: RepoState{Refs: []RefState{ref("wip", "j", nil)}},
			jobs: job(JobShipped, 90*day, inFlight), target: "refs/heads/aq/wip/j", action: Keep, rule: RuleInFlight},
		{name: "wip of job in review", repo: RepoState{Refs: []RefState{ref("wip", "j", nil), ref("job", "j", nil)}},
			jobs: job(JobAwaiting, 90*day, nil), target: "refs/heads/aq/wip/j", action: Keep, rule: RuleUnshipped},
		{name: "wip of job in review whose branch was squash-merged", repo: RepoState{Refs: []RefState{ref("wip", "j", nil)},
			Remote: []RefState{ref("job", "j", func(r *RefState) { r.Squashed = worktree.SquashMergeTree })}},
			jobs: job(JobAwaiting, day, nil), target: "refs/heads/aq/wip/j", action: Delete, rule: RuleShipped},
		{name: "wip of unknown job", repo: RepoState{Refs: []RefState{ref("wip", "j", nil)}},
			target: "refs/heads/aq/wip/j", action: Keep, rule: RuleUnknownJob},
		{name: "wip of unknown job, all in base", repo: RepoState{Refs: []RefState{ref("wip", "j", func(r *RefState) { r.Merged = true })}},
			target: "refs/heads/aq/wip/j", action: Delete, rule: RuleMerged},
		{name: "wip squashed is not merged", repo: RepoState{Refs: []RefState{ref("wip", "j", func(r *RefState) { r.Squashed = worktree.SquashPatchID })}},
			jobs: job(JobQueued, day, nil), target: "refs/heads/aq/wip/j", action: Keep, rule: RulePending},
		{name: "origin wip of shipped job", repo: RepoState{Remote: []RefState{ref("wip", "j", nil)}},
			jobs: job(JobShipped, day, nil), where: WhereOrigin, target: "refs/heads/aq/wip/j", action: Delete, rule: RuleShipped},
		{name: "origin wip never fetched", repo: RepoState{Remote: []RefState{ref("wip", "j", func(r *RefState) { r.Absent = true })}},
			jobs: job(JobShipped, 90*day, nil), where: WhereOrigin, target: "refs/heads/aq/wip/j", action: Keep, rule: RuleAbsent},

		// Worktrees.
		{name: "worktree of shipped job", repo: RepoState{Worktrees: []WorktreeState{{Path: wt, Job: "j", Branch: "aq/job/j", Registered: true}}},
			jobs: job(JobShipped, day, nil), target: wt, action: Delete, rule: RuleNotRunning},
		{name: "dirty worktree of dead job", repo: RepoState{Worktrees: []WorktreeState{{Path: wt, Job: "j", Branch: "aq/job/j", Registered: true, Dirty: true}}},
			jobs: job(JobFailed, 90*day, nil), target: wt, action: Delete, rule: RuleNotRunning, cp: true},
		{name: "detached worktree", repo: RepoState{Worktrees: []WorktreeState{{Path: wt, Job: "j", Registered: true}}},
			jobs: job(JobFailed, day, nil), target: wt, action: Delete, rule: RuleNotRunning, cp: true},
		{name: "worktree of unknown job", repo: RepoState{Worktrees: []WorktreeState{{Path: wt, Job: "j", Branch: "aq/job/j", Registered: true}}},
			target: wt, action: Delete, rule: RuleNotRunning},
		{name: "worktree while the repo lock is held", repo: RepoState{Locked: true, Worktrees: []WorktreeState{{Path: wt, Job: "j", Branch: "aq/job/j", Registered: true}}},
			jobs: job(JobShipped, day, nil), target: wt, action: Keep, rule: RuleRepoLocked},
		{name: "worktree whose job lock is held", repo: RepoState{Worktrees: []WorktreeState{{Path: wt, Job: "j", Branch: "aq/job/j", Registered: true}}},
			jobs: job(JobShipped, day, inFlight), target: wt, action: Keep, rule: RuleInFlight},
		{name: "worktree of orphaned job", repo: RepoState{Worktrees: []WorktreeState{{Path: wt, Job: "j", Branch: "aq/job/j", Registered: true, Dirty: true}}},
			jobs: job(JobBuilding, 0, nil), target: wt, action: Keep, rule: RuleOrphaned},
		{name: "locked worktree", repo: RepoState{Worktrees: []WorktreeState{{Path: wt, Job: "j", Branch: "aq/job/j", Registered: true, Locked: true}}},
			jobs: job(JobShipped, day, nil), target: wt, action: Keep, rule: RuleLockedTree},
		{name: "stale worktree, directory deleted", repo: RepoState{Worktrees: []WorktreeState{{Path: wt, Job: "j", Branch: "aq/job/j", Registered: true, Missing: true}}},
			jobs: job(JobFailed, day, nil), target: wt, action: Delete, rule: RuleMissing},
		{name: "stale worktree of running job", repo: RepoState{Worktrees: []WorktreeState{{Path: wt, Job: "j", Registered: true, Missing: true}}},
			jobs: job(JobBuilding, 0, inFlight), target: wt, action: Keep, rule: RuleInFlight},
		{name: "directory git does not know", repo: RepoState{Worktrees: []WorktreeState{{Path: wt, Job: "j"}}},
			jobs: job(JobShipped, day, nil), target: wt, action: Keep, rule: RuleUnregistered},
		{name: "worktree not named after a job", repo: RepoState{Worktrees: []WorktreeState{{Path: "/h/worktrees/r/.x", Job: ".x", Registered: true}}},
			target: "/h/worktrees/r/.x", action: Keep, rule: RuleNotJobRef},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			tc.repo.Name = "r"
			where := tc.where
			if where == "" {
				where = WhereLocal
			}
			d := find(t, Plan(t0, State{Repos: []RepoState{tc.repo}, Jobs: tc.jobs}, pol), where, tc.target)
			if d.Action != tc.action || d.Rule != tc.rule || d.Checkpoint != tc.cp {
				t.Errorf("got %s/%s checkpoint=%v (%s), want %s/%s checkpoint=%v", d.Action, d.Rule, d.Checkpoint, d.Reason, tc.action, tc.rule, tc.cp)
			}
			if d.Reason == "" {
				t.Error("no reason")
			}
			if d.Kind != KindWorktree && d.SHA == "" {
				t.Error("a ref decision must carry the sha to compare-and-swap on")
			}
		})
	}
}

// goldenCase is a testdata/gc/*.input.json file.
type goldenCase struct {
	Now    time.Time `json:"now"`
	Policy struct {
		WIPRetention string `json:"wipRetention"`
	} `json:"policy"`
	State State `json:"state"`
}

// Golden: state JSON in, plan JSON and text out. `go test ./worktree -run
// TestPlanGolden -update` rewrites the outputs.
func TestPlanGolden(t *testing.T) {
	t.Parallel()
	inputs, err := filepath.Glob(filepath.Join("testdata", "gc", "*.input.json"))
	if err != nil || len(inputs) == 0 {
		t.Fatalf("no golden inputs: %v", err)
	}
	for _, in := range inputs {
		name := strings.TrimSuffix(filepath.Base(in), ".input.json")
		t.Run(name, func(t *testing.T) {
			raw, err := os.ReadFile(in)
			if err != nil {
				t.Fatal(err)
			}
			var c goldenCase
			dec := json.NewDecoder(bytes.NewReader(raw))
			dec.DisallowUnknownFields()
			if err := dec.Decode(&c); err != nil {
				t.Fatalf("%s: %v", in, err)
			}
			ret, err := time.ParseDuration(c.Policy.WIPRetention)
			if err != nil {
				t.Fatalf("%s: wipRetention: %v", in, err)
			}
			plan := Plan(c.Now, c.State, Policy{WIPRetention: ret})
			gotJSON, err := json.MarshalIndent(plan, "", "  ")
			if err != nil {
				t.Fatal(err)
			}
			gotJSON = append(gotJSON, '\n')
			var txt bytes.Buffer
			if err := plan.WriteText(&txt); err != nil {
				t.Fatal(err)
			}
			for _, out := range []struct {
				path string
				got  []byte
			}{
				{filepath.Join("testdata", "gc", name+".plan.json"), gotJSON},
				{filepath.Join("testdata", "gc", name+".plan.txt"), txt.Bytes()},
			} {
				if *updateGolden {
					if err := os.WriteFile(out.path, out.got, 0o644); err != nil {
						t.Fatal(err)
					}
					continue
				}
				want, err := os.ReadFile(out.path)
				if err != nil {
					t.Fatalf("%v (run with -update to create it)", err)
				}
				if !bytes.Equal(want, out.got) {
					t.Errorf("%s differs from Plan's output (run with -update if the change is intended):\n--- want\n%s\n--- got\n%s", out.path, want, out.got)
				}
			}
		})
	}
}

// randomState builds a state with every kind of candidate in random
// situations.
func randomState(r *rand.Rand) State {
	st := State{Jobs: map[string]JobState{}}
	statuses := []JobStatus{JobQueued, JobBuilding, JobAwaiting, JobShipped, JobFailed}
	for ri := range 1 + r.IntN(3) {
		repo := RepoState{Name: fmt.Sprintf("repo%d", ri), Locked: r.IntN(4) == 0}
		for k := range 2 + r.IntN(8) {
			id := fmt.Sprintf("r%dj%d", ri, k)
			if r.IntN(5) > 0 {
				st.Jobs[id] = JobState{Status: statuses[r.IntN(len(statuses))], EndedAt: t0.Add(-time.Duration(r.IntN(40)) * day), InFlight: r.IntN(5) == 0}
			}
			mk := func(kind string) RefState {
				rs := RefState{Name: "refs/heads/aq/" + kind + "/" + id, SHA: fmt.Sprintf("%040x", r.Uint64()), Base: "main",
					Time: t0.Add(-time.Duration(r.IntN(40)) * day), Merged: r.IntN(3) == 0, Absent: r.IntN(8) == 0}
				if r.IntN(3) == 0 {
					rs.Squashed = worktree.SquashPatchID
				}
				return rs
			}
			wtPath := "/h/worktrees/" + repo.Name + "/" + id
			if r.IntN(2) == 0 {
				repo.Worktrees = append(repo.Worktrees, WorktreeState{Path: wtPath, Job: id, Branch: "aq/job/" + id,
					Registered: r.IntN(6) > 0, Missing: r.IntN(5) == 0, Locked: r.IntN(6) == 0, Dirty: r.IntN(2) == 0})
			}
			for _, kind := range []string{"job", "wip"} {
				if r.IntN(3) > 0 {
					rs := mk(kind)
					if kind == "job" && r.IntN(2) == 0 {
						rs.CheckedOut = wtPath
					}
					rs.Absent = false
					repo.Refs = append(repo.Refs, rs)
				}
				if r.IntN(3) > 0 {
					repo.Remote = append(repo.Remote, mk(kind))
				}
			}
		}
		for k := range r.IntN(4) {
			repo.Worktrees = append(repo.Worktrees, WorktreeState{Path: fmt.Sprintf("/h/worktrees/.pool/%s/%d", repo.Name, k), Pooled: true,
				PooledAt: t0.Add(-time.Duration(r.IntN(100)) * time.Hour), Registered: r.IntN(8) > 0, Missing: r.IntN(8) == 0,
				Locked: r.IntN(8) == 0, SetAside: r.IntN(8) == 0, Bytes: int64(1+r.IntN(10)) << 20})
		}
		for i := range repo.Worktrees {
			if repo.Worktrees[i].Bytes == 0 {
				repo.Worktrees[i].Bytes = int64(1+r.IntN(10)) << 20
			}
		}
		repo.Refs = append(repo.Refs, RefState{Name: "refs/heads/main", SHA: sha2, Merged: true},
			RefState{Name: "refs/tags/aq/job/x", SHA: sha2, Merged: true})
		st.Repos = append(st.Repos, repo)
	}
	return st
}

// The rules of docs/gc.md ("Never") hold for any state: nothing outside aq/ is
// ever deleted; no worktree of a job in flight (or in a locked repository);
// no job branch whose commits or change are not in base; no WIP ref of a
// job that is running, unknown (unless merged) or failed within retention;
// every candidate gets exactly one decision with a reason; Plan is
// deterministic and leaves its input alone.
func TestPlanInvariants(t *testing.T) {
	testenv.Slow(t, "a property test over many random states")
	t.Parallel()
	r := rand.New(rand.NewPCG(8, 8))
	for iter := range 2000 {
		st := randomState(r)
		pol := pol
		pol.PoolMaxAge, pol.PoolSize, pol.PoolOff = time.Duration(r.IntN(3))*24*time.Hour, r.IntN(3), r.IntN(6) == 0
		if r.IntN(2) == 0 {
			pol.DiskMax = int64(r.IntN(60)) << 20
		}
		before, _ := json.Marshal(st)
		plan := Plan(t0, st, pol)
		after, _ := json.Marshal(st)
		if !bytes.Equal(before, after) {
			t.Fatal("Plan modified its input")
		}
		again := Plan(t0, st, pol)
		if !reflect.DeepEqual(plan, again) {
			t.Fatal("Plan is not deterministic")
		}
		n := 0
		for _, repo := range st.Repos {
			n += len(repo.Refs) + len(repo.Remote) + len(repo.Worktrees)
		}
		if len(plan.Items) != n {
			t.Fatalf("iteration %d: %d decisions for %d candidates", iter, len(plan.Items), n)
		}
		locked := map[string]bool{}
		for _, repo := range st.Repos {
			locked[repo.Name] = repo.Locked
		}
		for _, d := range plan.Items {
			if d.Reason == "" || d.Rule == "" {
				t.Fatalf("decision without a reason: %+v", d)
			}
			if d.Action != Delete {
				continue
			}
			j, known := st.Jobs[d.Job]
			fail := func(why string) { t.Fatalf("iteration %d: %s: %+v (job %+v known=%v)", iter, why, d, j, known) }
			if known && j.InFlight {
				fail("deleted something of a job in flight")
			}
			switch d.Kind {
			case KindPooled:
				if locked[d.Repo] {
					fail("removed a pooled worktree while its repo lock is held")
				}
			case KindWorktree:
				if locked[d.Repo] {
					fail("removed a worktree while its repo lock is held")
				}
				if d.Rule == RuleDiskMax || d.Rule == RulePoolFull || d.Rule == RulePoolAge {
					fail("removed a job's worktree by a pool rule")
				}
				if known && j.Status == JobBuilding {
					fail("removed an orphan's worktree")
				}
			case KindOtherRef:
				fail("deleted a ref that is not aq's")
			case KindJobBranch:
				if d.Rule != RuleMerged && d.Rule != RuleSquashed {
					fail("deleted an unmerged job branch")
				}
			case KindWIPRef:
				switch d.Rule {
				case RuleMerged:
				case RuleShipped:
					if !known || !(j.Status == JobShipped || j.Status == JobAwaiting && branchMerged(st, d.Repo, d.Job)) {
						fail("deleted a WIP ref as shipped")
					}
				case RuleExpired:
					if !known || j.Status == JobQueued || j.Status == JobBuilding || j.Status == JobAwaiting && !branchMerged(st, d.Repo, d.Job) {
						fail("expired the WIP ref of a job that may still need it")
					}
				default:
					fail("deleted a WIP ref by an unknown rule")
				}
			}
			if !strings.HasPrefix(d.Name, "refs/heads/aq/") && d.Kind != KindWorktree && d.Kind != KindPooled {
				fail("deleted outside refs/heads/aq/")
			}
		}
	}
}

// poolInvariants: over the disk ceiling, kept pooled worktrees remain only
// if the ceiling is met without them; a repository never keeps more than
// PoolSize pooled worktrees, and the ones it keeps are its newest.
func TestPlanPoolInvariants(t *testing.T) {
	testenv.Slow(t, "a property test over many random states")
	t.Parallel()
	r := rand.New(rand.NewPCG(9, 9))
	for iter := range 2000 {
		st := randomState(r)
		pol := Policy{WIPRetention: 14 * day, PoolMaxAge: time.Duration(r.IntN(4)) * day, PoolSize: r.IntN(3), DiskMax: int64(r.IntN(60)) << 20}
		plan := Plan(t0, st, pol)
		at := map[string]time.Time{}
		for _, repo := range st.Repos {
			for _, w := range repo.Worktrees {
				at[w.Path] = w.PooledAt
			}
		}
		keptPooled := map[string][]Decision{}
		for _, d := range plan.Items {
			if d.Kind == KindPooled && d.Action == Keep && d.Rule == RulePooled {
				keptPooled[d.Repo] = append(keptPooled[d.Repo], d)
			}
		}
		for repo, kept := range keptPooled {
			if pol.PoolSize > 0 && len(kept) > pol.PoolSize {
				t.Fatalf("iteration %d: %s keeps %d pooled worktrees, PoolSize %d", iter, repo, len(kept), pol.PoolSize)
			}
			for _, d := range plan.Items {
				if d.Repo == repo && d.Kind == KindPooled && d.Rule == RulePoolFull {
					for _, k := range kept {
						if at[d.Name].After(at[k.Name]) {
							t.Fatalf("iteration %d: trimmed %s but kept the older %s", iter, d.Name, k.Name)
						}
					}
				}
			}
		}
		if pol.DiskMax > 0 {
			if plan.Disk == nil {
				t.Fatal("no disk plan under a ceiling")
			}
			if plan.Disk.After > pol.DiskMax && len(keptPooled) > 0 {
				t.Fatalf("iteration %d: %d bytes after the plan, over %d, with pooled worktrees kept", iter, plan.Disk.After, pol.DiskMax)
			}
		} else if plan.Disk != nil {
			t.Fatal("a disk plan without a ceiling")
		}
	}
}

// TestPlanPool: the pool's rules on one repository.
func TestPlanPool(t *testing.T) {
	t.Parallel()
	pw := func(n int, ago time.Duration, mb int64, mod func(*WorktreeState)) WorktreeState {
		w := WorktreeState{Path: fmt.Sprintf("/h/worktrees/.pool/r/%d", n), Pooled: true, Registered: true, PooledAt: t0.Add(-ago), Bytes: mb << 20}
		if mod != nil {
			mod(&w)
		}
		return w
	}
	jobWT := WorktreeState{Path: "/h/worktrees/r/j", Job: "j", Branch: "aq/job/j", Registered: true, Bytes: 50 << 20}
	running := map[string]JobState{"j": {Status: JobBuilding, InFlight: true}}
	tests := []struct {
		name  string
		repo  RepoState
		jobs  map[string]JobState
		pol   Policy
		rules map[string]Rule // path -> rule
		after int64           // DiskPlan.After in MiB, when there is a ceiling
	}{
		{name: "kept warm", repo: RepoState{Worktrees: []WorktreeState{pw(0, time.Hour, 10, nil)}}, pol: Policy{PoolMaxAge: 3 * day},
			rules: map[string]Rule{"/h/worktrees/.pool/r/0": RulePooled}},
		{name: "too old", repo: RepoState{Worktrees: []WorktreeState{pw(0, 3*day, 10, nil), pw(1, 71*time.Hour, 10, nil)}}, pol: Policy{PoolMaxAge: 3 * day},
			rules: map[string]Rule{"/h/worktrees/.pool/r/0": RulePoolAge, "/h/worktrees/.pool/r/1": RulePooled}},
		{name: "no age limit", repo: RepoState{Worktrees: []WorktreeState{pw(0, 300*day, 10, nil)}},
			rules: map[string]Rule{"/h/worktrees/.pool/r/0": RulePooled}},
		{name: "repo locked: a job may be taking it", repo: RepoState{Locked: true, Worktrees: []WorktreeState{pw(0, 30*day, 10, func(w *WorktreeState) { w.SetAside = true })}},
			pol: Policy{PoolMaxAge: day, PoolOff: true, DiskMax: 1}, rules: map[string]Rule{"/h/worktrees/.pool/r/0": RuleRepoLocked}, after: 10},
		{name: "pool off", repo: RepoState{Worktrees: []WorktreeState{pw(0, time.Hour, 10, nil)}}, pol: Policy{PoolOff: true},
			rules: map[string]Rule{"/h/worktrees/.pool/r/0": RulePoolOff}},
		{name: "beyond the pool's size, oldest go", repo: RepoState{Worktrees: []WorktreeState{pw(0, 5*time.Hour, 10, nil), pw(1, time.Hour, 10, nil), pw(2, 3*time.Hour, 10, nil)}},
			pol: Policy{PoolSize: 2}, rules: map[string]Rule{"/h/worktrees/.pool/r/0": RulePoolFull, "/h/worktrees/.pool/r/1": RulePooled, "/h/worktrees/.pool/r/2": RulePooled}},
		{name: "set aside", repo: RepoState{Worktrees: []WorktreeState{pw(0, time.Hour, 10, func(w *WorktreeState) { w.SetAside, w.Registered = true, false })}},
			rules: map[string]Rule{"/h/worktrees/.pool/r/0": RuleSetAside}},
		{name: "forgotten by git", repo: RepoState{Worktrees: []WorktreeState{pw(0, time.Hour, 10, func(w *WorktreeState) { w.Registered = false })}},
			rules: map[string]Rule{"/h/worktrees/.pool/r/0": RuleSetAside}},
		{name: "directory gone", repo: RepoState{Worktrees: []WorktreeState{pw(0, time.Hour, 10, func(w *WorktreeState) { w.Missing = true })}},
			rules: map[string]Rule{"/h/worktrees/.pool/r/0": RuleMissing}},
		{name: "git worktree locked", repo: RepoState{Worktrees: []WorktreeState{pw(0, 30*day, 10, func(w *WorktreeState) { w.Locked = true })}}, pol: Policy{PoolMaxAge: day},
			rules: map[string]Rule{"/h/worktrees/.pool/r/0": RuleLockedTree}},
		{name: "disk ceiling: oldest pooled go until under", repo: RepoState{Worktrees: []WorktreeState{jobWT, pw(0, 5*time.Hour, 20, nil), pw(1, time.Hour, 20, nil), pw(2, 3*time.Hour, 20, nil)}},
			jobs: running, pol: Policy{DiskMax: 85 << 20},
			rules: map[string]Rule{"/h/worktrees/r/j": RuleInFlight, "/h/worktrees/.pool/r/0": RuleDiskMax, "/h/worktrees/.pool/r/2": RuleDiskMax, "/h/worktrees/.pool/r/1": RulePooled}, after: 70},
		{name: "disk ceiling below the running jobs: the pool empties, nothing more", repo: RepoState{Worktrees: []WorktreeState{jobWT, pw(0, time.Hour, 20, nil)}},
			jobs: running, pol: Policy{DiskMax: 10 << 20},
			rules: map[string]Rule{"/h/worktrees/r/j": RuleInFlight, "/h/worktrees/.pool/r/0": RuleDiskMax}, after: 50},
		{name: "under the ceiling", repo: RepoState{Worktrees: []WorktreeState{jobWT, pw(0, time.Hour, 20, nil)}},
			jobs: running, pol: Policy{DiskMax: 1 << 30},
			rules: map[string]Rule{"/h/worktrees/.pool/r/0": RulePooled}, after: 70},
		{name: "a removed job worktree counts no more", repo: RepoState{Worktrees: []WorktreeState{jobWT, pw(0, time.Hour, 20, nil)}},
			jobs: map[string]JobState{"j": {Status: JobShipped}}, pol: Policy{DiskMax: 30 << 20},
			rules: map[string]Rule{"/h/worktrees/r/j": RuleNotRunning, "/h/worktrees/.pool/r/0": RulePooled}, after: 20},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			tc.repo.Name = "r"
			plan := Plan(t0, State{Repos: []RepoState{tc.repo}, Jobs: tc.jobs}, tc.pol)
			for path, rule := range tc.rules {
				d := find(t, plan, WhereLocal, path)
				wantAction := Keep
				switch rule {
				case RulePoolAge, RulePoolFull, RulePoolOff, RuleDiskMax, RuleSetAside, RuleMissing, RuleNotRunning:
					wantAction = Delete
				}
				if d.Rule != rule || d.Action != wantAction || d.Reason == "" {
					t.Errorf("%s: %s/%s (%s), want %s/%s", path, d.Action, d.Rule, d.Reason, wantAction, rule)
				}
				if d.Checkpoint && d.Kind == KindPooled {
					t.Errorf("%s: a pooled worktree holds no work to checkpoint", path)
				}
			}
			if tc.pol.DiskMax > 0 && (plan.Disk == nil || plan.Disk.After != tc.after<<20) {
				t.Errorf("disk plan %+v, want %d MiB after", plan.Disk, tc.after)
			}
		})
	}
}

// branchMerged reports whether a job branch of id in repo has its work in
// base.
func branchMerged(st State, repo, id string) bool {
	for _, r := range st.Repos {
		if r.Name != repo {
			continue
		}
		for _, refs := range [][]RefState{r.Refs, r.Remote} {
			for _, x := range refs {
				if x.Name == JobRefPrefix+id && !x.Absent && (x.Merged || x.Squashed != "") {
					return true
				}
			}
		}
	}
	return false
}

func TestHuman(t *testing.T) {
	t.Parallel()
	for d, want := range map[time.Duration]string{
		-time.Second: "0m", 59 * time.Second: "0m", 90 * time.Minute: "1h", 47 * time.Hour: "47h",
		14 * day: "14d", 15*day + 3*time.Hour: "15d3h",
	} {
		if got := human(d); got != want {
			t.Errorf("human(%v) = %q, want %q", d, got, want)
		}
	}
}
