package selftest

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/aqfleet/aq/agent/fleet"
	"github.com/aqfleet/aq/demo/coord"
	"github.com/aqfleet/aq/internal/brief"
	"github.com/aqfleet/aq/internal/fixture"
	"github.com/aqfleet/aq/job"
)

// fleetSetup starts a world with repository app and a stub with o, for a
// fleet scenario; the stub is killed when the scenario ends (stop).
func fleetSetup(ctx context.Context, s *session, name string, o coord.Options) (*world, func()) {
	wd, err := s.ws.newWorld(ctx, name, "app")
	if err != nil {
		s.setupFailed(err)
		return nil, nil
	}
	st, err := startStub(ctx, o, "127.0.0.1:0")
	if err != nil {
		s.setupFailed(fmt.Errorf("the coordinator stub: %w", err))
		return nil, nil
	}
	wd.st = st
	return wd, func() { wd.st.Kill() }
}

// await waits for a run started in the background.
func await(ctx context.Context, done <-chan runResult) (*fleet.Result, error) {
	select {
	case r := <-done:
		if r.err == nil && r.res == nil {
			r.err = errNoResult
		}
		return r.res, r.err
	case <-ctx.Done():
		return nil, fmt.Errorf("the fleet run did not end: %v", context.Cause(ctx))
	}
}

type runResult struct {
	res *fleet.Result
	err error
}

func (f *factory) runOnceBackground(ctx context.Context) <-chan runResult {
	done := make(chan runResult, 1)
	go func() {
		r, err := f.runOnce(ctx)
		done <- runResult{r, err}
	}()
	return done
}

func fleetText(r *fleet.Result) string {
	if r == nil {
		return "no result"
	}
	s := fmt.Sprintf("%s, report %s", r.Stage, r.Report)
	if r.Outcome.Reason != "" {
		s += fmt.Sprintf(" (%s: %s)", r.Outcome.Reason, r.Outcome.Detail)
	}
	return s
}

// --- enroll, run, heartbeat, auth, retries -----------------------------------------

func fleetBasicScenario() *scenario {
	g := GroupPipeline
	return &scenario{name: "fleet-basic", group: g, workspace: true, checks: []Check{
		check(g, "pipeline.fleet.enroll", "a factory trades the enrollment token for its own, stored 0600 in $AQ_HOME/credentials"),
		check(g, "pipeline.fleet.run-once", "aq run --once in fleet mode: one claim, the job run and shipped, the final report delivered"),
		check(g, "pipeline.fleet.heartbeat", "the factory's heartbeats reach the coordinator, which sees it fresh"),
		check(g, "pipeline.fleet.auth-refused", "a refused token (401) is an auth error at once, never retried"),
		check(g, "pipeline.fleet.retry-503", "503 answers are retried with backoff until the coordinator answers"),
	}, run: func(ctx context.Context, s *session) {
		wd, stop := fleetSetup(ctx, s, "fleet-basic", coord.Options{})
		if wd == nil {
			return
		}
		defer stop()
		var f *factory
		if !s.step(ctx, "pipeline.fleet.enroll", 20*time.Second, func(ctx context.Context) (string, error) {
			var err error
			if f, err = wd.newFactory(ctx, "selftest-one", nil); err != nil {
				return "", err
			}
			creds, err := f.enroll(ctx)
			if err != nil {
				return "", err
			}
			path := f.cfg.CredentialsFile()
			if m := fileMode(path); m != 0o600 {
				return "", failf("%s is mode %04o, want 0600", path, m)
			}
			if creds.FactoryID != f.id || creds.Token == "" || creds.Token == wd.st.EnrollToken() {
				return "", failf("credentials for %q, a new token %v", creds.FactoryID, creds.Token != wd.st.EnrollToken())
			}
			return fmt.Sprintf("enrolled as %s; its own token stored in credentials (0600)", creds.FactoryID), nil
		}) {
			return
		}
		var res *fleet.Result
		one, two := f.jobID("one"), f.jobID("two")
		if !s.step(ctx, "pipeline.fleet.run-once", 30*time.Second, func(ctx context.Context) (string, error) {
			for _, id := range []string{one, two} {
				if err := wd.submit(ctx, id, "repo: app\nengine: script\nscript: \"echo "+id+" > out.txt\"\nship: branch"); err != nil {
					return "", err
				}
			}
			var err error
			if res, err = f.runOnce(ctx); err != nil {
				return "", err
			}
			if res == nil || res.Outcome.Failed() || res.Stage != job.Shipped || res.Report != "delivered" || res.LeaseEpoch != 1 {
				return "", failf("ended %s, want shipped with the report delivered at epoch 1", fleetText(res))
			}
			if n := wd.st.Stats().Count(coord.RouteClaim); n != 1 {
				return "", failf("%d claims, want exactly 1", n)
			}
			j, _ := wd.st.Job(res.JobID)
			if j.Stage != coord.StageShipped || j.Holder != "" || j.Branch != job.JobBranch(res.JobID) || j.Checkpoint == "" {
				return "", failf("the coordinator has the job %s (holder %q, branch %q)", j.Stage, j.Holder, j.Branch)
			}
			other := two
			if res.JobID == two {
				other = one
			}
			if o, _ := wd.st.Job(other); o.Stage != coord.StageQueued {
				return "", failf("the other job is %s, want still queued", o.Stage)
			}
			refs, err := s.ws.remoteRefs(ctx, wd.origins["app"], "refs/heads/aq/job/")
			if err != nil || refs["refs/heads/"+job.JobBranch(res.JobID)] == "" {
				return "", failf("%s is not on origin (%v)", job.JobBranch(res.JobID), err)
			}
			return fmt.Sprintf("one claim; %s shipped at epoch 1, branch on origin, report delivered; the other job still queued", res.JobID), nil
		}) {
			return
		}
		s.step(ctx, "pipeline.fleet.heartbeat", 10*time.Second, func(ctx context.Context) (string, error) {
			n := wd.st.Stats().Count(coord.RouteHeartbeat)
			for _, fa := range wd.st.Factories() {
				if fa.ID == f.id {
					if fa.Stale || fa.LastHeartbeatAt.IsZero() || n < 1 {
						return "", failf("the coordinator sees %s stale %v, last heartbeat %v (%d heartbeats)", f.id, fa.Stale, fa.LastHeartbeatAt, n)
					}
					return fmt.Sprintf("heartbeats received: %d; the coordinator sees %s fresh", n, f.id), nil
				}
			}
			return "", failf("the coordinator does not know %s", f.id)
		})
		s.step(ctx, "pipeline.fleet.auth-refused", 10*time.Second, func(ctx context.Context) (string, error) {
			c, err := fleet.NewClient(fleet.ClientOptions{API: wd.st.API, Token: "aqf_not_a_token_" + fixture.RandomHex(6), FactoryID: "selftest-intruder", Budgets: fastBudgets()})
			if err != nil {
				return "", err
			}
			before := wd.st.Stats().Routes[coord.RouteHeartbeat].Status["401"]
			err = c.Heartbeat(ctx, fleet.HeartbeatRequest{FactoryID: "selftest-intruder"})
			var ae *fleet.AuthError
			if !errors.As(err, &ae) {
				return "", failf("a heartbeat with a bad token: %v, want an auth error", err)
			}
			if n := wd.st.Stats().Routes[coord.RouteHeartbeat].Status["401"] - before; n != 1 {
				return "", failf("the refused call was sent %d times, want once (4xx is never retried)", n)
			}
			return "401 on the first try, not retried: " + err.Error(), nil
		})
		s.step(ctx, "pipeline.fleet.retry-503", 20*time.Second, func(ctx context.Context) (string, error) {
			wd.st.SetFaults(1, 0, coord.RouteQueueState)
			got := make(chan error, 1)
			go func() {
				_, err := f.agent.Client.QueueState(ctx)
				got <- err
			}()
			n503 := func() int64 { return wd.st.Stats().Routes[coord.RouteQueueState].Status["503"] }
			werr := fixture.WaitFor(ctx, "a 503", func() bool { return n503() >= 2 })
			wd.st.SetFaults(0, 0)
			if err := <-got; err != nil {
				return "", failf("the call failed instead of being retried: %v", err)
			}
			if werr != nil {
				return "", werr
			}
			return fmt.Sprintf("answered 503 %d times, retried with backoff, then 200", n503()), nil
		})
	}}
}

// --- fencing ---------------------------------------------------------------------

func fleetFenceScenario() *scenario {
	g := GroupPipeline
	return &scenario{name: "fleet-fence", group: g, workspace: true, checks: []Check{
		check(g, "pipeline.fleet.fenced", "a job requeued while it runs is fenced: the renewal's 409 stops the engine, reason fenced (aq run exits 4)"),
		check(g, "pipeline.fleet.fenced-no-push", "a fenced job pushes nothing to origin: no job branch, no WIP ref"),
		check(g, "pipeline.fleet.fenced-checkpoint", "a fenced job's work is checkpointed to aq/wip/<id> locally"),
		check(g, "pipeline.fleet.fenced-silent", "after the 409 the fenced factory sends nothing more for the job"),
	}, run: func(ctx context.Context, s *session) {
		wd, stop := fleetSetup(ctx, s, "fleet-fence", coord.Options{LeaseTTL: 30 * time.Second})
		if wd == nil {
			return
		}
		defer stop()
		var f *factory
		var res *fleet.Result
		var id string
		if !s.step(ctx, "pipeline.fleet.fenced", 45*time.Second, func(ctx context.Context) (string, error) {
			var err error
			if f, err = wd.newFactory(ctx, "selftest-holder", nil); err != nil {
				return "", err
			}
			id = f.jobID("victim")
			done, _, err := wd.runWaiting(ctx, f, id, "branch")
			if err != nil {
				return "", err
			}
			if _, err := wd.st.Action(id, "requeue"); err != nil {
				return "", err
			}
			if res, err = await(ctx, done); err != nil {
				return "", err
			}
			if !res.Fenced || res.Outcome.Reason != job.ReasonFenced || res.Report != "none" {
				return "", failf("after the requeue the run ended %s, want fenced with no report", fleetText(res))
			}
			return "requeued while running: the next renewal or live log chunk got 409, the engine was stopped, the job ended fenced: " + res.Outcome.Detail, nil
		}) {
			return
		}
		s.step(ctx, "pipeline.fleet.fenced-no-push", 10*time.Second, func(ctx context.Context) (string, error) {
			refs, err := s.ws.remoteRefs(ctx, wd.origins["app"], "refs/heads/aq/")
			if err != nil {
				return "", err
			}
			if len(refs) > 0 {
				return "", failf("the fenced factory pushed %v", sortedKeys(refs))
			}
			if j, _ := wd.st.Job(id); j.Branch != "" || j.Stage != coord.StageQueued || j.LeaseEpoch != 2 {
				return "", failf("the coordinator has the job %s at epoch %d with branch %q", j.Stage, j.LeaseEpoch, j.Branch)
			}
			return "origin has no aq/ ref; the job is queued at epoch 2 for another factory", nil
		})
		s.step(ctx, "pipeline.fleet.fenced-checkpoint", 10*time.Second, func(ctx context.Context) (string, error) {
			repo := f.repo("app")
			wip := s.ws.revParse(ctx, repo, "refs/heads/"+job.WIPBranch(id))
			if wip == "" || res.Outcome.Checkpoint != wip {
				return "", failf("local %s is %q, the outcome's checkpoint %q", job.WIPBranch(id), wip, res.Outcome.Checkpoint)
			}
			if !s.ws.treeHas(ctx, repo, wip, "partial.txt") {
				return "", failf("the checkpoint lacks the engine's partial.txt")
			}
			return fmt.Sprintf("the engine's partial.txt is kept in the local %s (%.10s)", job.WIPBranch(id), wip), nil
		})
		s.step(ctx, "pipeline.fleet.fenced-silent", 10*time.Second, func(ctx context.Context) (string, error) {
			evs := wd.st.Events(id)
			first := slices.IndexFunc(evs, func(e coord.Event) bool { return e.Kind == "fenced" && e.Factory == f.id })
			if first < 0 {
				return "", failf("the coordinator recorded no 409 for %s", f.id)
			}
			for _, e := range evs[first+1:] {
				if e.Factory == f.id {
					return "", failf("after the 409 the fenced factory called again: %s %s", e.Kind, e.Call)
				}
			}
			return fmt.Sprintf("one 409 (%s), then no call from %s for the job", evs[first].Call, f.id), nil
		})
	}}
}

// --- /fleet/fail ---------------------------------------------------------------------

func fleetFailScenario() *scenario {
	g := GroupPipeline
	return &scenario{name: "fleet-fail", group: g, workspace: true, checks: []Check{
		check(g, "pipeline.fleet.fail-frees-lease", "a failed job is reported with /fleet/fail and its lease is free at once (no reaper)"),
		check(g, "pipeline.fleet.dead-letter", "another factory takes the retry at once; retries spent, the coordinator dead-letters it"),
		check(g, "pipeline.fleet.invalid-manifest", "a job whose manifest does not validate fails invalid_manifest and is not retried"),
	}, run: func(ctx context.Context, s *session) {
		wd, stop := fleetSetup(ctx, s, "fleet-fail", coord.Options{LeaseTTL: time.Hour, ReapEvery: time.Hour, MaxBackoff: time.Millisecond})
		if wd == nil {
			return
		}
		defer stop()
		var f1 *factory
		var id string
		if !s.step(ctx, "pipeline.fleet.fail-frees-lease", 30*time.Second, func(ctx context.Context) (string, error) {
			var err error
			if f1, err = wd.newFactory(ctx, "selftest-first", nil); err != nil {
				return "", err
			}
			id = f1.jobID("flaky")
			if err := wd.submit(ctx, id, "repo: app\nengine: script\nscript: \"exit 3\"\nretry: { max: 1 }"); err != nil {
				return "", err
			}
			res, err := f1.runOnce(ctx)
			if err != nil {
				return "", err
			}
			if res.Outcome.Reason != job.ReasonEngineFailed || res.Report != "delivered" || res.Stage != job.Inbox {
				return "", failf("ended %s, want engine_failed, delivered, back in the queue", fleetText(res))
			}
			j, _ := wd.st.Job(id)
			if j.Stage != coord.StageQueued || j.Holder != "" || !j.LeaseExpiresAt.IsZero() || j.Attempts != 1 {
				return "", failf("after /fleet/fail the coordinator has the job %s, holder %q, lease until %v", j.Stage, j.Holder, j.LeaseExpiresAt)
			}
			if n := wd.st.Reap(time.Now()); n != 0 {
				return "", failf("the reaper found %d leases to reap", n)
			}
			return "engine_failed reported with /fleet/fail: queued again with no holder and no lease, without the reaper", nil
		}) {
			return
		}
		s.step(ctx, "pipeline.fleet.dead-letter", 30*time.Second, func(ctx context.Context) (string, error) {
			_, res, err := wd.takeOver(ctx, "selftest-second", id)
			if err != nil {
				return "", err
			}
			if res.JobID != id || res.LeaseEpoch != 2 || res.Attempt != 2 || res.Stage != job.DeadLetter {
				return "", failf("the second factory's run: %s at epoch %d attempt %d, want %s dead_letter at epoch 2", fleetText(res), res.LeaseEpoch, res.Attempt, id)
			}
			return "claimed at once by a second factory (epoch 2), failed again: dead_letter", nil
		})
		s.step(ctx, "pipeline.fleet.invalid-manifest", 30*time.Second, func(ctx context.Context) (string, error) {
			bad := f1.jobID("broken")
			text := "---\nid: " + bad + "\nrepo: app\nengine: script\nscript: \"true\"\nnosuchkey: 1\n---\n# broken\n"
			op, err := wd.operator()
			if err != nil {
				return "", err
			}
			if _, err := op.Submit(ctx, &job.Job{ID: bad, Repo: "app", Engine: "script", Capabilities: []string{}}, []byte(text)); err != nil {
				return "", err
			}
			res, err := f1.runOnce(ctx)
			if err != nil {
				return "", err
			}
			if res.JobID != bad || res.Outcome.Reason != job.ReasonInvalidManifest || !strings.Contains(res.Outcome.Detail, "nosuchkey") {
				return "", failf("ended %s, want invalid_manifest naming nosuchkey", fleetText(res))
			}
			if j, _ := wd.st.Job(bad); j.Stage != coord.StageFailed {
				return "", failf("the coordinator has it %s, want failed (not retried)", j.Stage)
			}
			return "invalid_manifest (" + brief.FirstLine(res.Outcome.Detail, 0) + "): failed, not retried", nil
		})
	}}
}

// --- the report spool ------------------------------------------------------------------

func fleetSpoolScenario() *scenario {
	g := GroupPipeline
	return &scenario{name: "fleet-spool", group: g, workspace: true, checks: []Check{
		check(g, "pipeline.fleet.spool", "reports the coordinator cannot take (503s, then the coordinator dies mid-job) wait in the spool"),
		check(g, "pipeline.fleet.spool-order", "when the coordinator is back, the next start delivers the spooled reports in order"),
	}, run: func(ctx context.Context, s *session) {
		wd, err := s.ws.newWorld(ctx, "fleet-spool", "app")
		if err != nil {
			s.setupFailed(err)
			return
		}
		opts := coord.Options{StateFile: filepath.Join(wd.dir, "coord.json"), LeaseTTL: time.Minute, FailRate: 1, FaultRoutes: []string{coord.RoutePatch}}
		st1, err := startStub(ctx, opts, "127.0.0.1:0")
		if err != nil {
			s.setupFailed(err)
			return
		}
		wd.st = st1
		defer func() { wd.st.Kill() }()
		var f *factory
		var id string
		if !s.step(ctx, "pipeline.fleet.spool", 45*time.Second, func(ctx context.Context) (string, error) {
			if f, err = wd.newFactory(ctx, "selftest-survivor", nil); err != nil {
				return "", err
			}
			id = f.jobID("durable")
			done, goFile, err := wd.runWaiting(ctx, f, id, "none")
			if err != nil {
				return "", err
			}
			st1.Kill() // the coordinator dies mid-job
			if err := fixture.WriteFile(goFile, "go"); err != nil {
				return "", err
			}
			res, err := await(ctx, done)
			if err != nil {
				return "", err
			}
			if res.Outcome.Failed() || res.Stage != job.Testing || res.Report != "spooled" {
				return "", failf("ended %s, want testing with the report spooled", fleetText(res))
			}
			reps, _ := f.agent.Reporter.Spool.Pending()
			if len(reps) != 2 || reps[0].Patch == nil || reps[0].Patch.Stage != "building" || reps[1].Patch == nil || reps[1].Patch.Stage != "testing" {
				return "", failf("the spool holds %d reports, want building then testing", len(reps))
			}
			return "building refused (503), then the coordinator died: both reports wait in the spool, in order", nil
		}) {
			return
		}
		s.step(ctx, "pipeline.fleet.spool-order", 45*time.Second, func(ctx context.Context) (string, error) {
			opts.FailRate = 0
			st2, err := startStub(ctx, opts, st1.Addr)
			if err != nil {
				return "", err
			}
			wd.st = st2
			if j, _ := st2.Job(id); j.Stage != coord.StageAssigned || j.Holder != f.id {
				return "", failf("the restarted coordinator has the job %s held by %q", j.Stage, j.Holder)
			}
			if err := f.build(); err != nil { // aq starts again
				return "", err
			}
			res, err := f.runOnce(ctx)
			if !errors.Is(err, fleet.ErrNoJob) || res != nil {
				return "", failf("the restart: %v %v, want no job", err, fleetText(res))
			}
			if d := f.agent.Reporter.Spool.Depth(); d != 0 {
				return "", failf("%d reports are left in the spool", d)
			}
			var order []string
			for _, e := range st2.Events(id) {
				if e.Kind == "stage" {
					order = append(order, e.Stage)
				}
			}
			if !slices.Equal(order, []string{"building", "testing"}) {
				return "", failf("the reports arrived as %v, want building, testing", order)
			}
			if j, _ := st2.Job(id); j.Stage != coord.StageTesting || j.Checkpoint == "" {
				return "", failf("the coordinator has the job %s (checkpoint %q)", j.Stage, j.Checkpoint)
			}
			return "the coordinator came back from its state file; the next start delivered building, then testing; the spool is empty", nil
		})
	}}
}

// --- the gated poll ------------------------------------------------------------------

func fleetGateScenario() *scenario {
	g := GroupPipeline
	return &scenario{name: "fleet-gate", group: g, workspace: true, checks: []Check{
		check(g, "pipeline.fleet.gate-idle", "the gated poll reads queue-state each tick and makes no claim while its version does not move"),
		check(g, "pipeline.fleet.gate-wakes", "a new job moves the version and the next tick claims it"),
	}, run: func(ctx context.Context, s *session) {
		wd, stop := fleetSetup(ctx, s, "fleet-gate", coord.Options{})
		if wd == nil {
			return
		}
		defer stop()
		var f *factory
		var p *fleet.Poller
		const ticks = 10
		if !s.step(ctx, "pipeline.fleet.gate-idle", 20*time.Second, func(ctx context.Context) (string, error) {
			var err error
			if f, err = wd.newFactory(ctx, "selftest-gated", nil); err != nil {
				return "", err
			}
			if _, err := f.enroll(ctx); err != nil {
				return "", err
			}
			f.agent.Client.SetOffer([]string{"os:linux", "engine:script"}, []string{"app"})
			p = &fleet.Poller{Client: f.agent.Client, Base: time.Second, Gate: true}
			wd.st.ResetStats()
			for range ticks {
				cl, err := p.Tick(ctx)
				if cl != nil || err != nil {
					return "", failf("an idle tick: claim %v, %v", cl != nil, err)
				}
			}
			st := wd.st.Stats()
			if st.Count(coord.RouteQueueState) != ticks || st.Count(coord.RouteClaim) != 1 {
				return "", failf("%d ticks: %d queue-state reads, %d claims; want %d and 1 (the first tick)", ticks, st.Count(coord.RouteQueueState), st.Count(coord.RouteClaim), ticks)
			}
			return fmt.Sprintf("%d idle ticks: %d queue-state reads, 1 claim (the first)", ticks, ticks), nil
		}) {
			return
		}
		s.step(ctx, "pipeline.fleet.gate-wakes", 20*time.Second, func(ctx context.Context) (string, error) {
			id := f.jobID("fresh")
			if err := wd.submit(ctx, id, "repo: app\nengine: script\nscript: \"true\""); err != nil {
				return "", err
			}
			cl, err := p.Tick(ctx)
			if err != nil || cl == nil || cl.Job.ID != id {
				return "", failf("the tick after a submit: claim %v, %v; want %s", cl != nil, err, id)
			}
			_ = f.agent.Client.Release(ctx, id, cl.LeaseEpoch)
			return fmt.Sprintf("the version moved; the next tick claimed %s (2 claims in all)", id), nil
		})
	}}
}

// --- resuming on another host -------------------------------------------------------

func fleetResumeScenario() *scenario {
	g := GroupPipeline
	return &scenario{name: "fleet-resume", group: g, workspace: true, checks: []Check{
		check(g, "pipeline.fleet.wip-pushed", "a fleet job's checkpoint is pushed to origin as aq/wip/<id> while it holds the lease"),
		check(g, "pipeline.fleet.resume-other-host", "the next factory (another home, another clone) resumes from that checkpoint and ships"),
	}, run: func(ctx context.Context, s *session) {
		wd, stop := fleetSetup(ctx, s, "fleet-resume", coord.Options{LeaseTTL: time.Hour, ReapEvery: time.Hour, MaxBackoff: time.Millisecond})
		if wd == nil {
			return
		}
		defer stop()
		var id string
		var res1 *fleet.Result
		if !s.step(ctx, "pipeline.fleet.wip-pushed", 30*time.Second, func(ctx context.Context) (string, error) {
			f1, err := wd.newFactory(ctx, "selftest-host-a", nil)
			if err != nil {
				return "", err
			}
			id = f1.jobID("handoff")
			twoSteps := "if [ -f step-1.txt ]; then echo two > step-2.txt; else echo one > step-1.txt; exit 1; fi"
			if err := wd.submit(ctx, id, "repo: app\nengine: script\nretry: { max: 1 }\nship: branch\n"+yamlBlock("script", twoSteps)); err != nil {
				return "", err
			}
			if res1, err = f1.runOnce(ctx); err != nil {
				return "", err
			}
			if res1.Outcome.Reason != job.ReasonEngineFailed || !res1.Outcome.WIPPushed {
				return "", failf("the first attempt ended %s, WIP pushed %v", fleetText(res1), res1.Outcome.WIPPushed)
			}
			refs, err := s.ws.remoteRefs(ctx, wd.origins["app"], "refs/heads/aq/wip/")
			if err != nil {
				return "", err
			}
			j, _ := wd.st.Job(id)
			if refs["refs/heads/"+job.WIPBranch(id)] != res1.Outcome.Checkpoint || j.Checkpoint != res1.Outcome.Checkpoint {
				return "", failf("origin's WIP %q, the coordinator's checkpoint %q, the run's %q", refs["refs/heads/"+job.WIPBranch(id)], j.Checkpoint, res1.Outcome.Checkpoint)
			}
			return fmt.Sprintf("attempt 1 failed after step 1; its checkpoint %.10s is on origin and recorded by the coordinator", res1.Outcome.Checkpoint), nil
		}) {
			return
		}
		s.step(ctx, "pipeline.fleet.resume-other-host", 30*time.Second, func(ctx context.Context) (string, error) {
			f2, res, err := wd.takeOver(ctx, "selftest-host-b", id)
			if err != nil {
				return "", err
			}
			if res.JobID != id || res.Outcome.Failed() || res.Stage != job.Shipped || res.Attempt != 2 {
				return "", failf("the second factory's run: %s (attempt %d)", fleetText(res), res.Attempt)
			}
			repo := f2.repo("app")
			br := job.JobBranch(id)
			if !s.ws.treeHas(ctx, repo, br, "step-1.txt") || !s.ws.treeHas(ctx, repo, br, "step-2.txt") {
				return "", failf("%s lacks step-1.txt or step-2.txt: the second factory did not resume", br)
			}
			return "another factory fetched aq/wip from origin, found step 1 done, did step 2 and shipped (attempt 2)", nil
		})
	}}
}
