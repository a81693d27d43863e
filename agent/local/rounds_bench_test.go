package local_test

import (
	"context"
	"errors"
	"strconv"
	"testing"
	"time"

	"github.com/aqfleet/aq/agent/queue"
	"github.com/aqfleet/aq/internal/testenv"
	"github.com/aqfleet/aq/job"
)

// The repair rounds' benchmark (docs/BENCHMARKS.md, "Repair rounds"): a
// scripted engine that needs verify's failure text to succeed — it writes
// the right answer only when its prompt says what verify wanted — run
// through the local agent as `aq run` runs jobs, each job to its end across
// its attempts. Reported per job: shipped-per-10 (of ten such jobs, how
// many ship), runs (engine runs spent), attempts (queue attempts spent).
//
//	no-rounds            verify_rounds: 0, retry.max 0: one blind run
//	rounds               verify_rounds: 2 (the default): repair rounds in the same attempt
//	retries-that-know    verify_rounds: 0, retry.max 2: retries told the previous attempt's failure
//	blind-retries        as retries-that-know, with an engine that ignores what the retry is told:
//	                     the prompt a retry had before #28 (the same task again)
//
// The counts are exact (the engine is deterministic); ns/op is the wall
// time of a job to its end, retries' backoff (1ms) included.

// roundsBenchFiles: the task is answer.txt, checked by check.sh.
var roundsBenchFiles = map[string]string{
	"README.md": "# calc\n",
	"check.sh":  "a=$(cat answer.txt 2>/dev/null)\nif [ \"$a\" != 42 ]; then echo \"FAIL: answer.txt says '$a', want 42\"; exit 1; fi\n",
}

// needsTheFailure fixes answer.txt only when its prompt names verify's
// failure; blind, it first cuts what a retry is told about the attempt
// before (everything from "This job ran before" on).
func needsTheFailure(blind bool) string {
	read := `prompt=$(cat)`
	if blind {
		read = `prompt=$(sed '/^This job ran before/,$d')`
	}
	return read + `
if printf '%s\n' "$prompt" | grep -q "want 42"; then echo 42 > answer.txt; else echo 41 > answer.txt; fi
echo "::aq-usage tokens_in=1000 tokens_out=100 cost_usd=0.01 turns=2"`
}

func BenchmarkRepairRounds(b *testing.B) {
	for _, c := range []struct {
		name          string
		rounds, retry int
		blind         bool
	}{
		{name: "no-rounds"},
		{name: "rounds", rounds: job.DefaultVerifyRounds},
		{name: "retries-that-know", retry: 2},
		{name: "blind-retries", retry: 2, blind: true},
	} {
		b.Run(c.name, func(b *testing.B) {
			h := testenv.NewHome(b)
			h.Repo(b, "calc", roundsBenchFiles)
			a := newAgent(b, h)
			front := "repo: calc\nengine: script\nship: none\nverify: sh check.sh\n" +
				"verify_rounds: " + strconv.Itoa(c.rounds) + "\nretry: { max: " + strconv.Itoa(c.retry) + ", backoff: 1ms }\n" +
				"script: " + strconv.Quote(needsTheFailure(c.blind))
			ctx := context.Background()
			var shipped, runs, attempts int
			b.ResetTimer()
			for i := range b.N {
				b.StopTimer()
				id := testenv.ID(c.name + "-" + strconv.Itoa(i))
				submit(b, a, c.name+"-"+strconv.Itoa(i), front)
				b.StartTimer()
				for done := false; !done; {
					res, err := a.RunOne(ctx)
					if errors.Is(err, queue.ErrNoJob) { // a retry's backoff
						time.Sleep(time.Millisecond)
						continue
					}
					if err != nil || res.JobID != id {
						b.Fatalf("job %s: %v, %+v", id, err, res)
					}
					attempts++
					runs += len(res.Outcome.Insights.Runs)
					switch res.Stage {
					case job.Testing:
						shipped++
						done = true
					case job.DeadLetter, job.Failed:
						done = true
					}
				}
			}
			b.StopTimer()
			b.ReportMetric(10*float64(shipped)/float64(b.N), "shipped-per-10")
			b.ReportMetric(float64(runs)/float64(b.N), "runs/op")
			b.ReportMetric(float64(attempts)/float64(b.N), "attempts/op")
		})
	}
}
