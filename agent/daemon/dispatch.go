package daemon

// The daemon's dispatch wiring: the broker receiver's and the poll path's
// options, the acceptor and poll tick they call, the broker's health and
// its refusal when the coordinator cannot accept.

import (
	"context"
	"time"

	"github.com/aqfleet/aq/agent/dispatch"
	"github.com/aqfleet/aq/agent/fleet"
	"github.com/aqfleet/aq/internal/aqerr"
)

func (d *Daemon) brokerConfig() dispatch.Config {
	c := d.cfg
	return dispatch.Config{FactoryID: c.FactoryID, Pool: c.FactoryPool, Namespace: c.SBNamespace, ConnectionString: c.SBConnectionString,
		Topic: c.SBTopic, Subscription: c.SBSubscription, Sessions: c.SBSessions}
}

// sourceOptions are the dispatch source's options for this factory id.
func (d *Daemon) sourceOptions(factoryID string) dispatch.SourceOptions {
	so := dispatch.SourceOptions{
		Poll:         pollPath{d},
		Handler:      d.runJob,
		Slots:        d.slots,
		ConnectGrace: d.o.ConnectGrace,
		Fatal: func(err error) bool {
			if fleet.IsAuth(err) {
				d.fail(err)
				return true
			}
			return false
		},
		OnSwitch: d.switched,
		Logger:   d.o.Log,
	}
	if bc := d.brokerConfig(); bc.Enabled() && !d.brokerRefused() {
		bc.FactoryID = factoryID
		t := d.o.Broker
		so.Broker = &dispatch.Options{
			Config: bc, Acceptor: acceptor{d}, Metrics: d.m, Logger: d.o.Log,
			OnHealth: d.brokerHealth, Credential: t.Credential, TLSConfig: t.TLSConfig, Backoff: t.Backoff, SDKRetry: t.SDKRetry,
			Unfit: d.unfit,
		}
	}
	return so
}

// unfit says why a broker message's job can no longer run here (a
// declared capability, or its repo, that this factory no longer offers):
// the message is dead-lettered rather than accepted — accepting would take
// a lease on a job that must fail here (repo_unavailable: an attempt
// burned), abandoning would bring it back to this subscription until the
// broker's max delivery count dead-letters it anyway. The job stays queued;
// the heartbeat with the new offer goes out now, so the coordinator
// re-dispatches it to a factory that fits (docs/fleet.md).
func (d *Daemon) unfit(ctx context.Context, m dispatch.Message) string {
	why := d.agent.Caps.Unfit(ctx, m.Caps, m.Repo)
	if why != "" {
		d.agent.Heartbeat.Kick()
	}
	return why
}

// acceptor is the broker path's POST /fleet/accept.
type acceptor struct{ d *Daemon }

func (a acceptor) Accept(ctx context.Context, jobID string) (dispatch.Accepted, error) {
	if ready := a.d.agent.Poller.Ready; ready != nil {
		// This host cannot write $AQ_HOME: the message is abandoned
		// (redelivered, another replica may take it), the job not accepted.
		if err := ready(); err != nil {
			return dispatch.Accepted{}, err
		}
	}
	cl, err := a.d.agent.Client.Accept(ctx, jobID)
	if fleet.IsRouteAbsent(err) {
		// The coordinator has no accept (the start-up probe could not tell):
		// no message can ever be accepted, so the broker path goes off and
		// the poll path claims; this message is abandoned (redelivered,
		// then dead-lettered), its job stays queued for the claim.
		a.d.offBroker(err)
		return dispatch.Accepted{}, err
	}
	if err != nil {
		return dispatch.Accepted{}, err
	}
	a.d.take(cl)
	return dispatch.Accepted{Claim: cl}, nil
}

// pollPath is the fleet Poller as the dispatch source drives it.
type pollPath struct{ d *Daemon }

func (pp pollPath) Tick(ctx context.Context) (dispatch.Accepted, bool, error) {
	cl, err := pp.d.agent.Poller.Tick(ctx)
	if cl == nil {
		return dispatch.Accepted{}, false, err
	}
	// Recorded before the next tick: its repo is busy from now on, so the
	// next claim does not advertise it.
	pp.d.take(cl)
	return dispatch.Accepted{Claim: cl}, true, nil
}

func (pp pollPath) Wait() time.Duration { return pp.d.agent.Poller.Wait() }

// take records a job this factory now holds (its repo is busy from here).
func (d *Daemon) take(c *fleet.Claim) {
	now := time.Now().UTC()
	id := c.Job.ID
	d.mu.Lock()
	d.running[id] = &RunningJob{JobID: id, Repo: c.Job.Repo, LeaseEpoch: c.LeaseEpoch, Source: c.Source, Phase: "accepted", AcceptedAt: now}
	d.mu.Unlock()
	d.event(JobEvent{JobID: id, Kind: "taken", Source: c.Source, At: now})
	d.kickStatus()
}

// checkAccept refuses the broker path, before it opens, when the
// coordinator has no POST /fleet/accept (today's coordinator): a delivered
// message could not be accepted, so the poll path takes work instead. The
// client says so in one line when it learns it; the status file keeps it.
// A probe that cannot tell (the coordinator unreachable) leaves the broker
// path on: an accept that then fails abandons its message for redelivery.
func (d *Daemon) checkAccept(ctx context.Context) {
	if d.broker == nil {
		return
	}
	ok, err := d.agent.Client.Probe(ctx, fleet.RouteAccept)
	if err != nil {
		d.log.Debug("cannot tell whether the coordinator has POST /fleet/accept; the broker path stays on", "err", err)
		return
	}
	if !ok {
		d.mu.Lock()
		d.broker.Refused = "the coordinator has no POST /fleet/accept: broker deliveries cannot be accepted; jobs are claimed over the poll path"
		d.mu.Unlock()
		d.kickStatus()
	}
}

// offBroker turns the broker path off while the daemon runs (see acceptor).
func (d *Daemon) offBroker(why error) {
	d.mu.Lock()
	if d.broker != nil && d.broker.Refused == "" {
		d.broker.Refused = "the coordinator has no POST /fleet/accept: broker deliveries cannot be accepted; jobs are claimed over the poll path"
	}
	src := d.source
	d.mu.Unlock()
	if src != nil {
		src.OffBroker(why)
	}
	d.kickStatus()
}

// BrokerRefused reports whether a broker is configured but its path was
// turned off: the coordinator has no POST /fleet/accept.
func (d *Daemon) BrokerRefused() bool { return d.brokerRefused() }

// brokerRefused reports whether checkAccept turned the broker path off.
func (d *Daemon) brokerRefused() bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.broker != nil && d.broker.Refused != ""
}

// idleRepos are the repos the poll path offers: this host's repos minus the
// ones a running job holds (a claim for them would wait on the repo lock).
func (d *Daemon) idleRepos() []string {
	_, repos := d.agent.Client.Offer()
	d.mu.Lock()
	busy := map[string]bool{}
	for _, r := range d.running {
		busy[r.Repo] = true
	}
	d.mu.Unlock()
	out := repos[:0]
	for _, r := range repos {
		if !busy[r] {
			out = append(out, r)
		}
	}
	return out
}

// switched is the source's hand-off report.
func (d *Daemon) switched(live string, why error) {
	d.mu.Lock()
	d.sourceSince = time.Now().UTC()
	d.mu.Unlock()
	if live != dispatch.LiveNone {
		d.m.switches.WithLabelValues(live).Inc()
	}
	d.kickStatus()
}

// brokerHealth is the receiver's report, for the status; a missing
// subscription stops a replica that has not started a job
// (RequireSubscription).
func (d *Daemon) brokerHealth(h dispatch.Health) {
	d.mu.Lock()
	if d.broker != nil {
		d.broker.Healthy, d.broker.Since, d.broker.Error = h.Healthy, h.Since.UTC(), errString(h.Err)
	}
	idle := d.started == 0
	d.mu.Unlock()
	d.kickStatus()
	if !h.Healthy && d.o.RequireSubscription && idle && dispatch.IsMissingSubscription(h.Err) {
		d.fail(aqerr.Wrap(aqerr.Usage, h.Err, h.Err.Error(), "a replica receives from its pool's subscription; nothing was taken or run"))
	}
}
