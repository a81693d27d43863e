package fleet

import (
	"context"
	"sync"
	"testing"

	"github.com/aqfleet/aq/demo/coord"
	"github.com/aqfleet/aq/internal/testenv"
)

// A claim can advertise fewer repos than the factory has (a daemon leaves
// out the busy ones): the coordinator then hands out only jobs it can start;
// a repo coming back into the list counts as a change for the gate.
func TestClaimReposAndPollerRepos(t *testing.T) {
	testenv.Slow(t, "runs fleet jobs against a coordinator with real git")
	t.Parallel()
	s := startStub(t, coord.Options{})
	w := newWorld(t, "app", "lib")
	f := newFactory(t, s, w, "repos")
	c := f.Agent.Client
	c.SetOffer([]string{"os:linux", "engine:script", "repo:app", "repo:lib"}, []string{"app", "lib"})
	if _, err := EnsureEnrolled(context.Background(), c, EnrollOptions{Path: f.Cfg.CredentialsFile(), EnvToken: s.EnrollToken(), Request: EnrollRequest{FactoryID: "repos"}}); err != nil {
		t.Fatal(err)
	}
	s.submit(t, testenv.ID("on-app"), "app", "script: true")
	s.submit(t, testenv.ID("on-lib"), "lib", "script: true")

	var mu sync.Mutex
	repos := []string{"lib"} // app is busy
	p := &Poller{Client: c, Gate: true, Repos: func() []string { mu.Lock(); defer mu.Unlock(); return append([]string{}, repos...) }}
	cl, err := p.Tick(context.Background())
	if err != nil || cl == nil || cl.Job.ID != testenv.ID("on-lib") {
		t.Fatalf("first claim: %+v %v (want the lib job although the app job is older)", cl, err)
	}
	mu.Lock()
	repos = []string{} // both busy now
	mu.Unlock()
	claims := s.Stats().Count(coord.RouteClaim)
	if cl, err := p.Tick(context.Background()); err != nil || cl != nil {
		t.Fatalf("claim with no idle repo: %+v %v", cl, err)
	}
	// Nothing moved in the queue: the gate holds.
	if cl, err := p.Tick(context.Background()); err != nil || cl != nil || s.Stats().Count(coord.RouteClaim) != claims+1 {
		t.Fatalf("gated tick: %+v %v, claims %d→%d", cl, err, claims, s.Stats().Count(coord.RouteClaim))
	}
	// app is idle again: the gate lets a claim through although the
	// queue's version did not move.
	mu.Lock()
	repos = []string{"app"}
	mu.Unlock()
	cl, err = p.Tick(context.Background())
	if err != nil || cl == nil || cl.Job.ID != testenv.ID("on-app") {
		t.Fatalf("claim after app came back: %+v %v", cl, err)
	}
}
