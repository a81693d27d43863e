//go:build unix && !unit

package fleet

import (
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"

	"github.com/aqfleet/aq/demo/coord"
	"github.com/aqfleet/aq/internal/testenv"
)

// factoriesListing is the stub's GET /fleet/factories, as an operator's
// dashboard reads it.
func (e *daemonEnv) factoriesListing() []coord.Factory {
	e.t.Helper()
	var api, token string
	for _, kv := range e.h.Env {
		if v, ok := strings.CutPrefix(kv, "AQ_FLEET_API="); ok {
			api = v
		}
		if v, ok := strings.CutPrefix(kv, "AQ_FLEET_TOKEN="); ok {
			token = v
		}
	}
	req, _ := http.NewRequest(http.MethodGet, api+"/fleet/factories", nil)
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		e.t.Fatal(err)
	}
	defer resp.Body.Close()
	var out struct {
		Factories []coord.Factory `json:"factories"`
	}
	if resp.StatusCode != 200 || json.NewDecoder(resp.Body).Decode(&out) != nil {
		e.t.Fatalf("GET /fleet/factories: %d", resp.StatusCode)
	}
	return out.Factories
}

// advertises reports whether factory fa's last heartbeat, as the listing
// shows it, offers repo (in repos[] and as repo:<name>).
func (e *daemonEnv) advertises(repo string) bool {
	for _, f := range e.factoriesListing() {
		if f.ID == "fa" {
			return slices.Contains(f.Repos, repo) && slices.Contains(f.Capabilities, "repo:"+repo)
		}
	}
	return false
}

// A real `aq daemon` process that runs for a while: a repository cloned
// under AQ_REPO_BASE is advertised by the next heartbeat (the stub's GET
// /fleet/factories lists repo:<new>), a removed one disappears the same way
// — the default cadence is five minutes: the repo base's change is what
// triggers the detection.
func TestDaemonHeartbeatFollowsTheRepoBase(t *testing.T) {
	t.Parallel() // its own home, repos and processes: it runs beside the others
	e := newDaemonEnv(t, false)
	p := e.startDaemon()
	e.waitFor(p, "the first heartbeat offering app", func() bool { return e.advertises("app") })
	beats := func() int64 { return e.stub.Stats().Count(coord.RouteHeartbeat) }

	fresh := filepath.Join(e.h.RepoBase, "fresh")
	testenv.Git(t, e.h.RepoBase, "clone", "-q", e.origin, fresh)
	from := beats()
	e.waitFor(p, "a heartbeat offering the new clone", func() bool { return e.advertises("fresh") })
	if n := beats() - from; n > 2 {
		t.Fatalf("%d heartbeats before one offered the new clone, want the next one", n)
	}
	if err := os.RemoveAll(fresh); err != nil {
		t.Fatal(err)
	}
	from = beats()
	e.waitFor(p, "a heartbeat without the removed repo", func() bool { return !e.advertises("fresh") })
	if n := beats() - from; n > 2 {
		t.Fatalf("%d heartbeats before one dropped the removed repo, want the next one", n)
	}
	if !e.advertises("app") {
		t.Fatal("app is no longer offered")
	}
	p.signal(t, syscall.SIGTERM)
	if code := p.wait(t); code != 0 {
		t.Fatalf("exit %d\n%s", code, p.err)
	}
	if !strings.Contains(p.err.String(), "capabilities changed; the next heartbeat carries them") {
		t.Fatalf("the change was not logged:\n%s", p.err)
	}
}
