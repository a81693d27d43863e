package cli

import (
	"context"
	"io"
	"strings"
	"testing"

	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus/admin"
	"github.com/spf13/cobra"

	"github.com/aqfleet/aq/cmd/aq/clitest"
	"github.com/aqfleet/aq/demo/sbpeer/sbpeertest"
	"github.com/aqfleet/aq/internal/aqerr"
)

// With sessions, a new subscription is created with RequiresSession; run
// again, nothing changes. An existing subscription whose RequiresSession
// disagrees with AQ_SB_SESSIONS is left as it is, with one clear line (the
// service cannot change it).
func TestEnsureSubscriptionWithSessions(t *testing.T) {
	f, srv := startAtomFake(t)
	o := ensureOpts(srv, "fa", false)
	o.Sessions = true
	res := runEnsure(t, o)
	if !res.Created || !res.RequiresSession || !strings.Contains(strings.Join(res.Actions, "\n"), "with rule targetFactoryId and sessions") {
		t.Fatalf("first run: %+v", res)
	}
	f.mu.Lock()
	subXML := f.subs["fleet-dispatch/fa"]
	f.mu.Unlock()
	if !strings.Contains(subXML, "<RequiresSession>true</RequiresSession>") {
		t.Fatalf("subscription PUT without RequiresSession:\n%s", subXML)
	}
	writes := f.writes()
	if res := runEnsure(t, o); res.Created || len(res.Actions) != 0 || f.writes() != writes {
		t.Fatalf("second run changed something: %+v", res)
	}

	off := ensureOpts(srv, "fa", false)
	err := runEnsureSubscription(context.Background(), io.Discard, off)
	if aqerr.ExitCode(err) != aqerr.Usage || !strings.Contains(err.Error(), "requires sessions but AQ_SB_SESSIONS is off") || f.writes() != writes {
		t.Fatalf("sessions off on a session subscription: %v (writes %d → %d)", err, writes, f.writes())
	}
	// A subscription without sessions, made before: sessions on cannot fix it.
	if res := runEnsure(t, ensureOpts(srv, "fb", false)); res.RequiresSession {
		t.Fatalf("without sessions: %+v", res)
	}
	on := ensureOpts(srv, "fb", false)
	on.Sessions = true
	err = runEnsureSubscription(context.Background(), io.Discard, on)
	if aqerr.ExitCode(err) != aqerr.Usage || !strings.Contains(err.Error(), "does not require sessions but AQ_SB_SESSIONS=1") {
		t.Fatalf("sessions on, subscription without: %v", err)
	}
}

// Against the local peer's management endpoint — which answers reads of a
// subscription (RequiresSession among them), not writes — the mismatch is
// found from the real admin client's read, before anything is written.
func TestEnsureSubscriptionSessionsMismatchOnPeer(t *testing.T) {
	p := sbpeertest.Start(t, sbpeertest.Options{Subs: []string{"fleet-dispatch/fa", "fleet-dispatch/fs"}, Sessions: []string{"fleet-dispatch/fs"}, Admin: true})
	for _, tc := range []struct {
		sub      string
		sessions bool
		want     string
	}{
		{"fa", true, "does not require sessions but AQ_SB_SESSIONS=1"},
		{"fs", false, "requires sessions but AQ_SB_SESSIONS is off"},
	} {
		o := &ensureSubOptions{Topic: "fleet-dispatch", Subscription: tc.sub, FactoryID: tc.sub, RuleName: "targetFactoryId", Sessions: tc.sessions,
			admin: func() (*admin.Client, error) {
				return newAdminClient("", p.AdminConnectionString(), nil, p.AdminHTTPClient())
			}}
		err := runEnsureSubscription(context.Background(), io.Discard, o)
		if aqerr.ExitCode(err) != aqerr.Usage || !strings.Contains(err.Error(), tc.want) {
			t.Fatalf("%s: %v, want %q", tc.sub, err, tc.want)
		}
	}
	evs, err := p.Events()
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range sbpeertest.Filter(evs, func(e sbpeertest.Event) bool { return e.Event == "admin" }) {
		if e.Status != 200 {
			t.Fatalf("admin call answered %d: only reads were expected", e.Status)
		}
	}
}

// aq demo coordinator publishes with SessionId = repo when sessions are on
// (AQ_SB_SESSIONS=1 or --sb-sessions); a value that is not a boolean is one
// usage line, not a publisher without sessions.
func TestDemoCoordinatorSessions(t *testing.T) {
	clitest.CleanEnv(t)
	t.Setenv("AQ_SB_CONNECTION_STRING", "Endpoint=sb://127.0.0.1:1;SharedAccessKeyName=k;SharedAccessKey=c2VjcmV0;UseDevelopmentEmulator=true")
	for _, v := range []string{"1", "0"} {
		t.Setenv("AQ_SB_SESSIONS", v)
		f := &Factory{IO: IO{In: strings.NewReader(""), Out: io.Discard, Err: io.Discard}}
		root := NewRoot(f)
		f.Flags = func() *cobra.Command { return root }
		pub, err := demoPublisher(f, &demoCoordinatorOptions{})
		if err != nil || pub == nil || pub.Sessions() != (v == "1") {
			t.Fatalf("AQ_SB_SESSIONS=%s: publisher %v (sessions %v), %v", v, pub, pub != nil && pub.Sessions(), err)
		}
	}
	t.Setenv("AQ_SB_SESSIONS", "maybe")
	_, errOut, code := runAQ(t, "demo", "coordinator", "--listen", "127.0.0.1:0")
	if code != 2 || !strings.Contains(errOut, "AQ_SB_SESSIONS") || strings.Count(strings.TrimSpace(errOut), "\n") != 0 || strings.Contains(errOut, "c2VjcmV0") {
		t.Fatalf("AQ_SB_SESSIONS=maybe: exit %d, stderr %q", code, errOut)
	}
}
