package coord

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/aqfleet/aq/job"
)

// helperEnv makes the test binary, re-executed, run the stub as a real
// process (for the kill -9 test).
const helperEnv = "AQ_COORD_TEST_HELPER"

func TestMain(m *testing.M) {
	if addr := os.Getenv(helperEnv); addr != "" {
		err := Serve(context.Background(), addr, Options{StateFile: os.Getenv("AQ_COORD_STATE"), EnrollToken: "aqe_helper-token-0123456789"}, os.Stdout)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// clock is a settable clock for the stub.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) Now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *clock) Add(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

type rig struct {
	t   *testing.T
	s   *Server
	url string
	clk *clock
}

func newRig(t *testing.T, o Options) *rig {
	t.Helper()
	clk := &clock{t: time.Date(2030, 1, 1, 12, 0, 0, 0, time.UTC)}
	if o.Now == nil {
		o.Now = clk.Now
	}
	s, err := New(o)
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(s)
	t.Cleanup(hs.Close)
	return &rig{t: t, s: s, url: hs.URL, clk: clk}
}

// call makes one request and decodes a JSON answer into a map.
func (r *rig) call(method, path, token string, body any) (int, map[string]any) {
	r.t.Helper()
	var rd io.Reader
	if body != nil {
		b, _ := json.Marshal(body)
		rd = bytes.NewReader(b)
	}
	req, _ := http.NewRequest(method, r.url+path, rd)
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	req.Header.Set("x-product-id", "prod")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		r.t.Fatal(err)
	}
	defer resp.Body.Close()
	var m map[string]any
	_ = json.NewDecoder(resp.Body).Decode(&m)
	return resp.StatusCode, m
}

func (r *rig) enroll(id string, caps ...string) string {
	r.t.Helper()
	code, m := r.call("POST", "/fleet/factories/enroll", r.s.EnrollToken(), map[string]any{"factoryId": id, "capabilities": caps})
	if code != 200 {
		r.t.Fatalf("enroll %s: %d %v", id, code, m)
	}
	return m["token"].(string)
}

func manifest(id string, mod func(j *job.Job)) map[string]any {
	j := &job.Job{ID: id, Repo: "app", Base: "main", Engine: "script", Capabilities: []string{}, Priority: job.PriorityNormal, DepsMode: "all"}
	if mod != nil {
		mod(j)
	}
	return map[string]any{"manifest": j, "bodyMd": "---\nid: " + id + "\n---\n# " + id + "\n", "idempotencyKey": j.IdempotencyKey}
}

func (r *rig) submit(id string, mod func(j *job.Job)) (int, map[string]any) {
	r.t.Helper()
	return r.call("POST", "/api/fleet/jobs", r.s.EnrollToken(), manifest(id, mod))
}

func claimBody(f string) map[string]any {
	return map[string]any{"factoryId": f, "capabilities": []string{"os:linux", "engine:script"}, "repos": []string{"app"}}
}

func (r *rig) claim(f, tok string) (int, map[string]any) {
	r.t.Helper()
	return r.call("POST", "/fleet/claim", tok, claimBody(f))
}

func epochOf(m map[string]any) int64 { return int64(m["leaseEpoch"].(float64)) }

func TestAuth(t *testing.T) {
	r := newRig(t, Options{})
	tok := r.enroll("f1")
	for _, tc := range []struct {
		name, method, path, token string
		body                      any
		want                      int
	}{
		{"no token", "POST", "/fleet/claim", "", claimBody("f1"), 401},
		{"unknown token", "POST", "/fleet/claim", "nope-nope", claimBody("f1"), 401},
		{"enrollment token cannot claim", "POST", "/fleet/claim", r.s.EnrollToken(), claimBody("f1"), 403},
		{"factory token cannot enroll", "POST", "/fleet/factories/enroll", tok, map[string]any{"factoryId": "f9"}, 401},
		{"another factory's id", "POST", "/fleet/factories/heartbeat", tok, map[string]any{"factoryId": "f2"}, 403},
		{"own heartbeat", "POST", "/fleet/factories/heartbeat", tok, map[string]any{"factoryId": "f1"}, 200},
		{"operator reads queue-state", "GET", "/fleet/queue-state", r.s.EnrollToken(), nil, 200},
	} {
		if code, m := r.call(tc.method, tc.path, tc.token, tc.body); code != tc.want {
			t.Errorf("%s: %d %v, want %d", tc.name, code, m, tc.want)
		}
	}
	// Enrolling again rotates the token; revoking refuses the current one.
	tok2 := r.enroll("f1")
	if code, _ := r.call("POST", "/fleet/factories/heartbeat", tok, map[string]any{"factoryId": "f1"}); code != 401 {
		t.Errorf("old token after rotation: %d", code)
	}
	if err := r.s.RevokeFactory("f1"); err != nil {
		t.Fatal(err)
	}
	if code, m := r.call("POST", "/fleet/factories/heartbeat", tok2, map[string]any{"factoryId": "f1"}); code != 401 || !strings.Contains(m["error"].(string), "revoked") {
		t.Errorf("revoked: %d %v", code, m)
	}
}

func TestLeaseLifecycle(t *testing.T) {
	r := newRig(t, Options{LeaseTTL: time.Minute})
	tok := r.enroll("f1")
	v0 := r.s.Version()
	if code, m := r.submit("j1", nil); code != 201 || m["jobId"] != "j1" || m["stage"] != "queued" {
		t.Fatalf("submit %d %v", code, m)
	}
	if r.s.Version() != v0+1 {
		t.Fatal("create did not bump the version")
	}
	code, m := r.claim("f1", tok)
	if code != 200 || epochOf(m) != 1 {
		t.Fatalf("claim %d %v", code, m)
	}
	jd := m["job"].(map[string]any)
	for _, k := range []string{"id", "productId", "repo", "stage", "capabilities", "priority", "leaseEpoch", "bodyMd", "manifestSnapshot"} {
		if _, ok := jd[k]; !ok {
			t.Errorf("job document lacks %s", k)
		}
	}
	exp, _ := time.Parse(time.RFC3339Nano, m["leaseExpiresAt"].(string))
	if !exp.Equal(r.clk.Now().Add(time.Minute)) {
		t.Errorf("lease expires %v", exp)
	}
	vClaim := r.s.Version()
	// Renew extends, without a version bump.
	r.clk.Add(30 * time.Second)
	code, m = r.call("POST", "/fleet/jobs/j1/lease/renew", tok, map[string]any{"factoryId": "f1", "leaseEpoch": 1})
	if code != 200 || r.s.Version() != vClaim {
		t.Fatalf("renew %d %v", code, m)
	}
	// Stage reports: building, then testing (which ends the lease).
	if code, m := r.call("PATCH", "/fleet/jobs/j1", tok, map[string]any{"stage": "building", "leaseEpoch": 1}); code != 200 || m["stage"] != "building" {
		t.Fatalf("building %d %v", code, m)
	}
	if code, m := r.call("PATCH", "/fleet/jobs/j1", tok, map[string]any{"stage": "testing", "leaseEpoch": 1, "checkpoint": "abc123", "branch": "aq/job/j1", "insights": map[string]any{"tokensIn": 5}}); code != 200 || m["stage"] != "testing" || m["holderFactoryId"] != nil {
		t.Fatalf("testing %d %v", code, m)
	}
	if r.s.Version() != vClaim+2 {
		t.Fatalf("stage changes bumped the version to %d (from %d)", r.s.Version(), vClaim)
	}
	// A re-sent report (lost answer) is idempotent; a stale one is fenced.
	if code, _ := r.call("PATCH", "/fleet/jobs/j1", tok, map[string]any{"stage": "testing", "leaseEpoch": 1}); code != 200 {
		t.Fatalf("re-sent report: %d", code)
	}
	if code, _ := r.call("PATCH", "/fleet/jobs/j1", tok, map[string]any{"stage": "shipped", "leaseEpoch": 1}); code != 409 {
		t.Fatalf("report after the lease ended: %d", code)
	}
	if code, _ := r.call("POST", "/fleet/jobs/j1/lease/renew", tok, map[string]any{"factoryId": "f1", "leaseEpoch": 1}); code != 409 {
		t.Fatalf("renew after the lease ended: %d", code)
	}
	j, _ := r.s.Job("j1")
	if j.Checkpoint != "abc123" || j.Branch != "aq/job/j1" || !strings.Contains(string(j.Insights), "tokensIn") {
		t.Fatalf("job %+v", j)
	}
	// Bad requests are 400s, unknown jobs 404.
	if code, _ := r.call("PATCH", "/fleet/jobs/j1", tok, map[string]any{"stage": "bogus", "leaseEpoch": 1}); code != 400 {
		t.Fatalf("bogus stage: %d", code)
	}
	if code, _ := r.call("PATCH", "/fleet/jobs/nope", tok, map[string]any{"stage": "building", "leaseEpoch": 1}); code != 404 {
		t.Fatalf("unknown job: %d", code)
	}
}

// A periodic checkpoint is a building report after the building report of
// the start: found by the scale-to-zero act, the stub took it for a re-send
// of the first and dropped its checkpoint, so the next owner restarted.
func TestBuildingReportsCarryCheckpoints(t *testing.T) {
	r := newRig(t, Options{LeaseTTL: 10 * time.Second})
	tok := r.enroll("f1")
	r.submit("j1", nil)
	r.claim("f1", tok)
	for _, cp := range []string{"", "wip1", "wip1", "wip2"} {
		body := map[string]any{"stage": "building", "leaseEpoch": 1}
		if cp != "" {
			body["checkpoint"] = cp
		}
		if code, _ := r.call("PATCH", "/fleet/jobs/j1", tok, body); code != 200 {
			t.Fatalf("building %q: %d", cp, code)
		}
		if j, _ := r.s.Job("j1"); cp != "" && j.Checkpoint != cp {
			t.Fatalf("after building with checkpoint %q the job records %q", cp, j.Checkpoint)
		}
	}
}

func TestReaperRequeuesKeepingCheckpoint(t *testing.T) {
	r := newRig(t, Options{LeaseTTL: 10 * time.Second})
	tok := r.enroll("f1")
	r.submit("j1", func(j *job.Job) { j.Retry.Max = 1 })
	r.claim("f1", tok)
	r.call("PATCH", "/fleet/jobs/j1", tok, map[string]any{"stage": "building", "leaseEpoch": 1, "checkpoint": "wip1"})
	if n := r.s.Reap(r.clk.Now().Add(5 * time.Second)); n != 0 {
		t.Fatalf("reaped a live lease")
	}
	v := r.s.Version()
	if n := r.s.Reap(r.clk.Now().Add(11 * time.Second)); n != 1 {
		t.Fatalf("reaped %d", n)
	}
	j, _ := r.s.Job("j1")
	if j.Stage != StageQueued || j.LeaseEpoch != 2 || j.Checkpoint != "wip1" || j.Holder != "" || j.Reason != "lease_lost" || r.s.Version() != v+1 {
		t.Fatalf("reaped job %+v", j)
	}
	// The old holder is fenced everywhere.
	for _, c := range []struct{ method, path string }{{"POST", "/fleet/jobs/j1/lease/renew"}, {"PATCH", "/fleet/jobs/j1"}} {
		if code, _ := r.call(c.method, c.path, tok, map[string]any{"factoryId": "f1", "leaseEpoch": 1, "stage": "testing"}); code != 409 {
			t.Errorf("%s: %d", c.path, code)
		}
	}
	// Found by the chaos harness: a re-send of its last accepted report
	// (building, whose answer a partition lost) is not idempotent once the
	// lease is gone: answered 200, it told a zombie it still held the job.
	if code, _ := r.call("PATCH", "/fleet/jobs/j1", tok, map[string]any{"stage": "building", "leaseEpoch": 1}); code != 409 {
		t.Errorf("re-sent building after the reap: %d, want 409", code)
	}
	if code, _ := r.call("POST", "/fleet/fail", tok, map[string]any{"jobId": "j1", "factoryId": "f1", "leaseEpoch": 1, "reason": "crash", "retryable": true}); code != 409 {
		t.Errorf("fail: %d", code)
	}
	// The next claim gets epoch 3 and the kept checkpoint.
	code, m := r.claim("f1", tok)
	if code != 200 || epochOf(m) != 3 || m["job"].(map[string]any)["checkpoint"] != "wip1" {
		t.Fatalf("reclaim %d %v", code, m)
	}
	var kinds []string
	for _, e := range r.s.Events("j1") {
		kinds = append(kinds, e.Kind)
	}
	if strings.Join(kinds, ",") != "submitted,claimed,stage,reaped,fenced,fenced,fenced,fenced,claimed" {
		t.Fatalf("events %v", kinds)
	}
}

func TestRequeueFencesHolder(t *testing.T) {
	r := newRig(t, Options{})
	tok := r.enroll("f1")
	r.submit("j1", nil)
	r.claim("f1", tok)
	code, m := r.call("POST", "/fleet/jobs/j1/actions/requeue", r.s.EnrollToken(), nil)
	if code != 200 || m["stage"] != "queued" || epochOf(m) != 2 {
		t.Fatalf("requeue %d %v", code, m)
	}
	if code, _ := r.call("PATCH", "/fleet/jobs/j1", tok, map[string]any{"stage": "building", "leaseEpoch": 1}); code != 409 {
		t.Fatalf("old holder: %d", code)
	}
	if code, _ := r.call("POST", "/fleet/jobs/j1/actions/frobnicate", r.s.EnrollToken(), nil); code != 400 {
		t.Fatalf("unknown action: %d", code)
	}
}

func TestFailRetriesAndDeadLetter(t *testing.T) {
	r := newRig(t, Options{MaxBackoff: time.Second})
	tok := r.enroll("f1")
	r.submit("j1", func(j *job.Job) { j.Retry.Max = 1 })
	r.claim("f1", tok)
	fail := map[string]any{"jobId": "j1", "factoryId": "f1", "leaseEpoch": 1, "reason": "verify_failed", "retryable": true, "checkpoint": "c1"}
	code, m := r.call("POST", "/fleet/fail", tok, fail)
	if code != 200 || m["stage"] != "queued" {
		t.Fatalf("fail %d %v", code, m)
	}
	j, _ := r.s.Job("j1")
	if j.Holder != "" || !j.LeaseExpiresAt.IsZero() || j.Attempts != 1 || j.Checkpoint != "c1" || !j.NotBefore.Equal(r.clk.Now().Add(time.Second)) {
		t.Fatalf("after fail %+v", j)
	}
	// A re-sent fail is idempotent.
	if code, m := r.call("POST", "/fleet/fail", tok, fail); code != 200 || m["stage"] != "queued" {
		t.Fatalf("re-sent fail %d %v", code, m)
	}
	// Not claimable during its backoff; then the version moves (reaper) and
	// it is.
	if code, _ := r.claim("f1", tok); code != 204 {
		t.Fatalf("claimed during backoff: %d", code)
	}
	v := r.s.Version()
	r.clk.Add(2 * time.Second)
	r.s.Reap(r.clk.Now())
	if r.s.Version() != v+1 {
		t.Fatal("a job past its backoff did not move the version")
	}
	code, m = r.claim("f1", tok)
	if code != 200 || epochOf(m) != 2 {
		t.Fatalf("reclaim %d %v", code, m)
	}
	fail["leaseEpoch"] = 2
	if code, m := r.call("POST", "/fleet/fail", tok, fail); code != 200 || m["stage"] != "dead_letter" {
		t.Fatalf("exhausted: %d %v", code, m)
	}
	// Not retryable: failed.
	r.submit("j2", func(j *job.Job) { j.Retry.Max = 5 })
	r.claim("f1", tok)
	if code, m := r.call("POST", "/fleet/fail", tok, map[string]any{"jobId": "j2", "factoryId": "f1", "leaseEpoch": 1, "reason": "invalid_manifest", "retryable": false}); code != 200 || m["stage"] != "failed" {
		t.Fatalf("permanent: %d %v", code, m)
	}
	// What the change held (#32): failed for a person to look, whatever
	// the retries left — even from a factory that said retryable.
	for _, reason := range []job.Reason{job.ReasonSecretInChange, job.ReasonProtectedChange} {
		id := "j-" + string(reason)
		r.submit(id, func(j *job.Job) { j.Retry.Max = 5 })
		r.claim("f1", tok)
		if code, m := r.call("POST", "/fleet/fail", tok, map[string]any{"jobId": id, "factoryId": "f1", "leaseEpoch": 1, "reason": string(reason), "retryable": true}); code != 200 || m["stage"] != "failed" {
			t.Fatalf("%s: %d %v, want failed (not retried)", reason, code, m)
		}
	}
}

func TestSchedulingHonoursCapsReposPriorityAge(t *testing.T) {
	r := newRig(t, Options{})
	tok := r.enroll("f1")
	r.submit("old-normal", nil)
	r.clk.Add(time.Second)
	r.submit("new-normal", nil)
	r.submit("high", func(j *job.Job) { j.Priority = job.PriorityHigh })
	r.submit("needs-node", func(j *job.Job) { j.Priority = job.PriorityCritical; j.Capabilities = []string{"node:>=20"} })
	r.submit("other-repo", func(j *job.Job) { j.Priority = job.PriorityCritical; j.Repo = "elsewhere" })
	r.submit("needs-codex", func(j *job.Job) { j.Priority = job.PriorityCritical; j.Engine = "codex" })
	var got []string
	for {
		code, m := r.claim("f1", tok)
		if code == 204 {
			break
		}
		got = append(got, m["job"].(map[string]any)["id"].(string))
	}
	if strings.Join(got, ",") != "high,old-normal,new-normal" {
		t.Fatalf("claim order %v", got)
	}
	// A factory with node 22 and the other repo gets those.
	tok2 := r.enroll("f2")
	code, m := r.call("POST", "/fleet/claim", tok2, map[string]any{"factoryId": "f2", "capabilities": []string{"engine:script", "node:22"}, "repos": []string{"app"}})
	if code != 200 || m["job"].(map[string]any)["id"] != "needs-node" {
		t.Fatalf("f2: %d %v", code, m)
	}
	ok, why := Eligible(&Job{Repo: "elsewhere", Engine: "script"}, Offer{Capabilities: []string{"engine:script"}, Repos: []string{"app"}})
	if ok || !strings.Contains(why, "repo:elsewhere") {
		t.Fatalf("eligible %v %q", ok, why)
	}
	if ok, _ := Eligible(&Job{Repo: "x", RepoURL: "https://example.com/x.git", Engine: "script"}, Offer{Capabilities: []string{"engine:script"}}); !ok {
		t.Fatal("a job with a repo URL needs no local checkout")
	}
	if ok, _ := Eligible(&Job{Repo: "app", Engine: "any"}, Offer{Capabilities: []string{"engine:script"}, Repos: []string{"app"}}); ok {
		t.Fatal("engine any needs a coding engine")
	}
	// sandbox: required is the capability sandbox:full: only a factory that
	// sandboxes engines fully (and offers both levels) gets the job.
	needs := &Job{Repo: "app", Engine: "script", Capabilities: []string{"sandbox:full"}}
	for offer, want := range map[string]bool{"": false, "sandbox:partial": false, "sandbox:full sandbox:partial": true} {
		ok, why := Eligible(needs, Offer{Capabilities: append([]string{"engine:script"}, strings.Fields(offer)...), Repos: []string{"app"}})
		if ok != want || !ok && !strings.Contains(why, "sandbox:full") {
			t.Errorf("offering %q: eligible %v %q, want %v", offer, ok, why, want)
		}
	}
}

func TestDepsBlockUntilShipped(t *testing.T) {
	r := newRig(t, Options{})
	tok := r.enroll("f1")
	r.submit("base", nil)
	if code, m := r.submit("child", func(j *job.Job) { j.Deps = []string{"base"} }); code != 201 || m["stage"] != "blocked" {
		t.Fatalf("child %d %v", code, m)
	}
	r.submit("either", func(j *job.Job) { j.Deps = []string{"base", "missing"}; j.DepsMode = "any" })
	r.submit("both", func(j *job.Job) { j.Deps = []string{"base", "missing"} })
	r.claim("f1", tok)
	if code, _ := r.claim("f1", tok); code != 204 {
		t.Fatal("a blocked job was claimable")
	}
	r.call("PATCH", "/fleet/jobs/base", tok, map[string]any{"stage": "shipped", "leaseEpoch": 1})
	for id, want := range map[string]string{"child": "queued", "either": "queued", "both": "blocked"} {
		if j, _ := r.s.Job(id); j.Stage != want {
			t.Errorf("%s is %s, want %s", id, j.Stage, want)
		}
	}
}

func TestSubmitIdempotency(t *testing.T) {
	r := newRig(t, Options{})
	r.submit("a", func(j *job.Job) { j.IdempotencyKey = "tracker-1" })
	code, m := r.submit("b", func(j *job.Job) { j.IdempotencyKey = "tracker-1" })
	if code != 200 || m["jobId"] != "a" || m["duplicate"] != true {
		t.Fatalf("same key: %d %v", code, m)
	}
	// A retried submit (same id, same manifest) answers the same job.
	if code, m := r.submit("a", func(j *job.Job) { j.IdempotencyKey = "tracker-1" }); code != 200 || m["jobId"] != "a" {
		t.Fatalf("retry: %d %v", code, m)
	}
	body := manifest("a", nil)
	body["bodyMd"] = "---\nid: a\n---\n# another\n"
	if code, _ := r.call("POST", "/fleet/jobs", r.s.EnrollToken(), body); code != 409 {
		t.Fatalf("same id, other manifest: %d", code)
	}
	if len(r.s.Jobs()) != 1 {
		t.Fatalf("%d jobs", len(r.s.Jobs()))
	}
	if code, _ := r.call("POST", "/fleet/jobs", r.s.EnrollToken(), map[string]any{"manifest": map[string]any{"id": "x"}}); code != 400 {
		t.Fatalf("no bodyMd: %d", code)
	}
}

func TestAcceptAndRelease(t *testing.T) {
	r := newRig(t, Options{})
	tok := r.enroll("f1")
	tok2 := r.enroll("f2")
	r.submit("j1", nil)
	code, m := r.call("POST", "/fleet/accept", tok, map[string]any{"jobId": "j1", "factoryId": "f1"})
	if code != 200 || epochOf(m) != 1 {
		t.Fatalf("accept %d %v", code, m)
	}
	if code, _ := r.call("POST", "/fleet/accept", tok2, map[string]any{"jobId": "j1", "factoryId": "f2"}); code != 409 {
		t.Fatalf("second accept: %d", code)
	}
	if code, _ := r.call("POST", "/fleet/accept", tok2, map[string]any{"jobId": "gone", "factoryId": "f2"}); code != 404 {
		t.Fatalf("unknown job: %d", code)
	}
	if code, m := r.call("POST", "/fleet/jobs/j1/lease/release", tok, map[string]any{"factoryId": "f1", "leaseEpoch": 1}); code != 200 || m["stage"] != "queued" {
		t.Fatalf("release %d %v", code, m)
	}
	if j, _ := r.s.Job("j1"); j.Attempts != 0 || j.Holder != "" {
		t.Fatalf("released job %+v", j)
	}
	if code, _ := r.call("POST", "/fleet/accept", tok2, map[string]any{"jobId": "j1", "factoryId": "f2"}); code != 200 {
		t.Fatalf("accept after release: %d", code)
	}
}

func TestStaleFactories(t *testing.T) {
	r := newRig(t, Options{StaleAfter: 90 * time.Second})
	tok := r.enroll("f1")
	r.call("POST", "/fleet/factories/heartbeat", tok, map[string]any{"factoryId": "f1", "running": []map[string]any{{"jobId": "x", "leaseEpoch": 2}}})
	r.clk.Add(89 * time.Second)
	if fs := r.s.Factories(); fs[0].Stale || len(fs[0].Running) != 1 {
		t.Fatalf("fresh: %+v", fs[0])
	}
	r.clk.Add(2 * time.Second)
	if fs := r.s.Factories(); !fs[0].Stale {
		t.Fatal("not stale after 91 s")
	}
	code, m := r.call("GET", "/fleet/factories", tok, nil)
	if code != 200 || !strings.Contains(fmt.Sprint(m), "stale:true") || strings.Contains(fmt.Sprint(m), "tokenHash:") && !strings.Contains(fmt.Sprint(m), "tokenHash:]") {
		t.Fatalf("%d %v", code, m)
	}
}

func TestStatsAndFaultInjection(t *testing.T) {
	r := newRig(t, Options{FailRate: 1, FaultRoutes: []string{RouteClaim}, Seed: 1})
	tok := r.enroll("f1")
	for range 3 {
		if code, _ := r.claim("f1", tok); code != 503 {
			t.Fatalf("fault not injected: %d", code)
		}
	}
	r.call("GET", "/fleet/queue-state", tok, nil)
	code, m := r.call("GET", "/fleet/_stats", "", nil)
	if code != 200 {
		t.Fatal(code)
	}
	st := r.s.Stats()
	if st.Count(RouteClaim) != 3 || st.Routes[RouteClaim].Status["503"] != 3 || st.Count(RouteQueueState) != 1 || st.Count(RouteEnroll) != 1 {
		t.Fatalf("stats %+v (http %v)", st, m)
	}
	// Faults can be changed at run time, over HTTP too.
	if code, _ := r.call("POST", "/fleet/_faults", tok, map[string]any{"failRate": 0}); code != 200 {
		t.Fatal(code)
	}
	if code, _ := r.claim("f1", tok); code != 204 {
		t.Fatalf("after clearing faults: %d", code)
	}
}

func TestStateSurvivesRestart(t *testing.T) {
	file := filepath.Join(t.TempDir(), "state.json")
	r := newRig(t, Options{StateFile: file})
	tok := r.enroll("f1")
	r.submit("j1", nil)
	r.claim("f1", tok)
	r.call("PATCH", "/fleet/jobs/j1", tok, map[string]any{"stage": "building", "leaseEpoch": 1, "checkpoint": "cp"})
	v := r.s.Version()
	// A second stub on the same file: everything acknowledged is there, the
	// enrollment token and the factory's token too.
	r2 := newRig(t, Options{StateFile: file})
	j, ok := r2.s.Job("j1")
	if !ok || j.Stage != StageBuilding || j.LeaseEpoch != 1 || j.Checkpoint != "cp" || j.Holder != "f1" || r2.s.Version() != v {
		t.Fatalf("restored %+v", j)
	}
	if r2.s.EnrollToken() != r.s.EnrollToken() {
		t.Fatal("enrollment token not kept")
	}
	if code, _ := r2.call("POST", "/fleet/jobs/j1/lease/renew", tok, map[string]any{"factoryId": "f1", "leaseEpoch": 1}); code != 200 {
		t.Fatalf("renew after restart: %d", code)
	}
}

// TestKill9KeepsState runs the stub as a real process with --state,
// SIGKILLs it, restarts it and finds every acknowledged change.
func TestKill9KeepsState(t *testing.T) {
	if testing.Short() {
		t.Skip("runs processes")
	}
	state := filepath.Join(t.TempDir(), "state.json")
	start := func(addr string) (*exec.Cmd, string) {
		cmd := exec.Command(os.Args[0], "-test.run=^$")
		cmd.Env = append(os.Environ(), helperEnv+"="+addr, "AQ_COORD_STATE="+state)
		out, _ := cmd.StdoutPipe()
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			if _, after, ok := strings.Cut(sc.Text(), "listening on "); ok {
				go io.Copy(io.Discard, out)
				return cmd, strings.TrimSuffix(after, "/api")
			}
		}
		cmd.Process.Kill()
		cmd.Wait()
		t.Fatal("the stub did not start")
		return nil, ""
	}
	cmd, url := start("127.0.0.1:0")
	r := &rig{t: t, url: url}
	enrollTok := "aqe_helper-token-0123456789"
	code, m := r.call("POST", "/fleet/factories/enroll", enrollTok, map[string]any{"factoryId": "f1"})
	if code != 200 {
		t.Fatal(code, m)
	}
	tok := m["token"].(string)
	r.call("POST", "/fleet/jobs", enrollTok, manifest("j1", nil))
	if code, _ := r.claim("f1", tok); code != 200 {
		t.Fatal(code)
	}
	r.call("PATCH", "/fleet/jobs/j1", tok, map[string]any{"stage": "building", "leaseEpoch": 1, "checkpoint": "before-kill"})
	cmd.Process.Signal(syscall.SIGKILL)
	cmd.Wait()

	addr := strings.TrimPrefix(url, "http://")
	var cmd2 *exec.Cmd
	for range 50 { // the port may take a moment to free
		ln, err := net.Listen("tcp", addr)
		if err == nil {
			ln.Close()
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	cmd2, url2 := start(addr)
	defer func() { cmd2.Process.Kill(); cmd2.Wait() }()
	r2 := &rig{t: t, url: url2}
	code, m = r2.call("GET", "/fleet/jobs/j1", enrollTok, nil)
	if code != 200 || m["stage"] != "building" || m["checkpoint"] != "before-kill" || epochOf(m) != 1 {
		t.Fatalf("after kill -9: %d %v", code, m)
	}
	if code, _ := r2.call("PATCH", "/fleet/jobs/j1", tok, map[string]any{"stage": "testing", "leaseEpoch": 1}); code != 200 {
		t.Fatalf("the factory's token after restart: %d", code)
	}
}

func TestPartition(t *testing.T) {
	r := newRig(t, Options{})
	p, err := NewPartition(strings.TrimPrefix(r.url, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	c := &http.Client{Timeout: 300 * time.Millisecond}
	get := func() error {
		resp, err := c.Get("http://" + p.Addr() + "/fleet/_stats")
		if err == nil {
			resp.Body.Close()
		}
		return err
	}
	if err := get(); err != nil {
		t.Fatal(err)
	}
	p.Cut()
	if get() == nil {
		t.Fatal("cut link answered")
	}
	p.Blackhole()
	if get() == nil {
		t.Fatal("blackholed link answered")
	}
	p.Heal()
	if err := get(); err != nil {
		t.Fatal(err)
	}
}

func TestConcurrentClaimsCAS(t *testing.T) {
	r := newRig(t, Options{Latency: time.Millisecond})
	const n = 20
	for i := range n {
		r.submit(fmt.Sprintf("j%02d", i), nil)
	}
	toks := map[string]string{}
	for i := range 5 {
		id := fmt.Sprintf("f%d", i)
		toks[id] = r.enroll(id)
	}
	var mu sync.Mutex
	got := map[string]int{}
	var wg sync.WaitGroup
	for id, tok := range toks {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				code, m := r.claim(id, tok)
				if code == 204 {
					return
				}
				if code != 200 {
					t.Errorf("claim %d %v", code, m)
					return
				}
				mu.Lock()
				got[m["job"].(map[string]any)["id"].(string)]++
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	if len(got) != n {
		t.Fatalf("%d jobs claimed", len(got))
	}
	for id, c := range got {
		if c != 1 {
			t.Errorf("job %s claimed %d times", id, c)
		}
	}
}

// A re-sent final report is idempotent only while nothing happened to the
// job since: a /fleet/fail re-sent after the job was claimed again (a new
// epoch) is stale, and fenced. Found by the chaos harness (the same rule as
// the re-sent building report).
func TestResentFailAfterReclaimIsFenced(t *testing.T) {
	r := newRig(t, Options{LeaseTTL: 10 * time.Second})
	tok := r.enroll("f1")
	r.submit("j1", func(j *job.Job) { j.Retry.Max = 3 })
	r.claim("f1", tok)
	fail := map[string]any{"jobId": "j1", "factoryId": "f1", "leaseEpoch": 1, "reason": "engine_failed", "retryable": true}
	if code, _ := r.call("POST", "/fleet/fail", tok, fail); code != 200 {
		t.Fatalf("fail: %d", code)
	}
	if code, _ := r.call("POST", "/fleet/fail", tok, fail); code != 200 {
		t.Fatalf("re-sent fail before anything else happened: %d, want 200", code)
	}
	r.clk.Add(time.Hour) // past the retry backoff
	if code, m := r.claim("f1", tok); code != 200 || epochOf(m) != 2 {
		t.Fatalf("reclaim %d %v", code, m)
	}
	if code, _ := r.call("POST", "/fleet/fail", tok, fail); code != 409 {
		t.Fatalf("re-sent fail at epoch 1 after the reclaim at epoch 2: %d, want 409", code)
	}
	if j, _ := r.s.Job("j1"); j.LeaseEpoch != 2 || j.Holder != "f1" || j.Stage != StageAssigned {
		t.Fatalf("job %+v", j)
	}
}

// TestOnCallAudit pins the audit record of every lease call, granted,
// re-sent and refused: the chaos harness's fencing checks read it.
func TestOnCallAudit(t *testing.T) {
	var mu sync.Mutex
	var calls []Call
	r := newRig(t, Options{LeaseTTL: time.Minute, OnCall: func(c Call) {
		mu.Lock()
		defer mu.Unlock()
		c.At = time.Time{}
		calls = append(calls, c)
	}})
	tok, tok2 := r.enroll("f1"), r.enroll("f2")
	r.submit("j1", nil)
	r.submit("j2", func(j *job.Job) { j.Priority = job.PriorityLow })
	steps := []struct {
		method, path, token string
		body                map[string]any
		status              int
	}{
		{"POST", "/fleet/accept", tok, map[string]any{"jobId": "j1", "factoryId": "f1"}, 200},
		{"POST", "/fleet/accept", tok2, map[string]any{"jobId": "j1", "factoryId": "f2"}, 409},
		{"POST", "/fleet/jobs/j1/lease/renew", tok, map[string]any{"factoryId": "f1", "leaseEpoch": 1}, 200},
		{"POST", "/fleet/jobs/j1/lease/renew", tok2, map[string]any{"factoryId": "f2", "leaseEpoch": 1}, 409},
		{"PATCH", "/fleet/jobs/j1", tok, map[string]any{"stage": "building", "leaseEpoch": 1}, 200},
		{"PATCH", "/fleet/jobs/j1", tok, map[string]any{"stage": "review", "leaseEpoch": 1, "reason": "done"}, 200},
		{"PATCH", "/fleet/jobs/j1", tok, map[string]any{"stage": "review", "leaseEpoch": 1, "reason": "done"}, 200},
		{"PATCH", "/fleet/jobs/j1", tok, map[string]any{"stage": "shipped", "leaseEpoch": 1}, 409},
		{"POST", "/fleet/claim", tok2, claimBody("f2"), 200},
		{"POST", "/fleet/fail", tok2, map[string]any{"jobId": "j2", "factoryId": "f2", "leaseEpoch": 1, "reason": "engine_failed", "retryable": false}, 200},
		{"POST", "/fleet/fail", tok2, map[string]any{"jobId": "j2", "factoryId": "f2", "leaseEpoch": 1, "reason": "engine_failed", "retryable": false}, 200},
		{"POST", "/fleet/fail", tok, map[string]any{"jobId": "j2", "factoryId": "f1", "leaseEpoch": 2, "reason": "engine_failed"}, 409},
		{"POST", "/fleet/jobs/j1/lease/release", tok, map[string]any{"factoryId": "f1", "leaseEpoch": 1}, 409},
		{"POST", "/fleet/jobs/nope/lease/release", tok, map[string]any{"factoryId": "f1", "leaseEpoch": 1}, 404},
	}
	for _, s := range steps {
		if code, m := r.call(s.method, s.path, s.token, s.body); code != s.status {
			t.Fatalf("%s %s %v: %d %v, want %d", s.method, s.path, s.body, code, m, s.status)
		}
	}
	want := []Call{
		{Route: RouteAccept, JobID: "j1", Factory: "f1", Epoch: 1, JobEpoch: 1, Stage: StageAssigned, Attempts: 1, Status: 200},
		{Route: RouteAccept, JobID: "j1", Factory: "f2", JobEpoch: 1, Holder: "f1", Stage: StageAssigned, Attempts: 1, Status: 409},
		{Route: RouteRenew, JobID: "j1", Factory: "f1", Epoch: 1, JobEpoch: 1, Holder: "f1", Stage: StageAssigned, Attempts: 1, Status: 200},
		{Route: RouteRenew, JobID: "j1", Factory: "f2", Epoch: 1, JobEpoch: 1, Holder: "f1", Stage: StageAssigned, Attempts: 1, Status: 409},
		{Route: RoutePatch, JobID: "j1", Factory: "f1", Epoch: 1, JobEpoch: 1, Holder: "f1", Stage: StageBuilding, Attempts: 1, Status: 200},
		{Route: RoutePatch, JobID: "j1", Factory: "f1", Epoch: 1, JobEpoch: 1, Holder: "f1", Stage: StageReview, Reason: "done", Attempts: 1, Status: 200},
		{Route: RoutePatch, JobID: "j1", Factory: "f1", Epoch: 1, JobEpoch: 1, Stage: StageReview, Reason: "done", Attempts: 1, Status: 200, Resend: true},
		{Route: RoutePatch, JobID: "j1", Factory: "f1", Epoch: 1, JobEpoch: 1, Stage: StageShipped, Attempts: 1, Status: 409},
		{Route: RouteClaim, JobID: "j2", Factory: "f2", Epoch: 1, JobEpoch: 1, Stage: StageAssigned, Attempts: 1, Status: 200},
		{Route: RouteFail, JobID: "j2", Factory: "f2", Epoch: 1, JobEpoch: 1, Holder: "f2", Stage: StageFailed, Reason: "engine_failed", Attempts: 1, Status: 200},
		{Route: RouteFail, JobID: "j2", Factory: "f2", Epoch: 1, JobEpoch: 1, Stage: StageFailed, Reason: "engine_failed", Attempts: 1, Status: 200, Resend: true},
		{Route: RouteFail, JobID: "j2", Factory: "f1", Epoch: 2, JobEpoch: 1, Stage: StageFailed, Reason: "engine_failed", Attempts: 1, Status: 409},
		{Route: RouteRelease, JobID: "j1", Factory: "f1", Epoch: 1, JobEpoch: 1, Stage: StageReview, Attempts: 1, Status: 409},
	}
	mu.Lock()
	defer mu.Unlock()
	if len(calls) != len(want) {
		t.Fatalf("%d calls audited, want %d: %+v", len(calls), len(want), calls)
	}
	for i := range want {
		if calls[i] != want[i] {
			t.Errorf("call %d:\n got %+v\nwant %+v", i, calls[i], want[i])
		}
	}
}

// Pools are targets with or without live replicas: a declared pool before
// any replica registered; a learnt one from its replicas' offer, kept after
// they left; a replica is never a target of its own, the pool is.
func TestPoolsAreTargetsWithoutLiveReplicas(t *testing.T) {
	r := newRig(t, Options{Pools: []Pool{{Name: "declared", Capabilities: []string{"os:linux", "engine:script"}, Repos: []string{"app"}, Seats: 3}}})
	code, m := r.call("POST", "/fleet/factories/enroll", r.s.EnrollToken(), map[string]any{"factoryId": "pod-1", "pool": "learnt",
		"capabilities": []string{"os:linux", "engine:claude"}, "repos": []string{"web"}})
	if code != 200 {
		t.Fatalf("enroll: %d %v", code, m)
	}
	tok := m["token"].(string)
	if code, _ := r.call("POST", "/fleet/factories/pod-1/deregister", tok, nil); code != 200 {
		t.Fatalf("deregister: %d", code)
	}
	pools := r.s.Pools()
	if len(pools) != 2 || pools[0].Name != "declared" || pools[0].Seats != 3 || pools[1].Name != "learnt" || pools[1].Live != 0 ||
		!slices.Equal(pools[1].Repos, []string{"web"}) || pools[1].Seats != 10 {
		t.Fatalf("pools: %+v", pools)
	}
	var ids []string
	for _, f := range targets(r.s) {
		ids = append(ids, f.ID)
	}
	if !slices.Equal(ids, []string{"declared", "learnt"}) {
		t.Fatalf("targets %v, want the two pools and no replica", ids)
	}
	j := &Job{ID: "j", Repo: "web", Engine: "claude"}
	cands := []Candidate{}
	for _, f := range targets(r.s) {
		cands = append(cands, Candidate{Factory: f})
	}
	if got, ok := ChooseTarget(j, cands); !ok || got != "learnt" {
		t.Fatalf("a web/claude job goes to %q (%v), want the learnt pool", got, ok)
	}
}
