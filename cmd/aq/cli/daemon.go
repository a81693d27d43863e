package cli

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/aqfleet/aq/agent/config"
	"github.com/aqfleet/aq/agent/daemon"
	"github.com/aqfleet/aq/agent/fleet"
	"github.com/aqfleet/aq/internal/aqerr"
)

func init() { register(newDaemonCmd) }

// daemonOptions are `aq daemon`'s own flags; its other knobs are
// configuration keys: --slots (AQ_SLOTS), --drain-timeout (AQ_DRAIN_TIMEOUT),
// --metrics-addr (AQ_METRICS_ADDR) and the fleet and Service Bus keys.
type daemonOptions struct {
	limits daemon.Limits
	// signals delivers the stop signals; nil: SIGINT and SIGTERM of this
	// process.
	signals <-chan os.Signal
}

func newDaemonCmd(f *Factory) *cobra.Command {
	opts := &daemonOptions{}
	cmd := &cobra.Command{
		Use:   "daemon [--slots N] [--drain-timeout D]",
		Short: "Run the fleet factory: enroll, heartbeat, receive or claim jobs, run up to N at once",
		Long: `Run this host as a long-running fleet factory (AQ_FLEET=1): enroll (or load
$AQ_HOME/credentials), heartbeat, recover the jobs a previous run left behind,
then take jobs — from this factory's Service Bus subscription when
AQ_SB_NAMESPACE or AQ_SB_CONNECTION_STRING is set, polling the coordinator
(gated with AQ_FLEET_GATE=1) while the broker is unreachable or not
configured — and run up to --slots of them at once, never two on one repo.

Stopping (docs/daemon.md):
  first SIGTERM/SIGINT   drain: no new work; running jobs finish and are
                         reported; exit 0 (after --drain-timeout, if set,
                         the second stage follows on its own)
  second                 running jobs are stopped through the kill ladder,
                         checkpointed (WIP refs pushed) and failed as
                         retryable so their leases free at once; exit 0
  third                  exit at once (exit 1)

With AQ_METRICS_ADDR: Prometheus /metrics and /healthz. aq status shows the
daemon's slots, running jobs, lease epochs, last heartbeat and dispatch
source from $AQ_HOME/state/daemon.json.

Limits, for a factory started for a while (a replica a scaler starts on
broker depth): each drains — no new work, running jobs finish and are
reported — and then exits 0:
  --idle-timeout D   nothing has run or arrived for D
  --max-jobs N       N jobs have started
  --max-uptime D     D after the start

Exit codes: 0 stopped by a signal or a limit; 2 configuration; 5 the
coordinator refused this factory's credentials (at start or on a later
heartbeat); 1 otherwise.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			return runDaemon(cmd.Context(), f, opts)
		},
	}
	fl := cmd.Flags()
	fl.DurationVar(&opts.limits.IdleTimeout, "idle-timeout", 0, "drain and exit 0 once nothing has run or arrived for this long (0: never)")
	fl.IntVar(&opts.limits.MaxJobs, "max-jobs", 0, "drain and exit 0 once this many jobs have started (0: no limit)")
	fl.DurationVar(&opts.limits.MaxUptime, "max-uptime", 0, "drain and exit 0 this long after the start (0: no limit)")
	return configFlags(cmd, config.GroupRepo, config.GroupFleet, config.GroupBroker, config.GroupEngine, config.GroupDaemon, config.GroupObserve)
}

func runDaemon(ctx context.Context, f *Factory, opts *daemonOptions) error {
	cfg, err := f.Config()
	if err != nil {
		return err
	}
	obs, err := f.observed()
	if err != nil {
		return err
	}
	d, err := daemon.New(daemon.Options{Config: cfg, Log: f.Logger(), Redactor: f.Redactor(), Limits: opts.limits,
		Parts: fleet.Parts{Tracer: obs.Tracer(), Notifier: obs.notifier}})
	if err != nil {
		return daemonError(err)
	}
	return superviseDaemon(ctx, f, d, opts.signals)
}

// superviseDaemon runs d until it returns, mapping stop signals to its
// stages: the first drains, the second aborts, the third returns at once.
// sigs nil: SIGINT and SIGTERM of this process.
func superviseDaemon(ctx context.Context, f *Factory, d *daemon.Daemon, sigs <-chan os.Signal) error {
	if sigs == nil {
		ch := make(chan os.Signal, 3)
		signal.Notify(ch, os.Interrupt, syscall.SIGTERM)
		defer signal.Stop(ch)
		sigs = ch
	}
	done := make(chan error, 1)
	go func() { done <- d.Run(ctx) }()
	log := f.Logger()
	n := 0
	for {
		select {
		case err := <-done:
			return daemonError(err)
		case s := <-sigs:
			n++
			switch n {
			case 1:
				log.Info("signal: draining (send it again to stop running jobs)", "signal", s.String())
				d.Drain()
			case 2:
				log.Warn("second signal: stopping running jobs (checkpoint, fail retryable); a third exits at once", "signal", s.String())
				d.Abort()
			default:
				// Returning leaves the daemon's goroutines to the process's
				// exit: this is the "exit now" the operator asked for.
				return aqerr.New(aqerr.Failed, "stopped at once on a third signal: running jobs were not checkpointed or reported",
					"the next aq daemon start recovers them; the coordinator's reaper frees their leases meanwhile")
			}
		}
	}
}

// daemonError maps the daemon's errors to exit codes (README.md, "Exit codes"): the
// fleet's typed errors as in aq run; configuration errors are already usage
// errors.
func daemonError(err error) error {
	if err == nil {
		return nil
	}
	var ae *aqerr.Error
	if errors.As(err, &ae) {
		return err
	}
	return fleetError(err)
}

// daemonStatus reads the daemon's status file for aq status (nil when no
// daemon ever ran on this home).
func daemonStatus(cfg *config.Config) *DaemonStatus {
	st, err := daemon.ReadStatus(cfg.StateDir())
	if err != nil {
		return nil
	}
	return &DaemonStatus{Status: *st, Alive: st.Alive()}
}

// DaemonStatus is the daemon section of `aq status --json`: the status file
// as the daemon wrote it, and whether its process is still there.
type DaemonStatus struct {
	daemon.Status
	// Alive is false when the daemon stopped, or its pid is gone (killed):
	// then nothing in the file is current.
	Alive bool `json:"alive"`
}

func printDaemonStatus(f *Factory, st *DaemonStatus, now time.Time) {
	if st == nil {
		return
	}
	w := f.IO.Out
	if !st.Alive {
		when := st.UpdatedAt
		if !st.StoppedAt.IsZero() {
			when = st.StoppedAt
		}
		fmt.Fprintf(w, "\ndaemon: not running (pid %d, last seen %s", st.PID, when.Local().Format(time.DateTime))
		if st.Error != "" {
			fmt.Fprintf(w, "; stopped: %s", st.Error)
		}
		fmt.Fprintln(w, ")")
		return
	}
	fmt.Fprintf(w, "\ndaemon: %s, pid %d, factory %s; slots %d/%d busy; source %s", st.Stage, st.PID, st.FactoryID, st.Busy, st.Slots, st.Source)
	if b := st.Broker; b != nil {
		state := "healthy"
		switch {
		case b.Refused != "":
			state = "refused: " + b.Refused
		case !b.Healthy:
			state = "unhealthy"
			if b.Error != "" {
				state += " (" + b.Error + ")"
			}
		}
		fmt.Fprintf(w, " (broker %s)", state)
	}
	fmt.Fprintln(w)
	hb := "never"
	if !st.LastHeartbeat.IsZero() {
		hb = fmt.Sprintf("%s ago", now.Sub(st.LastHeartbeat).Round(time.Second))
	}
	health := "healthy"
	if !st.HeartbeatHealthy {
		health = "UNHEALTHY"
	}
	fmt.Fprintf(w, "  last heartbeat %s (%s, every %gs)", hb, health, st.HeartbeatEvery)
	if st.MetricsAddr != "" {
		fmt.Fprintf(w, "; metrics http://%s/metrics", st.MetricsAddr)
	}
	fmt.Fprintln(w)
	for _, r := range st.AbsentRoutes {
		fmt.Fprintf(w, "  the coordinator has no %s: %s\n", r.Route, r.Fallback)
	}
	if len(st.Running) > 0 {
		tw := table(w)
		fmt.Fprintln(tw, "  JOB\tREPO\tEPOCH\tSOURCE\tPHASE\tAGE")
		for _, r := range st.Running {
			phase := r.Phase
			if r.WaitsFor != "" {
				phase += " (after " + r.WaitsFor + ")"
			}
			fmt.Fprintf(tw, "  %s\t%s\t%d\t%s\t%s\t%s\n", r.JobID, r.Repo, r.LeaseEpoch, r.Source, phase, now.Sub(r.AcceptedAt).Round(time.Second))
		}
		tw.Flush()
	}
}
