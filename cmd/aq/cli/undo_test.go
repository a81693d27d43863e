package cli

import (
	"os"
	"strings"
	"testing"

	"github.com/aqfleet/aq/cmd/aq/clitest"
	"github.com/aqfleet/aq/demo/coord"
	"github.com/aqfleet/aq/internal/testenv"
)

// TestUndoAMistakeFleet: in fleet mode --replace and rm go through the
// coordinator (PUT and DELETE /fleet/jobs/:id); a job the coordinator does
// not have gives aq job show's line; a running job is refused with the
// coordinator's reason; a coordinator without the routes (today's) refuses
// with one line and changes nothing.
func TestUndoAMistakeFleet(t *testing.T) {
	testenv.Slow(t, "runs commands end to end with real git and a coordinator")
	eachRouteSet(t, func(t *testing.T, routes string) {
		s, dir, _ := clitest.FleetEnvRoutes(t, routes)
		id := testenv.ID("fl-typo")
		m := clitest.WriteManifest(t, dir, id, "script: echo hi > hi.txt\ncapabilities: [has:no-such-tool]")
		if _, errOut, code := runAQ(t, "submit", m); code != 0 {
			t.Fatalf("submit: %s", errOut)
		}
		m = clitest.WriteManifest(t, dir, id, "script: echo hi > hi.txt")
		out, errOut, code := runAQ(t, "submit", "--replace", m)
		if routes == coord.RoutesLegacy {
			if code != 1 || out != "" {
				t.Fatalf("--replace without the route: exit %d %q %q", code, out, errOut)
			}
			clitest.OneErrLine(t, errOut, "cannot replace job "+id+": the coordinator has no PUT /fleet/jobs/:id route")
			if j, _ := s.Job(id); len(j.Capabilities) != 1 {
				t.Fatalf("changed anyway: %+v", j)
			}
			_, errOut, code = runAQ(t, "job", "rm", id)
			if code != 1 {
				t.Fatalf("rm without the route: exit %d %q", code, errOut)
			}
			clitest.OneErrLine(t, errOut, "cannot remove job "+id+": the coordinator has no DELETE /fleet/jobs/:id route")
			if _, ok := s.Job(id); !ok {
				t.Fatal("removed anyway")
			}
			return
		}
		if code != 0 || out != "replaced "+id+" (it was in queued): now in the fleet (queued)\n" {
			t.Fatalf("--replace: exit %d %q %q", code, out, errOut)
		}
		if j, _ := s.Job(id); len(j.Capabilities) != 0 || !strings.Contains(j.BodyMd, "echo hi") {
			t.Fatalf("not replaced: %+v", j)
		}
		// Running (a factory holds it): refused with the coordinator's
		// reason, nothing changed.
		base := strings.TrimSuffix(os.Getenv("AQ_FLEET_API"), "/api")
		caps := []string{"os:linux", "engine:script", "repo:app"}
		tok := clitest.StubReq(t, base, "POST", "/fleet/factories/enroll", s.EnrollToken(), map[string]any{"factoryId": "f-test", "capabilities": caps, "repos": []string{"app"}, "seatLimit": 1})["token"].(string)
		clitest.StubReq(t, base, "POST", "/fleet/claim", tok, map[string]any{"factoryId": "f-test", "capabilities": caps, "repos": []string{"app"}})
		for _, args := range [][]string{{"submit", "--replace", m}, {"job", "rm", id}} {
			_, errOut, code := runAQ(t, args...)
			if code != 2 {
				t.Fatalf("aq %v of a running job: exit %d %q", args, code, errOut)
			}
			clitest.OneErrLine(t, errOut, "(409): job "+id+" is running (assigned on factory f-test")
		}
		if j, _ := s.Job(id); j.Stage != coord.StageAssigned || j.Holder != "f-test" {
			t.Fatalf("a refusal changed the job: %+v", j)
		}
		if _, err := s.Action(id, "requeue"); err != nil {
			t.Fatal(err)
		}
		// rm: shown and removed; an unknown job as aq job show says it.
		_, showErr, showCode := runAQ(t, "job", "show", "nope-x")
		_, rmErr, rmCode := runAQ(t, "job", "rm", "nope-x")
		if rmCode != 2 || rmCode != showCode || rmErr != showErr {
			t.Errorf("rm of an unknown job: %d %q; show: %d %q", rmCode, rmErr, showCode, showErr)
		}
		out, errOut, code = runAQ(t, "job", "rm", id)
		if code != 0 || out != "removed "+id+" from the coordinator (the coordinator had it in queued); its worktree and branches are left to aq gc, which never deletes unmerged work\n" {
			t.Fatalf("rm: %d %q %q", code, out, errOut)
		}
		if _, ok := s.Job(id); ok {
			t.Fatal("the coordinator still has the job")
		}
	})
}
