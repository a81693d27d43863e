package coord

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"

	"github.com/aqfleet/aq/agent/dispatch"
	"github.com/aqfleet/aq/internal/secrets"
)

// PublisherOptions configure a Publisher.
type PublisherOptions struct {
	// ConnectionString is the broker's (the local peer's or an emulator's).
	// It is a secret: it never reaches a log line or an error, and a
	// development string (UseDevelopmentEmulator=true) must point at
	// loopback.
	ConnectionString string
	Topic            string // default dispatch.DefaultTopic
	// Sessions sets SessionID = repo on each message.
	Sessions bool
	// ClientOptions tune the SDK client (retries, TLS); nil: short retries.
	ClientOptions *azservicebus.ClientOptions
	// Backoff paces retries after a send failed (the broker is down).
	Backoff dispatch.Backoff
	// Rescan is how often queued jobs are looked at again without a change
	// event: a factory that just came up, a target that went stale
	// (default 1 s).
	Rescan time.Duration
	// Redispatch is how long a job may stay queued, at the same epoch, after
	// its message went to a live factory before it is published again
	// (default 2 min; negative: never). The message may be gone: a factory
	// abandons it when its accept fails (a coordinator outage), and after
	// the subscription's max delivery count the broker dead-letters it —
	// while that factory, its broker path healthy, never polls. A second
	// message for a job still in a subscription is harmless: one accept
	// wins, the other is answered 409 and completed.
	Redispatch time.Duration
	// OnSent is called after each message the broker took (tests and the
	// dispatch benchmark time it).
	OnSent func(Sent)
	Log    *slog.Logger
}

// Sent is one dispatch message the broker took.
type Sent struct {
	MessageID string
	JobID     string
	Target    string
	Epoch     int64
	At        time.Time // when SendMessage was called
}

// PublisherStats count what the publisher did.
type PublisherStats struct {
	Sent     int64 `json:"sent"`
	Failed   int64 `json:"failed"`   // sends the broker did not take (retried)
	Unplaced int64 `json:"unplaced"` // scans that found no fitting factory for a queued job
	// Redispatched counts jobs published again because their message went
	// unanswered past PublisherOptions.Redispatch.
	Redispatched int64 `json:"redispatched"`
}

// Publisher makes the stub the dispatcher that the coordinator team's "Fleet dispatch redesign" describes
// (docs/servicebus.md, "The coordinator stub as publisher"):
// for every job that is queued and due, it picks a target among the enrolled,
// non-stale factories whose capabilities and repos fit (caps.FromTokens +
// caps.Match, as the scheduler does; then the least loaded, preferring free
// seats and a factory not already busy with the job's repo) and publishes one
// targeted message (dispatch.Message: application property targetFactoryId,
// the small body of docs/contract.md, "Broker messages") with the azservicebus sender. A job that
// comes back to queued — a retry, a reap, a requeue, a release — is published
// again under a new MessageID (dispatch.DispatchMessageID: jobId:epoch);
// re-publishing the same dispatch (a scan after a failed send, a restart)
// keeps the MessageID, so the broker's duplicate detection collapses it.
//
// It runs on the stub's change events (Options.OnChange) plus a periodic
// rescan; sends happen on its own goroutine, never in a request's path, and
// a broker outage only delays them (the factories poll meanwhile).
type Publisher struct {
	o   PublisherOptions
	red *secrets.Redactor
	log *slog.Logger

	kick chan struct{}

	mu    sync.Mutex
	sent  map[string]dispatched // by job id: the last dispatch of each job
	stats PublisherStats
}

// dispatched is the last message published for a job.
type dispatched struct {
	id       string
	epoch    int64
	target   string
	retarget int
	at       time.Time // the server's clock
}

// NewPublisher checks o. It dials nothing.
func NewPublisher(o PublisherOptions) (*Publisher, error) {
	if strings.TrimSpace(o.ConnectionString) == "" {
		return nil, errors.New("the publisher needs the broker's connection string")
	}
	if err := dispatch.CheckConnectionString(o.ConnectionString); err != nil {
		return nil, err
	}
	if o.Topic == "" {
		o.Topic = dispatch.DefaultTopic
	}
	if o.Rescan <= 0 {
		o.Rescan = time.Second
	}
	if o.Redispatch == 0 {
		o.Redispatch = 2 * time.Minute
	}
	if o.Backoff == (dispatch.Backoff{}) {
		o.Backoff = dispatch.Backoff{Initial: 200 * time.Millisecond, Max: 5 * time.Second}
	}
	if o.Log == nil {
		o.Log = slog.New(slog.DiscardHandler)
	}
	p := &Publisher{o: o, red: secrets.NewRedactor(nil), kick: make(chan struct{}, 1), sent: map[string]dispatched{}}
	p.red.Add(dispatch.ConnectionStringSecrets(o.ConnectionString)...)
	p.log = o.Log.With("component", "publisher", "topic", o.Topic)
	return p, nil
}

// Notify is the stub's OnChange hook: a job changed, look again.
func (p *Publisher) Notify(Event) {
	select {
	case p.kick <- struct{}{}:
	default:
	}
}

// Topic is the topic the publisher sends to.
func (p *Publisher) Topic() string { return p.o.Topic }

// Sessions reports whether messages carry SessionId = repo.
func (p *Publisher) Sessions() bool { return p.o.Sessions }

// Stats returns the counters.
func (p *Publisher) Stats() PublisherStats {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.stats
}

// Run publishes for stub s until ctx is done.
func (p *Publisher) Run(ctx context.Context, s *Server) {
	var (
		client *azservicebus.Client
		sender *azservicebus.Sender
	)
	closeAll := func() {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		if sender != nil {
			_ = sender.Close(cctx)
		}
		if client != nil {
			_ = client.Close(cctx)
		}
		client, sender = nil, nil
	}
	defer closeAll()
	tick := time.NewTicker(p.o.Rescan)
	defer tick.Stop()
	failures := 0
	for ctx.Err() == nil {
		err := p.scan(ctx, s, func() (*azservicebus.Sender, error) {
			if sender != nil {
				return sender, nil
			}
			co := p.o.ClientOptions
			if co == nil {
				co = &azservicebus.ClientOptions{RetryOptions: azservicebus.RetryOptions{MaxRetries: 1, RetryDelay: 100 * time.Millisecond, MaxRetryDelay: time.Second}}
			}
			c, err := azservicebus.NewClientFromConnectionString(p.o.ConnectionString, co)
			if err != nil {
				return nil, errors.New("the broker connection string is not valid")
			}
			snd, err := c.NewSender(p.o.Topic, nil)
			if err != nil {
				_ = c.Close(ctx)
				return nil, err
			}
			client, sender = c, snd
			return sender, nil
		})
		if err != nil && ctx.Err() == nil {
			closeAll()
			delay := p.o.Backoff.Delay(failures, 0.5)
			failures++
			p.log.Warn("publishing failed; retrying", "in", delay, "err", p.red.String(err.Error()))
			t := time.NewTimer(delay)
			select {
			case <-ctx.Done():
			case <-t.C:
			}
			t.Stop()
			continue
		}
		failures = 0
		select {
		case <-ctx.Done():
		case <-p.kick:
		case <-tick.C:
		}
	}
}

// scan publishes every queued, due job that has no live dispatch yet.
func (p *Publisher) scan(ctx context.Context, s *Server, sender func() (*azservicebus.Sender, error)) error {
	now := s.o.Now()
	jobs := s.Jobs()
	byID := make(map[string]*Job, len(jobs))
	for i := range jobs {
		byID[jobs[i].ID] = &jobs[i]
	}
	facts := targets(s)
	live := map[string]bool{}
	for _, f := range facts {
		live[f.ID] = !f.Stale && !f.Revoked
	}
	p.mu.Lock()
	outstanding := map[string]int{}
	for id, d := range p.sent {
		j, ok := byID[id]
		switch {
		case !ok || j.Stage == StageShipped || j.Stage == StageFailed || j.Stage == StageDeadLetter:
			delete(p.sent, id) // done with: forget it
		case Runnable(j, now) && j.LeaseEpoch == d.epoch:
			outstanding[d.target]++ // published, not yet taken
		}
	}
	p.mu.Unlock()
	cands := make([]Candidate, 0, len(facts))
	for _, f := range facts {
		c := Candidate{Factory: f, BusyRepos: map[string]bool{}}
		for _, r := range f.Running {
			if j, ok := byID[r.JobID]; ok {
				c.BusyRepos[j.Repo] = true
			}
		}
		cands = append(cands, c)
	}
	for i := range jobs {
		j := &jobs[i]
		if !Runnable(j, now) {
			continue
		}
		p.mu.Lock()
		last, seen := p.sent[j.ID]
		p.mu.Unlock()
		retarget := 0
		overdue := false
		if seen && last.epoch == j.LeaseEpoch {
			overdue = p.o.Redispatch > 0 && now.Sub(last.at) >= p.o.Redispatch
			if live[last.target] && !overdue && stillFits(j, last.target, cands) {
				continue // its message waits in a live factory's subscription
			}
			retarget = last.retarget + 1
		}
		for k := range cands {
			cands[k].Outstanding = outstanding[cands[k].Factory.ID]
		}
		target, ok := ChooseTarget(j, cands)
		if !ok {
			p.mu.Lock()
			p.stats.Unplaced++
			if seen && last.epoch == j.LeaseEpoch && last.target != "" && !stillFits(j, last.target, cands) {
				// Its target dropped what it needs (and dead-lettered the
				// message): forget the target, so that whichever factory
				// fits next — that one again, once it has it back — gets a
				// message at once.
				last.target = ""
				p.sent[j.ID] = last
			}
			p.mu.Unlock()
			continue // no factory fits now: a later scan looks again
		}
		if seen && last.epoch == j.LeaseEpoch && last.target == target && !overdue {
			continue // the stale target is still the only choice
		}
		snd, err := sender()
		if err != nil {
			return err
		}
		m := dispatch.Message{JobID: j.ID, ProductID: j.ProductID, Repo: j.Repo, Caps: append([]string{}, j.Capabilities...), Priority: j.Priority, TargetFactoryID: target}
		id := dispatch.DispatchMessageID(j.ID, j.LeaseEpoch, retarget)
		sm, err := m.ServiceBusMessageWithID(id, p.o.Sessions)
		if err != nil {
			return err
		}
		at := time.Now()
		sctx, cancel := context.WithTimeout(ctx, 15*time.Second)
		err = snd.SendMessage(sctx, sm, nil)
		cancel()
		if err != nil {
			p.mu.Lock()
			p.stats.Failed++
			p.mu.Unlock()
			return fmt.Errorf("send %s: %w", id, err)
		}
		p.mu.Lock()
		p.sent[j.ID] = dispatched{id: id, epoch: j.LeaseEpoch, target: target, retarget: retarget, at: now}
		p.stats.Sent++
		if overdue && live[last.target] {
			p.stats.Redispatched++
		}
		p.mu.Unlock()
		outstanding[target]++
		p.log.Info("dispatched", "job", j.ID, "target", target, "messageId", id, "epoch", j.LeaseEpoch)
		if p.o.OnSent != nil {
			p.o.OnSent(Sent{MessageID: id, JobID: j.ID, Target: target, Epoch: j.LeaseEpoch, At: at})
		}
	}
	return nil
}

// stillFits reports whether target, as its last heartbeat describes it,
// can still run j: a factory that dropped the job's repo or a capability
// since its message went out (it dead-letters such a message) is not waited
// for — the job is re-targeted at once.
func stillFits(j *Job, target string, cands []Candidate) bool {
	for _, c := range cands {
		if c.Factory.ID == target {
			ok, _ := Eligible(j, Offer{Capabilities: c.Factory.Capabilities, Repos: c.Factory.Repos})
			return ok
		}
	}
	return true // not a candidate now (stale, left): live[] decides
}

// targets are what the publisher may target: the registered factories that
// are not replicas of a pool, and one target per pool — a pool is always
// live (a message to it is what starts a replica), its running jobs those of
// its live replicas.
func targets(s *Server) []Factory {
	var facts []Factory
	running := map[string][]RunningJob{}
	for _, f := range s.Factories() {
		if f.Pool != "" {
			if !f.Stale {
				running[f.Pool] = append(running[f.Pool], f.Running...)
			}
			continue
		}
		facts = append(facts, f)
	}
	for _, p := range s.Pools() {
		facts = append(facts, Factory{ID: p.Name, Capabilities: p.Capabilities, Repos: p.Repos, SeatLimit: p.Seats, Running: running[p.Name], Pool: p.Name})
	}
	return facts
}

// Candidate is a factory as the publisher weighs it for one job.
type Candidate struct {
	Factory Factory
	// Outstanding counts messages published to it and not yet taken.
	Outstanding int
	// BusyRepos are the repos of the jobs it runs now.
	BusyRepos map[string]bool
}

// ChooseTarget picks the factory a job is dispatched to: among enrolled,
// non-stale, non-revoked factories whose capabilities and repos fit the job
// (Eligible), the first by: not busy with the job's repo (the factory runs
// same-repo jobs one after another), a free seat (seat limit minus running
// jobs minus outstanding messages), the lowest load ((running + outstanding)
// / seat limit), then id. A pure function; false when none fits.
func ChooseTarget(j *Job, cands []Candidate) (string, bool) {
	type scored struct {
		id       string
		repoBusy bool
		free     bool
		load     float64
	}
	var fit []scored
	for _, c := range cands {
		f := c.Factory
		if f.Stale || f.Revoked {
			continue
		}
		if ok, _ := Eligible(j, Offer{Capabilities: f.Capabilities, Repos: f.Repos}); !ok {
			continue
		}
		seats := max(f.SeatLimit, 1)
		taken := len(f.Running) + c.Outstanding
		fit = append(fit, scored{id: f.ID, repoBusy: c.BusyRepos[j.Repo], free: taken < seats, load: float64(taken) / float64(seats)})
	}
	if len(fit) == 0 {
		return "", false
	}
	sort.Slice(fit, func(a, b int) bool {
		x, y := fit[a], fit[b]
		if x.repoBusy != y.repoBusy {
			return !x.repoBusy
		}
		if x.free != y.free {
			return x.free
		}
		if x.load != y.load {
			return x.load < y.load
		}
		return x.id < y.id
	})
	return fit[0].id, true
}
