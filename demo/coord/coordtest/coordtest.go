// Package coordtest starts the coordinator stub (demo/coord) for a test: a
// real HTTP server on a 127.0.0.1 listener, its reaper running, stopped when
// the test ends. It is how aq's tests get a coordinator; only tests import
// it (the demos, the selftest and the chaos harness use coord.ServeOn).
package coordtest

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/aqfleet/aq/demo/coord"
)

// Start serves a stub made from o on a free port of 127.0.0.1 until the
// test ends. Its API field is what a factory's AQ_FLEET_API is.
func Start(tb testing.TB, o coord.Options) *coord.Served {
	tb.Helper()
	return StartOn(tb, "127.0.0.1:0", o, nil)
}

// StartBehind is Start with wrap in front of the stub: a test's faults or
// its spy on the requests.
func StartBehind(tb testing.TB, o coord.Options, wrap func(http.Handler) http.Handler) *coord.Served {
	tb.Helper()
	return StartOn(tb, "127.0.0.1:0", o, wrap)
}

// StartOn serves on addr: a fixed address brings a coordinator back where a
// killed one was (its state in o.StateFile), trying while the port frees.
func StartOn(tb testing.TB, addr string, o coord.Options, wrap func(http.Handler) http.Handler) *coord.Served {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	ln, err := coord.ListenAgain(ctx, addr)
	if err != nil {
		tb.Fatal(err)
	}
	s, err := coord.ServeOn(context.Background(), ln, o, wrap)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(s.Kill)
	return s
}
