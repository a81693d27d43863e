//go:build unix

package wire

import (
	"bytes"
	"path/filepath"
	"strings"
	"testing"

	"github.com/aqfleet/aq/demo/coord"
	"github.com/aqfleet/aq/internal/testenv"
	"github.com/aqfleet/aq/job"
)

// TestWireSandboxRequired (#23): a factory whose engines run unsandboxed
// (AQ_SANDBOX=off) neither offers sandbox:full nor gets a job whose
// manifest says sandbox: required; a coordinator that hands it out all the
// same has it refused at admission (sandbox_unavailable, one line, exit 1)
// before anything runs — the job failed retryable, for another factory.
func TestWireSandboxRequired(t *testing.T) {
	e := newWireEnv(t, coord.Options{})
	id := testenv.ID("wire-sandbox")
	ran := filepath.Join(e.root, "ran")
	e.post(id, "repo: app\nengine: script\nship: branch\nsandbox: required\nscript: touch "+ran, "# job")
	before := tree(t, e.root)

	r := e.run("run", "--once")
	if r.Code != 3 || !strings.Contains(r.Stderr, "no runnable job in the fleet") {
		t.Fatalf("an unsandboxed factory: want exit 3, no job:\n%s", clipped(r))
	}
	for _, x := range append(e.co.requests("POST /fleet/claim"), e.co.requests("POST /fleet/factories/enroll")...) {
		if bytes.Contains(x.ReqBody, []byte(`"sandbox:full"`)) {
			t.Fatalf("%s %s offers sandbox:full: %s", x.Method, x.Path, x.ReqBody)
		}
	}

	// A coordinator that ignores what the factory offers.
	e.co.tamperRequest(func(x *exchange) {
		if x.route("POST /fleet/claim") {
			x.ReqBody = bytes.Replace(x.ReqBody, []byte(`"capabilities":[`), []byte(`"capabilities":["sandbox:full",`), 1)
		}
	})
	r = e.run("run", "--once")
	line := oneAQLine(t, r)
	if r.Code != 1 || !strings.Contains(line, "refused (sandbox_unavailable): the job requires sandbox:full and engines run unsandboxed here") {
		t.Fatalf("want exit 1 and the refusal:\n%s", clipped(r))
	}
	if testenv.Exists(ran) {
		t.Fatal("the script ran")
	}
	assertOnlyUnder(t, e.root, before, "home")
	e.assertNoBranch()
	if j := e.job(id); j.Reason != string(job.ReasonSandboxUnavailable) || j.Stage == coord.StageFailed || j.Stage == coord.StageShipped {
		t.Fatalf("the coordinator has the job %s (%s), want it sandbox_unavailable and retryable", j.Stage, j.Reason)
	}
}
