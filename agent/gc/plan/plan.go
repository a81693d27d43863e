// Package plan is garbage collection's plan (docs/gc.md): a pure function
// from what is on disk (refs, worktrees, locks, what aq knows of each job),
// a policy and the time to one decision — delete or keep, with a reason —
// for every candidate. Gathering that state and carrying out the plan is
// agent/gc's job, beside it; nothing here runs git, reads a file or looks
// at a clock, so every rule is tested with tables and golden files.
//
// The plan knows jobs only as plain values (JobState: a status, an end time,
// whether a live process holds it), so it imports nothing of aq's job model.
package plan

import (
	"cmp"
	"fmt"
	"io"
	"regexp"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/aqfleet/aq/internal/brief"
)

// GC ref namespaces. Only refs under refs/heads/aq/ are ever candidates.
const (
	JobRefPrefix = "refs/heads/aq/job/"
	WIPRefPrefix = "refs/heads/aq/wip/"
)

// JobStatus is where a job is, as far as gc needs to know.
type JobStatus string

const (
	// JobQueued: waiting to run (inbox, blocked; a failure with retries left).
	JobQueued JobStatus = "queued"
	// JobBuilding: recorded as running. InFlight says whether a live process
	// really holds it; if not, the run was orphaned (aq died) and orphan
	// recovery, not gc, deals with it.
	JobBuilding JobStatus = "building"
	// JobAwaiting: finished but not shipped: a PR is open (review) or verify
	// passed with ship: none (testing).
	JobAwaiting JobStatus = "awaiting"
	// JobShipped: shipped.
	JobShipped JobStatus = "shipped"
	// JobFailed: terminally failed (failed, dead_letter).
	JobFailed JobStatus = "failed"
)

// JobState is what aq's records (the local queue, the factory's fleet job
// records) say about one job.
type JobState struct {
	Status JobStatus `json:"status"`
	// Stage is the stage as recorded ("review", "dead_letter", ...), for
	// reasons.
	Stage string `json:"stage,omitempty"`
	// EndedAt is when the job's last run ended (zero: unknown or running).
	EndedAt time.Time `json:"endedAt,omitzero"`
	// InFlight: a live process holds the job (its job lock, or a running
	// fleet record whose process is alive).
	InFlight bool `json:"inFlight,omitempty"`
	// Repo is the job's repository (a name under AQ_REPO_BASE).
	Repo string `json:"repo,omitempty"`
	// Base is the job's base branch, when known.
	Base string `json:"base,omitempty"`
	// Source is where the record came from: "queue" or "fleet".
	Source string `json:"source,omitempty"`
}

// State is everything Plan decides on.
type State struct {
	Repos []RepoState `json:"repos"`
	// Jobs are the jobs aq knows of, by id. A ref or worktree whose job is
	// not here belongs to an unknown job.
	Jobs map[string]JobState `json:"jobs,omitempty"`
	// Sandboxes are the jobs' sandbox directories ($AQ_HOME/sandbox/<id>)
	// on disk (see SandboxState).
	Sandboxes []SandboxState `json:"sandboxes,omitempty"`
}

// RepoState is one repository under AQ_REPO_BASE.
type RepoState struct {
	Name string `json:"name"`
	// Locked: the repo lock is held, so a job is running in this repository.
	Locked bool `json:"locked,omitempty"`
	// Refs are the local refs under refs/heads/aq/.
	Refs []RefState `json:"refs,omitempty"`
	// Remote are origin's refs under refs/heads/aq/ (empty when the repo has
	// no origin or origin could not be read).
	Remote []RefState `json:"remote,omitempty"`
	// Worktrees are aq's worktrees of this repo: those under
	// $AQ_HOME/worktrees/<repo>/, registered or not.
	Worktrees []WorktreeState `json:"worktrees,omitempty"`
}

// RefState is one ref and what git says about its tip.
type RefState struct {
	Name string `json:"name"` // full name: refs/heads/aq/job/x
	SHA  string `json:"sha"`
	// Time is the tip's committer time (zero: unknown).
	Time time.Time `json:"time,omitzero"`
	// Base is the branch the tip was compared with.
	Base string `json:"base,omitempty"`
	// Merged: the tip is an ancestor of (or equal to) base: every commit of
	// the ref is in base.
	Merged bool `json:"merged,omitempty"`
	// Squashed says how the ref's change was found in base although its
	// commits are not there (a squash merge): "patch-id" (a commit of base
	// carries the same change, as `git cherry` sees it) or "merge-tree"
	// (merging the tip into base would change nothing). Empty: not found.
	Squashed string `json:"squashed,omitempty"`
	// Absent: the tip's commits are not in this clone (an origin ref pushed
	// from elsewhere and never fetched): nothing above is known.
	Absent bool `json:"absent,omitempty"`
	// CheckedOut is the path of a worktree that has this branch checked out.
	CheckedOut string `json:"checkedOut,omitempty"`
}

// WorktreeState is one of aq's worktrees ($AQ_HOME/worktrees/<repo>/<job>).
type WorktreeState struct {
	Path string `json:"path"`
	Job  string `json:"job"`
	// Branch is the branch checked out ("aq/job/x"); empty when detached.
	Branch string `json:"branch,omitempty"`
	HEAD   string `json:"head,omitempty"`
	// Registered: git knows it (`git worktree list`). A directory git does
	// not know is never removed.
	Registered bool `json:"registered"`
	// Missing: registered, but its directory is gone (deleted by hand).
	Missing bool `json:"missing,omitempty"`
	// Locked: `git worktree lock`ed by someone.
	Locked bool `json:"locked,omitempty"`
	// Dirty: it holds changes or untracked files not committed.
	Dirty bool `json:"dirty,omitempty"`
	// Pooled: a warm worktree in its repository's pool
	// (<worktrees>/.pool/<repo>/<n>, see Pool): no job's, kept for the next
	// job on the repository. PooledAt is when it went there (zero:
	// unknown).
	Pooled   bool      `json:"pooled,omitempty"`
	PooledAt time.Time `json:"pooledAt,omitzero"`
	// SetAside: a folder in the pool that is not a worktree any more — one
	// set aside because it could be neither reset nor removed
	// (Pool.Discard), or a pooled worktree git forgot. Only gc deletes it.
	SetAside bool `json:"setAside,omitempty"`
	// Bytes is the disk it uses, its git directory included (0: not
	// measured; gc measures only when there is a disk ceiling).
	Bytes int64 `json:"bytes,omitempty"`
}

// Policy is gc's configuration.
type Policy struct {
	// WIPRetention is how long a terminally failed job's WIP ref is kept
	// after the job ended (AQ_GC_WIP_RETENTION).
	WIPRetention time.Duration `json:"wipRetention"`
	// PoolMaxAge: a pooled worktree no job took for this long goes
	// (AQ_WORKTREE_POOL_MAX_AGE; 0: never for its age).
	PoolMaxAge time.Duration `json:"poolMaxAge,omitempty"`
	// PoolSize is the most pooled worktrees a repository keeps
	// (AQ_WORKTREE_POOL): the oldest beyond it go. 0: no limit here.
	PoolSize int `json:"poolSize,omitempty"`
	// PoolOff: pooling is off (AQ_WORKTREE_POOL=0): every pooled worktree
	// goes.
	PoolOff bool `json:"poolOff,omitempty"`
	// DiskMax is the disk aq's worktrees may use (AQ_WORKTREE_DISK_MAX;
	// 0: no ceiling). Over it, pooled worktrees go, oldest first, across
	// repositories; nothing else is removed for it.
	DiskMax int64 `json:"diskMax,omitempty"`
}

// Action is what to do with a candidate.
type Action string

const (
	Delete Action = "delete"
	Keep   Action = "keep"
)

// Kind is what a candidate is.
type Kind string

const (
	KindWorktree  Kind = "worktree"
	KindPooled    Kind = "pooled-worktree" // a worktree in a repository's pool
	KindJobBranch Kind = "job-branch"      // refs/heads/aq/job/<id>
	KindWIPRef    Kind = "wip-ref"         // refs/heads/aq/wip/<id>
	KindOtherRef  Kind = "other-ref"       // any other ref met; always kept
	KindSandbox   Kind = "sandbox-dir"     // $AQ_HOME/sandbox/<id>: a job's sandbox directory
)

// Where a ref lives.
const (
	WhereLocal  = "local"
	WhereOrigin = "origin"
)

// Rule names the rule behind a decision, for programs (the reason is for
// people).
type Rule string

// Rules that delete.
const (
	RuleMerged     Rule = "merged"      // every commit is in base
	RuleSquashed   Rule = "squashed"    // the change is in base (squash merge)
	RuleShipped    Rule = "shipped"     // WIP of a shipped job
	RuleExpired    Rule = "expired"     // WIP of a failed job past retention
	RuleNotRunning Rule = "not-running" // worktree of a job not in flight
	RuleMissing    Rule = "missing"     // worktree whose directory is gone
	RulePoolAge    Rule = "pool-age"    // pooled worktree no job took for PoolMaxAge
	RulePoolFull   Rule = "pool-full"   // pooled worktree beyond PoolSize
	RulePoolOff    Rule = "pool-off"    // pooled worktree while pooling is off
	RuleDiskMax    Rule = "disk-max"    // pooled worktree while aq's worktrees use more than DiskMax
	RuleSetAside   Rule = "set-aside"   // folder in the pool that is not a worktree any more
	RuleStale      Rule = "stale"       // sandbox directory of a job not in flight, left by a run that did not end
)

// Rules that keep.
const (
	RuleOutsideAQ    Rule = "outside-aq"   // not under refs/heads/aq/
	RuleNotJobRef    Rule = "not-job-ref"  // under aq/ but not aq/job/<id> or aq/wip/<id>; a worktree not named after a job
	RuleInFlight     Rule = "in-flight"    // a live process holds the job
	RuleRepoLocked   Rule = "repo-locked"  // a job runs in the repository
	RuleCheckedOut   Rule = "checked-out"  // checked out in a worktree that stays
	RuleNotMerged    Rule = "not-merged"   // its commits are not in base
	RuleAbsent       Rule = "absent"       // origin's tip is not in this clone
	RuleUnknownJob   Rule = "unknown-job"  // no record of the job on this host
	RulePending      Rule = "pending"      // the job will run again
	RuleOrphaned     Rule = "orphaned"     // recorded running, no live holder
	RuleUnshipped    Rule = "unshipped"    // the job finished but did not ship (yet)
	RuleRetained     Rule = "retained"     // within AQ_GC_WIP_RETENTION
	RuleUnknownAge   Rule = "unknown-age"  // end time unknown
	RuleLockedTree   Rule = "locked"       // `git worktree lock`ed
	RuleUnregistered Rule = "unregistered" // a directory git does not know
	RulePooled       Rule = "pooled"       // a warm worktree for the next job
)

// Decision is the plan for one candidate.
type Decision struct {
	Repo  string `json:"repo"`
	Kind  Kind   `json:"kind"`
	Where string `json:"where"` // local | origin
	// Name is the full ref name, or the worktree's path.
	Name string `json:"name"`
	// SHA is the value the ref must still have when it is deleted
	// (compare-and-swap); for a worktree, its HEAD.
	SHA    string `json:"sha,omitempty"`
	Job    string `json:"job,omitempty"`
	Action Action `json:"action"`
	// Checkpoint: save the worktree's uncommitted work (or detached HEAD) to
	// aq/wip/<job> before removing it.
	Checkpoint bool   `json:"checkpoint,omitempty"`
	Rule       Rule   `json:"rule"`
	Reason     string `json:"reason"`
}

// Decisions is a plan: one Decision per candidate, ordered by repository,
// then worktrees, local refs, origin refs, then name.
type Decisions struct {
	Items []Decision `json:"items"`
	// Disk is set when the policy has a disk ceiling.
	Disk *DiskPlan `json:"disk,omitempty"`
}

// DiskPlan is the disk ceiling's arithmetic: what aq's worktrees use
// (measured ones), the ceiling, and what is left once the plan is carried
// out. After above Max means even an empty pool would not bring it under:
// the rest is worktrees of jobs (running, or kept for a reason).
type DiskPlan struct {
	Used  int64 `json:"used"`
	Max   int64 `json:"max"`
	After int64 `json:"after"`
}

// Deletes returns the decisions that delete.
func (d Decisions) Deletes() []Decision {
	var out []Decision
	for _, x := range d.Items {
		if x.Action == Delete {
			out = append(out, x)
		}
	}
	return out
}

// WriteText writes one line per decision:
//
//	delete repo worktree /home/u/.aq/worktrees/repo/j1: job j1 shipped; no process holds it
//	keep   repo origin aq/wip/j3: job j3 failed 2d ago; kept until 2026-01-15T10:00:00Z (retention 14d)
func (d Decisions) WriteText(w io.Writer) error {
	for _, x := range d.Items {
		if _, err := fmt.Fprintf(w, "%-6s %s: %s\n", x.Action, x.Subject(), x.Reason); err != nil {
			return err
		}
	}
	return nil
}

// Subject is the candidate's repository and label ("app aq/job/x"), or
// its label alone when it is no repository's (a sandbox directory).
func (x Decision) Subject() string {
	if x.Repo == "" {
		return x.Label()
	}
	return x.Repo + " " + x.Label()
}

// Label names the candidate for people: "worktree <path>", "aq/job/x",
// "origin aq/wip/x".
func (x Decision) Label() string {
	switch x.Kind {
	case KindWorktree:
		return "worktree " + x.Name
	case KindPooled:
		return "pooled worktree " + x.Name
	case KindSandbox:
		return "sandbox directory " + x.Name
	}
	name := strings.TrimPrefix(x.Name, "refs/heads/")
	if x.Where == WhereOrigin {
		return "origin " + name
	}
	return name
}

// jobIDPattern is a job id (the manifest's rule): a ref whose last part is
// not one is not a job's.
var jobIDPattern = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$`) })

// RefJob splits a ref under refs/heads/aq/ into its kind and job id.
func RefJob(name string) (Kind, string) {
	for _, k := range []struct {
		prefix string
		kind   Kind
	}{{JobRefPrefix, KindJobBranch}, {WIPRefPrefix, KindWIPRef}} {
		if id, ok := strings.CutPrefix(name, k.prefix); ok {
			if jobIDPattern().MatchString(id) && !strings.Contains(id, "..") {
				return k.kind, id
			}
			return KindOtherRef, ""
		}
	}
	return KindOtherRef, ""
}

// Plan decides, for every ref and worktree in st, whether gc deletes it and
// why. It is pure: the same input always gives the same plan.
//
// Worktrees (only aq's, under $AQ_HOME/worktrees/<repo>/<job>):
//   - kept while the job is in flight: the repo lock is held (a job runs in
//     the repository) or a live process holds the job;
//   - kept when git does not know the directory, when it is `git worktree
//     lock`ed, or when its job is recorded running with no live holder
//     (orphan recovery checkpoints and requeues it; gc does not race it);
//   - otherwise removed; one with uncommitted work or a detached HEAD is
//     checkpointed to aq/wip/<job> first. One whose directory is gone is
//     unregistered (git worktree prune), its detached HEAD, if any, first
//     made reachable from aq/wip/<job>.
//
// Pooled worktrees (<worktrees>/.pool/<repo>/<n>, no job's; see Pool):
//   - kept while the repository's lock is held (a job may be taking one) or
//     when `git worktree lock`ed;
//   - a folder set aside by a failed discard, or one git no longer knows,
//     is deleted; one whose directory is gone is unregistered;
//   - all go when pooling is off (PoolOff), and any no job took for
//     PoolMaxAge;
//   - a repository keeps its newest PoolSize; older ones go;
//   - with a disk ceiling (DiskMax), when the worktrees that stay use more,
//     kept pooled worktrees go, oldest first across repositories, until
//     they do not (Decisions.Disk says what remains). A job's worktree is
//     never removed for the ceiling.
//
// Job branches, refs/heads/aq/job/<id>, local and on origin:
//   - kept while checked out in a worktree that stays, or while the job is in
//     flight;
//   - deleted when merged: the tip is an ancestor of base;
//   - deleted when squash-merged: its change is in base although its commits
//     are not (RefState.Squashed);
//   - otherwise kept: not merged.
//
// WIP refs, refs/heads/aq/wip/<id>, local and on origin:
//   - kept while the job is in flight;
//   - deleted when every commit is in base (merged);
//   - kept when the job is unknown to this host;
//   - deleted once the job shipped (or its job branch is merged or
//     squash-merged while it awaits review), unless the checkpoint was made
//     after the job ended (work saved later, e.g. by gc from a dirty
//     worktree): that one is treated like a failed job's;
//   - deleted once the job is terminally failed and the later of its end and
//     the checkpoint is older than the retention;
//   - otherwise kept (queued, orphaned, awaiting review, within retention).
//
// Origin refs whose tips are absent from this clone are judged only where
// no commit needs to be read: an absent job branch is kept, an absent WIP
// ref is kept (it holds work this host never saw).
//
// Sandbox directories, $AQ_HOME/sandbox/<id> (planSandboxes; they can hold
// copies of an engine's login):
//   - kept while a live process holds the job, and while the job is
//     recorded running with no live holder (recovery first, as for its
//     worktree);
//   - otherwise deleted: the run that made it did not end cleanly (a run
//     removes its own), so nothing will use it again.
//
// Anything else (a ref outside refs/heads/aq/, aq/<other>, a bad job id) is
// kept.
func Plan(now time.Time, st State, p Policy) Decisions {
	var items []Decision
	repos := slices.Clone(st.Repos)
	slices.SortStableFunc(repos, func(a, b RepoState) int { return cmp.Compare(a.Name, b.Name) })
	for _, r := range repos {
		pl := planner{now: now, p: p, repo: r, jobs: st.Jobs, removed: map[string]bool{}}
		items = append(items, pl.plan()...)
	}
	items = append(items, planSandboxes(st)...)
	d := Decisions{Items: items}
	if p.DiskMax > 0 {
		d.Disk = diskCeiling(repos, d.Items, p.DiskMax)
	}
	return d
}

// diskCeiling turns kept pooled worktrees into deletions, oldest first
// across repositories, while the worktrees that stay use more than max.
// Only pooled ones ever go for it: a job's worktree holds its work.
func diskCeiling(repos []RepoState, items []Decision, max int64) *DiskPlan {
	type key struct{ repo, path string }
	info := map[key]WorktreeState{}
	for _, r := range repos {
		for _, w := range r.Worktrees {
			info[key{r.Name, w.Path}] = w
		}
	}
	dp := &DiskPlan{Max: max}
	var pooled []int
	for i, d := range items {
		if d.Kind != KindWorktree && d.Kind != KindPooled {
			continue
		}
		b := info[key{d.Repo, d.Name}].Bytes
		dp.Used += b
		if d.Action == Keep {
			dp.After += b
			if d.Rule == RulePooled {
				pooled = append(pooled, i)
			}
		}
	}
	slices.SortStableFunc(pooled, func(a, b int) int {
		wa, wb := info[key{items[a].Repo, items[a].Name}], info[key{items[b].Repo, items[b].Name}]
		if c := wa.PooledAt.Compare(wb.PooledAt); c != 0 {
			return c
		}
		return cmp.Compare(items[a].Name, items[b].Name)
	})
	for _, i := range pooled {
		if dp.After <= max {
			break
		}
		b := info[key{items[i].Repo, items[i].Name}].Bytes
		items[i].Action, items[i].Rule = Delete, RuleDiskMax
		items[i].Reason = fmt.Sprintf("aq's worktrees use %s, over the ceiling of %s (AQ_WORKTREE_DISK_MAX): the oldest pooled ones go; this one frees %s", bytesHuman(dp.After), bytesHuman(max), bytesHuman(b))
		dp.After -= b
	}
	return dp
}

// bytesHuman prints a size in binary units: "512B", "3.0KiB", "1.5GiB".
func bytesHuman(n int64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%dB", n)
	}
	div, exp := int64(unit), 0
	for m := n / unit; m >= unit; m /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f%ciB", float64(n)/float64(div), "KMGTPE"[exp])
}

type planner struct {
	now     time.Time
	p       Policy
	repo    RepoState
	jobs    map[string]JobState
	removed map[string]bool // worktree paths this plan removes
	// landed maps a job to a job branch of it whose work is in base.
	landed map[string]RefState
}

func (pl *planner) plan() []Decision {
	pl.landed = map[string]RefState{}
	for _, refs := range [][]RefState{pl.repo.Refs, pl.repo.Remote} {
		for _, r := range refs {
			if kind, id := RefJob(r.Name); kind == KindJobBranch && !r.Absent && (r.Merged || r.Squashed != "") {
				pl.landed[id] = r
			}
		}
	}
	var wts, local, remote []Decision
	var pooled []int // kept pooled worktrees, by index in wts
	for _, w := range pl.repo.Worktrees {
		var d Decision
		if w.Pooled || w.SetAside {
			d = pl.pooled(w)
			if d.Action == Keep && d.Rule == RulePooled {
				pooled = append(pooled, len(wts))
			}
		} else {
			d = pl.worktree(w)
		}
		wts = append(wts, d)
	}
	pl.trimPool(wts, pooled)
	for _, d := range wts {
		if d.Action == Delete {
			pl.removed[d.Name] = true
		}
	}
	for _, r := range pl.repo.Refs {
		local = append(local, pl.ref(r, WhereLocal))
	}
	for _, r := range pl.repo.Remote {
		remote = append(remote, pl.ref(r, WhereOrigin))
	}
	byName := func(a, b Decision) int { return cmp.Compare(a.Name, b.Name) }
	slices.SortStableFunc(wts, byName)
	slices.SortStableFunc(local, byName)
	slices.SortStableFunc(remote, byName)
	return slices.Concat(wts, local, remote)
}

func (pl *planner) job(id string) (JobState, bool) {
	j, ok := pl.jobs[id]
	return j, ok
}

func (pl *planner) worktree(w WorktreeState) Decision {
	d := Decision{Repo: pl.repo.Name, Kind: KindWorktree, Where: WhereLocal, Name: w.Path, SHA: w.HEAD, Job: w.Job}
	keep := func(rule Rule, format string, args ...any) Decision {
		d.Action, d.Rule, d.Reason = Keep, rule, fmt.Sprintf(format, args...)
		return d
	}
	j, known := pl.job(w.Job)
	switch {
	case !jobIDPattern().MatchString(w.Job) || strings.Contains(w.Job, ".."):
		return keep(RuleNotJobRef, "its name is not a job id: aq did not make it")
	case !w.Registered:
		return keep(RuleUnregistered, "git does not know this directory as a worktree of %s; inspect it and delete it by hand", pl.repo.Name)
	case pl.repo.Locked:
		return keep(RuleRepoLocked, "a job is running in %s (its repo lock is held)", pl.repo.Name)
	case known && j.InFlight:
		return keep(RuleInFlight, "job %s is running", w.Job)
	case w.Locked:
		return keep(RuleLockedTree, "locked with `git worktree lock`")
	case known && j.Status == JobBuilding:
		return keep(RuleOrphaned, "job %s is recorded as building but no process holds it: `aq run` or `aq status` recovers it", w.Job)
	}
	d.Action = Delete
	if w.Missing {
		d.Rule, d.Reason = RuleMissing, "its directory is gone: unregister it (git worktree prune)"
		if w.Branch == "" && w.HEAD != "" {
			d.Checkpoint = true
			d.Reason += "; its detached HEAD is kept in " + strings.TrimPrefix(WIPRefPrefix, "refs/heads/") + w.Job + " first"
		}
		return d
	}
	d.Rule = RuleNotRunning
	if known {
		d.Reason = fmt.Sprintf("job %s is %s and not running", w.Job, stageName(j))
	} else {
		d.Reason = fmt.Sprintf("job %s is unknown to this host and not running", w.Job)
	}
	switch {
	case w.Dirty:
		d.Checkpoint = true
		d.Reason += "; its uncommitted work is checkpointed to " + strings.TrimPrefix(WIPRefPrefix, "refs/heads/") + w.Job + " first"
	case w.Branch == "":
		d.Checkpoint = true
		d.Reason += "; its detached HEAD is checkpointed to " + strings.TrimPrefix(WIPRefPrefix, "refs/heads/") + w.Job + " first"
	}
	return d
}

// pooled decides on a worktree of the repository's pool: kept for the next
// job, unless the pool is off, it has waited longer than PoolMaxAge, git no
// longer knows it, or it was set aside. (PoolSize and DiskMax are applied
// to the kept ones afterwards.)
func (pl *planner) pooled(w WorktreeState) Decision {
	d := Decision{Repo: pl.repo.Name, Kind: KindPooled, Where: WhereLocal, Name: w.Path, SHA: w.HEAD}
	age := pl.now.Sub(w.PooledAt)
	switch {
	case pl.repo.Locked:
		return d.keep(RuleRepoLocked, "a job is running in %s (its repo lock is held) and may be taking it", pl.repo.Name)
	case w.SetAside:
		return d.del(RuleSetAside, "set aside by aq (it could be neither reset nor removed for a job): its folder is deleted")
	case !w.Registered:
		return d.del(RuleSetAside, "git no longer knows it as a worktree of %s: its folder is deleted", pl.repo.Name)
	case w.Locked:
		return d.keep(RuleLockedTree, "locked with `git worktree lock`")
	case w.Missing:
		return d.del(RuleMissing, "its directory is gone: unregister it (git worktree prune)")
	case pl.p.PoolOff:
		return d.del(RulePoolOff, "pooling is off (AQ_WORKTREE_POOL=0)")
	case w.PooledAt.IsZero():
		return d.keep(RulePooled, "warm for the next job on %s (pooled at an unknown time)", pl.repo.Name)
	case pl.p.PoolMaxAge > 0 && age >= pl.p.PoolMaxAge:
		return d.del(RulePoolAge, "no job took it for %s (AQ_WORKTREE_POOL_MAX_AGE %s)", human(age), human(pl.p.PoolMaxAge))
	}
	return d.keep(RulePooled, "warm for the next job on %s (pooled %s ago)", pl.repo.Name, human(age))
}

// trimPool deletes the oldest kept pooled worktrees beyond PoolSize.
func (pl *planner) trimPool(wts []Decision, kept []int) {
	if pl.p.PoolSize <= 0 || len(kept) <= pl.p.PoolSize {
		return
	}
	at := map[string]time.Time{}
	for _, w := range pl.repo.Worktrees {
		at[w.Path] = w.PooledAt
	}
	slices.SortStableFunc(kept, func(a, b int) int {
		if c := at[wts[b].Name].Compare(at[wts[a].Name]); c != 0 {
			return c // newest first
		}
		return cmp.Compare(wts[a].Name, wts[b].Name)
	})
	for _, i := range kept[pl.p.PoolSize:] {
		wts[i] = wts[i].del(RulePoolFull, "%s's pool keeps %d (AQ_WORKTREE_POOL); this one is older", pl.repo.Name, pl.p.PoolSize)
	}
}

func (pl *planner) ref(r RefState, where string) Decision {
	kind, id := RefJob(r.Name)
	d := Decision{Repo: pl.repo.Name, Kind: kind, Where: where, Name: r.Name, SHA: r.SHA, Job: id}
	if !strings.HasPrefix(r.Name, "refs/heads/aq/") {
		d.Kind, d.Job = KindOtherRef, ""
		return d.keep(RuleOutsideAQ, "outside refs/heads/aq/: aq never deletes it")
	}
	switch kind {
	case KindJobBranch:
		return pl.jobBranch(d, r)
	case KindWIPRef:
		return pl.wipRef(d, r)
	}
	return d.keep(RuleNotJobRef, "not an aq/job/<id> or aq/wip/<id> ref")
}

func (x Decision) keep(rule Rule, format string, args ...any) Decision {
	x.Action, x.Rule, x.Reason = Keep, rule, fmt.Sprintf(format, args...)
	return x
}

func (x Decision) del(rule Rule, format string, args ...any) Decision {
	x.Action, x.Rule, x.Reason = Delete, rule, fmt.Sprintf(format, args...)
	return x
}

func (pl *planner) jobBranch(d Decision, r RefState) Decision {
	j, known := pl.job(d.Job)
	switch {
	case r.CheckedOut != "" && !pl.removed[r.CheckedOut]:
		return d.keep(RuleCheckedOut, "checked out in %s", r.CheckedOut)
	case known && j.InFlight:
		return d.keep(RuleInFlight, "job %s is running", d.Job)
	case r.Absent:
		return d.keep(RuleAbsent, "origin's tip %s is not in this clone: its commits cannot be checked", brief.SHA(r.SHA))
	case r.Merged:
		return d.del(RuleMerged, "merged into %s", baseName(r))
	case r.Squashed != "":
		return d.del(RuleSquashed, "squash-merged (or otherwise applied): its change is in %s (%s), though its commits are not", baseName(r), r.Squashed)
	}
	return d.keep(RuleNotMerged, "not merged into %s", baseName(r))
}

func (pl *planner) wipRef(d Decision, r RefState) Decision {
	j, known := pl.job(d.Job)
	switch {
	case known && j.InFlight:
		return d.keep(RuleInFlight, "job %s is running", d.Job)
	case r.Absent:
		return d.keep(RuleAbsent, "origin's checkpoint %s is not in this clone: it holds work this host never saw", brief.SHA(r.SHA))
	case r.Merged:
		return d.del(RuleMerged, "every commit is in %s", baseName(r))
	case !known:
		return d.keep(RuleUnknownJob, "job %s is not in this host's queue or job records", d.Job)
	}
	shipped, how := pl.shipped(d.Job, j)
	if shipped {
		// A checkpoint made after the job ended holds work that never
		// shipped: it gets a failed job's retention, counted from itself.
		if r.Time.IsZero() || j.EndedAt.IsZero() || !r.Time.After(j.EndedAt) {
			return d.del(RuleShipped, "job %s %s", d.Job, how)
		}
		return pl.retain(d, r, fmt.Sprintf("job %s %s, but this checkpoint was saved after its run ended,", d.Job, how))
	}
	switch j.Status {
	case JobFailed:
		return pl.retain(d, r, fmt.Sprintf("job %s %s", d.Job, ended(j)))
	case JobBuilding:
		return d.keep(RuleOrphaned, "job %s is recorded as building but no process holds it: its recovery resumes from this checkpoint", d.Job)
	case JobAwaiting:
		return d.keep(RuleUnshipped, "job %s is %s and not shipped yet", d.Job, stageName(j))
	}
	return d.keep(RulePending, "job %s is %s: its next run resumes from this checkpoint", d.Job, stageName(j))
}

// shipped reports whether job id counts as shipped: recorded shipped, or
// awaiting review while one of its job branches is merged into base.
func (pl *planner) shipped(id string, j JobState) (bool, string) {
	switch j.Status {
	case JobShipped:
		return true, "shipped"
	case JobAwaiting:
		if r, ok := pl.landed[id]; ok {
			return true, fmt.Sprintf("is %s and its branch is merged into %s", stageName(j), baseName(r))
		}
	}
	return false, ""
}

// retain applies the retention to a WIP ref of a job that did not ship: its
// age counts from the later of the job's end and the checkpoint itself.
func (pl *planner) retain(d Decision, r RefState, what string) Decision {
	since := later(r.Time, pl.jobs[d.Job].EndedAt)
	if since.IsZero() {
		return d.keep(RuleUnknownAge, "%s; its end time is unknown, so its retention cannot be counted", what)
	}
	age := pl.now.Sub(since)
	if age >= pl.p.WIPRetention {
		return d.del(RuleExpired, "%s %s ago; retention %s", what, human(age), human(pl.p.WIPRetention))
	}
	return d.keep(RuleRetained, "%s %s ago; kept until %s (retention %s)", what, human(age),
		since.Add(pl.p.WIPRetention).UTC().Format(time.RFC3339), human(pl.p.WIPRetention))
}

// later is the later of two times.
func later(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

// stageName says where a job is, after "is": "shipped", "in review",
// "queued", "dead-lettered", ...
func stageName(j JobState) string {
	switch j.Stage {
	case "":
	case "inbox", "queued":
		return "queued"
	case "review", "testing":
		return "in " + j.Stage
	case "dead_letter":
		return "dead-lettered"
	default:
		return j.Stage
	}
	if j.Status == JobAwaiting {
		return "awaiting review"
	}
	return string(j.Status)
}

// ended says how a job that did not ship ended, as a verb: "failed", "was
// dead-lettered".
func ended(j JobState) string {
	if j.Stage == "dead_letter" {
		return "was dead-lettered"
	}
	return "failed"
}

func baseName(r RefState) string {
	if r.Base != "" {
		return r.Base
	}
	return "base"
}

// human prints a duration the way people count retention: days, hours or
// minutes, rounded down.
func human(d time.Duration) string {
	switch {
	case d < 0:
		return "0m"
	case d >= 48*time.Hour:
		days := d / (24 * time.Hour)
		if h := (d - days*24*time.Hour) / time.Hour; h > 0 {
			return fmt.Sprintf("%dd%dh", days, h)
		}
		return fmt.Sprintf("%dd", days)
	case d >= time.Hour:
		return fmt.Sprintf("%dh", d/time.Hour)
	}
	return fmt.Sprintf("%dm", d/time.Minute)
}
