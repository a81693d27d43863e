package coord

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"time"
)

// Served is a stub served over HTTP on a TCP listener: how `aq demo
// coordinator`, the demos, the selftest, the chaos harness and the tests
// (through coordtest) run it.
type Served struct {
	*Server
	// Addr is the listener's host:port; API is the base URL a factory is
	// given (AQ_FLEET_API): http://Addr/api.
	Addr, API string

	srv  *http.Server
	done chan struct{}
	err  error // why serving ended: nil after Kill or Shutdown
}

// ServeOn makes a stub from o and serves it on ln, its reaper (and
// publisher) running until Kill or Shutdown. wrap, when set, stands in front
// of the stub (a request log, a test's faults). ServeOn owns ln from here.
func ServeOn(ctx context.Context, ln net.Listener, o Options, wrap func(http.Handler) http.Handler) (*Served, error) {
	s, err := New(o)
	if err != nil {
		ln.Close()
		return nil, err
	}
	var h http.Handler = s
	if wrap != nil {
		h = wrap(s)
	}
	sv := &Served{Server: s, Addr: ln.Addr().String(), srv: &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}, done: make(chan struct{})}
	sv.API = "http://" + sv.Addr + "/api"
	s.Start(context.WithoutCancel(ctx))
	go func() {
		defer close(sv.done)
		if err := sv.srv.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
			sv.err = err
		}
	}()
	return sv, nil
}

// ListenAgain listens on addr, trying again while it is busy until ctx
// ends: the port of a stub just killed may take a moment to free, and a
// restart on the same address is how a test or the chaos harness brings a
// coordinator back.
func ListenAgain(ctx context.Context, addr string) (net.Listener, error) {
	for {
		ln, err := net.Listen("tcp", addr)
		if err == nil {
			return ln, nil
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("listen on %s: %w", addr, err)
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// Done is closed when serving has ended; Err then says why (nil after Kill
// or Shutdown).
func (s *Served) Done() <-chan struct{} { return s.done }

// Err is why serving ended, once Done is closed.
func (s *Served) Err() error { <-s.done; return s.err }

// Kill stops the stub at once, as a crash would: the listener and every
// connection closed, the reaper stopped. Its state (Options.StateFile)
// stays for a stub started again on the same address.
func (s *Served) Kill() {
	_ = s.srv.Close()
	<-s.done
	s.Server.Close()
}

// Shutdown stops the stub gracefully: no new connection, requests in flight
// answered (until ctx ends), then the reaper stopped.
func (s *Served) Shutdown(ctx context.Context) error {
	err := s.srv.Shutdown(ctx)
	<-s.done
	s.Server.Close()
	return err
}

// Serve runs the stub on addr until ctx is done: it prints the API URL, the
// enrollment token and the environment a factory needs to out, then serves.
// It is `aq demo coordinator`.
func Serve(ctx context.Context, addr string, o Options, out io.Writer) error {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("listen on %s: %w", addr, err)
	}
	s, err := ServeOn(ctx, ln, o, nil)
	if err != nil {
		return err
	}
	api := s.API
	fmt.Fprintf(out, "aq coordinator stub (a test and demo double, not the coordinator) listening on %s\n", api)
	fmt.Fprintf(out, "enrollment token: %s\n", s.EnrollToken())
	fmt.Fprintf(out, "lease TTL %s; factories stale after %s", s.o.LeaseTTL, s.o.StaleAfter)
	if s.legacy() {
		fmt.Fprintf(out, "; route set legacy (the coordinator in service today: no %s)", strings.Join(ProposedRoutes, ", "))
	}
	if o.StateFile != "" {
		fmt.Fprintf(out, "; state kept in %s", o.StateFile)
	}
	if len(o.Breaks) > 0 {
		fmt.Fprintf(out, "\nBROKEN ON PURPOSE (a test of aq fleet check): %s", strings.Join(o.Breaks, ", "))
	}
	if o.Publisher != nil {
		fmt.Fprintf(out, "\npublishing a dispatch message per queued job to topic %s", o.Publisher.Topic())
	}
	fmt.Fprintf(out, "\n\nrun a factory against it:\n  export AQ_FLEET=1 AQ_FLEET_API=%s AQ_FLEET_TOKEN=%s\n  export AQ_ENGINES=all   # to run script jobs (a fleet factory does not by default)\n  aq submit job.md && aq run --once\n", api, s.EnrollToken())
	select {
	case <-ctx.Done():
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		_ = s.Shutdown(sctx)
		return nil
	case <-s.Done():
		s.Server.Close()
		return s.Err()
	}
}
