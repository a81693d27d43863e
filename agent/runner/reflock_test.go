package runner_test

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/aqfleet/aq/agent/runner"
	"github.com/aqfleet/aq/internal/testenv"
	"github.com/aqfleet/aq/job"
)

// TestADeadGitsRefLockStopsNothing: a git that died while it updated one of
// the job's refs left <ref>.lock (the chaos run, seed 140406565973930: a
// periodic checkpoint's update-ref ended as the engine did, and the final
// checkpoint, then aq gc, failed on the lock). Left before the run (an
// earlier aq's) or during the engine (a periodic checkpoint's), the run
// removes it: the final checkpoint and the result land, and origin has
// both.
func TestADeadGitsRefLockStopsNothing(t *testing.T) {
	testenv.Slow(t, "runs whole jobs with real git, processes and waits")
	for _, tc := range []struct{ name, ref, when string }{
		{"wip-before", "wip", "before"},
		{"job-before", "job", "before"},
		{"wip-during", "wip", "during"},
		{"job-during", "job", "during"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			f := newFixture(t)
			origin := testenv.AddOrigin(t, f.repo)
			id := f.id("reflock-" + tc.name)
			branch := job.WIPBranch(id)
			if tc.ref == "job" {
				branch = job.JobBranch(id)
			}
			lock := filepath.Join(f.repo, ".git", "refs", "heads", filepath.FromSlash(branch)+".lock")
			plant := "mkdir -p '" + filepath.Dir(lock) + "' && : > '" + lock + "'\n"
			script := writeAll
			if tc.when == "before" {
				testenv.WriteFile(t, lock, "")
			} else {
				script += plant
			}
			j := f.job("reflock-"+tc.name, script)
			j.Ship = "branch"
			out := f.run(context.Background(), j, runner.Options{})
			if out.Failed() || out.Stage != job.Shipped {
				t.Fatalf("the job did not ship: %+v", out)
			}
			if _, err := os.Lstat(lock); err == nil {
				t.Error("the dead git's lock is still there")
			}
			if got := f.wip("reflock-" + tc.name); got != out.Checkpoint || out.Checkpoint == "" {
				t.Errorf("aq/wip/%s is %s, want the final checkpoint %s", id, got, out.Checkpoint)
			}
			wantAll(t, "the final checkpoint", testenv.TreeFiles(t, f.repo, out.Checkpoint))
			if wip := testenv.RemoteRefs(t, origin, "refs/heads/aq/wip/"); wip["refs/heads/aq/wip/"+id] != out.Checkpoint {
				t.Errorf("origin's WIP refs %v, want aq/wip/%s at %s", wip, id, out.Checkpoint)
			}
			if refs := testenv.RemoteRefs(t, origin, "refs/heads/aq/job/"); refs["refs/heads/aq/job/"+id] != out.Commit {
				t.Errorf("origin's job refs %v, want aq/job/%s at %s", refs, id, out.Commit)
			}
		})
	}
}
