// Package notifytest is a webhook receiver on 127.0.0.1 for tests: a real
// HTTP server that records each notification aq POSTs (body and headers),
// answers with a status of the test's choice, or holds requests (a receiver
// that hangs) until released.
package notifytest

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
)

// Receiver records notifications.
type Receiver struct {
	srv *httptest.Server
	// Arrived gets a value as each request arrives (before it is answered).
	Arrived chan struct{}

	mu       sync.Mutex
	bodies   [][]byte
	headers  []http.Header
	answer   func(n int) int
	hold     chan struct{}
	answered int
}

// Start serves a receiver until the test ends.
func Start(tb testing.TB) *Receiver {
	tb.Helper()
	r := &Receiver{Arrived: make(chan struct{}, 1024)}
	r.srv = httptest.NewServer(http.HandlerFunc(r.serve))
	tb.Cleanup(func() {
		r.Release()
		r.srv.Close()
	})
	return r
}

func (r *Receiver) serve(w http.ResponseWriter, req *http.Request) {
	b, _ := io.ReadAll(req.Body)
	r.mu.Lock()
	r.bodies = append(r.bodies, b)
	r.headers = append(r.headers, req.Header.Clone())
	n, answer, hold := len(r.bodies), r.answer, r.hold
	r.mu.Unlock()
	select {
	case r.Arrived <- struct{}{}:
	default:
	}
	if hold != nil {
		select {
		case <-hold:
		case <-req.Context().Done():
			return
		}
	}
	code := http.StatusOK
	if answer != nil {
		code = answer(n)
	}
	w.WriteHeader(code)
	r.mu.Lock()
	r.answered++
	r.mu.Unlock()
}

// URL is the receiver's URL (with a path and a token-like query, as a
// webhook URL has).
func (r *Receiver) URL() string { return r.srv.URL + "/hooks/aq?token=notify-secret-token" }

// Answer sets the status of request n (1-based); nil: 200.
func (r *Receiver) Answer(status func(n int) int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.answer = status
}

// Hold makes requests hang until Release.
func (r *Receiver) Hold() {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.hold == nil {
		r.hold = make(chan struct{})
	}
}

// Release answers the held requests (and stops holding).
func (r *Receiver) Release() {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.hold != nil {
		close(r.hold)
		r.hold = nil
	}
}

// Requests counts the requests received; Answered those answered.
func (r *Receiver) Requests() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.bodies)
}

// Answered: see Requests.
func (r *Receiver) Answered() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.answered
}

// Headers are the headers of every request received.
func (r *Receiver) Headers() []http.Header {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]http.Header(nil), r.headers...)
}

// Events decodes every body received, as generic JSON objects (the test
// checks the documented field names, not aq's Go types).
func (r *Receiver) Events(tb testing.TB) []map[string]any {
	tb.Helper()
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]map[string]any, 0, len(r.bodies))
	for _, b := range r.bodies {
		var m map[string]any
		if err := json.Unmarshal(b, &m); err != nil {
			tb.Fatalf("a notification is not a JSON object: %q: %v", b, err)
		}
		out = append(out, m)
	}
	return out
}
