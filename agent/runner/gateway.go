package runner

// Gateway: an engine pointed at a gateway (a base URL: ANTHROPIC_BASE_URL,
// OPENAI_BASE_URL, or the engine's own settings) is checked before it
// starts — can the job's way out (its egress proxy when sandboxed, else
// the factory's network) connect to it? — so that an unreachable gateway
// fails the job in seconds, saying where and what refused, instead of the
// engine retrying for minutes; and the engine is held on this factory for
// a while, so that its other jobs wait instead of failing the same way
// (docs/engines.md, "An unreachable API").

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"syscall"
	"time"

	"github.com/aqfleet/aq/agent/holds"
	"github.com/aqfleet/aq/engines"
	"github.com/aqfleet/aq/internal/brief"
	"github.com/aqfleet/aq/internal/egress"
	"github.com/aqfleet/aq/job"
)

const (
	// GatewayCheckTimeout bounds the gateway pre-flight: resolving and
	// connecting, through the proxy or not.
	GatewayCheckTimeout = 10 * time.Second
	// GatewayHoldWait is how long an engine whose API was unreachable is
	// held on this factory (holds.Hold, Why HoldUnreachable).
	GatewayHoldWait = 5 * time.Minute
	// HoldUnreachable is the Why of such a hold.
	HoldUnreachable = "API unreachable"
)

// checkGateway is the gateway pre-flight; it reports whether the run may
// go on.
func (ru *run) checkGateway(ctx context.Context) bool {
	name := ru.eng.Name()
	b, ok := engines.Endpoint(name, ru.r.env())
	if !ok {
		return true
	}
	hp := b.HostPort()
	ctx, cancel := context.WithTimeout(ctx, GatewayCheckTimeout)
	defer cancel()
	var why string
	var refused *job.EgressRefusal
	if ru.proxy != nil && ru.jail != nil {
		why, refused = connectThroughProxy(ctx, ru.jail.Policy().Net.ProxySocket, hp)
	} else {
		why = connectDirect(ctx, hp)
	}
	if why == "" {
		return true
	}
	detail := fmt.Sprintf("%s's gateway %s (%s) cannot be reached: %s", name, b.Redacted(), b.Where(), why)
	ru.fail(job.ReasonEngineUnavailable, detail)
	if refused != nil {
		ru.engineRefused(*refused)
		return false
	}
	ru.holdUnreachable(detail)
	return false
}

// connectThroughProxy asks the job's proxy for a tunnel to hostport, as
// the engine would: "" when it opens one, else what refused it (the
// proxy's refusal, with the refusal itself; no listener; DNS).
func connectThroughProxy(ctx context.Context, sock, hostport string) (string, *job.EgressRefusal) {
	c, err := egress.DialUnix(ctx, sock) // a long path too: a deep $AQ_HOME
	if err != nil {
		return "the job's egress proxy cannot be reached: " + err.Error(), nil
	}
	defer c.Close()
	if dl, ok := ctx.Deadline(); ok {
		_ = c.SetDeadline(dl)
	}
	if _, err := fmt.Fprintf(c, "CONNECT %s HTTP/1.1\r\nHost: %s\r\n\r\n", hostport, hostport); err != nil {
		return "the job's egress proxy: " + err.Error(), nil
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), &http.Request{Method: http.MethodConnect})
	if err != nil {
		return "the job's egress proxy did not answer: " + err.Error(), nil
	}
	defer resp.Body.Close()
	if resp.StatusCode == http.StatusOK {
		return "", nil
	}
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 4<<10))
	text := brief.OneLine(strings.TrimSpace(string(body)), 300)
	switch {
	case resp.Header.Get("X-Aq-Egress") == "refused":
		r := &job.EgressRefusal{Count: 1, Why: text}
		host, port, _ := net.SplitHostPort(hostport)
		r.Host = host
		_, _ = fmt.Sscan(port, &r.Port)
		if _, why, ok := strings.Cut(text, " refused: "); ok {
			r.Why = strings.TrimSuffix(why, " (docs/sandbox.md, Network)")
		}
		return "the job's egress proxy refused it: " + text, r
	case strings.Contains(text, "cannot resolve"):
		return "DNS: " + text, nil
	case strings.Contains(text, "connection refused"):
		return "nothing listens there: " + text, nil
	}
	return fmt.Sprintf("the job's egress proxy answered %d: %s", resp.StatusCode, text), nil
}

// connectDirect connects to hostport from the factory: "" when it can,
// else what failed (DNS, no listener, no route, a timeout).
func connectDirect(ctx context.Context, hostport string) string {
	host, port, err := net.SplitHostPort(hostport)
	if err != nil {
		return err.Error()
	}
	addrs, err := net.DefaultResolver.LookupHost(ctx, host)
	if err != nil {
		return "DNS: " + err.Error()
	}
	var d net.Dialer
	c, err := d.DialContext(ctx, "tcp", net.JoinHostPort(addrs[0], port))
	if err == nil {
		_ = c.Close()
		return ""
	}
	if errors.Is(err, syscall.ECONNREFUSED) {
		return "nothing listens at " + net.JoinHostPort(addrs[0], port) + " (connection refused)"
	}
	return err.Error()
}

// holdUnreachable holds the engine on this factory for GatewayHoldWait:
// its other jobs wait (parked) instead of failing the same way, and a
// fleet claims them elsewhere.
func (ru *run) holdUnreachable(detail string) {
	name := ru.eng.Name()
	if err := ru.r.Holds.Hold(holds.Hold{Engine: name, Until: ru.r.now().Add(GatewayHoldWait), Why: HoldUnreachable, Job: ru.j.ID}); err != nil {
		ru.log.Warn("cannot hold the engine; its other jobs may meet the same unreachable API", "engine", name, "err", err)
		return
	}
	ru.log.Warn("engine held: its API is unreachable", "engine", name, "for", GatewayHoldWait.String(), "detail", detail)
}

// engineRefused records in the job's insights an API call the proxy
// refused, when the proxy's own count does not have it already.
func (ru *run) engineRefused(r job.EgressRefusal) {
	for _, e := range ru.out.Insights.EgressRefused {
		if e.Host == r.Host && e.Port == r.Port {
			return
		}
	}
	if r.Count == 0 {
		r.Count = 1
	}
	ru.out.Insights.EgressRefused = append(ru.out.Insights.EgressRefused, r)
}
