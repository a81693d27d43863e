package dispatch

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/aqfleet/aq/internal/testenv"
)

// fakePoll answers ticks from a channel of jobs (none: no job) and counts
// them; Wait is short.
type fakePoll struct {
	mu    sync.Mutex
	ticks int
	jobs  chan Accepted
	err   error
}

func (p *fakePoll) Tick(ctx context.Context) (Accepted, bool, error) {
	p.mu.Lock()
	p.ticks++
	err := p.err
	p.mu.Unlock()
	if err != nil {
		return Accepted{}, false, err
	}
	select {
	case a := <-p.jobs:
		return a, true, nil
	default:
		return Accepted{}, false, nil
	}
}

func (p *fakePoll) Wait() time.Duration { return time.Millisecond }

func (p *fakePoll) count() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.ticks
}

// sourceRig drives a Source's poll loop with health reports by hand (a
// Receiver exists, as with a broker, but is never run).
type sourceRig struct {
	s     *Source
	poll  *fakePoll
	slots *Semaphore
	ran   chan string
	done  chan error
	stop  context.CancelFunc
}

func newSourceRig(t *testing.T, slots int, grace time.Duration) *sourceRig {
	t.Helper()
	r := &sourceRig{poll: &fakePoll{jobs: make(chan Accepted, 10)}, slots: NewSemaphore(slots), ran: make(chan string, 10), done: make(chan error, 1)}
	release := make(chan struct{})
	t.Cleanup(func() { close(release) })
	s, err := NewSource(SourceOptions{
		Poll: r.poll, Slots: r.slots, ConnectGrace: grace,
		Handler: func(ctx context.Context, a Accepted) { r.ran <- a.Message.JobID; <-release },
		Fatal:   func(err error) bool { return errors.Is(err, errFatal) },
	})
	if err != nil {
		t.Fatal(err)
	}
	recv, err := New(Options{Config: Config{FactoryID: "fa", ConnectionString: "Endpoint=sb://127.0.0.1:1;SharedAccessKeyName=k;SharedAccessKey=v;UseDevelopmentEmulator=true"},
		Acceptor: AcceptFunc(func(context.Context, string) (Accepted, error) { return Accepted{}, nil }), Handler: s.o.Handler, Slots: r.slots})
	if err != nil {
		t.Fatal(err)
	}
	s.recv = recv // present, never run: health comes from the test
	r.s = s
	ctx, cancel := context.WithCancel(context.Background())
	r.stop = cancel
	go func() { r.done <- s.pollLoop(ctx) }()
	t.Cleanup(func() { cancel(); <-r.done })
	return r
}

var errFatal = errors.New("credentials refused")

// Until the broker says anything the poll path waits; when it never does,
// polling takes over after the grace.
func TestSourceConnectGrace(t *testing.T) {
	r := newSourceRig(t, 1, 50*time.Millisecond)
	if r.s.Live() != LiveNone || r.poll.count() != 0 {
		t.Fatalf("live %s, %d ticks before the grace passed", r.s.Live(), r.poll.count())
	}
	testenv.WaitFor(t, time.Minute, "polling after the grace", func() bool { return r.poll.count() > 0 })
	if r.s.Live() != LivePoll {
		t.Fatalf("live %s", r.s.Live())
	}
}

// Healthy broker: no tick, every slot free for the receiver. Unhealthy: the
// poll path ticks at once and runs what it claims (holding a slot). Healthy
// again: the poll path gives its slot back and stops ticking.
func TestSourceHandOff(t *testing.T) {
	r := newSourceRig(t, 2, time.Hour)
	r.s.brokerHealth(Health{Healthy: true})
	if r.s.Live() != LiveBroker {
		t.Fatalf("live %s", r.s.Live())
	}
	r.s.brokerHealth(Health{Healthy: false, Err: errors.New("link detached")})
	testenv.WaitFor(t, time.Minute, "poll ticks", func() bool { return r.poll.count() > 0 })
	r.poll.jobs <- Accepted{Message: Message{JobID: "j1"}}
	if got := <-r.ran; got != "j1" {
		t.Fatalf("ran %s", got)
	}
	if r.slots.Free() == 2 {
		t.Fatal("the polled job holds no slot")
	}
	r.s.brokerHealth(Health{Healthy: true})
	testenv.WaitFor(t, time.Minute, "the poll path's slot back", func() bool { return r.slots.Free() == 1 }) // j1 keeps its own
	n := r.poll.count()
	r.s.brokerHealth(Health{Healthy: true}) // no change: nothing happens
	if r.s.Live() != LiveBroker || r.poll.count() != n {
		t.Fatalf("live %s, ticks %d→%d", r.s.Live(), n, r.poll.count())
	}
	// The receiver stopping is not an outage.
	r.s.brokerHealth(Health{Healthy: false, Err: ErrStopped})
	if r.s.Live() != LiveBroker {
		t.Fatalf("live %s after the receiver stopped", r.s.Live())
	}
}

// With every slot busy the poll path takes nothing: no tick until a slot
// frees.
func TestSourcePollWaitsForSlot(t *testing.T) {
	r := newSourceRig(t, 1, time.Hour)
	if !r.slots.TryAcquire() {
		t.Fatal("no slot")
	}
	r.s.brokerHealth(Health{Healthy: false, Err: errors.New("down")})
	if r.poll.count() != 0 {
		t.Fatalf("%d ticks with no free slot", r.poll.count())
	}
	r.slots.Release()
	testenv.WaitFor(t, time.Minute, "a tick once the slot is free", func() bool { return r.poll.count() > 0 })
}

// A fatal poll error (credentials refused) ends the loop with it.
func TestSourceFatalPollError(t *testing.T) {
	r := newSourceRig(t, 1, time.Hour)
	r.poll.mu.Lock()
	r.poll.err = errFatal
	r.poll.mu.Unlock()
	r.s.brokerHealth(Health{Healthy: false, Err: errors.New("down")})
	if err := <-r.done; !errors.Is(err, errFatal) {
		t.Fatalf("pollLoop = %v", err)
	}
	r.done <- nil // for the cleanup
	if r.slots.Free() != 1 {
		t.Fatal("the slot was not given back")
	}
}

// Without a broker, Run polls at once and returns when ctx ends, after its
// Handlers returned.
func TestSourcePollOnlyRun(t *testing.T) {
	p := &fakePoll{jobs: make(chan Accepted, 1)}
	ran := make(chan struct{})
	s, err := NewSource(SourceOptions{Poll: p, Slots: NewSemaphore(1), Handler: func(ctx context.Context, a Accepted) {
		close(ran)
		time.Sleep(20 * time.Millisecond)
	}})
	if err != nil {
		t.Fatal(err)
	}
	p.jobs <- Accepted{Message: Message{JobID: "j"}}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- s.Run(ctx) }()
	<-ran
	if s.Live() != LivePoll {
		t.Fatalf("live %s", s.Live())
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if s.Live() != LiveNone {
		t.Fatalf("live %s after Run", s.Live())
	}
}

// A dispatch's MessageID is jobId or jobId:generation; the factory takes
// both silently, and runs the body's job with a warning for any other.
func TestDispatchMessageID(t *testing.T) {
	if id := DispatchMessageID("j1", 3, 0); id != "j1:3" {
		t.Fatal(id)
	}
	if id := DispatchMessageID("j1", 3, 2); id != "j1:3.2" {
		t.Fatal(id)
	}
	m := Message{JobID: "j1", TargetFactoryID: "fa"}
	for id, ok := range map[string]bool{"j1": true, "j1:3": true, "j1:3.2": true, "j2:1": false, "j1x": false, "j1x:1": false} {
		sm, err := m.ServiceBusMessageWithID(id, false)
		if err != nil {
			t.Fatal(err)
		}
		m, warning, err := parse(sm.Body, *sm.MessageID, sm.ApplicationProperties, "fa", "")
		if err != nil || m.JobID != "j1" || (warning == "") != ok {
			t.Errorf("MessageID %q: job %q, warning %q, err %v", id, m.JobID, warning, err)
		}
	}
}
