package runner_test

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/aqfleet/aq/agent/runner"
	"github.com/aqfleet/aq/internal/testenv"
	"github.com/aqfleet/aq/job"
)

// logGit makes the runner's git a logging one: each call's arguments, one
// line, in the returned file; then the real git.
func logGit(t *testing.T, f *fixture) (log string) {
	t.Helper()
	real, err := exec.LookPath("git")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	log = filepath.Join(dir, "git.log")
	bin := filepath.Join(dir, "git")
	testenv.WriteFile(t, bin, "#!/bin/sh\nline=$(printf '%s ' \"$@\" | tr '\\n' '|')\nprintf '%s\\n' \"$line\" >> "+strconv.Quote(log)+"\nexec "+strconv.Quote(real)+" \"$@\"\n")
	if err := os.Chmod(bin, 0o755); err != nil {
		t.Fatal(err)
	}
	f.r.Git.Bin = bin
	return log
}

// pushes are the git pushes in a logGit log.
func pushes(t *testing.T, log string) []string {
	t.Helper()
	b, _ := os.ReadFile(log)
	var out []string
	for _, l := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(l, "push ") {
			out = append(out, l)
		}
	}
	return out
}

// TestResultAndCheckpointGoInOneAtomicPush: a job without a verify
// command pushes its checkpoint after the engine and its result in one
// `git push --atomic` (#35), each ref a compare-and-swap. When origin moved
// meanwhile the atomic push is refused as a whole, and each ref is pushed
// alone, as before the two went together: another delivery of the job
// branch is a ship_failed saying so (the checkpoint still reaches origin);
// another factory's WIP checkpoint is kept (the result still ships). A job
// with a verify command pushes its checkpoint alone before verify runs.
func TestResultAndCheckpointGoInOneAtomicPush(t *testing.T) {
	testenv.Slow(t, "runs whole jobs with real git, processes and waits")
	for _, tc := range []struct {
		name    string
		verify  string
		moved   string // the ref of origin's another factory moves while the engine runs
		pushes  int
		stage   job.Stage
		reason  job.Reason
		detail  string
		wipMine bool // origin's aq/wip is this run's checkpoint
	}{
		{name: "together", pushes: 1, stage: job.Shipped, wipMine: true},
		{name: "verify", verify: "test -f mine.txt", pushes: 2, stage: job.Shipped, wipMine: true},
		{name: "job-moved", moved: "job", pushes: 3, stage: job.Failed, reason: job.ReasonShipFailed,
			detail: "another run delivered it", wipMine: true},
		{name: "wip-moved", moved: "wip", pushes: 3, stage: job.Shipped, wipMine: false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			f := newFixture(t)
			origin := testenv.AddOrigin(t, f.repo)
			log := logGit(t, f)
			j := f.job("atomic-"+tc.name, `echo mine > mine.txt; touch "$MARK/started"; while [ ! -f "$MARK/go" ]; do sleep 0.01; done`)
			j.Ship, j.Verify = "branch", tc.verify
			done := make(chan runner.Outcome, 1)
			go func() { done <- f.run(context.Background(), j, runner.Options{}) }()
			f.waitMarker("started")
			var other string
			if tc.moved != "" {
				other = testenv.Git(t, origin, "commit-tree", "-m", "another factory's commit\n\naq-job: other", testenv.Git(t, origin, "rev-parse", "main^{tree}"))
				testenv.Git(t, origin, "update-ref", "refs/heads/aq/"+tc.moved+"/"+j.ID, other)
			}
			testenv.WriteFile(t, f.marker("go"), "go")
			out := <-done
			p := pushes(t, log)
			if len(p) != tc.pushes {
				t.Errorf("%d pushes, want %d:\n%s", len(p), tc.pushes, strings.Join(p, "\n"))
			}
			if len(p) > 0 && strings.Contains(p[0], "--atomic") != (tc.verify == "") {
				t.Errorf("first push %q: atomic %v, want %v", p[0], !(tc.verify == ""), tc.verify == "")
			}
			if out.Stage != tc.stage || out.Reason != tc.reason || !strings.Contains(out.Detail, tc.detail) {
				t.Fatalf("stage %s reason %q detail %q; want %s %q containing %q", out.Stage, out.Reason, out.Detail, tc.stage, tc.reason, tc.detail)
			}
			// The change's size, whichever git counted it: the atomic push's
			// change check (no rev-list: the two commits sit on base; no git
			// diff), else git diff; and the result commit reads what the checkpoint
			// read (no rev-parse HEAD ...).
			if in := out.Insights; in.FilesChanged != 1 || in.LinesAdded != 1 || in.LinesDeleted != 0 {
				t.Errorf("change insights: files %d +%d -%d, want 1 +1 -0", in.FilesChanged, in.LinesAdded, in.LinesDeleted)
			}
			if tc.name == "together" {
				b, _ := os.ReadFile(log)
				for _, l := range strings.Split(string(b), "\n") {
					if strings.HasPrefix(l, "rev-list ") || strings.HasPrefix(l, "diff ") || strings.HasPrefix(l, "rev-parse HEAD ") {
						t.Errorf("a git the lean path has no need of (#35): %s", l)
					}
				}
			}
			refs := testenv.RemoteRefs(t, origin, "refs/heads/aq/")
			wip, jb := refs["refs/heads/aq/wip/"+j.ID], refs["refs/heads/aq/job/"+j.ID]
			if out.Checkpoint == "" || (wip == out.Checkpoint) != tc.wipMine || out.WIPPushed != tc.wipMine {
				t.Errorf("origin's aq/wip %s, this run's checkpoint %s (WIPPushed %v); want it there: %v", wip, out.Checkpoint, out.WIPPushed, tc.wipMine)
			}
			if !tc.wipMine && wip != other {
				t.Errorf("origin's aq/wip %s, want the other factory's %s kept", wip, other)
			}
			switch {
			case tc.moved == "job" && (jb != other || out.Pushed):
				t.Errorf("origin's job branch %s (pushed %v), want the other delivery %s kept", jb, out.Pushed, other)
			case tc.moved != "job" && (jb != out.Commit || !out.Pushed):
				t.Errorf("origin's job branch %s (pushed %v), want the result %s", jb, out.Pushed, out.Commit)
			}
		})
	}
}
