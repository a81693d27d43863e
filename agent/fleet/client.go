package fleet

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/hashicorp/go-cleanhttp"
	"github.com/hashicorp/go-retryablehttp"
	"go.opentelemetry.io/otel/attribute"

	"github.com/aqfleet/aq/agent/holds"
	"github.com/aqfleet/aq/internal/brief"
	"github.com/aqfleet/aq/internal/secrets"
	"github.com/aqfleet/aq/internal/telemetry"
	"github.com/aqfleet/aq/internal/version"
	"github.com/aqfleet/aq/job"
)

// ClientOptions configure a Client.
type ClientOptions struct {
	// API is the coordinator's base URL (AQ_FLEET_API, e.g. https://host/api);
	// calls go to API + "/fleet/...".
	API string
	// Token is the bearer token (the factory token, or the enrollment token
	// for Enroll). It is never logged or put in an error.
	Token     string
	ProductID string // x-product-id
	FactoryID string
	Budgets   Budgets
	// HTTP is the underlying client; nil means a pooled client without its
	// own timeout (Budgets.PerTry bounds each try).
	HTTP *http.Client
	// Redactor masks secrets in server text that ends up in errors.
	Redactor *secrets.Redactor
	Log      *slog.Logger
	Now      func() time.Time
	Rand     func() float64
	// Holds are the engines held until their limit resets: their
	// engine:<name> capability is left out of every claim and heartbeat
	// (Offer) until then. nil: none.
	Holds *holds.Store
}

// Client calls the coordinator's /fleet API (docs/contract.md, "Requests, retries and errors"). Every call carries
// the bearer token and x-product-id, retries only what can succeed on retry
// within the call's budget, and maps answers to typed errors: 409
// *FencedError, 401/403 *AuthError, a 404/405 for a route the coordinator
// does not have *RouteAbsentError (remembered: routes.go), 404 ErrGone (for
// a job), other 4xx *StatusError, and an exhausted budget *TransientError.
// It is safe for concurrent use.
type Client struct {
	o    ClientOptions
	base *url.URL
	http *http.Client

	mu      sync.RWMutex
	token   string
	fid     string
	caps    []string
	repos   []string
	observe func(CallResult)

	// routes is what the coordinator answered about its routes (routes.go).
	routes routeBook
	// skewed is set once a clock skew was logged (it is said once).
	skewed sync.Once
}

// CallResult is one finished call to the coordinator (after its retries),
// for metrics: a daemon counts claims, 409 conflicts, renewal and heartbeat
// failures and gate reads from these.
type CallResult struct {
	Call   string // method and route, e.g. "POST /fleet/claim"
	Status int    // the last HTTP status; 0 when no answer came
	Err    error  // nil on success
	JobID  string // for a job's call
}

// Observe sets fn to be called after every call, from the calling goroutine
// (nil: none). fn must be quick and safe for concurrent use.
func (c *Client) Observe(fn func(CallResult)) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.observe = fn
}

// NewClient returns a client for o.API.
func NewClient(o ClientOptions) (*Client, error) {
	u, err := url.Parse(strings.TrimRight(o.API, "/"))
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("fleet API %q is not an http(s) URL", o.API)
	}
	if o.Budgets == (Budgets{}) {
		o.Budgets = DefaultBudgets(0)
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.Rand == nil {
		o.Rand = defaultRand
	}
	if o.Log == nil {
		o.Log = slog.New(slog.DiscardHandler)
	}
	hc := o.HTTP
	if hc == nil {
		hc = cleanhttp.DefaultPooledClient()
	}
	return &Client{o: o, base: u, http: hc, token: o.Token, fid: o.FactoryID}, nil
}

// SetToken replaces the bearer token (after enrollment).
func (c *Client) SetToken(tok string) {
	c.mu.Lock()
	c.token = tok
	c.mu.Unlock()
	if c.o.Redactor != nil {
		c.o.Redactor.Add(tok)
	}
}

// SetFactoryID sets the id this client acts as (enrollment may assign one).
func (c *Client) SetFactoryID(id string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if id != "" {
		c.fid = id
	}
}

// SetOffer sets what this factory offers: the capabilities and repos claims
// send.
func (c *Client) SetOffer(capabilities, repos []string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.caps = append([]string{}, capabilities...)
	c.repos = append([]string{}, repos...)
}

// FactoryID is the id this client acts as.
func (c *Client) FactoryID() string {
	c.mu.RLock()
	defer c.mu.RUnlock()
	return c.fid
}

// Offer returns the capabilities and repos claims and heartbeats send:
// SetOffer's, less the engines held until their limit resets.
func (c *Client) Offer() (capabilities, repos []string) {
	c.mu.RLock()
	caps, repos := append([]string{}, c.caps...), append([]string{}, c.repos...)
	c.mu.RUnlock()
	return c.o.Holds.Filter(caps), repos
}

// Budgets are the client's retry budgets.
func (c *Client) Budgets() Budgets { return c.o.Budgets }

// API is the coordinator's base URL.
func (c *Client) API() string { return c.base.String() }

// Enroll trades the enrollment token (the client's current token) for a
// factory token. It does not change the client's token.
func (c *Client) Enroll(ctx context.Context, req EnrollRequest) (*Enrollment, error) {
	var out Enrollment
	if _, err := c.do(ctx, call{name: RouteEnroll, method: http.MethodPost, path: "/fleet/factories/enroll", body: req, budget: c.o.Budgets.Enroll}, &out); err != nil {
		return nil, err
	}
	if out.Token == "" {
		return nil, &ContractError{Call: RouteEnroll, Status: http.StatusOK, Detail: "the answer carries no token"}
	}
	if out.FactoryID == "" {
		out.FactoryID = req.FactoryID
	}
	return &out, nil
}

// Heartbeat reports this factory alive. Its budget is below the heartbeat
// interval: the next beat follows.
func (c *Client) Heartbeat(ctx context.Context, hb HeartbeatRequest) error {
	if hb.FactoryID == "" {
		hb.FactoryID = c.FactoryID()
	}
	_, err := c.do(ctx, call{name: RouteHeartbeat, method: http.MethodPost, path: "/fleet/factories/heartbeat", body: hb, budget: c.o.Budgets.Heartbeat}, nil)
	return err
}

// Deregister tells the coordinator this factory is leaving for good (a
// replica that exits), so that its record does not linger as a stale
// factory. A coordinator without the route (today's) is fine: it is
// remembered and not asked again; a 404 for this factory (the coordinator
// does not know it) is fine too.
func (c *Client) Deregister(ctx context.Context) error {
	id := c.FactoryID()
	_, err := c.do(ctx, call{name: RouteDeregister, method: http.MethodPost,
		path: "/fleet/factories/" + url.PathEscape(id) + "/deregister", body: map[string]string{"factoryId": id}, budget: c.o.Budgets.Heartbeat}, nil)
	var se *StatusError
	if IsRouteAbsent(err) || errors.As(err, &se) && se.Status == http.StatusNotFound {
		return nil
	}
	return err
}

// QueueState reads the queue's version (the gate).
func (c *Client) QueueState(ctx context.Context) (QueueState, error) {
	var qs QueueState
	_, err := c.do(ctx, call{name: RouteQueueState, method: http.MethodGet, path: "/fleet/queue-state", budget: c.o.Budgets.QueueState}, &qs)
	return qs, err
}

// Claim asks for the best job this factory can run; nil, nil when there is
// none (204). With dryRun (shadow mode) nothing is leased: the answer says
// which job the coordinator would hand out.
func (c *Client) Claim(ctx context.Context, dryRun bool) (*Claim, error) {
	return c.ClaimRepos(ctx, dryRun, nil)
}

// ClaimRepos is Claim advertising only repos instead of the offer's repos
// (nil: the offer's), in repos[] and as repo:<name> capabilities: a daemon
// leaves out the repos it is busy with, so the coordinator hands it work it
// can start now.
func (c *Client) ClaimRepos(ctx context.Context, dryRun bool, only []string) (*Claim, error) {
	caps, repos := c.Offer()
	if only != nil {
		repos = append([]string{}, only...)
		keep := make(map[string]bool, len(only))
		for _, r := range only {
			keep["repo:"+r] = true
		}
		kept := caps[:0]
		for _, t := range caps {
			if !strings.HasPrefix(t, "repo:") || keep[t] {
				kept = append(kept, t)
			}
		}
		caps = kept
	}
	req := ClaimRequest{FactoryID: c.FactoryID(), Capabilities: caps, Repos: repos, DryRun: dryRun}
	var cl Claim
	info, err := c.do(ctx, call{name: RouteClaim, method: http.MethodPost, path: "/fleet/claim", body: req, budget: c.o.Budgets.Claim}, &cl)
	if err != nil {
		return nil, err
	}
	if info.status == http.StatusNoContent || cl.Job.ID == "" {
		return nil, nil
	}
	cl.Source = "poll"
	c.fixClaim(&cl, info)
	return &cl, nil
}

// Accept takes the lease on one job (a broker delivery). 409 is a
// *FencedError (owned elsewhere); 404 ErrGone.
func (c *Client) Accept(ctx context.Context, jobID string) (*Claim, error) {
	var cl Claim
	name := RouteAccept
	info, err := c.do(ctx, call{name: name, method: http.MethodPost, path: "/fleet/accept", body: AcceptRequest{JobID: jobID, FactoryID: c.FactoryID()}, budget: c.o.Budgets.Accept, jobID: jobID}, &cl)
	if err != nil {
		return nil, err
	}
	if cl.Job.ID == "" {
		return nil, &ContractError{Call: name, Status: info.status, Detail: "the answer carries no job"}
	}
	cl.Source, cl.Asked = "broker", jobID
	c.fixClaim(&cl, info)
	return &cl, nil
}

func (c *Client) fixClaim(cl *Claim, info answer) {
	if cl.LeaseEpoch == 0 {
		cl.LeaseEpoch = cl.Job.LeaseEpoch
	}
	cl.Job.LeaseEpoch = cl.LeaseEpoch
	cl.LocalExpiry = localExpiry(cl.LeaseExpiresAt, cl.TTL, info)
}

// Renew extends the lease on jobID at epoch. It retries transient failures
// until ctx's deadline (the lease's owner sets it short of the expiry) or the
// Renew budget, whichever comes first.
func (c *Client) Renew(ctx context.Context, jobID string, epoch int64) (Lease, error) {
	var l Lease
	info, err := c.do(ctx, call{name: RouteRenew, method: http.MethodPost, path: "/fleet/jobs/" + url.PathEscape(jobID) + "/lease/renew",
		body: LeaseRequest{FactoryID: c.FactoryID(), LeaseEpoch: epoch}, budget: c.o.Budgets.Renew, jobID: jobID, epoch: epoch}, &l)
	if err != nil {
		return Lease{}, err
	}
	l.LocalExpiry = localExpiry(l.ExpiresAt, l.TTL, info)
	return l, nil
}

// Release gives the lease back without a failure (the job never started
// here). Its budget is seconds: the reaper frees the lease anyway.
func (c *Client) Release(ctx context.Context, jobID string, epoch int64) error {
	return c.release(ctx, jobID, epoch, c.o.Budgets.Release)
}

func (c *Client) release(ctx context.Context, jobID string, epoch int64, budget time.Duration) error {
	_, err := c.do(ctx, call{name: RouteRelease, method: http.MethodPost, path: "/fleet/jobs/" + url.PathEscape(jobID) + "/lease/release",
		body: LeaseRequest{FactoryID: c.FactoryID(), LeaseEpoch: epoch}, budget: budget, jobID: jobID, epoch: epoch}, nil)
	return err
}

// Patch sends a fenced stage report. A terminal stage retries for the
// FinalReport budget, others for Report. 409 is a *FencedError.
func (c *Client) Patch(ctx context.Context, jobID string, p PatchRequest) (*Job, error) {
	budget := c.o.Budgets.Report
	if p.Terminal() {
		budget = c.o.Budgets.FinalReport
	}
	return c.patch(ctx, jobID, p, budget)
}

func (c *Client) patch(ctx context.Context, jobID string, p PatchRequest, budget time.Duration) (*Job, error) {
	var j Job
	if _, err := c.do(ctx, call{name: RoutePatch, method: http.MethodPatch, path: "/fleet/jobs/" + url.PathEscape(jobID), body: p, budget: budget, jobID: jobID, epoch: p.LeaseEpoch}, &j); err != nil {
		return nil, err
	}
	return &j, nil
}

// Fail reports a failure and releases the lease at once; the answer is the
// stage the job went to (queued, failed or dead_letter). A coordinator
// without /fleet/fail (today's) gets the fallback: a fenced PATCH, then
// lease/release (failByPatch); exhausted says the job has no retries left
// (its stage is then failed rather than queued).
func (c *Client) Fail(ctx context.Context, f FailRequest, exhausted bool) (string, error) {
	return c.fail(ctx, f, exhausted, c.o.Budgets.FinalReport)
}

func (c *Client) fail(ctx context.Context, f FailRequest, exhausted bool, budget time.Duration) (string, error) {
	if f.FactoryID == "" {
		f.FactoryID = c.FactoryID()
	}
	var a FailAnswer
	_, err := c.do(ctx, call{name: RouteFail, method: http.MethodPost, path: "/fleet/fail", body: f, budget: budget, jobID: f.JobID, epoch: f.LeaseEpoch}, &a)
	if IsRouteAbsent(err) {
		return c.failByPatch(ctx, f, exhausted, budget)
	}
	if err != nil {
		return "", err
	}
	return a.Stage, nil
}

// Submit posts a job (aq submit in fleet mode).
func (c *Client) Submit(ctx context.Context, j *job.Job, bodyMd []byte) (*SubmitAnswer, error) {
	req := SubmitRequest{Manifest: j, BodyMd: string(bodyMd), IdempotencyKey: j.IdempotencyKey}
	var a SubmitAnswer
	if _, err := c.do(ctx, call{name: RouteSubmit, method: http.MethodPost, path: "/fleet/jobs", body: req, budget: c.o.Budgets.Submit}, &a); err != nil {
		return nil, err
	}
	if a.JobID == "" {
		a.JobID = j.ID
	}
	return &a, nil
}

// call is one API call.
type call struct {
	name   string // method and route, for errors and logs
	method string
	path   string
	body   any
	budget time.Duration
	jobID  string // for fenced/gone errors
	epoch  int64
	// operator: a read or action of the operator's (aq status, the board,
	// aq job) on a route a coordinator may lack; a 404 or 405 is a
	// *RouteAbsentError (not ErrGone), remembered without a log line (the
	// caller names what is missing).
	operator bool
	// raw, when set, receives a 2xx answer's body as it is (gunzipped when
	// the server sent it gzip-encoded) instead of decoding JSON; limit
	// bounds it (0: maxAnswer).
	raw   *[]byte
	limit int64
}

// answer is what a successful call saw.
type answer struct {
	status int
	sentAt time.Time // when the last try was sent (this host's clock, monotonic)
	date   time.Time // the server's Date header, zero if absent
}

// maxAnswer bounds an answer's body (a job document holds a manifest of at
// most 1 MiB).
const maxAnswer = 8 << 20

func (c *Client) do(ctx context.Context, cl call, out any) (ans answer, err error) {
	if err := c.knownAbsent(cl.name); err != nil {
		return answer{}, err // learnt before: nothing is sent
	}
	c.mu.RLock()
	obs := c.observe
	c.mu.RUnlock()
	if obs != nil {
		defer func() { obs(CallResult{Call: cl.name, Status: ans.status, Err: err, JobID: cl.jobID}) }()
	}
	return c.try(ctx, cl, out)
}

func (c *Client) try(ctx context.Context, cl call, out any) (answer, error) {
	var body []byte
	if cl.body != nil {
		var err error
		if body, err = json.Marshal(cl.body); err != nil {
			return answer{}, fmt.Errorf("%s: %w", cl.name, err)
		}
	}
	budget := cl.budget
	if budget <= 0 {
		budget = 10 * time.Second
	}
	at := &attempts{deadline: c.o.Now().Add(budget), min: c.o.Budgets.MinWait, max: c.o.Budgets.MaxWait, rnd: c.o.Rand, now: c.o.Now}
	if d, ok := ctx.Deadline(); ok && d.Before(at.deadline) {
		at.deadline = d
	}
	var sentAt time.Time // when the last try was sent (lease expiry skew)
	hc := c.http
	if c.o.Budgets.PerTry > 0 {
		// Each try gets its own deadline, so one hung connection cannot eat
		// the whole budget.
		hc = perTryClient(c.http, c.o.Budgets.PerTry)
	}
	// A terminal report's attempts take turns on the wire with its job's
	// lease renewals (wireTurn): each one from the request hook to the
	// retry decision.
	turn, onWire := turnFor(ctx, cl), false
	checkRetry := at.checkRetry
	if turn != nil {
		checkRetry = func(ctx context.Context, resp *http.Response, err error) (bool, error) {
			retry, cerr := at.checkRetry(ctx, resp, err)
			if onWire {
				onWire = false
				turn.sent(!retry || !untaken(resp, err))
			}
			return retry, cerr
		}
	}
	// A retryablehttp client per call: its CheckRetry and Backoff close over
	// this call's budget.
	rc := &retryablehttp.Client{
		HTTPClient:   hc,
		RetryWaitMin: c.o.Budgets.MinWait,
		RetryWaitMax: c.o.Budgets.MaxWait,
		RetryMax:     1 << 20, // the budget, not a count, ends the retries
		CheckRetry:   checkRetry,
		Backoff:      at.backoff,
		ErrorHandler: retryablehttp.PassthroughErrorHandler,
		RequestLogHook: func(_ retryablehttp.Logger, _ *http.Request, n int) {
			if turn != nil {
				onWire = turn.send(ctx)
			}
			sentAt = c.o.Now()
			if n > 0 {
				c.o.Log.Debug("fleet call retry", "call", cl.name, "attempt", n+1, "job", cl.jobID)
				telemetry.Event(ctx, telemetry.EventRetry, attribute.String(telemetry.AttrCall, cl.name), attribute.Int(telemetry.AttrAttemptN, n+1))
			}
		},
	}
	req, err := retryablehttp.NewRequestWithContext(ctx, cl.method, c.base.String()+cl.path, body)
	if err != nil {
		return answer{}, fmt.Errorf("%s: %w", cl.name, err)
	}
	c.setHeaders(req.Header, body != nil)
	if cl.raw != nil {
		// Asked for explicitly, the transport hands gzip over as it is
		// (rawBody decodes it), whatever the server does.
		req.Header.Set("Accept-Encoding", "gzip")
	}
	resp, err := rc.Do(req)
	if err != nil && resp != nil {
		resp.Body.Close()
	}
	if err != nil {
		if ctx.Err() != nil {
			// The caller's context ended: not the coordinator's fault. A
			// deadline the caller set (a lease renewal's) is still a
			// transient failure of the call.
			if errors.Is(ctx.Err(), context.DeadlineExceeded) {
				return answer{}, &TransientError{Call: cl.name, Tries: at.tries, Err: context.DeadlineExceeded}
			}
			return answer{}, fmt.Errorf("%s: %w", cl.name, ctx.Err())
		}
		if !Retryable(nil, err) {
			return answer{}, &StatusError{Call: cl.name, Detail: c.redact(scrubURL(err.Error()))}
		}
		return answer{}, &TransientError{Call: cl.name, Tries: at.tries, Err: errors.New(c.redact(scrubURL(err.Error())))}
	}
	defer resp.Body.Close()
	limit := int64(maxAnswer)
	if cl.limit > 0 {
		limit = cl.limit
	}
	// One byte over the cap says the answer is over it (rather than
	// decoding a truncated body and blaming its JSON).
	data, rerr := io.ReadAll(io.LimitReader(resp.Body, limit+1))
	over := int64(len(data)) > limit
	if over {
		data = data[:limit]
	}
	info := answer{status: resp.StatusCode, sentAt: sentAt}
	if d, err := http.ParseTime(resp.Header.Get("Date")); err == nil {
		info.date = d
		c.noteSkew(sentAt, c.o.Now(), d)
	}
	if resp.StatusCode == http.StatusRequestedRangeNotSatisfiable && cl.name == RouteLogAppend {
		if le := c.logOffset(data); le != nil {
			return info, le
		}
	}
	switch s := resp.StatusCode; {
	case s >= 200 && s < 300:
		if rerr != nil {
			return info, &TransientError{Call: cl.name, Tries: at.tries, Err: errors.New(c.redact(rerr.Error()))}
		}
		if cl.raw != nil {
			b, err := rawBody(resp, data, limit)
			if err != nil {
				return info, &StatusError{Call: cl.name, Status: s, Detail: c.redact(err.Error())}
			}
			*cl.raw = b
			return info, nil
		}
		if out == nil || s == http.StatusNoContent {
			return info, nil
		}
		if err := decodeAnswer(data, over, limit, out); err != nil {
			// What the server sent is shown, never obeyed: no control
			// character reaches a terminal.
			err.Call, err.Status, err.ContentType = cl.name, s, clipText(job.Printable(resp.Header.Get("Content-Type"), false), 80)
			err.Detail = c.redact(err.Detail)
			return info, err
		}
		return info, nil
	case s == http.StatusUnauthorized || s == http.StatusForbidden:
		return info, &AuthError{Call: cl.name, Status: s, Detail: c.detail(data)}
	case cl.operator && (s == http.StatusNotFound || s == http.StatusMethodNotAllowed):
		// No probe and no log line: the caller names what is missing.
		if s == http.StatusNotFound && cl.jobID != "" && judgeBody(s, data, cl.method, c.base.Path+cl.path) == missingResource {
			return info, fmt.Errorf("%s for job %s: %w", cl.name, cl.jobID, ErrGone)
		}
		ev := c.evidence(data)
		c.markAbsent(cl.name, ev, true)
		return info, &RouteAbsentError{Call: cl.name, Status: s, Evidence: ev}
	case s == http.StatusConflict:
		return info, &FencedError{Call: cl.name, JobID: cl.jobID, Epoch: cl.epoch, Detail: c.detail(data)}
	case s == http.StatusNotFound || s == http.StatusMethodNotAllowed:
		// The route, or what the call names? (routes.go)
		v := judgeBody(s, data, cl.method, c.base.Path+cl.path)
		if v == missingUnsure {
			v = c.probeMissing(ctx, cl, s, resp.Header.Get("Content-Type"), data)
		}
		switch {
		case v == missingRoute:
			ev := c.evidence(data)
			c.markAbsent(cl.name, ev, false)
			return info, &RouteAbsentError{Call: cl.name, Status: s, Evidence: ev}
		case s == http.StatusNotFound && cl.jobID != "":
			return info, fmt.Errorf("%s for job %s: %w", cl.name, cl.jobID, ErrGone)
		}
	case Retryable(resp, nil):
		return info, &TransientError{Call: cl.name, Status: s, Tries: at.tries, Detail: c.detail(data)}
	}
	return info, &StatusError{Call: cl.name, Status: resp.StatusCode, Detail: c.detail(data)}
}

// decodeAnswer decodes a 2xx answer's body into out: the contract's JSON
// (an empty body is none, and leaves out as it is). An answer over the cap
// (over) or that does not decode is a *ContractError — a proxy's login
// page, a truncated body — whose caller fills in the call and status.
func decodeAnswer(data []byte, over bool, limit int64, out any) *ContractError {
	if over {
		return &ContractError{Cap: limit}
	}
	if len(bytes.TrimSpace(data)) == 0 {
		return nil
	}
	if err := json.Unmarshal(data, out); err != nil {
		detail := err.Error()
		if t := bytes.TrimSpace(data); len(t) > 0 && t[0] == '<' {
			detail = "it starts with \"" + clipText(job.Printable(brief.Head(string(t)), false), 40) + "\""
		}
		return &ContractError{Detail: detail}
	}
	return nil
}

// clipText cuts s to at most n bytes (at a rune boundary), marking the cut.
func clipText(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n] + "…"
}

// logOffset reads a 416 to a live log chunk: where the coordinator's copy
// of the run ends (nil: not the contract's answer).
func (c *Client) logOffset(data []byte) *LogOffsetError {
	var a struct {
		Next *int64 `json:"next"`
	}
	if json.Unmarshal(data, &a) != nil || a.Next == nil || *a.Next < 0 {
		return nil
	}
	return &LogOffsetError{Next: *a.Next, Detail: c.detail(data)}
}

// detail is the server's error text, redacted and cut to one short line.
func (c *Client) detail(data []byte) string {
	var eb errorBody
	msg := ""
	if json.Unmarshal(data, &eb) == nil {
		msg = eb.Error
		if msg == "" {
			msg = eb.Message
		}
	}
	if msg == "" {
		msg = strings.TrimSpace(string(data))
	}
	msg = job.Printable(strings.Join(strings.Fields(msg), " "), false)
	if len(msg) > 300 {
		msg = msg[:300] + "…"
	}
	return c.redact(msg)
}

func (c *Client) redact(s string) string {
	c.mu.RLock()
	tok := c.token
	c.mu.RUnlock()
	if tok != "" {
		s = strings.ReplaceAll(s, tok, secrets.Mask)
	}
	if c.o.Redactor != nil {
		s = c.o.Redactor.String(s)
	}
	return s
}

// scrubURL drops a URL's query from a net/url error text (the API URL never
// carries credentials: config refuses user info).
func scrubURL(s string) string {
	if i := strings.Index(s, "?"); i >= 0 {
		if j := strings.IndexAny(s[i:], "\" "); j >= 0 {
			return s[:i] + s[i+j:]
		}
		return s[:i]
	}
	return s
}

// localExpiry is when a lease ends on this host's clock, from the time the
// coordinator granted rather than from its clock (docs/fleet.md#leases):
// ttl seconds when the answer carries a ttl, else the expiry minus the
// answer's Date header (less a second for the header's resolution), counted
// from when the request was sent — so the lease ends no later than the
// coordinator thinks, whatever either clock reads, and the comparison uses
// the monotonic clock (a wall clock stepped meanwhile changes nothing).
// Without a ttl or a Date the expiry is taken as it is (clocks assumed to
// agree). Whatever a coordinator sends, the time granted is read as at
// least zero (a lease already over) and at most MaxLease: no value makes
// the arithmetic wrap around into a lease that never ends.
func localExpiry(exp time.Time, ttl float64, a answer) time.Time {
	switch {
	case a.sentAt.IsZero():
		return exp
	case ttl > 0 && !math.IsInf(ttl, 0):
		return a.sentAt.Add(granted(time.Duration(min(ttl, MaxLease.Seconds()) * float64(time.Second))))
	case exp.IsZero() || a.date.IsZero():
		return exp
	}
	left := exp.Sub(a.date) // Sub saturates rather than wrapping
	if left < time.Second {
		return a.sentAt // over already
	}
	return a.sentAt.Add(granted(left - time.Second))
}

// MaxLease bounds the time a lease is believed granted for: a longer one
// (or a leaseExpiresAt centuries away) is taken as this long.
const MaxLease = 24 * time.Hour

// granted clamps a lease's time to live to [0, MaxLease].
func granted(d time.Duration) time.Duration { return min(max(d, 0), MaxLease) }

// maxSkew is the clock difference with the coordinator worth a line: the
// Date header has a second's resolution and a call takes its time.
const maxSkew = 5 * time.Second

// noteSkew logs, once per client, a coordinator clock that differs from
// this host's by more than maxSkew, with both clocks: leases are timed on
// this host's clock from the durations granted, so it is harmless to them,
// but an operator wants to know.
func (c *Client) noteSkew(sent, recv, date time.Time) {
	if sent.IsZero() {
		return
	}
	mid := sent.Add(recv.Sub(sent) / 2)
	skew := date.Sub(mid)
	if skew.Abs() <= maxSkew+recv.Sub(sent)/2 {
		return
	}
	c.skewed.Do(func() {
		way := "ahead of"
		if skew < 0 {
			way = "behind"
		}
		c.o.Log.Warn(fmt.Sprintf("the coordinator's clock is %s %s this host's: leases are timed on this host's clock from the durations the coordinator grants", skew.Abs().Round(time.Second), way),
			"coordinator", date.UTC().Format(time.RFC3339), "factory", mid.UTC().Format(time.RFC3339))
	})
}

// perTryClient returns hc with a per-request timeout (a copy; hc is shared).
func perTryClient(hc *http.Client, d time.Duration) *http.Client {
	cp := *hc
	cp.Timeout = d
	return &cp
}

// setHeaders sets what every request to the coordinator carries: the
// bearer token, JSON, aq's version and the product tag.
func (c *Client) setHeaders(h http.Header, hasBody bool) {
	c.mu.RLock()
	token := c.token
	c.mu.RUnlock()
	h.Set("Authorization", "Bearer "+token)
	h.Set("Accept", "application/json")
	h.Set("User-Agent", "aq/"+version.Get().Version)
	if hasBody {
		h.Set("Content-Type", "application/json")
	}
	if c.o.ProductID != "" {
		h.Set("x-product-id", c.o.ProductID)
	}
}
