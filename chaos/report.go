//go:build linux

package chaos

import (
	"fmt"
	"io"
	"sort"
	"strings"
	"time"
)

// Bug is one bug the harness found, and its fix.
type Bug struct {
	Title      string
	Where      string // file(s) of the fix
	Cause      string
	Fix        string
	Regression string // the test that fails without the fix
}

// BugsFound are the bugs chaos runs found; the report lists them.
func BugsFound() []Bug { return append([]Bug(nil), bugsFound...) }

// WriteMarkdown writes the report of res (docs/RELIABILITY.md).
func WriteMarkdown(w io.Writer, res *Result) error {
	cfg := res.Config
	var b strings.Builder
	p := func(format string, args ...any) { fmt.Fprintf(&b, format, args...) }
	// items writes a list of n items, item(i) each, cut after the first limit.
	items := func(n, limit int, item func(i int) string) {
		for i := range min(n, limit) {
			p("  - %s\n", item(i))
		}
		if n > limit {
			p("  - … and %d more\n", n-limit)
		}
	}
	verdict := "**all invariants hold**"
	if res.Checks == nil || !res.Checks.OK() {
		verdict = "**INVARIANTS BROKEN** (see below)"
	}

	p("# Reliability: the chaos run\n\n")
	p("This page is written by `make chaos` (`go run ./chaos/cmd/chaos --out docs/RELIABILITY.md`): a %s run of the\n", cfg.Name)
	p("chaos harness (`chaos/`), which proves on a real multi-host fleet what the second milestone (M2) of the coordinator team's \"Fleet dispatch redesign\" asks to\n")
	p("verify — exactly-once shipping and crash recovery — and that nothing is lost on the way. `make test` runs a\n")
	p("reduced run (`TestChaos`) that fails on any broken invariant. Result of this run: %s.\n\n", verdict)

	p("## The run\n\n| | |\n|---|---|\n")
	p("| date | %s |\n", res.Started.Format(time.RFC3339))
	p("| seed | `%d` — replay with `go run ./chaos/cmd/chaos --seed %d` |\n", cfg.Seed, cfg.Seed)
	mode := "`" + res.Mode + "`"
	if res.Mode == ModeNetns {
		mode += " — every factory in its own network namespace"
	} else {
		mode += " — plain processes on loopback"
		if res.ModeWhy != "" {
			mode += " (network namespaces unavailable: " + res.ModeWhy + ")"
		}
	}
	p("| host mode | %s |\n", mode)
	p("| network | %s |\n", res.Network)
	engines := res.Sandbox
	if res.SandboxWhy != "" {
		engines += " — " + res.SandboxWhy
	} else {
		engines += " — a quarter of the engines daemonise a straggler (a process that drops the job's tag and leaves its process group), which only the sandbox ends with its job"
	}
	p("| engines | %s |\n", engines)
	race := "without -race"
	if cfg.AQRace {
		race = "with -race"
	}
	p("| factories | %d real `aq daemon` processes (aq built %s), %d slots each, each with its own AQ_HOME and clones; broker delivery (the local AMQP peer) with the poll path as fallback, the poll path gated on half of them; `AQ_ENGINES=all` (the jobs are script jobs, which a fleet factory runs only when told to) and `AQ_ENGINE_ENV=CHAOS_RUNS,CHAOS_FACTORY` (what the scripts read) |\n", cfg.Factories, race, cfg.Slots)
	p("| coordinator | the stub (`demo/coord`) as a child process, state in a file (rewritten and fsynced before each answer), lease TTL %s, factories stale after %s, reaper every 200 ms, retry backoff capped at 1 s, publishing a targeted message per queued job |\n", cfg.LeaseTTL, cfg.StaleAfter)
	p("| origins | bare repositories on the shared file system, pushed to over file paths: a partition cuts a factory off the coordinator and the broker but not off git — GitHub staying reachable while the coordinator is not, the interesting zombie case |\n")
	p("| run time | %s (converged: %v) |\n\n", res.Duration.Round(time.Second), res.Converged)

	// Load.
	plans := map[string]int{}
	for _, j := range res.Jobs {
		plans[j.Plan]++
	}
	p("## Load\n\n%d jobs over %d repositories, submitted %.0f%% at once and the rest over %s, for a scripted engine (`engine: script`, `ship: branch`, wall budget %s, `retry: {max: 2, backoff: 1s}`) that writes files in two steps and, per its plan:\n\n",
		len(res.Jobs), cfg.Repos, cfg.InitialShare*100, cfg.SubmitSpan, cfg.Wall)
	p("| plan | jobs | engine | shipped | failed | dead_letter | other |\n|---|---:|---|---:|---:|---:|---:|\n")
	desc := map[string]string{PlanOK: "succeeds", PlanFail: "exits 1 on its first 1–2 runs (retried)", PlanAlways: "always exits 1", PlanHang: "hangs past the wall budget on its first run (timeout, retried)", PlanInvalid: "manifest with an unknown key (invalid_manifest)"}
	for _, pl := range []string{PlanOK, PlanFail, PlanHang, PlanAlways, PlanInvalid} {
		var o map[string]int
		if res.Checks != nil {
			o = res.Checks.Outcomes[pl]
		}
		other := plans[pl] - o["shipped"] - o["failed"] - o["dead_letter"]
		p("| %s | %d | %s | %d | %d | %d | %d |\n", pl, plans[pl], desc[pl], o["shipped"], o["failed"], o["dead_letter"], other)
	}
	p("\n")

	// Faults.
	p("## Faults\n\nOn a seeded schedule (faults on one factory never overlap; every other combination may).\n\n")
	p("| fault | count | first | last | mid-job | down (total) |\n|---|---:|---:|---:|---:|---:|\n")
	kinds := []string{KindKill9, KindKill9Sandboxed, KindTerm, KindAbort, KindPeer, KindStub, KindErrors, KindReports, KindPartition, KindHostLost, KindPreempt}
	names := map[string]string{KindKill9: "kill -9 of a factory, restart", KindKill9Sandboxed: "kill -9 of a factory while a sandboxed engine's straggler is up, restart", KindTerm: "SIGTERM (drain, then stage two after AQ_DRAIN_TIMEOUT), restart",
		KindAbort: "two SIGTERMs (abort: checkpoint, fail retryable), restart", KindPeer: "broker peer killed, restarted", KindStub: "coordinator stub kill -9, restarted from its state file",
		KindErrors: "stub answers 503 for a share of factory calls, + latency", KindReports: "stub refuses most reports (PATCH, fail) with 503; renewals work",
		KindPartition: "factory cut off past its leases' expiry, reconnected",
		KindHostLost:  "host lost: every process killed -9, AQ_HOME and clones deleted, back as a fresh host",
		KindPreempt:   "preemption: the stub requeues a running job (epoch bumped, its factory fenced)"}
	t0 := res.Started
	for _, k := range kinds {
		n, mid := 0, 0
		var first, last time.Time
		var down time.Duration
		for _, f := range res.Faults {
			if f.Kind != k {
				continue
			}
			n++
			if first.IsZero() || f.Start.Before(first) {
				first = f.Start
			}
			if f.Start.After(last) {
				last = f.Start
			}
			if f.Running > 0 {
				mid++
			}
			if !f.End.IsZero() {
				down += f.End.Sub(f.Start)
			}
		}
		if n == 0 {
			p("| %s | 0 | | | | |\n", names[k])
			continue
		}
		midS := "—"
		if Fault.factoryFault(Fault{Kind: k}) {
			midS = fmt.Sprintf("%d/%d", mid, n)
		}
		p("| %s | %d | +%s | +%s | %s | %s |\n", names[k], n, first.Sub(t0).Round(time.Second), last.Sub(t0).Round(time.Second), midS, down.Round(100*time.Millisecond))
	}
	p("\n<details><summary>Timeline</summary>\n\n| at | fault | target | jobs held | lasted | |\n|---:|---|---|---:|---:|---|\n")
	for _, f := range res.Faults {
		target := "stub"
		switch {
		case f.factoryFault():
			target = fmt.Sprintf("f%d", f.Target+1)
		case f.Kind == KindPeer:
			target = "broker"
		}
		extra := f.Detail
		switch f.Kind {
		case KindErrors:
			extra = fmt.Sprintf("%.0f%% 503, +%s", f.Rate*100, f.Latency)
		case KindReports:
			extra = fmt.Sprintf("%.0f%% of reports 503", f.Rate*100)
		}
		lasted := ""
		if !f.End.IsZero() {
			lasted = f.End.Sub(f.Start).Round(100 * time.Millisecond).String()
		}
		p("| +%s | %s | %s | %d | %s | %s |\n", f.Start.Sub(t0).Round(100*time.Millisecond), f.Kind, target, f.Running, lasted, extra)
	}
	p("\n</details>\n\n")

	// Invariants.
	if res.Checks != nil {
		rep := res.Checks
		p("## Invariants\n\n| invariant | result | what the run showed |\n|---|---|---|\n")
		for _, c := range rep.Checks {
			r := "PASS"
			if !c.OK {
				r = "**FAIL**"
			}
			p("| %s | %s | %s |\n", c.Name, r, c.Summary)
		}
		p("\nPrecisely:\n\n")
		for _, c := range rep.Checks {
			p("- **%s** — %s.", c.Name, c.Definition)
			if len(c.Violations) > 0 {
				p(" Violations (%d):\n", len(c.Violations))
				items(len(c.Violations), 20, func(i int) string { return c.Violations[i] })
			} else {
				p("\n")
			}
		}
		p("\n## What the faults did\n\n")
		p("- Leases: %s.\n", leaseLine(rep.LeaseEnds))
		p("- Orphans recovered at start-up after a kill -9 (checkpoint, WIP push under a confirmed lease, `/fleet/fail crash`): %d.\n", rep.Orphans)
		p("- Shipped jobs whose verify passed only after repair rounds (the engine handed verify's failure): %d, in %d rounds.\n", rep.Repaired, rep.RepairRounds)
		p("- Zombies (partitions):\n")
		for _, z := range rep.Zombies {
			p("  - %s cut off for %s holding %d jobs: the reaper took %d of its leases (%d of those jobs ended terminal later); after it came back the stub refused %d of its calls with 409.\n",
				z.Factory, z.Duration, z.Running, z.Reaped, z.Recovered, z.Refused)
		}
		p("- Reaper reclaims (%d), each with the fault that explains it:\n", len(rep.Reaps))
		items(len(rep.Reaps), 40, func(i int) string {
			r := rep.Reaps[i]
			ex := r.Explained
			if ex == "" {
				ex = "**unexplained**"
			}
			return fmt.Sprintf("+%s %s epoch %d of %s (last renewal +%s): %s", r.At.Sub(t0).Round(100*time.Millisecond), r.Job, r.Epoch, r.Holder, r.LastRenewal.Sub(t0).Round(100*time.Millisecond), ex)
		})
		if len(rep.Redelivered) > 0 {
			p("- Results reported without running the engine again (an earlier attempt had pushed the result and was lost before its report): %d.\n", len(rep.Redelivered))
			items(len(rep.Redelivered), 15, func(i int) string { return rep.Redelivered[i] })
		}
		if len(rep.InFlight) > 0 {
			p("- Pushes in flight when a preemption revoked the pusher's lease (landed within %s, before anyone else held the job): %d.\n", inFlightWindow, len(rep.InFlight))
			items(len(rep.InFlight), 15, func(i int) string { return rep.InFlight[i] })
		}
		if len(rep.Superseded) > 0 {
			p("- Job-branch pushes of runs whose result the coordinator did not accept (a run whose report was lost to a kill -9 or a partition and that was run again; the accepted run's push replaced it, as check 2 shows): %d.\n", len(rep.Superseded))
			items(len(rep.Superseded), 15, func(i int) string { return rep.Superseded[i] })
		}
		p("- Calls the stub answered (lease calls, by route and status): %s.\n", callsLine(rep.Calls))
		p("- ERROR lines in the factories' logs: %d (expected under these faults: unreachable coordinator, refused reports).\n", rep.FactoryErr)
	}
	if rep := res.Checks; rep != nil && rep.Requests > 0 {
		p("- Requests the factories made of the stub, over all its incarnations: %d (answered 503: %d, injected or while it started).\n", rep.Requests, rep.Refused503)
	}
	if len(res.Peer) > 0 {
		p("- Broker peer events: %s.\n", peerLine(res.Peer))
	}

	p("\n## Bugs the harness found, and their fixes\n\n")
	for i, bug := range bugsFound {
		p("%d. **%s** (`%s`). %s Fix: %s Regression test: %s.\n", i+1, bug.Title, bug.Where, bug.Cause, bug.Fix, bug.Regression)
	}
	p("\n## What the harness cannot show\n\n%s\n", cannotShow)
	_, err := io.WriteString(w, b.String())
	return err
}

func leaseLine(m map[string]int) string {
	keys := make([]string, 0, len(m))
	n := 0
	for k, v := range m {
		keys = append(keys, k)
		n += v
	}
	sort.Strings(keys)
	var parts []string
	for _, k := range keys {
		parts = append(parts, fmt.Sprintf("%d %s", m[k], map[string]string{"report": "ended by a success report", "fail": "by /fleet/fail", "release": "released unstarted",
			"reaped": "reaped", "open": "never ended", "requeued": "requeued", "rejected": "rejected"}[k]))
	}
	return fmt.Sprintf("%d granted: %s", n, strings.Join(parts, ", "))
}

func callsLine(m map[string]int) string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var parts []string
	for _, k := range keys {
		parts = append(parts, fmt.Sprintf("`%s` %d", k, m[k]))
	}
	return strings.Join(parts, ", ")
}

func peerLine(m map[string]int) string {
	var parts []string
	for _, k := range []string{"send", "duplicate", "deliver", "redelivery", "dead-letter", "connection"} {
		if m[k] > 0 {
			parts = append(parts, fmt.Sprintf("%s %d", k, m[k]))
		}
	}
	return strings.Join(parts, ", ")
}

const cannotShow = `- **Real clocks and real networks.** Every process shares one host clock (no skew between factories and the
  coordinator) and the "network" is veth pairs on one kernel: no packet loss short of a cut, no reordering, no
  asymmetric partition (the harness cuts both directions at once). Partitions are a link set down; there is no
  iptables/nft on this machine to drop packets selectively.
- **The real coordinator.** The stub is one process with one mutex and a JSON state file; Cosmos's CAS, the change feed
  and the real dispatcher are modelled, not run. A property of the stub (the call log, an epoch checked on every
  call) is what the checks read.
- **GitHub.** Origins are bare repositories on a shared file system: ` + "`ship: branch`" + ` only (no pull requests, no
  auto-merge, no branch protection), and a partition never cuts git — by design (the zombie case), but a factory
  that loses GitHub and the coordinator together is not exercised.
- **Exactly-once pushes.** A job branch can be pushed more than once: a run that pushed and then lost its report
  (a kill -9 between push and report, a cut between them) is run again and pushes again. What the harness shows is
  that every push happened under the pusher's lease and that the branch ends holding the accepted run's result;
  at-most-once pushing would need the push and the report to be one transaction, which git and the coordinator
  cannot give.
- **Timing-dependent windows.** Faults land where the seed puts them; a window of a few milliseconds (a cut between a
  lease confirmation and a push, a kill between a push and its report) is hit only by chance. More seeds cover more;
  none proves the absence of such a bug.
- **Service Bus.** The local AMQP peer is a model (no message-lock renewal, its own redelivery and session-lock timing; this run does not use sessions), not Azure.
- **Power loss.** kill -9 keeps the page cache; a power cut does not. The fsyncs are in the code, but no run proves them.
- **Scale.** Four factories and hundreds of jobs on a 2-vCPU machine, not a hundred hosts and a day of traffic.`
