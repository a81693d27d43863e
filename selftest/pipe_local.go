package selftest

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"time"

	"github.com/aqfleet/aq/agent/gc"
	"github.com/aqfleet/aq/agent/gc/plan"
	"github.com/aqfleet/aq/agent/local"
	"github.com/aqfleet/aq/agent/manifest"
	"github.com/aqfleet/aq/agent/queue"
	"github.com/aqfleet/aq/agent/runner"
	"github.com/aqfleet/aq/agent/ship"
	"github.com/aqfleet/aq/internal/fixture"
	"github.com/aqfleet/aq/job"
	"github.com/aqfleet/aq/worktree"
)

// --- one job, end to end; verify; gc --------------------------------------------

func localRunScenario() *scenario {
	g := GroupPipeline
	return &scenario{name: "local-run", group: g, workspace: true, checks: []Check{
		check(g, "pipeline.git.setup", "throw-away git repositories with bare origins, under an isolated git configuration"),
		check(g, "pipeline.run.ship-branch", "a job runs end to end through the real queue and runner, and its branch is pushed to origin"),
		check(g, "pipeline.run.worktree", "the engine ran in $AQ_HOME/worktrees/<repo>/<id>, a linked worktree on aq/job/<id>"),
		check(g, "pipeline.run.prompt", "the engine got the task and its acceptance criteria on stdin"),
		check(g, "pipeline.run.insights", "usage reported with ::aq-usage is metered into the job's insights (tokens, cost, turns, lines)"),
		check(g, "pipeline.run.checkpoint", "the engine's files, untracked ones included, are checkpointed to aq/wip/<id> and pushed"),
		check(g, "pipeline.run.pr-body", ".aq_pr.md never reaches the commit; its text is kept as the PR body"),
		check(g, "pipeline.run.no-changes", "an engine that changes nothing ships nothing (no branch)"),
		check(g, "pipeline.run.warm", "the next job on the repository starts in the first job's worktree, reset to its base (the pool), not a new checkout"),
		check(g, "pipeline.verify.repair", "a failed verify goes back to the engine: a repair round with verify's output in its prompt, and the job ships in the same attempt"),
		check(g, "pipeline.verify.failed", "a verify that still fails after the job's repair rounds fails the job verify_failed, its work checkpointed"),
		check(g, "pipeline.gc.merged", "gc deletes a merged job branch (locally and on origin) and its worktree"),
		check(g, "pipeline.gc.unmerged", "gc keeps a job branch whose work is not merged"),
		check(g, "pipeline.gc.idempotent", "a second gc right after the first deletes nothing"),
	}, run: runLocalRun}
}

func runLocalRun(ctx context.Context, s *session) {
	var l *localSetup
	var repo, origin string
	if !s.step(ctx, "pipeline.git.setup", 30*time.Second, func(ctx context.Context) (string, error) {
		var err error
		if l, err = s.ws.newLocal("local-run", localOpt{}); err != nil {
			return "", err
		}
		repo, origin, err = l.repo(ctx, "app", map[string]string{"README.md": "# app\n", "main.txt": "one\n"}, true)
		if err != nil {
			return "", err
		}
		if refs, err := s.ws.remoteRefs(ctx, origin, "refs/heads/"); err != nil || refs["refs/heads/main"] == "" {
			return "", failf("origin has no main after the push: %v %v", refs, err)
		}
		return "repository app on main with a bare origin; git reads only the workspace's configuration", nil
	}) {
		return
	}
	id := l.id("ship")
	warm := false
	script := strings.Join([]string{
		"cat > " + shq(l.markFile("prompt.txt")),
		"pwd > " + shq(l.markFile("pwd.txt")),
		"git worktree list --porcelain > " + shq(l.markFile("worktrees.txt")),
		"echo 'hello from aq selftest' > hello.txt",
		"mkdir -p notes && echo 'untracked scratch' > notes/scratch.txt",
		"printf 'PR body from the engine\\n' > .aq_pr.md",
		"echo '::aq-usage tokens_in=1200 tokens_out=300 cost_usd=0.0125 turns=2'",
	}, "\n")
	body := "# Selftest: ship a branch\n\nWrite hello.txt.\n\n## Acceptance\n- hello.txt says hello\n"
	var res *local.Result
	var took time.Duration
	if !s.step(ctx, "pipeline.run.ship-branch", 30*time.Second, func(ctx context.Context) (string, error) {
		if _, err := l.submit(id, "title: Selftest ship\nrepo: app\nengine: script\n"+yamlBlock("script", script)+"\nverify: test -s hello.txt\nship: branch", body); err != nil {
			return "", err
		}
		start := time.Now()
		var err error
		res, err = l.runOne(ctx, id)
		took = time.Since(start)
		if err != nil {
			return "", err
		}
		if res.Stage != job.Shipped || !res.Outcome.Pushed {
			return "", failf("the job ended %s, pushed %v; want shipped and pushed", outcomeText(res), res.Outcome.Pushed)
		}
		refs, err := s.ws.remoteRefs(ctx, origin, "refs/heads/aq/job/")
		if err != nil {
			return "", err
		}
		if refs["refs/heads/"+job.JobBranch(id)] != res.Outcome.Commit {
			return "", failf("origin's %s is %q, want the result commit %s", job.JobBranch(id), refs["refs/heads/"+job.JobBranch(id)], res.Outcome.Commit)
		}
		return fmt.Sprintf("submitted, run, verified and shipped in %s: %s pushed to origin", ms(took), job.JobBranch(id)), nil
	}) {
		return
	}
	s.step(ctx, "pipeline.run.worktree", 10*time.Second, func(ctx context.Context) (string, error) {
		want := l.worktreePath("app", id)
		if got := strings.TrimSpace(readFile(l.markFile("pwd.txt"))); got != want {
			return "", failf("the engine ran in %q, want %s", got, want)
		}
		// What git listed while the engine ran (the worktree went back to
		// the pool since).
		for _, rec := range strings.Split(readFile(l.markFile("worktrees.txt")), "\n\n") {
			lines := strings.Split(strings.TrimSpace(rec), "\n")
			if len(lines) == 0 || lines[0] != "worktree "+want {
				continue
			}
			for _, line := range lines {
				if b, ok := strings.CutPrefix(line, "branch "); ok {
					if strings.TrimPrefix(b, "refs/heads/") != job.JobBranch(id) {
						return "", failf("the worktree was on %q, want %s", b, job.JobBranch(id))
					}
					return fmt.Sprintf("the engine ran in %s, listed by git worktree list on %s", want, job.JobBranch(id)), nil
				}
			}
			return "", failf("the worktree %s was on no branch", want)
		}
		return "", failf("git worktree list did not show %s while the engine ran", want)
	})
	s.step(ctx, "pipeline.run.prompt", 5*time.Second, func(ctx context.Context) (string, error) {
		p := readFile(l.markFile("prompt.txt"))
		if !strings.Contains(p, "Write hello.txt.") || !strings.Contains(p, "hello.txt says hello") {
			return "", failf("the engine's stdin lacks the task or its acceptance: %q", p)
		}
		return fmt.Sprintf("%d bytes on stdin: the task and the definition of done", len(p)), nil
	})
	s.step(ctx, "pipeline.run.insights", 5*time.Second, func(ctx context.Context) (string, error) {
		st, err := l.state(id)
		if err != nil {
			return "", err
		}
		in := st.Insights
		if in == nil {
			return "", failf("the sidecar has no insights")
		}
		if in.TokensIn != 1200 || in.TokensOut != 300 || in.CostUSD != 0.0125 || in.Turns != 2 || in.Engine != "script" {
			return "", failf("insights %+v, want 1200 in, 300 out, $0.0125, 2 turns, engine script", *in)
		}
		if in.FilesChanged != 2 || in.LinesAdded != 2 {
			return "", failf("change %d files +%d, want 2 files +2", in.FilesChanged, in.LinesAdded)
		}
		return fmt.Sprintf("tokens %d/%d, $%.4f, %d turns, %d files +%d/-%d, wall %dms", in.TokensIn, in.TokensOut, in.CostUSD, in.Turns, in.FilesChanged, in.LinesAdded, in.LinesDeleted, in.WallMS), nil
	})
	s.step(ctx, "pipeline.run.checkpoint", 10*time.Second, func(ctx context.Context) (string, error) {
		st, err := l.state(id)
		if err != nil {
			return "", err
		}
		wip := s.ws.revParse(ctx, repo, "refs/heads/"+job.WIPBranch(id))
		if wip == "" || st.Checkpoint != wip {
			return "", failf("checkpoint %q, %s is %q", st.Checkpoint, job.WIPBranch(id), wip)
		}
		for _, f := range []string{"hello.txt", "notes/scratch.txt"} {
			if !s.ws.treeHas(ctx, repo, wip, f) {
				return "", failf("the checkpoint lacks %s", f)
			}
		}
		refs, err := s.ws.remoteRefs(ctx, origin, "refs/heads/aq/wip/")
		if err != nil {
			return "", err
		}
		if refs["refs/heads/"+job.WIPBranch(id)] != wip || !res.Outcome.WIPPushed {
			return "", failf("the checkpoint was not pushed to origin (%v)", refs)
		}
		return fmt.Sprintf("%s = %.10s holds hello.txt and the untracked notes/scratch.txt; pushed to origin", job.WIPBranch(id), wip), nil
	})
	s.step(ctx, "pipeline.run.pr-body", 5*time.Second, func(ctx context.Context) (string, error) {
		if s.ws.treeHas(ctx, repo, res.Outcome.Commit, ".aq_pr.md") {
			return "", failf(".aq_pr.md is in the result commit")
		}
		if !s.ws.treeHas(ctx, repo, res.Outcome.Commit, "hello.txt") {
			return "", failf("the result commit lacks hello.txt")
		}
		if b := readFile(filepath.Join(l.cfg.LogsDir(), id, "pr.md")); !strings.Contains(b, "PR body from the engine") {
			return "", failf("logs/%s/pr.md does not hold the engine's PR body", id)
		}
		return ".aq_pr.md left out of the commit; its text kept in logs/" + id + "/pr.md", nil
	})
	s.step(ctx, "pipeline.run.no-changes", 20*time.Second, func(ctx context.Context) (string, error) {
		id2 := l.id("nochange")
		if _, err := l.submit(id2, "repo: app\nengine: script\nscript: \"cat > /dev/null; echo '::aq-usage tokens_in=10 tokens_out=1 turns=1'\"", ""); err != nil {
			return "", err
		}
		r, err := l.runOne(ctx, id2)
		if err != nil {
			return "", err
		}
		if r.Outcome.Failed() || r.Stage != job.Shipped || r.Outcome.Branch != "" || r.Outcome.Pushed {
			return "", failf("ended %s with branch %q (pushed %v); want shipped with no branch", outcomeText(r), r.Outcome.Branch, r.Outcome.Pushed)
		}
		if refs, _ := s.ws.remoteRefs(ctx, origin, "refs/heads/"+job.JobBranch(id2)); len(refs) > 0 {
			return "", failf("a branch was pushed for a job that changed nothing")
		}
		warm = r.Outcome.WarmStart
		return "shipped with nothing to ship: no commit, no branch, no push", nil
	})
	s.step(ctx, "pipeline.run.warm", 5*time.Second, func(ctx context.Context) (string, error) {
		if !warm {
			return "", failf("the second job on app got a new worktree; want the first job's, from the pool")
		}
		pooled, err := worktree.Pool{Dir: worktree.PoolDir(l.cfg.WorktreesDir(), "app")}.List()
		if err != nil || len(pooled) != 1 {
			return "", failf("app's pool holds %d worktrees (%v), want 1", len(pooled), err)
		}
		return "the second job on app reset the first job's worktree from the pool; it is back there: " + pooled[0].Path, nil
	})
	repairID := l.id("repair")
	s.step(ctx, "pipeline.verify.repair", 20*time.Second, func(ctx context.Context) (string, error) {
		// The engine writes the right answer only when its prompt names
		// verify's failure.
		script := "if grep -q 'want 42'; then echo 42 > answer.txt; else echo 41 > answer.txt; fi"
		verify := `a=$(cat answer.txt); [ "$a" = 42 ] || { echo "FAIL: answer.txt says $a, want 42"; exit 1; }`
		if _, err := l.submit(repairID, "repo: app\nengine: script\n"+yamlBlock("script", script)+"\n"+yamlBlock("verify", verify)+"\nship: none", ""); err != nil {
			return "", err
		}
		r, err := l.runOne(ctx, repairID)
		if err != nil {
			return "", err
		}
		in := r.Outcome.Insights
		if r.Outcome.Failed() || r.Attempt != 1 || in.RepairRounds != 1 || len(in.Runs) != 2 || in.Runs[0].VerifyExit != 1 || !in.Runs[1].VerifyPassed {
			return "", failf("ended %s after %d repair round(s), attempt %d; want it shipped in attempt 1 after one round", outcomeText(r), in.RepairRounds, r.Attempt)
		}
		return "verify failed after the first run, the engine got its output in repair round 1 of 2, fixed it, verify passed: one attempt", nil
	})
	failedID := l.id("verify")
	s.step(ctx, "pipeline.verify.failed", 20*time.Second, func(ctx context.Context) (string, error) {
		if _, err := l.submit(failedID, "repo: app\nengine: script\nscript: \"echo half-done > broken.txt\"\nverify: test -f never-there.txt", ""); err != nil {
			return "", err
		}
		r, err := l.runOne(ctx, failedID)
		if err != nil {
			return "", err
		}
		if r.Outcome.Reason != job.ReasonVerifyFailed || r.Outcome.Insights.RepairRounds != job.DefaultVerifyRounds {
			return "", failf("ended %s after %d repair round(s), want verify_failed after %d", outcomeText(r), r.Outcome.Insights.RepairRounds, job.DefaultVerifyRounds)
		}
		if r.Stage != job.DeadLetter {
			return "", failf("went to %s, want dead_letter (no retries left)", r.Stage)
		}
		if r.Outcome.Checkpoint == "" || !s.ws.treeHas(ctx, repo, r.Outcome.Checkpoint, "broken.txt") {
			return "", failf("the work was not checkpointed")
		}
		if !fixture.Exists(filepath.Join(l.cfg.LogsDir(), failedID, "verify.log")) {
			return "", failf("no verify.log")
		}
		return "verify exited 1 after the first run and both repair rounds: verify_failed, dead_letter (no retries), broken.txt checkpointed, verify.log written", nil
	})
	g := &gc.GC{
		Cfg: gc.Config{RepoBase: l.base, WorktreesDir: l.cfg.WorktreesDir(), LocksDir: l.cfg.LocksDir(), Policy: plan.Policy{WIPRetention: 336 * time.Hour}},
		Git: s.ws.git, Queue: l.a.Queue, Now: time.Now,
		Base: func(path string) (string, error) {
			j, err := manifest.ParseFile(path, s.ws.cat)
			if err != nil {
				return "", err
			}
			return j.Base, nil
		},
	}
	jobRef := "refs/heads/" + job.JobBranch(id)
	if !s.step(ctx, "pipeline.gc.merged", 30*time.Second, func(ctx context.Context) (string, error) {
		// Someone merges the shipped branch into main on origin.
		if _, err := s.ws.gitRun(ctx, repo, "merge", "-q", "--ff-only", job.JobBranch(id)); err != nil {
			return "", err
		}
		if _, err := s.ws.gitRun(ctx, repo, "push", "-q", "origin", "main"); err != nil {
			return "", err
		}
		rep, err := g.Run(ctx, false)
		if err != nil {
			return "", err
		}
		if err := rep.Err(); err != nil {
			return "", failf("gc reported errors: %v", err)
		}
		if s.ws.revParse(ctx, repo, jobRef) != "" {
			return "", failf("the merged branch %s is still there", job.JobBranch(id))
		}
		if refs, _ := s.ws.remoteRefs(ctx, origin, jobRef); len(refs) > 0 {
			return "", failf("the merged branch is still on origin")
		}
		if fixture.Exists(l.worktreePath("app", id)) {
			return "", failf("the shipped job's worktree is still there")
		}
		d := rep.Deleted
		return fmt.Sprintf("deleted %d job branches, %d WIP refs, %d worktrees, %d origin refs; kept %d", d.JobBranches, d.WIPRefs, d.Worktrees, d.RemoteRefs, rep.Kept.Total()), nil
	}) {
		return
	}
	s.step(ctx, "pipeline.gc.unmerged", 5*time.Second, func(ctx context.Context) (string, error) {
		if s.ws.revParse(ctx, repo, "refs/heads/"+job.JobBranch(failedID)) == "" {
			return "", failf("gc deleted %s, whose work is not merged", job.JobBranch(failedID))
		}
		if s.ws.revParse(ctx, repo, "refs/heads/"+job.WIPBranch(failedID)) == "" {
			return "", failf("gc deleted the WIP of a recently failed job")
		}
		return job.JobBranch(failedID) + " (not merged) and its WIP kept", nil
	})
	s.step(ctx, "pipeline.gc.idempotent", 30*time.Second, func(ctx context.Context) (string, error) {
		rep, err := g.Run(ctx, false)
		if err != nil {
			return "", err
		}
		if n := rep.Deleted.Total(); n != 0 || len(rep.Errors) > 0 {
			return "", failf("the second run deleted %d (errors %v)", n, rep.Errors)
		}
		return fmt.Sprintf("the second run deleted nothing and kept %d", rep.Kept.Total()), nil
	})
}

// --- repo locks -------------------------------------------------------------------

func locksScenario() *scenario {
	g := GroupPipeline
	return &scenario{name: "locks", group: g, workspace: true, checks: []Check{
		check(g, "pipeline.locks.same-repo", "a job on a repository whose lock is held waits for it, then runs"),
		check(g, "pipeline.locks.other-repo", "a job on another repository runs meanwhile (repos run in parallel)"),
	}, run: func(ctx context.Context, s *session) {
		l := s.newLocal(ctx, "locks", localOpt{}, "one", "two")
		if l == nil {
			return
		}
		script := func(id string) string {
			return fmt.Sprintf("script: \"touch %s; echo %s > out.txt\"", l.markFile(id+".ran"), id)
		}
		run := func(ctx context.Context, a *local.Agent) <-chan *local.Result {
			ch := make(chan *local.Result, 1)
			go func() {
				r, err := a.RunOne(ctx)
				if err != nil && r == nil {
					r = &local.Result{Outcome: failedOutcome(err)}
				}
				ch <- r
			}()
			return ch
		}
		s.step(ctx, "pipeline.locks.same-repo", 30*time.Second, func(ctx context.Context) (string, error) {
			lock, err := worktree.LockRepo(ctx, l.cfg.LocksDir(), "one")
			if err != nil {
				return "", err
			}
			defer lock.Unlock()
			id := l.id("lock-wait")
			if _, err := l.submit(id, "repo: one\nengine: script\n"+script(id), ""); err != nil {
				return "", err
			}
			ch := run(ctx, l.a)
			if err := fixture.WaitFor(ctx, "the job to be taken", func() bool { st, _ := l.state(id); return st.Stage == job.Building }); err != nil {
				return "", err
			}
			time.Sleep(300 * time.Millisecond)
			if fixture.Exists(l.markFile(id + ".ran")) {
				return "", failf("the engine ran while another held the repository's lock")
			}
			released := time.Now()
			lock.Unlock()
			r := <-ch
			if r.Outcome.Failed() || r.Stage != job.Shipped || !fixture.Exists(l.markFile(id+".ran")) {
				return "", failf("after the lock was released the job ended %s", outcomeText(r))
			}
			return fmt.Sprintf("waited for the repository lock (held 300ms+), then ran and shipped %s after the release", ms(time.Since(released))), nil
		})
		s.step(ctx, "pipeline.locks.other-repo", 30*time.Second, func(ctx context.Context) (string, error) {
			lock, err := worktree.LockRepo(ctx, l.cfg.LocksDir(), "one")
			if err != nil {
				return "", err
			}
			defer lock.Unlock()
			waiting, other := l.id("lock-one"), l.id("lock-two")
			if _, err := l.submit(waiting, "repo: one\nengine: script\npriority: high\n"+script(waiting), ""); err != nil {
				return "", err
			}
			if _, err := l.submit(other, "repo: two\nengine: script\n"+script(other), ""); err != nil {
				return "", err
			}
			first := run(ctx, l.a) // takes the high-priority job on the locked repo, and waits
			if err := fixture.WaitFor(ctx, "the first job to be taken", func() bool { st, _ := l.state(waiting); return st.Stage == job.Building }); err != nil {
				return "", err
			}
			second, err := s.ws.newLocalOn(l) // another runner on the same AQ_HOME
			if err != nil {
				return "", err
			}
			r2 := <-run(ctx, second)
			if r2.JobID != other || r2.Stage != job.Shipped {
				return "", failf("the job on repository two ended %s (%s) while one was locked", outcomeText(r2), r2.JobID)
			}
			if fixture.Exists(l.markFile(waiting + ".ran")) {
				return "", failf("the job on the locked repository ran")
			}
			lock.Unlock()
			r1 := <-first
			if r1.Stage != job.Shipped {
				return "", failf("the waiting job ended %s", outcomeText(r1))
			}
			return "the job on repository two shipped while one's lock was held; one's job ran after", nil
		})
	}}
}

// newLocalOn is a second agent on l's installation (another aq process).
func (w *workspace) newLocalOn(l *localSetup) (*local.Agent, error) {
	a, err := local.New(l.cfg, l.a.Log, l.red, local.Parts{Catalog: w.cat})
	if err != nil {
		return nil, err
	}
	a.Runner.Git, a.Runner.Env, a.Runner.Log, a.Host = w.git, l.a.Runner.Env, l.a.Runner.Log, l.a.Host
	return a, nil
}

// --- failures that must not reach a worktree ------------------------------------------

func failuresScenario() *scenario {
	g := GroupPipeline
	return &scenario{name: "failures", group: g, workspace: true, checks: []Check{
		check(g, "pipeline.fail.no-engine", "a script command that is not installed fails no_engine before any worktree is made"),
		check(g, "pipeline.fail.repo-missing", "a repo that is not under AQ_REPO_BASE fails repo_unavailable"),
		check(g, "pipeline.fail.ship-needs-gh", "ship: pr without a usable gh fails capability_mismatch before any worktree"),
		check(g, "pipeline.fail.engine-unavailable", "an engine that reports itself unavailable fails engine_unavailable and is retried later"),
		check(g, "pipeline.fail.capability", "a job this host lacks a capability for stays queued, and the reason is explained"),
	}, run: func(ctx context.Context, s *session) {
		l := s.newLocal(ctx, "failures", localOpt{}, "app")
		if l == nil {
			return
		}
		s.step(ctx, "pipeline.fail.no-engine", 20*time.Second, func(ctx context.Context) (string, error) {
			id := l.id("noengine")
			if _, err := l.submit(id, "repo: app\nengine: script\nscript: aq-selftest-no-such-command --go", ""); err != nil {
				return "", err
			}
			r, err := l.runOne(ctx, id)
			if err != nil {
				return "", err
			}
			if r.Outcome.Reason != job.ReasonNoEngine {
				return "", failf("ended %s, want no_engine", outcomeText(r))
			}
			if fixture.Exists(l.worktreePath("app", id)) {
				return "", failf("a worktree was made for a job whose engine is missing")
			}
			return "no_engine: " + r.Outcome.Detail, nil
		})
		s.step(ctx, "pipeline.fail.repo-missing", 20*time.Second, func(ctx context.Context) (string, error) {
			id := l.id("norepo")
			if _, err := l.submit(id, "repo: not-cloned-here\nengine: script\nscript: \"true\"", ""); err != nil {
				return "", err
			}
			r, err := l.runOne(ctx, id)
			if err != nil {
				return "", err
			}
			if r.Outcome.Reason != job.ReasonRepoUnavailable || !strings.Contains(r.Outcome.Detail, "not-cloned-here") {
				return "", failf("ended %s, want repo_unavailable naming the repo", outcomeText(r))
			}
			return "repo_unavailable: " + r.Outcome.Detail, nil
		})
		s.step(ctx, "pipeline.fail.ship-needs-gh", 20*time.Second, func(ctx context.Context) (string, error) {
			id := l.id("needsgh")
			if _, err := l.submit(id, "repo: app\nengine: script\nscript: \"echo x > x.txt\"\nship: pr", ""); err != nil {
				return "", err
			}
			a, err := s.ws.newLocalOn(l)
			if err != nil {
				return "", err
			}
			a.Runner.Shipper = ship.GH{Bin: filepath.Join(s.ws.root, "no-such-dir", "gh")} // the real pre-flight, with gh missing
			r, err := a.RunOne(ctx)
			if err != nil {
				return "", err
			}
			if r.JobID != id || r.Outcome.Reason != job.ReasonCapabilityMismatch || !strings.Contains(r.Outcome.Detail, "has:gh") {
				return "", failf("ended %s, want capability_mismatch naming has:gh", outcomeText(r))
			}
			if fixture.Exists(l.worktreePath("app", id)) {
				return "", failf("a worktree was made although the job could not ship")
			}
			return "capability_mismatch before any work: " + r.Outcome.Detail, nil
		})
		s.step(ctx, "pipeline.fail.engine-unavailable", 20*time.Second, func(ctx context.Context) (string, error) {
			id := l.id("unavailable")
			if _, err := l.submit(id, "repo: app\nengine: script\nscript: \"echo '::aq-unavailable login expired'\"", ""); err != nil {
				return "", err
			}
			r, err := l.runOne(ctx, id)
			if err != nil {
				return "", err
			}
			st, err := l.state(id)
			if err != nil {
				return "", err
			}
			if r.Outcome.Reason != job.ReasonEngineUnavailable || st.Stage != job.Inbox || time.Until(st.NotBefore) < 20*time.Second {
				return "", failf("ended %s; stage %s, retry in %s: want engine_unavailable, back in the inbox after a backoff", outcomeText(r), st.Stage, time.Until(st.NotBefore).Round(time.Second))
			}
			return fmt.Sprintf("engine_unavailable (%s): back in the inbox, retried in %s (not the task's fault)", r.Outcome.Detail, time.Until(st.NotBefore).Round(time.Second)), nil
		})
		s.step(ctx, "pipeline.fail.capability", 20*time.Second, func(ctx context.Context) (string, error) {
			id := l.id("picky")
			if _, err := l.submit(id, "repo: app\nengine: script\nscript: \"true\"\ncapabilities: [has:aq-selftest-missing-tool]", ""); err != nil {
				return "", err
			}
			if r, err := l.a.RunOne(ctx); !errors.Is(err, queue.ErrNoJob) {
				return "", failf("RunOne took %v (%v), want no runnable job", r, err)
			}
			st, err := l.state(id)
			if err != nil {
				return "", err
			}
			host, err := l.a.HostCaps(ctx)
			if err != nil {
				return "", err
			}
			ok, why := local.Runnable(host, st)
			if ok || !strings.Contains(why, "has:aq-selftest-missing-tool") || st.Stage != job.Inbox || st.Attempts != 0 {
				return "", failf("runnable %v (%s), stage %s, attempts %d", ok, why, st.Stage, st.Attempts)
			}
			return "stays queued; why: " + why, nil
		})
	}}
}

// failedOutcome stands for a RunOne that returned no result.
func failedOutcome(err error) runner.Outcome {
	return runner.Outcome{Stage: job.Failed, Reason: job.ReasonCrash, Detail: err.Error()}
}
