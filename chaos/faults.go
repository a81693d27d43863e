//go:build linux

package chaos

import (
	"context"
	"fmt"
	"os"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/aqfleet/aq/agent/runner"
	"github.com/aqfleet/aq/internal/process"
)

// runSchedule injects each fault at its time (faults on different targets
// overlap), and returns when all of them are over: every target is back.
func (r *harness) runSchedule(ctx context.Context, sched []Fault, t0 time.Time) {
	var wg sync.WaitGroup
	for _, f := range sched {
		if d := time.Until(t0.Add(f.At)); d > 0 {
			select {
			case <-ctx.Done():
				wg.Wait()
				return
			case <-time.After(d):
			}
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			rec := r.inject(ctx, f)
			r.mu.Lock()
			r.faults = append(r.faults, rec)
			r.mu.Unlock()
		}()
	}
	wg.Wait()
}

// sleepCtx sleeps d unless ctx ends first; the fault's restore step runs
// either way (a cancelled run still heals what it broke before teardown).
func sleepCtx(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}

// stragglerWait bounds how long KindKill9Sandboxed waits for an engine
// with its straggler up: a loaded host runs a few jobs a second at best,
// a quarter of them with a straggler, each up for a second or two.
const stragglerWait = time.Minute

func (r *harness) inject(ctx context.Context, f Fault) FaultRecord {
	rec := FaultRecord{Fault: f}
	if f.factoryFault() && f.Kind != KindKill9Sandboxed { // that one picks its factory (lockStraggler)
		fa := r.facts[f.Target]
		fa.faultMu.Lock()
		defer fa.faultMu.Unlock()
	}
	switch f.Kind {
	case KindKill9:
		fa := r.facts[f.Target]
		rec.Running = fa.waitBusy(30 * time.Second) // the coverage check wants it mid-job
		rec.Start = time.Now().UTC()
		c := fa.take()
		r.logf("FAULT kill -9 %s (running %d jobs)", fa.id, rec.Running)
		if c != nil {
			c.kill()
			c.wait()
			fa.exited(c, "kill -9")
		}
		sleepCtx(ctx, f.Down)
		r.restart(fa, &rec)
	case KindKill9Sandboxed:
		if !r.stragglers {
			rec.Start = time.Now().UTC()
			rec.End, rec.Detail = rec.Start, "not run: "+r.res.SandboxWhy
			r.logf("FAULT kill -9 %s under a sandboxed engine: not run (%s)", r.facts[f.Target].id, r.res.SandboxWhy)
			break
		}
		var run string
		var n int
		rec.Target, run, n = r.lockStraggler(f.Target, stragglerWait)
		fa := r.facts[rec.Target]
		defer fa.faultMu.Unlock()
		rec.Running = fa.waitBusy(time.Second)
		rec.Start = time.Now().UTC()
		if run != "" {
			rec.Job = run
			rec.Detail = "killed while the straggler of " + run + " was up"
		} else {
			rec.Detail = "no engine of any factory had a straggler up within " + stragglerWait.String()
		}
		r.logf("FAULT kill -9 %s under a sandboxed engine (running %d jobs; %s, %d stragglers up)", fa.id, rec.Running, rec.Detail, n)
		if c := fa.take(); c != nil {
			c.kill()
			c.wait()
			fa.exited(c, "kill -9")
		}
		sleepCtx(ctx, f.Down)
		r.restart(fa, &rec)
	case KindTerm, KindAbort:
		fa := r.facts[f.Target]
		rec.Running = fa.waitBusy(8 * time.Second)
		rec.Start = time.Now().UTC()
		c := fa.take()
		if c != nil {
			fa.waitUp(c, 30*time.Second)
			c.signal(syscall.SIGTERM)
			if f.Kind == KindAbort {
				r.logf("FAULT SIGTERM x2 %s (running %d jobs)", fa.id, rec.Running)
				sleepCtx(ctx, 300*time.Millisecond+f.Down/4)
				c.signal(syscall.SIGTERM)
			} else {
				r.logf("FAULT SIGTERM %s (running %d jobs; drain, escalating after %s)", fa.id, rec.Running, r.cfg.DrainTimeout)
			}
			if !c.waitFor(r.cfg.DrainTimeout + 2*time.Minute) {
				r.problem("factory %s did not stop within its drain timeout + 2 min after %s; killed", fa.id, f.Kind)
				c.killGroup()
				c.wait()
			}
			fa.exited(c, f.Kind)
			rec.Detail = fmt.Sprintf("exit %d after %s", c.code, time.Since(rec.Start).Round(100*time.Millisecond))
			if c.code != 0 {
				r.problem("factory %s exited %d %s after %s (want 0)", fa.id, c.code, c.sig, f.Kind)
			}
		}
		sleepCtx(ctx, f.Down)
		r.restart(fa, &rec)
	case KindHostLost:
		fa := r.facts[f.Target]
		rec.Running = fa.waitBusy(8 * time.Second)
		rec.Start = time.Now().UTC()
		r.logf("FAULT host lost: %s (running %d jobs): every process of the host killed -9, its AQ_HOME and clones deleted", fa.id, rec.Running)
		r.loseHost(fa)
		sleepCtx(ctx, f.Down)
		if err := r.sb.cloneAll(fa.src); err != nil {
			r.problem("cannot clone %s's repositories again: %v", fa.id, err)
		}
		r.restart(fa, &rec)
		rec.Detail = "came back as a fresh host: new clones, enrolled again"
	case KindPreempt:
		fa := r.facts[f.Target]
		rec.Running = fa.waitBusy(8 * time.Second)
		rec.Start = time.Now().UTC()
		rec.Job = fa.runningJob()
		if rec.Job == "" {
			rec.Detail = "nothing was running to preempt"
			rec.End = rec.Start
			break
		}
		r.logf("FAULT preempt %s on %s: the stub requeues it (epoch bumped)", rec.Job, fa.id)
		if _, err := r.stubCall(ctx, "POST", "/fleet/jobs/"+rec.Job+"/actions/requeue", []byte("{}"), 30*time.Second); err != nil {
			rec.Detail = "requeue refused: " + err.Error() // it ended meanwhile
		}
		rec.End = time.Now().UTC()
	case KindPeer:
		rec.Start = time.Now().UTC()
		r.logf("FAULT broker peer killed (down %s)", f.Down.Round(100*time.Millisecond))
		r.peer.Kill()
		sleepCtx(ctx, f.Down)
		if err := r.peer.Restart(); err != nil {
			r.problem("cannot restart the broker peer: %v", err)
		}
		rec.End = time.Now().UTC()
	case KindStub:
		rec.Start = time.Now().UTC()
		r.logf("FAULT coordinator stub killed (down %s)", f.Down.Round(100*time.Millisecond))
		r.killCoord()
		sleepCtx(ctx, f.Down)
		if err := r.startCoord(); err != nil {
			r.problem("cannot restart the coordinator stub: %v", err)
		}
		rec.End = time.Now().UTC()
	case KindErrors, KindReports:
		rec.Start = time.Now().UTC()
		routes := factoryRoutes
		if f.Kind == KindReports {
			routes = reportRoutes // f.Latency is 0
			r.logf("FAULT stub answers 503 for %.0f%% of reports (PATCH, /fleet/fail) for %s; every other call works", f.Rate*100, f.Down.Round(100*time.Millisecond))
		} else {
			r.logf("FAULT stub answers 503 for %.0f%% of factory calls, +%s latency, for %s", f.Rate*100, f.Latency, f.Down.Round(100*time.Millisecond))
		}
		if err := r.setFaults(f.Rate, f.Latency, routes); err != nil {
			r.problem("cannot set the stub's faults: %v", err)
		}
		sleepCtx(ctx, f.Down)
		if err := r.setFaults(0, 0, factoryRoutes); err != nil {
			r.problem("cannot clear the stub's faults: %v", err)
		}
		rec.End = time.Now().UTC()
	case KindPartition:
		fa := r.facts[f.Target]
		rec.Running = fa.waitBusy(30 * time.Second)
		rec.Start = time.Now().UTC()
		r.logf("FAULT partition %s (running %d jobs) for %s", fa.id, rec.Running, f.Down.Round(100*time.Millisecond))
		if err := r.net.Cut(f.Target); err != nil {
			r.problem("cannot cut %s off: %v", fa.id, err)
		}
		sleepCtx(ctx, f.Down)
		if err := r.net.Heal(f.Target); err != nil {
			r.problem("cannot reconnect %s: %v", fa.id, err)
		}
		rec.End = time.Now().UTC()
		r.logf("partition of %s healed", fa.id)
	}
	return rec
}

func (r *harness) restart(fa *factory, rec *FaultRecord) {
	if err := r.startFactory(fa); err != nil {
		r.problem("cannot restart %s: %v", fa.id, err)
	}
	rec.End = time.Now().UTC()
	r.logf("%s restarted (incarnation %d)", fa.id, fa.incarnation)
}

// loseHost kills -9 every process of factory fa's host — its daemon, the
// engines' supervisors and the engines — and deletes its AQ_HOME and
// clones: nothing of the host survives but what it pushed and reported.
func (r *harness) loseHost(fa *factory) {
	scope := runner.Scope(fa.home)
	supervisor := func(kv string) bool {
		return strings.HasPrefix(kv, process.SuperviseEnv+"=") && strings.Contains(kv, `"scope":"`+scope+`"`)
	}
	for _, pid := range findEnv(supervisor) {
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
	if c := fa.take(); c != nil {
		c.kill()
		c.wait()
		fa.exited(c, "host lost")
	}
	for _, pid := range findScope(scope) {
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
	for _, dir := range []string{fa.home, fa.src} {
		if err := os.RemoveAll(dir); err != nil {
			r.problem("cannot delete %s of the lost host %s: %v", dir, fa.id, err)
		}
	}
}
