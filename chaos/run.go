//go:build linux

package chaos

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/aqfleet/aq/agent/daemon"
	"github.com/aqfleet/aq/agent/manifest"
	"github.com/aqfleet/aq/demo/coord"
	"github.com/aqfleet/aq/demo/sbpeer/sbpeertest"
	"github.com/aqfleet/aq/internal/process"
	aqsb "github.com/aqfleet/aq/internal/sandbox"
	"github.com/aqfleet/aq/profiles"
)

// Result is a finished run: what ran, what was injected, what was checked.
type Result struct {
	Config  Config `json:"-"`
	Mode    string `json:"mode"`
	ModeWhy string `json:"modeWhy,omitempty"` // why loopback, when it is
	// Sandbox is how the factories run engines (AQ_SANDBOX, the level this
	// host gives them); SandboxWhy, when the stragglers and the
	// kill9-sandboxed faults are not run, why (engines not fully
	// sandboxed here).
	Sandbox    string        `json:"sandbox"`
	SandboxWhy string        `json:"sandboxWhy,omitempty"`
	Network    string        `json:"network"`
	Token      string        `json:"token"`
	Dir        string        `json:"dir"`
	Started    time.Time     `json:"started"`
	Duration   time.Duration `json:"duration"`
	// Converged: every job reached a terminal stage before Config.Guard.
	Converged bool          `json:"converged"`
	Schedule  []Fault       `json:"schedule"`
	Faults    []FaultRecord `json:"faults"`
	Jobs      []JobSpec     `json:"jobs"`
	// Problems the harness saw while running (a factory that exited on its
	// own, a daemon that would not stop): each is a finding.
	Problems []string `json:"problems,omitempty"`
	Checks   *Report  `json:"checks"`
	// Peer counts the broker peer's events by kind.
	Peer map[string]int `json:"peer"`
}

// FaultRecord is one fault as it happened.
type FaultRecord struct {
	Fault
	Start time.Time `json:"start"`
	End   time.Time `json:"end"`
	// Running is how many jobs the target factory held when it was hit.
	Running int    `json:"running"`
	Detail  string `json:"detail,omitempty"`
	// Job is the job a preemption requeued.
	Job string `json:"job,omitempty"`
}

// factoryRoutes are the routes fault windows apply to: the factories'
// calls (the harness's own submit and list calls are spared).
var factoryRoutes = []string{coord.RouteEnroll, coord.RouteHeartbeat, coord.RouteQueueState, coord.RouteClaim, coord.RouteAccept,
	coord.RouteRenew, coord.RouteRelease, coord.RoutePatch, coord.RouteFail, coord.RouteLogAppend}

type harness struct {
	cfg   Config
	exe   string
	sb    *sandbox
	net   network
	peer  *sbpeertest.Peer
	token string
	enrol string
	start time.Time
	res   *Result

	coordMu   sync.Mutex
	coordCfg  coordConfig
	coordProc *child
	coordURL  string
	hc        *http.Client

	facts []*factory
	// stragglers: some engines daemonise a straggler, and the
	// kill9-sandboxed faults run (the factories sandbox fully, or
	// Config.Stragglers).
	stragglers bool

	mu       sync.Mutex
	faults   []FaultRecord
	problems []string
}

// factory is one `aq daemon` host.
type factory struct {
	i         int
	id        string
	home, src string
	env       []string
	log       string
	// faultMu serialises the faults on this factory: the schedule keeps
	// them apart, but a drain can take longer than it guessed (a final
	// report retried for its drain budget under 503s).
	faultMu     sync.Mutex
	mu          sync.Mutex
	cur         *child
	incarnation int
	down        bool // the harness took it down on purpose
	exits       []string
}

func newToken() string {
	var b [3]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

func (r *harness) logf(format string, args ...any) {
	if r.cfg.Progress == nil {
		return
	}
	el := time.Since(r.start).Truncate(100 * time.Millisecond)
	fmt.Fprintf(r.cfg.Progress, "[chaos %7s] %s\n", el, fmt.Sprintf(format, args...))
}

func (r *harness) problem(format string, args ...any) {
	msg := fmt.Sprintf(format, args...)
	r.mu.Lock()
	r.problems = append(r.problems, msg)
	r.mu.Unlock()
	r.logf("PROBLEM: %s", msg)
}

// Run runs the chaos harness once: it builds the sandbox, runs the load
// under the fault schedule until every job is terminal (or Config.Guard
// passes), stops the factories, runs aq gc on each, checks the invariants,
// and tears everything down — also when ctx is cancelled (Ctrl-C) or a step
// fails. The error is about the harness itself; invariant failures are in
// Result.Checks.
func Run(ctx context.Context, cfg Config) (res *Result, err error) {
	if cfg.AQ == "" {
		return nil, errors.New("chaos: Config.AQ (the aq binary) is required")
	}
	if why := sbpeertest.Missing(); why != "" {
		return nil, errors.New("chaos: the broker peer cannot run: " + why)
	}
	exe, err := os.Executable()
	if err != nil {
		return nil, err
	}
	r := &harness{cfg: cfg, exe: exe, token: newToken(), start: time.Now(), hc: &http.Client{Timeout: 15 * time.Second}}
	r.enrol = "aqe_chaos_" + r.token
	r.res = &Result{Config: cfg, Token: r.token, Started: r.start.UTC()}
	res = r.res

	dir := cfg.Dir
	if dir == "" {
		parent := os.TempDir()
		if st, err := os.Stat("/dev/shm"); err == nil && st.IsDir() {
			parent = "/dev/shm"
		}
		if dir, err = os.MkdirTemp(parent, "aq-chaos-"+r.token+"-"); err != nil {
			return res, err
		}
	}
	r.res.Dir = dir
	var cleanups []func()
	defer func() {
		r.logf("tearing down")
		for i := len(cleanups) - 1; i >= 0; i-- {
			cleanups[i]()
		}
		res.Duration = time.Since(r.start)
		if !cfg.Keep && err == nil && res.Checks != nil && res.Checks.OK() {
			os.RemoveAll(dir)
		}
	}()

	r.logf("sandbox %s", dir)
	if r.sb, err = newSandbox(dir, cfg.Repos); err != nil {
		return res, err
	}

	// The hosts.
	mode := cfg.Mode
	if mode == "" || mode == "auto" {
		if why := netnsUsable(); why != "" {
			mode, r.res.ModeWhy = ModeLoopback, why
		} else {
			mode = ModeNetns
		}
	}
	switch mode {
	case ModeNetns:
		nn, err := newNetns(exe, r.sb.path("logs"), r.token, cfg.Factories)
		if err != nil {
			return res, fmt.Errorf("network namespaces: %w", err)
		}
		r.net = nn
	case ModeLoopback:
		r.net = newLoopNet(cfg.Factories)
	default:
		return res, fmt.Errorf("unknown mode %q (auto, %s, %s)", mode, ModeNetns, ModeLoopback)
	}
	cleanups = append(cleanups, func() { _ = r.net.Close() })
	r.res.Mode = r.net.Mode()
	r.logf("hosts: %s%s", r.res.Mode, map[bool]string{true: " (" + r.res.ModeWhy + ")", false: ""}[r.res.ModeWhy != ""])

	// How the factories' engines run: in a full sandbox, the stragglers
	// and the faults that kill aq under them run.
	if err := r.sandboxLevel(); err != nil {
		return res, err
	}
	r.logf("engines: %s", r.res.Sandbox)
	cleanups = append(cleanups, r.killStragglers)

	// The broker peer, then the coordinator stub.
	var subs []string
	for i := range cfg.Factories {
		subs = append(subs, fmt.Sprintf("fleet-dispatch/f%d", i+1))
	}
	r.peer, err = sbpeertest.Launch(sbpeertest.Options{Subs: subs, LockDuration: 10 * time.Second, MaxDelivery: 10, Persist: true, Dir: r.sb.path("peer")})
	if err != nil {
		return res, fmt.Errorf("broker peer: %w", err)
	}
	cleanups = append(cleanups, func() { r.peer.Stop() })

	r.coordCfg = coordConfig{
		Listen: r.net.CoordListen(0), StateFile: r.sb.path("coord", "state.json"), CallLog: r.sb.path("coord", "calls.jsonl"), RequestLog: r.sb.path("coord", "requests.jsonl"),
		EnrollToken: r.enrol, LeaseTTLMs: cfg.LeaseTTL.Milliseconds(), StaleMs: cfg.StaleAfter.Milliseconds(), ReapMs: 200,
		MaxBackoff: 1000, Seed: cfg.Seed, FaultRoutes: factoryRoutes, Broker: r.peer.ConnectionString(), RescanMs: 250,
	}
	if err := r.startCoord(); err != nil {
		return res, err
	}
	cleanups = append(cleanups, r.stopCoord)
	if err := r.net.Attach(r.coordCfg.Listen, r.peer.Addr()); err != nil {
		return res, err
	}
	r.res.Network = r.net.Describe()

	// The factories.
	for i := range cfg.Factories {
		f, err := r.newFactory(i)
		if err != nil {
			return res, err
		}
		r.facts = append(r.facts, f)
	}
	cleanups = append(cleanups, r.killFactories)
	for _, f := range r.facts {
		if err := r.startFactory(f); err != nil {
			return res, err
		}
	}

	// Load and faults. Submissions go on past the last fault that must land
	// on running work, wherever the overlap rules moved it (LoadSpan).
	sched := Schedule(cfg)
	cfg.SubmitSpan = LoadSpan(cfg, sched)
	r.cfg.SubmitSpan, r.res.Config.SubmitSpan = cfg.SubmitSpan, cfg.SubmitSpan
	jobs := Load(cfg, r.token)
	if !r.stragglers {
		for i := range jobs {
			jobs[i].Straggler = false
		}
	}
	r.res.Jobs, r.res.Schedule = jobs, sched
	cleanups = append(cleanups, func() { r.killEngines(jobs) })
	r.logf("seed %d: %d jobs over %d repos, %d factories x %d slots, %d faults", cfg.Seed, len(jobs), cfg.Repos, cfg.Factories, cfg.Slots, len(sched))

	loadStart := time.Now()
	runCtx, stopRun := context.WithCancel(ctx)
	defer stopRun()
	var wg sync.WaitGroup
	submitted := make(chan error, 1)
	wg.Add(1)
	go func() {
		defer wg.Done()
		submitted <- r.submitAll(runCtx, jobs, loadStart)
	}()
	faultsDone := make(chan struct{})
	wg.Add(1)
	go func() {
		defer wg.Done()
		defer close(faultsDone)
		r.runSchedule(runCtx, sched, loadStart)
	}()

	converged, werr := r.waitTerminal(runCtx, jobs, submitted, faultsDone)
	stopRun()
	wg.Wait()
	r.res.Converged = converged
	if werr != nil && ctx.Err() != nil {
		return res, ctx.Err()
	}

	// Stop: spools empty, then every factory drained (one SIGTERM each).
	r.waitSpools(ctx)
	r.stopFactories()
	r.stopCoord()
	r.peer.Stop()
	r.res.Peer = r.peerCounts()
	if ctx.Err() != nil {
		return res, ctx.Err()
	}

	// aq gc on every factory, then the checks.
	r.logf("running aq gc on every factory")
	gcs := r.runGC(ctx)
	r.mu.Lock()
	r.res.Faults = append([]FaultRecord(nil), r.faults...)
	r.res.Problems = append([]string(nil), r.problems...)
	r.mu.Unlock()
	sort.Slice(r.res.Faults, func(a, b int) bool { return r.res.Faults[a].Start.Before(r.res.Faults[b].Start) })
	in, err := r.collect(jobs, gcs)
	if err != nil {
		return res, err
	}
	r.res.Checks = Check(in)
	r.logf("checks: %s", r.res.Checks.Summary())
	return res, nil
}

// ---- the engines' sandbox ----

// sandboxMode is the factories' AQ_SANDBOX.
func (r *harness) sandboxMode() string {
	if r.cfg.Sandbox == "" {
		return string(aqsb.ModeAuto)
	}
	return r.cfg.Sandbox
}

// sandboxLevel asks the aq binary's sandbox what this host gives the
// factories' engines (the probe aq itself makes: a trial sandbox), and
// decides whether the stragglers run.
func (r *harness) sandboxLevel() error {
	mode, err := aqsb.ParseMode(r.sandboxMode())
	if err != nil {
		return fmt.Errorf("chaos: Config.Sandbox %q %v", r.cfg.Sandbox, err)
	}
	h := aqsb.Open(aqsb.Options{Init: r.cfg.AQ, Mode: mode})
	rep := h.Report()
	r.res.Sandbox = "AQ_SANDBOX=" + string(mode) + ": " + string(rep.Level)
	if rep.Mechanism != "" {
		r.res.Sandbox += " (" + rep.Mechanism + ")"
	}
	if m := rep.MissingLine(); m != "" && mode != aqsb.ModeOff {
		r.res.Sandbox += "; missing: " + m
	}
	if err := h.Refuses(); err != nil {
		return fmt.Errorf("chaos: the factories would refuse every job: %v", err)
	}
	full := rep.Level == aqsb.LevelFull
	r.stragglers = full || r.cfg.Stragglers
	switch {
	case !full && r.cfg.Stragglers:
		r.res.SandboxWhy = "the engines are not fully sandboxed (" + string(rep.Level) + "), and their stragglers run anyway (Config.Stragglers)"
	case !full:
		r.res.SandboxWhy = "the engines are not fully sandboxed here (" + string(rep.Level) + "): nothing ends a straggler with its aq"
	}
	return nil
}

// killStragglers kills what the stragglers of this run left (they carry
// its runs directory on their command line): where no sandbox ended them.
func (r *harness) killStragglers() {
	for _, pid := range findCmdline(r.sb.stragglerMark()) {
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
}

// ---- the coordinator stub ----

func (r *harness) startCoord() error {
	r.coordMu.Lock()
	defer r.coordMu.Unlock()
	cmd, err := helperCommand(r.exe, r.sb.path("coord"), "coord", "coord", r.coordCfg, nil)
	if err != nil {
		return err
	}
	c, err := startChildReady("coordinator stub", cmd, r.sb.path("logs", "coord.log"), true)
	if err != nil {
		return err
	}
	r.coordProc = c
	r.coordCfg.Listen = c.readyAddr // the same port after a restart
	r.coordURL = "http://" + c.readyAddr
	return nil
}

func (r *harness) killCoord() {
	r.coordMu.Lock()
	c := r.coordProc
	r.coordMu.Unlock()
	if c != nil {
		c.kill()
		c.wait()
	}
}

func (r *harness) stopCoord() {
	r.coordMu.Lock()
	c := r.coordProc
	r.coordMu.Unlock()
	if c == nil || !c.alive() {
		return
	}
	c.signal(syscall.SIGTERM)
	if !c.waitFor(10 * time.Second) {
		c.killGroup()
		c.wait()
	}
}

// reportRoutes are the routes a report-errors window refuses.
var reportRoutes = []string{coord.RoutePatch, coord.RouteFail}

// setFaults sets the stub's fault injection on routes now, and for its next
// start.
func (r *harness) setFaults(rate float64, latency time.Duration, routes []string) error {
	r.coordMu.Lock()
	r.coordCfg.FailRate, r.coordCfg.LatencyMs, r.coordCfg.FaultRoutes = rate, latency.Milliseconds(), routes
	r.coordMu.Unlock()
	body, _ := json.Marshal(map[string]any{"failRate": rate, "latencyMs": latency.Milliseconds(), "routes": routes})
	_, err := r.stubCall(context.Background(), http.MethodPost, "/fleet/_faults", body, 30*time.Second)
	return err
}

// stubCall calls the stub as an operator (the enrollment token), retrying
// while it is down (a restart) for at most budget.
func (r *harness) stubCall(ctx context.Context, method, path string, body []byte, budget time.Duration) ([]byte, error) {
	deadline := time.Now().Add(budget)
	for {
		r.coordMu.Lock()
		url := r.coordURL + path
		r.coordMu.Unlock()
		req, err := http.NewRequestWithContext(ctx, method, url, bytes.NewReader(body))
		if err != nil {
			return nil, err
		}
		req.Header.Set("Authorization", "Bearer "+r.enrol)
		req.Header.Set("Content-Type", "application/json")
		resp, err := r.hc.Do(req)
		if err == nil {
			b, rerr := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode < 300 && rerr == nil {
				return b, nil
			}
			if resp.StatusCode < 500 {
				return nil, fmt.Errorf("%s %s: %s: %s", method, path, resp.Status, strings.TrimSpace(string(b)))
			}
			err = fmt.Errorf("%s %s: %s", method, path, resp.Status)
		}
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		if time.Now().After(deadline) {
			return nil, err
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// ---- load ----

func (r *harness) submitAll(ctx context.Context, jobs []JobSpec, t0 time.Time) error {
	cat, err := profiles.Embedded()
	if err != nil {
		return err
	}
	wall := r.cfg.Wall.String()
	for _, j := range jobs {
		if d := time.Until(t0.Add(j.SubmitAt)); d > 0 {
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(d):
			}
		}
		body, valid := r.sb.manifest(j, wall)
		m, err := manifest.Parse(j.ID+".md", []byte(valid), cat)
		if err != nil {
			return fmt.Errorf("the harness's manifest for %s is not valid: %w", j.ID, err)
		}
		req, _ := json.Marshal(map[string]any{"manifest": m, "bodyMd": body})
		if _, err := r.stubCall(ctx, http.MethodPost, "/fleet/jobs", req, 5*time.Minute); err != nil {
			return fmt.Errorf("submit %s: %w", j.ID, err)
		}
	}
	r.logf("all %d jobs submitted", len(jobs))
	return nil
}

// waitTerminal watches the stub until every job is terminal, the schedule
// has run and every factory is up — or the guard passes (false).
func (r *harness) waitTerminal(ctx context.Context, jobs []JobSpec, submitted <-chan error, faultsDone <-chan struct{}) (bool, error) {
	guard := time.NewTimer(r.cfg.Guard - time.Since(r.start))
	defer guard.Stop()
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	subDone, schedDone := false, false
	last := ""
	for {
		select {
		case <-ctx.Done():
			return false, ctx.Err()
		case <-guard.C:
			r.problem("the run did not converge within the guard (%s): %s", r.cfg.Guard, last)
			return false, nil
		case err := <-submitted:
			subDone = true
			if err != nil {
				r.problem("submitting failed: %v", err)
			}
		case <-faultsDone:
			schedDone = true
			faultsDone = nil
		case <-tick.C:
		}
		r.superviseFactories()
		counts, err := r.stages()
		if err != nil {
			continue
		}
		var parts []string
		for _, k := range []string{"queued", "blocked", "assigned", "building", "shipped", "failed", "dead_letter"} {
			if counts[k] > 0 {
				parts = append(parts, fmt.Sprintf("%s %d", k, counts[k]))
			}
		}
		last = strings.Join(parts, ", ")
		terminal := counts["shipped"] + counts["failed"] + counts["dead_letter"]
		r.logf("%d/%d terminal: %s", terminal, len(jobs), last)
		if subDone && schedDone && terminal == len(jobs) && r.allUp() {
			return true, nil
		}
	}
}

func (r *harness) stages() (map[string]int, error) {
	b, err := r.stubCall(context.Background(), http.MethodGet, "/fleet/jobs", nil, 5*time.Second)
	if err != nil {
		return nil, err
	}
	var out struct {
		Jobs []coord.Job `json:"jobs"`
	}
	if err := json.Unmarshal(b, &out); err != nil {
		return nil, err
	}
	c := map[string]int{}
	for _, j := range out.Jobs {
		c[j.Stage]++
	}
	return c, nil
}

// ---- factories ----

const sbKey = "c2JwZWVyLWxvY2FsLWtleQ=="

func (r *harness) newFactory(i int) (*factory, error) {
	id := fmt.Sprintf("f%d", i+1)
	root := r.sb.path(id)
	f := &factory{i: i, id: id, home: filepath.Join(root, "home"), src: filepath.Join(root, "src"), log: r.sb.path("logs", id+".log")}
	if err := r.sb.cloneAll(f.src); err != nil {
		return nil, err
	}
	gate := "0"
	if i%2 == 1 {
		gate = "1" // half the factories gate their poll path
	}
	var env []string
	for _, kv := range os.Environ() {
		k, _, _ := strings.Cut(kv, "=")
		if strings.HasPrefix(k, "AQ_") || k == "POLL_SECONDS" || strings.HasPrefix(k, "GIT_") || k == HelperEnv || strings.HasPrefix(k, "CHAOS_") {
			continue
		}
		env = append(env, kv)
	}
	env = append(env,
		"GIT_CONFIG_GLOBAL="+r.sb.path("gitconfig"), "GIT_CONFIG_NOSYSTEM=1",
		"AQ_HOME="+f.home, "AQ_REPO_BASE="+f.src,
		"AQ_FLEET=1", "AQ_FLEET_API="+r.net.FactoryAPI(i), "AQ_FLEET_TOKEN="+r.enrol, "AQ_FACTORY_ID="+id,
		// The chaos jobs are script jobs: the factories opt in to script,
		// and pass the engine the two variables its script reads.
		"AQ_ENGINES=all", "AQ_ENGINE_ENV=CHAOS_RUNS,CHAOS_FACTORY",
		fmt.Sprintf("AQ_SLOTS=%d", r.cfg.Slots), "AQ_HEARTBEAT_SEC=1", "AQ_FLEET_LEASE_RENEW_SEC=1", "AQ_POLL_SECONDS=1",
		"AQ_FLEET_GATE="+gate, "AQ_KILL_GRACE=500ms", "AQ_DRAIN_TIMEOUT="+r.cfg.DrainTimeout.String(),
		"AQ_CHECKPOINT_INTERVAL="+r.cfg.CheckpointInterval.String(),
		"AQ_LOG_FORMAT=json", "AQ_LOG_LEVEL=info",
		"AQ_SB_CONNECTION_STRING=Endpoint=sb://"+r.net.FactoryBroker(i)+";SharedAccessKeyName=sbpeer;SharedAccessKey="+sbKey+";UseDevelopmentEmulator=true",
		"CHAOS_FACTORY="+id, "CHAOS_RUNS="+r.sb.runsDir(),
		// The scripted engine records its runs in CHAOS_RUNS, outside its
		// worktree: the sandbox lets every engine write there.
		"AQ_SANDBOX="+r.sandboxMode(), "AQ_SANDBOX_WRITABLE="+r.sb.shared(),
	)
	if r.cfg.AQRace {
		env = append(env, "GORACE=atexit_sleep_ms=50 halt_on_error=0")
	}
	f.env = env
	return f, nil
}

func (r *harness) startFactory(f *factory) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.incarnation++
	lf, err := os.OpenFile(f.log, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err == nil {
		fmt.Fprintf(lf, "{\"msg\":\"chaos: incarnation %d starts\",\"time\":%q}\n", f.incarnation, time.Now().UTC().Format(time.RFC3339Nano))
		lf.Close()
	}
	cmd := r.net.Command(f.i, r.cfg.AQ, "daemon")
	cmd.Env = f.env
	cmd.Dir = f.src
	c, err := startChild("aq daemon "+f.id, cmd, f.log)
	if err != nil {
		return err
	}
	f.cur, f.down = c, false
	return nil
}

// superviseFactories notices a factory that exited without being told to
// (a crash of aq is a finding) and starts it again.
func (r *harness) superviseFactories() {
	for _, f := range r.facts {
		f.mu.Lock()
		c, down := f.cur, f.down
		f.mu.Unlock()
		if down || c == nil || c.alive() {
			continue
		}
		r.problem("factory %s (incarnation %d) exited on its own: code %d %s; log: %s", f.id, f.incarnation, c.code, c.sig, lastLines(f.log, 5))
		if err := r.startFactory(f); err != nil {
			r.problem("cannot restart factory %s: %v", f.id, err)
		}
	}
}

func (r *harness) allUp() bool {
	for _, f := range r.facts {
		f.mu.Lock()
		ok := !f.down && f.cur != nil && f.cur.alive()
		f.mu.Unlock()
		if !ok {
			return false
		}
	}
	return true
}

// take marks f down on purpose and returns its process.
func (f *factory) take() *child {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.down = true
	return f.cur
}

func (f *factory) exited(c *child, why string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.exits = append(f.exits, fmt.Sprintf("%s: code %d %s", why, c.code, c.sig))
}

// runningJob is a job the factory's engine is running now ("" if none).
func (f *factory) runningJob() string {
	if st := f.status(); st != nil {
		for _, j := range st.Running {
			if j.Phase == "running" {
				return j.JobID
			}
		}
	}
	return ""
}

// status is the factory's daemon status file.
func (f *factory) status() *daemon.Status {
	st, _ := daemon.ReadStatus(filepath.Join(f.home, "state"))
	return st
}

// waitUp waits (up to d) until the daemon f.cur runs has started: its
// "aq daemon starting" line for this incarnation is in f's log. From then on
// it handles SIGTERM; before, a signal finds the Go runtime without a
// handler and ends the process (the default action) — a race of the
// harness's, not a fault of aq's.
func (f *factory) waitUp(c *child, d time.Duration) {
	f.mu.Lock()
	want := f.incarnation
	f.mu.Unlock()
	deadline := time.Now().Add(d)
	for c.alive() && time.Now().Before(deadline) {
		if b, err := os.ReadFile(f.log); err == nil && strings.Count(string(b), `"msg":"aq daemon starting"`) >= want {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// lockStraggler waits (at most d) until an engine of some factory whose
// fault lock is free has daemonised a straggler that is up — the planned
// target first, then the others: one factory may run no such engine for a
// while, all three rarely — and returns that factory's index with its
// fault lock held, the run ("<job>/<n>") and how many are up on it. When
// none came up in time it returns the planned target, locked, and "".
func (r *harness) lockStraggler(target int, d time.Duration) (int, string, int) {
	runs := r.sb.runsDir()
	for deadline := time.Now().Add(d); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		for k := range r.facts {
			i := (target + k) % len(r.facts)
			if up := r.facts[i].stragglersUp(runs); len(up) > 0 && r.facts[i].faultMu.TryLock() {
				return i, up[0], len(up)
			}
		}
	}
	r.facts[target].faultMu.Lock()
	return target, "", 0
}

// stragglersUp lists the runs of this factory's engines that have
// daemonised a straggler that is up (the engine's and the straggler's
// files both refreshed within the last second: a run that failed writes no
// done file), as "<job>/<n>".
func (f *factory) stragglersUp(runs string) []string {
	var up []string
	jobs, _ := os.ReadDir(runs)
	for _, j := range jobs {
		ns, _ := os.ReadDir(filepath.Join(runs, j.Name()))
		for _, n := range ns {
			dir := filepath.Join(runs, j.Name(), n.Name())
			who, err := os.ReadFile(filepath.Join(dir, "who"))
			if err != nil || !strings.HasPrefix(string(who), f.id+" ") {
				continue
			}
			if _, err := os.Stat(filepath.Join(dir, "done")); err == nil {
				continue
			}
			fresh := func(name string) bool {
				st, err := os.Stat(filepath.Join(dir, name))
				return err == nil && time.Since(st.ModTime()) < time.Second
			}
			if fresh("alive") && fresh("straggler") {
				up = append(up, j.Name()+"/"+n.Name())
			}
		}
	}
	return up
}

// waitBusy waits (a little) for f to run a job, so that a fault lands
// mid-job; it returns how many it runs.
func (f *factory) waitBusy(d time.Duration) int {
	deadline := time.Now().Add(d)
	for {
		if st := f.status(); st != nil && st.Busy > 0 {
			n := 0
			for _, j := range st.Running {
				if j.Phase == "running" {
					n++
				}
			}
			if n > 0 || time.Now().After(deadline) {
				return st.Busy
			}
		}
		if time.Now().After(deadline) {
			return 0
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// waitSpools waits until no factory has a report in its spool (the drain
// loops re-send them; they may be backing off after a long outage).
func (r *harness) waitSpools(ctx context.Context) {
	deadline := time.Now().Add(4 * time.Minute)
	for ctx.Err() == nil {
		left := 0
		for _, f := range r.facts {
			left += len(spoolFiles(f.home))
		}
		if left == 0 {
			return
		}
		if time.Now().After(deadline) {
			r.problem("%d reports still in the factories' spools after 4 minutes", left)
			return
		}
		time.Sleep(250 * time.Millisecond)
	}
}

// stopFactories drains every factory with one SIGTERM and waits for it.
func (r *harness) stopFactories() {
	var wg sync.WaitGroup
	for _, f := range r.facts {
		c := f.take()
		if c == nil || !c.alive() {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			f.waitUp(c, 30*time.Second)
			c.signal(syscall.SIGTERM)
			if !c.waitFor(r.cfg.DrainTimeout + 2*time.Minute) {
				r.problem("factory %s did not stop within its drain timeout + 2 min after SIGTERM; killed", f.id)
				c.killGroup()
				c.wait()
			}
			f.exited(c, "final drain")
			if c.code != 0 {
				r.problem("factory %s exited %d %s after the final SIGTERM (want 0)", f.id, c.code, c.sig)
			}
		}()
	}
	wg.Wait()
}

func (r *harness) killFactories() {
	for _, f := range r.facts {
		c := f.take()
		if c != nil && c.alive() {
			c.killGroup()
			c.wait()
		}
	}
}

// killEngines stops whatever still carries a job's tag (after a failed or
// interrupted run; a clean run leaves nothing).
func (r *harness) killEngines(jobs []JobSpec) {
	for _, j := range jobs {
		_, _ = process.KillScoped(context.Background(), j.ID, "", 0)
	}
}

func (r *harness) peerCounts() map[string]int {
	evs, err := r.peer.Events()
	if err != nil {
		return nil
	}
	c := map[string]int{}
	for _, e := range evs {
		c[e.Event]++
	}
	return c
}

func lastLines(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, " | ")
}
