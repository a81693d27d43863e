//go:build linux

package chaos

import (
	"encoding/json"
	"fmt"
	"net/http"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/aqfleet/aq/demo/coord"
	"github.com/aqfleet/aq/internal/brief"
	"github.com/aqfleet/aq/job"
)

// CheckResult is one invariant and what the run showed of it.
type CheckResult struct {
	Name       string   `json:"name"`
	Definition string   `json:"definition"`
	OK         bool     `json:"ok"`
	Summary    string   `json:"summary"`
	Violations []string `json:"violations,omitempty"`
	Notes      []string `json:"notes,omitempty"`
}

// Report is every check of a run, and the tallies the report prints.
type Report struct {
	Checks []CheckResult `json:"checks"`
	// Outcomes counts final stages by engine plan.
	Outcomes map[string]map[string]int `json:"outcomes"`
	// LeaseEnds counts how leases ended: report, fail, release, reaped.
	LeaseEnds map[string]int `json:"leaseEnds"`
	// Reaps are the reaper's reclaims, each with the fault that explains it.
	Reaps []Reap `json:"reaps"`
	// Calls counts the call log by route and status.
	Calls map[string]int `json:"calls"`
	// Zombies: per partition, the target's leases the reaper took while it
	// was cut off, and its calls refused 409 afterwards.
	Zombies []Zombie `json:"zombies"`
	// Superseded are job-branch pushes of runs whose result was not the
	// one the coordinator accepted.
	Superseded []string `json:"superseded,omitempty"`
	// Redelivered: shipped jobs whose accepted run reported a result an
	// earlier attempt had pushed (it did not run the engine again).
	Redelivered []string `json:"redelivered,omitempty"`
	// InFlight: WIP or job-branch pushes that landed just after the
	// coordinator revoked the pusher's lease (a preemption).
	InFlight []string `json:"inFlight,omitempty"`
	Orphans  int      `json:"orphans"`
	// Repaired counts the shipped jobs with verify: whose accepted run
	// passed it only after repair rounds (the rounds in all of them:
	// RepairRounds) — the scripted engine fixes what verify checks only
	// once it is handed verify's failure.
	Repaired     int `json:"repaired"`
	RepairRounds int `json:"repairRounds"`
	FactoryErr   int `json:"factoryErrors"` // ERROR lines in the factories' logs
	Pushes       int `json:"pushes"`
	// Requests and Refused503 count the request log: every request the
	// factories made of the stub, over all its incarnations.
	Requests   int `json:"requests"`
	Refused503 int `json:"refused503"`
}

// Reap is one lease the reaper reclaimed.
type Reap struct {
	Job         string    `json:"job"`
	Epoch       int64     `json:"epoch"`
	Holder      string    `json:"holder"`
	LastRenewal time.Time `json:"lastRenewal"`
	At          time.Time `json:"at"`
	Explained   string    `json:"explained,omitempty"` // the fault; "" when none
}

// Zombie is one partition's zombie case.
type Zombie struct {
	Factory string `json:"factory"`
	Reaped  int    `json:"reaped"`  // its leases reaped while cut off
	Refused int    `json:"refused"` // its calls answered 409 after it came back
	Running int    `json:"running"` // jobs its status file said it ran when cut off
	// Held is how many leases it held at the cut in the stub's log (its
	// status file can lag: jobs that had just reported are not a zombie's).
	Held      int    `json:"held"`
	Duration  string `json:"duration"`  // how long it was cut off
	Recovered int    `json:"recovered"` // its reaped jobs that ended terminal elsewhere or later
}

// OK reports whether every check passed.
func (r *Report) OK() bool {
	for _, c := range r.Checks {
		if !c.OK {
			return false
		}
	}
	return true
}

// Failed lists the failed checks with their first violations.
func (r *Report) Failed() []string {
	var out []string
	for _, c := range r.Checks {
		if c.OK {
			continue
		}
		v := c.Violations
		if len(v) > 8 {
			v = append(v[:8:8], fmt.Sprintf("… and %d more", len(c.Violations)-8))
		}
		out = append(out, c.Name+": "+c.Summary+"\n    "+strings.Join(v, "\n    "))
	}
	return out
}

// Summary is one line: how many checks passed.
func (r *Report) Summary() string {
	n := 0
	var bad []string
	for _, c := range r.Checks {
		if c.OK {
			n++
		} else {
			bad = append(bad, c.Name)
		}
	}
	s := fmt.Sprintf("%d/%d invariants hold", n, len(r.Checks))
	if len(bad) > 0 {
		s += "; FAILED: " + strings.Join(bad, ", ")
	}
	return s
}

var terminalStages = map[string]bool{coord.StageShipped: true, coord.StageFailed: true, coord.StageDeadLetter: true}

// lease is one grant of a job's lease and how it ended.
type lease struct {
	job       string
	epoch     int64
	factory   string
	granted   time.Time
	attempts  int
	lastRenew time.Time
	end       time.Time
	endKind   string // report | fail | release | reaped | requeued | rejected | "" (open)
	endStage  string
}

type leaseKey struct {
	job   string
	epoch int64
}

func isOK(status int) bool { return status >= 200 && status < 300 }

// buildLeases reads the grants, renewals and ends of every lease from the
// call log and the audit trail.
func buildLeases(in *Input) (map[leaseKey]*lease, []string) {
	ls := map[leaseKey]*lease{}
	var problems []string
	for _, c := range in.Calls {
		if !isOK(c.Status) {
			continue
		}
		k := leaseKey{c.JobID, c.Epoch}
		switch c.Route {
		case coord.RouteClaim, coord.RouteAccept:
			if o, dup := ls[k]; dup {
				problems = append(problems, fmt.Sprintf("%s epoch %d granted twice: to %s at %s and to %s at %s", c.JobID, c.Epoch, o.factory, ts(o.granted), c.Factory, ts(c.At)))
				continue
			}
			ls[k] = &lease{job: c.JobID, epoch: c.Epoch, factory: c.Factory, granted: c.At, attempts: c.Attempts, lastRenew: c.At}
		case coord.RouteRenew:
			if l := ls[k]; l != nil && c.At.After(l.lastRenew) {
				l.lastRenew = c.At
			}
		case coord.RoutePatch, coord.RouteFail, coord.RouteRelease:
			l := ls[k]
			if l == nil || c.Resend || l.endKind != "" {
				continue
			}
			switch {
			case c.Route == coord.RouteFail:
				l.end, l.endKind, l.endStage = c.At, "fail", c.Stage
			case c.Route == coord.RouteRelease:
				l.end, l.endKind, l.endStage = c.At, "release", coord.StageQueued
			case c.Stage != coord.StageBuilding:
				l.end, l.endKind, l.endStage = c.At, "report", c.Stage
			}
		}
	}
	for id, evs := range in.State.Events {
		for _, ev := range evs {
			switch ev.Kind {
			case "reaped", "requeued", "rejected":
				if l := ls[leaseKey{id, ev.Epoch - 1}]; l != nil && l.endKind == "" {
					l.end, l.endKind, l.endStage = ev.At, ev.Kind, ev.Stage
				}
			}
		}
	}
	return ls, problems
}

func ts(t time.Time) string { return t.UTC().Format("15:04:05.000") }

// explain finds the injected fault that explains a reaped lease of holder
// whose last renewal was at from and which the reaper took at to: a fault
// on the holder (killed, drained, cut off) or on the stub (restarted, 503s)
// whose window overlaps [from, to] — for 503s, only if they refused the
// holder's renewals of this very lease in that window.
func explain(in *Input, job string, epoch int64, holder string, from, to time.Time) string {
	idx := -1
	if n, err := strconv.Atoi(strings.TrimPrefix(holder, "f")); err == nil {
		idx = n - 1
	}
	// The holder's own faults first, then the stub's.
	for _, own := range []bool{true, false} {
		for _, f := range in.Faults {
			end := f.End
			if end.IsZero() {
				end = to.Add(time.Hour) // still going at the end
			}
			if f.Start.After(to) || end.Before(from) {
				continue
			}
			// A healthy holder renews every second; one that had made no
			// renewal for renewSlack when the fault hit had stopped renewing
			// by itself, and the fault explains nothing.
			hitInTime := !f.Start.After(from.Add(renewSlack))
			switch {
			case own && f.factoryFault() && f.Target == idx && hitInTime:
				return fmt.Sprintf("%s of %s at %s (for %s)", f.Kind, holder, ts(f.Start), end.Sub(f.Start).Round(100*time.Millisecond))
			case !own && f.Kind == KindStub && hitInTime:
				return fmt.Sprintf("%s at %s (for %s)", f.Kind, ts(f.Start), end.Sub(f.Start).Round(100*time.Millisecond))
			case !own && f.Kind == KindErrors:
				// 503s explain a lapse only if they refused the holder's
				// renewals of this lease: a holder that stopped renewing
				// lost its lease by itself.
				n := refusedRenewals(in, job, epoch, holder, from, to)
				if n > 0 {
					return fmt.Sprintf("%s at %s (for %s): %d of %s's renewals refused 503", f.Kind, ts(f.Start), end.Sub(f.Start).Round(100*time.Millisecond), n, holder)
				}
			}
		}
	}
	return ""
}

// renewSlack is how long a holder may go without a renewal before a fault
// can no longer be blamed for its lapse: the harness's factories renew
// every second (AQ_FLEET_LEASE_RENEW_SEC=1, ±10%), so 3 s is two missed
// renewals and the latency of a third.
const renewSlack = 3 * time.Second

// refusedRenewals counts the holder's renewals of job's lease at epoch that
// the stub refused with a 5xx between from and to.
func refusedRenewals(in *Input, job string, epoch int64, holder string, from, to time.Time) int {
	n := 0
	for _, q := range in.Requests {
		if q.Renewal() && q.Job == job && q.Epoch == epoch && q.Factory == holder && q.Status >= 500 && q.At.After(from) && !q.At.After(to) {
			n++
		}
	}
	return n
}

var trailerRE = regexp.MustCompile(`(?m)^aq-(job|attempt): *(\S+)\s*$`)

func trailers(msg string) map[string]string {
	out := map[string]string{}
	for _, m := range trailerRE.FindAllStringSubmatch(msg, -1) {
		out[m[1]] = m[2]
	}
	return out
}

// facts are what the invariants are checked against: the run's input, the
// leases read from its logs (each job's in epoch order), and each job's
// engine runs in order with the interruptions that hit them.
type facts struct {
	in            *Input
	leases        map[leaseKey]*lease
	byJob         map[string][]*lease
	grantProblems []string
	runs          map[string][]EngineRun
	interrupts    []interruption
}

func newFacts(in *Input) *facts {
	f := &facts{in: in, byJob: map[string][]*lease{}, runs: map[string][]EngineRun{}}
	f.leases, f.grantProblems = buildLeases(in)
	for _, l := range f.leases {
		f.byJob[l.job] = append(f.byJob[l.job], l)
	}
	for _, ls := range f.byJob {
		sort.Slice(ls, func(a, b int) bool { return ls[a].epoch < ls[b].epoch })
	}
	for _, r := range in.Runs {
		f.runs[r.Job] = append(f.runs[r.Job], r)
	}
	for _, rs := range f.runs {
		sort.Slice(rs, func(a, b int) bool { return rs[a].N < rs[b].N })
	}
	f.interrupts = interruptions(in)
	return f
}

// invariants are the checks of a run, one method of facts each, in the
// report's order. A check may add to the report's tallies.
var invariants = []func(*facts, *Report) CheckResult{
	(*facts).terminalOnce,
	(*facts).shippedOnce,
	(*facts).pushesUnderLease,
	(*facts).noStaleWrite,
	(*facts).noReportLost,
	(*facts).leasesFreed,
	(*facts).gcLeftNothing,
	(*facts).noEngineAlive,
	(*facts).noCrash,
	(*facts).workLost,
	(*facts).noEngineOutlives,
	(*facts).noRerun,
}

// Check evaluates every invariant on in.
func Check(in *Input) *Report {
	rep := &Report{Outcomes: map[string]map[string]int{}, LeaseEnds: map[string]int{}, Calls: map[string]int{}}
	f := newFacts(in)
	for _, c := range in.Calls {
		rep.Calls[fmt.Sprintf("%s %d", c.Route, c.Status)]++
	}
	for _, q := range in.Requests {
		rep.Requests++
		if q.Status == http.StatusServiceUnavailable {
			rep.Refused503++
		}
	}
	for _, check := range invariants {
		rep.Checks = append(rep.Checks, check(f, rep))
	}
	rep.Repaired, rep.RepairRounds = f.repairs()
	rep.Zombies = f.zombies()
	for _, fd := range in.Factories {
		rep.Orphans += fd.Orphans
		rep.FactoryErr += fd.Errors
	}
	return rep
}

// repairs counts the shipped jobs with verify: whose accepted run passed it
// only after repair rounds, and the rounds in all of them.
func (f *facts) repairs() (jobs, rounds int) {
	for _, j := range f.in.Jobs {
		sj := f.in.State.Jobs[j.ID]
		if sj == nil || !j.Verify || sj.Stage != coord.StageShipped || len(sj.Insights) == 0 {
			continue
		}
		var ins job.Insights
		if json.Unmarshal(sj.Insights, &ins) == nil && ins.RepairRounds > 0 {
			jobs++
			rounds += ins.RepairRounds
		}
	}
	return jobs, rounds
}

// zombies says what each partition did: the leases its factory held, those
// the reaper took and the jobs that still ended, the writes refused after.
func (f *facts) zombies() []Zombie {
	in := f.in
	var out []Zombie
	for _, flt := range in.Faults {
		if flt.Kind != KindPartition {
			continue
		}
		id := fmt.Sprintf("f%d", flt.Target+1)
		z := Zombie{Factory: id, Running: flt.Running, Duration: flt.End.Sub(flt.Start).Round(100 * time.Millisecond).String()}
		for _, l := range f.leases {
			if l.factory == id && !l.granted.After(flt.Start) && (l.endKind == "" || l.end.After(flt.Start)) {
				z.Held++
			}
			if l.factory == id && l.endKind == "reaped" && !l.end.Before(flt.Start) && !l.end.After(flt.End) {
				z.Reaped++
				if sj := in.State.Jobs[l.job]; sj != nil && terminalStages[sj.Stage] {
					z.Recovered++
				}
			}
		}
		for _, cl := range in.Calls {
			if cl.Factory == id && cl.Status == 409 && !cl.At.Before(flt.End) && cl.At.Before(flt.End.Add(in.LeaseTTL+30*time.Second)) {
				z.Refused++
			}
		}
		out = append(out, z)
	}
	return out
}

// terminalOnce: every job reached a terminal stage exactly once.
func (f *facts) terminalOnce(rep *Report) CheckResult {
	in := f.in
	c := CheckResult{Name: "terminal exactly once",
		Definition: "every submitted job is, at the end, in a terminal stage of the stub's model (shipped, failed, dead_letter); its audit trail has exactly one event entering a terminal stage, it is the job's last state change (only refused calls may follow), and the trail is complete (shorter than the stub's cap)"}
	counts := map[string]int{}
	for _, j := range in.Jobs {
		sj, ok := in.State.Jobs[j.ID]
		if !ok {
			c.Violations = append(c.Violations, j.ID+": not in the stub's state (lost)")
			continue
		}
		counts[sj.Stage]++
		if rep.Outcomes[j.Plan] == nil {
			rep.Outcomes[j.Plan] = map[string]int{}
		}
		rep.Outcomes[j.Plan][sj.Stage]++
		if !terminalStages[sj.Stage] {
			c.Violations = append(c.Violations, fmt.Sprintf("%s: ended %s (epoch %d, holder %q)", j.ID, sj.Stage, sj.LeaseEpoch, sj.Holder))
			continue
		}
		evs := in.State.Events[j.ID]
		if len(evs) >= coord.MaxEvents {
			c.Violations = append(c.Violations, fmt.Sprintf("%s: audit trail truncated at %d events", j.ID, len(evs)))
			continue
		}
		entered, last := 0, -1
		for i, ev := range evs {
			if ev.Kind == "fenced" || ev.Kind == "due" {
				continue
			}
			last = i
			if terminalStages[ev.Stage] {
				entered++
			}
		}
		switch {
		case entered != 1:
			c.Violations = append(c.Violations, fmt.Sprintf("%s: entered a terminal stage %d times", j.ID, entered))
		case last < 0 || !terminalStages[evs[last].Stage] || evs[last].Stage != sj.Stage:
			c.Violations = append(c.Violations, fmt.Sprintf("%s: a state change follows its terminal stage", j.ID))
		}
	}
	c.OK = len(c.Violations) == 0 && in.Converged
	if !in.Converged {
		c.Violations = append(c.Violations, "the run did not converge before the guard")
	}
	c.Summary = fmt.Sprintf("%d jobs: %d shipped, %d failed, %d dead_letter", len(in.Jobs), counts[coord.StageShipped], counts[coord.StageFailed], counts[coord.StageDeadLetter])
	return c
}

// shippedOnce: no job shipped twice, and origin holds the accepted run's result.
func (f *facts) shippedOnce(rep *Report) CheckResult {
	in, leases, byJob := f.in, f.leases, f.byJob
	c := CheckResult{Name: "shipped at most once",
		Definition: "per job, the stub accepted at most one success report (PATCH shipped, answered 2xx and not as a re-send), exactly one for a shipped job; and origin's aq/job/<id> of a shipped job holds the accepted run's result: its tip carries aq-job: <id> and aq-attempt: N where N is the attempt of the lease whose report was accepted (a zombie's push cannot have overwritten it)"}
	shippedCalls := map[string][]coord.Call{}
	for _, cl := range in.Calls {
		if cl.Route == coord.RoutePatch && isOK(cl.Status) && !cl.Resend && cl.Stage == coord.StageShipped {
			shippedCalls[cl.JobID] = append(shippedCalls[cl.JobID], cl)
		}
	}
	shipped := 0
	for _, j := range in.Jobs {
		sj := in.State.Jobs[j.ID]
		calls := shippedCalls[j.ID]
		isShipped := sj != nil && sj.Stage == coord.StageShipped
		switch {
		case len(calls) > 1:
			c.Violations = append(c.Violations, fmt.Sprintf("%s: %d success reports accepted", j.ID, len(calls)))
			continue
		case isShipped && len(calls) == 0:
			c.Violations = append(c.Violations, j.ID+": shipped without an accepted success report")
			continue
		case !isShipped && len(calls) > 0:
			c.Violations = append(c.Violations, fmt.Sprintf("%s: a success report was accepted but the job ended %s", j.ID, sj.Stage))
			continue
		case !isShipped:
			if tip, ok := in.OriginJobTips[j.ID]; ok {
				rep.Superseded = append(rep.Superseded, fmt.Sprintf("%s (ended %s): origin keeps aq/job/%s from attempt %s", j.ID, sj.Stage, j.ID, trailers(tip.Message)["attempt"]))
			}
			continue
		}
		shipped++
		l := leases[leaseKey{j.ID, calls[0].Epoch}]
		tip, ok := in.OriginJobTips[j.ID]
		switch {
		case l == nil:
			c.Violations = append(c.Violations, fmt.Sprintf("%s: shipped at epoch %d, which was never granted", j.ID, calls[0].Epoch))
		case !ok:
			c.Violations = append(c.Violations, fmt.Sprintf("%s: shipped, but origin has no aq/job/%s", j.ID, j.ID))
		default:
			tr := trailers(tip.Message)
			if tr["job"] == j.ID && tr["attempt"] != strconv.Itoa(l.attempts) && redelivered(in, l.factory, j.ID, tip.SHA) {
				// An earlier attempt pushed this result and was lost before
				// its report; the accepted run found it on origin and
				// reported it without running the engine (exactly once).
				rep.Redelivered = append(rep.Redelivered, fmt.Sprintf("%s: attempt %d of %s reported attempt %s's result, already on origin", j.ID, l.attempts, l.factory, tr["attempt"]))
				break
			}
			if tr["job"] != j.ID || tr["attempt"] != strconv.Itoa(l.attempts) {
				c.Violations = append(c.Violations, fmt.Sprintf("%s: origin's aq/job/%s is %s (aq-job %q, attempt %q), but the accepted run was attempt %d of %s",
					j.ID, j.ID, tip.SHA[:10], tr["job"], tr["attempt"], l.attempts, l.factory))
			}
		}
	}
	// Pushes of the job branch by runs other than the accepted one.
	for _, p := range in.Pushes {
		if p.Phase != "run" || p.Deletes() {
			continue
		}
		id, ok := strings.CutPrefix(p.Ref, "refs/heads/aq/job/")
		if !ok {
			continue
		}
		rep.Pushes++
		var acc *lease
		if cs := shippedCalls[id]; len(cs) == 1 {
			acc = leases[leaseKey{id, cs[0].Epoch}]
		}
		own := leaseAt(byJob[id], p.Factory, p.T)
		if acc != nil && own == acc {
			continue
		}
		why := "no lease"
		if own != nil {
			why = fmt.Sprintf("epoch %d, which ended by %s", own.epoch, own.endKind)
		}
		rep.Superseded = append(rep.Superseded, fmt.Sprintf("%s pushed by %s at %s (%s)", id, p.Factory, ts(p.T), why))
	}
	c.OK = len(c.Violations) == 0
	c.Summary = fmt.Sprintf("%d jobs shipped once each; %d job-branch pushes, %d of them by runs whose result was not the accepted one", shipped, rep.Pushes, len(rep.Superseded))
	return c
}

// pushesUnderLease: every push of a job or WIP ref was made under the pusher's lease.
func (f *facts) pushesUnderLease(rep *Report) CheckResult {
	in, byJob := f.in, f.byJob
	c := CheckResult{Name: "pushes only under a lease",
		Definition: fmt.Sprintf("every update of refs/heads/aq/job/<id> or refs/heads/aq/wip/<id> an origin took during the run (its post-receive hook logs the pushing factory and the time) was made by a factory that held the job's lease at that moment in the stub's log: granted (claim/accept 2xx) before it, and not yet ended by a report, a fail, a release or the reaper — or was in flight when the coordinator revoked the lease (a requeue, which the holder learns at its next renewal): landed within %s of the revocation and before anyone else held the job, so no later owner's work could be overwritten", inFlightWindow)}
	n := 0
	for _, p := range in.Pushes {
		if p.Phase != "run" || p.Deletes() {
			continue
		}
		id, ok := strings.CutPrefix(p.Ref, "refs/heads/aq/job/")
		if !ok {
			id, ok = strings.CutPrefix(p.Ref, "refs/heads/aq/wip/")
		}
		if !ok {
			continue
		}
		n++
		if inFlight(byJob[id], p.Factory, p.T) {
			rep.InFlight = append(rep.InFlight, fmt.Sprintf("%s %s by %s at %s", p.Repo, p.Ref, p.Factory, ts(p.T)))
			continue
		}
		if leaseAt(byJob[id], p.Factory, p.T) == nil {
			c.Violations = append(c.Violations, fmt.Sprintf("%s %s by %q at %s: %s held no lease of it then (%s)", p.Repo, p.Ref, p.Factory, ts(p.T), p.Factory, describeLeases(byJob[id])))
		}
	}
	c.OK = len(c.Violations) == 0
	c.Summary = fmt.Sprintf("%d pushes of aq/job and aq/wip refs, all under the pusher's lease", n)
	if !c.OK {
		c.Summary = fmt.Sprintf("%d pushes of aq/job and aq/wip refs, %d without a lease", n, len(c.Violations))
	}
	return c
}

// noStaleWrite: the stub accepted no write with a stale epoch or from a non-holder.
func (f *facts) noStaleWrite(*Report) CheckResult {
	in, grantProblems := f.in, f.grantProblems
	c := CheckResult{Name: "no stale write accepted",
		Definition: "in the stub's call log, every renew, release, PATCH, fail and live log chunk answered 2xx carried the job's lease epoch as the stub held it when it decided (a re-send included), and every one that changed the job (or its log) came from the lease's holder; every epoch was granted once, and only while nobody held the job"}
	checked := 0
	for _, cl := range in.Calls {
		switch cl.Route {
		case coord.RouteRenew, coord.RouteRelease, coord.RoutePatch, coord.RouteFail, coord.RouteLogAppend:
		default:
			continue
		}
		if !isOK(cl.Status) {
			continue
		}
		checked++
		if cl.Epoch != cl.JobEpoch {
			c.Violations = append(c.Violations, fmt.Sprintf("%s %s by %s at %s: epoch %d accepted while the job was at epoch %d (resend=%v)", cl.Route, cl.JobID, cl.Factory, ts(cl.At), cl.Epoch, cl.JobEpoch, cl.Resend))
		} else if !cl.Resend && cl.Holder != cl.Factory {
			c.Violations = append(c.Violations, fmt.Sprintf("%s %s by %s at %s: accepted while %q held the lease", cl.Route, cl.JobID, cl.Factory, ts(cl.At), cl.Holder))
		}
	}
	for _, cl := range in.Calls {
		if cl.Route == coord.RouteAccept && isOK(cl.Status) && cl.Holder != "" {
			c.Violations = append(c.Violations, fmt.Sprintf("accept %s by %s at %s: granted while %s held it", cl.JobID, cl.Factory, ts(cl.At), cl.Holder))
		}
	}
	c.Violations = append(c.Violations, grantProblems...)
	c.OK = len(c.Violations) == 0
	refused := 0
	for _, cl := range in.Calls {
		if cl.Status == 409 {
			refused++
		}
	}
	c.Summary = fmt.Sprintf("%d accepted lease calls checked; %d calls refused 409 (fenced or owned elsewhere)", checked, refused)
	return c
}

// noReportLost: no report was lost: spools empty, every delivered report in the call log.
func (f *facts) noReportLost(*Report) CheckResult {
	in, leases := f.in, f.leases
	c := CheckResult{Name: "no report lost",
		Definition: "after the final drain every factory's spool is empty (spool/ and spool/dead/); every report a factory logged as delivered is in the stub's call log as a 2xx call of that factory at that epoch (PATCH of that stage, or fail of that reason); every job record a factory keeps is closed, and its last run's report is in the call log: an accepted PATCH of its success stage, or an accepted fail or release — unless the record says fenced"}
	delivered := 0
	okCall := map[string]bool{}
	for _, cl := range in.Calls {
		if !isOK(cl.Status) {
			continue
		}
		switch cl.Route {
		case coord.RoutePatch:
			okCall[fmt.Sprintf("%s|%s|%d|%s", cl.JobID, cl.Factory, cl.Epoch, cl.Stage)] = true
			if cl.Stage != coord.StageBuilding {
				okCall[fmt.Sprintf("%s|%s|%d|end", cl.JobID, cl.Factory, cl.Epoch)] = true
			}
		case coord.RouteFail:
			okCall[fmt.Sprintf("%s|%s|%d|fail:%s", cl.JobID, cl.Factory, cl.Epoch, cl.Reason)] = true
			okCall[fmt.Sprintf("%s|%s|%d|end", cl.JobID, cl.Factory, cl.Epoch)] = true
		case coord.RouteRelease:
			okCall[fmt.Sprintf("%s|%s|%d|end", cl.JobID, cl.Factory, cl.Epoch)] = true
		}
	}
	for _, f := range in.Factories {
		for _, s := range f.Spool {
			c.Violations = append(c.Violations, fmt.Sprintf("%s: spool still holds %s", f.ID, s))
		}
		for _, s := range f.SpoolDead {
			c.Violations = append(c.Violations, fmt.Sprintf("%s: spool/dead holds %s (refused for good)", f.ID, s))
		}
		for _, d := range f.Delivered {
			delivered++
			if !okCall[fmt.Sprintf("%s|%s|%d|%s", d.Job, f.ID, d.Epoch, d.Report)] {
				c.Violations = append(c.Violations, fmt.Sprintf("%s logged %s of %s at epoch %d delivered; the stub has no such accepted call", f.ID, d.Report, d.Job, d.Epoch))
			}
		}
		for _, rec := range f.Records {
			if rec.Running() {
				c.Violations = append(c.Violations, fmt.Sprintf("%s: record of %s still says running (epoch %d)", f.ID, rec.ID, rec.LeaseEpoch))
				continue
			}
			if rec.Fenced {
				continue
			}
			key := fmt.Sprintf("%s|%s|%d|end", rec.ID, f.ID, rec.LeaseEpoch)
			if !okCall[key] {
				l := leases[leaseKey{rec.ID, rec.LeaseEpoch}]
				if rec.Stage == job.Building && rec.Reason == job.ReasonInterrupted && l != nil && l.endKind == "reaped" {
					c.Notes = append(c.Notes, fmt.Sprintf("%s: the lease of %s could not be given back at a stop; the reaper freed it", f.ID, rec.ID))
					continue
				}
				c.Violations = append(c.Violations, fmt.Sprintf("%s: its record of %s (stage %s, reason %q, epoch %d) has no accepted report in the call log", f.ID, rec.ID, rec.Stage, rec.Reason, rec.LeaseEpoch))
			}
		}
	}
	c.OK = len(c.Violations) == 0
	c.Summary = fmt.Sprintf("%d delivered reports matched; spools empty: %v", delivered, c.OK)
	return c
}

// leasesFreed: failed jobs freed their lease at once; every reap is explained by a fault.
func (f *facts) leasesFreed(rep *Report) CheckResult {
	in, leases := f.in, f.leases
	c := CheckResult{Name: "leases freed without the reaper",
		Definition: "every lease ended, and every lease whose run failed ended by that run's /fleet/fail (or a release) at once, not by the reaper: the reaper reclaimed only leases of a holder hit by an injected fault while it still renewed — killed, drained or cut off, or the stub restarted, within 3 s (two missed renewals) of the lease's last accepted renewal or grant, or the stub refusing that lease's renewals with 503s before the reclaim; any other reclaim (a holder alive and connected that stopped renewing by itself) is a violation"}
	for _, l := range leases {
		kind := l.endKind
		if kind == "" {
			kind = "open"
			c.Violations = append(c.Violations, fmt.Sprintf("%s epoch %d (%s): the lease never ended", l.job, l.epoch, l.factory))
		}
		rep.LeaseEnds[kind]++
		if l.endKind != "reaped" {
			continue
		}
		rp := Reap{Job: l.job, Epoch: l.epoch, Holder: l.factory, LastRenewal: l.lastRenew, At: l.end}
		rp.Explained = explain(in, l.job, l.epoch, l.factory, l.lastRenew, l.end)
		if rp.Explained == "" {
			c.Violations = append(c.Violations, fmt.Sprintf("%s epoch %d: reaped at %s from %s (last renewal %s) with no fault on %s or the stub in between",
				l.job, l.epoch, ts(l.end), l.factory, ts(l.lastRenew), l.factory))
		}
		rep.Reaps = append(rep.Reaps, rp)
	}
	sort.Slice(rep.Reaps, func(a, b int) bool { return rep.Reaps[a].At.Before(rep.Reaps[b].At) })
	fails := 0
	for _, cl := range in.Calls {
		if cl.Route == coord.RouteFail && isOK(cl.Status) && !cl.Resend {
			fails++
			if l := leases[leaseKey{cl.JobID, cl.Epoch}]; l == nil || l.endKind != "fail" {
				c.Violations = append(c.Violations, fmt.Sprintf("fail of %s at epoch %d by %s was accepted but did not end the lease", cl.JobID, cl.Epoch, cl.Factory))
			}
		}
	}
	c.OK = len(c.Violations) == 0
	c.Summary = fmt.Sprintf("%d leases: %d ended by a success report, %d by /fleet/fail, %d released, %d reaped (each explained by a fault)",
		len(leases), rep.LeaseEnds["report"], fails, rep.LeaseEnds["release"], rep.LeaseEnds["reaped"])
	return c
}

// gcLeftNothing: aq gc left nothing behind and deleted no unmerged work.
func (f *facts) gcLeftNothing(*Report) CheckResult {
	in := f.in
	c := CheckResult{Name: "gc: nothing left, nothing unmerged lost",
		Definition: "after aq gc on every factory (stopped, so with pooling off: AQ_WORKTREE_POOL=0): no worktree directory is left under $AQ_HOME/worktrees, pooled ones included, and git lists no linked worktree; gc reported no error; a dry run right after finds nothing more to delete (the policy wants nothing else gone); no factory keeps aq/wip/<id> of a job its record says it shipped; every ref gc deleted (in the clones and on the origins) is one the policy allows: aq/wip/<id> of a job the stub says shipped, or any aq/ ref whose tip is in origin's main; and every commit reachable before gc and not after was reachable only from such an allowed deletion"}
	deleted, lost := 0, 0
	for _, g := range in.GC {
		for _, w := range g.WorktreeDirs {
			c.Violations = append(c.Violations, fmt.Sprintf("%s: worktree left: %s", g.Factory, w))
		}
		for _, w := range g.Linked {
			c.Violations = append(c.Violations, "git still lists a linked worktree: "+w)
		}
		if g.RunExit != 0 || len(g.Run.Errors) > 0 {
			c.Violations = append(c.Violations, fmt.Sprintf("%s: aq gc exit %d, errors %v %s", g.Factory, g.RunExit, g.Run.Errors, g.RunErr))
		}
		a := g.After.Deleted
		if a.JobBranches+a.WIPRefs+a.Worktrees+a.RemoteRefs+a.OtherRefs+a.Pooled > 0 {
			c.Violations = append(c.Violations, fmt.Sprintf("%s: a dry run after gc would still delete %+v", g.Factory, a))
		}
		var fd *FactoryData
		for i := range in.Factories {
			if in.Factories[i].ID == g.Factory {
				fd = &in.Factories[i]
			}
		}
		for repo, wips := range g.LocalWIP {
			for id := range wips {
				if fd != nil {
					if rec, ok := fd.Records[id]; ok && rec.Stage == job.Shipped && !rec.Fenced {
						c.Violations = append(c.Violations, fmt.Sprintf("%s/%s: keeps aq/wip/%s of a job it shipped", g.Factory, repo, id))
					}
				}
			}
		}
		allowed := map[string]bool{} // where/repo|sha reachable only from allowed deletions
		for _, d := range g.Deleted {
			deleted++
			ok, why := allowedDeletion(in, d)
			if !ok {
				c.Violations = append(c.Violations, fmt.Sprintf("%s %s %s (%s) deleted: %s", d.Where, d.Repo, d.Ref, brief.SHA(d.SHA), why))
				continue
			}
			for _, s := range d.OnlyFrom {
				allowed[d.Where+"/"+d.Repo+"|"+s] = true
			}
		}
		for where, shas := range g.Lost {
			for _, s := range shas {
				lost++
				if !allowed[where+"|"+s] {
					c.Violations = append(c.Violations, fmt.Sprintf("%s: commit %s became unreachable without an allowed deletion", where, brief.SHA(s)))
				}
			}
		}
	}
	c.OK = len(c.Violations) == 0
	c.Summary = fmt.Sprintf("%d refs deleted (all allowed), %d commits dropped with them, no worktree left, second run deletes nothing", deleted, lost)
	if !c.OK {
		c.Summary = fmt.Sprintf("%d refs deleted, %d commits dropped; %d violations", deleted, lost, len(c.Violations))
	}
	return c
}

// noEngineAlive: no engine is alive after the factories stopped.
func (f *facts) noEngineAlive(*Report) CheckResult {
	in := f.in
	c := CheckResult{Name: "no engine left alive",
		Definition: "after every factory stopped, no live process carries a job's tag (process.FindScoped(<job id>, \"\") for every job) or a factory's scope (AQ_SCOPE of its home, scanned in /proc), nor a straggler's mark on its command line (it dropped both)"}
	c.Violations = append(c.Violations, in.Alive...)
	c.OK = len(c.Violations) == 0
	c.Summary = fmt.Sprintf("%d jobs and %d factory scopes scanned; %d processes alive", len(in.Jobs), len(in.Factories), len(in.Alive))
	return c
}

// noCrash: the harness saw no crash, and every job's outcome fits its plan.
func (f *facts) noCrash(*Report) CheckResult {
	in := f.in
	c := CheckResult{Name: "no crash, outcomes fit the plans",
		Definition: "no factory exited on its own, every SIGTERM ended its daemon with exit 0, and every job's end fits its engine plan: invalid manifests end failed (invalid_manifest, never retried), always-failing engines never ship"}
	c.Violations = append(c.Violations, in.Problems...)
	for _, j := range in.Jobs {
		sj := in.State.Jobs[j.ID]
		if sj == nil {
			continue
		}
		switch {
		case j.Plan == PlanInvalid && (sj.Stage != coord.StageFailed || sj.Reason != string(job.ReasonInvalidManifest)):
			c.Violations = append(c.Violations, fmt.Sprintf("%s (invalid manifest) ended %s (%s)", j.ID, sj.Stage, sj.Reason))
		case j.Plan == PlanAlways && sj.Stage == coord.StageShipped:
			c.Violations = append(c.Violations, fmt.Sprintf("%s (always fails) shipped", j.ID))
		case j.Plan != PlanInvalid && j.Plan != PlanAlways && sj.Stage != coord.StageShipped:
			c.Notes = append(c.Notes, fmt.Sprintf("%s (plan %s) ended %s after %d attempts (last reason %s)", j.ID, j.Plan, sj.Stage, sj.Attempts, sj.Reason))
		}
	}
	c.OK = len(c.Violations) == 0
	c.Summary = fmt.Sprintf("%d problems seen while running", len(in.Problems))
	return c
}

// allowedDeletion applies the policy's rules, independently of gc's code.
func allowedDeletion(in *Input, d DeletedRef) (bool, string) {
	if d.InBase {
		return true, ""
	}
	name := strings.TrimPrefix(strings.TrimPrefix(d.Ref, "refs/heads/"), "refs/remotes/origin/")
	if id, ok := strings.CutPrefix(name, "aq/wip/"); ok {
		if sj := in.State.Jobs[id]; sj != nil && sj.Stage == coord.StageShipped {
			return true, ""
		}
		stage := "unknown to the stub"
		if sj := in.State.Jobs[id]; sj != nil {
			stage = sj.Stage
		}
		return false, "a WIP ref of a job that is " + stage + ", not shipped, and its work is not in main"
	}
	return false, "not merged into main"
}

// leaseAt is the lease of factory on the job (ls) that was held at t.
func leaseAt(ls []*lease, factory string, t time.Time) *lease {
	for _, l := range ls {
		if l.factory != factory || t.Before(l.granted) {
			continue
		}
		if l.endKind == "" || !t.After(l.end) {
			return l
		}
	}
	return nil
}

func describeLeases(ls []*lease) string {
	var parts []string
	for _, l := range ls {
		end := "open"
		if l.endKind != "" {
			end = l.endKind + " " + ts(l.end)
		}
		parts = append(parts, fmt.Sprintf("e%d %s %s..%s", l.epoch, l.factory, ts(l.granted), end))
	}
	return strings.Join(parts, "; ")
}

// redelivered reports whether factory's logs (or its job record) say it
// reported the commit sha for job as a result found on origin, without
// running the engine (runner: redeliver).
func redelivered(in *Input, factory, job, sha string) bool {
	for _, f := range in.Factories {
		if f.ID == factory {
			return f.Redelivered[job] == sha || f.Records[job].Delivered == sha
		}
	}
	return false
}

// inFlightWindow: how long after a requeue a push of the fenced holder may
// still land — it learns of the revocation at its next renewal (1 s in the
// chaos run), and checked its lease locally just before pushing.
const inFlightWindow = 1500 * time.Millisecond

// inFlight reports whether a push by factory at t landed just after the
// coordinator revoked that factory's lease by a requeue, before any other
// factory held the job.
func inFlight(ls []*lease, factory string, t time.Time) bool {
	for i, l := range ls {
		if l.factory != factory || l.endKind != "requeued" || t.Before(l.end) || t.Sub(l.end) > inFlightWindow {
			continue
		}
		if i+1 < len(ls) && !ls[i+1].granted.After(t) {
			return false // someone else held it by then
		}
		return true
	}
	return false
}
