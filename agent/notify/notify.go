// Package notify tells a person about the jobs that need one: a JSON POST to
// AQ_NOTIFY_URL when a job ships, fails for good (dead letter, no retries
// left, a permanent reason) or needs a person (a result awaiting review, a
// budget spent), in local and fleet mode alike.
//
// Notifying never blocks or delays a job or its report: Notify only puts the
// event on a bounded queue, which one goroutine (owned by the Notifier's
// context and WaitGroup) delivers, retrying with backoff (go-retryablehttp)
// what may succeed on retry (network errors, 429, 5xx). Close stops taking
// events and delivers what is queued within a time limit. The URL is a secret
// (its token often sits in the path or query): it is never logged.
package notify

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-cleanhttp"
	"github.com/hashicorp/go-retryablehttp"

	"github.com/aqfleet/aq/internal/secrets"
	"github.com/aqfleet/aq/internal/version"
	"github.com/aqfleet/aq/job"
)

// Version is the payload's version: a receiver checks it; fields are only
// ever added within one version.
const Version = 1

// Kind is what happened.
type Kind string

const (
	// Shipped: the job's result shipped (merged, or its branch delivered).
	Shipped Kind = "job.shipped"
	// Failed: the job failed for good — dead letter, no retries left, or a
	// reason retrying cannot fix.
	Failed Kind = "job.failed"
	// NeedsPerson: the job waits for a person — Need says why.
	NeedsPerson Kind = "job.needs_person"
)

// Needs of a NeedsPerson event.
const (
	// NeedReview: a result waits for review — a pull request is open (stage
	// review), or a verified branch waits to be shipped (stage testing).
	NeedReview = "review"
	// NeedBudget: the run stopped at the job's budget (reason
	// budget_exceeded): raise it, or requeue, or reject.
	NeedBudget = "budget"
)

// Event is the payload (docs/observability.md): one JSON object per POST.
type Event struct {
	Version int  `json:"version"`
	Event   Kind `json:"event"`
	// ID names this delivery: the same on every retry of it (a receiver
	// dedupes on it), and it is sent as the X-Aq-Delivery header too.
	ID       string        `json:"id"`
	Need     string        `json:"need,omitempty"`
	JobID    string        `json:"jobId"`
	Title    string        `json:"title,omitempty"`
	Repo     string        `json:"repo"`
	Stage    job.Stage     `json:"stage"`
	Reason   job.Reason    `json:"reason,omitempty"`
	Detail   string        `json:"detail,omitempty"`
	Attempt  int           `json:"attempt"`
	Branch   string        `json:"branch,omitempty"`
	PRURL    string        `json:"prUrl,omitempty"`
	Insights *job.Insights `json:"insights,omitempty"`
	Factory  string        `json:"factory"`
	Mode     string        `json:"mode"` // local | fleet
	TraceID  string        `json:"traceId,omitempty"`
	Time     time.Time     `json:"time"`
}

// End is a job's end as the notifier judges it.
type End struct {
	JobID, Title, Repo string
	Attempt            int
	Stage              job.Stage // where the job went, as far as aq knows
	Reason             job.Reason
	Detail             string
	Fenced             bool // another factory owns the job: never notified from here
	// Final: a failure is for good (dead letter, failed, no retries left).
	Final         bool
	Branch, PRURL string
	Insights      job.Insights
	Mode          string
	TraceID       string
}

// For decides which event a job's end is, if any (a pure function):
//
//   - fenced, lease lost or interrupted (aq stopped): none — not this run's
//     result to announce;
//   - budget_exceeded: needs_person (budget), final or not — the next
//     attempt would spend as much again;
//   - any other failure: failed when Final, else none (it will be retried);
//   - shipped: shipped; review or testing: needs_person (review).
func For(e End) (Kind, string, bool) {
	switch {
	case e.Fenced || e.Reason == job.ReasonFenced || e.Reason == job.ReasonLeaseLost || e.Reason == job.ReasonInterrupted:
		return "", "", false
	case e.Reason == job.ReasonBudgetExceeded:
		return NeedsPerson, NeedBudget, true
	case e.Reason != "" && e.Final:
		return Failed, "", true
	case e.Reason != "":
		return "", "", false
	}
	switch e.Stage {
	case job.Shipped:
		return Shipped, "", true
	case job.Review, job.Testing:
		return NeedsPerson, NeedReview, true
	}
	return "", "", false
}

// Options configure a Notifier.
type Options struct {
	// URL is AQ_NOTIFY_URL (http or https). Empty: Start returns nil, and a
	// nil Notifier does nothing.
	URL     string
	Factory string // the factory (or host) the events are from
	Log     *slog.Logger
	// Redactor masks secrets in an event's detail text.
	Redactor *secrets.Redactor
	// HTTP is the client (nil: a pooled one); Timeout bounds each attempt
	// (default 10 s), so a receiver that hangs costs one attempt's time.
	HTTP    *http.Client
	Timeout time.Duration
	// Retries after the first attempt (default 5), waiting MinWait doubling
	// up to MaxWait between them (defaults 1 s and 30 s; a Retry-After on
	// 429/503 is honoured).
	Retries          int
	MinWait, MaxWait time.Duration
	// Queue bounds the events waiting to be sent (default 64): a full queue
	// drops the new event with a warning rather than block a job.
	Queue int
	Now   func() time.Time
}

// Notifier delivers events in the background. A nil *Notifier is off.
type Notifier struct {
	o      Options
	log    *slog.Logger
	client *retryablehttp.Client
	q      chan Event
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu     sync.Mutex
	closed bool

	sent, failed, dropped atomic.Int64
}

// Start returns a Notifier for o.URL whose delivery goroutine runs until
// Close (or ctx ends); nil when o.URL is empty.
func Start(ctx context.Context, o Options) *Notifier {
	if o.URL == "" {
		return nil
	}
	if o.Log == nil {
		o.Log = slog.New(slog.DiscardHandler)
	}
	if o.Timeout <= 0 {
		o.Timeout = 10 * time.Second
	}
	if o.Retries <= 0 {
		o.Retries = 5
	}
	if o.MinWait <= 0 {
		o.MinWait = time.Second
	}
	if o.MaxWait <= 0 {
		o.MaxWait = 30 * time.Second
	}
	if o.Queue <= 0 {
		o.Queue = 64
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	hc := o.HTTP
	if hc == nil {
		hc = cleanhttp.DefaultPooledClient()
	}
	cp := *hc
	cp.Timeout = o.Timeout
	n := &Notifier{o: o, log: o.Log.With("component", "notify"), q: make(chan Event, o.Queue)}
	n.client = &retryablehttp.Client{
		HTTPClient: &cp, RetryWaitMin: o.MinWait, RetryWaitMax: o.MaxWait, RetryMax: o.Retries,
		CheckRetry: retryablehttp.DefaultRetryPolicy, Backoff: retryablehttp.DefaultBackoff,
		ErrorHandler: retryablehttp.PassthroughErrorHandler,
		RequestLogHook: func(_ retryablehttp.Logger, r *http.Request, attempt int) {
			if attempt > 0 {
				n.log.Debug("notification retried", "event", r.Header.Get("X-Aq-Event"), "delivery", r.Header.Get("X-Aq-Delivery"), "attempt", attempt+1)
			}
		},
	}
	ctx, n.cancel = context.WithCancel(context.WithoutCancel(ctx))
	n.wg.Go(func() { n.loop(ctx) })
	return n
}

// Notify queues the event for e's end, if it is one (For); it never blocks.
// Call it after the job's report: the event says where the job went.
func (n *Notifier) Notify(e End) {
	if n == nil {
		return
	}
	kind, need, ok := For(e)
	if !ok {
		return
	}
	in := e.Insights
	ev := Event{
		Version: Version, Event: kind, Need: need, ID: fmt.Sprintf("%s:%d:%s", e.JobID, e.Attempt, kind),
		JobID: e.JobID, Title: e.Title, Repo: e.Repo, Stage: e.Stage, Reason: e.Reason, Detail: n.detail(e.Detail),
		Attempt: e.Attempt, Branch: e.Branch, PRURL: e.PRURL, Insights: &in, Factory: n.o.Factory, Mode: e.Mode,
		TraceID: e.TraceID, Time: n.o.Now().UTC(),
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.closed {
		n.log.Warn("notification not sent: aq is stopping", "event", kind, "job", e.JobID)
		return
	}
	select {
	case n.q <- ev:
	default:
		n.dropped.Add(1)
		n.log.Warn("notification dropped: too many are waiting to be sent (is the receiver down?)", "event", kind, "job", e.JobID, "queue", cap(n.q))
	}
}

// detail is a failure's detail for a person: masked, one short paragraph.
func (n *Notifier) detail(s string) string {
	if n.o.Redactor != nil {
		s = n.o.Redactor.String(s)
	}
	if len(s) > 1000 {
		s = s[:1000] + "…"
	}
	return s
}

// Close stops taking events and delivers the queued ones within limit;
// what is left then (a receiver that hangs or is down) is given up, with one
// warning. It waits for the delivery goroutine. Safe to call more than once,
// and on a nil Notifier.
func (n *Notifier) Close(limit time.Duration) {
	if n == nil {
		return
	}
	n.mu.Lock()
	if !n.closed {
		n.closed = true
		close(n.q)
	}
	n.mu.Unlock()
	done := make(chan struct{})
	go func() {
		n.wg.Wait()
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(limit):
		n.cancel() // stops the attempt in flight; the rest are counted as not sent
		<-done
	}
	n.cancel()
}

// Sent, Failed and Dropped count deliveries: accepted by the receiver,
// given up after the retries (or at Close), dropped on a full queue.
func (n *Notifier) Sent() int64 { return n.count(&n.sent) }

// Failed: see Sent.
func (n *Notifier) Failed() int64 { return n.count(&n.failed) }

// Dropped: see Sent.
func (n *Notifier) Dropped() int64 { return n.count(&n.dropped) }

func (n *Notifier) count(c *atomic.Int64) int64 {
	if n == nil {
		return 0
	}
	return c.Load()
}

func (n *Notifier) loop(ctx context.Context) {
	abandoned := 0
	for ev := range n.q {
		if ctx.Err() != nil {
			abandoned++
			n.failed.Add(1)
			continue
		}
		n.deliver(ctx, ev)
	}
	if abandoned > 0 {
		n.log.Warn("notifications not sent: aq stopped before the receiver took them", "count", abandoned)
	}
}

// deliver POSTs one event, with the client's retries.
func (n *Notifier) deliver(ctx context.Context, ev Event) {
	body, err := json.Marshal(ev)
	if err != nil {
		n.failed.Add(1)
		n.log.Error("cannot encode a notification", "err", err)
		return
	}
	log := n.log.With("event", ev.Event, "job", ev.JobID, "delivery", ev.ID)
	req, err := retryablehttp.NewRequestWithContext(ctx, http.MethodPost, n.o.URL, body)
	if err != nil {
		n.failed.Add(1)
		log.Error("cannot build the notification request (check AQ_NOTIFY_URL)")
		return
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("User-Agent", "aq/"+version.Get().Version)
	req.Header.Set("X-Aq-Event", string(ev.Event))
	req.Header.Set("X-Aq-Delivery", ev.ID)
	resp, err := n.client.Do(req)
	if resp != nil {
		resp.Body.Close()
	}
	switch {
	case err != nil:
		n.failed.Add(1)
		log.Warn("notification not delivered", "err", urlFree(err))
	case resp.StatusCode < 200 || resp.StatusCode > 299:
		n.failed.Add(1)
		log.Warn("notification refused by the receiver", "status", resp.StatusCode)
	default:
		n.sent.Add(1)
		log.Info("notification sent", "status", resp.StatusCode)
	}
}

// urlFree is err without the URL a *url.Error quotes (it may hold a token).
func urlFree(err error) string {
	var ue *url.Error
	if errors.As(err, &ue) {
		return ue.Op + ": " + ue.Err.Error()
	}
	return err.Error()
}
