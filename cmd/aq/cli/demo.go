package cli

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/aqfleet/aq/agent/config"
	"github.com/aqfleet/aq/agent/dispatch"
	"github.com/aqfleet/aq/demo"
	"github.com/aqfleet/aq/demo/coord"
	"github.com/aqfleet/aq/demo/fleetdemo"
	"github.com/aqfleet/aq/demo/local"
	"github.com/aqfleet/aq/demo/scaledemo"
	"github.com/aqfleet/aq/internal/aqerr"
)

func init() { register(newDemoCmd) }

// newDemoCmd is `aq demo`: the README's main job on a fresh machine — act 1
// (the local demo) then act 2 (the fleet on one machine) — and the group of
// `aq demo local` and `aq demo coordinator`.
func newDemoCmd(f *Factory) *cobra.Command {
	o := &demoOptions{}
	cmd := &cobra.Command{
		Use:   "demo [--keep] [--dir DIR] [--local-only] [--json]",
		Short: "Run aq's offline demo: local mode, a two-factory fleet, then a pool scaled to zero",
		Long: `Run aq's main job offline, in a throw-away workspace, narrating what happens
and checking that every expected event happened. The three acts take about
45 seconds on 2 cores (measured 2026-11-27; the last line says how long this
run took); make demo on a fresh clone adds building aq and npm ci.

Act 1, local mode (the embedded default): a folder queue, two repositories,
six jobs run by a scripted engine through the real pipeline.

Act 2, the fleet on one machine: the coordinator stub, the local Service Bus
peer (when Node and its packages are installed: make sbpeer; else the gated
poll path, and the demo says so), and two factories as real aq daemon
processes with their own AQ_HOME and clones of three repos. It shows
targeted dispatch, parallel work on different repos, same-repo
serialization, a factory killed with kill -9 mid-job, the reaper reclaiming
its lease, the other factory resuming from the pushed WIP checkpoint, the
killed factory restarting as a zombie and being fenced (409), a failing job
releasing its lease at once, and aq gc cleaning up; then a summary of jobs,
attempts, lease epochs and requests made.

Act 3, scale to zero (needs the local Service Bus peer; skipped, saying so,
without it): a pool of on-demand replicas. A scaler that implements KEDA's
ScaledJob "accurate" strategy reads the pool subscription's active message
count through the management API, as KEDA does, and starts aq run --once
replicas, each with a fresh AQ_HOME and no clones. It shows zero aq
processes and zero coordinator requests while idle, a burst capped at the
scaler's maximum, a replica's host lost mid-job (kill -9, its AQ_HOME
deleted) and its job finished by another replica from the checkpoint pushed
before the loss, every replica deregistered, and idle again.

Exit 0 only if every check passed. Everything the demo starts is stopped
before it exits, also on Ctrl-C. The workspace is removed unless --keep (or
--dir) is given.

  aq demo local         act 1 alone
  aq demo scale         act 3 alone
  aq demo coordinator   run the in-memory coordinator stub (a test and demo
                        double of the fleet coordinator) to try fleet mode`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error { return runDemo(cmd.Context(), f, o) },
	}
	o.flags(cmd, true)
	local := &demoOptions{LocalOnly: true}
	localCmd := &cobra.Command{
		Use:   "local [--keep] [--dir DIR] [--json]",
		Short: "Run act 1 of the demo alone: local mode, a folder queue, no coordinator",
		Args:  cobra.NoArgs,
		RunE:  func(cmd *cobra.Command, args []string) error { return runDemo(cmd.Context(), f, local) },
	}
	local.flags(localCmd, false)
	scale := &demoOptions{ScaleOnly: true}
	scaleCmd := &cobra.Command{
		Use:   "scale [--keep] [--dir DIR] [--json]",
		Short: "Run act 3 of the demo alone: a pool of one-job replicas scaled on broker depth, from zero and back",
		Args:  cobra.NoArgs,
		RunE:  func(cmd *cobra.Command, args []string) error { return runDemo(cmd.Context(), f, scale) },
	}
	scale.flags(scaleCmd, false)
	cmd.AddCommand(localCmd, scaleCmd, newDemoCoordinatorCmd(f))
	return cmd
}

// demoOptions are `aq demo`'s (and `aq demo local`'s).
type demoOptions struct {
	Dir       string
	Keep      bool
	LocalOnly bool
	ScaleOnly bool
	JSON      bool
	// Routes is the coordinator stub's route set in act 2 (full or legacy).
	Routes string
}

func (o *demoOptions) flags(cmd *cobra.Command, full bool) {
	fl := cmd.Flags()
	fl.StringVar(&o.Dir, "dir", "", "run in this directory (new or empty; kept afterwards) instead of a temp dir")
	fl.BoolVar(&o.Keep, "keep", false, "keep the workspace (repos, AQ_HOMEs, logs) to look at afterwards")
	fl.BoolVar(&o.JSON, "json", false, "print the summary as JSON on stdout (the narration goes to stderr)")
	if full {
		fl.BoolVar(&o.LocalOnly, "local-only", false, "run act 1 (local mode) only")
		fl.StringVar(&o.Routes, "routes", coord.RoutesFull, "act 2's coordinator: full (docs/contract.md) or legacy (the coordinator in service today: no /fleet/accept, /fleet/fail)")
	}
}

// DemoSummary is `aq demo --json`: both acts' summaries. Field names are
// stable.
type DemoSummary struct {
	Workspace  string             `json:"workspace,omitempty"` // with --keep or --dir
	Kept       bool               `json:"kept"`
	Passed     bool               `json:"passed"`
	Local      *local.Summary     `json:"local,omitempty"`
	Fleet      *fleetdemo.Summary `json:"fleet,omitempty"`
	Scale      *scaledemo.Summary `json:"scale,omitempty"`
	DurationMS int64              `json:"durationMs"`
}

func runDemo(ctx context.Context, f *Factory, o *demoOptions) error {
	if o.Routes != "" && o.Routes != coord.RoutesFull && o.Routes != coord.RoutesLegacy {
		return aqerr.Usagef("use --routes full (docs/contract.md) or --routes legacy (the coordinator in service today)", "--routes %q is not a route set", o.Routes)
	}
	start := time.Now()
	out := f.IO.Out
	if o.JSON {
		out = f.IO.Err
	}
	// Kept: one workspace (a new temp dir, or --dir) holds both acts.
	// Otherwise each act makes its own temp dir and removes it.
	dir, keep := o.Dir, o.Keep || o.Dir != ""
	if dir != "" {
		if entries, err := os.ReadDir(dir); err == nil && len(entries) > 0 {
			return aqerr.Usagef("give a new or empty directory, or leave --dir out for a temp dir", "--dir %s is not empty", dir)
		}
		if abs, err := filepath.Abs(dir); err == nil {
			dir = abs
		}
	} else if keep {
		d, err := os.MkdirTemp("", "aq-demo-")
		if err != nil {
			return aqerr.Wrap(aqerr.Failed, err, "cannot make a temp dir for the demo: "+err.Error(), "check TMPDIR")
		}
		dir = d
	}
	actDir := func(name string) string {
		if !keep {
			return ""
		}
		return filepath.Join(dir, name)
	}
	sum := &DemoSummary{Workspace: dir, Kept: keep}
	passed := true
	if !o.ScaleOnly {
		acts := "1 of 3"
		if o.LocalOnly {
			acts = "1 of 1"
		}
		fmt.Fprintf(out, "━━ Act %s: local mode ━━\n\n", acts)
		ls, err := local.Run(ctx, local.Options{Dir: actDir("local"), Out: out})
		sum.Local = ls
		if err == nil && ctx.Err() != nil {
			err = context.Cause(ctx)
		}
		if err != nil {
			return demoError(ctx, err)
		}
		passed = ls.Passed()
	}
	if !o.LocalOnly && !o.ScaleOnly {
		fmt.Fprintf(out, "\n━━ Act 2 of 3: the fleet on one machine ━━\n\n")
		fs, err := fleetdemo.Run(ctx, fleetdemo.Options{Dir: actDir("fleet"), Out: out, Routes: o.Routes})
		sum.Fleet = fs
		if err != nil {
			return demoError(ctx, err)
		}
		passed = passed && fs.Passed()
	}
	if !o.LocalOnly {
		acts := "3 of 3"
		if o.ScaleOnly {
			acts = "1 of 1"
		}
		fmt.Fprintf(out, "\n━━ Act %s: scale to zero ━━\n\n", acts)
		ss, err := scaledemo.Run(ctx, scaledemo.Options{Dir: actDir("scale"), Out: out})
		sum.Scale = ss
		if err != nil {
			return demoError(ctx, err)
		}
		passed = passed && ss.Passed()
	}
	sum.Passed = passed
	sum.DurationMS = time.Since(start).Milliseconds()
	total, ok := sum.counts()
	fmt.Fprintln(out)
	if passed {
		fmt.Fprintf(out, "aq demo: all %d checks passed in %s\n", total, time.Since(start).Round(100*time.Millisecond))
	} else {
		fmt.Fprintf(out, "aq demo: %d of %d checks passed in %s\n", ok, total, time.Since(start).Round(100*time.Millisecond))
	}
	if keep {
		fmt.Fprintf(out, "workspace: %s\n", dir)
	}
	if o.JSON {
		if err := writeJSON(f.IO.Out, sum); err != nil {
			return err
		}
	}
	if !passed {
		fix := "run it again with --keep and look at the daemons' and replicas' logs in the workspace"
		if keep {
			fix = "the daemons' logs are in " + filepath.Join(dir, "fleet") + ", the replicas' in " + filepath.Join(dir, "scale", "replicas")
		}
		return aqerr.New(aqerr.Failed, fmt.Sprintf("the demo's checks failed: %d of %d passed", ok, total), fix)
	}
	return nil
}

// counts are the demo's checks in all, and how many passed.
func (s *DemoSummary) counts() (total, ok int) {
	var all []demo.Check
	if s.Local != nil {
		all = append(all, s.Local.Checks...)
	}
	if s.Fleet != nil {
		all = append(all, s.Fleet.Checks...)
	}
	if s.Scale != nil {
		all = append(all, s.Scale.Checks...)
	}
	return len(all), demo.Passed(all)
}

// demoError maps a demo that could not run (or was interrupted) to an
// error for the user.
func demoError(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return aqerr.Wrap(aqerr.Failed, err, "the demo was interrupted; everything it started was stopped", "")
	}
	return aqerr.Wrap(aqerr.Failed, err, "the demo could not run: "+err.Error(), "run it again with --keep to look at the workspace")
}

type demoCoordinatorOptions struct {
	Listen      string
	FailRate    float64
	Latency     time.Duration
	LeaseTTL    time.Duration
	StaleAfter  time.Duration
	ReapEvery   time.Duration
	MaxBackoff  time.Duration
	FaultRoutes []string
	State       string
	TokenFile   string
	// BrokerFile holds the broker's connection string (publisher.go); else
	// AQ_SB_CONNECTION_STRING, the one the factories receive with.
	BrokerFile  string
	BrokerTopic string
	// Routes is the route set: full (docs/contract.md) or legacy (the coordinator
	// in service today).
	Routes string
	// LogCapJob and LogCap bound the live log output kept, per job and in
	// all, in MiB.
	LogCapJob, LogCap int
	// Breaks are contract rules the stub breaks on purpose (coord.AllBreaks).
	Breaks []string
}

func newDemoCoordinatorCmd(f *Factory) *cobra.Command {
	o := &demoCoordinatorOptions{}
	cmd := &cobra.Command{
		Use:   "coordinator --listen 127.0.0.1:PORT [flags]",
		Short: "Run the in-memory coordinator stub (a test and demo double) for fleet mode",
		Long: `Run the in-memory coordinator stub: a test and demo double of the fleet
coordinator that serves the /fleet REST contract aq uses (docs/contract.md) with
real semantics — leases with epochs and a reaper, fenced reports, retries,
deps, idempotency keys, a queue-state version, enrollment tokens — so fleet
mode can be tried on a laptop. It prints its URL and an enrollment token.
It is not the coordinator.

  aq demo coordinator --listen 127.0.0.1:8787
  export AQ_FLEET=1 AQ_FLEET_API=http://127.0.0.1:8787/api AQ_FLEET_TOKEN=<token>
  export AQ_ENGINES=all   # to run script jobs (a fleet factory does not by default)
  aq submit job.md && aq run --once

Fault injection: --fail-rate 0.3 answers 30% of requests 503; --latency 200ms
delays each. GET /fleet/_stats counts requests per route. --state FILE keeps
the state across restarts, and the jobs' live logs and artifacts on disk
beside it (FILE.d/), bounded by --log-cap-per-job and --log-cap (the oldest
jobs' live logs go first).

With a broker (--broker-connection-string-file F, or AQ_SB_CONNECTION_STRING)
the stub also publishes a targeted Service Bus message per queued job
(MessageID jobId:epoch, application property targetFactoryId) to the factory
it picks, as the coordinator's dispatcher does; the factories' subscriptions
must exist (the local peer: node demo/sbpeer/sbpeer.js --sub fleet-dispatch/ID).
With --sb-sessions (AQ_SB_SESSIONS=1) each message carries SessionId = the
job's repo, for subscriptions that require sessions (docs/servicebus.md).

--routes legacy serves exactly the routes of the coordinator in service
today (no POST /fleet/accept, POST /fleet/fail, deregister or GET
/fleet/factories) and answers the others as it does (404 "Cannot POST
/path"): factories then fail jobs with a fenced PATCH and lease/release,
and take work over the poll path (docs/fleet.md). It publishes no dispatch
messages.

--break RULE,... makes the stub break rules of the contract on purpose, one
bug each, to see aq fleet check catch them (docs/contract.md): stale-epoch
(a stale lease epoch's write is taken), drop-checkpoint (a building PATCH
re-sent with a new checkpoint is answered 200 and dropped), resend-conflict
(a re-sent report is refused 409), ignore-not-before (a park's notBefore is
ignored and the attempt counted), double-lease (accept hands out a held
job), frozen-version (the queue-state version never moves), log-stale-epoch
(a live log chunk of a stale lease epoch is appended).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			return runDemoCoordinator(cmd.Context(), f, o)
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&o.Listen, "listen", "127.0.0.1:8787", "address to listen on (host:port; keep it on loopback)")
	fl.Float64Var(&o.FailRate, "fail-rate", 0, "share of requests answered 503 (0..1)")
	fl.DurationVar(&o.Latency, "latency", 0, "latency added to every request")
	fl.DurationVar(&o.LeaseTTL, "lease-ttl", 90*time.Second, "lease time to live")
	fl.DurationVar(&o.StaleAfter, "stale-after", 90*time.Second, "a factory is stale after this long without a heartbeat")
	fl.DurationVar(&o.ReapEvery, "reap-every", time.Second, "reaper cadence")
	fl.DurationVar(&o.MaxBackoff, "max-backoff", 0, "cap on the retry backoff after a retryable failure (0: the job's policy)")
	fl.StringSliceVar(&o.FaultRoutes, "fault-routes", nil, `limit fault injection to these routes, e.g. "POST /fleet/claim"`)
	fl.StringVar(&o.State, "state", "", "keep the state in this file across restarts")
	fl.StringVar(&o.TokenFile, "enroll-token-file", "", "file holding the enrollment token to use (default: the state file's, else a new one)")
	fl.StringVar(&o.BrokerFile, "broker-connection-string-file", "", "file holding a Service Bus connection string: publish a dispatch message per queued job (default: AQ_SB_CONNECTION_STRING, if set)")
	fl.StringVar(&o.BrokerTopic, "broker-topic", "", "topic to publish to (default: AQ_SB_TOPIC, fleet-dispatch)")
	fl.StringSliceVar(&o.Breaks, "break", nil, "contract rules to break on purpose, for aq fleet check: "+strings.Join(coord.AllBreaks, ", "))
	fl.StringVar(&o.Routes, "routes", coord.RoutesFull, "route set: full (docs/contract.md) or legacy (the coordinator in service today: no accept, fail, deregister, factories list, live log)")
	fl.IntVar(&o.LogCapJob, "log-cap-per-job", coord.DefaultLogJobCap>>20, "live log output kept per job, MiB (a job's older runs go first)")
	fl.IntVar(&o.LogCap, "log-cap", coord.DefaultLogCap>>20, "live log output kept in all, MiB (the oldest jobs' go first)")
	return configFlags(cmd, config.GroupBroker)
}

func runDemoCoordinator(ctx context.Context, f *Factory, o *demoCoordinatorOptions) error {
	if o.FailRate < 0 || o.FailRate > 1 {
		return aqerr.Usagef("use a share from 0 to 1", "--fail-rate %v is out of range", o.FailRate)
	}
	if o.Routes != coord.RoutesFull && o.Routes != coord.RoutesLegacy {
		return aqerr.Usagef("use --routes full (docs/contract.md) or --routes legacy (the coordinator in service today)", "--routes %q is not a route set", o.Routes)
	}
	if o.LogCapJob < 1 || o.LogCap < 1 || o.LogCapJob > o.LogCap {
		return aqerr.Usagef("give MiB, at least 1, the per-job cap at most the total", "--log-cap-per-job %d, --log-cap %d", o.LogCapJob, o.LogCap)
	}
	opts := coord.Options{
		LeaseTTL: o.LeaseTTL, StaleAfter: o.StaleAfter, ReapEvery: o.ReapEvery, MaxBackoff: o.MaxBackoff,
		FailRate: o.FailRate, Latency: o.Latency, FaultRoutes: o.FaultRoutes, StateFile: o.State, Log: f.Logger(),
		Routes: o.Routes, Breaks: o.Breaks, LogJobCap: int64(o.LogCapJob) << 20, LogCap: int64(o.LogCap) << 20,
	}
	for _, b := range o.Breaks {
		if !slices.Contains(coord.AllBreaks, b) {
			return aqerr.Usagef("use one of "+strings.Join(coord.AllBreaks, ", "), "--break %q is not a rule the stub can break", b)
		}
	}
	if o.TokenFile != "" {
		b, err := os.ReadFile(o.TokenFile)
		if err != nil {
			return aqerr.Usagef("check the path", "--enroll-token-file: cannot read %s", o.TokenFile)
		}
		opts.EnrollToken = strings.TrimSpace(string(b))
	}
	if o.Routes == coord.RoutesLegacy {
		if o.BrokerFile != "" {
			return aqerr.Usagef("drop --broker-connection-string-file, or use --routes full", "--routes legacy models a coordinator without a broker: it publishes no dispatch messages")
		}
	} else {
		pub, err := demoPublisher(f, o)
		if err != nil {
			return err
		}
		opts.Publisher = pub
	}
	if err := coord.Serve(ctx, o.Listen, opts, f.IO.Out); err != nil {
		return aqerr.Wrap(aqerr.Failed, err, err.Error(), "pick another --listen address")
	}
	return nil
}

// demoPublisher is the stub's Service Bus publisher, when a broker is given
// (the connection string never on the command line: a file, or the
// environment).
func demoPublisher(f *Factory, o *demoCoordinatorOptions) (*coord.Publisher, error) {
	cfg, err := f.Config()
	if err != nil {
		return nil, err // e.g. AQ_SB_SESSIONS=maybe: one line, not a publisher without sessions
	}
	cs, topic := cfg.SBConnectionString, o.BrokerTopic
	if topic == "" {
		topic = cfg.SBTopic
	}
	if o.BrokerFile != "" {
		b, err := os.ReadFile(o.BrokerFile)
		if err != nil {
			return nil, aqerr.Usagef("check the path", "--broker-connection-string-file: cannot read %s", o.BrokerFile)
		}
		cs = strings.TrimSpace(string(b))
	}
	if cs == "" {
		return nil, nil
	}
	f.Redactor().Add(dispatch.ConnectionStringSecrets(cs)...)
	pub, err := coord.NewPublisher(coord.PublisherOptions{ConnectionString: cs, Topic: topic, Sessions: cfg.SBSessions, Log: f.Logger()})
	if err != nil {
		var ae *aqerr.Error
		if errors.As(err, &ae) {
			return nil, err
		}
		return nil, aqerr.Usagef("check the broker's connection string", "%s", err.Error())
	}
	return pub, nil
}
