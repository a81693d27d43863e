package daemon

// Job slots: a job taken from either path runs here, under the job's flock,
// with its events, gauges and end recorded.

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/aqfleet/aq/agent/dispatch"
	"github.com/aqfleet/aq/agent/fleet"
	"github.com/aqfleet/aq/agent/runner"
)

// runJob is the Handler of both dispatch paths: it runs one job holding a
// slot (the source's) and the job's flock.
func (d *Daemon) runJob(_ context.Context, a dispatch.Accepted) {
	c := a.Claim
	if c == nil {
		d.log.Error("dispatch handed over no claim")
		return
	}
	id := c.Job.ID
	defer d.agent.LockJob(id)()
	d.mu.Lock()
	_, taken := d.running[id]
	d.mu.Unlock()
	if !taken {
		d.take(c)
	}

	ctx := d.jobsCtx
	started := d.dispatchCtx.Err() == nil
	if !started {
		// Taken as the drain began (a claim or an accept already under way):
		// not started, so not run — a cancelled context makes the job runner
		// give the lease back at once, with no attempt counted.
		d.log.Info("draining: giving back a job that had not started", "job", id, "repo", c.Job.Repo, "epoch", c.LeaseEpoch)
		var cancel context.CancelFunc
		ctx, cancel = context.WithCancel(ctx)
		cancel()
	} else {
		d.jobStarted()
		d.m.started.Inc()
	}
	res := d.agent.Jobs.Run(ctx, c)
	d.m.jobDone(res)
	d.ended(id, started, res)
	if started && d.o.OnResult != nil {
		d.o.OnResult(res)
	}

	d.mu.Lock()
	delete(d.running, id)
	d.lastBusy = time.Now()
	d.mu.Unlock()
	d.event(JobEvent{JobID: id, Kind: "done", Source: c.Source, At: time.Now()})
	d.kickStatus()
	if res.Err != nil && fleet.IsAuth(res.Err) {
		d.fail(res.Err)
	}
}

// ended counts a job that started here once its report settled, and has
// the worktrees' disk measured again.
func (d *Daemon) ended(id string, started bool, res *fleet.Result) {
	if !started {
		return
	}
	d.mu.Lock()
	var took time.Duration
	if rj := d.running[id]; rj != nil {
		took = time.Since(rj.AcceptedAt)
	}
	d.mu.Unlock()
	d.m.jobEnded(res, took)
	d.disk.Kick()
}

// watchGauges starts the gauges measured on a cadence, while /metrics is
// served: the worktrees' disk, and the broker's depth.
func (d *Daemon) watchGauges(ctx context.Context, wg *sync.WaitGroup) {
	if d.cfg.MetricsAddr == "" {
		return
	}
	wg.Go(func() { d.disk.run(ctx) })
	if d.depth == nil {
		return
	}
	var r depthReader
	if d.o.Broker.Admin != nil {
		r = d.o.Broker.Admin
	} else {
		dr, why, err := newDepthReader(d.brokerConfig(), d.o.Broker.Credential)
		switch {
		case err != nil:
			d.log.Warn("the broker depth gauges are off: "+err.Error(), "fix", "set AQ_BROKER_DEPTH_INTERVAL=0 to silence this")
			return
		case dr == nil:
			d.log.Info("the broker depth gauges are off: " + why)
			return
		}
		r = dr
	}
	wg.Go(func() { watchDepth(ctx, r, d.depth, d.cfg.BrokerDepthInterval, d.m.depthErrors.Inc, d.log) })
}

// event records a job's step.
func (d *Daemon) event(e JobEvent) {
	d.mu.Lock()
	rj := d.running[e.JobID]
	if rj != nil {
		switch e.Kind {
		case "pipeline":
			rj.Phase = "preparing"
		case "repair":
			rj.Phase = fmt.Sprintf("repair %d/%d", e.Round, e.Rounds)
		case "engine":
			rj.Phase, rj.EngineAt = "running", e.At.UTC()
			d.m.toEngine.WithLabelValues(rj.Source).Observe(e.At.Sub(rj.AcceptedAt).Seconds())
			d.m.startup.WithLabelValues(rj.Source).Observe(e.At.Sub(rj.AcceptedAt).Seconds())
		}
		if e.Source == "" {
			e.Source = rj.Source
		}
	}
	d.mu.Unlock()
	if d.o.OnJobEvent != nil {
		d.o.OnJobEvent(e)
	}
	if e.Kind == "engine" {
		d.kickStatus()
	}
}

// jobEvent is the jobs' lifecycle observer (fleet.JobRunner.OnEvent): it
// sees when a job reaches the runner (repo lock and worktree next) and when
// its engine starts (after them).
func (d *Daemon) jobEvent(id string, e runner.Event) {
	switch e := e.(type) {
	case runner.Preparing:
		d.event(JobEvent{JobID: id, Kind: "pipeline", At: time.Now()})
	case runner.EngineStarted:
		d.event(JobEvent{JobID: id, Kind: "engine", At: time.Now()})
	case runner.RepairStarted:
		d.event(JobEvent{JobID: id, Kind: "repair", Round: e.Round, Rounds: e.Of, At: time.Now()})
	}
}
