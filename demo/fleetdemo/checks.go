package fleetdemo

import (
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/aqfleet/aq/agent/daemon"
	"github.com/aqfleet/aq/demo"
	"github.com/aqfleet/aq/demo/coord"
	"github.com/aqfleet/aq/internal/brief"
)

// submitted is the order the demo submits its jobs in.
var submitted = []string{"api-health", "web-title", "docs-intro", "web-footer", "web-header", "web-nav", "docs-verify", "api-resume"}

// expected is where each job must end. docs-verify, out of retries, is
// dead_letter by the coordinator's policy after /fleet/fail; against today's
// coordinator (legacy routes) aq applies the policy and PATCHes failed.
func (r *run) expected() map[string]string {
	dv := coord.StageDeadLetter
	if r.legacy() {
		dv = coord.StageFailed
	}
	return map[string]string{
		"api-health": coord.StageShipped, "web-title": coord.StageShipped, "docs-intro": coord.StageShipped,
		"web-footer": coord.StageShipped, "web-header": coord.StageShipped, "web-nav": coord.StageShipped,
		"docs-verify": dv, "api-resume": coord.StageShipped,
	}
}

// summarize fills sum from the stub's audit trail and counters and what
// the demo observed, and evaluates the checks.
func (r *run) summarize(sum *Summary) {
	for _, id := range r.order {
		f := r.facs[id]
		sum.Factories = append(sum.Factories, FactoryRow{ID: id, Home: f.home, PIDs: f.pids})
	}
	if r.stub == nil {
		return
	}
	for _, id := range submitted {
		j, ok := r.stub.Job(id)
		if !ok {
			continue
		}
		sum.Jobs = append(sum.Jobs, JobRow{ID: id, Repo: j.Repo, Stage: j.Stage, Reason: j.Reason, Attempts: r.attempts(id)})
	}
	st := r.stub.Stats()
	for route, rs := range st.Routes {
		if route == coord.RouteGetStats {
			continue
		}
		sum.Requests = append(sum.Requests, RouteRow{Route: route, Requests: rs.Requests, Status: rs.Status})
	}
	sort.Slice(sum.Requests, func(i, j int) bool {
		if sum.Requests[i].Requests != sum.Requests[j].Requests {
			return sum.Requests[i].Requests > sum.Requests[j].Requests
		}
		return sum.Requests[i].Route < sum.Requests[j].Route
	})
	sum.Total = st.Total()
	sum.GC = r.ob.gc
	sum.Checks = r.checks(sum)
}

// attempts reads a job's leases from its audit trail: each claim or accept
// starts one; the first later event of that epoch ends it.
func (r *run) attempts(id string) []Attempt {
	evs := r.stub.Events(id)
	var out []Attempt
	for i, e := range evs {
		if e.Kind != "claimed" && e.Kind != "accepted" {
			continue
		}
		a := Attempt{Epoch: e.Epoch, Factory: e.Factory, Via: e.Kind, Result: "running"}
		if m, ok := r.message(id, e.Epoch); ok {
			a.Target = m.Target
		}
	end:
		for _, x := range evs[i+1:] {
			switch {
			case x.Kind == "stage" && x.Epoch == e.Epoch && x.Stage != coord.StageBuilding:
				a.Result = x.Stage
				if x.Stage == coord.StageQueued || x.Stage == coord.StageFailed {
					a.Result = "PATCH → " + x.Stage + ", lease released" // no /fleet/fail (legacy routes)
				}
			case x.Kind == "fail" && x.Epoch == e.Epoch:
				a.Result = x.Detail + " → " + x.Stage
			case x.Kind == "reaped" && x.Epoch == e.Epoch+1:
				a.Result = "lease expired, reaped → " + x.Stage
			case x.Kind == "released" && x.Epoch == e.Epoch:
				a.Result = "released → " + x.Stage
			case x.Kind == "requeued" && x.Epoch == e.Epoch+1:
				a.Result = "requeued by an operator"
			default:
				continue
			}
			break end
		}
		if e.Factory == r.ob.killed && e.Epoch == r.ob.killedEpoch {
			a.Result = "kill -9; " + a.Result
			for _, f := range r.zombieRefusals() {
				a.Result += fmt.Sprintf("; restarted as a zombie: %s → 409 fenced", f.Call)
				break
			}
		}
		out = append(out, a)
	}
	return out
}

// checks are the expected events, each ok or not, from what was observed.
func (r *run) checks(sum *Summary) []Check {
	var cs []Check
	add := func(ok bool, what, note string) { cs = append(cs, Check{What: what, OK: ok, Note: note}) }
	ob := &r.ob
	byID := map[string]JobRow{}
	for _, j := range sum.Jobs {
		byID[j.ID] = j
	}

	// The fleet.
	beating := 0
	for _, f := range r.stub.AllFactories() { // they have left (deregistered) by now
		if slices.Contains(factoryIDs, f.ID) && !f.LastHeartbeatAt.IsZero() {
			beating++
		}
	}
	add(beating == len(factoryIDs), "two aq daemons (child processes, each with its own AQ_HOME and clones) enrolled and heartbeated",
		fmt.Sprintf("%d of %d", beating, len(factoryIDs)))

	// Dispatch.
	var takes, viaPath, targeted int
	var bad []string
	for _, j := range sum.Jobs {
		for _, a := range j.Attempts {
			takes++
			switch {
			case r.broker && a.Via == "accepted":
				viaPath++
				m, ok := r.message(j.ID, a.Epoch)
				subs := r.routedTo(m.MessageID)
				if ok && m.Target == a.Factory && len(subs) == 1 && subOf(subs[0]) == a.Factory {
					targeted++
				} else {
					bad = append(bad, fmt.Sprintf("%s@%d", j.ID, a.Epoch))
				}
			case !r.broker && a.Via == "claimed":
				viaPath++
			}
		}
	}
	if r.broker {
		note := fmt.Sprintf("%d of %d leases", targeted, takes)
		if len(bad) > 0 {
			note += "; not targeted: " + strings.Join(bad, " ")
		}
		add(takes > 0 && targeted == takes, "targeted dispatch: every job was published to one factory's subscription and accepted by that factory", note)
	} else {
		add(takes > 0 && viaPath == takes, "no broker ("+r.why+"): every job was claimed over the gated poll path",
			fmt.Sprintf("%d of %d leases claimed", viaPath, takes))
	}
	if r.refuse {
		var notes []string
		for _, id := range r.order {
			if why := ob.refused[id]; why != "" {
				notes = append(notes, id+": "+why)
			}
		}
		add(len(ob.refused) == len(r.order), "each factory, given a broker, refused it at start: the coordinator has no POST /fleet/accept",
			strings.Join(notes, "; "))
	}

	// Parallel and serial.
	var par []string
	for _, fid := range r.order {
		if js := ob.parallel[fid]; len(js) > 0 {
			par = append(par, fid+": "+strings.Join(js, ", "))
		}
	}
	add(ob.parallelRepo == 3, "three jobs on three repos ran at the same time", strings.Join(par, "; "))
	add(ob.serialOK && ob.navWaits != "", "same-repo jobs ran one after another on one factory (web-nav waited for the web repo)", ob.serialNote)

	// The failing job.
	{
		fail, okF := r.lastFailure("docs-verify")
		take, okT := r.lastEvent("docs-verify", "claimed", "accepted")
		reaped := len(r.events("docs-verify", "reaped")) + len(r.events("docs-verify", "expired"))
		free, okR := fail, okF
		how := "POST /fleet/fail"
		if r.legacy() {
			free, okR = r.released("docs-verify", take.Epoch)
			how = "a fenced PATCH then lease/release: the coordinator has no /fleet/fail"
		}
		d := free.At.Sub(take.At)
		add(okF && okT && okR && reaped == 0 && fail.Stage == r.expected()["docs-verify"] && r.job("docs-verify").Holder == "",
			"a failing job released its lease at once ("+how+", no reaper wait)",
			fmt.Sprintf("%s → %s, lease free %s after it was taken", fail.Detail, fail.Stage, d.Round(time.Millisecond)))
	}

	// Attempt 1 of api-resume.
	{
		var first coord.Event
		for _, e := range r.failures("api-resume") {
			first = e
			break
		}
		add(ob.cp1 != "" && ob.originAfter1 == ob.cp1 && ob.step1Files && first.Stage == coord.StageQueued,
			"api-resume's first attempt pushed its WIP checkpoint (step 1) while holding the lease, and was requeued at once",
			fmt.Sprintf("checkpoint %s, origin aq/wip/api-resume %s → %s", brief.SHA(ob.cp1), brief.SHA(ob.originAfter1), first.Stage))
	}

	// kill -9.
	{
		st := ob.statusAfter
		inFile := st != nil && slices.ContainsFunc(st.Running, func(j daemon.RunningJob) bool { return j.JobID == "api-resume" })
		add(ob.killed != "" && strings.Contains(ob.killedSignal, "killed") && inFile && !st.Alive(),
			"a factory was killed with kill -9 mid-job",
			fmt.Sprintf("%s (pid %d) %s; its status file still said running api-resume, with its pid gone", ob.killed, ob.killedPID, ob.killedSignal))
	}
	add(len(ob.orphanEngines) > 0 && ob.engineStopped >= 0,
		"no engine runs on without its aq: the killed factory's engine was stopped by its supervisor",
		fmt.Sprintf("engine %v gone %s after the kill -9", ob.orphanEngines, ob.engineStopped.Round(10*time.Millisecond)))
	{
		var reaped bool
		for _, e := range r.events("api-resume", "reaped") {
			reaped = reaped || (e.Factory == ob.killed && e.Epoch == ob.killedEpoch+1)
		}
		add(reaped && ob.reapedAfter <= leaseTTL+5*time.Second, "the reaper reclaimed the dead factory's lease",
			fmt.Sprintf("%s after the kill (lease TTL %s)", ob.reapedAfter.Round(100*time.Millisecond), leaseTTL))
	}
	{
		found, _, _ := r.marker("api-resume.found-step-1")
		step1By, _, _ := r.marker("api-resume.step-1")
		lines := strings.Fields(found)
		crossed := slices.ContainsFunc(lines, func(f string) bool { return f != step1By })
		files := ob.resultFiles
		ok := ob.resumer != "" && ob.resumer != ob.killed && byID["api-resume"].Stage == coord.StageShipped &&
			slices.Contains(lines, ob.resumer) && crossed &&
			slices.Contains(files, "step-1.txt") && slices.Contains(files, "step-2.txt") && !slices.Contains(files, "step-2-partial.txt")
		add(ok, "the other factory resumed from the pushed WIP checkpoint (it found step 1) and shipped",
			fmt.Sprintf("%s resumed; step 1 was written by %s; shipped files: %s", ob.resumer, step1By, strings.Join(files, ", ")))
	}
	{
		refusals := r.zombieRefusals()
		reported := 0
		for _, e := range r.stub.Events("api-resume") {
			if (e.Kind == "fail" || e.Kind == "stage") && e.Factory == ob.killed && e.Epoch == ob.killedEpoch && e.At.After(ob.killedAt) {
				reported++
			}
		}
		var calls []string
		for _, e := range refusals {
			calls = append(calls, e.Call+" at epoch "+fmt.Sprint(e.Epoch))
		}
		add(ob.zombieUp && len(refusals) > 0 && reported == 0 && ob.wipAfter != "" && ob.wipAfter == ob.wipBefore && strings.Contains(ob.zombieRecord, "fenced=true"),
			"the killed factory came back as a zombie and was fenced: 409, nothing pushed, nothing reported",
			fmt.Sprintf("%s refused; origin aq/wip/api-resume unchanged (%s); its record: %s", strings.Join(calls, ", "), brief.SHA(ob.wipAfter), ob.zombieRecord))
	}
	add(slices.Contains(ob.zombieLocal, "step-2-partial.txt") && len(ob.zombieEngines) == 0 && ob.zombieUp,
		"no work lost: the zombie stopped its old engine and kept its half-done step 2 on its local aq/wip/api-resume", "")

	// gc.
	{
		var first, second, errs int
		var wt, wip int
		for _, g := range ob.gc {
			n := 0
			for _, v := range g.Deleted {
				n += v
			}
			if g.Run == 1 {
				first += n
				wt += g.Deleted["worktrees"]
				wip += g.Deleted["wipRefs"]
			} else {
				second += n
			}
			errs += len(g.Errors)
		}
		add(len(ob.gc) == 2*len(factoryIDs) && wt > 0 && wip > 0 && ob.mergedGone && ob.zombieKept && errs == 0,
			"aq gc cleaned up: worktrees, WIP refs of shipped jobs, the merged job branch (also on origin); it kept unmerged work",
			fmt.Sprintf("%d deleted (%d worktrees, %d local WIP refs); merged aq/job/api-health gone from origin: %t", first, wt, wip, ob.mergedGone))
		add(len(ob.gc) == 2*len(factoryIDs) && second == 0, "a second aq gc deleted nothing", "")
	}

	// Outcomes.
	{
		var wrong []string
		shipped := 0
		expected := r.expected()
		for _, id := range submitted {
			got := byID[id].Stage
			if got != expected[id] {
				wrong = append(wrong, fmt.Sprintf("%s is %q, want %s", id, got, expected[id]))
			}
			if got == coord.StageShipped {
				shipped++
			}
		}
		note := fmt.Sprintf("%d shipped, docs-verify %s", shipped, byID["docs-verify"].Stage)
		if len(wrong) > 0 {
			note = strings.Join(wrong, "; ")
		}
		add(len(wrong) == 0, "every job ended where it should: seven shipped, docs-verify in "+expected["docs-verify"], note)
	}

	// The end.
	{
		var codes []string
		ok := len(ob.stopped) == len(r.order)
		for _, id := range r.order {
			c, seen := ob.stopped[id]
			ok = ok && seen && c == 0
			codes = append(codes, fmt.Sprintf("%s exit %d", id, c))
		}
		add(ok, "both daemons drained and exited 0 on SIGTERM", strings.Join(codes, ", "))
	}
	{
		alive := []string{}
		for _, id := range r.order {
			if r.facs[id].running() {
				alive = append(alive, id+"'s daemon")
			}
		}
		if !r.peer.Exited() {
			alive = append(alive, "the Service Bus peer")
		}
		alive = append(alive, ob.leftovers...)
		note := "daemons and peer reaped; no process carries a demo job's tag"
		if errors.Is(ob.leftoverErr, errors.ErrUnsupported) {
			note = "daemons and peer reaped (this OS has no /proc to look for engines by tag)"
		}
		if len(alive) > 0 {
			note = strings.Join(alive, ", ")
		}
		add(len(alive) == 0, "nothing the demo started is left running", note)
	}
	if ob.aborted != nil {
		add(false, "the story ran to the end", ob.aborted.Error())
	}
	return cs
}

// printSummary prints the jobs, the requests and the checks.
func (r *run) printSummary(sum *Summary) {
	r.say("")
	r.say("7. Summary (jobs reached the factories by: %s)", sum.Path)
	tw := tabwriter.NewWriter(r.out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "   JOB\tREPO\tOUTCOME\tATTEMPTS: factory@epoch → result")
	for _, j := range sum.Jobs {
		outcome := j.Stage
		if j.Reason != "" && j.Stage != coord.StageShipped {
			outcome += " (" + j.Reason + ")"
		}
		for i, a := range j.Attempts {
			via := ""
			if a.Target != "" {
				via = " (message to " + a.Target + ")"
			}
			cell := fmt.Sprintf("%s@%d%s → %s", a.Factory, a.Epoch, via, a.Result)
			if i == 0 {
				fmt.Fprintf(tw, "   %s\t%s\t%s\t%s\n", j.ID, j.Repo, outcome, cell)
			} else {
				fmt.Fprintf(tw, "   \t\t\t%s\n", cell)
			}
		}
		if len(j.Attempts) == 0 {
			fmt.Fprintf(tw, "   %s\t%s\t%s\t-\n", j.ID, j.Repo, outcome)
		}
	}
	tw.Flush()
	r.say("")
	r.say("   Requests to the coordinator stub (its GET /fleet/_stats): %d in all", sum.Total)
	tw = tabwriter.NewWriter(r.out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "   ROUTE\tREQUESTS\tANSWERS")
	for _, rr := range sum.Requests {
		var codes []string
		for c, n := range rr.Status {
			codes = append(codes, fmt.Sprintf("%s×%d", c, n))
		}
		sort.Strings(codes)
		fmt.Fprintf(tw, "   %s\t%d\t%s\n", rr.Route, rr.Requests, strings.Join(codes, " "))
	}
	tw.Flush()
	r.say("")
	r.say("8. Expected events")
	demo.WriteChecks(r.out, sum.Checks)
	r.say("")
	r.say("fleet act: %d of %d checks passed in %s", demo.Passed(sum.Checks), len(sum.Checks), time.Since(r.start).Round(100*time.Millisecond))
}
