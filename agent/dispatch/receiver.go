package dispatch

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/azcore"
	"github.com/Azure/azure-sdk-for-go/sdk/azidentity"
	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"

	"github.com/aqfleet/aq/internal/aqerr"
	"github.com/aqfleet/aq/internal/logging"
	"github.com/aqfleet/aq/internal/secrets"
)

// DefaultTopic is AQ_SB_TOPIC's default.
const DefaultTopic = "fleet-dispatch"

// Config is what the receiver takes from aq's configuration (docs/servicebus.md; `aq config`).
type Config struct {
	FactoryID string // AQ_FACTORY_ID: messages for any other factory are dead-lettered
	// Pool (AQ_FACTORY_POOL): a message targeted at the pool is this
	// factory's to take too (a replica of the pool).
	Pool string
	// Namespace (AQ_SB_NAMESPACE) is the fully-qualified namespace: the
	// production path, authenticated with a token credential (managed identity).
	Namespace string
	// ConnectionString (AQ_SB_CONNECTION_STRING) is the dev/emulator path. It
	// is a secret: it never reaches a log line or an error.
	ConnectionString string
	Topic            string // AQ_SB_TOPIC, default fleet-dispatch
	Subscription     string // AQ_SB_SUBSCRIPTION, default FactoryID
	// Sessions (AQ_SB_SESSIONS) receives with sessions keyed by repo
	// (sessions.go): the subscription must require sessions and the
	// dispatcher set SessionId = repo on every message.
	Sessions bool
}

// Enabled reports whether broker delivery is configured at all.
func (c Config) Enabled() bool { return c.Namespace != "" || c.ConnectionString != "" }

// Options configure a Receiver.
type Options struct {
	Config
	Acceptor Acceptor // required
	Handler  Handler  // required
	Slots    Slots    // required: the receiver takes a slot before each message
	Metrics  Metrics  // optional
	Logger   *slog.Logger
	// OnHealth is called on every change of the broker link's health, from
	// the receiver's goroutine; keep it quick.
	OnHealth func(Health)
	// Credential authenticates the Namespace path. Nil means
	// azidentity.DefaultAzureCredential (production only: tests inject one).
	Credential azcore.TokenCredential
	// TLSConfig overrides the TLS settings of the amqps:// connection.
	TLSConfig *tls.Config
	// Backoff paces reconnects to the broker.
	Backoff Backoff
	// SDKRetry is the SDK's own retry for one operation. Default: 2 retries,
	// 200ms to 2s: the receiver's Backoff owns the long waits, so that an
	// outage shows as unhealthy quickly and the poll path takes over.
	SDKRetry *azservicebus.RetryOptions
	// SettleTimeout bounds one complete/abandon/dead-letter (default 30s).
	SettleTimeout time.Duration
	// SessionAcceptWait (sessions) is how long one accept of the next free
	// session waits for one (default 30s); the broker answers "none" at
	// the end of it and the receiver asks again.
	SessionAcceptWait time.Duration
	// SessionIdle (sessions) is how long a held session waits for its next
	// message before the receiver closes it, freeing it (default 1s).
	SessionIdle time.Duration
	// Unfit, when set, is asked before each accept whether this factory
	// can still run the message's job: a non-empty answer (why not: a
	// capability or repo it no longer offers) dead-letters the message
	// (ReasonUnfit) without accepting the job, which stays queued for a
	// factory that has what it needs.
	Unfit func(ctx context.Context, m Message) string
}

// Health is the state of the broker link.
type Health struct {
	Healthy bool
	Err     error // why it is unhealthy (secrets masked); nil when healthy
	Since   time.Time
}

// ErrStopped is the Health.Err after Run returned.
var ErrStopped = errors.New("dispatch receiver stopped")

// Receiver receives this factory's dispatch messages. Build it with New and
// run it with Run; it is safe to call Healthy from other goroutines.
type Receiver struct {
	opts    Options
	path    string
	log     *slog.Logger
	metrics Metrics
	red     *secrets.Redactor
	cred    azcore.TokenCredential

	mu     sync.Mutex
	health Health
	known  bool // health has been reported once

	jobs sync.WaitGroup
	held sync.WaitGroup // held sessions (sessions.go)

	warned atomic.Bool // a lenient message's warning was logged
}

// settler is the part of the SDK receiver that settles messages.
type settler interface {
	CompleteMessage(ctx context.Context, m *azservicebus.ReceivedMessage, o *azservicebus.CompleteMessageOptions) error
	AbandonMessage(ctx context.Context, m *azservicebus.ReceivedMessage, o *azservicebus.AbandonMessageOptions) error
	DeadLetterMessage(ctx context.Context, m *azservicebus.ReceivedMessage, o *azservicebus.DeadLetterOptions) error
}

var _ settler = (*azservicebus.Receiver)(nil)

// New checks opts and builds a Receiver. It dials nothing.
func New(opts Options) (*Receiver, error) {
	c := &opts.Config
	if c.Topic == "" {
		c.Topic = DefaultTopic
	}
	if c.Subscription == "" {
		c.Subscription = c.FactoryID
		if c.Pool != "" {
			c.Subscription = c.Pool
		}
	}
	switch {
	case c.FactoryID == "":
		return nil, aqerr.Usagef("set AQ_FACTORY_ID", "Service Bus delivery needs this factory's id")
	case c.Namespace != "" && c.ConnectionString != "":
		return nil, aqerr.Usagef("unset AQ_SB_CONNECTION_STRING in production (managed identity needs only AQ_SB_NAMESPACE)",
			"both AQ_SB_NAMESPACE and AQ_SB_CONNECTION_STRING are set")
	case !c.Enabled():
		return nil, aqerr.Usagef("set AQ_SB_NAMESPACE (or AQ_SB_CONNECTION_STRING for an emulator)", "Service Bus delivery is not configured")
	case opts.Acceptor == nil || opts.Handler == nil || opts.Slots == nil:
		return nil, errors.New("dispatch: Acceptor, Handler and Slots are required")
	}
	r := &Receiver{
		opts:    opts,
		path:    c.Topic + "/Subscriptions/" + c.Subscription,
		log:     opts.Logger,
		metrics: opts.Metrics,
		red:     secrets.NewRedactor(nil),
		cred:    opts.Credential,
	}
	if r.log == nil {
		r.log = logging.Discard()
	}
	r.log = r.log.With("component", "dispatch", "subscription", r.path)
	if r.metrics == nil {
		r.metrics = MetricsFuncs{}
	}
	if r.opts.SettleTimeout <= 0 {
		r.opts.SettleTimeout = 30 * time.Second
	}
	if r.opts.SessionAcceptWait <= 0 {
		r.opts.SessionAcceptWait = defaultSessionAcceptWait
	}
	if r.opts.SessionIdle <= 0 {
		r.opts.SessionIdle = defaultSessionIdle
	}
	if c.ConnectionString != "" {
		r.red.Add(ConnectionStringSecrets(c.ConnectionString)...)
		if err := CheckConnectionString(c.ConnectionString); err != nil {
			return nil, err
		}
	}
	return r, nil
}

// Healthy reports whether the broker link is connected and receiving.
func (r *Receiver) Healthy() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.health.Healthy
}

// Health returns the current health.
func (r *Receiver) Health() Health {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.health
}

func (r *Receiver) setHealth(ok bool, err error) {
	if ok {
		err = nil
	} else if err != nil {
		err = r.clean(err)
	}
	r.mu.Lock()
	// A link that stays down is reported again when it turns out to be a
	// missing subscription (the first try may have met a dropped
	// connection): that one stops a replica.
	changed := !r.known || r.health.Healthy != ok || (!ok && IsMissingSubscription(err) != IsMissingSubscription(r.health.Err))
	if changed {
		r.known = true
		r.health = Health{Healthy: ok, Err: err, Since: time.Now()}
	}
	h := r.health
	r.mu.Unlock()
	if !changed {
		return
	}
	if ok {
		r.log.Info("broker link healthy")
	} else {
		r.log.Warn("broker link unhealthy", "err", errString(err))
	}
	if r.opts.OnHealth != nil {
		r.opts.OnHealth(h)
	}
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

// cleanError keeps an error's chain (for errors.Is) but prints with aq's
// secrets masked.
type cleanError struct {
	msg string
	err error
}

func (e *cleanError) Error() string { return e.msg }
func (e *cleanError) Unwrap() error { return e.err }

func (r *Receiver) clean(err error) error {
	var ce *cleanError
	if err == nil || errors.As(err, &ce) {
		return err
	}
	return &cleanError{msg: r.red.String(err.Error()), err: err}
}

func (r *Receiver) newClient() (*azservicebus.Client, error) {
	retry := azservicebus.RetryOptions{MaxRetries: 2, RetryDelay: 200 * time.Millisecond, MaxRetryDelay: 2 * time.Second}
	if r.opts.SDKRetry != nil {
		retry = *r.opts.SDKRetry
	}
	co := &azservicebus.ClientOptions{TLSConfig: r.opts.TLSConfig, RetryOptions: retry, ApplicationID: "aq"}
	if r.opts.ConnectionString != "" {
		c, err := azservicebus.NewClientFromConnectionString(r.opts.ConnectionString, co)
		if err != nil {
			// The SDK's parse errors may quote the string: say only what is wrong.
			return nil, aqerr.Usagef("check AQ_SB_CONNECTION_STRING (Endpoint=sb://HOST;SharedAccessKeyName=...;SharedAccessKey=...)",
				"AQ_SB_CONNECTION_STRING is not a valid Service Bus connection string")
		}
		return c, nil
	}
	cred := r.cred
	if cred == nil {
		dc, err := azidentity.NewDefaultAzureCredential(nil)
		if err != nil {
			return nil, aqerr.Wrap(aqerr.Usage, err, "no Azure credential for AQ_SB_NAMESPACE: "+r.red.String(err.Error()),
				"give this host a managed identity with the Azure Service Bus Data Receiver role")
		}
		cred = dc
	}
	c, err := azservicebus.NewClient(r.opts.Namespace, cred, co)
	if err != nil {
		return nil, aqerr.Wrap(aqerr.Usage, err, "Service Bus client for "+r.opts.Namespace+": "+err.Error(), "check AQ_SB_NAMESPACE")
	}
	return c, nil
}

// Run receives until ctx is done, reconnecting with backoff while the broker
// is unreachable. When ctx is done it stops taking messages, lets the ones in
// hand settle (with sessions: lets each held session's job in hand finish,
// its lock renewed, then closes the session), closes the connection, and
// then waits for running Handlers (a drain). It returns an error only when
// it cannot start at all, or the broker refuses this receiver's kind (a
// subscription that requires sessions without AQ_SB_SESSIONS, or the
// reverse): a configuration error, after the jobs in hand have finished.
func (r *Receiver) Run(ctx context.Context) error {
	client, err := r.newClient()
	if err != nil {
		return err
	}
	attempt := 0
	var fatal error
	for ctx.Err() == nil {
		var err error
		if r.opts.Sessions {
			err = r.receiveSessions(ctx, client, &attempt)
		} else {
			err = r.receive(ctx, client, &attempt)
		}
		if ctx.Err() != nil {
			break
		}
		if aqerr.ExitCode(err) == aqerr.Usage {
			fatal = err
			r.log.Error("the broker refused this receiver", "err", err.Error())
			break
		}
		r.setHealth(false, err)
		delay := r.opts.Backoff.Delay(attempt, rand.Float64())
		attempt++
		r.log.Debug("reconnecting to the broker", "in", delay, "attempt", attempt)
		t := time.NewTimer(delay)
		select {
		case <-ctx.Done():
		case <-t.C:
		}
		t.Stop()
	}
	r.held.Wait()
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), r.opts.SettleTimeout)
	_ = client.Close(cctx)
	cancel()
	r.setHealth(false, ErrStopped)
	r.jobs.Wait()
	return fatal
}

// linkChecks bounds how often in a row (each within linkCheckWindow of the
// last) a receive may end with neither a message nor an error — the SDK's sign
// of a dropped link it re-creates on the next call — before the receiver
// treats the link as broken and reconnects with backoff. Service Bus detaches
// idle links every few minutes; those drops are far apart and never add up.
const (
	linkChecks      = 3
	linkCheckWindow = time.Minute
)

// receive opens the subscription, checks the links with a peek (the SDK opens
// links lazily, and a receive blocks until a message comes, so only a
// completed management round trip proves the link is up), then takes one
// message per free slot until ctx is done or the link fails.
func (r *Receiver) receive(ctx context.Context, client *azservicebus.Client, attempt *int) error {
	rcv, err := client.NewReceiverForSubscription(r.opts.Topic, r.opts.Subscription,
		&azservicebus.ReceiverOptions{ReceiveMode: azservicebus.ReceiveModePeekLock})
	if err != nil {
		return r.missing(err)
	}
	var inHand sync.WaitGroup // messages being accepted and settled on rcv
	defer func() {
		inHand.Wait()
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), r.opts.SettleTimeout)
		_ = rcv.Close(cctx)
		cancel()
	}()
	if _, err := rcv.PeekMessages(ctx, 1, nil); err != nil {
		if merr := r.kindMismatch(err); merr != nil {
			return merr
		}
		if err := r.missing(err); IsMissingSubscription(err) {
			return err
		}
		return fmt.Errorf("open %s: %w", r.path, err)
	}
	r.setHealth(true, nil)
	*attempt = 0
	empty, lastEmpty := 0, time.Time{}
	for {
		if err := r.opts.Slots.Acquire(ctx); err != nil {
			return nil
		}
		// One credit per free slot: the broker never pushes more messages
		// than this factory can start.
		msgs, err := rcv.ReceiveMessages(ctx, 1, nil)
		if err != nil || len(msgs) == 0 {
			r.opts.Slots.Release()
			if ctx.Err() != nil {
				return nil
			}
			if err != nil {
				r.setHealth(false, err)
				return err
			}
			if time.Since(lastEmpty) > linkCheckWindow {
				empty = 0
			}
			lastEmpty = time.Now()
			if empty++; empty >= linkChecks {
				err := fmt.Errorf("the link to %s keeps dropping", r.path)
				r.setHealth(false, err)
				return err
			}
			if _, err := rcv.PeekMessages(ctx, 1, nil); err != nil {
				if ctx.Err() != nil {
					return nil
				}
				r.setHealth(false, err)
				return err
			}
			continue
		}
		empty = 0
		inHand.Add(1)
		go func(m *azservicebus.ReceivedMessage) {
			defer inHand.Done()
			r.handle(ctx, rcv, m, r.opts.Slots.Release)
		}(msgs[0])
	}
}

// handle acts on one message holding one slot: dead-letter it, or accept the
// job and settle by the outcome table; an accepted job goes to the Handler
// before its message is completed. done is called when the message's work
// is over: once it is settled, or for an accepted job when the Handler
// returns (the slot is the job's until then).
func (r *Receiver) handle(ctx context.Context, s settler, msg *azservicebus.ReceivedMessage, done func()) {
	handedOver := false
	defer func() {
		if !handedOver {
			done()
		}
	}()
	log := r.log.With("messageId", msg.MessageID, "deliveryCount", msg.DeliveryCount)
	m, warning, err := parse(msg.Body, msg.MessageID, msg.ApplicationProperties, r.opts.FactoryID, r.opts.Pool)
	if warning != "" && r.warned.CompareAndSwap(false, true) {
		// A dispatcher that does this does it to every message: once.
		log.Warn("dispatch message differs from the contract; running it with the body authoritative (logged once)", "job", m.JobID, "warning", warning)
	}
	var inv *invalid
	if errors.As(err, &inv) {
		o := OutcomeMalformed
		if inv.Reason == ReasonMistargeted {
			o = OutcomeMistargeted
		}
		r.settle(ctx, s, msg, o.Settle(), inv, log)
		r.metrics.Message(o)
		log.Warn("dispatch message dead-lettered", "reason", inv.Reason, "description", inv.Description)
		return
	}
	log = log.With("job", m.JobID, "repo", m.Repo)
	if r.opts.Unfit != nil {
		if why := r.opts.Unfit(ctx, m); why != "" {
			r.settle(ctx, s, msg, OutcomeUnfit.Settle(), &invalid{Reason: ReasonUnfit, Description: why}, log)
			r.metrics.Message(OutcomeUnfit)
			log.Warn("dispatch message dead-lettered: its job needs what this factory no longer offers; it stays queued for another", "why", why)
			return
		}
	}
	acc, err := r.opts.Acceptor.Accept(ctx, m.JobID)
	o := Classify(err)
	if o == OutcomeAccepted && msg.EnqueuedTime != nil {
		acc.Lag = time.Since(*msg.EnqueuedTime)
		acc.EnqueuedTime = *msg.EnqueuedTime
		r.metrics.Lag(acc.Lag)
	}
	r.metrics.Message(o)
	if o != OutcomeAccepted {
		r.settle(ctx, s, msg, o.Settle(), nil, log)
		log.Info("dispatch message settled", "outcome", string(o), "settle", string(o.Settle()), "err", errString(r.clean(err)))
		return
	}
	// The lease is this factory's from the accept on, and only the job's
	// runner records and renews it: hand the job over first, then complete
	// the message beside it (complete-on-claim). A settlement can hang on a
	// broken link for up to SettleTimeout; were the job to wait for it, its
	// lease would go unrenewed (and lapse, with a TTL below that) and a
	// factory killed meanwhile would not know it held the job.
	log.Info("job accepted from the broker", "lag", acc.Lag, "epoch", acc.epoch())
	acc.Message = m
	acc.DeliveryCount = msg.DeliveryCount
	handedOver = true
	r.jobs.Add(1)
	go func() {
		defer r.jobs.Done()
		defer done()
		r.opts.Handler(context.WithoutCancel(ctx), acc)
	}()
	r.settle(ctx, s, msg, o.Settle(), nil, log)
}

func (r *Receiver) settle(ctx context.Context, s settler, msg *azservicebus.ReceivedMessage, how Settlement, inv *invalid, log *slog.Logger) {
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), r.opts.SettleTimeout)
	defer cancel()
	var err error
	switch how {
	case Complete:
		err = s.CompleteMessage(sctx, msg, nil)
	case Abandon:
		err = s.AbandonMessage(sctx, msg, nil)
	case DeadLetter:
		err = s.DeadLetterMessage(sctx, msg, &azservicebus.DeadLetterOptions{Reason: &inv.Reason, ErrorDescription: &inv.Description})
	}
	if err != nil {
		r.metrics.SettleFailed(how)
		log.Warn("settling the message failed; the broker redelivers it when its lock expires", "settle", string(how), "err", r.clean(err).Error())
	}
}
