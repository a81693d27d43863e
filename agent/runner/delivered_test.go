package runner_test

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/aqfleet/aq/agent/runner"
	"github.com/aqfleet/aq/internal/testenv"
	"github.com/aqfleet/aq/job"
)

// A crash between the push of the result and the final report requeues the
// job; the next attempt — here, or on a host that shares only origin — must
// report the result already on origin, not run the engine again and replace
// the delivered branch (it used to: the result push was a forced '+').
func TestDeliveredResultIsNotMadeAgain(t *testing.T) {
	testenv.Slow(t, "runs whole jobs with real git, processes and waits")
	for _, where := range []string{"same-host", "other-host"} {
		t.Run(where, func(t *testing.T) {
			t.Parallel()
			f := newFixture(t)
			origin := testenv.AddOrigin(t, f.repo)
			script := writeAll + "echo run >> \"$MARK/runs\"\n"
			j := f.job("delivered-"+where, script)
			j.Ship = "branch"
			first := f.run(context.Background(), j, runner.Options{Attempt: 1})
			if first.Failed() || !first.Pushed || first.Redelivered {
				t.Fatalf("first attempt: %+v", first)
			}
			ref := "refs/heads/aq/job/" + j.ID
			delivered := testenv.RemoteRefs(t, origin, "refs/heads/aq/job/")[ref]
			if delivered != first.Commit {
				t.Fatalf("origin %s = %s, want the result %s", ref, delivered, first.Commit)
			}

			g := f
			if where == "other-host" { // a second factory: its own home and clone of origin
				g = newFixture(t)
				testenv.Git(t, g.repo, "remote", "add", "origin", origin)
				testenv.Git(t, g.repo, "fetch", "-q", "origin")
				g.mark = f.mark
			}
			var events []string
			second := g.run(context.Background(), j, runner.Options{Attempt: 2, OnEvent: func(e runner.Event) {
				events = append(events, fmt.Sprintf("%T", e))
			}})
			if second.Failed() || second.Stage != job.Shipped || !second.Redelivered || second.Commit != first.Commit {
				t.Fatalf("second attempt: stage %s reason %q redelivered %v commit %s, want shipped, redelivered %s",
					second.Stage, second.Reason, second.Redelivered, second.Commit, first.Commit)
			}
			if runs := strings.Count(testenv.ReadFile(t, f.marker("runs")), "run"); runs != 1 {
				t.Errorf("the engine ran %d times for one delivered result", runs)
			}
			if now := testenv.RemoteRefs(t, origin, "refs/heads/aq/job/")[ref]; now != first.Commit {
				t.Errorf("the delivered branch was replaced: %s → %s", first.Commit, now)
			}
			if want := []string{"runner.Preparing", "runner.Delivered"}; !slices.Equal(events, want) {
				t.Errorf("events %v, want %v (no engine started)", events, want)
			}
		})
	}
}

// The result push is a compare-and-swap: a branch that moved on origin since
// the run looked (another run delivered meanwhile) is not overwritten.
func TestResultPushDoesNotOverwriteAnotherDelivery(t *testing.T) {
	testenv.Slow(t, "runs whole jobs with real git, processes and waits")
	f := newFixture(t)
	origin := testenv.AddOrigin(t, f.repo)
	j := f.job("race", writeAll+"touch \"$MARK/started\"\nwhile [ ! -e \"$MARK/go\" ]; do sleep 0.05; done\n")
	j.Ship = "branch"
	done := make(chan runner.Outcome, 1)
	go func() { done <- f.run(context.Background(), j, runner.Options{Attempt: 1}) }()
	f.waitMarker("started")
	// Meanwhile another factory delivers a result for the job.
	other := t.TempDir()
	testenv.Git(t, other, "clone", "-q", origin, ".")
	testenv.Git(t, other, "checkout", "-q", "-b", "aq/job/"+j.ID)
	if err := os.WriteFile(other+"/theirs.txt", []byte("theirs\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	testenv.Git(t, other, "add", "theirs.txt")
	testenv.Git(t, other, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "their result\n\naq-job: "+j.ID)
	testenv.Git(t, other, "push", "-q", "origin", "aq/job/"+j.ID)
	theirs := testenv.Git(t, other, "rev-parse", "HEAD")
	if err := os.WriteFile(f.marker("go"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	out := <-done
	if !out.Failed() || out.Reason != job.ReasonShipFailed || out.Pushed {
		t.Fatalf("outcome %+v, want ship_failed without a push", out)
	}
	if now := testenv.RemoteRefs(t, origin, "refs/heads/aq/job/")["refs/heads/aq/job/"+j.ID]; now != theirs {
		t.Fatalf("origin's branch %s, want the other delivery %s kept", now, theirs)
	}
}
