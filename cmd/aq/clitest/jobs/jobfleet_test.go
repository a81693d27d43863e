//go:build !unit

package jobs

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/aqfleet/aq/cmd/aq/cli"
	"github.com/aqfleet/aq/cmd/aq/clitest"
	"github.com/aqfleet/aq/demo/coord"
	"github.com/aqfleet/aq/internal/testenv"
)

var (
	idFleetShow   = testenv.ID("fleet-show")
	idFleetQueued = testenv.ID("fleet-queued")
)

// TestFleetJobCommands: in fleet mode aq job show|ship|reject|requeue act
// through the coordinator; a job it does not have, an action it refuses
// (409 with its reason), a route it lacks and a coordinator that is down
// each give one line and their exit code.
func TestFleetJobCommands(t *testing.T) {
	testenv.Slow(t, "runs fleet jobs against the stub end to end")
	s, dir, _ := clitest.FleetEnv(t)
	m := clitest.WriteManifest(t, dir, idFleetShow, "script: echo shown > s.txt\nship: branch")
	q := clitest.WriteManifest(t, dir, idFleetQueued, "script: true\ncapabilities: [has:no-such-tool-anywhere]")
	if _, errOut, code := runAQ(t, "submit", m, q); code != 0 {
		t.Fatalf("submit: %d %s", code, errOut)
	}
	if _, errOut, code := runAQ(t, "run", "--once"); code != 0 {
		t.Fatalf("run: %d %s", code, errOut)
	}

	out, errOut, code := runAQ(t, "job", "show", idFleetShow)
	if code != 0 || !strings.Contains(out, "stage") || !strings.Contains(out, "shipped") || !strings.Contains(out, "events:") || !strings.Contains(out, "artifacts:") || !strings.Contains(out, "engine-stdout") {
		t.Fatalf("show: %d %q %q", code, out, errOut)
	}
	out, _, code = runAQ(t, "job", "show", "--json", idFleetShow)
	var v cli.FleetJobView
	if code != 0 || json.Unmarshal([]byte(out), &v) != nil || v.Job.ID != idFleetShow || v.Job.Stage != "shipped" || len(v.Events) < 3 || len(v.Artifacts) < 1 || v.Logs == "" {
		t.Fatalf("show --json: %d %s", code, out)
	}

	// Refused: a queued job does not ship (409 and the coordinator's reason).
	_, errOut, code = runAQ(t, "job", "ship", idFleetQueued)
	if code != 2 {
		t.Fatalf("ship of a queued job: exit %d %q", code, errOut)
	}
	clitest.OneErrLine(t, errOut, "the coordinator refused to ship job "+idFleetQueued+" (409): job "+idFleetQueued+" is queued; only review or testing jobs ship")
	if j, _ := s.Job(idFleetQueued); j.Stage != coord.StageQueued {
		t.Fatalf("moved anyway: %s", j.Stage)
	}
	// A shipped job is not requeued.
	_, errOut, code = runAQ(t, "job", "requeue", idFleetShow)
	if code != 2 {
		t.Fatalf("requeue of a shipped job: %d", code)
	}
	clitest.OneErrLine(t, errOut, "(409): job "+idFleetShow+" is shipped")

	// Done through the coordinator: reject with a reason, then requeue.
	out, errOut, code = runAQ(t, "job", "reject", "--why", "not this week", idFleetQueued)
	if code != 0 || !strings.Contains(out, "rejected "+idFleetQueued+" (the coordinator has it in failed)") {
		t.Fatalf("reject: %d %q %q", code, out, errOut)
	}
	if j, _ := s.Job(idFleetQueued); j.Stage != coord.StageFailed || j.Detail != "not this week" {
		t.Fatalf("after reject: %+v", j)
	}
	if out, _, code = runAQ(t, "job", "requeue", idFleetQueued); code != 0 || !strings.Contains(out, "requeued") {
		t.Fatalf("requeue: %d %q", code, out)
	}
	if j, _ := s.Job(idFleetQueued); j.Stage != coord.StageQueued {
		t.Fatalf("after requeue: %s", j.Stage)
	}

	// A job the coordinator does not have.
	for _, args := range [][]string{{"job", "show", "nope-x"}, {"job", "requeue", "nope-x"}, {"job", "logs", "-f", "nope-x"}} {
		_, errOut, code = runAQ(t, args...)
		if code != 2 {
			t.Fatalf("%v: exit %d %q", args, code, errOut)
		}
		clitest.OneErrLine(t, errOut, "the coordinator has no job nope-x")
	}

	// A coordinator without the actions route.
	s.SetWithout(coord.RouteAction)
	_, errOut, code = runAQ(t, "job", "requeue", idFleetQueued)
	if code != 1 {
		t.Fatalf("no actions route: exit %d %q", code, errOut)
	}
	clitest.OneErrLine(t, errOut, "the coordinator has no POST /fleet/jobs/:id/actions/:action")
	s.SetWithout(coord.RouteEvents, coord.RouteArtifactList)
	out, _, code = runAQ(t, "job", "show", idFleetShow)
	if code != 0 || !strings.Contains(out, "the coordinator has no GET /fleet/jobs/:id/events") || !strings.Contains(out, "GET /fleet/jobs/:id/artifacts") {
		t.Fatalf("show without events and artifacts: %d %q", code, out)
	}
	s.SetWithout()

	// A coordinator that is down.
	s.Kill()
	_, errOut, code = runAQ(t, "job", "requeue", idFleetQueued)
	if code != 1 {
		t.Fatalf("coordinator down: exit %d %q", code, errOut)
	}
	clitest.OneErrLine(t, errOut, "cannot requeue job "+idFleetQueued+": coordinator unavailable")
}

// TestFleetStatusJSONCoordinator: aq status --json in fleet mode carries
// the coordinator's view — counts, jobs, factories with health and load,
// alerts — names a route the coordinator lacks, and says when it is down.
func TestFleetStatusJSONCoordinator(t *testing.T) {
	testenv.Slow(t, "runs fleet jobs against the stub end to end")
	s, dir, _ := clitest.FleetEnv(t)
	q := clitest.WriteManifest(t, dir, idFleetQueued, "script: true\ncapabilities: [has:no-such-tool-anywhere]")
	if _, errOut, code := runAQ(t, "submit", q); code != 0 {
		t.Fatal(errOut)
	}
	if _, _, code := runAQ(t, "run", "--once"); code != 3 { // enrolls and heartbeats; nothing it can run
		t.Fatalf("run: %d", code)
	}
	b := statusJSON(t)
	c := b.Coordinator
	if c == nil || !c.Reachable || c.Counts["queued"] != 1 || len(c.Jobs) != 1 || c.Jobs[0].ID != idFleetQueued || len(c.Factories) != 1 || c.Factories[0].ID != "cli-factory" {
		t.Fatalf("coordinator %+v", c)
	}
	if w := c.Jobs[0].Why; !strings.Contains(w, "has:no-such-tool-anywhere") {
		t.Fatalf("why %q", w)
	}
	kinds := map[string]bool{}
	for _, a := range c.Alerts {
		kinds[a.Kind] = true
	}
	if !kinds["unroutable"] {
		t.Fatalf("alerts %+v", c.Alerts)
	}
	s.SetWithout(coord.RouteFactories)
	if c := statusJSON(t).Coordinator; !c.Reachable || len(c.Missing) != 1 || c.Missing[0] != "GET /fleet/factories" || len(c.Jobs) != 1 {
		t.Fatalf("without factories: %+v", c)
	}
	out, _, _ := runAQ(t, "status")
	if !strings.Contains(out, "(the coordinator has no GET /fleet/factories)") {
		t.Fatalf("text status: %q", out)
	}
	s.Kill()
	if c := statusJSON(t).Coordinator; c.Reachable || c.Error == "" || c.UnreachableSince.IsZero() {
		t.Fatalf("down: %+v", c)
	}
}

func statusJSON(t *testing.T) cli.Board {
	t.Helper()
	out, errOut, code := runAQ(t, "status", "--json")
	var b cli.Board
	if code != 0 || json.Unmarshal([]byte(out), &b) != nil {
		t.Fatalf("status --json: %d %q %q", code, out, errOut)
	}
	return b
}
