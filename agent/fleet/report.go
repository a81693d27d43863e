package fleet

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"time"

	"go.opentelemetry.io/otel/attribute"

	"github.com/aqfleet/aq/agent/jobstate"
	"github.com/aqfleet/aq/internal/brief"
	"github.com/aqfleet/aq/internal/telemetry"
	"github.com/aqfleet/aq/job"
)

// Delivery is what became of a report.
type Delivery struct {
	Delivered bool   `json:"delivered,omitempty"`
	Spooled   bool   `json:"spooled,omitempty"`  // kept in the spool; the drain re-sends it
	Fenced    bool   `json:"fenced,omitempty"`   // 409: this factory no longer owns the job
	Rejected  bool   `json:"rejected,omitempty"` // refused for good (4xx): kept in spool/dead
	Skipped   bool   `json:"skipped,omitempty"`  // an artifact the coordinator has no route for: dropped
	Stage     string `json:"stage,omitempty"`    // /fleet/fail's answer; the patched stage
	Err       error  `json:"-"`

	seq int64 // the spool's sequence number, when spooled
}

// String names the delivery for logs and results.
func (d Delivery) String() string {
	switch {
	case d.Delivered:
		return "delivered"
	case d.Fenced:
		return "fenced"
	case d.Rejected:
		return "rejected"
	case d.Spooled:
		return "spooled"
	case d.Skipped:
		return "skipped"
	}
	return "none"
}

// Reporter sends stage reports in order, per job: a report the coordinator
// cannot take now (network, 5xx, 429 after its budget, or a 401/403) goes to
// the spool, and while a job has spooled reports its later ones queue behind
// them. The drain (at start-up, and Run's loop) re-sends the spool in order
// until each report is accepted, or fenced (409: that job's later reports are
// dropped too and the job recorded fenced). Nothing is ever dropped otherwise.
type Reporter struct {
	Client  *Client
	Spool   *Spool
	Records *jobstate.Store // optional: what the drain learns is recorded here
	Log     *slog.Logger
	Clock   Clock
	// DrainEvery is the drain loop's cadence while reports wait (default
	// 15 s); a failed pass backs off up to 8× that.
	DrainEvery time.Duration

	locksMu sync.Mutex
	locks   map[string]*jobLock
	kickMu  sync.Mutex
	kick    chan struct{}
	drainMu sync.Mutex
}

// jobLock is one job's report lock, dropped when nobody holds or waits.
type jobLock struct {
	mu   sync.Mutex
	refs int
}

// lockJob serialises reports of one job (the sender and the drain).
func (r *Reporter) lockJob(id string) func() {
	r.locksMu.Lock()
	if r.locks == nil {
		r.locks = map[string]*jobLock{}
	}
	l, ok := r.locks[id]
	if !ok {
		l = &jobLock{}
		r.locks[id] = l
	}
	l.refs++
	r.locksMu.Unlock()
	l.mu.Lock()
	return func() {
		l.mu.Unlock()
		r.locksMu.Lock()
		if l.refs--; l.refs == 0 {
			delete(r.locks, id)
		}
		r.locksMu.Unlock()
	}
}

// Send delivers rep now, within its call's budget (bounded further by ctx),
// or spools it. When earlier reports of the job are still spooled, rep is
// spooled behind them and the spool is drained at once (in order).
func (r *Reporter) Send(ctx context.Context, rep Report) Delivery {
	unlock := r.lockJob(rep.JobID)
	log := r.log().With("job", rep.JobID, "epoch", rep.LeaseEpoch, "report", rep.stage())
	if !r.Spool.Has(rep.JobID) {
		stage, err := r.deliver(ctx, rep, 0)
		d := r.settle(log, rep, stage, err, false)
		unlock()
		if d.Spooled {
			telemetry.Event(ctx, telemetry.EventSpooled, attribute.String("aq.report", rep.stage()))
		}
		return d
	}
	// Earlier reports of this job wait: this one goes behind them.
	d := r.spool(log, rep, errors.New("earlier reports of this job are still spooled"))
	unlock()
	if !d.Spooled {
		return d
	}
	_, got, _ := r.drain(ctx, d.seq)
	if gd, ok := got[d.seq]; ok {
		return gd
	}
	return d
}

// deliver sends one report; budget 0 means the call's own.
func (r *Reporter) deliver(ctx context.Context, rep Report, budget time.Duration) (string, error) {
	switch rep.Kind {
	case KindPatch:
		b := budget
		if b == 0 {
			b = r.Client.Budgets().Report
			if rep.Patch.Terminal() {
				b = r.Client.Budgets().FinalReport
			}
		}
		_, err := r.Client.patch(ctx, rep.JobID, *rep.Patch, b)
		return rep.Patch.Stage, err
	case KindFail:
		b := budget
		if b == 0 {
			b = r.Client.Budgets().FinalReport
		}
		return r.Client.fail(ctx, *rep.Fail, rep.Exhausted, b)
	case KindArtifact:
		b := budget
		if b == 0 {
			b = r.Client.Budgets().Report
		}
		_, err := r.Client.UploadArtifact(ctx, rep.JobID, *rep.Artifact, b)
		return "", err
	}
	return "", errors.New("unknown report kind " + rep.Kind)
}

// settle decides what a send's result means; spooled says rep is in the
// spool already.
func (r *Reporter) settle(log *slog.Logger, rep Report, stage string, err error, spooled bool) Delivery {
	switch {
	case err == nil:
		if spooled {
			_ = r.Spool.Remove(rep)
		}
		log.Info("report delivered", "stage", stage)
		return Delivery{Delivered: true, Stage: stage}
	case rep.Kind == KindArtifact && IsRouteAbsent(err):
		// Warned once by the client; not kept: the coordinator cannot take it.
		if spooled {
			_ = r.Spool.Remove(rep)
		}
		return Delivery{Skipped: true, Err: err}
	case IsFenced(err):
		log.Warn("report fenced: this factory no longer owns the job", "err", err)
		if spooled {
			_ = r.Spool.Remove(rep)
		}
		return Delivery{Fenced: true, Err: err}
	case errors.Is(err, ErrGone) || isStatus(err) || IsContract(err):
		log.Error("the coordinator refused the report for good; kept in spool/dead", "err", err)
		if rerr := r.Spool.Reject(rep, err.Error()); rerr != nil {
			log.Error("cannot keep the refused report", "err", rerr)
		}
		return Delivery{Rejected: true, Err: err}
	}
	// Transient, refused credentials, or our own context ended: keep it.
	if spooled {
		return Delivery{Spooled: true, Err: err}
	}
	return r.spool(log, rep, err)
}

func (r *Reporter) spool(log *slog.Logger, rep Report, why error) Delivery {
	rep.Why = why.Error()
	stored, err := r.Spool.Append(rep)
	if err != nil {
		// The spool is the last line: without it the report would be lost,
		// so say so loudly.
		log.Error("cannot spool a report the coordinator did not take; it is LOST unless the coordinator gets it otherwise", "err", err, "why", why)
		return Delivery{Err: err}
	}
	log.Warn("report spooled; it will be re-sent in order", "seq", stored.Seq, "why", why)
	r.Kick()
	return Delivery{Spooled: true, Err: why, seq: stored.Seq}
}

// reportRefusal is what a job's record says of a report the coordinator
// refused for good.
func reportRefusal(d Delivery) string {
	return brief.Head(errText(d.Err)) + "; the report is kept in $AQ_HOME/spool/dead"
}

func errText(err error) string {
	if err == nil {
		return "refused"
	}
	return err.Error()
}

func isStatus(err error) bool {
	var se *StatusError
	return errors.As(err, &se)
}

// DrainResult counts one drain pass.
type DrainResult struct {
	Delivered, Fenced, Rejected, Left int
}

// Drain re-sends the spool in sequence order. It stops at the first report
// that still cannot be delivered (the coordinator is down: later ones would
// fail too, and a job's reports must not overtake each other); the error is
// then that report's (an *AuthError, a *TransientError). A 409 drops the
// report and every later one of its job, and records the job fenced.
func (r *Reporter) Drain(ctx context.Context) (DrainResult, error) {
	res, _, err := r.drain(ctx, 0)
	return res, err
}

// drain is Drain; it also returns what became of each report it tried, and
// stops after report upTo when upTo > 0.
func (r *Reporter) drain(ctx context.Context, upTo int64) (DrainResult, map[int64]Delivery, error) {
	r.drainMu.Lock()
	defer r.drainMu.Unlock()
	var res DrainResult
	got := map[int64]Delivery{}
	reps, errs := r.Spool.Pending()
	for _, e := range errs {
		r.log().Error("report spool", "err", e)
	}
	fenced := map[string]bool{}
	for i, rep := range reps {
		if upTo > 0 && rep.Seq > upTo {
			res.Left = len(reps) - i
			break
		}
		if ctx.Err() != nil {
			res.Left = len(reps) - i
			return res, got, ctx.Err()
		}
		log := r.log().With("job", rep.JobID, "epoch", rep.LeaseEpoch, "report", rep.stage(), "seq", rep.Seq)
		if fenced[rep.JobID] {
			log.Warn("dropping a spooled report: the job is fenced")
			_ = r.Spool.Remove(rep)
			res.Fenced++
			got[rep.Seq] = Delivery{Fenced: true}
			continue
		}
		unlock := r.lockJob(rep.JobID)
		stage, err := r.deliver(ctx, rep, r.Client.Budgets().Drain)
		d := r.settle(log, rep, stage, err, true)
		unlock()
		got[rep.Seq] = d
		switch {
		case d.Delivered:
			res.Delivered++
			r.record(rep, d)
		case d.Fenced:
			res.Fenced++
			fenced[rep.JobID] = true
			r.record(rep, d)
		case d.Rejected:
			res.Rejected++
		case d.Skipped:
		default:
			res.Left = len(reps) - i
			return res, got, d.Err
		}
	}
	return res, got, nil
}

// record writes what a drained report taught us into the job's record.
func (r *Reporter) record(rep Report, d Delivery) {
	if r.Records == nil {
		return
	}
	_, err := r.Records.Update(rep.JobID, func(rec *jobstate.Record) {
		switch {
		case d.Fenced:
			rec.Fenced = true
			if rec.Reason == "" {
				rec.Reason = job.ReasonFenced
			}
			rec.Detail = "fenced when a spooled report was re-sent: another factory owns the job"
		case rep.Final() && d.Stage != "":
			if rep.Kind == KindFail {
				rec.Stage = job.StageFromFleet(d.Stage)
			} else {
				rec.Stage = job.StageFromFleet(rep.Patch.Stage)
			}
		}
	})
	if err != nil {
		r.log().Warn("cannot update the job record", "job", rep.JobID, "err", err)
	}
}

// Kick asks Run for a drain pass now.
func (r *Reporter) Kick() {
	ch := r.kickChan()
	select {
	case ch <- struct{}{}:
	default:
	}
}

func (r *Reporter) kickChan() chan struct{} {
	r.kickMu.Lock()
	defer r.kickMu.Unlock()
	if r.kick == nil {
		r.kick = make(chan struct{}, 1)
	}
	return r.kick
}

// Run drains the spool whenever it holds reports, every DrainEvery (or when
// kicked), backing off while the coordinator stays away, until ctx is done.
func (r *Reporter) Run(ctx context.Context) {
	every := r.DrainEvery
	if every <= 0 {
		every = 15 * time.Second
	}
	kick := r.kickChan()
	fails := 0
	for {
		wait := Jitter(every, 0.1, defaultRand)
		if fails > 0 {
			wait = Backoff(every, 8*every, fails, nil, defaultRand)
		}
		sctx, cancel := context.WithCancel(ctx)
		done := make(chan struct{})
		go func() {
			defer close(done)
			select {
			case <-kick:
				cancel()
			case <-sctx.Done():
			}
		}()
		err := r.clock().Sleep(sctx, wait)
		cancel()
		<-done
		if ctx.Err() != nil {
			return
		}
		_ = err // woken by the timer or a kick
		if r.Spool.Depth() == 0 {
			fails = 0
			continue
		}
		res, derr := r.Drain(ctx)
		if derr != nil && ctx.Err() == nil {
			fails++
			r.log().Warn("report spool: coordinator still unavailable", "delivered", res.Delivered, "left", res.Left, "err", derr)
			continue
		}
		fails = 0
	}
}

func (r *Reporter) clock() Clock {
	if r.Clock != nil {
		return r.Clock
	}
	return RealClock{}
}

func (r *Reporter) log() *slog.Logger {
	if r.Log != nil {
		return r.Log
	}
	return slog.New(slog.DiscardHandler)
}
