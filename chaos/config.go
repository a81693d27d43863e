//go:build linux

package chaos

import (
	"fmt"
	"io"
	"math/rand/v2"
	"slices"
	"sort"
	"time"
)

// Config sizes a run. Full and Reduced are the two presets.
type Config struct {
	Name      string // "full" or "reduced", for the report
	Seed      uint64
	Jobs      int
	Repos     int
	Factories int
	Slots     int
	// Mode: "" or "auto" (namespaces when possible, else loopback),
	// ModeNetns (fail when namespaces cannot be made) or ModeLoopback.
	Mode string
	// AQ is the aq binary the factories run; AQRace says whether it was
	// built with -race (for the report).
	AQ     string
	AQRace bool
	// Dir is the sandbox (default: a new directory under /dev/shm, else
	// the temp dir); removed at the end unless Keep.
	Dir  string
	Keep bool

	Faults FaultCounts
	// Warmup passes before the first fault; Window is the span faults are
	// spread over.
	Warmup, Window time.Duration
	// SubmitSpan spreads the submissions: InitialShare of the jobs at
	// once, the rest evenly over SubmitSpan (so that faults land on work).
	SubmitSpan   time.Duration
	InitialShare float64

	LeaseTTL time.Duration // the stub's lease time to live
	// CheckpointInterval is AQ_CHECKPOINT_INTERVAL of the factories: the
	// bound on the work a lost host or a preemption may cost.
	CheckpointInterval time.Duration
	StaleAfter         time.Duration // the stub's stale window for factories
	// DrainTimeout is AQ_DRAIN_TIMEOUT of the factories: a SIGTERM drain
	// escalates to the second stage after it.
	DrainTimeout time.Duration
	// Wall is every job's wall budget (a hanging engine runs past it).
	Wall time.Duration

	// Guard bounds the whole run: a run that has not converged by then
	// ends and reports what is stuck. A deadlock guard, not a speed limit.
	Guard time.Duration

	// Progress, if set, gets one line per second and per fault.
	Progress io.Writer

	// Sandbox is AQ_SANDBOX of the factories ("" is auto: the full
	// sandbox where this host can). Where the factories' engines run in a
	// full sandbox, a share of the jobs' engines daemonise a straggler and
	// the kill9-sandboxed faults run; elsewhere neither, unless
	// Stragglers: then the stragglers run anyway (the invariant that
	// they end with their aq then shows what the sandbox is for).
	Sandbox    string
	Stragglers bool
}

// FaultCounts is how many faults of each kind a run injects.
type FaultCounts struct {
	Kill9       int `json:"kill9"`       // SIGKILL a factory mid-job, restart it
	Term        int `json:"term"`        // SIGTERM (drain, escalating after AQ_DRAIN_TIMEOUT), restart
	Abort       int `json:"abort"`       // two SIGTERMs (cancel, checkpoint, fail retryable), restart
	PeerRestart int `json:"peerRestart"` // SIGKILL the broker peer, restart it (its state file kept)
	StubRestart int `json:"stubRestart"` // SIGKILL the coordinator stub, restart it (its state file kept)
	Errors      int `json:"errors"`      // a window of 503s and added latency on the factories' routes
	// ReportErrors is a window in which the stub refuses most reports
	// (PATCH, /fleet/fail) with 503 while every other call works: a
	// coordinator whose report path is degraded.
	ReportErrors int `json:"reportErrors"`
	Partition    int `json:"partition"` // cut a factory off past its leases' expiry, reconnect it
	// HostLost: kill -9 a factory's daemon and every process of its host
	// (engines and their supervisors too), delete its AQ_HOME and clones,
	// and bring it back as a fresh host (new clones, enrolled again).
	HostLost int `json:"hostLost"`
	// Preempt: the stub requeues a job a factory is running (its requeue
	// action: epoch bumped, the running factory fenced), as a coordinator
	// preempting it for a critical job would.
	Preempt int `json:"preempt"`
	// Kill9Sandboxed: SIGKILL a factory while one of its engines runs in
	// its sandbox and has daemonised a straggler (a process that dropped
	// the job's tag and left its process group), restart it.
	Kill9Sandboxed int `json:"kill9Sandboxed"`
}

// Full is `make chaos`: 320 jobs over 5 repositories, 4 factories of 2
// slots, every fault kind several times.
func Full(seed uint64) Config {
	return Config{
		Name: "full", Seed: seed, Jobs: 320, Repos: 5, Factories: 4, Slots: 2,
		Faults:       FaultCounts{Kill9: 8, Term: 3, Abort: 3, PeerRestart: 3, StubRestart: 3, Errors: 4, ReportErrors: 2, Partition: 4, HostLost: 3, Preempt: 4, Kill9Sandboxed: 3},
		Warmup:       8 * time.Second,
		Window:       150 * time.Second,
		SubmitSpan:   120 * time.Second,
		InitialShare: 0.3,
		LeaseTTL:     10 * time.Second, StaleAfter: 5 * time.Second, DrainTimeout: 6 * time.Second,
		CheckpointInterval: time.Second,
		Wall:               10 * time.Second,
		Guard:              25 * time.Minute,
	}
}

// Reduced is the run inside `make test`: the full run's repositories, slots
// and timings with 48 jobs, 3 factories, every fault kind the issue names at
// least once (a kill -9, a partition-induced zombie, a peer restart, a stub
// restart), on a compressed schedule.
func Reduced(seed uint64) Config {
	c := Full(seed)
	c.Name, c.Jobs, c.Factories = "reduced", 48, 3
	c.Faults = FaultCounts{Kill9: 1, Term: 1, PeerRestart: 1, StubRestart: 1, Errors: 1, Partition: 1, HostLost: 1, Preempt: 1, Kill9Sandboxed: 1}
	c.Warmup, c.Window, c.SubmitSpan, c.InitialShare = 5*time.Second, 35*time.Second, 30*time.Second, 0.4
	c.Guard = 8 * time.Minute
	return c
}

// Fault kinds.
const (
	KindKill9     = "kill9"
	KindTerm      = "sigterm"
	KindAbort     = "abort"
	KindPeer      = "peer-restart"
	KindStub      = "stub-restart"
	KindErrors    = "errors"
	KindReports   = "report-errors"
	KindPartition = "partition"
	KindHostLost  = "host-lost"
	KindPreempt   = "preempt"
	// KindKill9Sandboxed: kill -9 while a sandboxed engine of the factory
	// runs with a daemonised straggler.
	KindKill9Sandboxed = "kill9-sandboxed"
)

// Fault is one scheduled fault.
type Fault struct {
	Kind   string        `json:"kind"`
	At     time.Duration `json:"at"`     // after the start of the load
	Target int           `json:"target"` // factory index; -1 for the stub and the peer
	// Down is how long the target stays down (killed, cut off) before it is
	// restarted or reconnected, or how long an error window lasts.
	Down    time.Duration `json:"down"`
	Rate    float64       `json:"rate,omitempty"`    // errors: share of 503s
	Latency time.Duration `json:"latency,omitempty"` // errors: added to every answer
}

func (f Fault) factoryFault() bool {
	switch f.Kind {
	case KindKill9, KindTerm, KindAbort, KindPartition, KindHostLost, KindPreempt, KindKill9Sandboxed:
		return true
	}
	return false
}

// kills reports whether f kills a factory's daemon -9 (its engines are
// then its supervisor's, or its sandbox's, to end).
func (f Fault) kills() bool { return f.Kind == KindKill9 || f.Kind == KindKill9Sandboxed }

// Schedule is the seeded fault schedule of cfg: the same seed and sizes give
// the same schedule. Faults on one factory never overlap (a factory is
// killed, drained or cut off once at a time); faults of one global kind
// neither.
func Schedule(cfg Config) []Fault {
	rng := rand.New(rand.NewPCG(cfg.Seed, cfg.Seed^0x5eed))
	between := func(lo, hi time.Duration) time.Duration {
		return lo + time.Duration(rng.Int64N(int64(hi-lo)+1))
	}
	var fs []Fault
	add := func(kind string, n int) {
		for range n {
			f := Fault{Kind: kind, At: cfg.Warmup + between(0, cfg.Window), Target: -1}
			switch kind {
			case KindKill9, KindKill9Sandboxed:
				f.Down = between(500*time.Millisecond, 3*time.Second)
			case KindTerm, KindAbort:
				f.Down = between(500*time.Millisecond, 2*time.Second)
			case KindPeer:
				f.Down = between(time.Second, 6*time.Second)
			case KindStub:
				f.Down = between(500*time.Millisecond, 4*time.Second)
			case KindErrors:
				f.Down = between(4*time.Second, 12*time.Second)
				f.Rate = 0.2 + rng.Float64()*0.4
				f.Latency = between(20*time.Millisecond, 150*time.Millisecond)
			case KindReports:
				f.Down = between(8*time.Second, 15*time.Second)
				f.Rate = 0.7 + rng.Float64()*0.25
			case KindPartition:
				// Long enough for the reaper: the lease's whole TTL, then
				// some.
				f.Down = cfg.LeaseTTL + between(4*time.Second, 10*time.Second)
			case KindHostLost:
				f.Down = between(2*time.Second, 8*time.Second)
			}
			if f.factoryFault() {
				f.Target = rng.IntN(cfg.Factories)
			}
			fs = append(fs, f)
		}
	}
	c := cfg.Faults
	add(KindKill9, c.Kill9)
	add(KindTerm, c.Term)
	add(KindAbort, c.Abort)
	add(KindPeer, c.PeerRestart)
	add(KindStub, c.StubRestart)
	add(KindErrors, c.Errors)
	add(KindReports, c.ReportErrors)
	add(KindPartition, c.Partition)
	add(KindHostLost, c.HostLost)
	add(KindPreempt, c.Preempt)
	add(KindKill9Sandboxed, c.Kill9Sandboxed)
	sort.SliceStable(fs, func(a, b int) bool { return fs[a].At < fs[b].At })

	// Resolve overlaps: a factory fault moves to another factory that is
	// free then, else later; a global fault moves later.
	busy := make([]time.Duration, cfg.Factories) // each factory busy until
	global := map[string]time.Duration{}
	span := func(f Fault) time.Duration {
		d := f.Down + 2*time.Second
		if f.Kind == KindTerm || f.Kind == KindAbort {
			d += cfg.DrainTimeout + 10*time.Second // the drain itself
		}
		if f.kills() || f.Kind == KindHostLost || f.Kind == KindPreempt {
			d += 3 * time.Second // mid-job wait and recovery
		}
		return d
	}
	for i := range fs {
		f := &fs[i]
		if f.factoryFault() {
			order := rng.Perm(cfg.Factories)
			idx := slices.Index(order, f.Target)
			order[0], order[idx] = order[idx], order[0] // the drawn target first
			placed := false
			for _, t := range order {
				if busy[t] <= f.At {
					f.Target, placed = t, true
					break
				}
			}
			if !placed {
				t := 0
				for k := range busy {
					if busy[k] < busy[t] {
						t = k
					}
				}
				f.Target, f.At = t, busy[t]
			}
			busy[f.Target] = f.At + span(*f)
			continue
		}
		key := f.Kind
		if key == KindReports {
			key = KindErrors // one fault configuration on the stub at a time
		}
		if until := global[key]; until > f.At {
			f.At = until
		}
		global[key] = f.At + span(*f)
	}
	sort.SliceStable(fs, func(a, b int) bool { return fs[a].At < fs[b].At })
	return fs
}

// loadTail is how long submissions go on after the last fault that must hit
// running work starts: it waits up to 8–15 s for its target to be busy.
const loadTail = 15 * time.Second

// LoadSpan is how long submissions go on: cfg.SubmitSpan, or longer when the
// schedule's last kill -9, drain, abort or partition comes later (the overlap
// rules push faults on one factory back) — a fault meant to land mid-job must
// find jobs to hit, or a run (the reduced one above all, whose load drains in
// seconds) would kill or cut off an idle factory and prove nothing.
func LoadSpan(cfg Config, sched []Fault) time.Duration {
	span := cfg.SubmitSpan
	for _, f := range sched {
		if f.factoryFault() && f.At+loadTail > span {
			span = f.At + loadTail
		}
	}
	return span
}

// Plans of the scripted engine (see engineScript).
const (
	PlanOK      = "ok"      // succeeds
	PlanFail    = "fail"    // exits 1 on its first K runs, then succeeds
	PlanAlways  = "always"  // always exits 1: dead_letter once the retries are spent
	PlanHang    = "hang"    // hangs past the wall budget on its first run (timeout), then succeeds
	PlanInvalid = "invalid" // its manifest has an unknown key: invalid_manifest, failed (not retryable)
)

// JobSpec is one job of the load.
type JobSpec struct {
	ID       string        `json:"id"`
	Repo     string        `json:"repo"`
	Plan     string        `json:"plan"`
	K        int           `json:"k,omitempty"`
	T1, T2   float64       `json:"-"` // engine sleeps, seconds
	Verify   bool          `json:"verify,omitempty"`
	Priority string        `json:"priority"`
	SubmitAt time.Duration `json:"submitAt"`
	// Straggler: the engine daemonises a straggler at its start (a process
	// that drops the job's tag and leaves its process group), which only
	// the job's sandbox ends with it. Run keeps it only where the
	// factories sandbox fully (or Config.Stragglers).
	Straggler bool `json:"straggler,omitempty"`
}

// Load is the seeded job mix of cfg; token makes the ids unique to the run
// (engines are found host-wide by their AQ_JOB_ID tag).
func Load(cfg Config, token string) []JobSpec {
	rng := rand.New(rand.NewPCG(cfg.Seed^0x10ad, cfg.Seed))
	// The stragglers are drawn apart, so a seed's job mix is what it was
	// before they were.
	strag := rand.New(rand.NewPCG(cfg.Seed^0x5717, cfg.Seed))
	initial := int(float64(cfg.Jobs) * cfg.InitialShare)
	prios := []string{"low", "normal", "normal", "normal", "high", "critical"}
	out := make([]JobSpec, cfg.Jobs)
	for n := range cfg.Jobs {
		j := JobSpec{
			ID:       fmt.Sprintf("cj-%s-%03d", token, n+1),
			Repo:     fmt.Sprintf("r%d", rng.IntN(cfg.Repos)+1),
			T1:       0.2 + rng.Float64()*1.2,
			T2:       0.1 + rng.Float64()*0.8,
			Verify:   rng.IntN(3) == 0,
			Priority: prios[rng.IntN(len(prios))],
		}
		switch p := rng.Float64(); {
		case p < 0.62:
			j.Plan = PlanOK
		case p < 0.76:
			j.Plan, j.K = PlanFail, 1
		case p < 0.80:
			j.Plan, j.K = PlanFail, 2
		case p < 0.86:
			j.Plan = PlanAlways
		case p < 0.95:
			j.Plan, j.K = PlanHang, 1
		default:
			j.Plan = PlanInvalid
		}
		j.Straggler = strag.IntN(4) == 0 && j.Plan != PlanInvalid
		if j.Straggler {
			// A second more with its straggler up: the kill -9 under a
			// sandboxed engine (KindKill9Sandboxed) waits for one, and on a
			// loaded host a run of a second or less is easily missed.
			j.T1++
		}
		if n >= initial && cfg.Jobs > initial {
			j.SubmitAt = time.Duration(float64(cfg.SubmitSpan) * float64(n-initial+1) / float64(cfg.Jobs-initial))
		}
		out[n] = j
	}
	return out
}
