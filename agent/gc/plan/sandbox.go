package plan

import (
	"cmp"
	"slices"
	"strings"
)

// SandboxState is one job's sandbox directory, $AQ_HOME/sandbox/<id>: the
// engine's home (with copies of its login files), its temporary directory
// and the sandbox's own files (docs/sandbox.md). A run removes its own at
// its end; one that is still there without a run was left by a crash (aq
// killed -9, the host lost) and holds a secret on disk.
type SandboxState struct {
	Path string `json:"path"`
	Job  string `json:"job"`
	// Held: a live process holds the job's lock (the job runs, whether or
	// not this host's records know it).
	Held bool `json:"held,omitempty"`
}

// planSandboxes decides on every sandbox directory: kept while its job is
// in flight or recorded running (recovery first), deleted otherwise.
func planSandboxes(st State) []Decision {
	dirs := slices.Clone(st.Sandboxes)
	slices.SortStableFunc(dirs, func(a, b SandboxState) int { return cmp.Compare(a.Path, b.Path) })
	out := make([]Decision, 0, len(dirs))
	for _, s := range dirs {
		d := Decision{Kind: KindSandbox, Where: WhereLocal, Name: s.Path, Job: s.Job}
		j, known := st.Jobs[s.Job]
		switch {
		case !jobIDPattern().MatchString(s.Job) || strings.Contains(s.Job, ".."):
			d = d.keep(RuleNotJobRef, "its name is not a job id: aq did not make it")
		case s.Held || known && j.InFlight:
			d = d.keep(RuleInFlight, "job %s is running", s.Job)
		case known && j.Status == JobBuilding:
			d = d.keep(RuleOrphaned, "job %s is recorded as building but no process holds it: `aq run` or `aq status` recovers it first", s.Job)
		default:
			what := "unknown to this host"
			if known {
				what = stageName(j)
			}
			d = d.del(RuleStale, "job %s is %s and not running: its run did not end cleanly and left it (the engine's home, with copies of its login)", s.Job, what)
		}
		d.Repo = ""
		out = append(out, d)
	}
	return out
}
