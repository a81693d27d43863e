//go:build unix

package process

import (
	"testing"

	"golang.org/x/sys/unix"
)

// The signals the Unix ladder sends are the steps it names (Result's
// LadderStep), one for one.
func TestUnixLadderSignals(t *testing.T) {
	if len(ladderSignals) != len(unixLadder) {
		t.Fatalf("%d signals for %d steps", len(ladderSignals), len(unixLadder))
	}
	for i, sig := range ladderSignals {
		if name := unix.SignalName(sig); name != unixLadder[i] {
			t.Errorf("step %d is named %s but sends %s", i, unixLadder[i], name)
		}
	}
}
