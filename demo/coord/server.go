package coord

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	mrand "math/rand/v2"
	"net/http"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/aqfleet/aq/job"
)

// Options configure the stub.
type Options struct {
	// EnrollToken is the enrollment token factories trade for their own;
	// empty: the state file's, else a new random one.
	EnrollToken string
	// LeaseTTL is how long a claim or renewal holds a lease (default 90 s).
	LeaseTTL time.Duration
	// StaleAfter marks a factory stale without a heartbeat (default 90 s).
	StaleAfter time.Duration
	// ReapEvery is the reaper's cadence (default 1 s).
	ReapEvery time.Duration
	// MaxBackoff caps the retry backoff after a retryable failure (0: the
	// job's own policy, as the local queue applies it).
	MaxBackoff time.Duration
	// FailRate is the share of requests answered 503 (fault injection);
	// Latency is added to every request. FaultRoutes limits both to these
	// routes (e.g. "POST /fleet/claim"); empty: every route except _stats
	// and _faults.
	FailRate    float64
	Latency     time.Duration
	FaultRoutes []string
	// StateFile keeps the state across restarts ("" = memory only).
	StateFile string
	// Seed makes fault injection reproducible (0: random).
	Seed uint64
	Now  func() time.Time
	Log  *slog.Logger
	// OnChange is called (outside the stub's locks) after every job state
	// change: a dispatcher (the Service Bus peer) hooks in here.
	OnChange func(Event)
	// Publisher, when set, makes the stub publish a targeted dispatch
	// message per queued job (publish.go); it runs from Start to Close.
	Publisher *Publisher
	// Pools are pools known before any replica of them registered (the
	// capabilities a replica will offer); a pool is also learnt from its
	// replicas' enrollments and heartbeats.
	Pools []Pool
	// OnCall, if set, sees every answered lease call (claim, accept, renew,
	// release, PATCH, fail) before its answer is written: an audit of
	// fencing (audit.go).
	OnCall func(Call)
	// Routes is the route set served: RoutesFull (default) or RoutesLegacy
	// (the coordinator in service today: routes.go).
	Routes string
	// Without are routes left out besides (e.g. "GET /fleet/factories"),
	// answered as unknown routes: a coordinator older or smaller still.
	// SetWithout changes them at run time.
	Without []string
	// LogJobCap and LogCap bound the live log output kept per job and in
	// all (0: DefaultLogJobCap, DefaultLogCap); with a StateFile it is kept
	// on disk beside it (LogDir), with the artifacts.
	LogJobCap, LogCap int64
	// Breaks are rules of the contract the stub breaks on purpose
	// (breaks.go: AllBreaks), each as a coordinator with that one bug
	// would — how `aq fleet check` is shown to catch it.
	Breaks []string
}

// Server is the stub: an http.Handler over the store.
type Server struct {
	o     Options
	st    *store
	mux   *http.ServeMux
	enrol string

	statsMu sync.Mutex
	stats   Stats

	faultMu sync.Mutex
	faults  faultConfig
	rnd     *mrand.Rand
	without []string // guarded by faultMu

	arts artifactStore
	logs *logStore

	bg     sync.WaitGroup
	cancel context.CancelFunc
}

type faultConfig struct {
	Rate    float64
	Latency time.Duration
	Routes  []string
}

// New builds a stub, loading Options.StateFile when it exists.
func New(o Options) (*Server, error) {
	if o.LeaseTTL <= 0 {
		o.LeaseTTL = 90 * time.Second
	}
	if o.StaleAfter <= 0 {
		o.StaleAfter = 90 * time.Second
	}
	if o.ReapEvery <= 0 {
		o.ReapEvery = time.Second
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.Log == nil {
		o.Log = slog.New(slog.DiscardHandler)
	}
	if err := checkRoutes(&o); err != nil {
		return nil, err
	}
	if err := checkBreaks(&o); err != nil {
		return nil, err
	}
	st, err := newStore(o.StateFile)
	if err != nil {
		return nil, err
	}
	dir := LogDir(o.StateFile)
	logs, err := newLogStore(subdir(dir, "logs"), o.LogJobCap, o.LogCap)
	if err != nil {
		return nil, err
	}
	st.kick = logs.kick // a job's change ends or starts runs: long polls look again
	for id, jl := range logs.jobs {
		if j, ok := st.st.Jobs[id]; ok {
			jl.created = j.CreatedAt // the oldest jobs' logs go first
		}
	}
	st.onChg = o.OnChange
	if pub := o.Publisher; pub != nil {
		user := o.OnChange
		st.onChg = func(ev Event) {
			pub.Notify(ev)
			if user != nil {
				user(ev)
			}
		}
	}
	s := &Server{o: o, st: st, mux: http.NewServeMux(), logs: logs}
	if err := s.arts.open(subdir(dir, "artifacts")); err != nil {
		return nil, err
	}
	seed := o.Seed
	if seed == 0 {
		seed = mrand.Uint64()
	}
	s.rnd = mrand.New(mrand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	s.faults = faultConfig{Rate: o.FailRate, Latency: o.Latency, Routes: o.FaultRoutes}
	s.without = slices.Clone(o.Without)
	s.stats = Stats{Since: o.Now().UTC(), Routes: map[string]RouteStats{}}

	s.st.mu.Lock()
	switch {
	case o.EnrollToken != "":
		s.st.st.EnrollToken = o.EnrollToken
	case s.st.st.EnrollToken == "":
		s.st.st.EnrollToken = newToken("aqe_")
	}
	s.enrol = s.st.st.EnrollToken
	err = s.st.persistLocked()
	s.st.mu.Unlock()
	if err != nil {
		return nil, err
	}
	s.routes()
	return s, nil
}

// EnrollToken is the token factories enroll with.
func (s *Server) EnrollToken() string { return s.enrol }

// LeaseTTL is the lease time to live.
func (s *Server) LeaseTTL() time.Duration { return s.o.LeaseTTL }

// Start runs the reaper (and the publisher, when set) until ctx is done or
// Close.
func (s *Server) Start(ctx context.Context) {
	ctx, s.cancel = context.WithCancel(ctx)
	if s.o.Publisher != nil {
		s.bg.Add(1)
		go func() {
			defer s.bg.Done()
			s.o.Publisher.Run(ctx, s)
		}()
	}
	s.bg.Add(1)
	go func() {
		defer s.bg.Done()
		t := time.NewTicker(s.o.ReapEvery)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				s.Reap(s.o.Now())
			}
		}
	}()
}

// Close stops the reaper and waits for it.
func (s *Server) Close() {
	if s.cancel != nil {
		s.cancel()
	}
	s.bg.Wait()
}

// SetFaults changes fault injection at run time.
func (s *Server) SetFaults(rate float64, latency time.Duration, routes ...string) {
	s.faultMu.Lock()
	defer s.faultMu.Unlock()
	s.faults = faultConfig{Rate: rate, Latency: latency, Routes: routes}
}

// SetWithout makes the stub answer 404 on routes, as a coordinator without
// them would (none: every route is served again).
func (s *Server) SetWithout(routes ...string) {
	s.faultMu.Lock()
	defer s.faultMu.Unlock()
	s.without = slices.Clone(routes)
}

// lacks reports whether route is one the stub pretends not to have.
func (s *Server) lacks(route string) bool {
	s.faultMu.Lock()
	defer s.faultMu.Unlock()
	return slices.Contains(s.without, route)
}

// Stats returns a copy of the request counters.
func (s *Server) Stats() Stats {
	s.statsMu.Lock()
	defer s.statsMu.Unlock()
	out := Stats{Since: s.stats.Since, Routes: map[string]RouteStats{}}
	for r, rs := range s.stats.Routes {
		c := RouteStats{Requests: rs.Requests, Status: map[string]int64{}}
		for k, v := range rs.Status {
			c.Status[k] = v
		}
		out.Routes[r] = c
	}
	return out
}

// ResetStats zeroes the counters.
func (s *Server) ResetStats() {
	s.statsMu.Lock()
	defer s.statsMu.Unlock()
	s.stats = Stats{Since: s.o.Now().UTC(), Routes: map[string]RouteStats{}}
}

// Job returns a copy of job id.
func (s *Server) Job(id string) (Job, bool) { return s.st.job(id) }

// Jobs returns copies of every job.
func (s *Server) Jobs() []Job { return s.st.jobs() }

// Events returns job id's audit trail.
func (s *Server) Events(id string) []Event { return s.st.events(id) }

// Factories returns every enrolled factory (staleness computed now).
// Factories lists the registered factories (not those that deregistered).
func (s *Server) Factories() []Factory {
	var out []Factory
	for _, f := range s.AllFactories() {
		if !f.Deregistered {
			out = append(out, f)
		}
	}
	return out
}

// AllFactories lists every factory the stub knows, deregistered ones too.
func (s *Server) AllFactories() []Factory {
	fs := s.st.factories()
	now := s.o.Now()
	for i := range fs {
		fs[i].Stale = s.stale(&fs[i], now)
		fs[i].TokenHash = ""
	}
	return fs
}

// Pools lists the pools the stub targets: declared (Options.Pools) and
// learnt from replicas (the latest registered replica's offer, kept after it
// deregistered), with their live replica counts.
func (s *Server) Pools() []Pool {
	byName := map[string]*Pool{}
	var order []string
	for _, p := range s.o.Pools {
		p := p
		byName[p.Name] = &p
		order = append(order, p.Name)
	}
	fs := s.AllFactories()
	sort.SliceStable(fs, func(a, b int) bool { return fs[a].LastHeartbeatAt.Before(fs[b].LastHeartbeatAt) })
	for _, f := range fs {
		if f.Pool == "" || f.Revoked {
			continue
		}
		p, ok := byName[f.Pool]
		if !ok {
			p = &Pool{Name: f.Pool}
			byName[f.Pool] = p
			order = append(order, f.Pool)
		}
		if len(f.Capabilities) > 0 || len(f.Repos) > 0 {
			p.Capabilities, p.Repos = f.Capabilities, f.Repos // the latest replica's
		}
		if !f.Deregistered && !f.Stale {
			p.Live++
		}
	}
	out := make([]Pool, 0, len(order))
	for _, n := range order {
		p := *byName[n]
		if p.Seats <= 0 {
			p.Seats = 10
		}
		out = append(out, p)
	}
	return out
}

// Version is the queue-state version.
func (s *Server) Version() int64 { return s.st.version() }

func (s *Server) stale(f *Factory, now time.Time) bool {
	return f.LastHeartbeatAt.IsZero() || now.Sub(f.LastHeartbeatAt) > s.o.StaleAfter
}

// ServeHTTP implements http.Handler. Routes live under /fleet/ (and, so
// that AQ_FLEET_API may end in /api like the real service's, /api/fleet/).
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	asSent := r.URL.Path
	if p, ok := strings.CutPrefix(r.URL.Path, "/api/"); ok {
		r2 := r.Clone(r.Context())
		r2.URL.Path = "/" + p
		r2.URL.RawPath = ""
		r = r2
	}
	_, route := s.mux.Handler(r)
	if route == "" {
		route = "unmatched"
	}
	rec := &StatusRecorder{ResponseWriter: w}
	defer func() { s.count(route, rec.Status()) }()
	if s.injectFault(r.Context(), rec, route) {
		return
	}
	if s.lacks(route) || (route == "unmatched" && s.legacy()) { // what a server without the route answers
		if s.legacy() {
			expressNotFound(rec, r, asSent)
		} else {
			http.NotFound(rec, r)
		}
		return
	}
	s.mux.ServeHTTP(rec, r)
}

// StatusRecorder is an http.ResponseWriter that remembers the status it
// answered: the stub's request counters, and the chaos harness's request
// log, which wraps the stub from outside.
type StatusRecorder struct {
	http.ResponseWriter
	status int // 0 until the answer starts
}

// WriteHeader records the first status written.
func (r *StatusRecorder) WriteHeader(code int) {
	if r.status == 0 {
		r.status = code
	}
	r.ResponseWriter.WriteHeader(code)
}

func (r *StatusRecorder) Write(b []byte) (int, error) {
	if r.status == 0 {
		r.status = http.StatusOK
	}
	return r.ResponseWriter.Write(b)
}

// Status is the status answered (200 when nothing was written).
func (r *StatusRecorder) Status() int {
	if r.status == 0 {
		return http.StatusOK
	}
	return r.status
}

func (s *Server) count(route string, status int) {
	s.statsMu.Lock()
	defer s.statsMu.Unlock()
	rs := s.stats.Routes[route]
	if rs.Status == nil {
		rs.Status = map[string]int64{}
	}
	rs.Requests++
	rs.Status[strconv.Itoa(status)]++
	s.stats.Routes[route] = rs
}

// injectFault applies latency and, for a share of requests, answers 503.
func (s *Server) injectFault(ctx context.Context, w http.ResponseWriter, route string) bool {
	if route == RouteGetStats || route == RouteFaults {
		return false
	}
	s.faultMu.Lock()
	f := s.faults
	hit := false
	applies := len(f.Routes) == 0 || slices.Contains(f.Routes, route)
	if applies && f.Rate > 0 {
		hit = s.rnd.Float64() < f.Rate
	}
	s.faultMu.Unlock()
	if !applies {
		return false
	}
	if f.Latency > 0 {
		t := time.NewTimer(f.Latency)
		select {
		case <-ctx.Done():
		case <-t.C:
		}
		t.Stop()
	}
	if hit {
		writeErr(w, http.StatusServiceUnavailable, "injected fault (coordinator stub --fail-rate)")
	}
	return hit
}

func (s *Server) routes() {
	m := routeMux{s}
	m.HandleFunc(RouteEnroll, s.handleEnroll)
	m.HandleFunc(RouteHeartbeat, s.factoryOnly(s.handleHeartbeat))
	m.HandleFunc(RouteFactories, s.anyToken(s.handleFactories))
	m.HandleFunc(RouteRevoke, s.anyToken(s.handleRevoke))
	m.HandleFunc(RouteDeregister, s.factoryOnly(s.handleDeregister))
	m.HandleFunc(RouteQueueState, s.anyToken(s.handleQueueState))
	m.HandleFunc(RouteClaim, s.factoryOnly(s.handleClaim))
	m.HandleFunc(RouteAccept, s.factoryOnly(s.handleAccept))
	m.HandleFunc(RouteRenew, s.factoryOnly(s.handleRenew))
	m.HandleFunc(RouteRelease, s.factoryOnly(s.handleRelease))
	m.HandleFunc(RoutePatch, s.factoryOnly(s.handlePatch))
	m.HandleFunc(RouteFail, s.factoryOnly(s.handleFail))
	m.HandleFunc(RouteSubmit, s.anyToken(s.handleSubmit))
	m.HandleFunc(RouteJobs, s.anyToken(s.handleJobs))
	m.HandleFunc(RouteJob, s.anyToken(s.handleJob))
	m.HandleFunc(RouteEvents, s.anyToken(s.handleEvents))
	m.HandleFunc(RouteAction, s.anyToken(s.handleAction))
	m.HandleFunc(RouteReplace, s.anyToken(s.handleReplace))
	m.HandleFunc(RouteRemove, s.anyToken(s.handleRemove))
	m.HandleFunc(RouteArtifactUpload, s.anyToken(s.handleArtifactUpload))
	m.HandleFunc(RouteArtifactList, s.anyToken(s.handleArtifactList))
	m.HandleFunc(RouteArtifactGet, s.anyToken(s.handleArtifactGet))
	m.HandleFunc(RouteArtifactDelete, s.anyToken(s.handleArtifactDelete))
	m.HandleFunc(RouteLogAppend, s.factoryOnly(s.handleLogAppend))
	m.HandleFunc(RouteLogRead, s.anyToken(s.handleLogRead))
	m.HandleFunc(RouteGetStats, s.handleStats)
	m.HandleFunc(RouteFaults, s.anyToken(s.handleFaults))
}

// routeMux registers only the routes of the stub's route set; those it is
// told to lack (Without, SetWithout) are answered 404 by ServeHTTP.
type routeMux struct{ s *Server }

func (m routeMux) HandleFunc(pattern string, h http.HandlerFunc) {
	if m.s.inSet(pattern) {
		m.s.mux.HandleFunc(pattern, h)
	}
}

// ---- authentication ----

// who is the caller a token stands for.
type who struct {
	factory string // "" for the enrollment (operator) token
}

func bearer(r *http.Request) string {
	h := r.Header.Get("Authorization")
	if t, ok := strings.CutPrefix(h, "Bearer "); ok {
		return strings.TrimSpace(t)
	}
	return ""
}

func hashToken(t string) string {
	h := sha256.Sum256([]byte(t))
	return hex.EncodeToString(h[:])
}

// identify maps the bearer token to a caller.
func (s *Server) identify(r *http.Request) (who, int, string) {
	t := bearer(r)
	if t == "" {
		return who{}, http.StatusUnauthorized, "no bearer token"
	}
	if subtle.ConstantTimeCompare([]byte(t), []byte(s.enrol)) == 1 {
		return who{}, 0, ""
	}
	f, ok := s.st.factoryByTokenHash(hashToken(t))
	if !ok {
		return who{}, http.StatusUnauthorized, "unknown token"
	}
	if f.Revoked {
		return who{}, http.StatusUnauthorized, "the factory's token was revoked"
	}
	return who{factory: f.ID}, 0, ""
}

// anyToken: the enrollment token (an operator's) or a factory token.
func (s *Server) anyToken(h func(http.ResponseWriter, *http.Request, who)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		c, code, msg := s.identify(r)
		if code != 0 {
			writeErr(w, code, msg)
			return
		}
		h(w, r, c)
	}
}

// factoryOnly: a factory token; the enrollment token is refused (403).
func (s *Server) factoryOnly(h func(http.ResponseWriter, *http.Request, who)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		c, code, msg := s.identify(r)
		if code != 0 {
			writeErr(w, code, msg)
			return
		}
		if c.factory == "" {
			writeErr(w, http.StatusForbidden, "this call needs a factory token (enroll first)")
			return
		}
		h(w, r, c)
	}
}

// sameFactory checks a body's factoryId against the token's factory.
func sameFactory(w http.ResponseWriter, c who, bodyID string) bool {
	if bodyID != "" && bodyID != c.factory {
		writeErr(w, http.StatusForbidden, fmt.Sprintf("factoryId %q does not match the token's factory", bodyID))
		return false
	}
	return true
}

func newToken(prefix string) string {
	b := make([]byte, 24)
	if _, err := rand.Read(b); err != nil {
		panic(err) // crypto/rand does not fail on supported platforms
	}
	return prefix + base64.RawURLEncoding.EncodeToString(b)
}

// ---- helpers ----

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(v)
}

func writeErr(w http.ResponseWriter, code int, msg string) {
	writeJSON(w, code, map[string]string{"error": msg})
}

func decode(w http.ResponseWriter, r *http.Request, v any) bool {
	b, err := io.ReadAll(io.LimitReader(r.Body, 4<<20))
	if err != nil {
		writeErr(w, http.StatusBadRequest, "cannot read the body")
		return false
	}
	if err := json.Unmarshal(b, v); err != nil {
		writeErr(w, http.StatusBadRequest, "the body is not valid JSON: "+err.Error())
		return false
	}
	return true
}

// mutate applies fn to a fresh copy of job id and stores it with a CAS on
// its revision, retrying when another request moved it in between. fn
// returns an HTTP status to answer instead of storing (0: store), and the
// events to record.
func (s *Server) mutate(id string, fn func(j *Job, now time.Time) (code int, msg string, evs []Event)) (Job, int, string) {
	for range 50 {
		j, ok := s.st.job(id)
		if !ok {
			return Job{}, http.StatusNotFound, "no job " + id
		}
		now := s.o.Now().UTC()
		code, msg, evs := fn(&j, now)
		if code != 0 {
			return j, code, msg
		}
		nj, err := s.st.cas(j, now, evs...)
		if errors.Is(err, errConflict) {
			continue
		}
		if err != nil {
			return Job{}, http.StatusInternalServerError, err.Error()
		}
		return nj, 0, ""
	}
	return Job{}, http.StatusServiceUnavailable, "too much contention on job " + id
}

// fenced records and answers a 409.
func (s *Server) fenced(w http.ResponseWriter, j Job, call, factory string, epoch int64, why string) {
	s.st.event(Event{JobID: j.ID, Kind: "fenced", Factory: factory, Epoch: epoch, Stage: j.Stage, Status: http.StatusConflict, Call: call, Detail: why}, s.o.Now().UTC())
	writeErr(w, http.StatusConflict, why)
}

// unblock moves blocked jobs whose deps have now shipped to queued.
func (s *Server) unblock() {
	stageOf := func(id string) (string, bool) {
		j, ok := s.st.job(id)
		return j.Stage, ok
	}
	for _, j := range s.st.jobs() {
		if j.Stage != StageBlocked || !depsShipped(&j, stageOf) {
			continue
		}
		s.mutate(j.ID, func(x *Job, now time.Time) (int, string, []Event) {
			if x.Stage != StageBlocked {
				return http.StatusConflict, "", nil
			}
			x.Stage = StageQueued
			return 0, "", []Event{{JobID: x.ID, Kind: "unblocked", Epoch: x.LeaseEpoch, Stage: StageQueued}}
		})
	}
}

// Reap returns jobs whose lease expired to queued (epoch bumped, so the old
// holder is fenced; checkpoint kept), and announces jobs whose retry backoff
// passed (a version bump, for gated factories). It returns how many leases
// it reaped.
func (s *Server) Reap(now time.Time) int {
	n := 0
	for _, j := range s.st.jobs() {
		switch {
		case j.held() && !j.LeaseExpiresAt.IsZero() && now.After(j.LeaseExpiresAt):
			_, code, _ := s.mutate(j.ID, func(x *Job, _ time.Time) (int, string, []Event) {
				if !x.held() || !now.After(x.LeaseExpiresAt) {
					return http.StatusConflict, "", nil
				}
				holder := x.Holder
				x.LeaseEpoch++
				x.Holder, x.LeaseExpiresAt = "", time.Time{}
				x.Reason, x.Detail = string(job.ReasonLeaseLost), "lease of "+holder+" expired"
				x.Previous = &job.Previous{Attempt: x.Attempts, Reason: job.ReasonLeaseLost,
					Detail: "the lease of factory " + holder + " expired: it stopped renewing (lost, killed or cut off) while the job ran"}
				x.Stage = StageQueued
				if !job.Retryable(job.ReasonLeaseLost, x.Attempts, x.Retry) {
					x.Stage = StageDeadLetter
				}
				return 0, "", []Event{{JobID: x.ID, Kind: "reaped", Factory: holder, Epoch: x.LeaseEpoch, Stage: x.Stage, Detail: "lease expired; checkpoint " + x.Checkpoint + " kept"}}
			})
			if code == 0 {
				n++
			}
		case !j.held() && j.Holder != "" && !j.LeaseExpiresAt.IsZero() && now.After(j.LeaseExpiresAt):
			// A lease a legacy PATCH to failed or queued left held, never
			// released: it expires; the reported stage stays.
			s.mutate(j.ID, func(x *Job, _ time.Time) (int, string, []Event) {
				if x.held() || x.Holder == "" || !now.After(x.LeaseExpiresAt) {
					return http.StatusConflict, "", nil
				}
				holder := x.Holder
				x.Holder, x.LeaseExpiresAt = "", time.Time{}
				return 0, "", []Event{{JobID: x.ID, Kind: "expired", Factory: holder, Epoch: x.LeaseEpoch, Stage: x.Stage, Detail: "lease of " + holder + " expired; never released"}}
			})
		case j.Waiting && !now.Before(j.NotBefore):
			s.mutate(j.ID, func(x *Job, _ time.Time) (int, string, []Event) {
				if !x.Waiting {
					return http.StatusConflict, "", nil
				}
				x.Waiting = false
				return 0, "", []Event{{JobID: x.ID, Kind: "due", Epoch: x.LeaseEpoch, Stage: x.Stage}}
			})
			s.st.mu.Lock()
			s.st.st.Version++ // the job is claimable now: gated factories must look
			_ = s.st.persistLocked()
			s.st.mu.Unlock()
		}
	}
	return n
}
