package fleet

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/aqfleet/aq/demo/coord"
	"github.com/aqfleet/aq/internal/testenv"
)

// virtualClock is a scaled clock: Sleep advances virtual time at once, and
// fails once the simulation's end is reached. Requests still go over real
// HTTP to the stub, which counts them.
type virtualClock struct {
	mu  sync.Mutex
	now time.Time
	end time.Time
}

var errSimulationOver = errors.New("simulated time is over")

func (v *virtualClock) Now() time.Time {
	v.mu.Lock()
	defer v.mu.Unlock()
	return v.now
}

func (v *virtualClock) Sleep(ctx context.Context, d time.Duration) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	v.now = v.now.Add(d)
	if !v.now.Before(v.end) {
		return errSimulationOver
	}
	return nil
}

// idleHour is one simulated idle hour of a factory: what it asks the
// coordinator, per route, counted by the stub.
type idleHour struct {
	Claims, QueueStates, Heartbeats int64
}

func (h idleHour) Total() int64 { return h.Claims + h.QueueStates + h.Heartbeats }

// simulateIdleHour runs the poll loop (plain or gated) and the heartbeat
// loop against an empty queue on a virtual clock with production cadences
// (POLL_SECONDS=15, AQ_HEARTBEAT_SEC=30, idle backoff up to 8×, jitter on).
// It warms up for one virtual hour (the first claim, the backoff ramp), then
// counts the stub's requests during the second hour.
func simulateIdleHour(tb testing.TB, s *stub, c *Client, gate bool) idleHour {
	tb.Helper()
	start := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	pollClock := &virtualClock{now: start, end: start.Add(time.Hour)}
	p := &Poller{Client: c, Base: 15 * time.Second, Gate: gate, Clock: pollClock}
	ctx := context.Background()
	if _, err := p.Next(ctx); !errors.Is(err, errSimulationOver) { // the warm-up hour
		tb.Fatalf("warm-up: %v", err)
	}
	s.ResetStats()
	pollClock.mu.Lock()
	pollClock.end = pollClock.now.Add(time.Hour)
	pollClock.mu.Unlock()
	if _, err := p.Next(ctx); !errors.Is(err, errSimulationOver) {
		tb.Fatalf("measured hour: %v", err)
	}
	hbClock := &virtualClock{now: start, end: start.Add(time.Hour)}
	hb := &Heartbeater{Client: c, Interval: 30 * time.Second, Running: &Running{}, Clock: hbClock}
	if err := hb.Run(ctx); err != nil {
		tb.Fatal(err)
	}
	st := s.Stats()
	return idleHour{Claims: st.Count(coord.RouteClaim), QueueStates: st.Count(coord.RouteQueueState), Heartbeats: st.Count(coord.RouteHeartbeat)}
}

func idleClient(tb testing.TB, s *stub) *Client {
	tb.Helper()
	w := newWorld(tb, "app")
	f := newFactory(tb, s, w, "idler")
	c := f.Agent.Client
	c.SetOffer([]string{"os:linux", "engine:script"}, []string{"app"})
	if _, err := EnsureEnrolled(context.Background(), c, EnrollOptions{Path: f.Cfg.CredentialsFile(), EnvToken: s.EnrollToken(), Request: EnrollRequest{FactoryID: "idler"}}); err != nil {
		tb.Fatal(err)
	}
	return c
}

// TestIdleRequestBudget holds the idle cost: the gated path makes no claim
// at all while the queue's version does not move; the plain path's claims
// are bounded by the idle backoff (at most one per 8×POLL_SECONDS, jittered).
func TestIdleRequestBudget(t *testing.T) {
	testenv.Slow(t, "runs fleet jobs against a coordinator with real git")
	t.Parallel()
	s := startStub(t, coord.Options{})
	c := idleClient(t, s)
	plain := simulateIdleHour(t, s, c, false)
	gated := simulateIdleHour(t, s, c, true)
	t.Logf("idle requests per hour: plain %+v (total %d), gated %+v (total %d)", plain, plain.Total(), gated, gated.Total())
	if gated.Claims != 0 {
		t.Fatalf("the gated path made %d claims while idle", gated.Claims)
	}
	// 8×15 s = 120 s between idle ticks, ±20%: 25..38 an hour.
	for _, n := range []int64{plain.Claims, gated.QueueStates} {
		if n < 25 || n > 38 {
			t.Fatalf("idle ticks per hour %d, want 25..38", n)
		}
	}
	if plain.QueueStates != 0 {
		t.Fatal("the plain path read the queue-state")
	}
	// 30 s ±10%: 109..134 an hour.
	if plain.Heartbeats < 109 || plain.Heartbeats > 134 {
		t.Fatalf("heartbeats per hour %d", plain.Heartbeats)
	}
}

// BenchmarkIdleRequestsPerHour reports, from the stub's per-route counters,
// what one idle factory asks of the coordinator in an hour on the plain poll
// path and on the gated path. Each iteration simulates two hours on a
// virtual clock (the first is warm-up; the second is counted), over real
// HTTP, with production cadences.
func BenchmarkIdleRequestsPerHour(b *testing.B) {
	s := startStub(b, coord.Options{})
	c := idleClient(b, s)
	for _, mode := range []struct {
		name string
		gate bool
	}{{"plain", false}, {"gated", true}} {
		b.Run(mode.name, func(b *testing.B) {
			var sum idleHour
			for range b.N {
				h := simulateIdleHour(b, s, c, mode.gate)
				if mode.gate && h.Claims != 0 {
					b.Fatalf("the gated path made %d claims while idle", h.Claims)
				}
				sum.Claims += h.Claims
				sum.QueueStates += h.QueueStates
				sum.Heartbeats += h.Heartbeats
			}
			n := float64(b.N)
			b.ReportMetric(float64(sum.Claims)/n, "claims/h")
			b.ReportMetric(float64(sum.QueueStates)/n, "queue-state/h")
			b.ReportMetric(float64(sum.Heartbeats)/n, "heartbeats/h")
			b.ReportMetric(float64(sum.Total())/n, "requests/h")
		})
	}
}
