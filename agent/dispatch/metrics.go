package dispatch

import "time"

// Metrics receives the dispatch metrics (docs/observability.md, "Metrics"): messages by outcome,
// settlements that failed, and the dispatch lag. The daemon backs it with
// Prometheus; implementations must be safe for concurrent use.
type Metrics interface {
	// Message counts one message by its outcome.
	Message(o Outcome)
	// SettleFailed counts a settlement the broker did not take (the message
	// comes back when its lock expires).
	SettleFailed(s Settlement)
	// Lag observes the time from the broker enqueuing a message to the
	// coordinator accepting its job.
	Lag(d time.Duration)
}

// MetricsFuncs adapts functions to Metrics; nil fields are skipped.
type MetricsFuncs struct {
	OnMessage      func(Outcome)
	OnSettleFailed func(Settlement)
	OnLag          func(time.Duration)
}

var _ Metrics = MetricsFuncs{}

// Message calls OnMessage.
func (m MetricsFuncs) Message(o Outcome) {
	if m.OnMessage != nil {
		m.OnMessage(o)
	}
}

// SettleFailed calls OnSettleFailed.
func (m MetricsFuncs) SettleFailed(s Settlement) {
	if m.OnSettleFailed != nil {
		m.OnSettleFailed(s)
	}
}

// Lag calls OnLag.
func (m MetricsFuncs) Lag(d time.Duration) {
	if m.OnLag != nil {
		m.OnLag(d)
	}
}
