package daemon_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/aqfleet/aq/agent/fleet"
	"github.com/aqfleet/aq/agent/jobstate"
	"github.com/aqfleet/aq/agent/runner"
	"github.com/aqfleet/aq/demo/coord"
	"github.com/aqfleet/aq/internal/abandon"
	"github.com/aqfleet/aq/internal/process"
	"github.com/aqfleet/aq/internal/testenv"
	"github.com/aqfleet/aq/job"
)

// orphan leaves behind what an aq killed with -9 mid-job leaves: this
// factory's credentials, a lease on job id (claimed), its record saying
// running with a dead pid, a worktree with uncommitted work, and the job's
// engine still running (tagged). It returns a channel closed when that
// engine exits.
func (r *rig) orphan(id string) <-chan struct{} {
	r.t.Helper()
	ctx := context.Background()
	c, err := fleet.NewClient(fleet.ClientOptions{API: r.api, FactoryID: r.o.factory, Budgets: fastBudgets()})
	if err != nil {
		r.t.Fatal(err)
	}
	c.SetOffer([]string{"os:linux", "engine:script", "has:git", "repo:app"}, []string{"app"})
	if _, err := fleet.EnsureEnrolled(ctx, c, fleet.EnrollOptions{Path: r.cfg.CredentialsFile(), EnvToken: r.stub.EnrollToken(),
		Request: fleet.EnrollRequest{FactoryID: r.o.factory}}); err != nil {
		r.t.Fatal(err)
	}
	cl, err := c.Claim(ctx, false)
	if err != nil || cl == nil || cl.Job.ID != id {
		r.t.Fatalf("claim: %+v %v", cl, err)
	}
	wt := filepath.Join(r.home, "worktrees", "app", id)
	testenv.Git(r.t, filepath.Join(r.base, "app"), "worktree", "add", "-q", "-b", job.JobBranch(id), wt, "main")
	testenv.WriteFile(r.t, filepath.Join(wt, "orphan.txt"), "work the dead aq's engine did\n")

	dead := exec.Command("true")
	if err := dead.Run(); err != nil {
		r.t.Fatal(err)
	}
	recs, err := jobstate.Open(filepath.Join(r.home, "state", "jobs"))
	if err != nil {
		r.t.Fatal(err)
	}
	if err := recs.Put(jobstate.Record{ID: id, Repo: "app", Base: "main", Engine: "script", Stage: job.Building, LeaseEpoch: cl.LeaseEpoch,
		Source: "poll", PID: dead.ProcessState.Pid(), StartedAt: time.Now().UTC()}); err != nil {
		r.t.Fatal(err)
	}
	eng := exec.Command("sleep", "300")
	eng.Env = append(os.Environ(), process.TagEnv+"="+id, process.ScopeEnv+"="+runner.Scope(r.home))
	process.SetGroup(eng)
	if err := eng.Start(); err != nil {
		r.t.Fatal(err)
	}
	gone := make(chan struct{})
	go func() { _ = eng.Wait(); close(gone) }()
	r.t.Cleanup(func() { _ = eng.Process.Kill(); <-gone })
	return gone
}

// Start-up recovery: the orphan's engine is stopped, its worktree
// checkpointed, the WIP ref pushed (the coordinator confirms the lease is
// still this factory's), and /fleet/fail (crash, retryable) sent at the
// recorded epoch — before any new work; the job then runs again here and
// resumes from the checkpoint.
func TestRecoverOrphanBeforeNewWork(t *testing.T) {
	t.Parallel()
	eachRouteSet(t, func(t *testing.T, routes string) {
		r := newRig(t, rigOptions{routes: routes})
		id := testenv.ID("orphan")
		r.submit(id, "app", r.quick(id))
		gone := r.orphan(id)
		r.start()
		select {
		case <-gone:
		case <-time.After(guard):
			t.Fatal("the orphan's engine was not stopped")
		}
		r.waitStage(id, coord.StageShipped)
		k := r.kinds(id)
		fk := failKinds(routes, coord.StageQueued)
		fail := slices.Index(k, fk[0])
		if fail < 0 || !slices.Equal(k[fail:fail+len(fk)], fk) || !slices.Contains(k[fail:], "claimed") || slices.Index(k, "claimed") > fail {
			t.Fatalf("audit %v: want claimed (the dead aq), %v (recovery), claimed (the new run)", k, fk)
		}
		evs := r.stub.Events(id)
		for _, e := range evs {
			if e.Kind == "fail" && e.Detail != string(job.ReasonCrash) {
				t.Fatalf("fail reason %q", e.Detail)
			}
		}
		if r.runs(id) != 1 {
			t.Fatalf("%d runs after recovery", r.runs(id))
		}
		// The new run resumed from the pushed checkpoint: the dead engine's file
		// is in the result.
		files := testenv.TreeFiles(t, r.origins["app"], "refs/heads/"+job.JobBranch(id))
		if !strings.Contains(files["orphan.txt"], "dead aq") || files["result.txt"] == "" {
			t.Fatalf("result files %v", files)
		}
		if st := r.status(); !slices.Contains(st.Recovered, id) {
			t.Fatalf("status %s", dumpJSON(st))
		}
		if err := r.drain(); err != nil {
			t.Fatal(err)
		}
	})
}

// An orphan its aq abandoned after a stop signal (it marked it:
// internal/abandon) is reported interrupted, saying what was abandoned, and
// its record closed so; the mark is gone after.
func TestRecoverAbandonedOrphanIsInterrupted(t *testing.T) {
	t.Parallel()
	r := newRig(t, rigOptions{routes: coord.RouteSets[0]})
	id := testenv.ID("abandoned")
	r.submit(id, "app", r.quick(id))
	r.orphan(id)
	recs, err := jobstate.Open(filepath.Join(r.home, "state", "jobs"))
	if err != nil {
		t.Fatal(err)
	}
	rec, err := recs.Get(id)
	if err != nil {
		t.Fatal(err)
	}
	why := "aq daemon was stopped by SIGTERM and abandoned the step it was in after AQ_STOP_BOUND (2m0s)"
	testenv.WriteFile(t, filepath.Join(abandon.Dir(r.home), id), fmt.Sprintf(`{"pid":%d,"why":%q}`, rec.PID, why))
	r.start()
	r.waitStage(id, coord.StageShipped)
	var fails []string
	for _, e := range r.stub.Events(id) {
		if e.Kind == "fail" {
			fails = append(fails, e.Detail)
		}
	}
	if !slices.Equal(fails, []string{string(job.ReasonInterrupted)}) {
		t.Fatalf("fail reports %v, want [interrupted]", fails)
	}
	if testenv.Exists(filepath.Join(abandon.Dir(r.home), id)) {
		t.Error("the mark outlived the recovery")
	}
	if err := r.drain(); err != nil {
		t.Fatal(err)
	}
}

// A recovered orphan whose lease the coordinator has moved on from (409 on
// the renewal at the recorded epoch): its checkpoint stays local (origin's
// WIP ref is not touched), nothing is reported, the record is closed fenced.
func TestRecoverOrphanFenced(t *testing.T) {
	t.Parallel()
	r := newRig(t, rigOptions{})
	id := testenv.ID("orphan-fenced")
	r.submit(id, "app", r.quick(id))
	gone := r.orphan(id)
	if _, err := r.stub.Action(id, "reject"); err != nil { // the holder is fenced
		t.Fatal(err)
	}
	r.start()
	r.waitFor("the orphan recovered", func() bool { return slices.Contains(r.status().Recovered, id) })
	<-gone
	if k := r.kinds(id); slices.Contains(k, "fail:queued") || slices.Contains(k, "fail:failed") || !slices.Contains(k, "fenced") {
		t.Fatalf("audit %v", k)
	}
	if wip := testenv.RemoteRefs(t, r.origins["app"], "refs/heads/aq/wip/"); len(wip) != 0 {
		t.Fatalf("origin's WIP refs moved: %v", wip)
	}
	local := testenv.Git(t, filepath.Join(r.base, "app"), "rev-parse", "refs/heads/"+job.WIPBranch(id))
	if files := testenv.TreeFiles(t, filepath.Join(r.base, "app"), local); !strings.Contains(files["orphan.txt"], "dead aq") {
		t.Fatalf("local checkpoint %v", files)
	}
	if rec := r.record(id); rec.Running() || !rec.Fenced || rec.Reason != job.ReasonCrash || rec.Checkpoint != local {
		t.Fatalf("record %+v", rec)
	}
	if err := r.drain(); err != nil {
		t.Fatal(err)
	}
}

// Found by the chaos harness (seed 259266473103113): a recovered orphan's
// /fleet/fail met a window in which the coordinator refused reports (503)
// while every other call worked. Recovery had confirmed the lease with one
// renewal and then stopped renewing while the fail was retried, so the lease
// lapsed under a live, connected factory and the reaper, not the fail, freed
// it (the fail came back 409). Recovery now holds the lease until its report
// settles.
func TestRecoverHoldsTheLeaseWhileTheFailIsRetried(t *testing.T) {
	t.Parallel()
	// The factory counts its lease from the Date header less a second and
	// gives it up a second before that: the lease must outlast both.
	ttl := 3 * time.Second
	r := newRig(t, rigOptions{leaseTTL: ttl, parts: func(p *fleet.Parts) {
		b := fastBudgets()
		b.FinalReport = time.Minute
		p.Budgets = &b
	}})
	id := testenv.ID("orphan-patient")
	r.submit(id, "app", r.quick(id))
	gone := r.orphan(id)
	r.stub.SetFaults(1, 0, coord.RouteFail) // every fail refused ...
	go func() {
		for r.stub.Stats().Routes[coord.RouteFail].Status["503"] == 0 {
			time.Sleep(10 * time.Millisecond)
		}
		time.Sleep(2 * ttl) // ... for twice the lease's time to live
		r.stub.SetFaults(0, 0)
	}()
	r.start()
	r.waitFor("the orphan recovered", func() bool { return slices.Contains(r.status().Recovered, id) })
	<-gone
	if k := r.kinds(id); !slices.Contains(k, "fail:queued") || slices.Contains(k, "reaped") {
		t.Fatalf("the reaper took the orphan's lease while its fail was retried: %v", k)
	}
	if r.stub.Stats().Routes[coord.RouteFail].Status["503"] == 0 {
		t.Fatal("no fail was refused")
	}
	if err := r.drain(); err != nil {
		t.Fatal(err)
	}
}

// An orphan whose worktree changed a CI workflow (docs/sandbox.md, "What
// ships is checked"): recovery checkpoints it but does not push it — the
// job's may_change is not known there — and says so in the crash's
// detail; the next run, which resumes from that local checkpoint, refuses
// it too: the job fails protected_change (not retried) and nothing of it
// reaches origin. Without the check, recovery pushed it to aq/wip/<id>
// (a push that runs the repository's on: push workflows).
func TestRecoverOrphanKeepsARefusedCheckpointLocal(t *testing.T) {
	t.Parallel()
	r := newRig(t, rigOptions{})
	id := testenv.ID("orphan-ci")
	r.submit(id, "app", r.quick(id))
	gone := r.orphan(id)
	testenv.WriteFile(t, filepath.Join(r.home, "worktrees", "app", id, ".github", "workflows", "ci.yml"), "on: push\njobs: {}\n")
	r.start()
	select {
	case <-gone:
	case <-time.After(guard):
		t.Fatal("the orphan's engine was not stopped")
	}
	r.waitStage(id, coord.StageFailed, coord.StageDeadLetter)
	var reasons []string
	for _, e := range r.stub.Events(id) {
		if e.Kind == "fail" {
			reasons = append(reasons, e.Detail)
		}
	}
	if !slices.Equal(reasons, []string{string(job.ReasonCrash), string(job.ReasonProtectedChange)}) {
		t.Fatalf("fail reasons %q, want crash (the recovery) then protected_change (the next run)", reasons)
	}
	if refs := testenv.RemoteRefs(t, r.origins["app"], "refs/heads/aq/"); len(refs) != 0 {
		t.Fatalf("origin has %v; want nothing of the job", refs)
	}
	if _, err := testenv.GitErr(filepath.Join(r.base, "app"), "rev-parse", "--verify", "refs/heads/"+job.WIPBranch(id)); err != nil {
		t.Fatalf("the checkpoint is not kept on this host: %v", err)
	}
	if st := r.stage(id); st != coord.StageFailed {
		t.Fatalf("stage %s, want failed (not retried)", st)
	}
}
