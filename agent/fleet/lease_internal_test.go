package fleet

import (
	"context"
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
