package scaledemo

import "testing"

// KEDA's documented examples for maxReplicaCount, and the accurate
// strategy's two branches.
func TestAccurate(t *testing.T) {
	for _, c := range []struct {
		queue, target, max, running, pending, want int64
	}{
		// keda.sh ScaledJob spec, maxReplicaCount table
		{10, 1, 3, 0, 0, 3},
		{10, 2, 3, 0, 0, 3},
		{10, 1, 3, 1, 0, 2},
		{10, 1, 100, 0, 0, 10},
		{4, 5, 3, 0, 0, 1},
		// idle: nothing queued, nothing started
		{0, 1, 3, 0, 0, 0},
		{0, 1, 3, 2, 0, 0},
		// replicas started for these messages have not taken them yet
		{3, 1, 10, 3, 3, 0},
		{3, 1, 5, 2, 2, 1},
		// …but near the ceiling the first branch wins and KEDA starts more
		// (they find nothing and exit 3): faithful, not tuned
		{3, 1, 5, 3, 3, 2},
		// at the ceiling: none, whatever the backlog
		{50, 1, 3, 3, 0, 0},
		// running replicas busy with taken messages do not count against
		// the backlog (the messages are gone from the queue)
		{2, 1, 10, 4, 0, 2},
		{1, 0, 3, 0, 0, 1}, // a zero target is one message per replica
	} {
		if got := Accurate(c.queue, c.target, c.max, c.running, c.pending); got != c.want {
			t.Errorf("Accurate(queue %d, target %d, max %d, running %d, pending %d) = %d, want %d", c.queue, c.target, c.max, c.running, c.pending, got, c.want)
		}
	}
}
