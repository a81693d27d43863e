package coord

import (
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/aqfleet/aq/job"
)

// TestReplace: PUT /fleet/jobs/:id gives a dead-lettered job a new
// manifest — its repo fixed — back to queued, its epoch bumped, attempts
// kept, the checkpoint of the old repository dropped, an event recorded; a
// running job is refused 409 naming its holder; a job in review is not
// replaced; an unknown job is a JSON 404; the path and the manifest must
// name the same job; another job's idempotency key is refused.
func TestReplace(t *testing.T) {
	r := newRig(t, Options{MaxBackoff: time.Second})
	tok := r.enroll("f1")
	op := r.s.EnrollToken()
	claim := func() (int, map[string]any) {
		return r.call("POST", "/fleet/claim", tok, map[string]any{"factoryId": "f1", "capabilities": []string{"os:linux", "engine:script"}, "repos": []string{"webap", "webapp"}})
	}
	r.submit("j1", func(j *job.Job) { j.Repo = "webap" })
	if code, m := claim(); code != 200 {
		t.Fatalf("claim %d %v", code, m)
	}
	if code, m := r.call("POST", "/fleet/fail", tok, map[string]any{"jobId": "j1", "factoryId": "f1", "leaseEpoch": 1, "reason": "repo_unavailable", "retryable": false, "checkpoint": "c1"}); code != 200 {
		t.Fatalf("fail %d %v", code, m)
	}
	before, _ := r.s.Job("j1")
	v0 := r.s.Version()

	body := manifest("j1", func(j *job.Job) { j.Repo, j.Priority = "webapp", job.PriorityHigh })
	body["bodyMd"] = "---\nid: j1\nrepo: webapp\n---\n# fixed\n"
	code, m := r.call("PUT", "/api/fleet/jobs/j1", op, body)
	if code != 200 || m["jobId"] != "j1" || m["stage"] != StageQueued || m["replaced"] != before.Stage {
		t.Fatalf("replace %d %v (it was %s)", code, m, before.Stage)
	}
	j, _ := r.s.Job("j1")
	if j.Repo != "webapp" || j.Priority != job.PriorityHigh || j.BodyMd != body["bodyMd"] || j.LeaseEpoch != before.LeaseEpoch+1 ||
		j.Attempts != before.Attempts || j.Checkpoint != "" || j.Reason != "" || j.Holder != "" || r.s.Version() <= v0 {
		t.Fatalf("after replace: %+v (before %+v)", j, before)
	}
	if evs := r.s.Events("j1"); evs[len(evs)-1].Kind != "replaced" {
		t.Fatalf("events %+v", evs)
	}
	// It runs again, as the new manifest's job.
	code, m = claim()
	if code != 200 || m["job"].(map[string]any)["repo"] != "webapp" {
		t.Fatalf("claim after replace: %d %v", code, m)
	}
	epoch := epochOf(m)
	// Running now: refused, nothing changed.
	code, m = r.call("PUT", "/fleet/jobs/j1", op, manifest("j1", nil))
	if code != 409 || !strings.Contains(m["error"].(string), "is running (assigned on factory f1") {
		t.Fatalf("replace of a running job: %d %v", code, m)
	}
	if j, _ := r.s.Job("j1"); j.Repo != "webapp" || j.Stage != StageAssigned {
		t.Fatalf("a refused replace changed the job: %+v", j)
	}
	if code, m := r.call("PATCH", "/fleet/jobs/j1", tok, map[string]any{"stage": "review", "leaseEpoch": epoch}); code != 200 {
		t.Fatalf("review: %d %v", code, m)
	}
	if code, m := r.call("PUT", "/fleet/jobs/j1", op, manifest("j1", nil)); code != 409 || !strings.Contains(m["error"].(string), "is review: its work is done") {
		t.Fatalf("replace of a job in review: %d %v", code, m)
	}

	for _, c := range []struct {
		name, path string
		body       map[string]any
		want       int
		says       string
	}{
		{"unknown job", "/fleet/jobs/nope", manifest("nope", nil), 404, "no job nope"},
		{"path and manifest disagree", "/fleet/jobs/j1", manifest("j2", nil), 400, `manifest.id "j2" is not the job "j1"`},
	} {
		code, m := r.call("PUT", c.path, op, c.body)
		if code != c.want || !strings.Contains(m["error"].(string), c.says) {
			t.Errorf("%s: %d %v", c.name, code, m)
		}
	}
	r.submit("k1", func(j *job.Job) { j.IdempotencyKey = "key-1" })
	r.submit("k2", nil)
	if code, m := r.call("PUT", "/fleet/jobs/k2", op, manifest("k2", func(j *job.Job) { j.IdempotencyKey = "key-1" })); code != 409 || !strings.Contains(m["error"].(string), "job k1's") {
		t.Errorf("another job's key: %d %v", code, m)
	}
	if code, _ := r.call("PUT", "/fleet/jobs/k1", op, manifest("k1", func(j *job.Job) { j.IdempotencyKey = "key-1" })); code != 200 {
		t.Errorf("its own key: %d", code)
	}
}

// TestRemove: DELETE /fleet/jobs/:id deletes a job that does not run, with
// its events and artifacts, names the jobs that wait for it, and bumps the
// queue-state version; a running job is refused 409; an unknown one is a
// JSON 404; the id can be submitted again, fresh.
func TestRemove(t *testing.T) {
	r := newRig(t, Options{})
	tok := r.enroll("f1")
	op := r.s.EnrollToken()
	r.submit("gone", nil)
	r.submit("child", func(j *job.Job) { j.Deps = []string{"gone"} })
	r.submit("run", nil)
	code, m := r.claim("f1", tok)
	if code != 200 || m["job"].(map[string]any)["id"] != "gone" {
		t.Fatalf("claim %d %v", code, m)
	}
	if code, m := r.call("DELETE", "/fleet/jobs/gone", op, nil); code != 409 || !strings.Contains(m["error"].(string), "is running") {
		t.Fatalf("remove of a running job: %d %v", code, m)
	}
	if code, m := r.call("POST", "/fleet/jobs/gone/artifacts", tok, upload("hello\n", 1)); code != 201 {
		t.Fatalf("upload: %d %v", code, m)
	}
	if code, m := r.call("POST", "/fleet/jobs/gone/actions/reject", op, nil); code != 200 {
		t.Fatalf("reject: %d %v", code, m)
	}
	v0 := r.s.Version()
	code, m = r.call("DELETE", "/api/fleet/jobs/gone", op, nil)
	if code != 200 || m["jobId"] != "gone" || m["stage"] != StageFailed {
		t.Fatalf("remove %d %v", code, m)
	}
	if deps, _ := m["dependents"].([]any); len(deps) != 1 || deps[0] != "child" {
		t.Errorf("dependents %v", m["dependents"])
	}
	if _, ok := r.s.Job("gone"); ok || len(r.s.Events("gone")) != 0 || len(r.s.Artifacts("gone")) != 0 || r.s.Version() <= v0 {
		t.Fatalf("still there: job %t, %d events, %d artifacts; version %d→%d", ok, len(r.s.Events("gone")), len(r.s.Artifacts("gone")), v0, r.s.Version())
	}
	if code, m := r.call("DELETE", "/fleet/jobs/gone", op, nil); code != http.StatusNotFound || m["error"] != "no job gone" {
		t.Fatalf("remove twice: %d %v", code, m)
	}
	if code, m := r.submit("gone", nil); code != 201 || m["stage"] != StageQueued {
		t.Fatalf("submitted again: %d %v", code, m)
	}
	if j, _ := r.s.Job("gone"); j.Attempts != 0 || j.LeaseEpoch != 0 || len(r.s.Events("gone")) != 1 {
		t.Fatalf("the new job carries the old one's state: %+v, %d events", j, len(r.s.Events("gone")))
	}
}
