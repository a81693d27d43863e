package daemon

import (
	"testing"
	"time"
)

// A depth read is never bounded tighter than 5 s, whatever the interval: a
// 50 ms interval on a busy host used to turn every slow TLS answer into a
// read error (TestBrokerDepthGauges failed that way beside the other
// engineers' builds).
func TestDepthReadTimeout(t *testing.T) {
	t.Parallel()
	for _, c := range []struct{ every, want time.Duration }{
		{50 * time.Millisecond, 5 * time.Second},
		{10 * time.Second, 10 * time.Second},
		{5 * time.Minute, 30 * time.Second},
	} {
		if got := depthReadTimeout(c.every); got != c.want {
			t.Errorf("depthReadTimeout(%v) = %v, want %v", c.every, got, c.want)
		}
	}
}
