package cli

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/spf13/cobra"

	"github.com/aqfleet/aq/agent/config"
	"github.com/aqfleet/aq/agent/local"
	"github.com/aqfleet/aq/agent/queue"
	"github.com/aqfleet/aq/agent/runner"
	"github.com/aqfleet/aq/internal/aqerr"
	"github.com/aqfleet/aq/internal/hostfault"
	"github.com/aqfleet/aq/job"
)

func init() { register(newRunCmd) }

type runOptions struct {
	Once  bool
	Drain bool
	JSON  bool
	// Wait bounds the wait for a broker message (--once, --drain).
	Wait time.Duration
	// JobID accepts that one fleet job and runs it (--job).
	JobID string
	// Verbose shows the info and debug log lines on a terminal too (-v).
	Verbose bool
}

func newRunCmd(f *Factory) *cobra.Command {
	opts := &runOptions{}
	cmd := &cobra.Command{
		Use:   "run [--once | --drain | --job ID] [--wait D]",
		Short: "Take runnable jobs and run them, one at a time",
		Long: `Take the best runnable job (priority, then age) whose capabilities this host
satisfies, run it in its own worktree, record the outcome, and go on.

  --once    run one job, then exit
  --drain   run jobs until none is runnable, then exit
  (neither) keep running, waiting POLL_SECONDS between looks at an empty queue

In fleet mode (AQ_FLEET=1) jobs come from the coordinator: claimed with
POST /fleet/claim, or — when a broker is configured (AQ_SB_NAMESPACE or
AQ_SB_CONNECTION_STRING) — received from this factory's Service Bus
subscription, one message at a time, the way a replica a scaler starts for
one message works (docs/ondemand.md):

  --once    receive at most one message, run its job, report, exit
  --drain   take messages until none arrives within --wait
  --wait D  how long to wait for a message (default 30s; 0: no limit)
  --job ID  accept that one job (POST /fleet/accept), run it, exit — for a
            controller that starts one replica per job

Exit codes: 0 the job(s) succeeded, 1 a job failed (or was refused as
invalid: invalid_job, invalid_manifest), 2 usage or configuration error,
nothing was done (also: the coordinator answered with something that is not
its API's JSON — check AQ_FLEET_API), 3 no runnable job (no message within
--wait; --job: no such job to accept; or the job was parked: its engine's
rate or usage limit stopped it, and it runs again once the limit resets), 4
the job was fenced or its lease lost (--job: another factory holds it), 5
the coordinator refused this factory's credentials, 6 the coordinator
refused the job's report (a 4xx, or an answer that is not its API's JSON):
it does not have the job's outcome, which is kept in $AQ_HOME/spool/dead and
shown by aq job show.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			switch {
			case opts.Once && opts.Drain:
				return aqerr.Usagef("use one of them", "--once and --drain cannot be combined")
			case opts.JobID != "" && opts.Drain:
				return aqerr.Usagef("use --job ID alone (it runs one job)", "--job and --drain cannot be combined")
			case opts.Wait < 0:
				return aqerr.Usagef("use a positive duration such as 30s, or 0 for no limit", "--wait %s is negative", opts.Wait)
			}
			return runRun(cmd.Context(), f, opts)
		},
	}
	cmd.Flags().BoolVar(&opts.Once, "once", false, "run one job, then exit")
	cmd.Flags().BoolVar(&opts.Drain, "drain", false, "run until no job is runnable, then exit")
	cmd.Flags().DurationVar(&opts.Wait, "wait", 30*time.Second, "fleet mode with a broker: how long --once/--drain wait for a message (0: no limit)")
	cmd.Flags().StringVar(&opts.JobID, "job", "", "fleet mode: accept this one job (POST /fleet/accept), run it, then exit")
	cmd.Flags().BoolVar(&opts.JSON, "json", false, "print each job's result as a JSON line: {jobId, attempt, stage, outcome}")
	cmd.Flags().BoolVarP(&opts.Verbose, "verbose", "v", false, "on a terminal, print the info log lines above the live block too (as --log-format does)")
	return configFlags(cmd, config.GroupRepo, config.GroupFleet, config.GroupBroker, config.GroupEngine, config.GroupObserve)
}

func runRun(ctx context.Context, f *Factory, opts *runOptions) error {
	cfg, err := f.Config()
	if err != nil {
		return err
	}
	// On a terminal (stderr, no --json): the live block, with warnings and
	// errors printed above it, info and debug lines only with -v or
	// --log-format. Everything on stderr goes through the block, so the
	// screen never garbles; without a terminal nothing changes.
	var live *progress
	if f.IO.ErrTTY && !opts.JSON {
		live = newLive(f.IO.Err, cfg.LogsDir())
		f.IO.Err = live
		if !opts.Verbose && !logFormatGiven(f) {
			f.quietInfo = true
		}
		live.start()
		defer live.stop()
	}
	obs, err := f.observed()
	if err != nil {
		return err
	}
	if useFleet(cfg) { // fleet mode: jobs come from the coordinator (fleet.go)
		return runFleet(ctx, f, cfg, opts)
	}
	if opts.JobID != "" {
		return aqerr.Usagef("set AQ_FLEET=1 and AQ_FLEET_API, or run local jobs with aq run --once", "--job accepts a fleet job: it needs fleet mode")
	}
	a, err := f.Local()
	if err != nil {
		return err
	}
	a.Tracer, a.Runner.Tracer, a.Notifier = obs.Tracer(), obs.Tracer(), obs.notifier
	ids, err := a.Recover(ctx)
	if err != nil {
		// Repairs that failed for some jobs; the others can still run.
		f.Logger().Warn("the local queue needs attention", "err", err)
	}
	if len(ids) > 0 {
		f.Logger().Info("recovered orphaned jobs", "jobs", ids)
	}
	ran, failed := 0, 0
	var last *local.Result
	prog := live
	if prog == nil {
		prog = newProgress(f.IO.Err, false, f.Logger())
	}
	prog.log = f.Logger()
	a.OnEvent = prog.event
	shadow := newShadowHook(f, cfg, a) // AQ_FLEET_SHADOW=1 (fleet.go); nil when off
	for {
		fleetPick, asked := shadow.ask(ctx)
		res, err := a.RunOne(ctx)
		if res != nil {
			prog.done(res.JobID)
		}
		shadow.compare(fleetPick, asked, res, err)
		if errors.Is(err, queue.ErrNoJob) {
			switch {
			case opts.Once || (opts.Drain && ran == 0):
				return noRunnable(ctx, a, time.Now())
			case opts.Drain:
				return exitFor(last, failed)
			}
			select {
			case <-ctx.Done():
				return exitFor(last, failed)
			case <-time.After(cfg.Poll):
			}
			continue
		}
		if err != nil && res == nil {
			return err
		}
		ran++
		last = res
		if res.Outcome.Failed() && !res.Outcome.IsParked() {
			failed++
		}
		var unrecorded *queue.MovedUnrecordedError
		if errors.As(err, &unrecorded) {
			// The job moved (its manifest's folder), but $AQ_HOME took no
			// state: said in the job's one line, not as a second error.
			res.Outcome.Detail += "; $AQ_HOME could not record this (" + hostfault.Cause(unrecorded.Err) + "): the job is in " + string(unrecorded.To) + " all the same"
			err = nil
		}
		printResult(f, opts, res)
		if err != nil {
			return err
		}
		if opts.Once || ctx.Err() != nil {
			return exitFor(res, failed)
		}
	}
}

// logFormatGiven says whether the log format was chosen (--log-format,
// AQ_LOG_FORMAT): then the log lines are what the person asked for.
func logFormatGiven(f *Factory) bool {
	if f.active != nil {
		if fl := f.active.Flags().Lookup("log-format"); fl != nil && fl.Changed {
			return true
		}
	}
	return os.Getenv("AQ_LOG_FORMAT") != ""
}

// exitFor maps the run's results to the exit codes (README.md, "Exit codes").
func exitFor(last *local.Result, failed int) error {
	switch {
	case last != nil && last.Outcome.Reason == job.ReasonFenced:
		return &aqerr.Silent{Code: aqerr.Fenced}
	case failed > 0:
		return &aqerr.Silent{Code: aqerr.Failed}
	case last != nil && last.Outcome.IsParked():
		// Not a failure, and nothing ran to the end: the job waits for its
		// engine's limit to reset, as a job with nothing runnable would.
		return &aqerr.Silent{Code: aqerr.NoJob}
	}
	return nil
}

func printResult(f *Factory, opts *runOptions, r *local.Result) {
	if opts.JSON {
		_ = writeJSONLine(f.IO.Out, r) // stdout: nothing to do about a closed pipe
		return
	}
	o := r.Outcome
	if o.IsParked() {
		fmt.Fprintf(f.IO.Err, "aq: job %s parked: %s until %s (not a failure: it runs again then; `aq job requeue %s` runs it sooner): %s\n",
			r.JobID, o.Parked, clockText(o.ParkedUntil, time.Now()), r.JobID, o.Detail)
		return
	}
	if o.Failed() {
		fmt.Fprintf(f.IO.Err, "aq: job %s failed (%s): %s; it is now in %s (see `aq job show %s`)\n", r.JobID, o.Reason, o.Detail, r.Stage, r.JobID)
		return
	}
	fmt.Fprintf(f.IO.Out, "job %s: %s (%s)\n", r.JobID, r.Stage, shippedText(o))
}

// shippedText sums up a finished job for its result line: the branch and
// its diff (or "no changes"), the PR, the engine and the wall time.
func shippedText(o runner.Outcome) string {
	in := o.Insights
	what := "no changes"
	if o.Branch != "" {
		what = fmt.Sprintf("%s, %d files +%d/-%d", o.Branch, in.FilesChanged, in.LinesAdded, in.LinesDeleted)
	}
	if o.PRURL != "" {
		what += ", PR " + o.PRURL
	}
	return fmt.Sprintf("%s; engine %s, %s", what, in.Engine, time.Duration(in.WallMS)*time.Millisecond)
}

// noRunnable is exit 3's line when nothing ran: the first queued job, in
// the order aq run takes them, and why it waits — or that nothing is
// queued at all.
func noRunnable(ctx context.Context, a *local.Agent, now time.Time) error {
	const fix = "`aq status` shows what is queued and why it waits"
	entries, err := a.Queue.List()
	if err != nil {
		return aqerr.New(aqerr.NoJob, "no runnable job", fix)
	}
	host, hostErr := a.HostCaps(ctx)
	active, _ := a.Runner.Holds.Active()
	var waiting []WaitingJob
	taken := ""
	for _, e := range entries {
		if s := e.State; s.Stage == job.Inbox || s.Stage == job.Blocked {
			if w, waits := standing(a, host, hostErr, active, s, now); waits {
				waiting = append(waiting, w)
			} else if taken == "" {
				taken = s.ID
			}
		}
	}
	switch {
	case len(waiting) > 0:
		w := waiting[0]
		more := fix
		if n := len(waiting) - 1; n > 0 {
			more = fmt.Sprintf("%d more job(s) wait; %s", n, fix)
		}
		return aqerr.New(aqerr.NoJob, fmt.Sprintf("no runnable job: %s (%s) waits: %s", w.ID, w.Stage, w.Why), more)
	case taken != "":
		return aqerr.New(aqerr.NoJob, fmt.Sprintf("no runnable job: %s is runnable, but another aq took it first", taken), fix)
	}
	return aqerr.New(aqerr.NoJob, "no runnable job: nothing is queued (the inbox is empty and no job is blocked)", "`aq submit FILE.md` queues a job; `aq status` shows the others")
}
