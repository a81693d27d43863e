package fleet

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"mime"
	"net/http"
	"net/url"
	"regexp"
	"sort"
	"strings"
	"sync"
	"time"
)

// The routes aq calls, as CallResult.Call, errors and Client.Has name them.
const (
	RouteEnroll     = "POST /fleet/factories/enroll"
	RouteHeartbeat  = "POST /fleet/factories/heartbeat"
	RouteDeregister = "POST /fleet/factories/:id/deregister"
	RouteQueueState = "GET /fleet/queue-state"
	RouteClaim      = "POST /fleet/claim"
	RouteAccept     = "POST /fleet/accept"
	RouteRenew      = "POST /fleet/jobs/:id/lease/renew"
	RouteRelease    = "POST /fleet/jobs/:id/lease/release"
	RoutePatch      = "PATCH /fleet/jobs/:id"
	RouteFail       = "POST /fleet/fail"
	RouteSubmit     = "POST /fleet/jobs"
	RouteJob        = "GET /fleet/jobs/:id"
	// Logs leaving the host, and the operator's calls.
	RouteArtifacts    = "POST /fleet/jobs/:id/artifacts"
	RouteJobs         = "GET /fleet/jobs"
	RouteFactories    = "GET /fleet/factories"
	RouteEvents       = "GET /fleet/jobs/:id/events"
	RouteArtifactList = "GET /fleet/jobs/:id/artifacts"
	RouteArtifactGet  = "GET /fleet/artifacts/:id"
	RouteAction       = "POST /fleet/jobs/:id/actions/:action"
	// Undoing an operator's mistake: a new manifest for a job that is not
	// running (aq submit --replace), or the job removed (aq job rm).
	RouteReplace = "PUT /fleet/jobs/:id"
	RouteRemove  = "DELETE /fleet/jobs/:id"
	// A running job's live log: appended by its factory, read by anyone.
	RouteLogAppend = "POST /fleet/jobs/:id/log"
	RouteLogRead   = "GET /fleet/jobs/:id/log"
)

// RouteBook is every route aq calls: the routes docs/contract.md describes
// (a test holds the page, this list and the Route constants to each other).
var RouteBook = []string{
	RouteEnroll, RouteHeartbeat, RouteDeregister, RouteQueueState, RouteClaim, RouteAccept, RouteRenew, RouteRelease,
	RoutePatch, RouteFail, RouteSubmit, RouteJob, RouteArtifacts, RouteJobs, RouteFactories, RouteEvents,
	RouteArtifactList, RouteArtifactGet, RouteAction, RouteReplace, RouteRemove, RouteLogAppend, RouteLogRead,
}

// Fallbacks says, for each route aq can do without, what it does instead
// (docs/contract.md, "Without a route: fallbacks", has the table and says
// it in these words). A route not listed is one aq cannot work without:
// its absence is an error each time it is met, never remembered.
var Fallbacks = map[string]string{
	RouteFail:       "a failure is reported with a fenced PATCH (stage failed or queued) followed by lease/release, so the lease still frees at once",
	RouteAccept:     "the Service Bus path is off: broker deliveries cannot be accepted, jobs are claimed over the poll path",
	RouteQueueState: "the poll path claims without the gate (plain poll with idle backoff)",
	RouteDeregister: "a leaving factory sends its offline heartbeat only; the coordinator counts it stale",
	RouteArtifacts:  "job logs are not uploaded as artifacts; they stay under $AQ_HOME/logs on the factory that ran the job",
	RouteLogAppend:  "a running job's output is not streamed; it reaches the coordinator as artifacts when the job ends",
	// Operator reads and actions (aq status, the board, aq job): the caller
	// shows what it can and names what is missing.
	RouteJobs:         "the board and aq status show no fleet-wide job list",
	RouteFactories:    "the board and aq status show no factories",
	RouteEvents:       "aq job logs shows no stage changes of a job that runs elsewhere",
	RouteArtifactList: "aq job logs cannot read the output of a job that ran on another factory",
	RouteArtifactGet:  "aq job logs cannot read the output of a job that ran on another factory",
	RouteAction:       "requeue, reject and ship a fleet job on the coordinator itself",
	RouteReplace:      "aq submit --replace is refused with one line: replace the job on the coordinator itself, or submit the new manifest under another id",
	RouteRemove:       "aq job rm is refused with one line: remove the job on the coordinator itself",
	RouteLogRead:      "aq job logs -f and the board show the output of a job that runs elsewhere only when it ends (from its artifacts)",
}

// ErrRouteAbsent matches (errors.Is) a *RouteAbsentError.
var ErrRouteAbsent = errors.New("the coordinator does not have this route")

// RouteAbsentError is a 404 or 405 that says the coordinator does not have
// the route at all (as opposed to not having the job the call names).
type RouteAbsentError struct {
	Call   string // the route, e.g. RouteFail
	Status int    // 404 or 405; 0 when known from an earlier call
	// Evidence is what told (the answer's first words, or the probe).
	Evidence string
}

func (e *RouteAbsentError) Error() string {
	msg := fmt.Sprintf("the coordinator has no %s route", e.Call)
	if e.Status != 0 {
		msg += fmt.Sprintf(" (%d %s", e.Status, http.StatusText(e.Status))
		if e.Evidence != "" {
			msg += ": " + e.Evidence
		}
		msg += ")"
	}
	if fb, ok := Fallbacks[e.Call]; ok {
		return msg + "; " + fb
	}
	return msg + "; aq cannot work without it: check that AQ_FLEET_API is the coordinator's base URL (e.g. https://host/api)"
}

// Is makes errors.Is(err, ErrRouteAbsent) true.
func (e *RouteAbsentError) Is(target error) bool { return target == ErrRouteAbsent }

// Optional reports whether aq has a fallback for the route.
func (e *RouteAbsentError) Optional() bool { _, ok := Fallbacks[e.Call]; return ok }

// IsRouteAbsent reports whether err says the coordinator lacks a route.
func IsRouteAbsent(err error) bool { return errors.Is(err, ErrRouteAbsent) }

// routeBook is what the client learnt about the coordinator's routes: the
// ones it answered absent, for the process's life.
type routeBook struct {
	mu     sync.Mutex
	absent map[string]string // route → evidence
}

// Has reports whether the coordinator may have route: false once a call (or
// a probe) met its absence. Callers ask this before they choose a path.
func (c *Client) Has(route string) bool {
	c.routes.mu.Lock()
	defer c.routes.mu.Unlock()
	_, gone := c.routes.absent[route]
	return !gone
}

// AbsentRoutes lists the routes found absent, sorted.
func (c *Client) AbsentRoutes() []string {
	c.routes.mu.Lock()
	defer c.routes.mu.Unlock()
	out := make([]string, 0, len(c.routes.absent))
	for r := range c.routes.absent {
		out = append(out, r)
	}
	sort.Strings(out)
	return out
}

// markAbsent records route as absent and, unless quiet (an operator's
// call, whose caller names what is missing), says so once, with what aq
// does instead.
func (c *Client) markAbsent(route, evidence string, quiet bool) {
	c.routes.mu.Lock()
	if c.routes.absent == nil {
		c.routes.absent = map[string]string{}
	}
	_, known := c.routes.absent[route]
	c.routes.absent[route] = evidence
	c.routes.mu.Unlock()
	if known || quiet {
		return
	}
	if fb, ok := Fallbacks[route]; ok {
		c.o.Log.Warn("the coordinator has no "+route+" route: "+fb, "evidence", evidence)
		return
	}
	c.o.Log.Error("the coordinator has no "+route+" route: check AQ_FLEET_API", "evidence", evidence)
}

// knownAbsent returns the error for a call to an optional route already
// found absent (nothing is sent), or nil.
func (c *Client) knownAbsent(route string) error {
	if _, optional := Fallbacks[route]; !optional || c.Has(route) {
		return nil
	}
	c.routes.mu.Lock()
	ev := c.routes.absent[route]
	c.routes.mu.Unlock()
	return &RouteAbsentError{Call: route, Evidence: ev}
}

// The verdicts on a 404 or 405.
type missing int

const (
	missingUnsure   missing = iota // cannot tell: treated as before (the job, or the request, is refused)
	missingRoute                   // the coordinator has no such route
	missingResource                // the route answered: what it names is not there
)

// cannotMethod finds Express's and NestJS's "Cannot POST /path" (for the
// evidence in logs).
var cannotMethod = regexp.MustCompile(`(?i)\bcannot (GET|HEAD|POST|PUT|PATCH|DELETE|OPTIONS) /`)

// namesUnknownRoute reports whether text is a framework's answer for an
// unknown route naming this very request: Express and NestJS ("Cannot POST
// /api/fleet/fail"), Fastify ("Route POST:/api/fleet/fail not found"), or
// Go's ServeMux ("404 page not found"). Naming the request's own method and
// path keeps a handler's message that merely contains such words (a job's
// "cannot PATCH …: stale epoch") from passing for it.
func namesUnknownRoute(text, method, path string) bool {
	if text == "404 page not found" {
		return true
	}
	lower := strings.ToLower(text)
	m := strings.ToLower(method)
	for _, sig := range []string{"cannot " + m + " " + strings.ToLower(path), "route " + m + ":" + strings.ToLower(path) + " not found"} {
		i := strings.Index(lower, sig)
		if i < 0 {
			continue
		}
		// The path must end there (not be a prefix of a longer one).
		if rest := lower[i+len(sig):]; rest == "" || !isPathChar(rest[0]) {
			return true
		}
	}
	return false
}

func isPathChar(b byte) bool {
	return b == '/' || b == '.' || b == '_' || b == '-' || b == '%' || b == ':' ||
		b >= 'a' && b <= 'z' || b >= 'A' && b <= 'Z' || b >= '0' && b <= '9'
}

// judgeBody is the first look at a 404/405: the status and the body alone.
//
//   - 405: the path exists, not with this method — the route is absent;
//   - a body that names this request as an unknown route (Express's
//     "Cannot POST /path", Fastify's "Route POST:/path not found", Go's
//     "404 page not found") — the route is absent;
//   - a JSON body (an object or array): the route's handler answered — what
//     the call names is not there (the job);
//   - anything else (empty, an HTML page of a proxy, other text) is unsure:
//     a probe decides (probeMissing).
func judgeBody(status int, body []byte, method, path string) missing {
	if status == http.StatusMethodNotAllowed {
		return missingRoute
	}
	text := strings.TrimSpace(string(body))
	switch {
	case namesUnknownRoute(text, method, path):
		return missingRoute
	case len(text) > 0 && (text[0] == '{' || text[0] == '[') && json.Valid([]byte(text)):
		return missingResource
	}
	return missingUnsure
}

// evidence is a 404's body cut to a few words for logs and errors.
func (c *Client) evidence(body []byte) string {
	text := strings.TrimSpace(string(body))
	if m := cannotMethod.FindString(text); m != "" {
		if i := strings.Index(text, m); i >= 0 {
			text = text[i:]
			if j := strings.IndexAny(text, "<\n"); j > 0 {
				text = text[:j]
			}
		}
	}
	return c.detail([]byte(text))
}

// probeMissing decides an unsure 404 with one more request:
//
//   - for a call on a job: GET /fleet/jobs/:id — the job is there (200), so
//     the 404 was the route's; it is not (404), so the job is absent;
//   - for any other call: the same method on a path no coordinator has
//     (/fleet/aq-route-probe): an answer that is the same as the call's
//     (status, media type, and body with the path swapped) means the call's
//     route is as unknown as that one; a different answer means the route
//     answered on its own.
//
// A probe that fails says nothing (missingUnsure).
func (c *Client) probeMissing(ctx context.Context, cl call, status int, ctype string, body []byte) missing {
	if cl.jobID != "" {
		st, _, _, err := c.raw(ctx, http.MethodGet, "/fleet/jobs/"+url.PathEscape(cl.jobID), nil)
		switch {
		case err != nil:
			return missingUnsure
		case st >= 200 && st < 300:
			return missingRoute
		case st == http.StatusNotFound:
			return missingResource
		}
		return missingUnsure
	}
	const probe = "/fleet/aq-route-probe"
	var pb []byte
	if cl.method != http.MethodGet && cl.method != http.MethodHead {
		pb = []byte("{}")
	}
	st, pct, pbody, err := c.raw(ctx, cl.method, probe, pb)
	if err != nil {
		return missingUnsure
	}
	same := st == status && mediaType(pct) == mediaType(ctype) &&
		normalizeBody(pbody, c.base.Path+probe) == normalizeBody(body, c.base.Path+cl.path)
	if same {
		return missingRoute
	}
	return missingResource
}

func mediaType(ct string) string {
	mt, _, err := mime.ParseMediaType(ct)
	if err != nil {
		return strings.ToLower(strings.TrimSpace(ct))
	}
	return mt
}

// normalizeBody replaces the request's path in body and collapses spaces,
// so two answers for unknown paths compare equal.
func normalizeBody(body []byte, path string) string {
	s := string(body)
	for _, p := range []string{path, strings.TrimPrefix(path, "/")} {
		if p != "" {
			s = strings.ReplaceAll(s, p, "{path}")
		}
	}
	return strings.Join(strings.Fields(s), " ")
}

// raw sends one request with the client's headers, without retries or
// classification (probes), within 10 s at most. Its body is read up to 64 KiB.
func (c *Client) raw(ctx context.Context, method, path string, body []byte) (int, string, []byte, error) {
	e, err := c.exchange(ctx, method, path, body, 10*time.Second)
	if err != nil {
		return 0, "", nil, err
	}
	return e.Status, e.Header.Get("Content-Type"), e.Body, nil
}

// probes are harmless requests that tell whether an optional route exists:
// each names no job that can exist (an empty id), so none can take a lease
// or move a job.
var probes = map[string]func(fid string) any{
	RouteAccept: func(fid string) any { return AcceptRequest{JobID: "", FactoryID: fid} },
	RouteFail:   func(fid string) any { return FailRequest{JobID: "", FactoryID: fid, Reason: "probe"} },
}

// Probe asks whether the coordinator has route (RouteAccept, RouteFail or
// RouteQueueState), without side effects: any answer but a route-level 404
// or 405 means present. A known absence answers at once. An error (the
// coordinator unreachable, credentials refused) leaves the route as it was
// (present, unless known absent).
func (c *Client) Probe(ctx context.Context, route string) (bool, error) {
	if !c.Has(route) {
		return false, nil
	}
	var method, path string
	var body []byte
	switch route {
	case RouteQueueState:
		method, path = http.MethodGet, "/fleet/queue-state"
	case RouteAccept, RouteFail:
		method, path = http.MethodPost, strings.TrimPrefix(route, "POST ")
		b, err := json.Marshal(probes[route](c.FactoryID()))
		if err != nil {
			return true, err
		}
		body = b
	default:
		return true, fmt.Errorf("no probe for %s", route)
	}
	st, ct, data, err := c.raw(ctx, method, path, body)
	if err != nil {
		return true, &TransientError{Call: route, Tries: 1, Err: errors.New(c.redact(scrubURL(err.Error())))}
	}
	switch {
	case st == http.StatusUnauthorized || st == http.StatusForbidden:
		return true, &AuthError{Call: route, Status: st, Detail: c.detail(data)}
	case st == http.StatusTooManyRequests || st >= 500:
		return true, &TransientError{Call: route, Status: st, Tries: 1, Detail: c.detail(data)}
	case st != http.StatusNotFound && st != http.StatusMethodNotAllowed:
		return true, nil
	}
	v := judgeBody(st, data, method, c.base.Path+path)
	if v == missingUnsure {
		v = c.probeMissing(ctx, call{name: route, method: method, path: path}, st, ct, data)
	}
	if v == missingRoute {
		c.markAbsent(route, c.evidence(data), false)
		return false, nil
	}
	return true, nil
}
