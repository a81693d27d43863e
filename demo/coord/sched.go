package coord

import (
	"slices"
	"sort"
	"time"

	"github.com/aqfleet/aq/agent/caps"
	"github.com/aqfleet/aq/engines"
	"github.com/aqfleet/aq/job"
)

// Offer is what a factory offers when it claims: its capability tokens and
// the repos it has locally.
type Offer struct {
	Capabilities []string
	Repos        []string
}

// Requirements are what job j needs of a factory: its capabilities, the
// engine it names (a job for codex waits for a factory with codex), and its
// repo (unless it names a URL a factory can clone).
func Requirements(j *Job) []string {
	reqs := slices.Clone(j.Capabilities)
	if slices.Contains(engines.Default().All(), j.Engine) { // not "any": a factory picks one
		reqs = append(reqs, "engine:"+j.Engine)
	}
	if j.RepoURL == "" && j.Repo != "" {
		reqs = append(reqs, "repo:"+j.Repo)
	}
	return reqs
}

// Eligible reports whether a factory offering o can run j, and if not, why
// (caps.Match's explanation). The scheduler's hard filter.
func Eligible(j *Job, o Offer) (bool, string) {
	tokens := slices.Clone(o.Capabilities)
	for _, r := range o.Repos {
		tokens = append(tokens, "repo:"+r)
	}
	host := caps.FromTokens(tokens)
	missing := caps.Match(Requirements(j), host)
	if j.Engine == "any" || j.Engine == "" {
		coding := false
		for _, e := range host.Engines {
			coding = coding || e.Name != caps.ScriptEngine
		}
		if !coding {
			missing = append(missing, caps.Missing{Token: "engine:any", Reason: "no coding engine (claude, codex, devin) is offered"})
		}
	}
	if len(missing) == 0 {
		return true, ""
	}
	return false, caps.Explain(missing)
}

// Runnable reports whether j may be handed out now: queued, past its retry
// backoff, its lease free (a legacy PATCH to queued leaves the lease held
// until lease/release or the reaper).
func Runnable(j *Job, now time.Time) bool {
	return j.Stage == StageQueued && !now.Before(j.NotBefore) && j.Holder == ""
}

// Pick chooses the job a factory offering o gets: among runnable, eligible
// jobs, the highest priority, then the oldest, then the smallest id. A pure
// function of its inputs.
func Pick(jobs []Job, o Offer, now time.Time) (Job, bool) {
	var cands []Job
	for i := range jobs {
		if Runnable(&jobs[i], now) {
			if ok, _ := Eligible(&jobs[i], o); ok {
				cands = append(cands, jobs[i])
			}
		}
	}
	if len(cands) == 0 {
		return Job{}, false
	}
	sort.Slice(cands, func(a, b int) bool {
		x, y := cands[a], cands[b]
		if x.Priority != y.Priority {
			return x.Priority > y.Priority
		}
		if !x.CreatedAt.Equal(y.CreatedAt) {
			return x.CreatedAt.Before(y.CreatedAt)
		}
		return x.ID < y.ID
	})
	return cands[0], true
}

// depsShipped reports whether j's deps allow it to run (depsMode all: every
// dep shipped; any: one). Unknown deps have not shipped.
func depsShipped(j *Job, stageOf func(id string) (string, bool)) bool {
	if len(j.Deps) == 0 {
		return true
	}
	shipped := 0
	for _, d := range j.Deps {
		if st, ok := stageOf(d); ok && st == StageShipped {
			shipped++
		}
	}
	if j.DepsMode == "any" {
		return shipped > 0
	}
	return shipped == len(j.Deps)
}

// afterPark is where a parked run (rate_limited: the engine's account hit
// a limit) sends a job: queued, not handed out before notBefore (the
// engine's reset; job.ParkUntil's rules when it is missing, past or too
// far), and the run is not an attempt: the claim's count is taken back, so
// parking never spends the job's retries.
func afterPark(j *Job, notBefore, now time.Time) (stage string, nb time.Time) {
	if j.Attempts > 0 {
		j.Attempts--
	}
	nb, _ = job.ParkUntil(now, notBefore)
	return StageQueued, nb
}

// afterFail is where a failed run sends a job: not retryable → failed;
// retries left (job.Retryable, the local queue's rule) → queued after
// job.Backoff (capped by maxBackoff when > 0); else dead_letter.
func afterFail(j *Job, reason job.Reason, retryable bool, now time.Time, maxBackoff time.Duration) (stage string, notBefore time.Time) {
	switch {
	case !retryable || reason.Permanent():
		return StageFailed, time.Time{}
	case job.Retryable(reason, j.Attempts, j.Retry):
		d := job.Backoff(reason, j.Attempts, j.Retry)
		if maxBackoff > 0 && d > maxBackoff {
			d = maxBackoff
		}
		return StageQueued, now.Add(d)
	}
	return StageDeadLetter, time.Time{}
}
