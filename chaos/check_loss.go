//go:build linux

package chaos

import (
	"fmt"
	"sort"
	"strings"
	"time"
)

// engineOutlivesLimit is how long an engine may outlive the aq that started
// it: its supervisor's kill ladder (two AQ_KILL_GRACE of 500 ms here) and a
// second of slack. Without the supervisor an engine lived until its
// factory's next start (orphan recovery), or forever.
const engineOutlivesLimit = 2*500*time.Millisecond + time.Second

// lossSlack allows for the checkpoint itself and its push after the tick.
const lossSlack = 2 * time.Second

// heartbeatSlack: the engine refreshes its heartbeat every 200 ms, so one
// whose last sign of life is this close to a moment was alive then.
const heartbeatSlack = 500 * time.Millisecond

// lastSign is the last moment run r is known to have been alive: its
// heartbeat, its end, or (killed before its first heartbeat) its start.
func (r EngineRun) lastSign() time.Time {
	last := r.Start
	for _, t := range []time.Time{r.Alive, r.Done} {
		if t.After(last) {
			last = t
		}
	}
	return last
}

// runningAt reports whether run r was running at t: started before it and
// alive at it (a run that had failed or timed out earlier was not).
func (r EngineRun) runningAt(t time.Time) bool {
	return r.Start.Before(t) && !r.lastSign().Before(t.Add(-heartbeatSlack))
}

// workLost: an interruption lost at most one checkpoint interval of work.
func (f *facts) workLost(*Report) CheckResult {
	in, byJob, interrupts := f.in, f.runs, f.interrupts
	c := CheckResult{Name: "work lost ≤ one checkpoint interval",
		Definition: fmt.Sprintf("for every run interrupted by a kill -9, a lost host or a preemption, that had written part one more than one checkpoint interval (%s, + %s for the checkpoint and its push) before the interruption, the job's next run started from that part (its worktree held it): the engine's own step log (runs/<job>/<n>) against what the resumed run found", in.CheckpointInterval, lossSlack)}
	checked := 0
	for _, it := range interrupts {
		for i, r := range byJob[it.job] {
			if r.Factory != it.factory || !r.runningAt(it.at) || (!r.Done.IsZero() && r.Done.Before(it.at)) {
				continue
			}
			if r.Part1.IsZero() || it.at.Sub(r.Part1) <= in.CheckpointInterval+lossSlack || i+1 >= len(byJob[it.job]) {
				continue
			}
			checked++
			next := byJob[it.job][i+1]
			if next.Found1 < r.N {
				c.Violations = append(c.Violations, fmt.Sprintf("%s: run %d on %s wrote part one %s before the %s; run %d resumed without it (found run %d's)",
					it.job, r.N, r.Factory, it.at.Sub(r.Part1).Round(10*time.Millisecond), it.kind, next.N, next.Found1))
			}
		}
	}
	c.OK = len(c.Violations) == 0
	c.Summary = fmt.Sprintf("%d faults interrupted running engines (kill -9, host lost, preempted); %d interrupted runs had work older than one interval, and resumed from it", countFaults(in, KindKill9, KindKill9Sandboxed, KindHostLost, KindPreempt), checked-len(c.Violations))
	return c
}

// noEngineOutlives: no engine, nor a straggler one daemonised, outlived
// its aq by more than the kill ladder; and no straggler outlived its own
// run.
func (f *facts) noEngineOutlives(*Report) CheckResult {
	in, byJob := f.in, f.runs
	c := CheckResult{Name: "no engine or straggler outlives its aq",
		Definition: fmt.Sprintf("after every kill -9 of a factory's daemon (%s, and %s: while one of its engines runs in its sandbox with a straggler up — a process the engine daemonised that dropped the job's tag and left its process group), each engine it was running, and each straggler one of them had daemonised, showed its last sign of life (a file each refreshes every 200 ms) at most %s later: its sandbox or its supervisor ended it, no later aq was needed; and every straggler's last sign came at most %s after its own run's, however the run ended", KindKill9, KindKill9Sandboxed, engineOutlivesLimit, engineOutlivesLimit)}
	var worst, worstStraggler time.Duration
	n, withStraggler, stragglers := 0, 0, 0
	for _, f := range in.Faults {
		if !f.kills() {
			continue
		}
		it := interruption{kind: f.Kind, factory: fmt.Sprintf("f%d", f.Target+1), at: f.Start}
		for _, rs := range byJob {
			for _, r := range rs {
				if r.Factory != it.factory || !r.runningAt(it.at) {
					continue // not running at the kill
				}
				last := r.lastSign()
				n++
				worst = max(worst, last.Sub(it.at))
				if last.Sub(it.at) > engineOutlivesLimit {
					c.Violations = append(c.Violations, fmt.Sprintf("%s run %d on %s lived %s after its aq was killed (%s)", r.Job, r.N, r.Factory, last.Sub(it.at).Round(10*time.Millisecond), f.Kind))
				}
				if r.Straggler.IsZero() {
					continue
				}
				withStraggler++
				if d := r.Straggler.Sub(it.at); d > engineOutlivesLimit {
					c.Violations = append(c.Violations, fmt.Sprintf("the straggler of %s run %d on %s lived %s after its aq was killed (%s)", r.Job, r.N, r.Factory, d.Round(10*time.Millisecond), f.Kind))
				}
			}
		}
	}
	for _, rs := range byJob {
		for _, r := range rs {
			if r.Straggler.IsZero() {
				continue
			}
			stragglers++
			d := r.Straggler.Sub(r.lastSign())
			worstStraggler = max(worstStraggler, d)
			if d > engineOutlivesLimit {
				c.Violations = append(c.Violations, fmt.Sprintf("the straggler of %s run %d on %s lived %s after its run", r.Job, r.N, r.Factory, d.Round(10*time.Millisecond)))
			}
		}
	}
	sort.Strings(c.Violations)
	c.OK = len(c.Violations) == 0
	c.Summary = fmt.Sprintf("%d engines running at a kill -9 (%d with a straggler up); the longest lived %s after its aq; %d stragglers in all, the longest outlived its run by %s",
		n, withStraggler, worst.Round(10*time.Millisecond), stragglers, max(worstStraggler, 0).Round(10*time.Millisecond))
	return c
}

// noRerun: no engine ran again for a result already on origin.
func (f *facts) noRerun(*Report) CheckResult {
	in, byJob := f.in, f.runs
	c := CheckResult{Name: "no engine re-run for a delivered result",
		Definition: "no run of a job's engine started after the job's result branch (aq/job/<id>) was first pushed to origin (the origins' push log against the engine's step log): a delivered result is reported, never made again"}
	delivered := map[string]time.Time{}
	for _, p := range in.Pushes {
		id, ok := strings.CutPrefix(p.Ref, "refs/heads/aq/job/")
		if !ok || p.Deletes() || p.Phase == "gc" {
			continue
		}
		if t, seen := delivered[id]; !seen || p.T.Before(t) {
			delivered[id] = p.T
		}
	}
	for id, t := range delivered {
		for _, r := range byJob[id] {
			if r.Start.After(t) {
				c.Violations = append(c.Violations, fmt.Sprintf("%s: run %d started on %s %s after the result was on origin", id, r.N, r.Factory, r.Start.Sub(t).Round(10*time.Millisecond)))
			}
		}
	}
	c.OK = len(c.Violations) == 0
	c.Summary = fmt.Sprintf("%d results delivered; %d engine runs in all", len(delivered), len(in.Runs))
	return c
}

// interruption is a moment a factory stopped running a job without its aq
// deciding to: a kill -9 (its jobs), a lost host (its jobs), a preemption
// (one job).
type interruption struct {
	kind, factory, job string
	at                 time.Time
}

func interruptions(in *Input) []interruption {
	var out []interruption
	for _, f := range in.Faults {
		fid := fmt.Sprintf("f%d", f.Target+1)
		switch f.Kind {
		case KindKill9, KindKill9Sandboxed, KindHostLost:
			for _, r := range in.Runs {
				if r.Factory == fid {
					out = append(out, interruption{kind: f.Kind, factory: fid, job: r.Job, at: f.Start})
				}
			}
		case KindPreempt:
			if f.Job != "" {
				out = append(out, interruption{kind: f.Kind, factory: fid, job: f.Job, at: f.Start})
			}
		}
	}
	return dedupe(out)
}

func dedupe(its []interruption) []interruption {
	seen := map[interruption]bool{}
	var out []interruption
	for _, it := range its {
		if !seen[it] {
			seen[it] = true
			out = append(out, it)
		}
	}
	return out
}

// countFaults counts the faults of the given kinds.
func countFaults(in *Input, kinds ...string) int {
	n := 0
	for _, f := range in.Faults {
		for _, k := range kinds {
			if f.Kind == k {
				n++
			}
		}
	}
	return n
}
