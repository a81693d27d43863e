package coord

import (
	"testing"
	"time"

	"github.com/aqfleet/aq/job"
)

// TestFailRateLimitedParks: a /fleet/fail with reason rate_limited queues
// the job until its notBefore (the engine's reset) without counting the
// attempt, however often it comes and whatever the retry policy; a missing,
// past or malformed notBefore gets job.ParkUntil's rules.
func TestFailRateLimitedParks(t *testing.T) {
	r := newRig(t, Options{})
	tok := r.enroll("f1")
	r.submit("j1", func(j *job.Job) { j.Retry.Max = 0 })
	reset := r.clk.Now().Add(3 * time.Hour)
	for epoch := 1; epoch <= 3; epoch++ {
		if epoch > 1 { // past the last park's reset
			r.clk.Add(3*time.Hour + time.Second)
			r.s.Reap(r.clk.Now())
			reset = r.clk.Now().Add(3 * time.Hour)
		}
		if code, m := r.claim("f1", tok); code != 200 || epochOf(m) != int64(epoch) {
			t.Fatalf("claim %d: %d %v", epoch, code, m)
		}
		code, m := r.call("POST", "/fleet/fail", tok, map[string]any{"jobId": "j1", "factoryId": "f1", "leaseEpoch": epoch,
			"reason": "rate_limited", "retryable": true, "checkpoint": "c1", "notBefore": reset.Format(time.RFC3339)})
		if code != 200 || m["stage"] != "queued" {
			t.Fatalf("park %d: %d %v", epoch, code, m)
		}
		j, _ := r.s.Job("j1")
		if j.Holder != "" || j.Attempts != 0 || !j.NotBefore.Equal(reset) || j.Reason != "rate_limited" || j.Checkpoint != "c1" {
			t.Fatalf("after park %d: %+v", epoch, j)
		}
		if code, _ := r.claim("f1", tok); code != 204 {
			t.Fatalf("claimed before the reset: %d", code)
		}
	}

	for _, tc := range []struct {
		name      string
		notBefore any
		want      time.Duration
	}{
		{"none", nil, job.DefaultParkWait},
		{"past", r.clk.Now().Add(-time.Hour).Format(time.RFC3339), job.MinParkWait},
		{"too_far", r.clk.Now().Add(90 * 24 * time.Hour).Format(time.RFC3339), job.DefaultParkWait},
	} {
		t.Run(tc.name, func(t *testing.T) {
			id := "j-" + tc.name
			r.submit(id, nil)
			code, m := r.claim("f1", tok)
			if code != 200 || m["job"].(map[string]any)["id"] != id {
				t.Fatalf("claim: %d %v", code, m)
			}
			body := map[string]any{"jobId": id, "factoryId": "f1", "leaseEpoch": 1, "reason": "rate_limited", "retryable": true}
			if tc.notBefore != nil {
				body["notBefore"] = tc.notBefore
			}
			if code, m := r.call("POST", "/fleet/fail", tok, body); code != 200 || m["stage"] != "queued" {
				t.Fatalf("park: %d %v", code, m)
			}
			if j, _ := r.s.Job(id); !j.NotBefore.Equal(r.clk.Now().Add(tc.want)) || j.Attempts != 0 {
				t.Errorf("notBefore %s, attempts %d; want now+%s, 0", j.NotBefore, j.Attempts, tc.want)
			}
		})
	}
	// A notBefore that is not a time is a bad request, and the lease stays.
	r.submit("j-bad", nil)
	r.claim("f1", tok)
	if code, _ := r.call("POST", "/fleet/fail", tok, map[string]any{"jobId": "j-bad", "factoryId": "f1", "leaseEpoch": 1, "reason": "rate_limited", "retryable": true, "notBefore": "at two"}); code != 400 {
		t.Errorf("a malformed notBefore: %d, want 400", code)
	}
	if j, _ := r.s.Job("j-bad"); j.Holder != "f1" {
		t.Errorf("a refused park released the lease: %+v", j)
	}
}
