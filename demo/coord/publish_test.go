package coord

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/aqfleet/aq/demo/sbpeer/sbpeertest"
	"github.com/aqfleet/aq/job"
)

func TestChooseTarget(t *testing.T) {
	j := &Job{ID: "j", Repo: "app", Engine: "script", Capabilities: []string{"os:linux"}}
	f := func(id string, seats int, running int, repos ...string) Factory {
		run := make([]RunningJob, running)
		return Factory{ID: id, Capabilities: []string{"os:linux", "engine:script"}, Repos: repos, SeatLimit: seats, Running: run}
	}
	for _, tc := range []struct {
		name  string
		cands []Candidate
		want  string
	}{
		{"none", nil, ""},
		{"only fitting repo", []Candidate{{Factory: f("a", 1, 0, "lib")}, {Factory: f("b", 1, 0, "app")}}, "b"},
		{"stale skipped", []Candidate{{Factory: func() Factory { x := f("a", 1, 0, "app"); x.Stale = true; return x }()}, {Factory: f("b", 1, 0, "app")}}, "b"},
		{"revoked skipped", []Candidate{{Factory: func() Factory { x := f("a", 1, 0, "app"); x.Revoked = true; return x }()}}, ""},
		{"missing engine", []Candidate{{Factory: Factory{ID: "a", Capabilities: []string{"os:linux"}, Repos: []string{"app"}, SeatLimit: 1}}}, ""},
		{"free seat wins", []Candidate{{Factory: f("a", 1, 1, "app")}, {Factory: f("b", 4, 3, "app")}}, "b"},
		{"lower load wins", []Candidate{{Factory: f("a", 2, 1, "app")}, {Factory: f("b", 4, 1, "app")}}, "b"},
		{"outstanding counts as load", []Candidate{{Factory: f("a", 2, 0, "app"), Outstanding: 1}, {Factory: f("b", 2, 0, "app")}}, "b"},
		{"not busy with the repo wins", []Candidate{{Factory: f("a", 4, 1, "app"), BusyRepos: map[string]bool{"app": true}}, {Factory: f("b", 2, 1, "app")}}, "b"},
		{"tie: id", []Candidate{{Factory: f("b", 1, 0, "app")}, {Factory: f("a", 1, 0, "app")}}, "a"},
		{"all full: least loaded", []Candidate{{Factory: f("a", 1, 1, "app")}, {Factory: f("b", 2, 2, "app"), Outstanding: 1}}, "a"},
	} {
		got, ok := ChooseTarget(j, tc.cands)
		if got != tc.want || ok != (tc.want != "") {
			t.Errorf("%s: got %q %v, want %q", tc.name, got, ok, tc.want)
		}
	}
}

// The stub publishes one targeted message per dispatch: to a factory that
// fits, MessageID jobId:epoch; again under a new MessageID when the job comes
// back to queued; re-targeted (jobId:epoch.n) when its target goes stale;
// not at all while no factory fits.
func TestPublisherTargetsAndRedispatches(t *testing.T) {
	peer := sbpeertest.Start(t, sbpeertest.Options{Subs: []string{"fleet-dispatch/fa", "fleet-dispatch/fb"}})
	sent := make(chan Sent, 20)
	pub, err := NewPublisher(PublisherOptions{ConnectionString: peer.ConnectionString(), Rescan: 20 * time.Millisecond,
		Redispatch: 10 * time.Minute, OnSent: func(s Sent) { sent <- s }})
	if err != nil {
		t.Fatal(err)
	}
	r := newRig(t, Options{Publisher: pub})
	ctx, cancel := context.WithCancel(context.Background())
	r.s.Start(ctx)
	t.Cleanup(func() { cancel(); r.s.Close() })
	beat := func(id, tok string, repos ...string) {
		t.Helper()
		if code, m := r.call("POST", "/fleet/factories/heartbeat", tok, map[string]any{"factoryId": id,
			"capabilities": []string{"os:linux", "engine:script"}, "repos": repos, "seatLimit": 1}); code != 200 {
			t.Fatalf("heartbeat %s: %d %v", id, code, m)
		}
	}
	next := func() Sent {
		t.Helper()
		select {
		case s := <-sent:
			return s
		case <-time.After(time.Minute): // a deadlock guard
			t.Fatal("nothing published")
		}
		return Sent{}
	}
	fa, fb := r.enroll("fa"), r.enroll("fb")

	// No factory fits yet (none has heartbeated): nothing is sent.
	r.submit("j", nil)
	beat("fb", fb, "lib")
	r.submit("k", func(j *job.Job) { j.Repo = "lib" })
	if s := next(); s.JobID != "k" || s.Target != "fb" || s.MessageID != "k:0" {
		t.Fatalf("sent %+v", s)
	}
	beat("fa", fa, "app")
	if s := next(); s.JobID != "j" || s.Target != "fa" || s.MessageID != "j:0" {
		t.Fatalf("sent %+v", s)
	}
	if pub.Stats().Unplaced == 0 {
		t.Fatal("the scan that found no factory for j was not counted")
	}
	// Back to queued (requeue bumps the epoch): a new dispatch, a new MessageID.
	if _, err := r.s.Action("j", "requeue"); err != nil {
		t.Fatal(err)
	}
	if s := next(); s.MessageID != "j:1" || s.Target != "fa" {
		t.Fatalf("sent %+v", s)
	}
	// fa goes stale with j:1 in its subscription: re-targeted to fb, which
	// now has the repo.
	r.clk.Add(2 * time.Minute)
	beat("fb", fb, "app", "lib")
	if s := next(); s.MessageID != "j:1.1" || s.Target != "fb" {
		t.Fatalf("sent %+v", s)
	}
	evs, err := peer.Events()
	if err != nil {
		t.Fatal(err)
	}
	routes := map[string]string{}
	for _, e := range evs {
		if e.Event == "send" {
			routes[e.MessageID] = strings.Join(e.RoutedTo, ",")
			if e.App["targetFactoryId"] == nil {
				t.Fatalf("no targetFactoryId on %s", e.MessageID)
			}
		}
	}
	for id, sub := range map[string]string{"k:0": "/fb", "j:0": "/fa", "j:1": "/fa", "j:1.1": "/fb"} {
		if !strings.HasSuffix(routes[id], sub) {
			t.Errorf("%s routed to %q, want %s", id, routes[id], sub)
		}
	}
	if st := pub.Stats(); st.Sent != 4 || st.Failed != 0 || st.Redispatched != 0 {
		t.Fatalf("stats %+v", st)
	}

	// Messages unanswered past Redispatch are published again, to the same
	// live factory: the first may have been abandoned through a coordinator
	// outage until the broker dead-lettered it, and a factory whose broker
	// path is healthy never polls for it.
	r.clk.Add(10 * time.Minute)
	beat("fb", fb, "app", "lib")
	got := map[string]string{}
	for range 2 {
		s := next()
		got[s.MessageID] = s.Target
	}
	if got["j:1.2"] != "fb" || got["k:0.1"] != "fb" {
		t.Fatalf("re-dispatched %v, want j:1.2 and k:0.1 to fb", got)
	}
	if st := pub.Stats(); st.Sent != 6 || st.Redispatched != 2 {
		t.Fatalf("stats %+v", st)
	}
}

// With sessions on, each dispatch message carries SessionId = the job's repo,
// which a subscription that requires sessions needs: without it the broker
// dead-letters the message there ("Session id is null.").
func TestPublisherSessions(t *testing.T) {
	for _, sessions := range []bool{true, false} {
		t.Run(fmt.Sprintf("sessions=%v", sessions), func(t *testing.T) {
			peer := sbpeertest.Start(t, sbpeertest.Options{Subs: []string{"fleet-dispatch/fa"}, Sessions: []string{"fleet-dispatch/fa"}})
			sent := make(chan Sent, 20)
			pub, err := NewPublisher(PublisherOptions{ConnectionString: peer.ConnectionString(), Rescan: 20 * time.Millisecond,
				Sessions: sessions, OnSent: func(s Sent) { sent <- s }})
			if err != nil {
				t.Fatal(err)
			}
			r := newRig(t, Options{Publisher: pub})
			ctx, cancel := context.WithCancel(context.Background())
			r.s.Start(ctx)
			t.Cleanup(func() { cancel(); r.s.Close() })
			fa := r.enroll("fa")
			if code, m := r.call("POST", "/fleet/factories/heartbeat", fa, map[string]any{"factoryId": "fa",
				"capabilities": []string{"os:linux", "engine:script"}, "repos": []string{"lib"}, "seatLimit": 1}); code != 200 {
				t.Fatalf("heartbeat: %d %v", code, m)
			}
			r.submit("j", func(j *job.Job) { j.Repo = "lib" })
			select {
			case s := <-sent:
				if s.JobID != "j" {
					t.Fatalf("sent %+v", s)
				}
			case <-time.After(time.Minute): // a deadlock guard
				t.Fatal("nothing published")
			}
			evs, err := peer.Events()
			if err != nil {
				t.Fatal(err)
			}
			var send, dl *sbpeertest.Event
			for i, e := range evs {
				switch e.Event {
				case "send":
					send = &evs[i]
				case "dead-letter":
					dl = &evs[i]
				}
			}
			if sessions && (send == nil || send.Session != "lib" || dl != nil) {
				t.Fatalf("with sessions: send %+v, dead-letter %+v; want SessionId lib, delivered", send, dl)
			}
			if !sessions && (dl == nil || dl.Reason != "Session id is null.") {
				t.Fatalf("without sessions: dead-letter %+v, want the broker's 'Session id is null.'", dl)
			}
		})
	}
}
