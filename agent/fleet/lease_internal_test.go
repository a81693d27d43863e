package fleet

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"
)

// TestLeaseCadenceFitsBeforeTheDeadline: the renewal cadence is shortened
// so that two renewals fit between now and the moment the lease counts as
// lost (its expiry less the stop margin). Found while writing the chaos
// regression test: with a short lease the cadence was cut to a third of the
// time to live, which could be longer than the room the 1 s margin left, so
// the first renewal came after the deadline and a healthy lease was given
// up without one renewal tried.
func TestLeaseCadenceFitsBeforeTheDeadline(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name        string
		ttl, every  time.Duration
		wantShorter bool
	}{
		{"short lease, margin leaves little room", 1300 * time.Millisecond, time.Second, true},
		{"short lease, cadence unset", 1600 * time.Millisecond, 0, true},
		{"long lease, cadence fits", 90 * time.Second, 30 * time.Second, false},
		{"long lease, cadence too long", 90 * time.Second, 60 * time.Second, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			now := time.Now()
			_, cancel := context.WithCancelCause(context.Background())
			defer cancel(nil)
			l := NewJobLease(nil, &Claim{Job: Job{ID: "j"}, LeaseEpoch: 1, LocalExpiry: now.Add(tc.ttl)}, tc.every, cancel, RealClock{}, nil)
			l.mu.Lock()
			every, deadline := l.every, l.expiry.Add(-l.margin)
			l.mu.Unlock()
			if room := deadline.Sub(now); 2*every > room {
				t.Fatalf("cadence %v: two renewals do not fit in the %v before the lease counts as lost", every, room)
			}
			if shorter := every != tc.every; shorter != tc.wantShorter {
				t.Fatalf("cadence %v from %v: shortened=%v, want %v", every, tc.every, shorter, tc.wantShorter)
			}
		})
	}
}

// A renewal the coordinator refuses (409) is a failure and fences the job —
// unless the job's final report is already out: then the report ended the
// lease (the race TestMetricsSeries once lost), and the refusal is neither
// counted nor a reason to cancel anything.
func TestRenewalRefusedAfterTheFinalReport(t *testing.T) {
	t.Parallel()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusConflict)
		_, _ = w.Write([]byte(`{"error":"lease epoch mismatch"}`))
	}))
	defer srv.Close()
	c, err := NewClient(ClientOptions{API: srv.URL, Token: "t", FactoryID: "fa"})
	if err != nil {
		t.Fatal(err)
	}
	for _, reporting := range []bool{false, true} {
		t.Run(fmt.Sprintf("reporting=%v", reporting), func(t *testing.T) {
			ctx, cancel := context.WithCancelCause(context.Background())
			defer cancel(nil)
			l := NewJobLease(c, &Claim{Job: Job{ID: "j"}, LeaseEpoch: 1, LocalExpiry: time.Now().Add(time.Minute)}, time.Second, cancel, RealClock{}, nil)
			var failed int
			l.Failed = func() { failed++ }
			if reporting {
				l.Reporting(context.Background())
			}
			err := l.Confirm(context.Background())
			if err == nil {
				t.Fatal("a refused renewal confirmed the lease")
			}
			wantFailed, wantFenced := 1, true
			if reporting {
				wantFailed, wantFenced = 0, false
			}
			if failed != wantFailed || l.Fenced() != wantFenced || (ctx.Err() != nil) != wantFenced {
				t.Fatalf("failures counted %d (want %d), fenced %v (want %v), job cancelled %v", failed, wantFailed, l.Fenced(), wantFenced, ctx.Err() != nil)
			}
		})
	}
}
