package fleet

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"testing"
	"time"

	"github.com/aqfleet/aq/agent/caps"
	"github.com/aqfleet/aq/agent/config"
	"github.com/aqfleet/aq/agent/holds"
	"github.com/aqfleet/aq/agent/manifest"
	"github.com/aqfleet/aq/agent/runner"
	"github.com/aqfleet/aq/demo/coord"
	"github.com/aqfleet/aq/internal/testenv"
	"github.com/aqfleet/aq/job"
	"github.com/aqfleet/aq/profiles"
)

var idParked = testenv.ID("parked")

// limitedClaude puts on PATH a claude that answers --version and --help as
// the real 2.1.197 does (testenv.FakeClaude) and whose runs write a file,
// then print the recorded rejected rate_limit_event stream with resetsAt
// set to reset, and exit 1.
func limitedClaude(t *testing.T, reset time.Time) {
	t.Helper()
	dir := t.TempDir()
	testenv.FakeClaude{Script: "echo wip > wip.txt", Stream: testenv.RateLimitedStream(t, dir, reset), Exit: 1}.Write(t, dir)
	t.Setenv("PATH", dir+string(os.PathListSeparator)+os.Getenv("PATH"))
	t.Setenv("ANTHROPIC_API_KEY", "sk-ant-test-0123456789")
}

// withClaude offers engine:claude beside the script engine.
func withClaude(_ *config.Config, p *Parts) {
	tokens := []string{"os:linux", "arch:amd64", "engine:script", "engine:claude", "has:git", "repo:app"}
	p.Host = func(context.Context) (*caps.Host, error) { return caps.FromTokens(tokens), nil }
}

func (s *stub) submitClaude(t *testing.T, id string) {
	t.Helper()
	text := fmt.Sprintf("---\nid: %s\nrepo: app\nengine: claude\nship: branch\nretry: { max: 0 }\n---\n# Job %s\n\nDo it.\n", id, id)
	cat, err := profiles.Embedded()
	if err != nil {
		t.Fatal(err)
	}
	j, err := manifest.Parse(id+".md", []byte(text), cat)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.operator(t).Submit(context.Background(), j, []byte(text)); err != nil {
		t.Fatal(err)
	}
}

// TestParkedRunReleasesTheLease: a run claude's usage limit stopped is
// reported as a retryable /fleet/fail with reason rate_limited and the
// reset as notBefore: the lease frees at once, the stub queues the job
// until the reset without counting the attempt (retry.max 0 and still
// queued), no factory gets it before then, and this factory withholds
// engine:claude from its claims and heartbeats until then.
func TestParkedRunReleasesTheLease(t *testing.T) {
	testenv.Slow(t, "runs fleet jobs against a coordinator with real git")
	reset := time.Now().Add(2 * time.Hour).Truncate(time.Second)
	limitedClaude(t, reset)
	s := startStub(t, coord.Options{LeaseTTL: time.Hour, ReapEvery: time.Hour})
	w := newWorld(t, "app")
	s.submitClaude(t, idParked)
	f1 := newFactory(t, s, w, "first", withClaude)

	res, err := f1.runOnce(t, ctxT(t))
	if err != nil {
		t.Fatal(err)
	}
	if !res.Outcome.IsParked() || res.Outcome.Reason != job.ReasonRateLimited || res.Report != "delivered" || res.Stage != job.Inbox ||
		!res.Outcome.ParkedUntil.Equal(reset) || res.Outcome.Checkpoint == "" {
		t.Fatalf("result %+v", res)
	}
	j, _ := s.Job(idParked)
	if j.Stage != coord.StageQueued || j.Holder != "" || !j.LeaseExpiresAt.IsZero() || j.Attempts != 0 || !j.NotBefore.Equal(reset) ||
		j.Reason != string(job.ReasonRateLimited) || j.Checkpoint != res.Outcome.Checkpoint {
		t.Fatalf("stub job after the park: %+v", j)
	}
	if got := kinds(s.Events(idParked)); !slices.Equal(got, []string{"submitted", "claimed", "stage:building", "fail:queued"}) {
		t.Errorf("events %v", got)
	}

	// Held: this factory no longer offers claude; the job is not handed to
	// anyone before the reset.
	if caps, _ := f1.Agent.Client.Offer(); slices.Contains(caps, "engine:claude") || !slices.Contains(caps, "engine:script") {
		t.Errorf("offer while claude is held: %v", caps)
	}
	if h, ok := holds.Open(runner.HoldsPath(f1.Home), nil).Held("claude"); !ok || !h.Until.Equal(reset) || h.Job != idParked {
		t.Errorf("hold %+v, %t", h, ok)
	}
	f2 := newFactory(t, s, w, "second", withClaude)
	if res2, err := f2.runOnce(t, ctxT(t)); !errors.Is(err, ErrNoJob) {
		t.Fatalf("another factory before the reset: %+v, %v; want no job", res2, err)
	}
	if n := s.Reap(time.Now()); n != 0 {
		t.Errorf("the reaper found %d leases: the park released it", n)
	}
}
