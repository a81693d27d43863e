package gc

import (
	"cmp"
	"fmt"

	"github.com/aqfleet/aq/agent/gc/plan"
	"github.com/aqfleet/aq/agent/jobstate"
	"github.com/aqfleet/aq/internal/process"
	"github.com/aqfleet/aq/job"
	"github.com/aqfleet/aq/worktree"
)

// gatherJobs reads what aq knows of every job: local jobs from the queue's
// sidecars, fleet jobs from the factory's records. A job in both gets the
// more cautious of the two statuses (the one that keeps more).
func (g *GC) gatherJobs() (map[string]plan.JobState, error) {
	jobs := map[string]plan.JobState{}
	if g.Queue != nil {
		entries, err := g.Queue.List()
		if err != nil {
			return nil, fmt.Errorf("read the local queue: %w", err)
		}
		for _, e := range entries {
			s := e.State
			js := plan.JobState{
				Status:  status(s.Stage),
				Stage:   string(s.Stage),
				EndedAt: s.EndedAt,
				Repo:    s.Repo,
				Source:  "queue",
			}
			if js.EndedAt.IsZero() && js.Status != plan.JobBuilding && len(s.History) > 0 {
				js.EndedAt = s.History[len(s.History)-1].At // moved by hand: the last change
			}
			if g.Base != nil && e.ManifestPath != "" {
				if b, err := g.Base(e.ManifestPath); err == nil {
					js.Base = b
				}
			}
			if js.InFlight, err = g.jobLocked(s.ID); err != nil {
				return nil, err
			}
			jobs[s.ID] = merge(jobs[s.ID], js)
		}
	}
	if g.Records != nil {
		recs, errs := g.Records.List()
		for _, err := range errs {
			g.log().Warn("gc: skipping an unreadable job record: its job counts as unknown (nothing of it is deleted unless merged)", "err", err)
		}
		for _, r := range recs {
			js := recordState(r)
			locked, err := g.jobLocked(r.ID)
			if err != nil {
				return nil, err
			}
			js.InFlight = locked || (r.Running() && r.PID > 0 && g.alive(r.PID))
			jobs[r.ID] = merge(jobs[r.ID], js)
		}
	}
	return jobs, nil
}

func recordState(r jobstate.Record) plan.JobState {
	js := plan.JobState{
		Status:  status(r.Stage),
		Stage:   string(r.Stage),
		EndedAt: r.EndedAt,
		Repo:    r.Repo,
		Base:    r.Base,
		Source:  "fleet",
	}
	if r.Running() {
		js.Status, js.Stage = plan.JobBuilding, string(job.Building)
	}
	return js
}

// jobLocked reports whether a live process holds the job's lock. When the
// probe itself fails, the job counts as in flight: never touch a live job.
func (g *GC) jobLocked(id string) (bool, error) {
	held, err := worktree.Held(g.Cfg.LocksDir, worktree.JobLockName(id))
	if err != nil {
		g.log().Warn("gc: cannot probe a job lock; the job counts as running", "job", id, "err", err)
		return true, nil
	}
	return held, nil
}

func (g *GC) alive(pid int) bool {
	if g.Alive != nil {
		return g.Alive(pid)
	}
	return process.Alive(pid)
}

// status maps a stage (local or fleet name) to what gc needs to know.
// Unknown stages count as queued: kept.
func status(s job.Stage) plan.JobStatus {
	switch job.StageFromFleet(string(s)) {
	case job.Building:
		return plan.JobBuilding
	case job.Review, job.Testing:
		return plan.JobAwaiting
	case job.Shipped:
		return plan.JobShipped
	case job.Failed, job.DeadLetter:
		return plan.JobFailed
	}
	return plan.JobQueued
}

// caution orders statuses from the one that lets gc delete most to the one
// that keeps most.
var caution = map[plan.JobStatus]int{
	plan.JobShipped:  1,
	plan.JobFailed:   2,
	plan.JobAwaiting: 3,
	plan.JobQueued:   4,
	plan.JobBuilding: 5,
}

// merge combines two records of one job (zero a: none yet).
func merge(a, b plan.JobState) plan.JobState {
	if a.Status == "" {
		return b
	}
	out := a
	if caution[b.Status] > caution[a.Status] {
		out = b
	}
	out.InFlight = a.InFlight || b.InFlight
	out.Base = cmp.Or(out.Base, a.Base, b.Base)
	out.Repo = cmp.Or(out.Repo, a.Repo, b.Repo)
	out.EndedAt = a.EndedAt // the later end keeps a failed job's WIP longer
	if b.EndedAt.After(a.EndedAt) {
		out.EndedAt = b.EndedAt
	}
	return out
}
