package cli

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/aqfleet/aq/agent/config"
	"github.com/aqfleet/aq/agent/local"
	"github.com/aqfleet/aq/job"
	"github.com/aqfleet/aq/worktree"
)

func init() { register(newStatusCmd) }

type statusOptions struct {
	JSON bool
}

// Board is `aq status --json`. Field names are stable.
type Board struct {
	Home      string            `json:"home"`
	Counts    map[job.Stage]int `json:"counts"`
	Running   []RunningJob      `json:"running"`
	Waiting   []WaitingJob      `json:"waiting"` // queued or blocked jobs that cannot run now, and why
	Failed    []FailedJob       `json:"failed"`
	Recovered []string          `json:"recovered,omitempty"` // orphans this call returned to the queue
	Pools     []PoolStatus      `json:"pools,omitempty"`     // warm worktrees kept per repository for its next job
	Fleet     *FleetStatus      `json:"fleet,omitempty"`     // fleet mode's jobs, spool and shadow counts (fleet.go)
	Daemon    *DaemonStatus     `json:"daemon,omitempty"`    // aq daemon's slots, running jobs, heartbeat, source (daemon.go)
}

// RunningJob is a job in building.
type RunningJob struct {
	ID        string    `json:"id"`
	Repo      string    `json:"repo"`
	Engine    string    `json:"engine"`
	Attempt   int       `json:"attempt"`
	Host      string    `json:"host"`
	PID       int       `json:"pid"`
	StartedAt time.Time `json:"startedAt"`
	AgeSec    int64     `json:"ageSec"`
}

// PoolStatus is one repository's pool of warm worktrees.
type PoolStatus struct {
	Repo      string `json:"repo"`
	Worktrees int    `json:"worktrees"`
}

// WaitingJob is a queued job that is not runnable now.
type WaitingJob struct {
	ID    string    `json:"id"`
	Stage job.Stage `json:"stage"`
	Why   string    `json:"why"`
}

// FailedJob is a job in failed or dead_letter.
type FailedJob struct {
	ID       string     `json:"id"`
	Stage    job.Stage  `json:"stage"`
	Reason   job.Reason `json:"reason"`
	Detail   string     `json:"detail,omitempty"`
	Attempts int        `json:"attempts"`
}

func newStatusCmd(f *Factory) *cobra.Command {
	opts := &statusOptions{}
	cmd := &cobra.Command{
		Use:   "status",
		Short: "Board: jobs per stage, running jobs, and why waiting jobs wait",
		Long: `Show the board: jobs per stage, running jobs with their age and pid, jobs that
wait (deps not shipped, a capability this host lacks, a retry backoff) and why,
and failed jobs with their reasons. Orphans of a dead aq are recovered first
(their worktrees checkpointed, the jobs requeued).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			return runStatus(cmd.Context(), f, opts)
		},
	}
	cmd.Flags().BoolVar(&opts.JSON, "json", false, "print the board as JSON: {home, counts, running, waiting, failed, recovered, pools}")
	return configFlags(cmd, config.GroupFleet)
}

func runStatus(ctx context.Context, f *Factory, opts *statusOptions) error {
	cfg, err := f.Config()
	if err != nil {
		return err
	}
	a, err := f.Local()
	if err != nil {
		return err
	}
	b, err := buildBoard(ctx, f, a, cfg.Home, time.Now())
	if err != nil {
		return err
	}
	b.Pools = poolStatus(cfg.WorktreesDir())
	b.Fleet = fleetStatus(cfg, time.Now())
	b.Daemon = daemonStatus(cfg)
	if opts.JSON {
		return writeJSON(f.IO.Out, b)
	}
	if err := printBoard(f, b); err != nil {
		return err
	}
	printFleetStatus(f, b.Fleet)
	printDaemonStatus(f, b.Daemon, time.Now())
	return nil
}

func buildBoard(ctx context.Context, f *Factory, a *local.Agent, home string, now time.Time) (*Board, error) {
	recovered, err := a.Recover(ctx)
	if err != nil {
		// Repairs that failed for some jobs; the board shows the rest.
		f.Logger().Warn("the local queue needs attention", "err", err)
	}
	entries, err := a.Queue.List()
	if err != nil {
		return nil, err
	}
	host, hostErr := a.HostCaps(ctx)
	b := &Board{Home: home, Counts: map[job.Stage]int{}, Running: []RunningJob{}, Waiting: []WaitingJob{}, Failed: []FailedJob{}, Recovered: recovered}
	for _, st := range job.Stages {
		b.Counts[st] = 0
	}
	for _, e := range entries {
		s := e.State
		b.Counts[s.Stage]++
		switch s.Stage {
		case job.Building:
			b.Running = append(b.Running, RunningJob{ID: s.ID, Repo: s.Repo, Engine: s.Engine, Attempt: s.Attempts, Host: s.Host, PID: s.PID, StartedAt: s.StartedAt, AgeSec: int64(now.Sub(s.StartedAt).Seconds())})
		case job.Blocked:
			why := "waiting for its deps to ship"
			if w, err := a.Queue.Waiting(s.ID); err == nil && w.Why != "" {
				why = w.Why
			}
			b.Waiting = append(b.Waiting, WaitingJob{ID: s.ID, Stage: s.Stage, Why: why})
		case job.Inbox:
			if s.NotBefore.After(now) {
				b.Waiting = append(b.Waiting, WaitingJob{ID: s.ID, Stage: s.Stage, Why: fmt.Sprintf("retry backoff until %s (attempt %d failed: %s)", s.NotBefore.Local().Format(time.TimeOnly), s.Attempts, s.Reason)})
				continue
			}
			if hostErr != nil {
				continue
			}
			if ok, why := local.Runnable(host, s); !ok {
				b.Waiting = append(b.Waiting, WaitingJob{ID: s.ID, Stage: s.Stage, Why: "this host cannot run it: " + why})
			}
		case job.Failed, job.DeadLetter:
			b.Failed = append(b.Failed, FailedJob{ID: s.ID, Stage: s.Stage, Reason: s.Reason, Detail: s.Detail, Attempts: s.Attempts})
		}
	}
	return b, nil
}

// poolStatus counts the warm worktrees in each repository's pool.
func poolStatus(worktreesDir string) []PoolStatus {
	repos, err := os.ReadDir(filepath.Join(worktreesDir, worktree.PoolDirName))
	if err != nil {
		return nil
	}
	var out []PoolStatus
	for _, r := range repos {
		if !r.IsDir() {
			continue
		}
		pooled, err := worktree.Pool{Dir: worktree.PoolDir(worktreesDir, r.Name())}.List()
		if err == nil && len(pooled) > 0 {
			out = append(out, PoolStatus{Repo: r.Name(), Worktrees: len(pooled)})
		}
	}
	return out
}

func printBoard(f *Factory, b *Board) error {
	w := f.IO.Out
	fmt.Fprintf(w, "aq home %s\n\n", b.Home)
	tw := table(w)
	for _, st := range job.Stages {
		fmt.Fprintf(tw, "%s\t%d\n", st, b.Counts[st])
	}
	tw.Flush()
	if len(b.Recovered) > 0 {
		fmt.Fprintf(w, "\nrecovered (aq had died; checkpointed and requeued): %v\n", b.Recovered)
	}
	if len(b.Running) > 0 {
		fmt.Fprintln(w, "\nrunning:")
		tw = table(w)
		fmt.Fprintln(tw, "  JOB\tREPO\tENGINE\tATTEMPT\tPID\tAGE")
		for _, r := range b.Running {
			fmt.Fprintf(tw, "  %s\t%s\t%s\t%d\t%d\t%s\n", r.ID, r.Repo, r.Engine, r.Attempt, r.PID, (time.Duration(r.AgeSec) * time.Second).String())
		}
		tw.Flush()
	}
	if len(b.Waiting) > 0 {
		fmt.Fprintln(w, "\nwaiting:")
		for _, x := range b.Waiting {
			fmt.Fprintf(w, "  %s (%s): %s\n", x.ID, x.Stage, x.Why)
		}
	}
	if len(b.Failed) > 0 {
		fmt.Fprintln(w, "\nfailed:")
		for _, x := range b.Failed {
			fmt.Fprintf(w, "  %s (%s, %s after %d attempts): %s\n", x.ID, x.Stage, x.Reason, x.Attempts, x.Detail)
		}
	}
	if len(b.Pools) > 0 {
		var parts []string
		for _, p := range b.Pools {
			parts = append(parts, fmt.Sprintf("%s %d", p.Repo, p.Worktrees))
		}
		fmt.Fprintf(w, "\nwarm worktrees (the next job on the repository resets one): %s\n", strings.Join(parts, ", "))
	}
	return nil
}
