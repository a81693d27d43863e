package fleet

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/aqfleet/aq/agent/config"
	"github.com/aqfleet/aq/demo/coord"
	"github.com/aqfleet/aq/internal/testenv"
	"github.com/aqfleet/aq/job"
)

var (
	idAnswer = testenv.ID("answer")
	idLost   = testenv.ID("lost")
)

// answerScript is an engine that keeps each prompt in <dir>/<id>.prompt-<n>
// and fixes answer.txt only when its prompt names verify's failure.
func answerScript(w *world, id string) string {
	return w.script(id, fmt.Sprintf(`n=1; while [ -e %[1]q-$n ]; do n=$((n+1)); done
cat > %[1]q-$n
if grep -q "want 42" %[1]q-$n; then echo 42 > answer.txt; else echo 41 > answer.txt; fi
`, filepath.Join(w.dir, id+".prompt")))
}

func (w *world) prompt(id string, n int) string {
	b, _ := os.ReadFile(filepath.Join(w.dir, fmt.Sprintf("%s.prompt-%d", id, n)))
	return string(b)
}

const answerVerify = `verify: 'a=$(cat answer.txt); [ "$a" = 42 ] || { echo "FAIL: answer.txt says $a, want 42"; exit 1; }'`

// TestRetryIsToldThePreviousAttempt: a job whose verify failed on one
// factory is retried knowing why. With /fleet/fail the coordinator keeps
// the failure (reason, detail, verify's tail from the insights) and the
// next claim carries it as previous: another factory's engine gets verify's
// output and the job ships. Today's coordinator (legacy) sends no
// previous: a factory that ran the attempt before uses its own record.
func TestRetryIsToldThePreviousAttempt(t *testing.T) {
	testenv.Slow(t, "runs fleet jobs against a coordinator with real git")
	t.Parallel()
	eachRouteSet(t, func(t *testing.T, rs routeSet) {
		s := startStub(t, rs.opts(coord.Options{LeaseTTL: time.Hour, ReapEvery: time.Hour, MaxBackoff: time.Millisecond}))
		w := newWorld(t, "app")
		s.submit(t, idAnswer, "app", "script: "+answerScript(w, idAnswer)+"\n"+answerVerify+"\nverify_rounds: 0\nretry: { max: 1 }\nship: branch")
		f1 := newFactory(t, s, w, "first")
		res, err := f1.runOnce(t, ctxT(t))
		if err != nil || res.Outcome.Reason != job.ReasonVerifyFailed || res.Stage != job.Inbox {
			t.Fatalf("first attempt: %+v, %v", res, err)
		}
		j, _ := s.Job(idAnswer)
		if p := j.Previous; p == nil || p.Attempt != 1 || p.Reason != job.ReasonVerifyFailed || p.Verify == nil || !strings.Contains(p.Verify.Tail, "want 42") {
			t.Fatalf("the coordinator's record of the attempt: %+v", j.Previous)
		}
		time.Sleep(5 * time.Millisecond) // the 1 ms backoff cap
		// Full: another factory, told by the claim. Legacy: the claim says
		// nothing; the same factory has its own record.
		next := f1
		if !rs.legacy() {
			next = newFactory(t, s, w, "second")
		}
		res2, err := next.runOnce(t, ctxT(t))
		if err != nil || res2.Outcome.Failed() || res2.Stage != job.Shipped || res2.Attempt != 2 {
			t.Fatalf("second attempt: %+v, %v", res2, err)
		}
		p := w.prompt(idAnswer, 2)
		for _, want := range []string{"This job ran before. Its attempt 1 ended: verify_failed", "FAIL: answer.txt says 41, want 42", "resumes from a checkpoint of the earlier work"} {
			if !strings.Contains(p, want) {
				t.Errorf("the retry's prompt lacks %q:\n%s", want, p)
			}
		}
		if rs.legacy() && !strings.Contains(f1.Logs.String(), "using this factory's record of it") {
			t.Error("legacy: the factory did not say it used its own record")
		}
	})
}

// TestRetryAfterALostHost: a factory cut off mid-job loses its lease to the
// reaper; the next factory's engine is told the attempt before ended
// lease_lost (the reaper's word) and that it resumes from the checkpoint
// that attempt pushed. A coordinator without previous: the generic note.
func TestRetryAfterALostHost(t *testing.T) {
	testenv.Slow(t, "runs fleet jobs against a coordinator with real git")
	t.Parallel()
	eachRouteSet(t, func(t *testing.T, rs routeSet) {
		s := startStub(t, rs.opts(coord.Options{LeaseTTL: 3 * time.Second, ReapEvery: 50 * time.Millisecond}))
		p, err := coord.NewPartition(s.Addr)
		if err != nil {
			t.Fatal(err)
		}
		defer p.Close()
		w := newWorld(t, "app")
		started := filepath.Join(w.dir, idLost+".started")
		script := w.script(idLost, fmt.Sprintf(`n=1; while [ -e %[1]q-$n ]; do n=$((n+1)); done
cat > %[1]q-$n
echo "part $n" > part-$n.txt
if [ $n -eq 1 ]; then touch %[2]q; sleep 300; fi
`, filepath.Join(w.dir, idLost+".prompt"), started))
		s.submit(t, idLost, "app", "script: "+script+"\nship: branch\nretry: { max: 2 }")
		f1 := newFactory(t, s, w, "islander", func(c *config.Config, _ *Parts) {
			c.FleetAPI = "http://" + p.Addr() + "/api"
			c.CheckpointInterval = 100 * time.Millisecond // the work reaches origin before the host is cut off
		}, func(_ *config.Config, parts *Parts) { parts.Budgets.PerTry = 300 * time.Millisecond })
		done := make(chan *Result, 1)
		go func() { res, _ := f1.runOnce(t, ctxT(t)); done <- res }()
		testenv.WaitFor(t, time.Minute, "the engine to start and its work to reach origin", func() bool {
			return testenv.Exists(started) && len(testenv.RemoteRefs(t, w.origins["app"], "refs/heads/aq/wip/")) > 0
		})
		p.Blackhole()
		if res := <-done; res.Outcome.Reason != job.ReasonLeaseLost {
			t.Fatalf("the cut-off run: %+v", res)
		}
		testenv.WaitFor(t, time.Minute, "the reaper", func() bool { j, _ := s.Job(idLost); return j.Stage == coord.StageQueued })
		f2 := newFactory(t, s, w, "survivor")
		res, err := f2.runOnce(t, ctxT(t))
		if err != nil || res.Outcome.Failed() || res.Stage != job.Shipped {
			t.Fatalf("the next factory's run: %+v, %v", res, err)
		}
		prompt := w.prompt(idLost, 2)
		want := []string{"Its attempt 1 ended: lease_lost", "islander expired: it stopped renewing", "cut off by the machine running it", "resumes from a checkpoint of the earlier work"}
		if rs.legacy() {
			want = []string{"This is attempt 2 of this job: an earlier attempt ran elsewhere and how it ended is not known here", "resuming from a checkpoint"}
		}
		for _, w := range want {
			if !strings.Contains(prompt, w) {
				t.Errorf("the retry's prompt lacks %q:\n%s", w, prompt)
			}
		}
	})
}
