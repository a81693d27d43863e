package fleetdemo

import (
	"context"
	"encoding/json"
	"fmt"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/aqfleet/aq/agent/gc"
	"github.com/aqfleet/aq/agent/jobstate"
	"github.com/aqfleet/aq/agent/runner"
	"github.com/aqfleet/aq/demo/coord"
	"github.com/aqfleet/aq/internal/brief"
	"github.com/aqfleet/aq/internal/process"
)

// phases runs the story. Each step waits on real signals with a deadlock
// guard; the first guard that fires ends the story (the checks then say
// what did not happen).
func (r *run) phases(ctx context.Context) error {
	for _, p := range []func(context.Context) error{r.parallel, r.sameRepo, r.failing, r.killAndResume, r.collect} {
		if err := p(ctx); err != nil {
			return err
		}
	}
	return nil
}

// submit runs `aq submit` for one embedded job as an operator would (fleet
// mode: POST /fleet/jobs with the enrollment token).
func (r *run) submit(ctx context.Context, id string) error {
	if err := r.settle(ctx); err != nil {
		return err
	}
	env := append(append([]string{}, r.env...),
		"AQ_HOME="+filepath.Join(r.ws, "operator", "home"), "AQ_REPO_BASE="+filepath.Join(r.ws, "operator", "src"),
		"AQ_FLEET=1", "AQ_FLEET_API="+r.api, "AQ_FLEET_TOKEN="+r.stub.EnrollToken())
	_, errOut, code, err := runAQ(ctx, r.aq, env, r.ws, "submit", filepath.Join(r.jobs, id+".md"))
	if err != nil || code != 0 {
		return fmt.Errorf("aq submit %s: exit %d %v: %s", id, code, err, strings.TrimSpace(errOut))
	}
	return nil
}

// submitAndTake submits id, waits until a factory holds it, and narrates.
func (r *run) submitAndTake(ctx context.Context, id string) (string, int64, error) {
	if err := r.submit(ctx, id); err != nil {
		return "", 0, err
	}
	holder, epoch, err := r.waitTaken(ctx, id, 0)
	if err != nil {
		return "", 0, err
	}
	r.say("   %-11s (repo %-4s) %s", id, r.job(id).Repo, r.took(id, epoch, holder))
	return holder, epoch, nil
}

// parallel: three jobs on three repos, dispatched one by one, all running
// at once (their engines hold until the demo has seen them all).
func (r *run) parallel(ctx context.Context) error {
	r.say("")
	if r.broker {
		r.say("2. Targeted dispatch, and three repos at once (aq submit → the stub picks a factory → one message to its subscription)")
	} else {
		r.say("2. Dispatch over the gated poll path, and three repos at once (aq submit → a factory's claim)")
	}
	ids := []string{"api-health", "web-title", "docs-intro"}
	for _, id := range ids {
		if _, _, err := r.submitAndTake(ctx, id); err != nil {
			return err
		}
	}
	// All three engines have started (their markers), and the daemons'
	// status files show them running at the same time.
	err := r.waitFor(ctx, "the three engines to run at once", func() bool {
		for _, id := range ids {
			if _, _, ok := r.marker(id + ".start"); !ok {
				return false
			}
		}
		running, repos := map[string][]string{}, map[string]bool{}
		for _, fid := range r.order {
			st := r.facs[fid].status()
			if st == nil {
				return false
			}
			for _, j := range st.Running {
				if j.Phase == "running" && slices.Contains(ids, j.JobID) {
					running[fid] = append(running[fid], fmt.Sprintf("%s (%s)", j.JobID, j.Repo))
					repos[j.Repo] = true
				}
			}
		}
		if len(repos) < len(ids) {
			return false
		}
		r.ob.parallel, r.ob.parallelRepo = running, len(repos)
		return true
	})
	if err != nil {
		return err
	}
	var parts []string
	for _, fid := range r.order {
		if js := r.ob.parallel[fid]; len(js) > 0 {
			parts = append(parts, fid+" runs "+strings.Join(js, " and "))
		}
	}
	r.say("   all three engines run at the same time: %s (the daemons' status files)", strings.Join(parts, "; "))
	if err := r.touch("gate-1"); err != nil {
		return err
	}
	r.say("   … the demo lets them finish")
	for _, id := range ids {
		if err := r.waitStage(ctx, id, coord.StageShipped, coord.StageFailed, coord.StageDeadLetter); err != nil {
			return err
		}
		r.say("   %-11s %s", id, r.outcome(ctx, id))
	}
	return nil
}

// outcome narrates where a finished job went.
func (r *run) outcome(ctx context.Context, id string) string {
	j := r.job(id)
	ev, _ := r.lastEvent(id, "stage", "fail", "released")
	switch j.Stage {
	case coord.StageShipped, coord.StageReview, coord.StageTesting:
		ref := r.originRef(ctx, j.Repo, "aq/job/"+id)
		return fmt.Sprintf("%s by %s: branch %s pushed to origin (%s)", j.Stage, ev.Factory, j.Branch, brief.SHA(ref))
	}
	return fmt.Sprintf("%s (%s) — reported by %s", j.Stage, j.Reason, ev.Factory)
}

// sameRepo: two web jobs on the two factories, then a third web job while
// both are busy with web. A factory runs one job per repo at a time.
func (r *run) sameRepo(ctx context.Context) error {
	r.say("")
	r.say("3. One repo, one job at a time on each factory")
	x, _, err := r.submitAndTake(ctx, "web-footer")
	if err != nil {
		return err
	}
	y, _, err := r.submitAndTake(ctx, "web-header")
	if err != nil {
		return err
	}
	if x != y {
		r.say("   the same repo on two factories at once is fine: each works in its own clone and worktree")
	}
	claims204 := func() int64 { return r.stub.Stats().Routes[coord.RouteClaim].Status["204"] }
	before := claims204()
	if err := r.submit(ctx, "web-nav"); err != nil {
		return err
	}
	if r.broker {
		// Both factories are busy with web: the stub targets one anyway
		// (a free seat), which accepts it and queues it behind its running
		// web job on the repo lock.
		var holder, waits string
		var epoch int64
		err := r.waitFor(ctx, "web-nav to wait for the web repo", func() bool {
			holder, epoch = r.held("web-nav")
			if holder == "" {
				return false
			}
			if st := r.facs[holder].status(); st != nil {
				for _, j := range st.Running {
					if j.JobID == "web-nav" && j.WaitsFor != "" {
						waits = j.WaitsFor
						return true
					}
				}
			}
			return false
		})
		if err != nil {
			return err
		}
		r.ob.navWaits = waits
		r.say("   %-11s (repo web ) %s", "web-nav", r.took("web-nav", epoch, holder))
		r.say("   both factories are busy with web, so %s took it and queues it on its repo lock behind %s:", holder, waits)
		r.showStatus(ctx, holder)
	} else {
		// Neither factory claims a repo it is busy with: web-nav stays
		// queued until one of them is done with web.
		err := r.waitFor(ctx, "two claims after web-nav was queued", func() bool {
			return claims204()-before >= 2 && r.job("web-nav").Stage == coord.StageQueued
		})
		if err != nil {
			return err
		}
		r.ob.navWaits = "queued"
		r.say("   %-11s (repo web ) stays queued: the factories' claims leave out the repos they are busy with (%d claims answered 204 since)",
			"web-nav", claims204()-before)
	}
	r.ob.gate2 = time.Now()
	if err := r.touch("gate-2"); err != nil {
		return err
	}
	r.say("   … the demo lets web-footer and web-header finish")
	for _, id := range []string{"web-footer", "web-header", "web-nav"} {
		if err := r.waitStage(ctx, id, coord.StageShipped, coord.StageFailed, coord.StageDeadLetter); err != nil {
			return err
		}
	}
	// When did each web job's engine run, and where (the engines' markers)?
	type span struct {
		id, fac    string
		start, end time.Time
	}
	var spans []span
	for _, id := range []string{"web-footer", "web-header", "web-nav"} {
		fac, st, ok1 := r.marker(id + ".start")
		_, en, ok2 := r.marker(id + ".end")
		if ok1 && ok2 {
			spans = append(spans, span{id, fac, st, en})
		}
	}
	r.ob.serialOK = len(spans) == 3
	nav := span{}
	for _, s := range spans {
		if s.id == "web-nav" {
			nav = s
		}
	}
	for _, s := range spans {
		if s.id == "web-nav" || s.fac != nav.fac {
			continue
		}
		gap := nav.start.Sub(s.end)
		if gap < 0 {
			r.ob.serialOK = false
		}
		r.ob.serialNote = fmt.Sprintf("on %s: %s's engine ended, then web-nav's started %s later", s.fac, s.id, gap.Round(time.Millisecond))
		r.say("   web-nav ran on %s only after %s, its other web job, was done (%s later); %s",
			s.fac, s.id, gap.Round(time.Millisecond), r.outcome(ctx, "web-nav"))
	}
	if r.ob.serialNote == "" {
		r.ob.serialOK = false
	}
	return nil
}

// showStatus prints the daemon section of `aq status` for a factory (what
// an operator on that host would see).
func (r *run) showStatus(ctx context.Context, fid string) {
	f := r.facs[fid]
	out, _, _, err := runAQ(ctx, r.aq, f.env, f.dir, "status")
	if err != nil {
		return
	}
	r.say("      $ aq status   (on %s)", fid)
	in := false
	for _, l := range strings.Split(out, "\n") {
		if strings.HasPrefix(l, "daemon:") {
			in = true
		}
		if in && strings.TrimSpace(l) == "" {
			break
		}
		if in {
			r.say("      %s", strings.TrimRight(l, " "))
		}
	}
}

// failing: a job whose verify fails, with no retries left: the factory
// reports it with /fleet/fail and the lease is free at once.
func (r *run) failing(ctx context.Context) error {
	r.say("")
	r.say("4. A failing job releases its lease at once")
	id := "docs-verify"
	holder, epoch, err := r.submitAndTake(ctx, id)
	if err != nil {
		return err
	}
	if err := r.waitStage(ctx, id, coord.StageDeadLetter, coord.StageFailed, coord.StageQueued, coord.StageShipped); err != nil {
		return err
	}
	if r.legacy() { // the release follows the PATCH
		if err := r.waitFor(ctx, id+"'s lease to be released", func() bool { _, ok := r.released(id, epoch); return ok }); err != nil {
			return err
		}
	}
	take, _ := r.takeEvent(id, epoch)
	fail, ok := r.lastFailure(id)
	if ok {
		free := fail
		if rel, ok := r.released(id, epoch); ok {
			free = rel
		}
		r.say("   the engine left the typo in, so verify failed (%s)", r.job(id).Detail)
		r.say("   → %s → %s (no retries left), %s after %s took the lease",
			r.failCall(id, fail, ""), fail.Stage, free.At.Sub(take.At).Round(time.Millisecond), holder)
		r.say("   the lease was released with the report — no wait for the reaper (the lease had %s to live)", leaseTTL)
	}
	r.ob.failJob = id
	return nil
}

// killAndResume: a two-step job that fails after step 1 (WIP pushed,
// requeued at once), hangs in its second attempt — whose factory the demo
// kill -9s — is reclaimed by the reaper, resumed by the other factory from
// the pushed checkpoint and shipped; then the killed factory comes back and
// is fenced.
func (r *run) killAndResume(ctx context.Context) error {
	const id = "api-resume"
	r.say("")
	r.say("5. kill -9 mid-job, the reaper, resume from the pushed checkpoint, and the zombie")
	if err := r.submit(ctx, id); err != nil {
		return err
	}

	// Attempt 1: step 1, then the engine fails.
	var fail coord.Event
	err := r.waitFor(ctx, id+"'s first attempt to fail", func() bool {
		var ok bool
		fail, ok = r.lastFailure(id)
		return ok
	})
	if err != nil {
		return err
	}
	j := r.job(id)
	r.ob.cp1 = j.Checkpoint
	r.ob.originAfter1 = r.originRef(ctx, "api", "aq/wip/"+id)
	r.ob.step1Files = slices.Contains(r.files(ctx, filepath.Join(r.ws, "origins", "api.git"), r.ob.originAfter1), "step-1.txt")
	r.say("   attempt 1: %s", r.took(id, fail.Epoch, fail.Factory))
	r.say("      the engine wrote step-1.txt and failed; %s checkpointed the worktree and pushed it to origin as aq/wip/%s (%s) while it held the lease",
		fail.Factory, id, brief.SHA(r.ob.originAfter1))
	if r.legacy() {
		r.say("      → %s → %s at once (aq applied the retry policy: a retry is left)", r.failCall(id, fail, ", checkpoint: "+brief.SHA(j.Checkpoint)), fail.Stage)
	} else {
		r.say("      → POST /fleet/fail {reason: %s, retryable: true, checkpoint: %s} → %s at once; retry in 3s (retry.backoff)", fail.Detail, brief.SHA(j.Checkpoint), fail.Stage)
	}

	// Attempt 2: resumes, does part of step 2, hangs.
	var hangOn string
	var epoch2 int64
	err = r.waitFor(ctx, id+"'s second attempt to reach step 2", func() bool {
		var ok bool
		hangOn, _, ok = r.marker(id + ".hanging")
		holder, e := r.held(id)
		epoch2 = e
		return ok && holder == hangOn && e > fail.Epoch
	})
	if err != nil {
		return err
	}
	r.say("   attempt 2: %s", r.took(id, epoch2, hangOn))
	r.say("      it starts from the checkpoint (step-1.txt is there), writes half of step 2 … and hangs")

	// kill -9 the factory running it.
	f := r.facs[hangOn]
	r.ob.killed, r.ob.killedPID, r.ob.killedEpoch = hangOn, f.pid(), epoch2
	r.ob.orphanEngines, _ = process.FindScoped(id, runner.Scope(f.home)) // the engine, before the kill
	ps, err := f.kill9()
	if err != nil {
		return err
	}
	r.ob.killedAt = time.Now()
	if ws, ok := ps.Sys().(interface{ Signaled() bool }); ok && ws.Signaled() {
		r.ob.killedSignal = ps.String()
	}
	if err := r.touch(id + ".killed"); err != nil { // the next attempt may finish
		return err
	}
	r.ob.statusAfter = f.status()
	r.say("   $ kill -9 %d   (%s's aq daemon, mid-job; %s)", r.ob.killedPID, hangOn, ps)
	r.ob.engineStopped = -1
	if err := r.waitFor(ctx, "the dead daemon's engine to be stopped by its supervisor", func() bool {
		left, _ := process.FindScoped(id, runner.Scope(f.home))
		return len(left) == 0
	}); err == nil {
		r.ob.engineStopped = time.Since(r.ob.killedAt)
	}
	if len(r.ob.orphanEngines) > 0 && r.ob.engineStopped >= 0 {
		r.say("      its engine (pid %s) does not run on without its aq: its supervisor stopped it %s later (SIGINT, SIGTERM, SIGKILL)",
			pidList(r.ob.orphanEngines), r.ob.engineStopped.Round(10*time.Millisecond))
	}
	r.say("      nothing is reported, the lease is no longer renewed")
	r.showStatus(ctx, hangOn)

	// The reaper.
	var reaped coord.Event
	err = r.waitFor(ctx, "the reaper to reclaim "+id+"'s lease", func() bool {
		for _, e := range r.events(id, "reaped") {
			if e.Factory == hangOn {
				reaped = e
				return true
			}
		}
		return false
	})
	if err != nil {
		return err
	}
	r.ob.reapedAfter = reaped.At.Sub(r.ob.killedAt)
	r.say("   the reaper: %s's lease expired %s after the kill (TTL %s, renewed every %ds until then) → epoch %d, %s, checkpoint %s kept",
		hangOn, r.ob.reapedAfter.Round(100*time.Millisecond), leaseTTL, renewEvery, reaped.Epoch, reaped.Stage, brief.SHA(r.job(id).Checkpoint))

	// Attempt 3, on the other factory, from the pushed checkpoint.
	holder, epoch3, err := r.waitTaken(ctx, id, reaped.Epoch)
	if err != nil {
		return err
	}
	r.ob.resumer = holder
	r.say("   attempt 3: %s", r.took(id, epoch3, holder))
	if err := r.waitStage(ctx, id, coord.StageShipped, coord.StageFailed, coord.StageDeadLetter); err != nil {
		return err
	}
	j = r.job(id)
	r.ob.resultFiles = r.files(ctx, filepath.Join(r.ws, "origins", "api.git"), "refs/heads/aq/job/"+id)
	step1By, _, _ := r.marker(id + ".step-1")
	r.say("      %s found step-1.txt (written by %s in attempt 1, reached it through origin's aq/wip/%s), wrote step 2, and the job %s",
		holder, step1By, id, j.Stage)
	r.say("      origin aq/job/%s has %s — and no step-2-partial.txt: the killed attempt's work never reached origin", id, strings.Join(r.ob.resultFiles, ", "))

	// The zombie: the killed factory restarts.
	r.ob.wipBefore = r.originRef(ctx, "api", "aq/wip/"+id)
	if err := f.start(r.aq); err != nil {
		return err
	}
	err = r.waitFor(ctx, hangOn+" to restart and recover its orphan", func() bool {
		st := f.status()
		return !f.running() || (st != nil && st.PID == f.pid() && st.Stage == "running" && slices.Contains(st.Recovered, id))
	})
	if err != nil {
		return err
	}
	if !f.running() {
		return fmt.Errorf("%s's aq daemon exited after its restart (%s); its log: %s", hangOn, f.state, f.logPath)
	}
	r.ob.zombieUp = true
	r.ob.wipAfter = r.originRef(ctx, "api", "aq/wip/"+id)
	r.ob.zombieLocal = r.files(ctx, filepath.Join(f.base, "api"), "refs/heads/aq/wip/"+id)
	r.ob.zombieEngines, _ = process.FindScoped(id, runner.Scope(f.home))
	if st, err := jobstate.Open(filepath.Join(f.home, "state", "jobs")); err == nil {
		if rec, err := st.Get(id); err == nil {
			r.ob.zombieRecord = fmt.Sprintf("%s/%s fenced=%t", rec.Stage, rec.Reason, rec.Fenced)
		}
	}
	r.say("   %s restarts (pid %d): its orphan recovery finds the old engine already stopped, checkpoints the worktree locally,", hangOn, f.pid())
	r.say("      and asks to renew the lease it had (epoch %d):", epoch2)
	for _, e := range r.zombieRefusals() {
		r.say("      %s %s → 409 Conflict: %q", e.Call, fmt.Sprintf("{factoryId: %s, leaseEpoch: %d}", e.Factory, e.Epoch), e.Detail)
	}
	r.say("      fenced: it pushes nothing (origin aq/wip/%s still %s) and reports nothing; its half-done step 2 stays on its local aq/wip/%s",
		id, brief.SHA(r.ob.wipAfter), id)
	return nil
}

// zombieRefusals are the 409s the stub answered the killed factory for
// api-resume at the epoch it had.
func (r *run) zombieRefusals() []coord.Event {
	var out []coord.Event
	for _, e := range r.events("api-resume", "fenced") {
		if e.Factory == r.ob.killed && e.Epoch == r.ob.killedEpoch && e.Status == 409 {
			out = append(out, e)
		}
	}
	return out
}

// collect: an operator merges one branch, then aq gc on each factory,
// twice.
func (r *run) collect(ctx context.Context) error {
	r.say("")
	r.say("6. aq gc: cleaning up branches, worktrees and WIP refs")
	// An operator merges api-health's branch on origin (as a PR merge on
	// GitHub would: a fast-forward of main).
	tip := r.originRef(ctx, "api", "aq/job/api-health")
	main := r.originRef(ctx, "api", "main")
	bare := filepath.Join(r.ws, "origins", "api.git")
	if tip != "" && main != "" {
		if _, err := r.git(ctx, r.ws, "-C", bare, "merge-base", "--is-ancestor", main, tip); err == nil {
			if _, err := r.git(ctx, r.ws, "-C", bare, "update-ref", "refs/heads/main", tip, main); err == nil {
				r.ob.merged = "api-health"
				r.say("   an operator merges aq/job/api-health into main on origin (a fast-forward, as a merged PR would)")
			}
		}
	}
	for round := 1; round <= 2; round++ {
		for _, fid := range r.order {
			f := r.facs[fid]
			out, errOut, code, err := runAQ(ctx, r.aq, f.env, f.dir, "gc", "--json")
			var rep struct {
				Deleted gc.Counts `json:"deleted"`
				Kept    gc.Counts `json:"kept"`
				Errors  []string  `json:"errors"`
			}
			if err != nil || json.Unmarshal([]byte(out), &rep) != nil {
				return fmt.Errorf("aq gc on %s: exit %d %v: %s", fid, code, err, strings.TrimSpace(errOut))
			}
			row := GCRow{Factory: fid, Run: round, Deleted: counts(rep.Deleted), Kept: counts(rep.Kept), Errors: rep.Errors}
			r.ob.gc = append(r.ob.gc, row)
			label := "first run"
			if round == 2 {
				label = "again"
			}
			r.say("   %s: aq gc (%s) → deleted %s; kept %s", fid, label, describe(row.Deleted), describe(row.Kept))
			for _, e := range rep.Errors {
				r.say("      error: %s", e)
			}
		}
	}
	r.ob.mergedGone = r.ob.merged != "" && r.originRef(ctx, "api", "aq/job/api-health") == ""
	if r.ob.killed != "" {
		z := r.facs[r.ob.killed]
		r.ob.zombieKept = slices.Contains(r.files(ctx, filepath.Join(z.base, "api"), "refs/heads/aq/wip/api-resume"), "step-2-partial.txt")
	}
	r.ob.originAfter = map[string]string{}
	for _, repo := range repoNames {
		for ref, sha := range r.originRefs(ctx, repo) {
			r.ob.originAfter[repo+":"+ref] = sha
		}
	}
	var left []string
	for k := range r.ob.originAfter {
		left = append(left, k)
	}
	sort.Strings(left)
	r.say("   left on origin under aq/: %s", strings.Join(left, " "))
	r.say("   (a job branch whose work is not in main is never deleted; a failed job's WIP waits out AQ_GC_WIP_RETENTION)")
	if r.ob.zombieKept {
		r.say("   %s's local aq/wip/api-resume (the zombie's half-done step 2) is kept: a fenced job's checkpoint waits out AQ_GC_WIP_RETENTION", r.ob.killed)
	}
	return nil
}

func counts(c gc.Counts) map[string]int {
	return map[string]int{"jobBranches": c.JobBranches, "wipRefs": c.WIPRefs, "worktrees": c.Worktrees, "remoteRefs": c.RemoteRefs, "otherRefs": c.OtherRefs}
}

// describe prints counts as "3 worktrees, 2 WIP refs" (or "nothing").
func describe(m map[string]int) string {
	names := []struct{ key, one, many string }{
		{"worktrees", "worktree", "worktrees"}, {"wipRefs", "WIP ref", "WIP refs"}, {"jobBranches", "job branch", "job branches"},
		{"remoteRefs", "origin ref", "origin refs"}, {"otherRefs", "other ref", "other refs"},
	}
	var parts []string
	for _, n := range names {
		switch v := m[n.key]; {
		case v == 1:
			parts = append(parts, "1 "+n.one)
		case v > 1:
			parts = append(parts, fmt.Sprintf("%d %s", v, n.many))
		}
	}
	if len(parts) == 0 {
		return "nothing"
	}
	return strings.Join(parts, ", ")
}

func pidList(pids []int) string {
	s := make([]string, len(pids))
	for i, p := range pids {
		s[i] = fmt.Sprint(p)
	}
	return strings.Join(s, ", ")
}
