package daemon_test

import (
	"strings"
	"testing"

	"github.com/aqfleet/aq/agent/dispatch"
	"github.com/aqfleet/aq/agent/fleet"
	"github.com/aqfleet/aq/demo/coord"
	"github.com/aqfleet/aq/demo/sbpeer/sbpeertest"
	"github.com/aqfleet/aq/internal/testenv"
)

// A broker is configured, but the coordinator is today's (legacy: no POST
// /fleet/accept): the daemon refuses the broker path at start, saying so in
// one line, and the (gated) poll path takes work; the status file and `aq
// status` carry why.
func TestBrokerRefusedWithoutAccept(t *testing.T) {
	t.Parallel()
	r := newRig(t, rigOptions{broker: true, noPublisher: true, gate: true, routes: coord.RoutesLegacy})
	r.start()
	r.waitLive(dispatch.LivePoll)
	id := testenv.ID("no-accept")
	r.submit(id, "app", r.quick(id))
	r.waitStage(id, coord.StageShipped)
	if rec := r.closedRecord(id); rec.Source != "poll" {
		t.Fatalf("record %+v", rec)
	}
	st := r.status()
	if st.Broker == nil || !strings.Contains(st.Broker.Refused, "no POST /fleet/accept") || st.Source != dispatch.LivePoll || !st.Gate {
		t.Fatalf("status %s", dumpJSON(st))
	}
	found := false
	for _, a := range st.AbsentRoutes {
		found = found || a.Route == fleet.RouteAccept && a.Fallback != ""
	}
	if !found {
		t.Fatalf("status lacks the absent route: %s", dumpJSON(st))
	}
	if n := strings.Count(r.logs.String(), "the coordinator has no POST /fleet/accept route"); n != 1 {
		t.Fatalf("said %d times:\n%s", n, r.logs)
	}
	// One probe of accept (answered as Express does) and one chunk of the
	// job's live log (the route learnt absent), no receive link ever asked
	// for a message.
	if n := r.stub.Stats().Routes["unmatched"].Requests; n != 2 {
		t.Fatalf("%d requests to routes the stub lacks, want 2 (the probe, the live log)", n)
	}
	if n := count(r.peerEvents(), "deliver", ""); n != 0 {
		t.Fatalf("%d deliveries", n)
	}
	if err := r.drain(); err != nil {
		t.Fatal(err)
	}
}

// The start-up probe cannot tell (the coordinator answers it 503), so the
// broker path opens; the first delivered message's accept meets the missing
// route: the broker path goes off for good (the message is abandoned, not
// completed: its job stays queued) and the poll path claims the job.
func TestBrokerOffWhenAcceptTurnsOutAbsent(t *testing.T) {
	t.Parallel()
	r := newRig(t, rigOptions{broker: true, noPublisher: true, routes: coord.RoutesLegacy, coord: func(o *coord.Options) {
		o.FailRate, o.FaultRoutes = 1, []string{"unmatched"}
	}})
	send := r.testSender()
	r.start()
	r.waitLive(dispatch.LiveBroker)
	r.stub.SetFaults(0, 0)
	id := testenv.ID("accept-gone")
	r.submit(id, "app", r.quick(id))
	send(id)
	r.waitStage(id, coord.StageShipped)
	if rec := r.closedRecord(id); rec.Source != "poll" {
		t.Fatalf("record %+v", rec)
	}
	if r.d.Live() != dispatch.LivePoll {
		t.Fatalf("live %s", r.d.Live())
	}
	if st := r.status(); st.Broker == nil || st.Broker.Refused == "" {
		t.Fatalf("status %s", dumpJSON(st))
	}
	evs := r.peerEvents()
	if len(sbpeertest.Filter(evs, func(e sbpeertest.Event) bool {
		return e.Event == "disposition" && strings.HasPrefix(e.MessageID, id) && e.Outcome == "complete"
	})) != 0 {
		t.Fatalf("the message was completed without its job accepted:\n%s", dumpJSON(evs))
	}
	if err := r.drain(); err != nil {
		t.Fatal(err)
	}
}
