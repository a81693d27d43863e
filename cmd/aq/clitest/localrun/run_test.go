//go:build unix && !unit

package localrun

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aqfleet/aq/cmd/aq/clitest"
	"github.com/aqfleet/aq/internal/testenv"
	"github.com/aqfleet/aq/job"
)

// These tests run the real aq binary (built once, with -race when the tests
// have it) against a temp AQ_HOME, real git repositories and script engines
// that leave markers in $MARK. Waits are on marker files; the timeouts are
// deadlock guards that fail the test, never speed requirements.

// TestRunConcurrentProcessesTakeEachJobOnce: several `aq run --once`
// processes on one AQ_HOME, each looping until the queue is empty (exit 3),
// run every job exactly once.
func TestRunConcurrentProcessesTakeEachJobOnce(t *testing.T) {
	t.Parallel() // its own home and job ids: it runs beside the others
	h, mark := clitest.MarkedHome(t)
	const jobs, procs = 20, 4
	for r := range 5 {
		h.Repo(t, fmt.Sprintf("repo%d", r), nil)
	}
	for i := range jobs {
		id := fmt.Sprintf("job%02d", i)
		h.Submit(t, id, clitest.ScriptJob(fmt.Sprintf("repo%d", i%5), `echo "$AQ_JOB_ID $$" >> "$MARK/runs"
echo "$AQ_JOB_ID" > out.txt`, "ship: branch"))
	}
	var (
		wg     sync.WaitGroup
		mu     sync.Mutex
		codes  = map[int]int{}
		failed []string
	)
	for p := range procs {
		wg.Go(func() {
			for n := 0; ; n++ {
				r, err := h.RunE(t, "run", "--once")
				mu.Lock()
				codes[r.Code]++
				if err != nil || (r.Code != 0 && r.Code != 3) {
					failed = append(failed, fmt.Sprintf("process %d run %d: %v %s", p, n, err, r))
				}
				mu.Unlock()
				if err != nil || r.Code != 0 {
					return
				}
			}
		})
	}
	wg.Wait()
	for _, f := range failed {
		t.Error(f)
	}
	if codes[0] != jobs {
		t.Errorf("exit codes %v: want %d runs that exited 0", codes, jobs)
	}
	runs := map[string]int{}
	for _, line := range strings.Split(strings.TrimSpace(testenv.ReadFile(t, filepath.Join(mark, "runs"))), "\n") {
		runs[strings.Fields(line)[0]]++
	}
	for i := range jobs {
		id := fmt.Sprintf("job%02d", i)
		if runs[testenv.ID(id)] != 1 {
			t.Errorf("job %s ran %d times", id, runs[id])
		}
		if v := show(t, h, id); v.Stage != job.Shipped || v.Attempts != 1 {
			t.Errorf("job %s: stage %s attempts %d", id, v.Stage, v.Attempts)
		}
	}
	if len(runs) != jobs {
		t.Errorf("%d distinct jobs ran, want %d: %v", len(runs), jobs, runs)
	}
}

// TestRunSameRepoSerially: jobs on one repo never overlap, even with as many
// aq processes as jobs taking them at once (they wait for the repo lock).
func TestRunSameRepoSerially(t *testing.T) {
	t.Parallel() // its own home and job ids: it runs beside the others
	h, mark := clitest.MarkedHome(t)
	h.Repo(t, "one", nil)
	const jobs = 4
	// mkdir is atomic: a second job inside the repo at the same time fails
	// to make the directory and records the overlap.
	script := `mkdir "$MARK/inside" 2>/dev/null || echo "$AQ_JOB_ID" >> "$MARK/overlaps"
echo "$AQ_JOB_ID" >> "$MARK/runs"
sleep 0.3
echo "$AQ_JOB_ID" > "out-$AQ_JOB_ID.txt"
rmdir "$MARK/inside" 2>/dev/null || true`
	for i := range jobs {
		h.Submit(t, fmt.Sprintf("s%d", i), clitest.ScriptJob("one", script, "ship: branch"))
	}
	var procs []*clitest.Started
	for range jobs {
		procs = append(procs, clitest.Start(t, h, "run", "--once"))
	}
	for _, p := range procs {
		if r := p.Wait(); r.Code != 0 {
			t.Errorf("aq run --once: %s", r)
		}
	}
	if b, err := os.ReadFile(filepath.Join(mark, "overlaps")); err == nil {
		t.Errorf("jobs on one repo overlapped: %q", b)
	}
	if runs := strings.Fields(testenv.ReadFile(t, filepath.Join(mark, "runs"))); len(runs) != jobs {
		t.Errorf("runs: %v", runs)
	}
}

// TestRunDifferentReposInParallel: two jobs on two repos run at the same
// time. Each waits for the other to start: run one after the other, both
// would wait in vain until their own deadline and fail.
func TestRunDifferentReposInParallel(t *testing.T) {
	t.Parallel() // its own home and job ids: it runs beside the others
	h, _ := clitest.MarkedHome(t)
	for _, r := range []string{"left", "right"} {
		h.Repo(t, r, nil)
	}
	barrier := func(me, other string) string {
		return fmt.Sprintf(`touch "$MARK/%s-in"
i=0
while [ ! -e "$MARK/%s-in" ]; do
  i=$((i+1)); [ $i -gt 1200 ] && { echo "the other job never started" >&2; exit 9; }
  sleep 0.05
done
echo done > %s.txt`, me, other, me)
	}
	h.Submit(t, "pl", clitest.ScriptJob("left", barrier("left", "right"), "ship: branch"))
	h.Submit(t, "pr", clitest.ScriptJob("right", barrier("right", "left"), "ship: branch"))
	a, b := clitest.Start(t, h, "run", "--once"), clitest.Start(t, h, "run", "--once")
	for _, p := range []*clitest.Started{a, b} {
		if r := p.Wait(); r.Code != 0 {
			t.Errorf("aq run --once: %s", r)
		}
	}
	for _, id := range []string{"pl", "pr"} {
		if v := show(t, h, id); v.Stage != job.Shipped {
			t.Errorf("%s: %s %s %s", id, v.Stage, v.Reason, v.Detail)
		}
	}
}

// TestRunRetriesWithBackoff: retry.max 1 with a backoff: the failed job waits
// in the inbox until NotBefore (aq run --once: exit 3, aq status says why),
// runs once more, then goes to dead_letter.
func TestRunRetriesWithBackoff(t *testing.T) {
	t.Parallel() // its own home and job ids: it runs beside the others
	h, mark := clitest.MarkedHome(t)
	h.Repo(t, "app", nil)
	h.Submit(t, "retry", clitest.ScriptJob("app", `echo "$AQ_JOB_ID" >> "$MARK/runs"; exit 4`, "retry: {max: 1, backoff: 2s}"))
	if r := h.Run(t, "run", "--once"); r.Code != 1 {
		t.Fatalf("attempt 1: %s", r)
	}
	v := show(t, h, "retry")
	if v.Stage != job.Inbox || v.Reason != job.ReasonEngineFailed || v.NotBefore.IsZero() || v.Attempts != 1 {
		t.Fatalf("after attempt 1: %s %s notBefore %v attempts %d", v.Stage, v.Reason, v.NotBefore, v.Attempts)
	}
	if d := v.NotBefore.Sub(v.EndedAt); d != 2*time.Second {
		t.Errorf("backoff %v, want 2s", d)
	}
	// A run during the backoff takes nothing. On a loaded machine the
	// backoff may be over before that aq looks at the queue: then it is
	// attempt 2, and it must have started after the backoff.
	during := h.Run(t, "run", "--once")
	switch after := show(t, h, "retry"); {
	case during.Code == 3 && after.Attempts == 1:
		b := board(t, h)
		if time.Now().Before(v.NotBefore) && (len(b.Waiting) != 1 || !strings.Contains(b.Waiting[0].Why, "retry backoff")) {
			t.Errorf("status during the backoff: %+v", b.Waiting)
		}
		time.Sleep(time.Until(v.NotBefore)) // the backoff is the behaviour under test
		if r := h.Run(t, "run", "--once"); r.Code != 1 {
			t.Fatalf("attempt 2: %s", r)
		}
	case during.Code == 1 && after.Attempts == 2:
		if after.StartedAt.Before(v.NotBefore) {
			t.Fatalf("attempt 2 started at %v, before the backoff ended at %v", after.StartedAt, v.NotBefore)
		}
	default:
		t.Fatalf("during the backoff (attempts now %d): %s", after.Attempts, during)
	}
	v = show(t, h, "retry")
	if v.Stage != job.DeadLetter || v.Attempts != 2 || v.Reason != job.ReasonEngineFailed {
		t.Errorf("after attempt 2: %s attempts %d %s", v.Stage, v.Attempts, v.Reason)
	}
	if runs := strings.Fields(testenv.ReadFile(t, filepath.Join(mark, "runs"))); len(runs) != 2 {
		t.Errorf("runs %v", runs)
	}
	if r := h.Run(t, "run", "--once"); r.Code != 3 {
		t.Errorf("a dead-lettered job ran again: %s", r)
	}
}

// TestRunSecretsMasked: secrets the engine prints are *** in the job logs and
// in aq's own output; AQ_FLEET_TOKEN and GITHUB_TOKEN are not in the
// engine's environment (issue #26), a credential AQ_ENGINE_ENV passes is.
func TestRunSecretsMasked(t *testing.T) {
	t.Parallel() // its own home and job ids: it runs beside the others
	h, mark := clitest.MarkedHome(t)
	h.Repo(t, "app", nil)
	const gh, fleet = "ghp_abcdefghijklmnop0123456789", "aqft_0123456789abcdef"
	h.Env = append(h.Env, "GITHUB_TOKEN="+gh, "AQ_FLEET_TOKEN="+fleet, "MY_SERVICE_PASSWORD=hunter2hunter2", "AQ_ENGINE_ENV=MARK,MY_SERVICE_PASSWORD")
	h.Submit(t, "sec", clitest.ScriptJob("app", `echo "token=${GITHUB_TOKEN:-absent} pass=$MY_SERVICE_PASSWORD fleet=${AQ_FLEET_TOKEN:-absent}"
echo "err pass=$MY_SERVICE_PASSWORD" >&2
env > "$MARK/env"
echo x > x.txt`, "verify: echo verify pass=$MY_SERVICE_PASSWORD token=${GITHUB_TOKEN:-absent}"))
	r := h.Run(t, "run", "--once")
	if r.Code != 0 {
		t.Fatalf("%s", r)
	}
	logs := h.Run(t, "job", "logs", testenv.ID("sec"))
	all := logs.Stdout + logs.Stderr + r.Stdout + r.Stderr
	for _, s := range []string{gh, fleet, "hunter2hunter2"} {
		if strings.Contains(all, s) {
			t.Errorf("secret %q shown:\n%s", s, all)
		}
		for _, n := range []string{"stdout.log", "stderr.log", "verify.log"} {
			if strings.Contains(testenv.ReadFile(t, filepath.Join(h.Dir, "logs", testenv.ID("sec"), n)), s) {
				t.Errorf("secret %q in %s", s, n)
			}
		}
	}
	for _, want := range []string{"token=absent pass=*** fleet=absent", "err pass=***", "verify pass=*** token=absent"} {
		if !strings.Contains(logs.Stdout, want) {
			t.Errorf("logs lack %q:\n%s", want, logs.Stdout)
		}
	}
	if env := testenv.ReadFile(t, filepath.Join(mark, "env")); strings.Contains(env, "AQ_FLEET_TOKEN") || strings.Contains(env, "GITHUB_TOKEN=") || strings.Contains(env, "AQ_HOME=") ||
		!strings.Contains(env, "MY_SERVICE_PASSWORD=") {
		t.Errorf("engine environment: AQ_FLEET_TOKEN, GITHUB_TOKEN and AQ_HOME must be absent, MY_SERVICE_PASSWORD (AQ_ENGINE_ENV) present")
	}
}
