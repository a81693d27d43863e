package scaledemo

import (
	"context"
	"sync"
	"time"
)

// Accurate is KEDA's ScaledJob "accurate" scaling strategy: how many jobs
// (here: aq replicas) to start on this poll, given the queue length the
// scaler read, the messages one job consumes (targetAverageValue, the
// trigger's messageCount), the ceiling (maxReplicaCount), the jobs not yet
// finished (running) and those among them not yet taking work (pending):
//
//	maxScale = min(maxReplicaCount, ceil(queueLength / targetAverageValue))
//	if maxScale + running > maxReplicaCount { return maxReplicaCount - running }
//	return maxScale - pending
//
// KEDA documents it for consumers that remove a message when they take it —
// aq completes the message at the accept — so the queue length is the
// backlog alone and running jobs must not be subtracted from it again.
func Accurate(queueLength, targetAverage, maxReplicas, running, pending int64) int64 {
	if targetAverage <= 0 {
		targetAverage = 1
	}
	maxScale := min(maxReplicas, (queueLength+targetAverage-1)/targetAverage)
	n := maxScale - pending
	if maxScale+running > maxReplicas {
		n = maxReplicas - running
	}
	return max(n, 0)
}

// Scaler polls a queue length and starts replicas by Accurate, like KEDA's
// ScaledJob controller with one azure-servicebus trigger.
type Scaler struct {
	// Read is the trigger: the subscription's active message count, read
	// from the management API's runtime properties.
	Read func(ctx context.Context) (int64, error)
	// Replicas counts the replicas not yet finished, and those among them
	// not yet taking work.
	Replicas func() (running, pending int64)
	// Start starts one replica.
	Start         func(ctx context.Context)
	TargetAverage int64 // messageCount (1: one replica per message)
	MaxReplicas   int64
	Poll          time.Duration

	mu      sync.Mutex
	reads   int
	errs    int
	lastErr error
	started int
}

// Run polls until ctx ends.
func (s *Scaler) Run(ctx context.Context) {
	t := time.NewTicker(s.Poll)
	defer t.Stop()
	for {
		s.tick(ctx)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

func (s *Scaler) tick(ctx context.Context) {
	q, err := s.Read(ctx)
	s.mu.Lock()
	s.reads++
	if err != nil {
		s.errs++
		s.lastErr = err
		s.mu.Unlock()
		return
	}
	s.mu.Unlock()
	running, pending := s.Replicas()
	for range Accurate(q, s.TargetAverage, s.MaxReplicas, running, pending) {
		if ctx.Err() != nil {
			return
		}
		s.Start(ctx)
		s.mu.Lock()
		s.started++
		s.mu.Unlock()
	}
}

// Stats are the scaler's reads, failed reads (and the last error) and
// replicas started.
func (s *Scaler) Stats() (reads, errs, started int, lastErr error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.reads, s.errs, s.started, s.lastErr
}
