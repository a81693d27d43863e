package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"path/filepath"
	"strings"
	"time"

	"github.com/aqfleet/aq/agent/fleet"
	"github.com/aqfleet/aq/agent/jobstate"
	"github.com/aqfleet/aq/internal/aqerr"
	"github.com/aqfleet/aq/job"
)

// Fleet mode's `aq job show|logs|requeue|reject|ship ID`: through the
// coordinator (GET /fleet/jobs/:id, POST /fleet/jobs/:id/actions/:action,
// the job's events and artifacts), whichever factory ran the job.

// operatorBudgets are short: a person waits for these calls.
func operatorBudgets() *fleet.Budgets {
	b := fleet.DefaultBudgets(0)
	b.QueueState, b.Submit, b.PerTry = 5*time.Second, 15*time.Second, 5*time.Second
	b.MinWait, b.MaxWait = 200*time.Millisecond, 2*time.Second
	return &b
}

// operatorClient is a coordinator client with this host's credentials (or
// AQ_FLEET_TOKEN); it never enrolls.
func operatorClient(ctx context.Context, f *Factory) (*fleet.Client, error) {
	cfg, err := f.Config()
	if err != nil {
		return nil, err
	}
	if err := checkFleetConfig(cfg); err != nil {
		return nil, err
	}
	c, err := fleet.NewClientFromConfig(cfg, f.Logger(), f.Redactor(), operatorBudgets(), nil)
	if err != nil {
		return nil, aqerr.Wrap(aqerr.Usage, err, err.Error(), "set AQ_FLEET_API to the coordinator's http(s) URL")
	}
	if _, err := fleet.EnsureEnrolled(ctx, c, fleet.EnrollOptions{Path: cfg.CredentialsFile(), EnvToken: cfg.FleetToken, NoEnroll: true, Log: f.Logger()}); err != nil {
		return nil, fleetError(err)
	}
	return c, nil
}

// jobOpError maps a coordinator call on job id to one line and an exit code
// (docs/board.md): no such job, or an action the coordinator refused, is a
// usage error (2), as the same mistakes are in local mode; a coordinator
// that lacks the route or is down is a failure (1); refused credentials 5.
func jobOpError(id, op string, err error) error {
	var (
		fe *fleet.FencedError
		me *fleet.RouteAbsentError
	)
	switch {
	case errors.Is(err, fleet.ErrGone):
		return aqerr.Wrap(aqerr.Usage, err, fmt.Sprintf("the coordinator has no job %s", id), "`aq status` lists the fleet's jobs")
	case errors.As(err, &fe):
		why := fe.Detail
		if why == "" {
			why = "no reason given"
		}
		return aqerr.Wrap(aqerr.Usage, err, fmt.Sprintf("the coordinator refused to %s job %s (409): %s", op, id, why), "`aq job show "+id+"` says where the job is")
	case errors.As(err, &me):
		return aqerr.Wrap(aqerr.Failed, err, fmt.Sprintf("cannot %s job %s: %s", op, id, me.Error()), "this coordinator cannot do it; use its own control plane")
	case fleet.IsTransient(err):
		return aqerr.Wrap(aqerr.Failed, err, fmt.Sprintf("cannot %s job %s: %s", op, id, err.Error()), "check AQ_FLEET_API and that the coordinator is up")
	}
	return fleetError(err)
}

// FleetJobView is `aq job show --json` in fleet mode. Field names are
// stable (docs/board.md).
type FleetJobView struct {
	Job       fleet.JobDoc        `json:"job"`
	Events    []fleet.JobEvent    `json:"events"`
	Artifacts []fleet.ArtifactDoc `json:"artifacts"`
	// Missing names the routes the coordinator lacks (their part is empty).
	Missing []string `json:"missing,omitempty"`
	// Logs is this host's log directory for the job, when it ran here.
	Logs string `json:"logs,omitempty"`
	// Here is this factory's record of the job, when it ran here: it says
	// what the coordinator may not know, such as a report it refused.
	Here *jobstate.Record `json:"here,omitempty"`
}

func fleetJobShow(ctx context.Context, f *Factory, id string, asJSON bool) error {
	if err := checkJobID(id); err != nil {
		return err
	}
	c, err := operatorClient(ctx, f)
	if err != nil {
		return err
	}
	j, err := c.Job(ctx, id)
	if err != nil {
		return jobOpError(id, "read", err)
	}
	v := FleetJobView{Job: *j, Events: []fleet.JobEvent{}, Artifacts: []fleet.ArtifactDoc{}}
	if evs, err := c.JobEvents(ctx, id); err == nil {
		v.Events = append(v.Events, evs...)
	} else if fleet.IsRouteAbsent(err) {
		v.Missing = append(v.Missing, "GET /fleet/jobs/:id/events")
	} else {
		return jobOpError(id, "read the events of", err)
	}
	if arts, err := c.JobArtifacts(ctx, id); err == nil {
		v.Artifacts = append(v.Artifacts, arts...)
	} else if fleet.IsRouteAbsent(err) {
		v.Missing = append(v.Missing, "GET /fleet/jobs/:id/artifacts")
	} else {
		return jobOpError(id, "read the artifacts of", err)
	}
	cfg, _ := f.Config()
	if dir := filepath.Join(cfg.LogsDir(), id); exists(dir) {
		v.Logs = dir
	}
	if st, err := jobstate.Open(filepath.Join(cfg.StateDir(), "jobs")); err == nil {
		if rec, err := st.Get(id); err == nil {
			v.Here = &rec
		}
	}
	if asJSON {
		return writeJSON(f.IO.Out, v)
	}
	return printFleetJob(f.IO.Out, v)
}

func printFleetJob(w io.Writer, v FleetJobView) error {
	j := v.Job
	tw := table(w)
	row := func(k, val string) {
		if val != "" {
			fmt.Fprintf(tw, "%s\t%s\n", k, job.Printable(val, false))
		}
	}
	row("id", j.ID)
	row("stage", j.Stage)
	row("repo", j.Repo)
	row("engine", j.Engine)
	row("priority", job.PriorityName(j.Priority))
	row("attempts", fmt.Sprint(j.Attempts))
	row("lease epoch", fmt.Sprint(j.LeaseEpoch))
	row("holder", j.Holder)
	row("reason", j.Reason)
	row("detail", j.Detail)
	row("branch", j.Branch)
	row("pr", j.PRURL)
	row("checkpoint", j.Checkpoint)
	if len(j.Deps) > 0 {
		row("deps", strings.Join(j.Deps, ", "))
	}
	row("logs (this host)", v.Logs)
	if h := v.Here; h != nil && h.ReportRefused != "" {
		row("report (this host)", "refused by the coordinator: "+h.ReportRefused+"; this host ended the job "+orDash(string(h.Stage))+
			reasonText(h.Reason)+", which the coordinator does not know")
	}
	if in := j.Insights; in != nil {
		row("insights", fmt.Sprintf("engine %s, model %s, tokens in/out %d/%d, cost $%.4f, turns %d, wall %dms, files %d +%d/-%d",
			in.Engine, in.Model, in.TokensIn, in.TokensOut, in.CostUSD, in.Turns, in.WallMS, in.FilesChanged, in.LinesAdded, in.LinesDeleted))
	}
	row("previous", previousText(j.Previous))
	tw.Flush()
	printRounds(w, j.Insights)
	if len(v.Events) > 0 {
		fmt.Fprintln(w, "\nevents:")
		for _, e := range v.Events {
			line := fmt.Sprintf("  %s  %-9s %s", e.At.Local().Format("2006-01-02 15:04:05"), e.Kind, orDash(e.Stage))
			if e.Factory != "" {
				line += "  " + e.Factory
			}
			if e.Epoch > 0 {
				line += fmt.Sprintf("  epoch %d", e.Epoch)
			}
			if e.Detail != "" {
				line += ": " + e.Detail
			}
			fmt.Fprintln(w, job.Printable(line, false))
		}
	}
	if len(v.Artifacts) > 0 {
		fmt.Fprintln(w, "\nartifacts:")
		for _, a := range v.Artifacts {
			tr := ""
			if a.Truncated {
				tr = fmt.Sprintf(", truncated from %d", a.OriginalSize)
			}
			fmt.Fprintf(w, "  %s  %s (%s, %d bytes%s), attempt %d, epoch %d, from %s\n", a.ID, a.Name, a.Kind, a.Size, tr, a.Attempt, a.LeaseEpoch, orDash(a.FactoryID))
		}
	}
	for _, m := range v.Missing {
		fmt.Fprintf(w, "\n(the coordinator has no %s: not shown)\n", m)
	}
	return nil
}

func reasonText(r job.Reason) string {
	if r == "" {
		return ""
	}
	return " (" + string(r) + ")"
}

// fleetAct applies action and says what became of the job.
func fleetAct(ctx context.Context, f *Factory, id, action, detail string) (string, error) {
	if err := checkJobID(id); err != nil {
		return "", err
	}
	c, err := operatorClient(ctx, f)
	if err != nil {
		return "", err
	}
	j, err := c.JobAction(ctx, id, action, detail)
	if err != nil {
		return "", jobOpError(id, action, err)
	}
	return fmt.Sprintf("%s %s (the coordinator has it in %s)", pastTense(action), id, orDash(j.Stage)), nil
}

func pastTense(action string) string {
	switch action {
	case "ship":
		return "shipped"
	case "requeue":
		return "requeued"
	case "reject":
		return "rejected"
	}
	return action
}

// fleetJobLogs prints a fleet job's logs: this host's files when it ran
// here, else the artifacts the coordinator holds (the latest of each).
func fleetJobLogs(ctx context.Context, f *Factory, out *logPrinter, names []string) error {
	id := out.id
	if err := checkJobID(id); err != nil {
		return err
	}
	cfg, err := f.Config()
	if err != nil {
		return err
	}
	if dir := filepath.Join(cfg.LogsDir(), id); exists(dir) {
		printLocalLogs(f, out, dir, names)
		return nil
	}
	c, err := operatorClient(ctx, f)
	if err != nil {
		return err
	}
	if _, err := c.Job(ctx, id); err != nil {
		return jobOpError(id, "read", err)
	}
	arts, err := c.JobArtifacts(ctx, id)
	if err != nil {
		return jobOpError(id, "read the artifacts of", err)
	}
	want := map[string]string{"stdout": "engine-stdout", "stderr": "engine-stderr", "verify": "verify"}
	latest := map[string]fleet.ArtifactDoc{}
	for _, a := range arts {
		if l, ok := latest[a.Name]; !ok || !a.CreatedAt.Before(l.CreatedAt) {
			latest[a.Name] = a
		}
	}
	for _, n := range names {
		a, ok := latest[want[n]]
		if !ok {
			continue
		}
		b, err := c.ArtifactContent(ctx, a)
		if err != nil {
			return jobOpError(id, "read the logs of", err)
		}
		out.log(n, fmt.Sprintf("%s.log (artifact %s from %s, attempt %d)", n, a.ID, orDash(a.FactoryID), a.Attempt), b)
	}
	if out.shown == 0 {
		fmt.Fprintf(f.IO.Err, "aq: the coordinator holds no log of job %s yet (it has not ended on a factory that uploads its logs)\n", id)
	}
	return nil
}
