package fleet

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

func half() float64 { return 0.5 }

func TestBackoff(t *testing.T) {
	t.Parallel()
	min, max := 100*time.Millisecond, time.Second
	for _, tc := range []struct {
		n      int
		lo, hi time.Duration
	}{
		{0, 50 * time.Millisecond, 100 * time.Millisecond},
		{1, 100 * time.Millisecond, 200 * time.Millisecond},
		{3, 400 * time.Millisecond, 800 * time.Millisecond},
		{10, 500 * time.Millisecond, time.Second}, // capped
	} {
		for _, r := range []func() float64{func() float64 { return 0 }, half, func() float64 { return 0.999 }} {
			d := Backoff(min, max, tc.n, nil, r)
			if d < tc.lo || d > tc.hi {
				t.Errorf("Backoff(n=%d) = %v, want within [%v, %v]", tc.n, d, tc.lo, tc.hi)
			}
		}
	}
	// Retry-After on 429 and 503 wins (seconds and HTTP date), capped.
	for _, tc := range []struct {
		status int
		header string
		want   time.Duration
	}{
		{429, "2", 2 * time.Second},
		{503, "3", 3 * time.Second},
		{429, "99999", maxRetryAfter},
		{500, "2", 0}, // not honoured on a plain 500
	} {
		resp := &http.Response{StatusCode: tc.status, Header: http.Header{"Retry-After": {tc.header}}}
		d := Backoff(min, max, 0, resp, half)
		if tc.want != 0 && d != tc.want {
			t.Errorf("%d Retry-After %s: %v, want %v", tc.status, tc.header, d, tc.want)
		}
		if tc.want == 0 && d > max {
			t.Errorf("%d: %v", tc.status, d)
		}
	}
	now := time.Now()
	if d, ok := retryAfter(now.Add(10*time.Second).UTC().Format(http.TimeFormat), now); !ok || d <= 9*time.Second || d > 10*time.Second { // the date has 1 s resolution
		t.Errorf("HTTP-date Retry-After: %v %v", d, ok)
	}
}

func TestJitter(t *testing.T) {
	t.Parallel()
	if d := Jitter(10*time.Second, 0.1, func() float64 { return 0 }); d != 9*time.Second {
		t.Errorf("low: %v", d)
	}
	if d := Jitter(10*time.Second, 0.1, func() float64 { return 1 }); d != 11*time.Second {
		t.Errorf("high: %v", d)
	}
	if d := Jitter(10*time.Second, 0, half); d != 10*time.Second {
		t.Errorf("no jitter: %v", d)
	}
}

func TestRetryable(t *testing.T) {
	t.Parallel()
	resp := func(code int) *http.Response { return &http.Response{StatusCode: code} }
	for _, tc := range []struct {
		resp *http.Response
		err  error
		want bool
	}{
		{nil, &url.Error{Op: "Post", URL: "http://x", Err: &net.OpError{Op: "dial", Err: errors.New("connection refused")}}, true},
		{nil, &url.Error{Op: "Post", URL: "x://x", Err: errors.New("unsupported protocol scheme \"x\"")}, false},
		{resp(429), nil, true},
		{resp(500), nil, true},
		{resp(502), nil, true},
		{resp(503), nil, true},
		{resp(501), nil, false},
		{resp(400), nil, false},
		{resp(401), nil, false},
		{resp(403), nil, false},
		{resp(404), nil, false},
		{resp(409), nil, false},
		{resp(200), nil, false},
	} {
		if got := Retryable(tc.resp, tc.err); got != tc.want {
			code := 0
			if tc.resp != nil {
				code = tc.resp.StatusCode
			}
			t.Errorf("Retryable(%d, %v) = %v, want %v", code, tc.err, got, tc.want)
		}
	}
}

// scripted is a fake coordinator answering a fixed sequence of statuses.
type scripted struct {
	hits    atomic.Int32
	answers []int
	body    string
	header  http.Header
	seen    atomic.Pointer[http.Request]
}

func (s *scripted) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	n := int(s.hits.Add(1)) - 1
	r2 := r.Clone(context.Background())
	s.seen.Store(r2)
	_, _ = io.Copy(io.Discard, r.Body)
	code := s.answers[min(n, len(s.answers)-1)]
	for k, v := range s.header {
		w.Header()[k] = v
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	if code != http.StatusNoContent {
		_, _ = io.WriteString(w, s.body)
	}
}

func testClient(t *testing.T, url string, b Budgets) *Client {
	t.Helper()
	c, err := NewClient(ClientOptions{API: url + "/api", Token: "sekrit-factory-token-123", ProductID: "prod-1", FactoryID: "f1", Budgets: b})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func TestClientRetriesOnlyWhatCanSucceed(t *testing.T) {
	t.Parallel()
	b := fastBudgets()
	for _, tc := range []struct {
		name    string
		answers []int
		tries   int32
		check   func(error) bool
	}{
		{"5xx then ok", []int{503, 500, 502, 200}, 4, func(err error) bool { return err == nil }},
		{"429 then ok", []int{429, 200}, 2, func(err error) bool { return err == nil }},
		{"400 is not retried", []int{400, 200}, 1, func(err error) bool { var se *StatusError; return errors.As(err, &se) && se.Status == 400 }},
		{"401 is an auth error", []int{401, 200}, 1, IsAuth},
		{"403 is an auth error", []int{403, 200}, 1, IsAuth},
		{"409 is fenced", []int{409, 200}, 1, IsFenced},
		{"404 is gone", []int{404, 200}, 1, func(err error) bool { return errors.Is(err, ErrGone) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := &scripted{answers: tc.answers, body: `{"leaseExpiresAt":"2030-01-01T00:00:00Z","unknownField":{"x":1}}`}
			srv := httptest.NewServer(s)
			defer srv.Close()
			c := testClient(t, srv.URL, b)
			_, err := c.Renew(context.Background(), "job-1", 3)
			if !tc.check(err) {
				t.Fatalf("error %v (%T)", err, err)
			}
			if got := s.hits.Load(); got != tc.tries {
				t.Fatalf("%d tries, want %d", got, tc.tries)
			}
			if err != nil && strings.Contains(err.Error(), "sekrit-factory-token-123") {
				t.Fatalf("the token leaked into an error: %v", err)
			}
		})
	}
}

func TestClientBudgetEndsRetries(t *testing.T) {
	t.Parallel()
	s := &scripted{answers: []int{503}}
	srv := httptest.NewServer(s)
	defer srv.Close()
	b := fastBudgets()
	b.Release = 300 * time.Millisecond
	c := testClient(t, srv.URL, b)
	err := c.Release(context.Background(), "job-1", 1)
	var te *TransientError
	if !errors.As(err, &te) || te.Status != 503 {
		t.Fatalf("want a transient 503 error, got %v", err)
	}
	// The budget, not a count, ended it: several tries, not unbounded.
	if n := s.hits.Load(); n < 2 || n > 200 {
		t.Fatalf("%d tries", n)
	}
	if int32(te.Tries) != s.hits.Load() {
		t.Fatalf("error says %d tries, server saw %d", te.Tries, s.hits.Load())
	}
}

func TestClientNetworkErrorIsTransient(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close() // nothing listens: connection refused
	b := fastBudgets()
	b.Claim = 200 * time.Millisecond
	c, _ := NewClient(ClientOptions{API: "http://" + addr, Token: "t0ken-value", Budgets: b})
	_, err = c.Claim(context.Background(), false)
	if !IsTransient(err) {
		t.Fatalf("want transient, got %v", err)
	}
}

func TestClientHeadersAndAnswers(t *testing.T) {
	t.Parallel()
	s := &scripted{answers: []int{200}, body: `{"job":{"id":"j1","repo":"r","stage":"assigned","capabilities":[],"priority":200,"leaseEpoch":4,"bodyMd":"x","extra":true},"leaseEpoch":4,"leaseExpiresAt":"2030-01-01T00:00:00Z","more":1}`}
	srv := httptest.NewServer(s)
	defer srv.Close()
	c := testClient(t, srv.URL, fastBudgets())
	c.SetOffer([]string{"os:linux"}, []string{"r"})
	cl, err := c.Claim(context.Background(), false)
	if err != nil || cl == nil || cl.Job.ID != "j1" || cl.LeaseEpoch != 4 || cl.Source != "poll" {
		t.Fatalf("claim %+v %v", cl, err)
	}
	r := s.seen.Load()
	if r.URL.Path != "/api/fleet/claim" || r.Header.Get("Authorization") != "Bearer sekrit-factory-token-123" || r.Header.Get("x-product-id") != "prod-1" || r.Header.Get("Content-Type") != "application/json" {
		t.Fatalf("request %s %v", r.URL.Path, r.Header)
	}
	// 204: no job.
	s2 := &scripted{answers: []int{204}}
	srv2 := httptest.NewServer(s2)
	defer srv2.Close()
	cl, err = testClient(t, srv2.URL, fastBudgets()).Claim(context.Background(), true)
	if cl != nil || err != nil {
		t.Fatalf("204: %v %v", cl, err)
	}
}

// TestLocalExpiry: a lease is timed on this host's clock from the time the
// coordinator granted — the ttl when sent, else the expiry minus the Date
// header — whichever way the clocks differ (issue #26, finding 5: a
// coordinator 120 s behind used to make every lease look expired).
func TestLocalExpiry(t *testing.T) {
	t.Parallel()
	exp := time.Date(2030, 1, 1, 0, 1, 30, 0, time.UTC)
	server := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	granted := 89 * time.Second // 90 s, less the Date header's second
	for _, c := range []struct {
		name string
		ours time.Time
	}{
		{"same clocks", server},
		{"ours 10 minutes behind", server.Add(-10 * time.Minute)},
		{"ours 120 s ahead", server.Add(120 * time.Second)},
		{"ours a day ahead", server.Add(24 * time.Hour)},
	} {
		if got := localExpiry(exp, 0, answer{sentAt: c.ours, date: server}); !got.Equal(c.ours.Add(granted)) {
			t.Errorf("%s: %v, want %v", c.name, got, c.ours.Add(granted))
		}
		// A ttl wins over the Date arithmetic.
		if got := localExpiry(exp, 30, answer{sentAt: c.ours, date: server}); !got.Equal(c.ours.Add(30 * time.Second)) {
			t.Errorf("%s with ttl 30: %v", c.name, got)
		}
	}
	if got := localExpiry(exp, 0, answer{}); got != exp {
		t.Errorf("no Date: %v", got)
	}
	// Monotonic: the result keeps the send time's monotonic reading.
	now := time.Now()
	if got := localExpiry(exp, 0, answer{sentAt: now, date: server}); got.Sub(now) != granted || got.String() == got.Round(0).String() {
		t.Errorf("the expiry lost the monotonic clock: %v", got)
	}
}

func TestErrorsSayWhatToDo(t *testing.T) {
	t.Parallel()
	ae := &AuthError{Call: "POST /fleet/factories/heartbeat", Status: 401}
	if !strings.Contains(ae.Error(), "401") || !strings.Contains(ae.Fix(), "AQ_FLEET_TOKEN") {
		t.Errorf("%s / %s", ae.Error(), ae.Fix())
	}
	fe := &FencedError{Call: "PATCH /fleet/jobs/:id", JobID: "j", Epoch: 2}
	if !strings.Contains(fe.Error(), "another factory owns it") {
		t.Error(fe.Error())
	}
}

// TestErrorPredicates: the broker receiver classifies accept errors by
// predicates, not status codes (agent/dispatch).
func TestErrorPredicates(t *testing.T) {
	t.Parallel()
	var c interface{ Conflict() bool }
	var g interface{ Gone() bool }
	var tmp interface{ Temporary() bool }
	if err := error(&FencedError{}); !errors.As(err, &c) || !c.Conflict() {
		t.Error("409 is not a Conflict")
	}
	if err := fmt.Errorf("accept: %w", ErrGone); !errors.As(err, &g) || !g.Gone() || !errors.Is(err, ErrGone) {
		t.Error("404 is not Gone")
	}
	if err := error(&TransientError{Status: 503}); !errors.As(err, &tmp) || !tmp.Temporary() {
		t.Error("503 is not Temporary")
	}
}

// TestLocalExpiryHostileValues: no leaseExpiresAt, Date or ttl a
// coordinator sends makes the time granted wrap around into a lease that
// never ends; it is read as between zero and MaxLease.
func TestLocalExpiryHostileValues(t *testing.T) {
	t.Parallel()
	now := time.Now()
	date := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	for _, c := range []struct {
		name string
		exp  time.Time
		ttl  float64
		want time.Duration
	}{
		{"expiry in year 1", time.Time{}.Add(4 * time.Second), 0, 0},
		{"expiry before the Date", date.Add(-time.Hour), 0, 0},
		{"expiry in year 9999", time.Date(9999, 12, 31, 0, 0, 0, 0, time.UTC), 0, MaxLease},
		{"ttl of centuries", date, 1e12, MaxLease},
		{"infinite ttl", date.Add(90 * time.Second), math.Inf(1), 89 * time.Second},
		{"NaN ttl", date.Add(90 * time.Second), math.NaN(), 89 * time.Second},
		{"negative ttl", date.Add(90 * time.Second), -5, 89 * time.Second},
	} {
		got := localExpiry(c.exp, c.ttl, answer{sentAt: now, date: date})
		if c.name == "expiry in year 1" {
			// A zero-looking expiry with a Date: the lease is over.
			if got.Sub(now) > 0 {
				t.Errorf("%s: a lease of %v", c.name, got.Sub(now))
			}
			continue
		}
		if d := got.Sub(now); d != c.want {
			t.Errorf("%s: a lease of %v, want %v", c.name, d, c.want)
		}
	}
}
