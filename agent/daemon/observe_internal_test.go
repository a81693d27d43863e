package daemon

import (
	"testing"
	"time"
)

// TestDepthReadTimeout: a depth read gets its interval, never less than the
// floor (a short interval on a busy host made slow answers count as read
// errors) and never more than 30 s.
func TestDepthReadTimeout(t *testing.T) {
	for every, want := range map[time.Duration]time.Duration{
		50 * time.Millisecond: depthReadFloor,
		10 * time.Second:      10 * time.Second,
		time.Minute:           30 * time.Second,
	} {
		if got := depthReadTimeout(every); got != want {
			t.Errorf("depthReadTimeout(%v) = %v, want %v", every, got, want)
		}
	}
}
