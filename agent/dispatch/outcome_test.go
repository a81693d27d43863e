package dispatch

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"
)

type predErr struct{ conflict, gone, temporary bool }

func (e predErr) Error() string   { return "status" }
func (e predErr) Conflict() bool  { return e.conflict }
func (e predErr) Gone() bool      { return e.gone }
func (e predErr) Temporary() bool { return e.temporary }

// The outcome table of docs/contract.md ("Broker messages"), from the Acceptor's error to the settlement.
func TestClassifyAndSettle(t *testing.T) {
	for _, tc := range []struct {
		name   string
		err    error
		want   Outcome
		settle Settlement
	}{
		{"200", nil, OutcomeAccepted, Complete},
		{"409", predErr{conflict: true}, OutcomeConflict, Complete},
		{"409 wrapped", fmt.Errorf("accept j1: %w", predErr{conflict: true}), OutcomeConflict, Complete},
		{"404", predErr{gone: true}, OutcomeGone, Complete},
		{"5xx", predErr{temporary: true}, OutcomeAbandoned, Abandon},
		{"network", &net.OpError{Op: "dial", Err: errors.New("connection refused")}, OutcomeAbandoned, Abandon},
		{"unknown error", errors.New("400 bad request"), OutcomeAbandoned, Abandon},
		{"all predicates false", predErr{}, OutcomeAbandoned, Abandon},
		{"conflict beats temporary", predErr{conflict: true, temporary: true}, OutcomeConflict, Complete},
		{"stopping", context.Canceled, OutcomeAbandoned, Abandon},
		{"deadline", fmt.Errorf("x: %w", context.DeadlineExceeded), OutcomeAbandoned, Abandon},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := Classify(tc.err)
			if got != tc.want || got.Settle() != tc.settle {
				t.Fatalf("Classify = %s (%s), want %s (%s)", got, got.Settle(), tc.want, tc.settle)
			}
		})
	}
	for _, o := range []Outcome{OutcomeMalformed, OutcomeMistargeted} {
		if o.Settle() != DeadLetter {
			t.Fatalf("%s settles %s, want dead-letter", o, o.Settle())
		}
	}
}

func TestBackoffDelay(t *testing.T) {
	b := Backoff{Initial: 100 * time.Millisecond, Max: time.Second, Jitter: 0.5}
	for _, tc := range []struct {
		n    int
		rnd  float64
		want time.Duration
	}{
		{0, 0, 100 * time.Millisecond},
		{1, 0, 200 * time.Millisecond},
		{3, 0, 800 * time.Millisecond},
		{4, 0, time.Second}, // capped
		{60, 0, time.Second},
		{1, 0.5, 150 * time.Millisecond}, // jitter takes up to half off
		{10, 0.999, 500500 * time.Microsecond},
	} {
		if got := b.Delay(tc.n, tc.rnd); got != tc.want {
			t.Errorf("Delay(%d, %v) = %s, want %s", tc.n, tc.rnd, got, tc.want)
		}
	}
	if d := (Backoff{}).Delay(100, 0); d != 30*time.Second {
		t.Errorf("default cap = %s", d)
	}
}

func TestParse(t *testing.T) {
	good := `{"jobId":"j1","productId":"p","repo":"r","caps":["os:linux"],"priority":3,"targetFactoryId":"fa"}`
	for _, tc := range []struct {
		name   string
		body   string
		id     string
		props  map[string]any
		reason string
		desc   string
		warn   string // a message that runs, with this warning
		pool   string // this factory's pool
	}{
		{"ok", good, "j1", map[string]any{"targetFactoryId": "fa"}, "", "", "", ""},
		{"no message id", good, "", nil, "", "", "", ""},
		{"not json", "hello", "j1", nil, ReasonMalformed, "body is not a dispatch message", "", ""},
		{"empty", "", "j1", nil, ReasonMalformed, "body is not a dispatch message", "", ""},
		{"trailing data", good + "{}", "j1", nil, ReasonMalformed, "data after", "", ""},
		{"wrong type", `{"jobId":1}`, "j1", nil, ReasonMalformed, "body is not a dispatch message", "", ""},
		{"no job id", `{"targetFactoryId":"fa"}`, "", nil, ReasonMalformed, "no jobId", "", ""},
		{"no target", `{"jobId":"j1"}`, "j1", nil, ReasonMalformed, "no targetFactoryId", "", ""},
		// Issue #26: a broker message's job id and repo pass the rule every
		// job's do before anything acts on them.
		{"job id climbs out", `{"jobId":"../../x","targetFactoryId":"fa"}`, "", nil, ReasonMalformed, `jobId "../../x" is not a job id: it contains ".."`, "", ""},
		{"job id with a slash", `{"jobId":"a/b","targetFactoryId":"fa"}`, "", nil, ReasonMalformed, `jobId "a/b" is not a job id`, "", ""},
		{"job id of 10 KB", `{"jobId":"` + strings.Repeat("x", 10<<10) + `","targetFactoryId":"fa"}`, "", nil, ReasonMalformed, "… (10240 bytes) is not a job id", "", ""},
		{"repo is a path", `{"jobId":"j1","repo":"../secret","targetFactoryId":"fa"}`, "", nil, ReasonMalformed, `repo "../secret" is not a repository name`, "", ""},
		{"id from the SDK", good, "5f3c0e0a-uuid", nil, "", "", `MessageID "5f3c0e0a-uuid" is not the body's jobId "j1"`, ""},
		{"id of another job", good, "j2", nil, "", "", `the body's jobId is used`, ""},
		{"property disagrees", good, "j1", map[string]any{"targetFactoryId": "fb"}, ReasonMalformed, "disagrees", "", ""},
		{"jobId property disagrees", good, "j1", map[string]any{"jobId": "j9"}, ReasonMalformed, `application property jobId "j9" disagrees`, "", ""},
		{"repo property disagrees", good, "j1", map[string]any{"repo": "other", "productId": "p"}, "", "", `application property repo "other" disagrees with the body's "r"`, ""},
		{"productId property disagrees", good, "j1:4", map[string]any{"productId": 7}, "", "", `productId "7" disagrees`, ""},
		{"all properties agree", good, "j1:4", map[string]any{"jobId": "j1", "productId": "p", "repo": "r", "targetFactoryId": "fa"}, "", "", "", ""},
		{"other factory", strings.Replace(good, `"fa"`, `"fb"`, 1), "j1", nil, ReasonMistargeted, `targetFactoryId is "fb", this factory is "fa"`, "", ""},
		{"my pool", strings.Replace(good, `"fa"`, `"builders"`, 1), "j1", nil, "", "", "", "builders"},
		{"my own id in a pool", good, "j1", nil, "", "", "", "builders"},
		{"another pool", strings.Replace(good, `"fa"`, `"testers"`, 1), "j1", nil, ReasonMistargeted, `targetFactoryId is "testers", this factory is "fa" of pool "builders"`, "", "builders"},
		{"a pool without being in one", strings.Replace(good, `"fa"`, `"builders"`, 1), "j1", nil, ReasonMistargeted, `targetFactoryId is "builders", this factory is "fa" (`, "", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m, warning, err := parse([]byte(tc.body), tc.id, tc.props, "fa", tc.pool)
			if tc.reason == "" {
				if err != nil || m.JobID != "j1" || m.Priority != 3 || m.Caps[0] != "os:linux" {
					t.Fatalf("parse = %+v, %v", m, err)
				}
				if (tc.warn == "") != (warning == "") || !strings.Contains(warning, tc.warn) {
					t.Fatalf("warning %q, want one containing %q", warning, tc.warn)
				}
				return
			}
			var inv *invalid
			if !errors.As(err, &inv) || inv.Reason != tc.reason || !strings.Contains(inv.Description, tc.desc) {
				t.Fatalf("parse error = %v, want %s containing %q", err, tc.reason, tc.desc)
			}
		})
	}
}

func TestServiceBusMessage(t *testing.T) {
	m := Message{JobID: "j1", ProductID: "p", Repo: "r", Caps: []string{"a", "b"}, Priority: 2, TargetFactoryID: "fa"}
	sm, err := m.ServiceBusMessage(true)
	if err != nil {
		t.Fatal(err)
	}
	if *sm.MessageID != "j1" || *sm.SessionID != "r" || sm.ApplicationProperties[PropTargetFactoryID] != "fa" || sm.ApplicationProperties[PropCaps] != "a,b" {
		t.Fatalf("%+v", sm)
	}
	back, _, err := parse(sm.Body, *sm.MessageID, sm.ApplicationProperties, "fa", "")
	if err != nil || back.Repo != "r" || len(back.Caps) != 2 {
		t.Fatalf("round trip: %+v %v", back, err)
	}
	if sm, _ := m.ServiceBusMessage(false); sm.SessionID != nil {
		t.Fatal("session id without sessions")
	}
}

func TestNewChecksConfig(t *testing.T) {
	base := func() Options {
		return Options{
			Config:   Config{FactoryID: "fa", Namespace: "ns.servicebus.windows.net"},
			Acceptor: AcceptFunc(func(context.Context, string) (Accepted, error) { return Accepted{}, nil }),
			Handler:  func(context.Context, Accepted) {},
			Slots:    NewSemaphore(1),
		}
	}
	r, err := New(base())
	if err != nil || r.opts.Topic != DefaultTopic || r.opts.Subscription != "fa" || r.path != "fleet-dispatch/Subscriptions/fa" {
		t.Fatalf("defaults: %v %+v", err, r)
	}
	for _, tc := range []struct {
		name string
		mod  func(*Options)
		want string
	}{
		{"no factory", func(o *Options) { o.FactoryID = "" }, "factory's id"},
		{"nothing configured", func(o *Options) { o.Namespace = "" }, "not configured"},
		{"both", func(o *Options) { o.ConnectionString = "Endpoint=sb://localhost" }, "both"},
		{"no slots", func(o *Options) { o.Slots = nil }, "required"},
		{"plaintext to a remote host", func(o *Options) {
			o.Namespace = ""
			o.ConnectionString = "Endpoint=sb://10.0.0.5:5672;SharedAccessKeyName=k;SharedAccessKey=secretsecret;UseDevelopmentEmulator=true"
		}, "not loopback"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := base()
			tc.mod(&o)
			_, err := New(o)
			if err == nil || !strings.Contains(err.Error(), tc.want) || strings.Contains(err.Error(), "secretsecret") {
				t.Fatalf("New: %v, want an error containing %q", err, tc.want)
			}
		})
	}
	o := base()
	o.Namespace = ""
	o.ConnectionString = "Endpoint=sb://localhost:5672;SharedAccessKeyName=k;SharedAccessKey=x;UseDevelopmentEmulator=true"
	if _, err := New(o); err != nil {
		t.Fatalf("emulator on localhost: %v", err)
	}
}
