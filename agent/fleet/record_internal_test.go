package fleet

import (
	"strings"
	"testing"
	"time"

	"github.com/aqfleet/aq/agent/jobstate"
	"github.com/aqfleet/aq/agent/runner"
	"github.com/aqfleet/aq/job"
)

// A fence the spool's drain learnt before the run's end was recorded (the
// background drain re-sent a spooled report, got 409 and dropped the
// final one; the final report's Send saw only "spooled") stays on the
// record; a run with nothing fenced is not marked. Found by the chaos run's
// "no report lost" invariant (seed 264317234386329).
func TestEndRecordKeepsAFenceTheDrainLearnt(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 11, 25, 15, 18, 45, 0, time.UTC)
	out := runner.Outcome{Stage: job.Failed, Reason: job.ReasonLeaseLost, Detail: "the lease could not be renewed"}
	for _, c := range []struct {
		name              string
		drained, runFence bool
		want              bool
	}{
		{"fenced by the drain first", true, false, true},
		{"fenced by the run's own report", false, true, true},
		{"not fenced", false, false, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			rec := &jobstate.Record{ID: "j", Fenced: c.drained}
			res := &Result{Stage: job.Failed, Fenced: c.runFence, Report: "spooled"}
			endRecord(rec, res, &out, now)
			if rec.Fenced != c.want || rec.Stage != job.Failed || rec.Reason != job.ReasonLeaseLost || !rec.EndedAt.Equal(now) {
				t.Fatalf("record %+v, want fenced %v", rec, c.want)
			}
			if c.drained && !strings.Contains(rec.Detail, "fenced when a spooled report was re-sent") {
				t.Errorf("detail %q does not say why nothing was reported", rec.Detail)
			}
		})
	}
}
