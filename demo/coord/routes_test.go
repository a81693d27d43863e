package coord

import (
	"io"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"
)

// section9 is the REST surface of the coordinator in service today, as
// the coordinator team's "Gigafactory system overview" lists it, as far as
// the stub implements it, transcribed route by route: the routes the
// coordinator in service today has. Factories: heartbeat, enroll, token
// rotate/revoke — no deregister, no list. Claim: POST /fleet/claim — no
// accept. Lease: renew, release. Jobs: submit, list, get, PATCH (fenced),
// actions — no /fleet/fail. Runs/Events: events. Artifacts: upload, list,
// get, delete. Metrics: queue-state.
var section9 = []string{
	RouteHeartbeat, RouteEnroll, RouteRevoke,
	RouteClaim,
	RouteRenew, RouteRelease,
	RouteSubmit, RouteJobs, RouteJob, RoutePatch, RouteAction,
	RouteEvents,
	RouteArtifactUpload, RouteArtifactList, RouteArtifactGet, RouteArtifactDelete,
	RouteQueueState,
}

// TestLegacyRoutesAreSection9: the legacy route set is exactly §9's routes
// (plus the stub's own instruments), the full set every route; a route
// added to the stub must be placed here on purpose.
func TestLegacyRoutesAreSection9(t *testing.T) {
	full, err := New(Options{})
	if err != nil {
		t.Fatal(err)
	}
	legacy, err := New(Options{Routes: RoutesLegacy})
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range allRoutes {
		if !full.Serves(r) {
			t.Errorf("the full set lacks %s", r)
		}
		want := slices.Contains(section9, r) || slices.Contains(stubRoutes, r)
		if got := legacy.Serves(r); got != want {
			t.Errorf("legacy serves %s: %t, want %t (§9)", r, got, want)
		}
		if !want && !slices.Contains(ProposedRoutes, r) {
			t.Errorf("%s is neither in §9 nor a proposed route", r)
		}
	}
	if _, err := New(Options{Routes: "newest"}); err == nil || !strings.Contains(err.Error(), "legacy") {
		t.Fatalf("unknown route set: %v", err)
	}
	if _, err := New(Options{Without: []string{"GET /fleet/nothing"}}); err == nil {
		t.Fatal("an unknown route in Without was taken")
	}
}

// TestLegacyAnswersUnknownRoutesAsExpress: a route today's coordinator
// lacks is answered as Express answers it — 404, HTML "Cannot POST
// /api/fleet/fail" — for a known path with another method too (no 405);
// a missing job is still the handler's JSON error.
func TestLegacyAnswersUnknownRoutesAsExpress(t *testing.T) {
	r := newRig(t, Options{Routes: RoutesLegacy})
	tok := r.enroll("f1")
	for _, c := range []struct{ method, path string }{
		{"POST", "/api/fleet/fail"},
		{"POST", "/api/fleet/accept"},
		{"POST", "/api/fleet/factories/f1/deregister"},
		{"GET", "/api/fleet/factories"},
		{"DELETE", "/api/fleet/claim"}, // a known path, another method
		{"PUT", "/api/fleet/jobs/j1"},
		{"DELETE", "/api/fleet/jobs/j1"},
	} {
		req, _ := http.NewRequest(c.method, r.url+c.path, strings.NewReader(`{}`))
		req.Header.Set("Authorization", "Bearer "+tok)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 404 || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/html") ||
			!strings.Contains(string(b), "<pre>Cannot "+c.method+" "+c.path+"</pre>") {
			t.Errorf("%s %s: %d %s %q", c.method, c.path, resp.StatusCode, resp.Header.Get("Content-Type"), b)
		}
	}
	// The full set answers the same paths (and has the routes).
	full := newRig(t, Options{Without: []string{RouteQueueState}})
	ftok := full.enroll("f1")
	if code, _ := full.call("GET", "/api/fleet/factories", ftok, nil); code != 200 {
		t.Fatalf("full set: factories list %d", code)
	}
	if code, _ := full.call("GET", "/api/fleet/queue-state", ftok, nil); code != 404 {
		t.Fatalf("Without queue-state: %d", code)
	}
	// A job the stub does not have: JSON from the handler, in both sets.
	code, m := r.call("PATCH", "/api/fleet/jobs/nope", tok, map[string]any{"stage": "building", "leaseEpoch": 1})
	if code != 404 || m["error"] != "no job nope" {
		t.Fatalf("unknown job: %d %v", code, m)
	}
}

// TestLegacyPatchLeavesTheLeaseToRelease: in the legacy set a PATCH to
// failed or queued records the stage and keeps the lease (the job is not
// handed out; a second factory's claim finds nothing) until lease/release
// frees it — a version bump, so a gated factory looks — or, never
// released, until it expires. A re-sent release is idempotent; a release
// at another epoch is fenced.
func TestLegacyPatchLeavesTheLeaseToRelease(t *testing.T) {
	r := newRig(t, Options{Routes: RoutesLegacy, LeaseTTL: time.Minute})
	tok := r.enroll("f1")
	tok2 := r.enroll("f2")
	r.submit("j1", nil)
	r.submit("j2", nil)
	for _, id := range []string{"j1", "j2"} {
		if code, m := r.claim("f1", tok); code != 200 {
			t.Fatalf("claim %s: %d %v", id, code, m)
		}
	}
	patch := func(id, stage string) (int, map[string]any) {
		return r.call("PATCH", "/fleet/jobs/"+id, tok, map[string]any{"stage": stage, "leaseEpoch": 1, "reason": "engine_failed", "detail": "exit 3", "checkpoint": "cafe01"})
	}
	if code, m := patch("j1", "queued"); code != 200 || m["stage"] != "queued" || m["holderFactoryId"] != "f1" {
		t.Fatalf("PATCH queued: %d %v", code, m)
	}
	if j, _ := r.s.Job("j1"); j.Detail != "exit 3" || j.Reason != "engine_failed" || j.Checkpoint != "cafe01" {
		t.Fatalf("PATCH did not record reason, detail, checkpoint: %+v", j)
	}
	if code, _ := r.claim("f2", tok2); code != 204 {
		t.Fatalf("a queued job whose lease is held was handed out: %d", code)
	}
	v := r.s.Version()
	if code, _ := r.call("POST", "/fleet/jobs/j1/lease/release", tok, map[string]any{"factoryId": "f1", "leaseEpoch": 2}); code != 409 {
		t.Fatalf("release at a stale epoch: %d", code)
	}
	if code, m := r.call("POST", "/fleet/jobs/j1/lease/release", tok, map[string]any{"factoryId": "f1", "leaseEpoch": 1}); code != 200 || m["stage"] != "queued" {
		t.Fatalf("release: %d %v", code, m)
	}
	if r.s.Version() == v {
		t.Fatal("freeing a queued job's lease did not bump the version")
	}
	if code, _ := r.call("POST", "/fleet/jobs/j1/lease/release", tok, map[string]any{"factoryId": "f1", "leaseEpoch": 1}); code != 200 {
		t.Fatalf("re-sent release: %d", code)
	}
	if j, _ := r.s.Job("j1"); j.Holder != "" || !j.LeaseExpiresAt.IsZero() || j.Attempts != 1 {
		t.Fatalf("after release: %+v", j)
	}
	if code, m := r.claim("f2", tok2); code != 200 || epochOf(m) != 2 {
		t.Fatalf("claim after release: %d %v", code, m)
	}
	// j2: PATCH failed, never released: held until the lease expires.
	if code, m := patch("j2", "failed"); code != 200 || m["stage"] != "failed" || m["holderFactoryId"] != "f1" {
		t.Fatalf("PATCH failed: %d %v", code, m)
	}
	r.s.Reap(r.clk.Now())
	if j, _ := r.s.Job("j2"); j.Holder != "f1" {
		t.Fatalf("reaped before expiry: %+v", j)
	}
	r.clk.Add(2 * time.Minute)
	r.s.Reap(r.clk.Now())
	if j, _ := r.s.Job("j2"); j.Holder != "" || j.Stage != StageFailed || j.LeaseEpoch != 1 {
		t.Fatalf("after expiry: %+v", j)
	}
	// The full set ends the lease with the PATCH.
	f := newRig(t, Options{})
	ftok := f.enroll("f1")
	f.submit("j1", nil)
	f.claim("f1", ftok)
	if code, m := f.call("PATCH", "/fleet/jobs/j1", ftok, map[string]any{"stage": "queued", "leaseEpoch": 1}); code != 200 || m["holderFactoryId"] != nil {
		t.Fatalf("full set PATCH queued: %d %v", code, m)
	}
	// A release after it (aq's fallback sends one) finds the lease ended:
	// 200, nothing changes.
	v = f.s.Version()
	if code, m := f.call("POST", "/fleet/jobs/j1/lease/release", ftok, map[string]any{"factoryId": "f1", "leaseEpoch": 1}); code != 200 || f.s.Version() != v {
		t.Fatalf("release after a lease-ending PATCH: %d %v", code, m)
	}
}
