// Package fleetcheck is `aq fleet check`: a conformance run of the fleet
// contract (docs/contract.md) against a live coordinator. It enrolls a
// factory of its own and submits jobs of its own — on a test product, a
// repository name no factory has, and a capability no factory offers, so
// that no real factory takes them — and takes them through every route aq
// calls: claim or accept, renew, stage reports and their re-sends, a stale
// epoch's write, a park with notBefore, release, artifacts, operator reads
// and actions, deregister. It never runs an engine or touches git, and it
// takes its jobs to a terminal stage and releases what it holds before it
// returns. The report says, per route or rule, present, missing (aq falls
// back: the route book's fallback, fleet.Fallbacks) or wrong.
package fleetcheck

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"time"

	"github.com/aqfleet/aq/agent/fleet"
	"github.com/aqfleet/aq/internal/mdmeta"
	"github.com/aqfleet/aq/internal/secrets"
)

// Options configure a check.
type Options struct {
	// API is the coordinator's base URL (AQ_FLEET_API).
	API string
	// EnrollToken is an enrollment token (AQ_FLEET_TOKEN): the check
	// enrolls a factory of its own with it, and makes the operator's calls
	// (submit, reads, actions) with it. It is never logged.
	EnrollToken string
	// Nonce names the check's factory, repository and jobs
	// (aq-check-<nonce>…); empty: 8 random hex digits.
	Nonce string
	// Product is the product the check's jobs are tagged with
	// (x-product-id, the manifests' product); empty: ProductID.
	Product string
	// Park is how long the park check holds its job (default 15 s): the
	// check waits that long for the job to be handed out again.
	Park time.Duration
	// Budgets are the calls' retry budgets (nil: Budgets()).
	Budgets *fleet.Budgets
	// HTTP is the underlying client (nil: a pooled one).
	HTTP     *http.Client
	Redactor *secrets.Redactor
	// Log gets the check's progress (debug) and the client's warnings.
	Log *slog.Logger
	// Version is the aq version the check's factory reports.
	Version string
}

// ProductID is the product the check's jobs are tagged with by default
// (x-product-id and the manifests' product): billing and dashboards can
// leave it out.
const ProductID = "aq-fleet-check"

// DefaultPark is Options.Park's default.
const DefaultPark = 15 * time.Second

// Budgets are the check's retry budgets: long enough to ride out a few
// 503s, short enough that a person waits for the whole check.
func Budgets() fleet.Budgets {
	return fleet.Budgets{
		Enroll: 15 * time.Second, Heartbeat: 10 * time.Second, QueueState: 10 * time.Second, Claim: 10 * time.Second,
		Accept: 10 * time.Second, Renew: 10 * time.Second, Release: 10 * time.Second, Report: 10 * time.Second,
		FinalReport: 10 * time.Second, Drain: 10 * time.Second, Submit: 10 * time.Second,
		MinWait: 100 * time.Millisecond, MaxWait: 2 * time.Second, PerTry: 10 * time.Second,
	}
}

// Row is one route or rule and what the check found.
type Row struct {
	// ID is the route ("POST /fleet/claim") or the rule's id
	// ("stale-epoch"): stable, for scripts.
	ID string `json:"id"`
	// Section is the docs/contract.md section that defines it.
	Section string `json:"section"`
	// Check is the route, or the rule in words.
	Check   string  `json:"check"`
	Route   bool    `json:"route"`
	Verdict Verdict `json:"verdict"`
	// Seen is what the coordinator answered, when it matters (always for
	// wrong and not checked).
	Seen string `json:"seen,omitempty"`
	// AQ is what aq does about it: for a missing route the route book's
	// fallback, for a missing or wrong rule the consequence.
	AQ string `json:"aq,omitempty"`
}

// Record is something the check leaves on the coordinator: a coordinator
// without a route to delete them keeps its records.
type Record struct {
	Kind  string `json:"kind"` // factory | job
	ID    string `json:"id"`
	State string `json:"state"` // the job's stage; the factory's state
}

// Report is a check's result.
type Report struct {
	API       string   `json:"api"`
	FactoryID string   `json:"factoryId"`
	ProductID string   `json:"productId"`
	Repo      string   `json:"repo"`
	Jobs      []string `json:"jobs"`
	Rows      []Row    `json:"rows"`
	// Left is what stays on the coordinator after the check.
	Left []Record `json:"left"`
	// GivenBack are jobs not the check's that a claim handed it (they need
	// no capability the check's offer lacks): each released at once,
	// unstarted.
	GivenBack []string `json:"givenBack"`
	// Incomplete says why the check stopped before the end ("" when it
	// did not): the rows it did not reach are not checked.
	Incomplete string `json:"incomplete,omitempty"`
}

// Count is how many rows have verdict v.
func (r *Report) Count(v Verdict) int {
	n := 0
	for _, row := range r.Rows {
		if row.Verdict == v {
			n++
		}
	}
	return n
}

// Failed reports whether aq cannot work correctly against the coordinator:
// a row is wrong (a missing route aq cannot work without is wrong too),
// or the check could not finish.
func (r *Report) Failed() bool { return r.Count(Wrong) > 0 || r.Incomplete != "" }

// Row returns the row with id (nil if none).
func (r *Report) Row(id string) *Row {
	for i := range r.Rows {
		if r.Rows[i].ID == id {
			return &r.Rows[i]
		}
	}
	return nil
}

// NotCoordinatorError is a URL that does not answer as an aq coordinator:
// nothing answers there, or what answers does not enroll a factory.
type NotCoordinatorError struct {
	API string
	Why string
}

func (e *NotCoordinatorError) Error() string {
	return fmt.Sprintf("%s is not an aq coordinator: %s", e.API, e.Why)
}

// Fix says what to do.
func (e *NotCoordinatorError) Fix() string {
	return "check AQ_FLEET_API: the coordinator's base URL, e.g. https://host/api (aq demo coordinator prints one)"
}

// OptionError is an option the check cannot run with.
type OptionError struct{ What, Fix string }

func (e *OptionError) Error() string { return e.What }

// ErrNoToken is a check without an enrollment token.
var ErrNoToken = errors.New("aq fleet check enrolls a factory of its own and needs an enrollment token in AQ_FLEET_TOKEN")

// Run checks the coordinator at o.API. The error is a *NotCoordinatorError
// (nothing to check), a *fleet.AuthError (the enrollment token was
// refused) or ErrNoToken; otherwise the report says what was found, and
// Report.Incomplete why it stopped early.
func Run(ctx context.Context, o Options) (*Report, error) {
	if o.EnrollToken == "" {
		return nil, ErrNoToken
	}
	if o.Nonce == "" {
		b := make([]byte, 4)
		_, _ = rand.Read(b)
		o.Nonce = hex.EncodeToString(b)
	}
	if o.Park <= 0 {
		o.Park = DefaultPark
	}
	if o.Product == "" {
		o.Product = ProductID
	}
	if msg := mdmeta.CheckName(o.Product); msg != "" {
		return nil, &OptionError{What: fmt.Sprintf("product %q %s", o.Product, msg), Fix: "give --product a product id: letters, digits, '.', '_' and '-'"}
	}
	if o.Log == nil {
		o.Log = slog.New(slog.DiscardHandler)
	}
	b := Budgets()
	if o.Budgets != nil {
		b = *o.Budgets
	}
	name := "aq-check-" + o.Nonce
	mk := func() (*fleet.Client, error) {
		return fleet.NewClient(fleet.ClientOptions{API: o.API, Token: o.EnrollToken, ProductID: o.Product, FactoryID: name,
			Budgets: b, HTTP: o.HTTP, Redactor: o.Redactor, Log: o.Log})
	}
	fac, err := mk()
	if err != nil {
		return nil, &NotCoordinatorError{API: o.API, Why: err.Error()}
	}
	op, err := mk()
	if err != nil {
		return nil, &NotCoordinatorError{API: o.API, Why: err.Error()}
	}
	c := &checker{o: o, fac: fac, op: op, name: name, factory: name, held: map[string]int64{},
		rep: &Report{API: fac.API(), FactoryID: name, ProductID: o.Product, Repo: name, Jobs: []string{}, Left: []Record{}, GivenBack: []string{}}}
	for _, s := range catalogue {
		check := s.Check
		if s.Route {
			check = s.ID
		}
		c.rep.Rows = append(c.rep.Rows, Row{ID: s.ID, Section: s.Section, Check: check, Route: s.Route})
	}
	if err := c.enroll(ctx); err != nil {
		return nil, err
	}
	err = c.steps(ctx)
	c.cleanup(ctx)
	if err != nil {
		c.rep.Incomplete = err.Error()
	}
	for i := range c.rep.Rows {
		if c.rep.Rows[i].Verdict == "" {
			why := "the check stopped before it"
			if c.rep.Incomplete == "" {
				why = "not reached"
			}
			c.rep.Rows[i].Verdict, c.rep.Rows[i].Seen = Unchecked, why
		}
	}
	return c.rep, nil
}

// checker is one check's state.
type checker struct {
	o       Options
	fac, op *fleet.Client // the check's factory; the operator (the enrollment token)
	// name is aq-check-<nonce>: the repository, the capability has:<name>,
	// the jobs' prefix; factory is the factory's id (name, unless the
	// coordinator chose another at enrollment).
	name, factory string
	rep           *Report
	// held are the leases the check holds, by job: cleanup gives them back.
	held map[string]int64
	// skew is the coordinator's clock minus this host's (from a Date
	// header), when it is over a second or two.
	skew time.Duration
	// epochA is job A's lease epoch once leased again; resends are the
	// re-sent reports the coordinator refused.
	epochA  int64
	resends []string
}

func (c *checker) row(id string) *Row {
	r := c.rep.Row(id)
	if r == nil {
		panic("fleetcheck: no row " + id)
	}
	return r
}

func specOf(id string) spec {
	for _, s := range catalogue {
		if s.ID == id {
			return s
		}
	}
	panic("fleetcheck: no row " + id)
}

// set gives row id its verdict (the first one set stands), with what was
// seen; AQ is filled from the catalogue.
func (c *checker) set(id string, v Verdict, seen string) {
	r := c.row(id)
	if r.Verdict != "" {
		return
	}
	r.Verdict, r.Seen = v, seen
	s := specOf(id)
	switch {
	case v == Missing && s.Route:
		r.AQ = fallback(id)
	case v == Missing:
		r.AQ = s.IfMissing
	case v == Wrong && s.Route && strings.HasPrefix(seen, "absent"):
		r.AQ = required
	case v == Wrong:
		r.AQ = s.IfWrong
	}
}

func (c *checker) present(id string)        { c.set(id, Present, "") }
func (c *checker) wrong(id, seen string)    { c.set(id, Wrong, seen) }
func (c *checker) missing(id, seen string)  { c.set(id, Missing, seen) }
func (c *checker) unchecked(id, why string) { c.set(id, Unchecked, why) }

// errAbort wraps what stops the check: the coordinator stopped answering.
type abortError struct{ err error }

func (e *abortError) Error() string { return e.err.Error() }

// route records the outcome of a call on route: nil present; absent
// missing (wrong, if aq cannot work without it); unavailable stops the
// check; anything else is wrong, with the answer. It returns a non-nil
// error to stop the check, and ok when the call succeeded.
func (c *checker) route(route string, err error) (ok bool, stop error) {
	switch {
	case err == nil:
		c.present(route)
		return true, nil
	case fleet.IsRouteAbsent(err):
		if _, optional := fleet.Fallbacks[route]; optional {
			c.missing(route, "absent ("+evidence(err)+")")
		} else {
			c.wrong(route, "absent ("+evidence(err)+")")
		}
		return false, nil
	case fleet.IsTransient(err), errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return false, &abortError{err}
	}
	c.wrong(route, answer(err))
	return false, nil
}

// evidence is how a RouteAbsentError was told.
func evidence(err error) string {
	var ra *fleet.RouteAbsentError
	if errors.As(err, &ra) {
		if ra.Status != 0 {
			return fmt.Sprintf("%d %s", ra.Status, http.StatusText(ra.Status))
		}
		return "known absent"
	}
	return err.Error()
}

// answer says in a few words what a failed call was answered.
func answer(err error) string {
	var (
		fe *fleet.FencedError
		se *fleet.StatusError
		ae *fleet.AuthError
		ce *fleet.ContractError
	)
	switch {
	case errors.As(err, &fe):
		return "answered 409 Conflict" + detail(fe.Detail)
	case errors.Is(err, fleet.ErrGone):
		return "answered 404 for the check's own job"
	case errors.As(err, &ae):
		return fmt.Sprintf("refused the check's factory token (%d %s)", ae.Status, http.StatusText(ae.Status)) + detail(ae.Detail)
	case errors.As(err, &se) && se.Status != 0:
		return fmt.Sprintf("answered %d %s", se.Status, http.StatusText(se.Status)) + detail(se.Detail)
	case errors.As(err, &ce) && ce.Cap > 0:
		return fmt.Sprintf("answered %d %s over the size cap", ce.Status, http.StatusText(ce.Status))
	case errors.As(err, &ce):
		return fmt.Sprintf("answered %d %s that is not the contract's JSON (%s)", ce.Status, http.StatusText(ce.Status), ce.ContentType) + detail(ce.Detail)
	}
	return err.Error()
}

func detail(d string) string {
	if d == "" {
		return ""
	}
	return ": " + d
}
