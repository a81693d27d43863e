package scaledemo

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/aqfleet/aq/demo"
	"github.com/aqfleet/aq/demo/coord"
	"github.com/aqfleet/aq/job"
)

// The jobs: quick ones hold until the gate opens (so the burst is seen at
// its peak); the long one leaves work, waits to be killed, and on its
// second run finds the work it left (resumed from the pushed checkpoint).
const quickScript = `cat > /dev/null
echo "$AQ_FACTORY_ID" > "$AQ_DEMO_SIGNALS/%[1]s.start"
printf 'change %[1]s\n' > %[1]s.txt
i=0; while [ ! -e "$AQ_DEMO_SIGNALS/gate" ] && [ $i -lt 1200 ]; do sleep 0.1; i=$((i+1)); done
echo "::aq-usage tokens_in=900 tokens_out=200 cost_usd=0.004 turns=1"`

const longScript = `cat > /dev/null
if [ -e resume.txt ]; then
  echo "resumed by $AQ_FACTORY_ID" >> resume.txt
  exit 0
fi
echo "first half, by $AQ_FACTORY_ID" > resume.txt
echo "$AQ_FACTORY_ID" > "$AQ_DEMO_SIGNALS/%[1]s.start"
i=0; while [ $i -lt 1200 ]; do sleep 0.1; i=$((i+1)); done`

func manifest(id, script string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "---\nid: %s\ntitle: %s\nrepo: %s\nengine: script\nship: branch\nscript: |\n", id, id, repo)
	for _, l := range strings.Split(fmt.Sprintf(script, id), "\n") {
		b.WriteString("  " + l + "\n")
	}
	b.WriteString("---\n# " + id + "\n")
	return b.String()
}

func (r *run) story(ctx context.Context) error {
	sctx, stopScaler := context.WithCancel(ctx)
	scalerDone := make(chan struct{})
	go func() {
		defer close(scalerDone)
		r.scaler.Run(sctx)
	}()
	defer func() { stopScaler(); <-scalerDone }()

	// 2. Idle.
	r.say("")
	r.say("2. Idle")
	if err := r.idle(ctx, "idle: zero aq processes and zero coordinator requests while the subscription is empty"); err != nil {
		return err
	}

	// 3. A burst.
	long := "svc-resume"
	ids := []string{long}
	for i := 1; i <= quickJobs; i++ {
		ids = append(ids, fmt.Sprintf("svc-%d", i))
	}
	if err := r.submit(ctx, ids, long); err != nil {
		return err
	}
	r.say("")
	r.say("3. A burst: %d jobs submitted; the stub publishes each to the pool's subscription", len(ids))
	var waiting int64
	if err := r.waitFor(ctx, fmt.Sprintf("%d replicas at once", maxReplicas), func() bool {
		if r.livePeak() < maxReplicas {
			return false
		}
		waiting, _ = r.read(ctx)
		return true
	}); err != nil {
		return err
	}
	r.say("   the scaler started replicas up to its maximum: %d at once, %d messages still waiting", maxReplicas, waiting)
	if err := os.WriteFile(filepath.Join(r.sig, "gate"), nil, 0o644); err != nil {
		return err
	}

	// 4. A replica's host is lost mid-job.
	var held coord.Job
	if err := r.waitFor(ctx, long+" to be running with its checkpoint on origin", func() bool {
		j, ok := r.stub.Job(long)
		held = j
		return ok && j.Holder != "" && j.Checkpoint != "" && (j.Stage == coord.StageBuilding || j.Stage == coord.StageAssigned)
	}); err != nil {
		return err
	}
	victim := r.replica(held.Holder)
	if victim == nil || !victim.running() {
		return fmt.Errorf("%s holds %s but is not running", held.Holder, long)
	}
	pid := victim.cmd.Process.Pid
	_ = victim.cmd.Process.Kill()
	<-victim.done
	r.mu.Lock()
	victim.killed = true
	r.mu.Unlock()
	if err := os.RemoveAll(victim.dir); err != nil {
		return err
	}
	r.say("")
	r.say("4. The host is gone: kill -9 %s (pid %d) mid-job, %s's checkpoint %.10s already on origin; its AQ_HOME and clones deleted", victim.id, pid, long, held.Checkpoint)

	// 5. Everything ships; the pool drains to zero.
	if err := r.waitFor(ctx, "every job shipped", func() bool {
		for _, id := range ids {
			if j, _ := r.stub.Job(id); j.Stage != coord.StageShipped {
				return false
			}
		}
		return true
	}); err != nil {
		return err
	}
	if err := r.waitFor(ctx, "every replica gone and the subscription empty", func() bool {
		n, err := r.read(ctx)
		return err == nil && n == 0 && r.live() == 0
	}); err != nil {
		return err
	}
	r.say("")
	r.say("5. All %d jobs shipped; every replica exited", len(ids))
	r.story5(ids, long, victim)

	// 6. Idle again.
	r.say("")
	r.say("6. Idle again")
	return r.idle(ctx, "idle again at the end: zero aq processes and zero coordinator requests")
}

// idle watches one idle window: the scaler keeps reading the broker, and
// nothing else happens — no replica, no coordinator request.
func (r *run) idle(ctx context.Context, what string) error {
	reads0, _, started0, _ := r.scaler.Stats()
	req0 := r.stub.Stats().Total()
	t := time.NewTimer(idleWindow)
	select {
	case <-ctx.Done():
		t.Stop()
		return context.Cause(ctx)
	case <-t.C:
	}
	reads1, errs, started1, lastErr := r.scaler.Stats()
	req1 := r.stub.Stats().Total()
	note := fmt.Sprintf("%s: %d reads of the subscription's active message count, %d replicas started, %d aq processes, %d coordinator requests",
		idleWindow, reads1-reads0, started1-started0, r.live(), req1-req0)
	if errs > 0 {
		note += fmt.Sprintf("; %d failed reads (last: %v)", errs, lastErr)
	}
	r.say("   %s", note)
	r.check(reads1-reads0 >= 2 && errs == 0 && started1 == started0 && r.live() == 0 && req1 == req0, what, note)
	return nil
}

// submit posts the jobs with aq submit from an operator's home.
func (r *run) submit(ctx context.Context, ids []string, long string) error {
	dir := filepath.Join(r.ws, "jobs")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	var files []string
	for _, id := range ids {
		script := quickScript
		if id == long {
			script = longScript
		}
		f := filepath.Join(dir, id+".md")
		if err := os.WriteFile(f, []byte(manifest(id, script)), 0o644); err != nil {
			return err
		}
		files = append(files, f)
	}
	cmd := exec.CommandContext(ctx, r.aq, append([]string{"submit"}, files...)...)
	cmd.Env = append(append([]string{}, r.env...), "AQ_HOME="+filepath.Join(r.ws, "operator", "home"), "AQ_REPO_BASE="+filepath.Join(r.ws, "operator"))
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("aq submit: %v: %s", err, strings.TrimSpace(string(out)))
	}
	return nil
}

func (r *run) replica(id string) *replica {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, p := range r.replicas {
		if p.id == id {
			return p
		}
	}
	return nil
}

func (r *run) livePeak() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.peak
}

// story5 checks what the burst and the lost host left behind.
func (r *run) story5(ids []string, long string, victim *replica) {
	r.mu.Lock()
	ps := append([]*replica{}, r.replicas...)
	peak := r.peak
	r.mu.Unlock()

	r.check(peak == maxReplicas, fmt.Sprintf("a burst of %d jobs: replicas capped at the scaler's maximum (%d)", len(ids), maxReplicas),
		fmt.Sprintf("%d replicas started in all, at most %d at once", len(ps), peak))

	var attempts []string
	for _, e := range r.stub.Events(long) {
		if e.Kind == "accepted" {
			attempts = append(attempts, e.Factory)
		}
	}
	resumed, _ := r.git(context.Background(), "--git-dir", filepath.Join(r.ws, "origins", repo+".git"), "show", job.JobBranch(long)+":resume.txt")
	okResume := len(attempts) >= 2 && attempts[0] == victim.id && attempts[len(attempts)-1] != victim.id &&
		strings.Contains(resumed, "first half, by "+victim.id) && strings.Contains(resumed, "resumed by ")
	r.check(okResume, "the killed replica's job finished by another replica, from the checkpoint pushed before the kill",
		fmt.Sprintf("accepted by %s; resume.txt on origin's %s: %q", strings.Join(attempts, " then "), job.JobBranch(long), resumed))

	shipped := 0
	for _, id := range ids {
		if j, _ := r.stub.Job(id); j.Stage == coord.StageShipped {
			shipped++
		}
	}
	r.check(shipped == len(ids), fmt.Sprintf("all %d jobs shipped", len(ids)), "")

	// Every replica that exited on its own left the fleet; the killed one
	// could not (the coordinator counts it stale).
	byID := map[string]coord.Factory{}
	for _, f := range r.stub.AllFactories() {
		byID[f.ID] = f
	}
	var stayed, badExit, noClone []string
	ran := 0
	for _, p := range ps {
		if p.killed {
			continue
		}
		if f, ok := byID[p.id]; ok && !f.Deregistered {
			stayed = append(stayed, p.id)
		}
		if p.code != 0 && p.code != 3 {
			badExit = append(badExit, fmt.Sprintf("%s exit %d", p.id, p.code))
		}
		if p.code == 0 {
			ran++
			out, err := r.git(context.Background(), "-C", filepath.Join(p.base, repo), "config", "remote.origin.partialclonefilter")
			if err != nil || out != "blob:none" {
				noClone = append(noClone, p.id)
			}
		}
	}
	kf := byID[victim.id]
	r.check(len(stayed) == 0 && !kf.Deregistered, "every replica that exited left the fleet (offline heartbeat, deregistered); the killed one could not",
		fmt.Sprintf("still registered: %v; %s deregistered: %v", stayed, victim.id, kf.Deregistered))
	r.check(len(badExit) == 0, "every replica exited 0 (ran its job) or 3 (found no message within --wait)", strings.Join(badExit, ", "))
	r.check(ran > 0 && len(noClone) == 0, "each replica started with no clones and cloned svc on demand (blobless)",
		fmt.Sprintf("%d replicas ran a job; without a blobless clone: %v", ran, noClone))
}

// summarize fills sum and prints the replicas and the checks.
func (r *run) summarize(sum *Summary) {
	r.mu.Lock()
	ps := append([]*replica{}, r.replicas...)
	sum.Peak = r.peak
	r.mu.Unlock()
	if r.scaler != nil {
		sum.Reads, _, _, _ = r.scaler.Stats()
	}
	jobOf := map[string]string{}
	if r.stub != nil {
		for _, j := range r.stub.Jobs() {
			for _, e := range r.stub.Events(j.ID) {
				if e.Kind == "accepted" {
					jobOf[e.Factory] = j.ID
				}
			}
		}
	}
	for _, p := range ps {
		code := -1
		if !p.running() {
			code = p.code
		}
		sum.Replicas = append(sum.Replicas, ReplicaRow{ID: p.id, Exit: code, Job: jobOf[p.id], Killed: p.killed})
	}
	sort.Slice(sum.Replicas, func(i, j int) bool { return sum.Replicas[i].ID < sum.Replicas[j].ID })
	sum.Checks = r.checks
	if len(sum.Replicas) > 0 {
		r.say("")
		r.say("7. Summary: %d replicas, at most %d at once, %d reads of the subscription", len(sum.Replicas), sum.Peak, sum.Reads)
		tw := tabwriter.NewWriter(r.out, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "   REPLICA\tJOB\tEXIT")
		for _, row := range sum.Replicas {
			exit := fmt.Sprint(row.Exit)
			if row.Killed {
				exit = "killed (-9)"
			}
			fmt.Fprintf(tw, "   %s\t%s\t%s\n", row.ID, orDash(row.Job), exit)
		}
		tw.Flush()
	}
	r.say("")
	r.say("Expected events:")
	demo.WriteChecks(r.out, sum.Checks)
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
