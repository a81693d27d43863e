package runner_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/aqfleet/aq/agent/runner"
	"github.com/aqfleet/aq/engines"
	"github.com/aqfleet/aq/internal/process"
	"github.com/aqfleet/aq/internal/testenv"
	"github.com/aqfleet/aq/job"
)

// TestSuccessCommitsResultAndCheckpoint: a successful run leaves one commit
// on aq/job/<id> (on main, without .aq_pr.md, whose text is kept as
// logs/<id>/pr.md) and every file the engine wrote in aq/wip/<id>.
func TestSuccessCommitsResultAndCheckpoint(t *testing.T) {
	testenv.Slow(t, "runs whole jobs with real git, processes and waits")
	f := newFixture(t)
	f.r.Cfg.PoolSize = 0 // the worktree stays, to be looked at
	j := f.job("ok", writeAll+"printf 'Fixes the thing\\n' > .aq_pr.md\n::aq-usage tokens_in=10 tokens_out=5 cost_usd=0.01 turns=2\n")
	// A directive is stdout text: make the script print it.
	j.Script = strings.Replace(j.Script, "::aq-usage", "echo ::aq-usage", 1)
	out := f.run(context.Background(), j, runner.Options{})

	if out.Failed() || out.Stage != job.Testing {
		t.Fatalf("want success in testing (ship: none), got %+v", out)
	}
	if out.Branch != "aq/job/"+j.ID || out.Commit == "" || out.Checkpoint == "" {
		t.Fatalf("branch %q commit %q checkpoint %q", out.Branch, out.Commit, out.Checkpoint)
	}
	if got := testenv.Git(t, f.repo, "rev-parse", "refs/heads/aq/job/"+j.ID); got != out.Commit {
		t.Errorf("aq/job/%s = %s, outcome says %s", j.ID, got, out.Commit)
	}
	main := testenv.Git(t, f.repo, "rev-parse", "main")
	if parent := testenv.Git(t, f.repo, "rev-parse", out.Commit+"^"); parent != main {
		t.Errorf("the result commit's parent is %s, want main %s (one commit on base)", parent, main)
	}
	result := testenv.TreeFiles(t, f.repo, out.Commit)
	wantAll(t, "job branch", result)
	if _, ok := result[".aq_pr.md"]; ok {
		t.Error(".aq_pr.md was committed to the job branch")
	}
	if got := testenv.ReadFile(t, filepath.Join(f.home.Dir, "logs", j.ID, "pr.md")); got != "Fixes the thing\n" {
		t.Errorf("logs/ok/pr.md = %q", got)
	}
	if f.wip("ok") != out.Checkpoint {
		t.Errorf("aq/wip/ok = %s, outcome checkpoint %s", f.wip("ok"), out.Checkpoint)
	}
	wantAll(t, "checkpoint", testenv.TreeFiles(t, f.repo, out.Checkpoint))

	in := out.Insights
	if in.Engine != "script" || in.TokensIn != 10 || in.TokensOut != 5 || in.CostUSD != 0.01 || in.Turns != 2 {
		t.Errorf("usage insights: %+v", in)
	}
	// keep.txt +1, doomed.txt -1, new.txt +1, deep/er/file.txt +1.
	if in.FilesChanged != 4 || in.LinesAdded != 3 || in.LinesDeleted != 1 {
		t.Errorf("change insights: files %d +%d -%d, want 4 +3 -1", in.FilesChanged, in.LinesAdded, in.LinesDeleted)
	}
	if in.WallMS <= 0 {
		t.Errorf("wall time not recorded: %d", in.WallMS)
	}
	// The worktree is left consistent: nothing staged or unstaged against
	// the job branch but the ignored files.
	if st := testenv.Git(t, f.wt("ok"), "status", "--porcelain"); st != "" {
		t.Errorf("worktree status after success:\n%s", st)
	}
}

// TestCheckpointOnEveryExitPath: whatever ends the run, aq/wip/<id> holds
// every file the engine wrote (tracked changes, deletions, untracked files;
// not ignored ones), and no process of the job survives it.
func TestCheckpointOnEveryExitPath(t *testing.T) {
	testenv.Slow(t, "runs whole jobs with real git, processes and waits")
	waitForever := "touch \"$MARK/wrote\"\nsleep 300\n"
	cases := []struct {
		name   string
		script string
		setup  func(j *job.Job)
		stop   func(f *fixture, cancel context.CancelCauseFunc) // after $MARK/wrote appears
		want   job.Reason
	}{
		{name: "success", script: writeAll},
		{name: "engine_failed", script: writeAll + "exit 3\n", want: job.ReasonEngineFailed},
		{name: "timeout", script: writeAll + waitForever, want: job.ReasonTimeout,
			setup: func(j *job.Job) { j.Budget.Wall = job.Duration(2 * time.Second) }},
		{name: "budget_tokens", script: writeAll + "echo ::aq-usage tokens_in=900 tokens_out=200\n" + waitForever, want: job.ReasonBudgetExceeded,
			setup: func(j *job.Job) { j.Budget.Tokens = 1000 }},
		{name: "budget_usd", script: writeAll + "echo ::aq-usage cost_usd=2.5\n" + waitForever, want: job.ReasonBudgetExceeded,
			setup: func(j *job.Job) { j.Budget.USD = 2 }},
		{name: "interrupted", script: writeAll + waitForever, want: job.ReasonInterrupted,
			stop: func(f *fixture, cancel context.CancelCauseFunc) {
				f.waitMarker("wrote")
				cancel(nil) // what SIGINT/SIGTERM to aq does: the root context ends
			}},
		{name: "lease_lost", script: writeAll + waitForever, want: job.ReasonLeaseLost,
			stop: func(f *fixture, cancel context.CancelCauseFunc) {
				f.waitMarker("wrote")
				cancel(job.Stop(job.ReasonLeaseLost, "renewal failed"))
			}},
		{name: "verify_failed", script: writeAll, want: job.ReasonVerifyFailed,
			setup: func(j *job.Job) { j.Verify = "echo verify-output > verify.out; exit 4" }},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			f := newFixture(t)
			j := f.job("cp-"+strings.ReplaceAll(c.name, "_", "-"), c.script)
			if c.setup != nil {
				c.setup(j)
			}
			ctx, cancel := context.WithCancelCause(context.Background())
			defer cancel(nil)
			if c.stop != nil {
				go c.stop(f, cancel)
			}
			out := f.run(ctx, j, runner.Options{})
			if out.Reason != c.want {
				t.Fatalf("reason %q (%s), want %q", out.Reason, out.Detail, c.want)
			}
			if c.want != "" && out.Stage != job.Failed {
				t.Errorf("stage %s, want failed", out.Stage)
			}
			if out.Checkpoint == "" || f.wip(j.ID) != out.Checkpoint {
				t.Fatalf("checkpoint %q, aq/wip/%s = %q", out.Checkpoint, j.ID, f.wip(j.ID))
			}
			wantAll(t, "aq/wip/"+j.ID, testenv.TreeFiles(t, f.repo, out.Checkpoint))
			if c.want == job.ReasonVerifyFailed {
				// The checkpoint is taken before verify runs: verify's own
				// output is not the engine's work.
				if _, ok := testenv.TreeFiles(t, f.repo, out.Checkpoint)["verify.out"]; ok {
					t.Error("verify's output was checkpointed as engine work")
				}
			}
		})
	}
}

// TestPanicCheckpoints: a panic inside aq while a job runs is recovered: the
// worktree is checkpointed, the run fails with crash.
func TestPanicCheckpoints(t *testing.T) {
	testenv.Slow(t, "runs whole jobs with real git, processes and waits")
	panicky := &funcEngine{name: "panicky", run: func(ctx context.Context, spec engines.Spec) (engines.Result, error) {
		write := func(p, c string) {
			if err := os.MkdirAll(filepath.Dir(filepath.Join(spec.Dir, p)), 0o755); err != nil {
				panic(err)
			}
			if err := os.WriteFile(filepath.Join(spec.Dir, p), []byte(c), 0o644); err != nil {
				panic(err)
			}
		}
		write("keep.txt", "one\ntwo\nthree\nchanged\n")
		if err := os.Remove(filepath.Join(spec.Dir, "doomed.txt")); err != nil {
			panic(err)
		}
		write("new.txt", "new\n")
		write("deep/er/file.txt", "nested\n")
		write("debug.log", "noise\n")
		write("build/out.o", "obj\n")
		panic("engine adapter bug")
	}}
	f := newFixture(t, panicky)
	j := f.job("boom", "")
	j.Engine, j.Script = "panicky", ""
	out := f.run(context.Background(), j, runner.Options{})
	if out.Reason != job.ReasonCrash || !strings.Contains(out.Detail, "engine adapter bug") {
		t.Fatalf("reason %q detail %q, want crash naming the panic", out.Reason, out.Detail)
	}
	if out.Checkpoint == "" || f.wip(j.ID) != out.Checkpoint {
		t.Fatalf("no checkpoint after the panic: %q / %q", out.Checkpoint, f.wip("boom"))
	}
	wantAll(t, "aq/wip/boom", testenv.TreeFiles(t, f.repo, out.Checkpoint))
	// The repo lock was released on the way out: the next job on app runs.
	if out := f.run(context.Background(), f.job("after-boom", "echo x > x.txt"), runner.Options{}); out.Failed() {
		t.Fatalf("the next job failed after a panic: %+v", out)
	}
}

// TestTimeoutKillsTheWholeGroup: on timeout the ladder reaches a grandchild
// that ignores SIGINT; nothing of the job survives the run.
func TestTimeoutKillsTheWholeGroup(t *testing.T) {
	testenv.Slow(t, "runs whole jobs with real git, processes and waits")
	f := newFixture(t)
	// The grandchild ignores SIGINT (kept across exec) and writes its pid;
	// the engine waits for it. A background loop keeps writing a file.
	script := `sh -c 'trap "" INT; echo $$ > "$MARK/grandchild.pid"; exec sleep 300' &
( trap "" INT; while :; do date +%s%N >> ticks.txt; sleep 0.01; done ) &
echo $! > "$MARK/writer.pid"
touch "$MARK/wrote"
wait
`
	j := f.job("slow", script)
	j.Budget.Wall = job.Duration(2 * time.Second)
	f.r.Cfg.PoolSize = 0 // the worktree stays, to be looked at
	start := time.Now()
	out := f.run(context.Background(), j, runner.Options{})
	if out.Reason != job.ReasonTimeout {
		t.Fatalf("reason %q (%s), want timeout", out.Reason, out.Detail)
	}
	t.Logf("timed out and reaped in %v", time.Since(start))
	for _, name := range []string{"grandchild.pid", "writer.pid"} {
		if pid := readPid(t, f.marker(name)); process.Alive(pid) {
			t.Errorf("%s: pid %d survived the timeout", name, pid)
		}
	}
	// Nothing wrote after the checkpoint: the worktree equals it.
	ticks := testenv.ReadFile(t, filepath.Join(f.wt("slow"), "ticks.txt"))
	if got := testenv.TreeFiles(t, f.repo, out.Checkpoint)["ticks.txt"]; got != strings.TrimRight(ticks, "\n") {
		t.Errorf("ticks.txt changed after the checkpoint (%d bytes checkpointed, %d in the worktree)", len(got), len(ticks))
	}
}

// TestFailureReasons: each way a run can fail is reported with its reason,
// and pre-flight failures happen before any worktree is made.
func TestFailureReasons(t *testing.T) {
	testenv.Slow(t, "runs whole jobs with real git, processes and waits")
	cases := []struct {
		name       string
		script     string
		setup      func(f *fixture, j *job.Job)
		want       job.Reason
		noWorktree bool
		detail     string
	}{
		{name: "no_engine_not_on_path", script: "no-such-engine-xyz --fix", want: job.ReasonNoEngine, noWorktree: true, detail: "no-such-engine-xyz"},
		{name: "no_engine_no_script", script: " ", want: job.ReasonNoEngine, noWorktree: true},
		{name: "no_engine_exit_127", script: "./tools/missing.sh", want: job.ReasonNoEngine},
		{name: "engine_failed", script: "echo trying; exit 3", want: job.ReasonEngineFailed, detail: "exited 3"},
		{name: "engine_unavailable", script: "echo '::aq-unavailable OAuth token expired'; exit 0", want: job.ReasonEngineUnavailable, detail: "OAuth token expired"},
		{name: "verify_failed", script: "echo x > x.txt", want: job.ReasonVerifyFailed,
			setup: func(_ *fixture, j *job.Job) { j.Verify = "test -f y.txt" }},
		{name: "repo_missing", script: "true", want: job.ReasonRepoUnavailable, noWorktree: true, detail: "AQ_REPO_BASE",
			setup: func(_ *fixture, j *job.Job) { j.Repo = "nope" }},
		{name: "repo_not_git", script: "true", want: job.ReasonRepoUnavailable, noWorktree: true,
			setup: func(f *fixture, j *job.Job) {
				testenv.WriteFile(f.t, filepath.Join(f.home.RepoBase, "plain", "file"), "x")
				j.Repo = "plain"
			}},
		{name: "base_missing", script: "true", want: job.ReasonRepoUnavailable, noWorktree: true, detail: "no-such-base",
			setup: func(_ *fixture, j *job.Job) { j.Base = "no-such-base" }},
		{name: "capability_mismatch_pr", script: "true", want: job.ReasonCapabilityMismatch, noWorktree: true, detail: "has:gh",
			setup: func(_ *fixture, j *job.Job) { j.Ship = "pr" }},
		{name: "capability_mismatch_merge", script: "true", want: job.ReasonCapabilityMismatch, noWorktree: true, detail: "has:gh",
			setup: func(_ *fixture, j *job.Job) { j.Ship = "merge" }},
		{name: "unknown_engine", script: "", want: job.ReasonNoEngine, noWorktree: true,
			setup: func(_ *fixture, j *job.Job) { j.Engine = "claude" }},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			f := newFixture(t)
			j := f.job("f-"+strings.ReplaceAll(c.name, "_", "-"), c.script)
			if c.setup != nil {
				c.setup(f, j)
			}
			out := f.run(context.Background(), j, runner.Options{})
			if out.Reason != c.want || out.Stage != job.Failed {
				t.Fatalf("stage %s reason %q (%s), want failed %q", out.Stage, out.Reason, out.Detail, c.want)
			}
			if !strings.Contains(out.Detail, c.detail) {
				t.Errorf("detail %q does not say %q", out.Detail, c.detail)
			}
			wt := f.home.Worktree(j.Repo, j.ID)
			if c.noWorktree {
				if testenv.Exists(wt) {
					t.Errorf("a worktree was made before the pre-flight failed: %s", wt)
				}
				if testenv.Exists(filepath.Join(f.home.Dir, "worktrees", j.Repo)) && j.Repo != "app" {
					t.Errorf("worktrees/%s was created for a repo that is not there", j.Repo)
				}
				if f.wip(j.ID) != "" || branchExists(t, f.repo, "aq/job/"+j.ID) {
					t.Error("branches were made before the pre-flight failed")
				}
			} else if !testenv.Exists(wt) && (!out.Pooled || out.Checkpoint == "") {
				t.Errorf("the worktree %s is gone, not pooled after a checkpoint (it holds the failed job's work)", wt)
			}
		})
	}
}

// TestNoChangeSucceeds: an engine that exits 0 without changing anything
// succeeds with nothing to ship: no result commit, no branch reported, no push.
func TestNoChangeSucceeds(t *testing.T) {
	testenv.Slow(t, "runs whole jobs with real git, processes and waits")
	f := newFixture(t)
	origin := testenv.AddOrigin(t, f.repo)
	j := f.job("noop", "echo looked around; echo junk > skip.log")
	j.Ship = "branch"
	out := f.run(context.Background(), j, runner.Options{})
	if out.Failed() || out.Stage != job.Shipped {
		t.Fatalf("want shipped with nothing to ship, got %+v", out)
	}
	if out.Branch != "" || out.Commit != "" || out.Pushed || !strings.Contains(out.Detail, "nothing to ship") {
		t.Errorf("branch %q commit %q pushed %v detail %q", out.Branch, out.Commit, out.Pushed, out.Detail)
	}
	if refs := testenv.RemoteRefs(t, origin, "refs/heads/aq/job/"); len(refs) != 0 {
		t.Errorf("an empty result was pushed: %v", refs)
	}
	main := testenv.Git(t, f.repo, "rev-parse", "main")
	if got := testenv.Git(t, f.repo, "rev-parse", "aq/job/"+j.ID); got != main {
		t.Errorf("the job branch moved off main (%s) to %s with nothing to commit", main, got)
	}
	if out.Insights.FilesChanged != 0 {
		t.Errorf("files changed %d", out.Insights.FilesChanged)
	}
}

// TestShipBranchPushesToOrigin: ship: branch pushes aq/job/<id> and the WIP
// ref to origin; ship: none keeps the job branch local (the WIP ref still
// goes to origin, so another host could resume).
func TestShipBranchPushesToOrigin(t *testing.T) {
	testenv.Slow(t, "runs whole jobs with real git, processes and waits")
	for _, ship := range []string{"branch", "none"} {
		t.Run(ship, func(t *testing.T) {
			t.Parallel()
			f := newFixture(t)
			origin := testenv.AddOrigin(t, f.repo)
			j := f.job("ship-"+ship, writeAll+"echo 'PR body' > .aq_pr.md\n")
			j.Ship = ship
			out := f.run(context.Background(), j, runner.Options{})
			if out.Failed() {
				t.Fatalf("%+v", out)
			}
			jobRefs := testenv.RemoteRefs(t, origin, "refs/heads/aq/job/")
			wipRefs := testenv.RemoteRefs(t, origin, "refs/heads/aq/wip/")
			if wipRefs["refs/heads/aq/wip/"+j.ID] != out.Checkpoint || !out.WIPPushed {
				t.Errorf("origin's WIP refs %v, want aq/wip/%s at %s", wipRefs, j.ID, out.Checkpoint)
			}
			switch ship {
			case "branch":
				if out.Stage != job.Shipped || !out.Pushed || jobRefs["refs/heads/aq/job/"+j.ID] != out.Commit {
					t.Fatalf("stage %s pushed %v origin job refs %v, want aq/job/%s at %s", out.Stage, out.Pushed, jobRefs, j.ID, out.Commit)
				}
				if _, ok := testenv.TreeFiles(t, origin, out.Commit)[".aq_pr.md"]; ok {
					t.Error(".aq_pr.md reached origin in the job branch")
				}
			case "none":
				if out.Stage != job.Testing || out.Pushed || len(jobRefs) != 0 {
					t.Errorf("ship: none: stage %s pushed %v origin job refs %v", out.Stage, out.Pushed, jobRefs)
				}
				if !branchExists(t, f.repo, "aq/job/"+j.ID) {
					t.Error("the job branch is not kept locally")
				}
			}
		})
	}
}

// TestResumeFromCheckpoint: a second attempt starts from the first one's
// checkpoint, and the result holds both attempts' work as one commit on base.
func TestResumeFromCheckpoint(t *testing.T) {
	testenv.Slow(t, "runs whole jobs with real git, processes and waits")
	f := newFixture(t)
	script := `if [ -f first.txt ]; then echo resumed > "$MARK/resumed"; echo second > second.txt; exit 0; fi
echo first > first.txt
rm doomed.txt
exit 5
`
	j := f.job("again", script)
	first := f.run(context.Background(), j, runner.Options{Attempt: 1})
	if first.Reason != job.ReasonEngineFailed || first.Checkpoint == "" {
		t.Fatalf("first attempt: %+v", first)
	}
	second := f.run(context.Background(), j, runner.Options{Attempt: 2, Checkpoint: first.Checkpoint})
	if second.Failed() {
		t.Fatalf("second attempt: %+v", second)
	}
	if !first.Pooled || !second.WarmStart {
		t.Errorf("the retry should resume in the first attempt's pooled worktree: pooled %v, warm start %v", first.Pooled, second.WarmStart)
	}
	if !testenv.Exists(f.marker("resumed")) {
		t.Fatal("the second attempt did not see the first one's files")
	}
	files := testenv.TreeFiles(t, f.repo, second.Commit)
	if files["first.txt"] != "first" || files["second.txt"] != "second" {
		t.Errorf("result files: %v", sortedKeys(files))
	}
	if _, ok := files["doomed.txt"]; ok {
		t.Error("the first attempt's deletion was lost")
	}
	main := testenv.Git(t, f.repo, "rev-parse", "main")
	if p := testenv.Git(t, f.repo, "rev-parse", second.Commit+"^"); p != main {
		t.Errorf("result parent %s, want main %s", p, main)
	}
	// The first checkpoint stays reachable from the WIP ref.
	if _, err := testenv.GitErr(f.repo, "merge-base", "--is-ancestor", first.Checkpoint, "aq/wip/"+j.ID); err != nil {
		t.Errorf("the first checkpoint is no longer reachable from aq/wip/%s: %v", j.ID, err)
	}
}

// TestDirtyMainCheckoutUntouched: aq works only in its own worktree: the
// repository's own checkout, with uncommitted, staged and untracked changes,
// stays byte for byte as it was, and so do its index and HEAD.
func TestDirtyMainCheckoutUntouched(t *testing.T) {
	testenv.Slow(t, "runs whole jobs with real git, processes and waits")
	f := newFixture(t)
	testenv.WriteFile(t, filepath.Join(f.repo, "keep.txt"), "someone's uncommitted edit\n")
	testenv.WriteFile(t, filepath.Join(f.repo, "scratch.txt"), "untracked\n")
	testenv.WriteFile(t, filepath.Join(f.repo, "docs/guide.txt"), "staged edit\n")
	testenv.Git(t, f.repo, "add", "docs/guide.txt")
	testenv.WriteFile(t, filepath.Join(f.repo, "docs/guide.txt"), "staged edit, then edited again\n")

	before := snapshotDir(t, f.repo)
	statusBefore := testenv.Git(t, f.repo, "status", "--porcelain=v2", "--branch")
	stagedBefore := testenv.Git(t, f.repo, "diff", "--cached")
	indexBefore := testenv.ReadFile(t, filepath.Join(f.repo, ".git", "index"))

	out := f.run(context.Background(), f.job("clean", writeAll), runner.Options{})
	if out.Failed() {
		t.Fatalf("%+v", out)
	}
	after := snapshotDir(t, f.repo)
	for _, p := range sortedKeys(before) {
		if after[p] != before[p] {
			t.Errorf("%s changed in the main checkout", p)
		}
	}
	if len(after) != len(before) {
		t.Errorf("files in the main checkout: %v, was %v", sortedKeys(after), sortedKeys(before))
	}
	if s := testenv.Git(t, f.repo, "status", "--porcelain=v2", "--branch"); s != statusBefore {
		t.Errorf("status changed:\n%s\nwas:\n%s", s, statusBefore)
	}
	if s := testenv.Git(t, f.repo, "diff", "--cached"); s != stagedBefore {
		t.Errorf("staged changes differ")
	}
	if testenv.ReadFile(t, filepath.Join(f.repo, ".git", "index")) != indexBefore {
		t.Error("the main checkout's index file was rewritten")
	}
	// The job's result is built from main's commit, not from the dirty files.
	if got := testenv.TreeFiles(t, f.repo, out.Commit)["docs/guide.txt"]; got != "guide" {
		t.Errorf("the job picked up the checkout's uncommitted edit: %q", got)
	}
}

// TestSecretsStayOutOfLogsAndEngine: the job logs mask secrets the engine
// prints (a credential passed to it on purpose, AQ_ENGINE_ENV), and aq's
// own secrets and the credentials aq ships with (GITHUB_TOKEN) are not in
// the engine's or verify's environment at all (issue #26, finding 4).
func TestSecretsStayOutOfLogsAndEngine(t *testing.T) {
	testenv.Slow(t, "runs whole jobs with real git, processes and waits")
	f := newFixture(t)
	const gh, fleet, svc = "ghp_0123456789abcdefSECRET", "fleet-token-0123456789", "svc-password-0123456789"
	f.r.Env = append(f.r.Env, "GITHUB_TOKEN="+gh, "AQ_FLEET_TOKEN="+fleet, "MY_SERVICE_PASSWORD="+svc)
	f.r.Cfg.EngineEnv = append(f.r.Cfg.EngineEnv, "MY_SERVICE_PASSWORD", "AQ_FLEET_TOKEN")
	f.r.Redactor.Add(fleet) // what the CLI does with the configured token
	f.r.Redactor.Add(gh, svc)
	script := `echo "github=${GITHUB_TOKEN:-unset}"
echo "fleet=${AQ_FLEET_TOKEN:-unset}"
echo "svc=$MY_SERVICE_PASSWORD"
echo "err-svc=$MY_SERVICE_PASSWORD" >&2
env | grep -c AQ_FLEET_TOKEN > "$MARK/fleet-count" || true
env > "$MARK/engine-env"
`
	j := f.job("secrets", script)
	j.Verify = `echo "verify-github=${GITHUB_TOKEN:-unset} verify-svc=$MY_SERVICE_PASSWORD"`
	out := f.run(context.Background(), j, runner.Options{})
	if out.Failed() {
		t.Fatalf("%+v", out)
	}
	logs := ""
	for _, n := range []string{"stdout.log", "stderr.log", "verify.log"} {
		logs += testenv.ReadFile(t, filepath.Join(f.home.Dir, "logs", j.ID, n))
	}
	if strings.Contains(logs, gh) || strings.Contains(logs, fleet) || strings.Contains(logs, svc) {
		t.Fatalf("a secret reached the job logs:\n%s", logs)
	}
	for _, want := range []string{"github=unset", "svc=***", "err-svc=***", "verify-github=unset verify-svc=***", "fleet=unset"} {
		if !strings.Contains(logs, want) {
			t.Errorf("logs lack %q:\n%s", want, logs)
		}
	}
	env := testenv.ReadFile(t, f.marker("engine-env"))
	for _, gone := range []string{"AQ_FLEET_TOKEN", "GITHUB_TOKEN", "AQ_HOME", "AQ_REPO_BASE"} {
		if strings.Contains(env, gone+"=") {
			t.Errorf("%s is in the engine's environment", gone)
		}
	}
	if !strings.Contains(env, "AQ_JOB_ID=secrets") {
		t.Error("the engine's environment lacks the AQ_JOB_ID tag")
	}
}

// TestStaleWorktreeOfADeadRun: a worktree left by a run whose aq died (its
// engine still running, tagged) is handled before the job runs again: the
// leftover processes are killed first, then everything is checkpointed, so
// nothing they wrote is lost and nothing writes into the new worktree.
func TestStaleWorktreeOfADeadRun(t *testing.T) {
	testenv.Slow(t, "runs whole jobs with real git, processes and waits")
	f := newFixture(t)
	j := f.job("stale", `if [ -f progress ]; then cp progress "$MARK/seen"; exit 0; fi; exit 9`)
	// A first attempt makes the worktree (and fails); as aq died, it stays
	// where it ran (no pool).
	f.r.Cfg.PoolSize = 0
	if out := f.run(context.Background(), j, runner.Options{Attempt: 1}); out.Reason != job.ReasonEngineFailed {
		t.Fatalf("first attempt: %+v", out)
	}
	f.r.Cfg.PoolSize = 1
	// A leftover engine of that job, as a kill -9 of aq leaves it: tagged,
	// in the worktree, still writing.
	leftover := startTagged(t, j.ID, f.wt("stale"), `i=0; while :; do i=$((i+1)); echo $i > p.tmp && mv p.tmp progress && echo $i >> "$MARK/written"; sleep 0.005; done`, "MARK="+f.mark, "AQ_SCOPE="+runner.Scope(f.r.Cfg.Home))
	testenv.WaitFor(t, time.Minute, "the leftover to write", func() bool { return testenv.Exists(f.marker("written")) })

	out := f.run(context.Background(), j, runner.Options{Attempt: 2})
	if out.Failed() {
		t.Fatalf("second attempt: %+v", out)
	}
	if process.Alive(leftover) {
		t.Fatalf("the leftover engine (pid %d) is still running", leftover)
	}
	seen, err := strconv.Atoi(strings.TrimSpace(testenv.ReadFile(t, f.marker("seen"))))
	if err != nil {
		t.Fatalf("the second attempt did not start from the leftover's work: %v", err)
	}
	// Every value the leftover wrote is in what the new attempt started
	// from: it was stopped before the checkpoint, not after.
	written := strings.Fields(testenv.ReadFile(t, f.marker("written")))
	last, _ := strconv.Atoi(written[len(written)-1])
	if last > seen {
		t.Errorf("the leftover wrote progress=%d after the checkpoint (which has %d): that write is lost", last, seen)
	}
}

// TestOriginCheckpointFromAnotherHost: a job handed to this host resumes from
// the WIP ref another host pushed to origin.
func TestOriginCheckpointFromAnotherHost(t *testing.T) {
	testenv.Slow(t, "runs whole jobs with real git, processes and waits")
	f := newFixture(t)
	origin := testenv.AddOrigin(t, f.repo)
	// "Another host": a clone that checkpoints work for the job and pushes it.
	other := filepath.Join(t.TempDir(), "other")
	testenv.Git(t, filepath.Dir(other), "clone", "-q", origin, other)
	testenv.WriteFile(t, filepath.Join(other, "elsewhere.txt"), "from the other host\n")
	testenv.Git(t, other, "add", "-A")
	testenv.Git(t, other, "commit", "-q", "-m", "aq checkpoint: moved (after the engine)")
	testenv.Git(t, other, "push", "-q", origin, "HEAD:refs/heads/aq/wip/"+f.id("moved"))

	j := f.job("moved", `test -f elsewhere.txt && echo here > here.txt`)
	out := f.run(context.Background(), j, runner.Options{})
	if out.Failed() {
		t.Fatalf("%+v", out)
	}
	files := testenv.TreeFiles(t, f.repo, out.Commit)
	if files["elsewhere.txt"] != "from the other host" || files["here.txt"] != "here" {
		t.Errorf("result files %v", sortedKeys(files))
	}
}

// TestResultCommit: the result is one commit on base holding everything the
// engine left in the worktree, on the job branch, whatever the engine did
// with git meanwhile; it is made from the checkpoint (the job branch's reflog
// says so) and the worktree's index follows it.
func TestResultCommit(t *testing.T) {
	testenv.Slow(t, "runs whole jobs with real git, processes and waits")
	const commit = "git -c user.name=Engine -c user.email=engine@example.com commit -q"
	cases := []struct {
		name    string
		script  string
		files   map[string]string // in the result, beside baseFiles
		head    string            // the branch HEAD is on afterwards; "" the job branch
		subject string            // a commit of the engine's, kept in the checkpoint
	}{
		{name: "plain", script: "echo a > a.txt", files: map[string]string{"a.txt": "a"}},
		{name: "pr_file", script: "echo a > a.txt; echo body > .aq_pr.md", files: map[string]string{"a.txt": "a"}},
		{name: "engine_commits", script: "echo a > a.txt; git add a.txt; " + commit + " -m one; echo b > b.txt",
			files: map[string]string{"a.txt": "a", "b.txt": "b"}, subject: "one"},
		{name: "engine_staged_then_edited", script: "echo a > a.txt; git add a.txt; echo more >> a.txt",
			files: map[string]string{"a.txt": "a\nmore"}},
		{name: "engine_switches_branch", script: "git checkout -q -b side; echo s > s.txt; git add s.txt; " + commit + " -m side; echo t > t.txt",
			files: map[string]string{"s.txt": "s", "t.txt": "t"}, head: "refs/heads/side", subject: "side"},
		{name: "engine_detaches", script: "git checkout -q --detach; echo d > d.txt; git add d.txt; " + commit + " -m detached",
			files: map[string]string{"d.txt": "d"}, head: "HEAD", subject: "detached"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			f := newFixture(t)
			f.r.Cfg.PoolSize = 0 // the worktree stays, to be looked at
			j := f.job("r-"+strings.ReplaceAll(c.name, "_", "-"), c.script)
			id := j.ID
			out := f.run(context.Background(), j, runner.Options{})
			if out.Failed() || out.Branch != "aq/job/"+id {
				t.Fatalf("%+v", out)
			}
			if got := testenv.Git(t, f.repo, "rev-parse", "aq/job/"+id); got != out.Commit {
				t.Fatalf("aq/job/%s = %s, outcome commit %s", id, got, out.Commit)
			}
			if p := testenv.Git(t, f.repo, "rev-parse", out.Commit+"^@"); p != testenv.Git(t, f.repo, "rev-parse", "main") {
				t.Errorf("parents of the result: %s, want main only", p)
			}
			got := testenv.TreeFiles(t, f.repo, out.Commit)
			for p, want := range c.files {
				if got[p] != want {
					t.Errorf("%s = %q, want %q", p, got[p], want)
				}
			}
			if len(got) != len(baseFiles)+len(c.files) {
				t.Errorf("result files %v", sortedKeys(got))
			}
			if msg := testenv.Git(t, f.repo, "reflog", "-1", "--format=%gs", "aq/job/"+id); msg != "aq: result of job "+id {
				t.Errorf("the result was not made from the checkpoint (reflog: %q)", msg)
			}
			head := testenv.Git(t, f.wt(id), "rev-parse", "--symbolic-full-name", "HEAD")
			wantHead := c.head
			if wantHead == "" {
				wantHead = "refs/heads/aq/job/" + id
				if st := testenv.Git(t, f.wt(id), "status", "--porcelain"); st != "" {
					t.Errorf("the worktree does not read clean on the job branch:\n%s", st)
				}
			}
			if head != wantHead {
				t.Errorf("HEAD is on %s, want %s", head, wantHead)
			}
			// Everything the engine committed is kept in the checkpoint's history.
			if c.subject != "" && !strings.Contains(testenv.Git(t, f.repo, "log", "--format=%s", out.Checkpoint), c.subject) {
				t.Errorf("the engine's commit %q is not in aq/wip/%s", c.subject, id)
			}
		})
	}
}

// TestResultRefusesToRevertBase: an engine that moved HEAD back behind base
// does not get its worktree committed on base (that would revert base's
// newer commits): the run fails and the work stays in the checkpoint.
func TestResultRefusesToRevertBase(t *testing.T) {
	testenv.Slow(t, "runs whole jobs with real git, processes and waits")
	f := newFixture(t)
	testenv.WriteFile(t, filepath.Join(f.repo, "second.txt"), "second\n")
	testenv.Git(t, f.repo, "add", "second.txt")
	testenv.Git(t, f.repo, "commit", "-q", "-m", "second")
	j := f.job("back", "git reset -q --hard HEAD~1; echo x > x.txt")
	out := f.run(context.Background(), j, runner.Options{})
	if out.Reason != job.ReasonCrash || !strings.Contains(out.Detail, "ancestor") {
		t.Fatalf("reason %q detail %q, want a refusal", out.Reason, out.Detail)
	}
	if files := testenv.TreeFiles(t, f.repo, out.Checkpoint); files["x.txt"] != "x" {
		t.Errorf("checkpoint: %v", sortedKeys(files))
	}
	if got := testenv.Git(t, f.repo, "rev-parse", "aq/job/"+j.ID); got == out.Checkpoint {
		t.Error("the job branch was moved")
	}
}

// TestEngineResultFlags: an engine that stopped itself at the budget aq gave
// it fails with budget_exceeded (not crash, which would be retried as an
// infrastructure failure and spend the budget again); an engine with no
// machine-readable outcome that exits 0 having changed nothing fails with
// engine_failed rather than succeeding with nothing to ship.
func TestEngineResultFlags(t *testing.T) {
	testenv.Slow(t, "runs whole jobs with real git, processes and waits")
	cases := []struct {
		name   string
		res    engines.Result
		write  bool
		want   job.Reason
		detail string
	}{
		{name: "budget", res: engines.Result{Outcome: engines.Stopped, BudgetExceeded: true, Detail: "max budget reached"}, want: job.ReasonBudgetExceeded, detail: "max budget"},
		{name: "stopped", res: engines.Result{Outcome: engines.Stopped}, want: job.ReasonCrash},
		{name: "no_outcome_no_change", res: engines.Result{Outcome: engines.Succeeded, NoStructuredOutcome: true}, want: job.ReasonEngineFailed, detail: "changed no file"},
		{name: "no_outcome_changed", res: engines.Result{Outcome: engines.Succeeded, NoStructuredOutcome: true}, write: true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			eng := &funcEngine{name: "fake", run: func(ctx context.Context, spec engines.Spec) (engines.Result, error) {
				if c.write {
					if err := os.WriteFile(filepath.Join(spec.Dir, "work.txt"), []byte("work\n"), 0o644); err != nil {
						return engines.Result{}, err
					}
				}
				return c.res, nil
			}}
			f := newFixture(t, eng)
			j := f.job("flags-"+strings.ReplaceAll(c.name, "_", "-"), "")
			j.Engine = "fake"
			out := f.run(context.Background(), j, runner.Options{})
			if out.Reason != c.want || !strings.Contains(out.Detail, c.detail) {
				t.Errorf("reason %q detail %q, want %q with %q", out.Reason, out.Detail, c.want, c.detail)
			}
			if c.want == "" && out.Commit == "" {
				t.Errorf("no result commit: %+v", out)
			}
		})
	}
}

// lockWIP is a script fragment that makes the next update of the job's WIP
// ref fail, as a full disk would: a directory where git makes the ref's
// lock ("File exists"), which aq does not take for a lock a dead git left
// (worktree.ClearRefLocks removes only a file).
const lockWIP = `mkdir -p "$(git rev-parse --git-common-dir)/refs/heads/aq/wip/$AQ_JOB_ID.lock"`

// TestStaleWorktreeKeptWhenItCannotBeCheckpointed: the worktree a dead run
// left is never removed unless its files were recorded first.
func TestStaleWorktreeKeptWhenItCannotBeCheckpointed(t *testing.T) {
	testenv.Slow(t, "runs whole jobs with real git, processes and waits")
	f := newFixture(t)
	j := f.job("keepme", "exit 9")
	f.r.Cfg.PoolSize = 0 // aq dies: the worktree stays where it ran
	if out := f.run(context.Background(), j, runner.Options{Attempt: 1}); out.Reason != job.ReasonEngineFailed {
		t.Fatalf("first attempt: %+v", out)
	}
	f.r.Cfg.PoolSize = 1
	// Work written after the last checkpoint (aq died before taking one).
	testenv.WriteFile(t, filepath.Join(f.wt("keepme"), "unrecorded.txt"), "only copy\n")
	if err := os.MkdirAll(filepath.Join(f.repo, ".git", "refs", "heads", "aq", "wip", j.ID+".lock"), 0o755); err != nil { // as lockWIP
		t.Fatal(err)
	}

	out := f.run(context.Background(), j, runner.Options{Attempt: 2})
	if out.Reason != job.ReasonCrash || !strings.Contains(out.Detail, "kept") {
		t.Fatalf("second attempt: reason %q detail %q, want a failure that keeps the worktree", out.Reason, out.Detail)
	}
	if got := testenv.ReadFile(t, filepath.Join(f.wt("keepme"), "unrecorded.txt")); got != "only copy\n" {
		t.Fatalf("the unrecorded file is gone or changed: %q", got)
	}
}

// TestResultWhenTheLastCheckpointFails: a resumed run whose own checkpoint
// fails still commits what its engine did (not the checkpoint it started
// from).
func TestResultWhenTheLastCheckpointFails(t *testing.T) {
	testenv.Slow(t, "runs whole jobs with real git, processes and waits")
	f := newFixture(t)
	j := f.job("cpfail", "if [ -f first.txt ]; then echo second > second.txt; "+lockWIP+"; exit 0; fi\necho first > first.txt; exit 5")
	first := f.run(context.Background(), j, runner.Options{Attempt: 1})
	if first.Reason != job.ReasonEngineFailed || first.Checkpoint == "" {
		t.Fatalf("first attempt: %+v", first)
	}
	second := f.run(context.Background(), j, runner.Options{Attempt: 2, Checkpoint: first.Checkpoint})
	if second.Failed() || second.Commit == "" {
		t.Fatalf("second attempt: %+v", second)
	}
	files := testenv.TreeFiles(t, f.repo, second.Commit)
	if files["first.txt"] != "first" || files["second.txt"] != "second" {
		t.Errorf("the result lost work: %v", sortedKeys(files))
	}
}

// fakeLease is a fleet lease whose state the test sets.
type fakeLease struct{ held bool }

func (l *fakeLease) Confirm(context.Context) error {
	if !l.held {
		return job.Stop(job.ReasonLeaseLost, "test: not held")
	}
	return nil
}
func (l *fakeLease) Held(time.Duration) bool { return l.held }

// TestWIPPushNeedsTheLease: a fleet job pushes its WIP checkpoint to origin
// only while it holds the lease; a factory that may have lost the job keeps
// its checkpoint locally and never moves origin's (the new owner's).
func TestWIPPushNeedsTheLease(t *testing.T) {
	testenv.Slow(t, "runs whole jobs with real git, processes and waits")
	for _, held := range []bool{true, false} {
		t.Run(fmt.Sprint("held=", held), func(t *testing.T) {
			f := newFixture(t)
			origin := testenv.AddOrigin(t, f.repo)
			j := f.job("leased", "echo work > w.txt; exit 1")
			out := f.run(context.Background(), j, runner.Options{Lease: &fakeLease{held: held}})
			if out.Reason != job.ReasonEngineFailed || out.Checkpoint == "" || f.wip("leased") != out.Checkpoint {
				t.Fatalf("outcome %+v", out)
			}
			refs := testenv.RemoteRefs(t, origin, "refs/heads/aq/wip/")
			_, pushed := refs["refs/heads/aq/wip/"+j.ID]
			if pushed != held || out.WIPPushed != held {
				t.Fatalf("lease held=%v: WIP on origin=%v (WIPPushed %v)", held, pushed, out.WIPPushed)
			}
		})
	}
}

// TestWIPPushIsCompareAndSwap: when origin's WIP moved after this run
// looked at it (another factory checkpointed the job), the push is refused
// and origin keeps the other factory's checkpoint.
func TestWIPPushIsCompareAndSwap(t *testing.T) {
	testenv.Slow(t, "runs whole jobs with real git, processes and waits")
	f := newFixture(t)
	origin := testenv.AddOrigin(t, f.repo)
	j := f.job("cas", `echo mine > mine.txt; touch "$MARK/started"; while [ ! -f "$MARK/go" ]; do sleep 0.01; done`)
	done := make(chan runner.Outcome, 1)
	go func() { done <- f.run(context.Background(), j, runner.Options{}) }()
	f.waitMarker("started")
	// Another factory pushes its own checkpoint of the job meanwhile.
	other := testenv.Git(t, origin, "commit-tree", "-m", "other factory's checkpoint", testenv.Git(t, origin, "rev-parse", "main^{tree}"))
	testenv.Git(t, origin, "update-ref", "refs/heads/aq/wip/"+j.ID, other)
	testenv.WriteFile(t, f.marker("go"), "go")
	out := <-done
	if out.WIPPushed {
		t.Fatal("the WIP push replaced another factory's checkpoint")
	}
	if got := testenv.Git(t, origin, "rev-parse", "refs/heads/aq/wip/"+j.ID); got != other {
		t.Fatalf("origin's WIP moved to %s", got)
	}
	if f.wip("cas") != out.Checkpoint || out.Checkpoint == "" {
		t.Fatal("the local checkpoint is missing")
	}
}
