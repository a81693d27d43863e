package fleetcheck

import (
	"bytes"
	"context"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/aqfleet/aq/agent/fleet"
	"github.com/aqfleet/aq/agent/manifest"
	"github.com/aqfleet/aq/demo/coord"
	"github.com/aqfleet/aq/demo/coord/coordtest"
	"github.com/aqfleet/aq/internal/testenv"
)

var update = flag.Bool("update", false, "rewrite the golden files")

// park is the tests' park: long enough that the claim right after the
// park goes out before its notBefore on a loaded machine, short enough to
// wait for.
const park = 3 * time.Second

// testBudgets ride out nothing: the stub answers at once.
func testBudgets() *fleet.Budgets {
	b := Budgets()
	b.MinWait, b.MaxWait = 5*time.Millisecond, 50*time.Millisecond
	return &b
}

// stub starts a coordinator stub with o on 127.0.0.1.
func stub(t *testing.T, o coord.Options) (*coord.Server, string) {
	t.Helper()
	s := coordtest.Start(t, o)
	return s.Server, s.API
}

func check(t *testing.T, o coord.Options) (*Report, *coord.Server) {
	t.Helper()
	s, api := stub(t, o)
	rep, err := Run(context.Background(), Options{API: api, EnrollToken: s.EnrollToken(), Nonce: "golden", Park: park, Budgets: testBudgets(), Version: "test"})
	if err != nil {
		t.Fatal(err)
	}
	rep.API = "http://127.0.0.1:PORT/api"
	return rep, s
}

func render(t *testing.T, rep *Report) string {
	t.Helper()
	var b bytes.Buffer
	if err := Render(&b, rep); err != nil {
		t.Fatal(err)
	}
	return b.String()
}

func golden(t *testing.T, name, got string) {
	t.Helper()
	p := filepath.Join("testdata", name)
	if *update {
		if err := os.WriteFile(p, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	if got != string(want) {
		t.Errorf("%s differs (go test -run %s -update rewrites it):\n--- got\n%s\n--- want\n%s", p, t.Name(), got, want)
	}
}

// The stub's two route sets, each against its expected table: every route
// of the full set present and every rule held; the legacy set missing
// accept, fail, deregister and the factories list, its PATCH ignoring a
// park's notBefore and counting the attempt — all with fallbacks, nothing
// wrong. The check leaves its jobs terminal and holds nothing.
func TestRouteSets(t *testing.T) {
	testenv.Slow(t, "waits out unavailability and coordinator round trips")
	t.Parallel()
	for _, routes := range coord.RouteSets {
		t.Run(routes, func(t *testing.T) {
			t.Parallel()
			rep, s := check(t, coord.Options{Routes: routes})
			golden(t, routes+".golden", render(t, rep))
			if rep.Failed() {
				t.Errorf("the stub's %s route set fails the check", routes)
			}
			for _, id := range rep.Jobs {
				j, kept := s.Job(id)
				switch {
				case routes == coord.RoutesFull && kept:
					t.Errorf("job %s kept (%s): the full set has DELETE /fleet/jobs/:id", id, j.Stage)
				case routes == coord.RoutesLegacy && (!kept || (j.Stage != coord.StageShipped && j.Stage != coord.StageFailed) || j.Holder != ""):
					t.Errorf("job %s left %s, held by %q", id, j.Stage, j.Holder)
				}
			}
			if len(rep.Jobs) != 2 {
				t.Errorf("jobs %v", rep.Jobs)
			}
			for _, f := range s.AllFactories() {
				if f.ID == rep.FactoryID && !f.Deregistered && routes == coord.RoutesFull {
					t.Errorf("factory %s not deregistered", f.ID)
				}
			}
		})
	}
}

// Each of the stub's breaks — one rule of the contract broken — shows in
// the rows it breaks and nowhere else: the table is the full set's but for
// those rows.
func TestBreaksAreCaught(t *testing.T) {
	testenv.Slow(t, "waits out unavailability and coordinator round trips")
	t.Parallel()
	for _, tc := range []struct {
		brk  string
		rows map[string]Verdict
	}{
		{coord.BreakStaleEpoch, map[string]Verdict{RuleStaleEpoch: Wrong}},
		{coord.BreakDropCheckpoint, map[string]Verdict{RuleCheckpoint: Wrong}},
		{coord.BreakResendConflict, map[string]Verdict{RuleResend: Wrong}},
		{coord.BreakIgnoreNotBefore, map[string]Verdict{RuleParkHolds: Missing, RuleParkNoAttempt: Missing, RuleVersionDue: Unchecked}},
		{coord.BreakDoubleLease, map[string]Verdict{RuleAcceptHeld: Wrong}},
		{coord.BreakFrozenVersion, map[string]Verdict{RuleVersionMoves: Wrong, RuleVersionDue: Wrong}},
		{coord.BreakLogStaleEpoch, map[string]Verdict{RuleLogRoutes: Wrong}},
	} {
		t.Run(tc.brk, func(t *testing.T) {
			t.Parallel()
			if tc.brk == coord.BreakFrozenVersion {
				// The check waits up to 10 s for a due version that never moves.
				testenv.Slow(t, "waits out the check's 10 s for a parked job's version to move")
			}
			rep, _ := check(t, coord.Options{Breaks: []string{tc.brk}})
			for _, row := range rep.Rows {
				want, broken := tc.rows[row.ID]
				if !broken {
					want = Present
					if row.ID == RuleBroker {
						want = Unchecked
					}
				}
				if row.Verdict != want {
					t.Errorf("%s: %s (%s), want %s", row.ID, row.Verdict, row.Seen, want)
				}
				if broken && want != Unchecked && (row.Seen == "" || row.AQ == "") {
					t.Errorf("%s: says neither what was seen nor what aq does: %+v", row.ID, row)
				}
			}
			if wrong := rep.Count(Wrong) > 0; rep.Failed() != wrong {
				t.Errorf("Failed() = %v with %d wrong", rep.Failed(), rep.Count(Wrong))
			}
			if t.Failed() {
				t.Log(render(t, rep))
			}
		})
	}
}

// Every break the stub knows is caught by a test above.
func TestEveryBreakTested(t *testing.T) {
	src, err := os.ReadFile("check_test.go")
	if err != nil {
		t.Fatal(err)
	}
	for _, b := range coord.AllBreaks {
		name := map[string]string{coord.BreakStaleEpoch: "BreakStaleEpoch", coord.BreakDropCheckpoint: "BreakDropCheckpoint", coord.BreakResendConflict: "BreakResendConflict",
			coord.BreakIgnoreNotBefore: "BreakIgnoreNotBefore", coord.BreakDoubleLease: "BreakDoubleLease", coord.BreakFrozenVersion: "BreakFrozenVersion",
			coord.BreakLogStaleEpoch: "BreakLogStaleEpoch"}[b]
		if name == "" || !strings.Contains(string(src), "{coord."+name+",") {
			t.Errorf("break %s has no case in TestBreaksAreCaught", b)
		}
	}
}

// A coordinator that answers a fifth of the requests 503: the check's
// calls are retried as aq's are, and the table is the full set's.
func TestRidesOutUnavailability(t *testing.T) {
	testenv.Slow(t, "waits out unavailability")
	t.Parallel()
	rep, s := check(t, coord.Options{FailRate: 0.2, Seed: 7})
	golden(t, "full.golden", render(t, rep))
	var n int64
	for _, rs := range s.Stats().Routes {
		n += rs.Status["503"]
	}
	if n == 0 {
		t.Fatal("no 503 was injected: nothing was ridden out")
	}
}

// submitForeign posts a job that is not the check's but that the check's
// offer fits (a script job on a repository URL, needing no capability): a
// real job of this kind is the one way a claim can hand the check real
// work.
func submitForeign(t *testing.T, s *coord.Server, api, id string) {
	t.Helper()
	c, err := fleet.NewClient(fleet.ClientOptions{API: api, Token: s.EnrollToken()})
	if err != nil {
		t.Fatal(err)
	}
	body := "---\nid: " + id + "\nrepo: https://git.example/org/real.git\nengine: script\nscript: make\n---\n# Real work\n"
	j, err := manifest.Parse(id+".md", []byte(body), nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Submit(context.Background(), j, []byte(body)); err != nil {
		t.Fatal(err)
	}
}

// A claim that hands the check a job not its own: the check gives it back
// at once, unstarted (not an attempt), names it, and goes on by accept —
// or, without accept, stops there, ending its own job.
func TestGivesBackAJobNotItsOwn(t *testing.T) {
	testenv.Slow(t, "waits out unavailability and coordinator round trips")
	t.Parallel()
	for _, routes := range coord.RouteSets {
		t.Run(routes, func(t *testing.T) {
			t.Parallel()
			s, api := stub(t, coord.Options{Routes: routes})
			submitForeign(t, s, api, "real-work")
			rep, err := Run(context.Background(), Options{API: api, EnrollToken: s.EnrollToken(), Nonce: "given", Park: park, Budgets: testBudgets()})
			if err != nil {
				t.Fatal(err)
			}
			j, _ := s.Job("real-work")
			if j.Stage != coord.StageQueued || j.Holder != "" || j.Attempts != 0 {
				t.Errorf("the real job is %s, held by %q, %d attempts", j.Stage, j.Holder, j.Attempts)
			}
			if len(rep.GivenBack) == 0 || rep.GivenBack[0] != "real-work" {
				t.Errorf("given back %v", rep.GivenBack)
			}
			text := render(t, rep)
			t.Log(text)
			if !strings.Contains(text, "given back at once, unstarted: real-work") {
				t.Errorf("the table does not name the job:\n%s", text)
			}
			for _, ev := range s.Events("real-work") {
				if ev.Kind == "stage" || ev.Kind == "fail" {
					t.Errorf("the check reported on the real job: %+v", ev)
				}
			}
			switch routes {
			case coord.RoutesFull:
				if rep.Incomplete != "" || rep.Count(Wrong) != 0 || rep.Row(fleet.RouteClaim).Verdict != Present {
					t.Errorf("full: %s", text)
				}
			case coord.RoutesLegacy:
				if !strings.Contains(rep.Incomplete, "real-work, a job not its own") {
					t.Errorf("legacy: incomplete %q", rep.Incomplete)
				}
			}
			for _, id := range rep.Jobs {
				if j, kept := s.Job(id); kept && (j.Holder != "" || (j.Stage != coord.StageShipped && j.Stage != coord.StageFailed)) {
					t.Errorf("the check's job %s left %s, held by %q", id, j.Stage, j.Holder)
				}
			}
		})
	}
}

// A coordinator that stops taking reports mid-check: the check stops,
// says why, marks what it did not reach, and still gives back its lease
// (by /fleet/fail, which still answers) and deregisters.
func TestStopsWhenTheCoordinatorStopsAnswering(t *testing.T) {
	t.Parallel()
	s, api := stub(t, coord.Options{FailRate: 1, FaultRoutes: []string{coord.RoutePatch}})
	b := testBudgets()
	b.Report, b.FinalReport = 300*time.Millisecond, 300*time.Millisecond
	rep, err := Run(context.Background(), Options{API: api, EnrollToken: s.EnrollToken(), Nonce: "stops", Park: park, Budgets: b})
	if err != nil {
		t.Fatal(err)
	}
	if !rep.Failed() || !strings.Contains(rep.Incomplete, "PATCH /fleet/jobs/:id") || !strings.Contains(rep.Incomplete, "503") {
		t.Fatalf("incomplete %q", rep.Incomplete)
	}
	if r := rep.Row(RuleStaleEpoch); r.Verdict != Unchecked || r.Seen != "the check stopped before it" {
		t.Errorf("row %+v", r)
	}
	if r := rep.Row(fleet.RouteClaim); r.Verdict != Present {
		t.Errorf("claim %+v", r)
	}
	// Removed: the stub refuses to remove a job that runs, so its lease
	// was given back first.
	if j, kept := s.Job(rep.Jobs[0]); kept || rep.Row(fleet.RouteRemove).Verdict != Present {
		t.Errorf("the check's job is kept (%s, held by %q), remove %+v", j.Stage, j.Holder, rep.Row(fleet.RouteRemove))
	}
	if r := rep.Row(fleet.RouteDeregister); r.Verdict != Present {
		t.Errorf("deregister %+v", r)
	}
	if !strings.Contains(render(t, rep), "the check stopped early: ") {
		t.Error("the table does not say the check stopped")
	}
}
