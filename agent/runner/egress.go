package runner

// The egress proxies of sandboxed jobs (internal/egress, docs/sandbox.md,
// "Network"): each job's engine reaches the network only through a proxy
// of its own, which allows AQ_SANDBOX_NET's rules and the engine's own
// endpoints, and reports what it refuses.

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"os"
	"strconv"
	"strings"

	"github.com/aqfleet/aq/engines"
	"github.com/aqfleet/aq/internal/egress"
	"github.com/aqfleet/aq/job"
)

// EgressProxies is a factory's Egress: AQ_SANDBOX_NET's rules for every
// job, and each job's engine's endpoints.
type EgressProxies struct {
	Rules egress.Rules
	// EngineHosts replaces engines' built-in endpoints
	// (AQ_SANDBOX_ENGINE_HOSTS).
	EngineHosts egress.EngineHostSet
	// Env is the environment engines start from, whose base-URL variables
	// (ANTHROPIC_BASE_URL, OPENAI_BASE_URL) point an engine at a gateway;
	// nil: aq's own.
	Env []string
	Log *slog.Logger
}

var _ Egress = EgressProxies{}

// Start implements Egress.
func (e EgressProxies) Start(ctx context.Context, jobID, engine, sock string, tcp bool, onRefusal func(job.EgressRefusal)) (EgressProxy, error) {
	env := e.Env
	if env == nil {
		env = os.Environ()
	}
	own, err := egress.ParseRules(strings.Join(e.EngineHosts.For(engine, env), ","))
	if err != nil {
		return nil, fmt.Errorf("the endpoints of engine %s: %w", engine, err)
	}
	rules, err := e.Rules.Union(own).WithGateways(gatewayHosts(engine, env))
	if err != nil {
		return nil, fmt.Errorf("the gateway of engine %s: %w", engine, err)
	}
	log := e.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	p, err := egress.Start(ctx, egress.Options{
		Rules: rules, UnixSocket: sock, TCP: tcp, Log: log.With("job", jobID),
		OnRefusal: func(r egress.Refusal) {
			if onRefusal != nil {
				onRefusal(job.EgressRefusal(r))
			}
		},
	})
	if err != nil {
		return nil, err
	}
	return jobProxy{p: p, gateways: rules.Loopbacks()}, nil
}

// gatewayHosts are the "host:port" of engine's base URLs, wherever they
// are set (engines.BaseURLs: its variable, its own settings files): the
// proxy allows each whatever address it resolves to but a link-local one.
func gatewayHosts(engine string, env []string) []string {
	var out []string
	for _, b := range engines.BaseURLs(engine, env) {
		if hp := b.HostPort(); hp != "" {
			out = append(out, hp)
		}
	}
	return out
}

// jobProxy is one job's running proxy.
type jobProxy struct {
	p        *egress.Proxy
	gateways []string
}

// Gateways are the destinations on the host's loopback its rules name
// with a port (the engine's base URL's, AQ_SANDBOX_NET's): the sandbox
// makes them reachable at their own address (sandbox.Net.Gateways).
func (j jobProxy) Gateways() []string { return j.gateways }

func (j jobProxy) Port() int {
	_, port, err := net.SplitHostPort(j.p.Addr())
	if err != nil {
		return 0
	}
	n, _ := strconv.Atoi(port)
	return n
}

func (j jobProxy) Refusals() []job.EgressRefusal {
	var out []job.EgressRefusal
	for _, r := range j.p.Refusals() {
		out = append(out, job.EgressRefusal(r))
	}
	return out
}

func (j jobProxy) Close() error { return j.p.Close() }

// egressRefused is the job's proxy's OnRefusal: the first refusal of each
// destination is an event of the job and a line in its log.
func (ru *run) egressRefused(r job.EgressRefusal) {
	if r.Count != 1 {
		return
	}
	ru.log.Info("the job's egress proxy refused a connection", "host", r.Host, "port", r.Port, "why", r.Why)
	ru.event(EgressRefused{Refusal: r})
}

// keepRefusals records in the job's insights what its proxy refused, the
// destinations refused most first.
func (ru *run) keepRefusals() {
	if ru.proxy == nil {
		return
	}
	refused := ru.proxy.Refusals()
	if len(refused) > job.MaxEgressRefusals {
		refused = refused[:job.MaxEgressRefusals]
	}
	ru.out.Insights.EgressRefused = refused
}
