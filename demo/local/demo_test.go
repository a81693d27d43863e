//go:build !unit

package local

import (
	"bytes"
	"context"
	"strings"
	"testing"

	"github.com/aqfleet/aq/internal/testenv"
)

// TestDemoPasses runs the whole local demo: real repos, real queue, real
// engine processes. Every expected event must happen.
func TestDemoPasses(t *testing.T) {
	testenv.Slow(t, "runs the local demo act")
	var out bytes.Buffer
	sum, err := Run(context.Background(), Options{Dir: t.TempDir(), Out: &out})
	if err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	if !sum.Passed() {
		t.Fatalf("demo checks failed:\n%s", out.String())
	}
	if len(sum.Checks) < 6 || !strings.Contains(out.String(), "resuming from its WIP checkpoint") {
		t.Fatalf("narration incomplete:\n%s", out.String())
	}
}
