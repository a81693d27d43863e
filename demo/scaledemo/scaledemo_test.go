package scaledemo

import (
	"bytes"
	"context"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/aqfleet/aq/internal/testenv"
)

func TestMain(m *testing.M) { os.Exit(testenv.Main(m)) }

// TestScaleToZero runs the act: the stub and the scaler here, the peer and
// the replicas as real processes of the built binary. Every check must pass.
func TestScaleToZero(t *testing.T) {
	if testing.Short() {
		t.Skip("the scale-to-zero act takes about half a minute")
	}
	var out bytes.Buffer
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	sum, err := Run(ctx, Options{Dir: t.TempDir(), Out: &out, AQ: testenv.BuildAQ(t)})
	if err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	if sum.Skipped != "" {
		t.Skip(sum.Skipped)
	}
	if !sum.Passed() {
		t.Fatalf("checks failed:\n%s", out.String())
	}
	if len(sum.Checks) < 7 || sum.Peak != maxReplicas {
		t.Fatalf("%d checks, peak %d:\n%s", len(sum.Checks), sum.Peak, out.String())
	}
	for _, want := range []string{"kill -9", "Idle again", "Expected events"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("narration lacks %q", want)
		}
	}
	t.Logf("scale-to-zero act passed in %s", time.Duration(sum.DurationMS)*time.Millisecond)
	if testing.Verbose() {
		t.Log(out.String())
	}
}
