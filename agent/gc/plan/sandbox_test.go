package plan

import (
	"strings"
	"testing"
	"time"
)

// TestPlanSandboxes: a job's sandbox directory is kept while a live process
// holds the job (known to this host or not) and while the job waits for
// its recovery, and deleted otherwise; one not named after a job is aq's
// neither and kept. The decisions are no repository's.
func TestPlanSandboxes(t *testing.T) {
	now := time.Date(2026, 11, 27, 12, 0, 0, 0, time.UTC)
	jobs := map[string]JobState{
		"running":  {Status: JobBuilding, InFlight: true},
		"orphaned": {Status: JobBuilding},
		"queued":   {Status: JobQueued, Stage: "inbox"},
		"failed":   {Status: JobFailed, Stage: "failed", EndedAt: now.Add(-time.Hour)},
		"shipped":  {Status: JobShipped, Stage: "shipped"},
	}
	for _, c := range []struct {
		job  string
		held bool
		want Action
		rule Rule
		says string
	}{
		{"running", false, Keep, RuleInFlight, "job running is running"},
		{"unknown-held", true, Keep, RuleInFlight, "is running"},
		{"queued", true, Keep, RuleInFlight, "is running"},
		{"orphaned", false, Keep, RuleOrphaned, "recovers it first"},
		{"queued", false, Delete, RuleStale, "job queued is queued and not running"},
		{"failed", false, Delete, RuleStale, "job failed is failed and not running"},
		{"shipped", false, Delete, RuleStale, "copies of its login"},
		{"unknown", false, Delete, RuleStale, "job unknown is unknown to this host"},
		{"..", false, Keep, RuleNotJobRef, "not a job id"},
		{".hidden", false, Keep, RuleNotJobRef, "not a job id"},
	} {
		t.Run(c.job, func(t *testing.T) {
			st := State{Jobs: jobs, Sandboxes: []SandboxState{{Path: "/h/sandbox/" + c.job, Job: c.job, Held: c.held}}}
			d := Plan(now, st, Policy{})
			if len(d.Items) != 1 {
				t.Fatalf("%d decisions: %+v", len(d.Items), d.Items)
			}
			x := d.Items[0]
			if x.Action != c.want || x.Rule != c.rule || !strings.Contains(x.Reason, c.says) || x.Kind != KindSandbox || x.Repo != "" {
				t.Fatalf("%s %s %q (kind %s, repo %q); want %s %s naming %q", x.Action, x.Rule, x.Reason, x.Kind, x.Repo, c.want, c.rule, c.says)
			}
			if got := x.Subject(); got != "sandbox directory /h/sandbox/"+c.job {
				t.Errorf("subject %q", got)
			}
		})
	}
}

// TestPlanSandboxesSorted: the plan is the same whatever order the
// directories were listed in, after every repository's decisions.
func TestPlanSandboxesSorted(t *testing.T) {
	st := State{
		Repos:     []RepoState{{Name: "app", Refs: []RefState{{Name: "refs/heads/aq/job/a", SHA: "1", Merged: true}}}},
		Sandboxes: []SandboxState{{Path: "/s/b", Job: "b"}, {Path: "/s/a", Job: "a"}},
	}
	d := Plan(time.Now(), st, Policy{})
	var names []string
	for _, x := range d.Items {
		names = append(names, x.Name)
	}
	if got := strings.Join(names, " "); got != "refs/heads/aq/job/a /s/a /s/b" {
		t.Fatalf("order: %s", got)
	}
}
