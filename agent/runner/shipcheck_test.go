package runner_test

import (
	"context"
	"encoding/json"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/aqfleet/aq/agent/runner"
	"github.com/aqfleet/aq/internal/testenv"
	"github.com/aqfleet/aq/job"
)

// heldKey is a made-up secret this factory holds (an engine's API key).
const heldKey = "sk-ant-api03-runnerShipcheckKEY0123456789abcdef"

// TestSecretInChangeIsNeverPushed: the engine writes a secret the factory
// holds into its change (plain, or base64). No push of the run reaches
// origin — the periodic checkpoints while it runs, the checkpoint after
// it, the job branch — and the run fails secret_in_change naming the file
// and line, never the secret; the checkpoint and the worktree stay on
// this host. Without the check, the periodic and the final checkpoint
// and the job branch carried the key to origin.
func TestSecretInChangeIsNeverPushed(t *testing.T) {
	testenv.Slow(t, "runs whole jobs with real git, processes and waits")
	for _, tc := range []struct{ name, script, where string }{
		{"plain", "printf 'key: %s\\n' " + heldKey + " > config.txt\n", "config.txt:1"},
		{"base64", "printf 'a\\n' > b64.txt; printf 'x-%s-y' " + heldKey + " | base64 -w0 >> b64.txt\n", "b64.txt:2"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			f := newFixture(t)
			f.r.Redactor.Add(heldKey)
			f.r.Cfg.CheckpointInterval = 100 * time.Millisecond
			origin := testenv.AddOrigin(t, f.repo)
			j := f.job("secret-"+tc.name, tc.script+"echo done > \"$MARK/wrote-"+tc.name+"\"\nsleep 1\n")
			j.Ship = "branch"
			var pushes []string
			out := f.run(context.Background(), j, runner.Options{OnEvent: func(e runner.Event) {
				if p, ok := e.(runner.CheckpointPushed); ok {
					pushes = append(pushes, p.Checkpoint)
				}
			}})
			if out.Stage != job.Failed || out.Reason != job.ReasonSecretInChange {
				t.Fatalf("stage %s reason %q (%s); want failed secret_in_change", out.Stage, out.Reason, out.Detail)
			}
			if !strings.Contains(out.Detail, tc.where) || !strings.Contains(out.Detail, "aq job requeue") {
				t.Errorf("the detail does not name %s and the way on: %s", tc.where, out.Detail)
			}
			b, _ := json.Marshal(out)
			if strings.Contains(string(b), heldKey) || strings.Contains(string(b), heldKey[10:34]) {
				t.Errorf("the outcome holds the secret: %s", b)
			}
			if refs := testenv.RemoteRefs(t, origin, "refs/heads/aq/"); len(refs) != 0 || len(pushes) != 0 || out.WIPPushed || out.Pushed {
				t.Errorf("origin has %v (pushed while running: %v, WIP %v, branch %v); want nothing of the job", refs, pushes, out.WIPPushed, out.Pushed)
			}
			if f.wip(j.ID) == "" || out.Checkpoint != f.wip(j.ID) {
				t.Errorf("the checkpoint %q is not kept on this host (aq/wip: %q)", out.Checkpoint, f.wip(j.ID))
			}
			if out.Pooled || !testenv.Exists(f.wt(j.ID)) {
				t.Errorf("the worktree was not kept for an operator (pooled %v)", out.Pooled)
			}
		})
	}
}

// TestProtectedChange: a change to a protected path is pushed nowhere
// without may_change naming it (protected_change); with it, ship: merge
// opens the PR without auto-merge and says why, ship: branch says so in
// the job's record. AQ_PROTECTED_PATHS replaces the default list.
func TestProtectedChange(t *testing.T) {
	testenv.Slow(t, "runs whole jobs with real git, processes and waits")
	const wf = ".github/workflows/ci.yml"
	script := "mkdir -p .github/workflows && echo 'on: push' > " + wf + "\necho x > x.txt\n"
	for _, tc := range []struct {
		name      string
		ship      string
		may       []string
		protected []string
		reason    job.Reason
		stage     job.Stage
	}{
		{"refused", "merge", nil, nil, job.ReasonProtectedChange, job.Failed},
		{"refused-branch", "branch", []string{"docs/**"}, nil, job.ReasonProtectedChange, job.Failed},
		{"allowed-merge", "merge", []string{".github/workflows/*.yml"}, nil, "", job.Review},
		{"allowed-branch", "branch", []string{wf}, nil, "", job.Shipped},
		{"not-protected-here", "merge", nil, []string{"Makefile"}, "", job.Review},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			f := newFixture(t)
			f.r.Cfg.ProtectedPaths = tc.protected
			sh := &recShipper{}
			f.r.Shipper = sh
			origin := testenv.AddOrigin(t, f.repo)
			j := f.job("protected-"+tc.name, script)
			j.Ship, j.MayChange = tc.ship, tc.may
			out := f.run(context.Background(), j, runner.Options{})
			if out.Stage != tc.stage || out.Reason != tc.reason {
				t.Fatalf("stage %s reason %q (%s); want %s %q", out.Stage, out.Reason, out.Detail, tc.stage, tc.reason)
			}
			refs := testenv.RemoteRefs(t, origin, "refs/heads/aq/")
			switch {
			case tc.reason != "":
				for _, want := range []string{wf, "may_change: [" + wf + "]", "nothing of it was pushed"} {
					if !strings.Contains(out.Detail, want) {
						t.Errorf("the detail lacks %q: %s", want, out.Detail)
					}
				}
				if len(refs) != 0 || len(sh.reqs) != 0 {
					t.Errorf("origin has %v and %d PRs; want nothing of the job", refs, len(sh.reqs))
				}
				if !testenv.Exists(f.wt(j.ID)) {
					t.Error("the worktree was not kept")
				}
				// A retry resumes from the same checkpoint: refused again.
				again := f.run(context.Background(), j, runner.Options{Attempt: 2})
				if again.Reason != job.ReasonProtectedChange || len(testenv.RemoteRefs(t, origin, "refs/heads/aq/")) != 0 {
					t.Errorf("the retry: reason %q, origin %v", again.Reason, testenv.RemoteRefs(t, origin, "refs/heads/aq/"))
				}
			case tc.protected != nil:
				if len(sh.reqs) != 1 || !sh.reqs[0].Merge || out.Insights.ProtectedChanged != nil {
					t.Errorf("with %v protected, the merge is not a plain one: %+v, %v", tc.protected, sh.reqs, out.Insights.ProtectedChanged)
				}
			default:
				if !slices.Equal(out.Insights.ProtectedChanged, []string{wf}) || !strings.Contains(out.Detail, "may_change allows: "+wf) {
					t.Errorf("the record does not say so: insights %v, detail %q", out.Insights.ProtectedChanged, out.Detail)
				}
				if refs["refs/heads/"+job.JobBranch(j.ID)] == "" {
					t.Errorf("the job branch is not on origin: %v", refs)
				}
				if tc.ship == "merge" {
					if len(sh.reqs) != 1 || sh.reqs[0].Merge || !strings.Contains(sh.reqs[0].Body, "did not enable auto-merge") {
						t.Errorf("ship: merge enabled auto-merge or did not say why: %+v", sh.reqs)
					}
				}
			}
		})
	}
}
