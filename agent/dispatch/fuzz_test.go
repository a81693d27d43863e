package dispatch

import (
	"errors"
	"strings"
	"testing"

	"github.com/aqfleet/aq/job"
)

// FuzzMessage: a received dispatch message, whatever its body, MessageID and
// routing property, is acted on only when its job id passes the rule every
// job's does and it is targeted at this factory (or its pool); anything else
// is an *invalid with one short line to dead-letter it with (issue #26,
// item 9; the seed corpus is testdata/fuzz/FuzzMessage).
func FuzzMessage(f *testing.F) {
	f.Add([]byte(`{"jobId":"j1","repo":"app","targetFactoryId":"fa"}`), "j1", "fa", "builders")
	f.Fuzz(func(t *testing.T, body []byte, messageID, targetProp, pool string) {
		props := map[string]any{}
		if targetProp != "" {
			props[PropTargetFactoryID] = targetProp
		}
		m, warning, err := parse(body, messageID, props, "fa", pool)
		if err != nil {
			var inv *invalid
			if !errors.As(err, &inv) || inv.Reason == "" || len(inv.Description) > 1024 || strings.ContainsAny(inv.Description, "\n\r") {
				t.Fatalf("refusal %#v", err)
			}
			return
		}
		if !job.ValidID(m.JobID) {
			t.Fatalf("acted on job id %q", m.JobID)
		}
		if m.TargetFactoryID != "fa" && (pool == "" || m.TargetFactoryID != pool) {
			t.Fatalf("acted on a message for %q", m.TargetFactoryID)
		}
		if targetProp != "" && targetProp != m.TargetFactoryID {
			t.Fatalf("the routing property %q disagrees with the body's %q", targetProp, m.TargetFactoryID)
		}
		if strings.ContainsAny(warning, "\n\r") || len(warning) > 2048 {
			t.Fatalf("warning %q", warning)
		}
	})
}
