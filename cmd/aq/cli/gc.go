package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/spf13/cobra"

	"github.com/aqfleet/aq/agent/config"
	"github.com/aqfleet/aq/agent/gc"
	"github.com/aqfleet/aq/agent/gc/plan"
	"github.com/aqfleet/aq/agent/jobstate"
	"github.com/aqfleet/aq/agent/manifest"
	"github.com/aqfleet/aq/agent/queue"
	"github.com/aqfleet/aq/internal/aqerr"
	"github.com/aqfleet/aq/internal/logging"
	"github.com/aqfleet/aq/internal/sandbox"
	"github.com/aqfleet/aq/profiles"
)

func init() { register(newGCCmd) }

type gcOptions struct {
	DryRun  bool
	JSON    bool
	Verbose bool
	Offline bool
}

func newGCCmd(f *Factory) *cobra.Command {
	opts := &gcOptions{}
	cmd := &cobra.Command{
		Use:   "gc [--dry-run] [--json]",
		Short: "Delete merged job branches, stale worktrees and old WIP refs (safe from cron)",
		Long: `Clean up what jobs leave behind, in every repository under AQ_REPO_BASE:

  - aq/job/<id> branches merged into their base, or squash-merged (their change
    is in base although their commits are not), locally and on origin;
  - worktrees under $AQ_HOME/worktrees whose job is not running (the repo lock
    is free and no live process holds the job); uncommitted work in one is
    checkpointed to aq/wip/<id> first; then git worktree prune;
  - aq/wip/<id> refs, locally and on origin, once the job shipped, or once it
    failed for good and AQ_GC_WIP_RETENTION has passed;
  - pooled worktrees ($AQ_HOME/worktrees/.pool/<repo>/<n>, kept warm for the
    next job on a repository) that no job took for AQ_WORKTREE_POOL_MAX_AGE,
    beyond AQ_WORKTREE_POOL per repository, or — oldest first — while aq's
    worktrees use more than AQ_WORKTREE_DISK_MAX; never while a job runs in
    the repository;
  - sandbox directories ($AQ_HOME/sandbox/<id>: an engine's home, with copies
    of its login) a crash left behind, once their job is neither running nor
    waiting for its recovery.

It never deletes a branch whose work is not in base (outside the WIP rule),
never touches a worktree whose job runs, and never touches a ref outside aq/.
Every deletion is a compare-and-swap on what the plan saw. Running it twice
in a row deletes nothing the second time. docs/gc.md has the whole policy.

Quiet on success: nothing is printed unless --dry-run, --json or --verbose.
Exit codes: 0 done (or nothing to do), 1 some deletion failed (each is
printed), 2 usage or configuration error.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			return runGC(cmd.Context(), f, opts)
		},
	}
	fl := cmd.Flags()
	fl.BoolVar(&opts.DryRun, "dry-run", false, "print every action gc would take and why; change nothing")
	fl.BoolVar(&opts.JSON, "json", false, "print counts as JSON: {dryRun, deleted, kept, checkpointed, errors, warnings, disk} (with --dry-run, also actions)")
	fl.BoolVarP(&opts.Verbose, "verbose", "v", false, "log each deletion to stderr")
	fl.BoolVar(&opts.Offline, "offline", false, "do not contact origin: no fetch of base branches, origin's refs left alone")
	return configFlags(cmd, config.GroupRepo, config.GroupGC)
}

func runGC(ctx context.Context, f *Factory, opts *gcOptions) error {
	cfg, err := f.Config()
	if err != nil {
		return err
	}
	g, err := newGC(f, cfg, opts)
	if err != nil {
		return err
	}
	rep, err := g.Run(ctx, opts.DryRun)
	if err != nil {
		if ctx.Err() != nil {
			return aqerr.Wrap(aqerr.Failed, err, "gc was interrupted", "run it again: it picks up where it stopped")
		}
		return aqerr.Wrap(aqerr.Failed, err, "gc: "+err.Error(), "")
	}
	if !opts.DryRun {
		rep.Actions = nil // counts only; --dry-run lists every action
	}
	switch {
	case opts.JSON:
		if err := writeJSON(f.IO.Out, rep); err != nil {
			return err
		}
	case opts.DryRun:
		printPlan(f.IO.Out, rep)
	}
	if err := rep.Err(); err != nil {
		if len(rep.Errors) > 1 { // the last line names only the first
			for _, e := range rep.Errors {
				f.Logger().Error("gc: " + e)
			}
		}
		return aqerr.Wrap(aqerr.Failed, err, "gc: "+err.Error(), "the rest was done; fix the cause and run aq gc again")
	}
	return nil
}

// newGC builds the collector from configuration. It creates nothing: a
// queue or job-record directory that does not exist is simply empty.
func newGC(f *Factory, cfg *config.Config, opts *gcOptions) (*gc.GC, error) {
	g := &gc.GC{
		Cfg: gc.Config{
			RepoBase:     cfg.RepoBase,
			WorktreesDir: cfg.WorktreesDir(),
			LocksDir:     cfg.LocksDir(),
			Policy: plan.Policy{
				WIPRetention: cfg.GCWIPRetention,
				PoolMaxAge:   cfg.WorktreePoolMaxAge,
				PoolSize:     max(cfg.WorktreePool, 0),
				PoolOff:      cfg.WorktreePool == 0,
				DiskMax:      cfg.WorktreeDiskMax,
			},
			Offline:    opts.Offline,
			SandboxDir: cfg.SandboxDir(),
		},
		Now:          time.Now,
		Log:          gcLogger(f, cfg, opts.Verbose),
		StaleCgroups: sandbox.RemoveStaleCgroups,
	}
	if exists(cfg.QueueDir()) {
		q, err := queue.Open(cfg.QueueDir())
		if err != nil {
			return nil, err
		}
		g.Queue = q
	}
	if dir := filepath.Join(cfg.StateDir(), "jobs"); exists(dir) {
		s, err := jobstate.Open(dir)
		if err != nil {
			return nil, err
		}
		g.Records = s
	}
	g.Base = manifestBase(filepath.Join(cfg.Home, "profiles"))
	return g, nil
}

// gcLogger logs deletions only with --verbose; warnings always.
func gcLogger(f *Factory, cfg *config.Config, verbose bool) *slog.Logger {
	if verbose {
		return f.Logger()
	}
	level := "warn"
	if logging.ParseLevel(cfg.LogLevel) > slog.LevelWarn {
		level = cfg.LogLevel
	}
	return logging.New(f.IO.Err, cfg.LogFormat, level, f.Redactor())
}

// manifestBase reads a queued manifest's base branch (profiles loaded once,
// on first use).
func manifestBase(profilesDir string) func(string) (string, error) {
	var (
		once sync.Once
		cat  *profiles.Catalog
		cerr error
	)
	return func(path string) (string, error) {
		once.Do(func() { cat, cerr = profiles.Load(profilesDir) })
		if cerr != nil {
			return "", cerr
		}
		j, err := manifest.ParseFile(path, cat)
		if err != nil {
			return "", err
		}
		return j.Base, nil
	}
}

func exists(p string) bool {
	_, err := os.Stat(p)
	return !errors.Is(err, fs.ErrNotExist)
}

// printPlan prints each action and its reason, then a summary.
func printPlan(w io.Writer, rep *gc.Report) {
	for _, a := range rep.Actions {
		verb := "keep"
		if a.Result == gc.WouldDelete {
			verb = "delete"
		}
		fmt.Fprintf(w, "%-6s %s: %s\n", verb, a.Subject(), a.Reason)
	}
	for _, warn := range rep.Warnings {
		fmt.Fprintf(w, "warning: %s\n", warn)
	}
	fmt.Fprintf(w, "would delete %s; keep %s\n", countsText(rep.Deleted), countsText(rep.Kept))
}

func countsText(c gc.Counts) string {
	var parts []string
	add := func(n int, one, many string) {
		if n == 1 {
			parts = append(parts, "1 "+one)
		} else if n > 1 {
			parts = append(parts, fmt.Sprintf("%d %s", n, many))
		}
	}
	add(c.JobBranches, "job branch", "job branches")
	add(c.WIPRefs, "WIP ref", "WIP refs")
	add(c.Worktrees, "worktree", "worktrees")
	add(c.Pooled, "pooled worktree", "pooled worktrees")
	add(c.RemoteRefs, "origin ref", "origin refs")
	add(c.OtherRefs, "other aq/ ref", "other aq/ refs")
	add(c.Sandboxes, "sandbox directory", "sandbox directories")
	add(c.Cgroups, "job cgroup", "job cgroups")
	if len(parts) == 0 {
		return "nothing"
	}
	return strings.Join(parts, ", ")
}
