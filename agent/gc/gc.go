// Package gc is `aq gc` (docs/gc.md): idempotent cleanup of the branches,
// WIP refs, worktrees and sandbox directories aq leaves behind, safe to run
// from cron while jobs run.
//
// It works in three steps:
//
//  1. Gather: every repository under AQ_REPO_BASE that has an aq/ ref, a
//     worktree under $AQ_HOME/worktrees/<repo>, or a job aq knows of; its
//     refs under refs/heads/aq/ (local and on origin) with what git says of
//     each tip (merged into base, squash-merged, checked out); aq's worktrees
//     (registered, missing, dirty); the repo and job locks; and what the local
//     queue and the factory's fleet job records say of every job.
//  2. Plan: plan.Plan, a pure function, decides delete or keep, with a
//     reason, for every candidate.
//  3. Execute, re-checking at the moment of each deletion: a worktree is
//     removed only while this process holds the repository's lock and the
//     job's lock is free, after its uncommitted work is checkpointed to
//     aq/wip/<job>; a ref is deleted only while it still points where the plan
//     saw it (update-ref with the old value locally, --force-with-lease on
//     origin). A job that starts between plan and act is never hurt.
package gc

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/aqfleet/aq/agent/gc/plan"
	"github.com/aqfleet/aq/agent/jobstate"
	"github.com/aqfleet/aq/agent/queue"
	"github.com/aqfleet/aq/worktree"
)

// Config is what gc needs of aq's configuration.
type Config struct {
	RepoBase     string // AQ_REPO_BASE
	WorktreesDir string // $AQ_HOME/worktrees
	LocksDir     string // $AQ_HOME/locks
	Policy       plan.Policy
	// Remote is the remote whose aq/ refs are collected too (default
	// "origin").
	Remote string
	// Offline: never contact the remote (no fetch of base branches, no
	// listing or deleting of its refs).
	Offline bool
	// SandboxDir is where the jobs' sandbox directories are
	// ($AQ_HOME/sandbox; "": none are collected).
	SandboxDir string
}

// GC collects garbage. Its fields are set once.
type GC struct {
	Cfg Config
	Git worktree.Git
	// Queue is the local queue (nil: none).
	Queue *queue.Queue
	// Records are the factory's fleet job records (nil: none).
	Records *jobstate.Store
	// Base reads a local job's base branch from its manifest (nil: a local
	// job's base is the repository's default branch).
	Base func(manifestPath string) (string, error)
	// Alive reports whether a process is alive (default: signal 0). A fleet
	// record that says running is in flight only while its process is.
	Alive func(pid int) bool
	Now   func() time.Time
	// Log gets one line per deletion at info, and warnings (a remote that
	// could not be read). nil: discarded.
	Log    *slog.Logger
	Squash worktree.SquashOptions
	// StaleCgroups removes the job cgroups of aq processes that are gone
	// (sandbox.RemoveStaleCgroups; nil: none are collected) and returns
	// what it removed.
	StaleCgroups func(alive func(pid int) bool) ([]string, error)
}

// Counts are candidates by kind.
type Counts struct {
	JobBranches int `json:"jobBranches"` // local refs/heads/aq/job/*
	WIPRefs     int `json:"wipRefs"`     // local refs/heads/aq/wip/*
	Worktrees   int `json:"worktrees"`
	RemoteRefs  int `json:"remoteRefs"` // aq/job/* and aq/wip/* on origin
	OtherRefs   int `json:"otherRefs"`  // other refs under aq/ (always kept)
	// Pooled are the pools' warm worktrees (and folders set aside there).
	Pooled int `json:"pooledWorktrees"`
	// Sandboxes are the jobs' sandbox directories ($AQ_HOME/sandbox/<id>).
	Sandboxes int `json:"sandboxDirs"`
	// Cgroups are job cgroups a crashed aq left (docs/sandbox.md, limits).
	Cgroups int `json:"cgroups,omitempty"`
}

func (c *Counts) add(d plan.Decision) {
	switch {
	case d.Kind == plan.KindWorktree:
		c.Worktrees++
	case d.Kind == plan.KindPooled:
		c.Pooled++
	case d.Kind == plan.KindSandbox:
		c.Sandboxes++
	case d.Kind == plan.KindOtherRef:
		c.OtherRefs++
	case d.Where == plan.WhereOrigin:
		c.RemoteRefs++
	case d.Kind == plan.KindJobBranch:
		c.JobBranches++
	case d.Kind == plan.KindWIPRef:
		c.WIPRefs++
	}
}

// Total is the sum of the counts.
func (c Counts) Total() int {
	return c.JobBranches + c.WIPRefs + c.Worktrees + c.RemoteRefs + c.OtherRefs + c.Pooled + c.Sandboxes + c.Cgroups
}

// Result is what became of one decision.
type Result string

const (
	Deleted     Result = "deleted"
	Kept        Result = "kept"
	WouldDelete Result = "would-delete" // --dry-run
	Failed      Result = "failed"
)

// Action is one decision of the plan and its outcome.
type Action struct {
	plan.Decision
	Result Result `json:"result"`
	// Detail says why a planned deletion did not happen (the ref moved, a
	// job started, an error), or what was checkpointed.
	Detail string `json:"detail,omitempty"`
	// CheckpointSHA is the checkpoint a removed worktree's work was saved
	// to.
	CheckpointSHA string `json:"checkpointSha,omitempty"`
}

// Report is the outcome of a run: `aq gc --json`. Field names are stable.
type Report struct {
	DryRun bool `json:"dryRun"`
	// Deleted counts what was deleted (with DryRun: what would be).
	Deleted Counts `json:"deleted"`
	// Kept counts what was kept, by the plan or because it changed since.
	Kept Counts `json:"kept"`
	// Checkpointed counts worktrees whose work was saved before removal.
	Checkpointed int `json:"checkpointed"`
	// Errors are real failures, one line each; gc exits non-zero with any.
	Errors []string `json:"errors"`
	// Warnings did not stop gc (a remote that could not be read); what
	// depended on it was kept.
	Warnings []string `json:"warnings,omitempty"`
	// Disk is the disk ceiling's arithmetic, when AQ_WORKTREE_DISK_MAX is
	// set (bytes).
	Disk *plan.DiskPlan `json:"disk,omitempty"`
	// Actions are every decision and its result.
	Actions []Action `json:"actions,omitempty"`
}

// Err is nil when the run had no errors, else an error naming them.
func (r *Report) Err() error {
	if len(r.Errors) == 0 {
		return nil
	}
	if len(r.Errors) == 1 {
		return errors.New(r.Errors[0])
	}
	return fmt.Errorf("%d errors; the first: %s", len(r.Errors), r.Errors[0])
}

func (g *GC) now() time.Time {
	if g.Now != nil {
		return g.Now()
	}
	return time.Now()
}

func (g *GC) log() *slog.Logger {
	if g.Log != nil {
		return g.Log
	}
	return slog.New(slog.DiscardHandler)
}

func (g *GC) remote() string {
	if g.Cfg.Remote != "" {
		return g.Cfg.Remote
	}
	return "origin"
}

// Run gathers, plans and — unless dryRun — executes. The error is for a
// failure to gather at all; failures of single deletions are in the report.
func (g *GC) Run(ctx context.Context, dryRun bool) (*Report, error) {
	snap, err := g.Gather(ctx)
	if err != nil {
		return nil, err
	}
	decided := plan.Plan(g.now(), snap.State, g.Cfg.Policy)
	var rep *Report
	if dryRun {
		rep = snap.dryRun(decided)
	} else {
		rep = g.Execute(ctx, snap, decided)
	}
	if d := decided.Disk; d != nil {
		rep.Disk = d
		if d.After > d.Max {
			w := fmt.Sprintf("aq's worktrees use %d bytes after this run, over AQ_WORKTREE_DISK_MAX (%d): the rest are worktrees of jobs, which gc never removes for the ceiling", d.After, d.Max)
			rep.Warnings = append(rep.Warnings, w)
			g.log().Warn("gc: " + w)
		}
	}
	return rep, nil
}

func (s *Snapshot) dryRun(decided plan.Decisions) *Report {
	r := &Report{DryRun: true, Errors: []string{}, Warnings: s.Warnings}
	for _, d := range decided.Items {
		a := Action{Decision: d, Result: Kept}
		if d.Action == plan.Delete {
			a.Result = WouldDelete
			r.Deleted.add(d)
		} else {
			r.Kept.add(d)
		}
		r.Actions = append(r.Actions, a)
	}
	return r
}
