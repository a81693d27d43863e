package cli

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/aqfleet/aq/agent/caps"
	"github.com/aqfleet/aq/agent/fleet"
)

// The fleet as the coordinator sees it, for `aq status` in fleet mode and
// the board: jobs per stage, factories with health and load, alerts. Each
// refresh costs the coordinator GET /fleet/queue-state and GET
// /fleet/factories, plus GET /fleet/jobs when the queue's version moved (or
// the last read is older than jobsMaxAge): docs/board.md.

// FleetView is the coordinator section of `aq status --json` in fleet mode.
// Field names are stable (docs/board.md).
type FleetView struct {
	API string `json:"api"`
	// Reachable is false when the last refresh could not reach the
	// coordinator: the data below is then the last that was read
	// (FetchedAt), and UnreachableSince says since when.
	Reachable        bool      `json:"reachable"`
	Error            string    `json:"error,omitempty"`
	UnreachableSince time.Time `json:"unreachableSince,omitzero"`
	FetchedAt        time.Time `json:"fetchedAt,omitzero"`
	QueueVersion     int64     `json:"queueVersion"`
	// Counts are jobs per coordinator stage (queued, blocked, assigned,
	// building, review, testing, shipped, failed, dead_letter).
	Counts    map[string]int     `json:"counts"`
	Jobs      []FleetViewJob     `json:"jobs"`
	Factories []FleetViewFactory `json:"factories"`
	Alerts    []FleetAlert       `json:"alerts"`
	// Missing names the routes this coordinator lacks; what they would
	// show is absent.
	Missing []string `json:"missing"`
	// Requests is how many calls the last refresh made.
	Requests int `json:"requests"`
}

// FleetViewJob is one job at the coordinator.
type FleetViewJob struct {
	ID         string `json:"id"`
	Repo       string `json:"repo"`
	Stage      string `json:"stage"`
	Engine     string `json:"engine,omitempty"`
	Priority   int    `json:"priority"`
	Attempts   int    `json:"attempts"`
	LeaseEpoch int64  `json:"leaseEpoch"`
	Factory    string `json:"factory,omitempty"` // the lease holder
	// AgeSec is the time since the job last changed.
	AgeSec  int64   `json:"ageSec"`
	Reason  string  `json:"reason,omitempty"`
	Detail  string  `json:"detail,omitempty"`
	Why     string  `json:"why,omitempty"` // queued or blocked: why it waits
	Tokens  int64   `json:"tokens,omitempty"`
	CostUSD float64 `json:"costUsd,omitempty"`
}

// FleetViewFactory is one factory at the coordinator.
type FleetViewFactory struct {
	ID              string   `json:"id"`
	Hostname        string   `json:"hostname,omitempty"`
	Health          string   `json:"health"`
	Stale           bool     `json:"stale"`
	SeatLimit       int      `json:"seatLimit"`
	Running         int      `json:"running"`
	Jobs            []string `json:"jobs"`
	Load            float64  `json:"load"`
	HeartbeatAgeSec int64    `json:"heartbeatAgeSec"` // -1: never
	Version         string   `json:"version,omitempty"`
	Pool            string   `json:"pool,omitempty"`
}

// FleetAlert is something an operator should look at.
type FleetAlert struct {
	Kind    string `json:"kind"` // stale_factory | unhealthy_factory | dead_letter | unroutable | starving
	Subject string `json:"subject"`
	Message string `json:"message"`
}

// Alert thresholds.
const (
	jobsMaxAge   = 30 * time.Second // re-read the jobs at least this often
	staleAfter   = 90 * time.Second // the coordinator's stale window
	starvingFrom = 30 * time.Minute // a job queued this long is starving
)

// fleetStages orders the coordinator's stages for display.
var fleetStages = []string{"queued", "blocked", "assigned", "building", "review", "testing", "shipped", "failed", "dead_letter"}

// fleetViewer reads the fleet view and keeps the last good data across a
// coordinator that goes away.
type fleetViewer struct {
	c   *fleet.Client
	api string

	version   int64
	jobs      []fleet.JobDoc
	jobsAt    time.Time
	factories []fleet.FactoryDoc
	missing   map[string]bool
	last      *FleetView
	downSince time.Time
}

func newFleetViewer(c *fleet.Client) *fleetViewer {
	return &fleetViewer{c: c, api: c.API(), missing: map[string]bool{}}
}

// refresh reads the coordinator; it never fails: an error is in the view.
func (v *fleetViewer) refresh(ctx context.Context, now time.Time) *FleetView {
	n := 0
	down := func(err error) *FleetView {
		if v.downSince.IsZero() {
			v.downSince = now
		}
		out := &FleetView{API: v.api, Counts: map[string]int{}, Jobs: []FleetViewJob{}, Factories: []FleetViewFactory{}, Alerts: []FleetAlert{}, Missing: []string{}}
		if v.last != nil {
			cp := *v.last
			out = &cp
		}
		out.Reachable, out.Error, out.UnreachableSince, out.Requests = false, err.Error(), v.downSince, n
		return out
	}
	readJobs := v.jobsAt.IsZero() || now.Sub(v.jobsAt) >= jobsMaxAge
	if !v.missing["GET /fleet/queue-state"] {
		n++
		qs, err := v.c.QueueState(ctx)
		var se *fleet.StatusError
		switch {
		case err == nil:
			if qs.Version != v.version {
				readJobs = true
			}
			v.version = qs.Version
		case asStatus(err, &se) && (se.Status == 404 || se.Status == 405):
			v.missing["GET /fleet/queue-state"], readJobs = true, true
		default:
			return down(err)
		}
	} else {
		readJobs = true
	}
	if readJobs {
		n++
		jobs, err := v.c.Jobs(ctx)
		switch {
		case err == nil:
			v.jobs, v.jobsAt = jobs, now
			delete(v.missing, "GET /fleet/jobs")
		case fleet.IsRouteAbsent(err):
			v.missing["GET /fleet/jobs"] = true
			v.jobs = nil
		default:
			return down(err)
		}
	}
	if !v.missing["GET /fleet/factories"] {
		n++
		fs, err := v.c.Factories(ctx)
		switch {
		case err == nil:
			v.factories = fs
		case fleet.IsRouteAbsent(err):
			v.missing["GET /fleet/factories"] = true // not asked again
		default:
			return down(err)
		}
	}
	v.downSince = time.Time{}
	view := buildFleetView(v.api, v.jobs, v.factories, now)
	view.Reachable, view.FetchedAt, view.QueueVersion, view.Requests = true, now, v.version, n
	for m := range v.missing {
		view.Missing = append(view.Missing, m)
	}
	sort.Strings(view.Missing)
	v.last = view
	return view
}

func asStatus(err error, se **fleet.StatusError) bool {
	e, ok := err.(*fleet.StatusError)
	if ok {
		*se = e
	}
	return ok
}

// buildFleetView is the pure part: counts, rows, the reasons jobs wait, and
// the alerts, from what the coordinator said.
func buildFleetView(api string, jobs []fleet.JobDoc, factories []fleet.FactoryDoc, now time.Time) *FleetView {
	view := &FleetView{API: api, Counts: map[string]int{}, Jobs: []FleetViewJob{}, Factories: []FleetViewFactory{}, Alerts: []FleetAlert{}, Missing: []string{}}
	for _, s := range fleetStages {
		view.Counts[s] = 0
	}
	byJob := map[string]string{} // job → factory running it (heartbeats)
	var live []*caps.Host
	for _, f := range factories {
		age := int64(-1) // never
		if !f.LastHeartbeatAt.IsZero() {
			age = int64(now.Sub(f.LastHeartbeatAt).Seconds())
		}
		stale := f.Stale || f.LastHeartbeatAt.IsZero() || now.Sub(f.LastHeartbeatAt) > staleAfter
		health := f.Health
		if health == "" {
			health = "unknown"
		}
		row := FleetViewFactory{ID: f.ID, Hostname: f.Hostname, Health: health, Stale: stale, SeatLimit: f.SeatLimit, Running: len(f.Running),
			Jobs: []string{}, Load: f.Load, HeartbeatAgeSec: age, Version: f.Version, Pool: f.Pool}
		for _, r := range f.Running {
			row.Jobs = append(row.Jobs, r.JobID)
			byJob[r.JobID] = f.ID
		}
		view.Factories = append(view.Factories, row)
		switch {
		case stale:
			msg := fmt.Sprintf("factory %s is stale: no heartbeat for %s", f.ID, time.Duration(age)*time.Second)
			if f.LastHeartbeatAt.IsZero() {
				msg = fmt.Sprintf("factory %s is stale: it never sent a heartbeat", f.ID)
			}
			view.Alerts = append(view.Alerts, FleetAlert{Kind: "stale_factory", Subject: f.ID, Message: msg})
		case health != "ok" && health != "unknown":
			view.Alerts = append(view.Alerts, FleetAlert{Kind: "unhealthy_factory", Subject: f.ID, Message: fmt.Sprintf("factory %s reports health %q", f.ID, health)})
		}
		if !stale {
			h := caps.FromTokens(f.Capabilities)
			h.Repos = append(h.Repos, f.Repos...)
			live = append(live, h)
		}
	}
	stageOf := map[string]string{}
	for _, j := range jobs {
		stageOf[j.ID] = j.Stage
	}
	for _, j := range jobs {
		view.Counts[j.Stage]++
		row := FleetViewJob{ID: j.ID, Repo: j.Repo, Stage: j.Stage, Engine: j.Engine, Priority: j.Priority, Attempts: j.Attempts,
			LeaseEpoch: j.LeaseEpoch, Factory: j.Holder, Reason: j.Reason, Detail: j.Detail}
		if row.Factory == "" && (j.Stage == "assigned" || j.Stage == "building") {
			row.Factory = byJob[j.ID]
		}
		if !j.UpdatedAt.IsZero() {
			row.AgeSec = int64(now.Sub(j.UpdatedAt).Seconds())
		}
		if in := j.Insights; in != nil {
			row.Tokens, row.CostUSD = in.TokensIn+in.TokensOut, in.CostUSD
		}
		switch j.Stage {
		case "blocked":
			var open []string
			for _, d := range j.Deps {
				if stageOf[d] != "shipped" {
					open = append(open, d)
				}
			}
			row.Why = "waiting for its deps to ship: " + strings.Join(open, ", ")
		case "queued":
			row.Why = queuedWhy(j, live, factories != nil, now)
			if strings.HasPrefix(row.Why, "no live factory") {
				view.Alerts = append(view.Alerts, FleetAlert{Kind: "unroutable", Subject: j.ID, Message: "job " + j.ID + ": " + row.Why})
			} else if !j.CreatedAt.IsZero() && now.Sub(j.CreatedAt) > starvingFrom && j.NotBefore.Before(now) {
				view.Alerts = append(view.Alerts, FleetAlert{Kind: "starving", Subject: j.ID, Message: fmt.Sprintf("job %s has waited %s in the queue", j.ID, (now.Sub(j.CreatedAt)).Round(time.Minute))})
			}
		case "dead_letter":
			msg := "job " + j.ID + " is dead-lettered"
			if j.Reason != "" {
				msg += " (" + j.Reason + ")"
			}
			view.Alerts = append(view.Alerts, FleetAlert{Kind: "dead_letter", Subject: j.ID, Message: msg + ": `aq job requeue " + j.ID + "` retries it"})
		}
		view.Jobs = append(view.Jobs, row)
	}
	sort.SliceStable(view.Jobs, func(a, b int) bool {
		ia, ib := slices.Index(fleetStages, view.Jobs[a].Stage), slices.Index(fleetStages, view.Jobs[b].Stage)
		if ia != ib {
			return ia < ib
		}
		return view.Jobs[a].ID < view.Jobs[b].ID
	})
	return view
}

// queuedWhy says why a queued job is not running: its backoff, no live
// factory that can run it, or all of them busy.
func queuedWhy(j fleet.JobDoc, live []*caps.Host, knowFactories bool, now time.Time) string {
	if j.NotBefore.After(now) {
		return "retry backoff until " + j.NotBefore.Local().Format(time.TimeOnly)
	}
	if !knowFactories {
		return "queued"
	}
	need := append([]string{}, j.Capabilities...)
	if j.Repo != "" && j.RepoURL == "" { // a job with a clone URL runs where the repo is not checked out too
		need = append(need, "repo:"+j.Repo)
	}
	var best []caps.Missing
	for _, h := range live {
		m := caps.Match(need, h)
		if len(m) == 0 {
			return "waiting for a free slot on a factory that can run it"
		}
		if best == nil || len(m) < len(best) {
			best = m
		}
	}
	if len(live) == 0 {
		return "no live factory (none has heartbeated within 90s)"
	}
	toks := make([]string, len(best))
	for i, m := range best {
		toks[i] = m.Token
	}
	return "no live factory can run it: none offers " + strings.Join(toks, ", ")
}
