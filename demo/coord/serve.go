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

// Serve runs the stub on addr until ctx is done: it prints the API URL, the
// enrollment token and the environment a factory needs to out, then serves.
// It is `aq demo coordinator`.
func Serve(ctx context.Context, addr string, o Options, out io.Writer) error {
	s, err := New(o)
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("listen on %s: %w", addr, err)
	}
	srv := &http.Server{Handler: s, ReadHeaderTimeout: 10 * time.Second}
	s.Start(ctx)
	defer s.Close()
	api := "http://" + ln.Addr().String() + "/api"
	fmt.Fprintf(out, "aq coordinator stub (a test and demo double, not the coordinator) listening on %s\n", api)
	fmt.Fprintf(out, "enrollment token: %s\n", s.EnrollToken())
	fmt.Fprintf(out, "lease TTL %s; factories stale after %s", s.o.LeaseTTL, s.o.StaleAfter)
	if s.legacy() {
		fmt.Fprintf(out, "; route set legacy (the coordinator in service today: no %s)", strings.Join(ProposedRoutes, ", "))
	}
	if o.StateFile != "" {
		fmt.Fprintf(out, "; state kept in %s", o.StateFile)
	}
	if o.Publisher != nil {
		fmt.Fprintf(out, "\npublishing a dispatch message per queued job to topic %s", o.Publisher.Topic())
	}
	fmt.Fprintf(out, "\n\nrun a factory against it:\n  export AQ_FLEET=1 AQ_FLEET_API=%s AQ_FLEET_TOKEN=%s\n  export AQ_ENGINES=all   # to run script jobs (a fleet factory does not by default)\n  aq submit job.md && aq run --once\n", api, s.EnrollToken())
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	select {
	case <-ctx.Done():
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
		<-errc
		return nil
	case err := <-errc:
		if errors.Is(err, http.ErrServerClosed) {
			return nil
		}
		return err
	}
}
