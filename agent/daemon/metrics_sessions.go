package daemon

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/aqfleet/aq/agent/dispatch"
)

var _ dispatch.SessionMetrics = (*metrics)(nil)

// newSessionCounter is aq_dispatch_sessions_total{event}: Service Bus
// sessions (AQ_SB_SESSIONS=1) accepted, released, and lost (the lock gone
// while held — the job in hand went on under its lease).
func newSessionCounter(reg *prometheus.Registry) *prometheus.CounterVec {
	c := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "aq_dispatch_sessions_total",
		Help: "Service Bus sessions (AQ_SB_SESSIONS=1) by event: accepted, released (closed: no message for it, or stopping), lost (its lock expired or was taken while held)."},
		[]string{"event"})
	reg.MustRegister(c)
	for _, e := range []string{dispatch.SessionAccepted, dispatch.SessionReleased, dispatch.SessionLost} {
		c.WithLabelValues(e)
	}
	return c
}

// Session implements dispatch.SessionMetrics.
func (m *metrics) Session(e string) { m.sessions.WithLabelValues(e).Inc() }
