package cli

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"sync"
	"time"

	"github.com/aqfleet/aq/agent/config"
	"github.com/aqfleet/aq/agent/daemon"
	"github.com/aqfleet/aq/agent/fleet"
	"github.com/aqfleet/aq/agent/jobstate"
	"github.com/aqfleet/aq/agent/local"
	"github.com/aqfleet/aq/agent/manifest"
	"github.com/aqfleet/aq/agent/queue"
	"github.com/aqfleet/aq/internal/aqerr"
	"github.com/aqfleet/aq/internal/hostfault"
	"github.com/aqfleet/aq/job"
	"github.com/aqfleet/aq/profiles"
)

// Fleet mode in the CLI: `aq run` and `aq submit` against the coordinator,
// shadow mode beside the local queue, and the fleet section of `aq status`.

// useFleet reports whether jobs come from the coordinator: AQ_FLEET=1 with
// AQ_FLEET_ROUTE=1 (the default). Shadow mode (AQ_FLEET_SHADOW=1) keeps the
// local queue deciding.
func useFleet(cfg *config.Config) bool { return cfg.Fleet && cfg.FleetRoute && !cfg.FleetShadow }

// fleetRouted is useFleet for commands that load the configuration later.
func fleetRouted(f *Factory) bool {
	cfg, err := f.Config()
	return err == nil && useFleet(cfg)
}

func checkFleetConfig(cfg *config.Config) error {
	if cfg.FleetAPI == "" {
		return aqerr.Usagef("set AQ_FLEET_API to the coordinator's URL (aq demo coordinator prints one), or AQ_FLEET=0 for the local queue", "fleet mode (AQ_FLEET=1) needs AQ_FLEET_API")
	}
	return nil
}

// runFleet is `aq run [--once|--drain]` in fleet mode.
func runFleet(ctx context.Context, f *Factory, cfg *config.Config, opts *runOptions) error {
	if err := checkFleetConfig(cfg); err != nil {
		return err
	}
	if opts.JobID == "" && (cfg.SBNamespace != "" || cfg.SBConnectionString != "") {
		return runFleetBroker(ctx, f, cfg, opts)
	}
	obs, err := f.observed()
	if err != nil {
		return err
	}
	a, err := fleet.New(cfg, f.Logger(), f.Redactor(), fleet.Parts{Tracer: obs.Tracer(), Notifier: obs.notifier})
	if err != nil {
		return err
	}
	var t fleetTally
	err = a.Run(ctx, fleet.RunOptions{Once: opts.Once, Drain: opts.Drain, JobID: opts.JobID}, func(r *fleet.Result) { t.add(f, opts, r) })
	if err != nil {
		if opts.JobID != "" {
			return acceptError(opts.JobID, err)
		}
		return fleetError(err)
	}
	return t.exit()
}

// runFleetBroker is `aq run` in fleet mode with a broker: a one-slot daemon
// (agent/daemon) whose limits make it a replica — --once drains after the
// first job starts, --once and --drain drain once no message arrived within
// --wait — with the daemon's stopping stages on signals. Nothing received
// within --wait is exit 3: a replica started for a message another replica
// took exits promptly and cleanly. A coordinator without POST /fleet/accept
// (today's) makes the daemon refuse the broker path at start (one warning):
// the same replica then claims over the poll path, within the same --wait.
func runFleetBroker(ctx context.Context, f *Factory, cfg *config.Config, opts *runOptions) error {
	one := *cfg
	one.Slots = 1
	var lim daemon.Limits
	if opts.Once || opts.Drain {
		lim.IdleTimeout = opts.Wait
	}
	if opts.Once {
		lim.MaxJobs = 1
	}
	var (
		mu sync.Mutex
		t  fleetTally
	)
	obs, err := f.observed()
	if err != nil {
		return err
	}
	d, err := daemon.New(daemon.Options{Config: &one, Log: f.Logger(), Redactor: f.Redactor(), Limits: lim,
		Parts:               fleet.Parts{Tracer: obs.Tracer(), Notifier: obs.notifier},
		RequireSubscription: opts.Once || opts.Drain,
		OnResult: func(r *fleet.Result) {
			mu.Lock()
			defer mu.Unlock()
			t.add(f, opts, r)
		}})
	if err != nil {
		return daemonError(err)
	}
	if err := superviseDaemon(ctx, f, d, nil); err != nil {
		return err
	}
	mu.Lock()
	defer mu.Unlock()
	if t.ran == 0 && (opts.Once || opts.Drain) && ctx.Err() == nil {
		if d.BrokerRefused() {
			return aqerr.New(aqerr.NoJob, fmt.Sprintf("no job was claimed within --wait %s (the coordinator has no POST /fleet/accept: the poll path ran instead of the broker)", opts.Wait),
				"`aq status` shows this factory's fleet state; the coordinator decides what it may run")
		}
		return aqerr.New(aqerr.NoJob, fmt.Sprintf("no job arrived from the broker within --wait %s", opts.Wait),
			"nothing is lost: a message another replica took is that replica's; `aq status` shows this factory's fleet state")
	}
	return t.exit()
}

// fleetTally counts a fleet run's results for its exit code.
type fleetTally struct {
	ran, failed int
	// refused counts jobs whose report the coordinator refused for good.
	refused int
	last    *fleet.Result
}

func (t *fleetTally) add(f *Factory, opts *runOptions, r *fleet.Result) {
	t.ran++
	t.last = r
	if r.Outcome.Failed() && !r.Outcome.IsParked() {
		t.failed++
	}
	if r.ReportRefused != "" {
		t.refused++
	}
	printFleetResult(f, opts, r)
}

// acceptError is fleetError for --job: a 409 is a job held by another
// factory or not queued (exit 4), a 404 no such job to accept (exit 3).
func acceptError(id string, err error) error {
	var fe *fleet.FencedError
	switch {
	case errors.As(err, &fe):
		why := "it is not queued"
		if fe.Detail != "" {
			why = fe.Detail
		}
		return aqerr.Wrap(aqerr.Fenced, err, fmt.Sprintf("job %s cannot be accepted (the coordinator answered 409: %s)", id, why),
			"nothing was run: another factory holds it, or it already ran; the coordinator decides who runs it")
	case errors.Is(err, fleet.ErrGone):
		return aqerr.Wrap(aqerr.NoJob, err, fmt.Sprintf("the coordinator has no job %s to accept (404)", id),
			"check the id with the coordinator; a job that already finished cannot be accepted again")
	case routeAbsent(err, fleet.RouteAccept):
		return aqerr.Wrap(aqerr.Usage, err, fmt.Sprintf("aq run --job %s needs POST /fleet/accept, which this coordinator does not have (today's coordinator)", id),
			"nothing was run; use aq run --once to claim the next job this factory can run")
	}
	return fleetError(err)
}

// routeAbsent reports whether err says the coordinator lacks route.
func routeAbsent(err error, route string) bool {
	var ra *fleet.RouteAbsentError
	return errors.As(err, &ra) && ra.Call == route
}

func (t *fleetTally) exit() error {
	last, failed := t.last, t.failed
	switch {
	case last != nil && (last.Fenced || last.Outcome.Reason == job.ReasonLeaseLost):
		// Lease lost counts as fenced (docs/contract.md, "Leases and fencing"): another factory may own it.
		return &aqerr.Silent{Code: aqerr.Fenced}
	case t.refused > 0:
		// A job ran (or was stopped before its engine) and the
		// coordinator refused its report: not 0, and not "the job failed".
		return &aqerr.Silent{Code: aqerr.ReportRefused}
	case failed > 0:
		return &aqerr.Silent{Code: aqerr.Failed}
	case last != nil && last.Outcome.IsParked():
		return &aqerr.Silent{Code: aqerr.NoJob} // released until the limit resets: not a failure
	}
	return nil
}

// fleetError maps the fleet package's typed errors to exit codes.
func fleetError(err error) error {
	var (
		ae  *fleet.AuthError
		ce  *fleet.CredentialsError
		te  *fleet.TransientError
		ra  *fleet.RouteAbsentError
		ctr *fleet.ContractError
	)
	switch {
	case errors.Is(err, fleet.ErrNoJob):
		return aqerr.Wrap(aqerr.NoJob, err, "no runnable job in the fleet", "`aq status` shows this factory's fleet state; the coordinator decides what it may run")
	case errors.As(err, &ae):
		return aqerr.Wrap(aqerr.AuthFail, err, ae.Error(), ae.Fix())
	case errors.As(err, &ce):
		return aqerr.Wrap(aqerr.Usage, err, ce.Error(), ce.Fix)
	case hostfault.Is(err):
		return aqerr.Wrap(aqerr.Failed, err, err.Error()+"; no job was taken",
			"free space on $AQ_HOME's file system, or make it writable (or set AQ_HOME to one that is): docs/troubleshooting.md#host_unavailable")
	case errors.As(err, &ctr):
		// Nothing ran: a claim, an accept or an enrollment answered with
		// something that is not the contract's.
		return aqerr.Wrap(aqerr.Usage, err, ctr.Error(), ctr.Fix())
	case errors.As(err, &te):
		return aqerr.Wrap(aqerr.Failed, err, te.Error(), "check AQ_FLEET_API and that the coordinator is up; reports are kept in $AQ_HOME/spool and re-sent")
	case errors.As(err, &ra) && !ra.Optional():
		return aqerr.Wrap(aqerr.Usage, err, fmt.Sprintf("the coordinator at AQ_FLEET_API has no %s route", ra.Call),
			"check AQ_FLEET_API: it is the coordinator's base URL, e.g. https://host/api (aq demo coordinator prints one)")
	}
	return err
}

// leaseLostText says exactly what became of a job whose lease was lost:
// what is on origin and what the coordinator was told. docs/fleet.md
// ("Lease lost") and docs/troubleshooting.md quote it.
func leaseLostText(r *fleet.Result) string {
	o := r.Outcome
	id := job.Show(r.JobID)
	work := fmt.Sprintf("its work is checkpointed on aq/wip/%s on this host, not pushed (the lease may be another factory's)", id)
	switch {
	case o.Checkpoint == "":
		work = "no checkpoint was taken"
	case o.WIPPushed:
		work = fmt.Sprintf("its work is checkpointed and pushed to origin's aq/wip/%s", id)
	}
	if !o.WIPPushed && o.OriginCheckpoint != "" {
		work += fmt.Sprintf("; origin keeps the earlier checkpoint %s", shortSHA(o.OriginCheckpoint))
	}
	told := map[string]string{
		"delivered": "the coordinator was told (/fleet/fail lease_lost, report delivered) and has the job in " + string(r.Stage),
		"spooled":   "its /fleet/fail (lease_lost) is spooled in $AQ_HOME/spool and is re-sent until the coordinator takes it",
	}[r.Report]
	if told == "" {
		told = "its /fleet/fail (lease_lost) was not taken (report " + r.Report + ")"
	}
	return work + "; nothing else was pushed; " + told
}

func shortSHA(s string) string {
	if len(s) > 12 {
		return s[:12]
	}
	return s
}

// endText is how a job ended, for a line that goes on to its report.
func endText(r *fleet.Result) string {
	o := r.Outcome
	switch {
	case o.Reason == job.ReasonReportRefused:
		return "was stopped before its engine"
	case o.Failed():
		return fmt.Sprintf("failed (%s: %s)", o.Reason, job.Printable(o.Detail, false))
	}
	return fmt.Sprintf("ended %s (%s)", o.Stage, shippedText(o))
}

func printFleetResult(f *Factory, opts *runOptions, r *fleet.Result) {
	if opts.JSON {
		_ = writeJSONLine(f.IO.Out, r) // stdout: nothing to do about a closed pipe
		return
	}
	o := r.Outcome
	id, detail := job.Show(r.JobID), job.Printable(o.Detail, false)
	switch {
	case r.ReportRefused != "":
		fmt.Fprintf(f.IO.Err, "aq: job %s %s, but the coordinator refused its report: %s; the coordinator does not have the job's outcome (`aq job show %s`)\n",
			id, endText(r), job.Printable(r.ReportRefused, false), id)
	case r.Refused:
		fmt.Fprintf(f.IO.Err, "aq: job %s refused (%s): %s; nothing of it ran here; the coordinator has it in %s (report %s)\n", id, o.Reason, detail, r.Stage, r.Report)
	case o.Reason == job.ReasonLeaseLost && !r.Fenced:
		fmt.Fprintf(f.IO.Err, "aq: job %s lost its lease (lease_lost): %s; %s\n", id, detail, leaseLostText(r))
	case r.Fenced || o.Reason == job.ReasonLeaseLost:
		fmt.Fprintf(f.IO.Err, "aq: job %s stopped (%s): %s; nothing was pushed or reported for it; its work is checkpointed locally on aq/wip/%s\n", id, o.Reason, detail, id)
	case o.IsParked():
		fmt.Fprintf(f.IO.Err, "aq: job %s parked: %s until %s (not a failure: its lease is released for that long, report %s): %s\n",
			id, o.Parked, clockText(o.ParkedUntil, time.Now()), r.Report, detail)
	case o.Failed():
		fmt.Fprintf(f.IO.Err, "aq: job %s failed (%s): %s; the coordinator has it in %s (report %s)\n", id, o.Reason, detail, r.Stage, r.Report)
	default:
		fmt.Fprintf(f.IO.Out, "job %s: %s (%s; epoch %d, report %s)\n", id, r.Stage, shippedText(o), r.LeaseEpoch, r.Report)
	}
}

// runFleetSubmit is `aq submit` in fleet mode: every manifest is validated
// locally first (nothing is posted if one is bad), then posted as
// {manifest, bodyMd, idempotencyKey} to POST /fleet/jobs.
func runFleetSubmit(ctx context.Context, f *Factory, opts *submitOptions) error {
	cfg, err := f.Config()
	if err != nil {
		return err
	}
	if err := checkFleetConfig(cfg); err != nil {
		return err
	}
	cat, err := profiles.Load(filepath.Join(cfg.Home, "profiles"))
	if err != nil {
		return err
	}
	ms, err := readManifests(f, opts.Files, func(file string, raw []byte) (*job.Job, error) {
		j, err := manifest.Parse(file, raw, cat)
		if err != nil {
			return nil, err
		}
		// What every factory would refuse (a repo by URL or path) is
		// refused here, before it is posted.
		if ref := manifest.Check(j, manifest.Policy{Fleet: true}); ref != nil {
			return nil, manifest.Errors{{File: file, Msg: ref.Msg}}
		}
		return j, nil
	})
	if err != nil {
		return err
	}
	c, err := fleet.NewClientFromConfig(cfg, f.Logger(), f.Redactor(), nil, nil)
	if err != nil {
		return err
	}
	if _, err := fleet.EnsureEnrolled(ctx, c, fleet.EnrollOptions{Path: cfg.CredentialsFile(), EnvToken: cfg.FleetToken, NoEnroll: true, Log: f.Logger()}); err != nil {
		return fleetError(err)
	}
	where := func(s job.Stage) string { return "the fleet (" + s.FleetName() + ")" }
	return submitEach(f, opts, ms, where, func(m manifestFile) (submitted, error) {
		if opts.Replace {
			r, err := c.ReplaceJob(ctx, m.j, m.raw)
			if err == nil {
				stage := job.StageFromFleet(r.Stage)
				if r.Stage == "" {
					stage = job.Inbox
				}
				return submitted{ID: r.JobID, Stage: stage, File: m.file, Replaced: orDash(r.Replaced)}, nil
			}
			if !errors.Is(err, fleet.ErrGone) {
				err = jobOpError(m.j.ID, "replace", err)
				return submitted{}, aqerr.Wrap(aqerr.ExitCode(err), err, m.file+": "+aqerr.Message(err), "")
			}
			// The coordinator has no such job: this manifest is a new one.
		}
		a, err := c.Submit(ctx, m.j, m.raw)
		if err != nil {
			err = fleetError(err)
			return submitted{}, aqerr.Wrap(aqerr.ExitCode(err), err, m.file+": "+aqerr.Message(err), "")
		}
		stage := job.StageFromFleet(a.Stage)
		if a.Stage == "" {
			stage = job.Inbox
		}
		if a.Duplicate && a.JobID != m.j.ID {
			fmt.Fprintf(f.IO.Err, "aq: %s: job %s duplicates job %s in the fleet (idempotencyKey %q); not submitted again\n", m.file, m.j.ID, a.JobID, m.j.IdempotencyKey)
		}
		return submitted{ID: a.JobID, Stage: stage, File: m.file}, nil
	})
}

// shadowHook is shadow mode in the local `aq run` loop; nil when off.
type shadowHook struct{ s *fleet.Shadow }

// newShadowHook returns the hook when AQ_FLEET=1 and AQ_FLEET_SHADOW=1.
func newShadowHook(f *Factory, cfg *config.Config, a *local.Agent) *shadowHook {
	if !cfg.Fleet || !cfg.FleetShadow {
		return nil
	}
	log := f.Logger()
	c, err := fleet.NewClientFromConfig(cfg, log, f.Redactor(), nil, nil)
	if err != nil {
		log.Warn("shadow: off", "err", err)
		return nil
	}
	return &shadowHook{s: &fleet.Shadow{
		Client: c, Path: fleet.ShadowFile(cfg.StateDir()), Log: log,
		Prepare: func(ctx context.Context) error {
			host, err := a.HostCaps(ctx)
			if err != nil {
				return err
			}
			c.SetOffer(host.Tokens(), host.Repos)
			_, err = fleet.EnsureEnrolled(ctx, c, fleet.EnrollOptions{Path: cfg.CredentialsFile(), EnvToken: cfg.FleetToken, Log: log,
				Request: fleet.EnrollRequest{FactoryID: cfg.FactoryID, Capabilities: host.Tokens(), Repos: host.Repos, SeatLimit: cfg.Slots}})
			return err
		},
	}}
}

// ask is the coordinator's pick before the local queue picks.
func (h *shadowHook) ask(ctx context.Context) (string, bool) {
	if h == nil {
		return "", false
	}
	return h.s.Ask(ctx)
}

// compare logs AGREE or DIVERGE for the local pick that RunOne made.
func (h *shadowHook) compare(fleetPick string, ok bool, res *local.Result, err error) {
	if h == nil || !ok {
		return
	}
	localPick := fleet.None
	switch {
	case res != nil:
		localPick = res.JobID
	case errors.Is(err, queue.ErrNoJob):
	default:
		return // the local run failed before picking: nothing to compare
	}
	h.s.Compare(localPick, fleetPick)
}

// FleetStatus is the fleet section of `aq status --json`. Field names are
// stable.
type FleetStatus struct {
	Mode      string              `json:"mode"` // fleet | shadow | local
	API       string              `json:"api,omitempty"`
	FactoryID string              `json:"factoryId,omitempty"`
	Enrolled  bool                `json:"enrolled"`
	Running   []FleetJob          `json:"running"`
	Recent    []FleetJob          `json:"recent"`
	Spool     int                 `json:"spool"`     // reports waiting to be re-sent
	SpoolDead int                 `json:"spoolDead"` // reports the coordinator refused for good
	Shadow    *fleet.ShadowCounts `json:"shadow,omitempty"`
}

// FleetJob is one job from this factory's records ($AQ_HOME/state/jobs).
type FleetJob struct {
	ID         string     `json:"id"`
	Repo       string     `json:"repo"`
	Stage      job.Stage  `json:"stage"`
	Reason     job.Reason `json:"reason,omitempty"`
	LeaseEpoch int64      `json:"leaseEpoch"`
	Fenced     bool       `json:"fenced,omitempty"`
	Engine     string     `json:"engine,omitempty"`
	PID        int        `json:"pid,omitempty"`
	AgeSec     int64      `json:"ageSec"`
}

// fleetStatus gathers the fleet section; nil when fleet mode never ran here.
func fleetStatus(cfg *config.Config, now time.Time) *FleetStatus {
	st := &FleetStatus{Mode: "local", API: cfg.FleetAPI, Running: []FleetJob{}, Recent: []FleetJob{}}
	switch {
	case cfg.Fleet && cfg.FleetShadow:
		st.Mode = "shadow"
	case useFleet(cfg):
		st.Mode = "fleet"
	}
	if c, err := fleet.LoadCredentials(cfg.CredentialsFile()); err == nil {
		st.Enrolled, st.FactoryID = true, c.FactoryID
	}
	if c, err := fleet.LoadShadowCounts(fleet.ShadowFile(cfg.StateDir())); err == nil {
		st.Shadow = c
	}
	if dir := cfg.SpoolDir(); exists(dir) {
		if sp, err := fleet.OpenSpool(dir); err == nil {
			st.Spool, st.SpoolDead = sp.Depth(), len(sp.Dead())
		}
	}
	var recs []jobstate.Record
	if dir := filepath.Join(cfg.StateDir(), "jobs"); exists(dir) {
		if s, err := jobstate.Open(dir); err == nil {
			recs, _ = s.List()
		}
	}
	for _, r := range recs {
		fj := FleetJob{ID: r.ID, Repo: r.Repo, Stage: r.Stage, Reason: r.Reason, LeaseEpoch: r.LeaseEpoch, Fenced: r.Fenced, Engine: r.Engine, PID: r.PID}
		if r.Running() {
			fj.AgeSec = int64(now.Sub(r.StartedAt).Seconds())
			st.Running = append(st.Running, fj)
		} else {
			fj.AgeSec = int64(now.Sub(r.EndedAt).Seconds())
			st.Recent = append(st.Recent, fj)
		}
	}
	if !cfg.Fleet && !st.Enrolled && st.Shadow == nil && len(recs) == 0 && st.Spool == 0 {
		return nil
	}
	return st
}

func printFleetStatus(f *Factory, st *FleetStatus) {
	if st == nil {
		return
	}
	w := f.IO.Out
	enrolled := "not enrolled"
	if st.Enrolled {
		enrolled = "enrolled as " + st.FactoryID
	}
	fmt.Fprintf(w, "\nfleet: %s mode, %s", st.Mode, enrolled)
	if st.API != "" {
		fmt.Fprintf(w, ", coordinator %s", st.API)
	}
	fmt.Fprintf(w, "; spool %d waiting, %d refused\n", st.Spool, st.SpoolDead)
	if len(st.Running) > 0 {
		tw := table(w)
		fmt.Fprintln(tw, "  RUNNING\tREPO\tEPOCH\tENGINE\tPID\tAGE")
		for _, r := range st.Running {
			fmt.Fprintf(tw, "  %s\t%s\t%d\t%s\t%d\t%s\n", r.ID, r.Repo, r.LeaseEpoch, r.Engine, r.PID, (time.Duration(r.AgeSec) * time.Second).String())
		}
		tw.Flush()
	}
	if len(st.Recent) > 0 {
		tw := table(w)
		fmt.Fprintln(tw, "  RAN\tREPO\tEPOCH\tSTAGE\tREASON")
		for _, r := range st.Recent {
			reason := string(r.Reason)
			if r.Fenced {
				reason += " (fenced)"
			}
			fmt.Fprintf(tw, "  %s\t%s\t%d\t%s\t%s\n", r.ID, r.Repo, r.LeaseEpoch, r.Stage, reason)
		}
		tw.Flush()
	}
	if s := st.Shadow; s != nil {
		fmt.Fprintf(w, "  shadow: %d agree, %d diverge, %d errors", s.Agree, s.Diverge, s.Errors)
		if s.LastDiverge != nil {
			fmt.Fprintf(w, " (last diverge: local=%s fleet=%s at %s)", s.LastDiverge.Local, s.LastDiverge.Fleet, s.LastDiverge.At.Local().Format(time.DateTime))
		}
		fmt.Fprintln(w)
	}
}
