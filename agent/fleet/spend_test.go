package fleet

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/aqfleet/aq/demo/coord"
	"github.com/aqfleet/aq/internal/testenv"
	"github.com/aqfleet/aq/job"
)

var idSpender = testenv.ID("spender")

// TestFailCarriesInsights: a run that fails still spent tokens and money;
// /fleet/fail carries its insights, so the coordinator's record of the job
// (its budgets) counts the spend of every attempt, failures included.
func TestFailCarriesInsights(t *testing.T) {
	testenv.Slow(t, "runs fleet jobs against a coordinator with real git")
	t.Parallel()
	s := startStub(t, coord.Options{MaxBackoff: time.Millisecond})
	w := newWorld(t, "app")
	spend := w.script("spend", "echo '::aq-usage tokens_in=1200 tokens_out=300 tokens_cached=50 cost_usd=0.25 turns=3'\nexit 3\n")
	s.submit(t, idSpender, "app", "script: "+spend+"\nretry: { max: 1 }")
	f := newFactory(t, s, w, "spender")
	for attempt := 1; attempt <= 2; attempt++ {
		if attempt == 2 {
			time.Sleep(5 * time.Millisecond) // the 1 ms backoff cap
		}
		res, err := f.runOnce(t, ctxT(t))
		if err != nil {
			t.Fatal(err)
		}
		if res.Outcome.Reason != job.ReasonEngineFailed || res.Report != "delivered" {
			t.Fatalf("attempt %d: %+v", attempt, res)
		}
		if in := res.Outcome.Insights; in.CostUSD != 0.25 || in.TokensIn != 1200 {
			t.Fatalf("attempt %d: the run's own insights %+v", attempt, in)
		}
	}
	j, _ := s.Job(idSpender)
	if j.Stage != coord.StageDeadLetter {
		t.Fatalf("stage %s", j.Stage)
	}
	var in job.Insights
	if err := json.Unmarshal(j.Insights, &in); err != nil {
		t.Fatalf("the stub recorded no insights for the failed job: %q (%v)", j.Insights, err)
	}
	if in.Engine != "script" || in.TokensIn != 1200 || in.TokensOut != 300 || in.TokensCached != 50 || in.CostUSD != 0.25 || in.Turns != 3 || in.WallMS <= 0 {
		t.Fatalf("insights of the last failed run %+v", in)
	}
	if sp := j.Spent; sp.Runs != 2 || sp.CostUSD != 0.5 || sp.TokensIn != 2400 || sp.TokensOut != 600 || sp.Turns != 6 {
		t.Fatalf("the job's spend over two failed attempts: %+v", sp)
	}
}
