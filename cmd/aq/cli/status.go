package cli

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/aqfleet/aq/agent/caps"
	"github.com/aqfleet/aq/agent/config"
	"github.com/aqfleet/aq/agent/holds"
	"github.com/aqfleet/aq/agent/local"
	"github.com/aqfleet/aq/agent/queue"
	"github.com/aqfleet/aq/internal/aqerr"
	"github.com/aqfleet/aq/internal/lockwait"
	"github.com/aqfleet/aq/job"
	"github.com/aqfleet/aq/worktree"
)

func init() { register(newStatusCmd) }

type statusOptions struct {
	JSON     bool
	Watch    bool
	Interval time.Duration
}

// Board is `aq status --json`. Field names are stable.
type Board struct {
	Home    string            `json:"home"`
	Counts  map[job.Stage]int `json:"counts"`
	Running []RunningJob      `json:"running"`
	// Runnable are the inbox jobs this host can run now, in the order aq
	// run takes them.
	Runnable []QueuedJob  `json:"runnable"`
	Waiting  []WaitingJob `json:"waiting"` // queued or blocked jobs that cannot run now, and why
	Failed   []FailedJob  `json:"failed"`
	Gate     []GateJob    `json:"gate"` // jobs in review or testing: the ship gate
	// Shipped are the latest shipped jobs, the most recent first (at most
	// shippedShown; Counts has them all).
	Shipped   []ShippedJob `json:"shipped"`
	Recovered []string     `json:"recovered,omitempty"` // orphans this call returned to the queue
	// Pools are the warm worktrees kept per repository for its next job.
	Pools []PoolStatus `json:"pools,omitempty"`
	// Holds are the engines held until their rate or usage limit resets:
	// their jobs wait (agent/holds).
	Holds  []holds.Hold  `json:"holds"`
	Fleet  *FleetStatus  `json:"fleet,omitempty"`  // fleet mode's jobs, spool and shadow counts (fleet.go)
	Daemon *DaemonStatus `json:"daemon,omitempty"` // aq daemon's slots, running jobs, heartbeat, source (daemon.go)
	// Coordinator is the fleet as the coordinator sees it (fleet mode
	// only): jobs per stage, factories, alerts (fleetview.go).
	Coordinator *FleetView `json:"coordinator,omitempty"`
	// Sandbox is how engines run on this host (docs/sandbox.md): the
	// running daemon's, else what AQ_SANDBOX and the host's probe give
	// here — the level, the guarantees that hold, those missing and why.
	Sandbox *caps.Sandbox `json:"sandbox,omitempty"`
}

// GateJob is a job in review or testing, waiting for `aq job ship`.
type GateJob struct {
	ID     string    `json:"id"`
	Stage  job.Stage `json:"stage"`
	Repo   string    `json:"repo"`
	Branch string    `json:"branch,omitempty"`
	PR     string    `json:"pr,omitempty"`
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
	// From the engine's log as it is written: where the run is (preparing,
	// engine, finishing), what it spent so far, and its last event.
	Phase         string  `json:"phase,omitempty"`
	Tokens        int64   `json:"tokens"`
	CostUSD       float64 `json:"costUsd"`
	CostEstimated bool    `json:"costEstimated,omitempty"`
	LastEvent     string  `json:"lastEvent,omitempty"`
}

// QueuedJob is an inbox job this host can run now.
type QueuedJob struct {
	ID       string    `json:"id"`
	Repo     string    `json:"repo"`
	Engine   string    `json:"engine"`
	Priority int       `json:"priority"`
	Attempts int       `json:"attempts"`
	Since    time.Time `json:"since"` // when it was submitted
}

// ShippedJob is a job that shipped.
type ShippedJob struct {
	ID      string    `json:"id"`
	Repo    string    `json:"repo"`
	Branch  string    `json:"branch,omitempty"`
	PR      string    `json:"pr,omitempty"`
	EndedAt time.Time `json:"endedAt,omitzero"`
}

// shippedShown bounds the shipped jobs the board lists.
const shippedShown = 10

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
	// Until is when a parked job (an engine's rate or usage limit), a job
	// in retry backoff or a job whose engine is held may run again.
	Until time.Time `json:"until,omitzero"`
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
		Long: `Show the board: jobs per stage, running jobs with their age, pid, phase,
usage and the engine's last event, the jobs aq run would take next, jobs
that wait (deps not shipped, a capability this host lacks, a retry backoff,
parked until an engine's rate or usage limit resets, an engine held) and
why, the ship gate, failed jobs with their reasons and the latest shipped
jobs, and how engines run here: the sandbox's level, the guarantees that
hold and those missing (docs/sandbox.md). Orphans of a dead aq are
recovered first (their worktrees checkpointed, the jobs requeued). In fleet mode the coordinator's view is
added: jobs per stage, factories with health and load, alerts.

--watch opens the live board (docs/board.md): refreshed every --interval,
with keys to follow a job's log (enter), requeue (r), reject (x) and ship (s)
a job after a y/n confirmation, and quit (q, Ctrl-C). Without a terminal,
--watch prints the plain board every --interval until interrupted.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			return runStatus(cmd.Context(), f, opts, cmd.Flags().Changed("interval"))
		},
	}
	cmd.Flags().BoolVar(&opts.JSON, "json", false, "print the board as JSON: {home, counts, running, runnable, waiting, failed, gate, shipped, recovered, holds, pools, fleet, daemon, coordinator, sandbox}")
	cmd.Flags().BoolVarP(&opts.Watch, "watch", "w", false, "the live board: full screen on a terminal, else the plain board every --interval")
	cmd.Flags().DurationVar(&opts.Interval, "interval", 2*time.Second, "with --watch: how often the board is refreshed (at least 200ms)")
	config.AddKeyFlags(cmd.Flags(), "sandbox")
	return configFlags(cmd, config.GroupFleet)
}

func runStatus(ctx context.Context, f *Factory, opts *statusOptions, intervalSet bool) error {
	switch {
	case intervalSet && !opts.Watch:
		return aqerr.Usagef("add --watch, or drop --interval (plain `aq status` is one snapshot)", "--interval goes with --watch")
	case opts.Watch && opts.Interval < 200*time.Millisecond:
		return aqerr.Usagef("give --interval 200ms or more, e.g. --interval 2s", "--interval %s is too short", opts.Interval)
	case opts.Watch && opts.JSON:
		return aqerr.Usagef("use `aq status --json` for a snapshot, --watch for the live board", "--json and --watch do not go together")
	}
	if opts.Watch {
		return runWatch(ctx, f, opts)
	}
	r, err := newStatusReader(f)
	if err != nil {
		return err
	}
	now := time.Now()
	b, err := r.read(ctx, now)
	if err != nil {
		return err
	}
	if opts.JSON {
		return writeJSON(f.IO.Out, b)
	}
	if err := printBoard(f, b); err != nil {
		return err
	}
	printFleetStatus(f, b.Fleet)
	printDaemonStatus(f, b.Daemon, now)
	printCoordinator(f.IO.Out, b.Coordinator)
	return nil
}

func buildBoard(ctx context.Context, f *Factory, a *local.Agent, home string, now time.Time) (*Board, error) {
	recovered, err := a.Recover(ctx)
	if lockwait.IsInterrupted(err) {
		return nil, err // Ctrl-C or SIGTERM while the queue's lock was held
	}
	if err != nil {
		// Repairs that failed for some jobs; the board shows the rest.
		f.Logger().Warn("the local queue needs attention", "err", err)
	}
	entries, err := a.Queue.List()
	if err != nil {
		return nil, err
	}
	host, hostErr := a.HostCaps(ctx)
	active, _ := a.Runner.Holds.Active()
	b := &Board{Home: home, Counts: map[job.Stage]int{}, Running: []RunningJob{}, Runnable: []QueuedJob{}, Waiting: []WaitingJob{}, Failed: []FailedJob{},
		Gate: []GateJob{}, Shipped: []ShippedJob{}, Recovered: recovered, Holds: a.Runner.Holds.List()}
	if host != nil {
		b.Sandbox = host.Sandbox
	}
	for _, st := range job.Stages {
		b.Counts[st] = 0
	}
	for _, e := range entries {
		s := e.State
		b.Counts[s.Stage]++
		switch s.Stage {
		case job.Building:
			b.Running = append(b.Running, RunningJob{ID: s.ID, Repo: s.Repo, Engine: s.Engine, Attempt: s.Attempts, Host: s.Host, PID: s.PID, StartedAt: s.StartedAt, AgeSec: int64(now.Sub(s.StartedAt).Seconds())})
		case job.Blocked, job.Inbox:
			if w, waits := standing(a, host, hostErr, active, s, now); waits {
				b.Waiting = append(b.Waiting, w)
			} else {
				b.Runnable = append(b.Runnable, QueuedJob{ID: s.ID, Repo: s.Repo, Engine: s.Engine, Priority: s.Priority, Attempts: s.Attempts, Since: s.CreatedAt})
			}
		case job.Failed, job.DeadLetter:
			b.Failed = append(b.Failed, FailedJob{ID: s.ID, Stage: s.Stage, Reason: s.Reason, Detail: s.Detail, Attempts: s.Attempts})
		case job.Review, job.Testing:
			b.Gate = append(b.Gate, GateJob{ID: s.ID, Stage: s.Stage, Repo: s.Repo, Branch: s.Branch, PR: s.PR})
		case job.Shipped:
			b.Shipped = append(b.Shipped, ShippedJob{ID: s.ID, Repo: s.Repo, Branch: s.Branch, PR: s.PR, EndedAt: shippedAt(s)})
		}
	}
	slices.SortStableFunc(b.Shipped, func(x, y ShippedJob) int { return y.EndedAt.Compare(x.EndedAt) })
	if len(b.Shipped) > shippedShown {
		b.Shipped = b.Shipped[:shippedShown]
	}
	return b, nil
}

// standing says why a queued (inbox) or blocked job does not run now on
// this host, or (waits false) that aq run would take it.
func standing(a *local.Agent, host *caps.Host, hostErr error, active map[string]holds.Hold, s queue.State, now time.Time) (w WaitingJob, waits bool) {
	w = WaitingJob{ID: s.ID, Stage: s.Stage}
	switch {
	case s.Stage == job.Blocked:
		w.Why = "waiting for its deps to ship"
		if x, err := a.Queue.Waiting(s.ID); err == nil && x.Why != "" {
			w.Why = x.Why
		}
	case s.NotBefore.After(now) && s.Parked != "":
		w.Until = s.NotBefore
		w.Why = fmt.Sprintf("parked: %s until %s (not a failure; parked %d time(s))", s.Parked, clockText(s.NotBefore, now), s.Parks)
	case s.NotBefore.After(now):
		w.Until = s.NotBefore
		w.Why = fmt.Sprintf("retry backoff until %s (attempt %d failed: %s)", s.NotBefore.Local().Format(time.TimeOnly), s.Attempts, s.Reason)
	case hostErr != nil:
		w.Why = "cannot tell whether this host can run it: " + aqerr.Message(hostErr)
	default:
		if ok, why := local.Runnable(host, s); !ok {
			w.Why = "this host cannot run it: " + why
			break
		}
		h, held := local.HeldFor(host, active, s)
		if !held {
			return w, false
		}
		w.Until = h.Until
		w.Why = fmt.Sprintf("held: %s %s until %s (met by job %s)", h.Engine, h.Why, clockText(h.Until, now), h.Job)
	}
	return w, true
}

// shippedAt is when a shipped job shipped: its last stage change.
func shippedAt(s queue.State) time.Time {
	if n := len(s.History); n > 0 {
		return s.History[n-1].At
	}
	return s.UpdatedAt
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

// clockText is t as a person reads it: "14:05" today, "Mon Jan 2 14:05"
// on another day (local time).
func clockText(t, now time.Time) string {
	lt, ln := t.Local(), now.Local()
	if lt.YearDay() == ln.YearDay() && lt.Year() == ln.Year() {
		return lt.Format("15:04")
	}
	return lt.Format("Mon Jan 2 15:04")
}

func printBoard(f *Factory, b *Board) error {
	w := f.IO.Out
	fmt.Fprintf(w, "aq home %s\n", b.Home)
	if b.Sandbox != nil {
		fmt.Fprintf(w, "sandbox %s\n", b.Sandbox.Line())
	}
	fmt.Fprintln(w)
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
		fmt.Fprintln(tw, "  JOB\tREPO\tENGINE\tATTEMPT\tPID\tAGE\tPHASE\tUSAGE\tLAST EVENT")
		for _, r := range b.Running {
			fmt.Fprintf(tw, "  %s\t%s\t%s\t%d\t%d\t%s\t%s\t%s\t%s\n", r.ID, r.Repo, r.Engine, r.Attempt, r.PID, (time.Duration(r.AgeSec) * time.Second).String(),
				orDash(r.Phase), usageCell(r.Tokens, r.CostUSD, r.CostEstimated), r.LastEvent)
		}
		tw.Flush()
	}
	if len(b.Runnable) > 0 {
		fmt.Fprintln(w, "\nrunnable (`aq run` takes them in this order):")
		for _, x := range b.Runnable {
			fmt.Fprintf(w, "  %s (inbox): repo %s, engine %s, priority %s\n", x.ID, x.Repo, orDash(x.Engine), job.PriorityName(x.Priority))
		}
	}
	if len(b.Holds) > 0 {
		fmt.Fprintln(w, "\nheld engines (their jobs wait until the limit resets):")
		for _, h := range b.Holds {
			fmt.Fprintf(w, "  %s %s until %s (met by job %s)\n", h.Engine, h.Why, clockText(h.Until, time.Now()), h.Job)
		}
	}
	if len(b.Waiting) > 0 {
		fmt.Fprintln(w, "\nwaiting:")
		for _, x := range b.Waiting {
			fmt.Fprintf(w, "  %s (%s): %s\n", x.ID, x.Stage, x.Why)
		}
	}
	if len(b.Gate) > 0 {
		fmt.Fprintln(w, "\nreview/testing (`aq job ship ID`):")
		for _, x := range b.Gate {
			fmt.Fprintf(w, "  %s (%s) %s %s\n", x.ID, x.Stage, x.Branch, x.PR)
		}
	}
	if len(b.Failed) > 0 {
		fmt.Fprintln(w, "\nfailed:")
		for _, x := range b.Failed {
			fmt.Fprintf(w, "  %s (%s, %s after %d attempts): %s\n", x.ID, x.Stage, x.Reason, x.Attempts, x.Detail)
		}
	}
	if len(b.Shipped) > 0 {
		head := "\nshipped:"
		if n := b.Counts[job.Shipped]; n > len(b.Shipped) {
			head = fmt.Sprintf("\nshipped (the latest %d of %d):", len(b.Shipped), n)
		}
		fmt.Fprintln(w, head)
		for _, x := range b.Shipped {
			fmt.Fprintf(w, "  %s %s\n", x.ID, strings.TrimSpace(x.Branch+" "+x.PR))
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
