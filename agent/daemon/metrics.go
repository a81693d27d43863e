package daemon

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/aqfleet/aq/agent/dispatch"
	"github.com/aqfleet/aq/agent/fleet"
	"github.com/aqfleet/aq/internal/aqerr"
	"github.com/aqfleet/aq/internal/telemetry"
	"github.com/aqfleet/aq/job"
)

// metrics are the daemon's Prometheus series (docs/observability.md, "Metrics"), on a registry of
// its own (never the global one). Every name starts with aq_.
type metrics struct {
	reg *prometheus.Registry

	jobs          *prometheus.CounterVec // aq_jobs_total{result,reason}
	claims        *prometheus.CounterVec // aq_claims_total{source,result}
	conflicts     *prometheus.CounterVec // aq_conflicts_total{call}
	requests      *prometheus.CounterVec // aq_fleet_requests_total{call,code}
	lag           prometheus.Histogram   // aq_dispatch_lag_seconds
	toEngine      *prometheus.HistogramVec
	renewFailures prometheus.Counter // aq_lease_renew_failures_total
	hbFailures    prometheus.Counter // aq_heartbeat_failures_total
	gateReads     prometheus.Counter // aq_gate_reads_total
	messages      *prometheus.CounterVec
	settleFailed  *prometheus.CounterVec
	switches      *prometheus.CounterVec
	orphans       *prometheus.CounterVec

	// The names buildkite-agent and actions-runner-controller use
	// (docs/observability.md); aq_jobs_total, aq_job_start_seconds and
	// aq_lease_renew_failures_total are their deprecated forerunners.
	started     prometheus.Counter       // aq_jobs_started_total
	ended       *prometheus.CounterVec   // aq_jobs_ended_total{result}
	failedBy    *prometheus.CounterVec   // aq_jobs_failed_total{reason}
	startup     *prometheus.HistogramVec // aq_job_startup_duration_seconds{source}
	duration    *prometheus.HistogramVec // aq_job_duration_seconds{result}
	cost        *prometheus.CounterVec   // aq_engine_cost_usd_total{engine}
	tokens      *prometheus.CounterVec   // aq_engine_tokens_total{engine,kind}
	renewErrors prometheus.Counter       // aq_lease_renew_errors_total
	depthErrors prometheus.Counter       // aq_broker_depth_read_errors_total
	sessions    *prometheus.CounterVec   // aq_dispatch_sessions_total{event} (metrics_sessions.go)
}

// jobResults are aq_jobs_ended_total's result values (telemetry.Outcome).
var jobResults = []string{"succeeded", "failed", "fenced", "interrupted"}

// durationBuckets span a job's life: seconds to a day.
var durationBuckets = []float64{1, 5, 15, 30, 60, 120, 300, 600, 1200, 1800, 3600, 7200, 14400, 28800, 86400}

var _ dispatch.Metrics = (*metrics)(nil)

// gauges are read at scrape time from the daemon.
type gauges struct {
	running   func() float64
	disk      func() float64 // aq_worktree_disk_bytes (measured on a cadence)
	depth     prometheus.Collector
	slots     func() float64
	spool     func() float64
	source    func(string) float64
	lastBeat  func() float64
	healthy   func() float64
	connected func() float64
}

func newMetrics(g gauges) *metrics {
	reg := prometheus.NewRegistry()
	m := &metrics{
		reg: reg,
		jobs: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "aq_jobs_total",
			Help: "Deprecated (removed in the next release): use aq_jobs_ended_total{result} and aq_jobs_failed_total{reason}. Jobs this factory finished, by result (the stage the job went to: review, testing, shipped, failed, queued, dead_letter; fenced) and failure reason (none on success)."}, []string{"result", "reason"}),
		claims: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "aq_claims_total",
			Help: "Attempts to take a job: source poll (POST /fleet/claim) or broker (POST /fleet/accept); result leased, none (204), conflict (409), gone (404) or error."}, []string{"source", "result"}),
		conflicts: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "aq_conflicts_total",
			Help: "409 answers from the coordinator, by call: the job is owned elsewhere or this factory's lease is fenced."}, []string{"call"}),
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "aq_fleet_requests_total",
			Help: "Calls to the coordinator (after their retries), by call and final HTTP status (0: no answer)."}, []string{"call", "code"}),
		lag: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "aq_dispatch_lag_seconds",
			Help:    "Dispatch lag: broker message enqueued to job accepted by the coordinator.",
			Buckets: []float64{.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 300}}),
		toEngine: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "aq_job_start_seconds",
			Help:    "Deprecated (removed in the next release): use aq_job_startup_duration_seconds. Job taken (accepted or claimed) to engine started, by source (includes waiting for the repo lock and creating the worktree).",
			Buckets: []float64{.01, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 300, 1800}}, []string{"source"}),
		renewFailures: prometheus.NewCounter(prometheus.CounterOpts{Name: "aq_lease_renew_failures_total",
			Help: "Deprecated (removed in the next release): use aq_lease_renew_errors_total. Lease renewals that failed (each is retried until the lease's expiry is near; a 409 fences the job)."}),
		started: prometheus.NewCounter(prometheus.CounterOpts{Name: "aq_jobs_started_total",
			Help: "Jobs this factory started (taken and handed to the pipeline; a job given back at a drain before it started is not one)."}),
		ended: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "aq_jobs_ended_total",
			Help: "Jobs this factory started and ended, by result: succeeded (review, testing or shipped), failed, fenced (another factory owns it: fenced or lease lost), interrupted (aq was stopped)."}, []string{"result"}),
		failedBy: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "aq_jobs_failed_total",
			Help: "Jobs that ended failed, by reason (timeout, budget_exceeded, verify_failed, engine_failed, engine_unavailable, ...)."}, []string{"reason"}),
		startup: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "aq_job_startup_duration_seconds",
			Help:    "Job taken (accepted or claimed) to engine started, by source (broker, poll): the repo lock, an on-demand clone and the worktree.",
			Buckets: []float64{.01, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 300, 1800}}, []string{"source"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "aq_job_duration_seconds",
			Help:    "Job taken to its final report settled, by result (as aq_jobs_ended_total).",
			Buckets: durationBuckets}, []string{"result"}),
		cost: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "aq_engine_cost_usd_total",
			Help: "USD the engines reported (or aq metered from its price table) for this factory's runs, failed runs included, by engine."}, []string{"engine"}),
		tokens: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "aq_engine_tokens_total",
			Help: "Tokens the engines used in this factory's runs, failed runs included, by engine and kind (input, output, cached: input read from the prompt cache)."}, []string{"engine", "kind"}),
		renewErrors: prometheus.NewCounter(prometheus.CounterOpts{Name: "aq_lease_renew_errors_total",
			Help: "Lease renewals that failed (each is retried until the lease's expiry is near; a 409 fences the job). A renewal refused after the job's final report ended the lease is not one."}),
		depthErrors: prometheus.NewCounter(prometheus.CounterOpts{Name: "aq_broker_depth_read_errors_total",
			Help: "Reads of the subscription's runtime properties that failed (refused: the credential lacks Manage rights; or the management API was unreachable); the depth gauges are absent until a read succeeds."}),
		hbFailures: prometheus.NewCounter(prometheus.CounterOpts{Name: "aq_heartbeat_failures_total",
			Help: "Heartbeats the coordinator did not take (retried with backoff; see /healthz)."}),
		gateReads: prometheus.NewCounter(prometheus.CounterOpts{Name: "aq_gate_reads_total",
			Help: "GET /fleet/queue-state reads of the gated poll path."}),
		messages: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "aq_dispatch_messages_total",
			Help: "Broker messages by outcome: accepted, conflict, gone (completed), abandoned, malformed, mistargeted (dead-lettered)."}, []string{"outcome"}),
		settleFailed: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "aq_dispatch_settle_failures_total",
			Help: "Settlements the broker did not take (the message comes back when its lock expires)."}, []string{"settlement"}),
		switches: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "aq_dispatch_source_switches_total",
			Help: "Hand-offs between the broker and the poll path, by the path that took over."}, []string{"to"}),
		orphans: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "aq_orphans_recovered_total",
			Help: "Jobs of a previous aq run recovered at start-up, by what the coordinator said (requeued, fenced, spooled, ...)."}, []string{"result"}),
	}
	reg.MustRegister(m.jobs, m.claims, m.conflicts, m.requests, m.lag, m.toEngine, m.renewFailures, m.hbFailures,
		m.gateReads, m.messages, m.settleFailed, m.switches, m.orphans,
		m.started, m.ended, m.failedBy, m.startup, m.duration, m.cost, m.tokens, m.renewErrors, m.depthErrors)
	reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "aq_worktree_disk_bytes",
		Help: "Bytes of the files under $AQ_HOME/worktrees (apparent size, symlinks not followed), measured at start, after each job and every 5 minutes — not per scrape."}, g.disk))
	if g.depth != nil {
		reg.MustRegister(g.depth)
	}
	for _, r := range jobResults {
		m.ended.WithLabelValues(r)
	}
	reg.MustRegister(
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "aq_jobs_running", Help: "Jobs this factory holds now."}, g.running),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "aq_slots", Help: "Job slots (the seat limit the heartbeat advertises)."}, g.slots),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "aq_spool_depth", Help: "Reports waiting in $AQ_HOME/spool to be re-sent."}, g.spool),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "aq_heartbeat_last_success_timestamp_seconds", Help: "Unix time of the last heartbeat the coordinator took (0: none yet)."}, g.lastBeat),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "aq_healthy", Help: "1 while /healthz answers 200 (last heartbeat younger than twice its interval)."}, g.healthy),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "aq_broker_connected", Help: "1 while the broker link is healthy (0 also when no broker is configured)."}, g.connected),
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
	)
	for _, s := range []string{dispatch.LiveBroker, dispatch.LivePoll, dispatch.LiveNone} {
		reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "aq_dispatch_source", Help: "1 for the dispatch path work comes from now (broker, poll or none).",
			ConstLabels: prometheus.Labels{"source": s}}, func() float64 { return g.source(s) }))
	}
	// Series that should show from the first scrape, at zero.
	for _, o := range []dispatch.Outcome{dispatch.OutcomeAccepted, dispatch.OutcomeConflict, dispatch.OutcomeGone,
		dispatch.OutcomeAbandoned, dispatch.OutcomeMalformed, dispatch.OutcomeMistargeted, dispatch.OutcomeUnfit} {
		m.messages.WithLabelValues(string(o))
	}
	for _, s := range []string{"poll", "broker"} {
		m.claims.WithLabelValues(s, "leased")
	}
	m.sessions = newSessionCounter(reg)
	return m
}

// Message implements dispatch.Metrics.
func (m *metrics) Message(o dispatch.Outcome) { m.messages.WithLabelValues(string(o)).Inc() }

// SettleFailed implements dispatch.Metrics.
func (m *metrics) SettleFailed(s dispatch.Settlement) {
	m.settleFailed.WithLabelValues(string(s)).Inc()
}

// Lag implements dispatch.Metrics.
func (m *metrics) Lag(d time.Duration) { m.lag.Observe(d.Seconds()) }

// observe is the fleet client's call hook: claims, conflicts, heartbeat
// failures and gate reads are counted from the calls themselves.
func (m *metrics) observe(r fleet.CallResult) {
	m.requests.WithLabelValues(r.Call, strconv.Itoa(r.Status)).Inc()
	if r.Status == http.StatusConflict {
		m.conflicts.WithLabelValues(r.Call).Inc()
	}
	switch r.Call {
	case "POST /fleet/claim":
		m.claims.WithLabelValues("poll", claimResult(r)).Inc()
	case "POST /fleet/accept":
		m.claims.WithLabelValues("broker", claimResult(r)).Inc()
	case "POST /fleet/factories/heartbeat":
		if r.Err != nil {
			m.hbFailures.Inc()
		}
	case "GET /fleet/queue-state":
		m.gateReads.Inc()
	}
}

func claimResult(r fleet.CallResult) string {
	switch {
	case r.Err == nil && r.Status == http.StatusNoContent:
		return "none"
	case r.Err == nil:
		return "leased"
	case r.Status == http.StatusConflict:
		return "conflict"
	case errors.Is(r.Err, fleet.ErrGone):
		return "gone"
	}
	return "error"
}

// renewFailed counts a failed lease renewal under both names.
func (m *metrics) renewFailed() {
	m.renewErrors.Inc()
	m.renewFailures.Inc()
}

// jobEnded counts a job that started here and ended: its result, its
// duration from taken to the final report, its engine's spend.
func (m *metrics) jobEnded(res *fleet.Result, took time.Duration) {
	o := res.Outcome
	result := telemetry.Outcome(o.Reason, res.Fenced)
	m.ended.WithLabelValues(result).Inc()
	if result == "failed" {
		m.failedBy.WithLabelValues(string(o.Reason)).Inc()
	}
	m.duration.WithLabelValues(result).Observe(took.Seconds())
	in := o.Insights
	if in.Engine == "" {
		return
	}
	m.cost.WithLabelValues(in.Engine).Add(in.CostUSD)
	m.tokens.WithLabelValues(in.Engine, "input").Add(float64(in.TokensIn))
	m.tokens.WithLabelValues(in.Engine, "output").Add(float64(in.TokensOut))
	m.tokens.WithLabelValues(in.Engine, "cached").Add(float64(in.TokensCached))
}

// jobDone counts a finished job.
func (m *metrics) jobDone(res *fleet.Result) {
	result := res.Stage.FleetName()
	if res.Fenced {
		result = "fenced"
	}
	reason := string(res.Outcome.Reason)
	if reason == "" {
		reason = "none"
	}
	if result == "" {
		result = job.Failed.FleetName()
	}
	m.jobs.WithLabelValues(result, reason).Inc()
}

// serveMetrics listens on AQ_METRICS_ADDR and serves /metrics and /healthz
// until ctx is done.
func (d *Daemon) serveMetrics(ctx context.Context, wg *sync.WaitGroup) error {
	addr := d.cfg.MetricsAddr
	if addr == "" {
		return nil
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return aqerr.Wrap(aqerr.Usage, err, fmt.Sprintf("AQ_METRICS_ADDR=%s: cannot listen: %v", addr, err), "pick a free host:port, or unset AQ_METRICS_ADDR")
	}
	d.mu.Lock()
	d.metricsAddr = ln.Addr().String()
	d.mu.Unlock()
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(d.m.reg, promhttp.HandlerOpts{Registry: d.m.reg}))
	mux.HandleFunc("/healthz", d.healthz)
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	wg.Add(2)
	go func() {
		defer wg.Done()
		_ = srv.Serve(ln)
	}()
	go func() {
		defer wg.Done()
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
	}()
	d.log.Info("serving /metrics and /healthz", "addr", d.metricsAddr)
	return nil
}

// healthz answers 200 while the last heartbeat the coordinator took is
// younger than twice the heartbeat interval, else 503.
func (d *Daemon) healthz(w http.ResponseWriter, r *http.Request) {
	hb := d.agent.Heartbeat
	now := time.Now()
	ok := hb.Healthy(now)
	body := map[string]any{"healthy": ok, "stage": d.Stage(), "source": d.Live(), "heartbeatEverySec": d.cfg.Heartbeat.Seconds()}
	if t := hb.LastOK(); !t.IsZero() {
		body["lastHeartbeat"] = t.UTC()
		body["heartbeatAgeSec"] = now.Sub(t).Seconds()
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	if ok {
		w.WriteHeader(http.StatusOK)
	} else {
		w.WriteHeader(http.StatusServiceUnavailable)
	}
	_ = json.NewEncoder(w).Encode(body)
}
