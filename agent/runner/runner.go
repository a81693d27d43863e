// Package runner runs one job (docs/architecture.md, "Running a job"), whatever its source (the
// local folder queue or the fleet): engine pre-flight, the per-(host, repo)
// lock, a linked worktree started from the job's WIP checkpoint or its base,
// the engine under its budgets and the kill ladder, a checkpoint on every exit
// path, verify, the commit on the job branch, and shipping. It owns the kill
// and the checkpoint; the engine process only runs the engine.
//
// The job's path is split by stage, one file each: runner.go (the run and
// its orchestration, do), prepare.go (pre-flight, clone, worktree, resume
// point), engine.go (run and judge), checkpoint.go (the WIP checkpoint),
// result.go (result commit, verify) and deliver.go (push, pull request).
//
// The runner does not know queues or coordinators: the caller hands it a
// job and a context (cancelled with a job.StopError cause when a lease is
// lost), and gets back an Outcome to record.
package runner

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"log/slog"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/aqfleet/aq/agent/holds"
	"github.com/aqfleet/aq/agent/repos"
	"github.com/aqfleet/aq/engines"
	"github.com/aqfleet/aq/internal/abandon"
	"github.com/aqfleet/aq/internal/sandbox"
	"github.com/aqfleet/aq/internal/secrets"
	"github.com/aqfleet/aq/internal/telemetry"
	"github.com/aqfleet/aq/job"
	"github.com/aqfleet/aq/worktree"
)

// Config is what the runner needs of aq's configuration.
type Config struct {
	Home           string
	RepoBase       string
	Grace          time.Duration // kill ladder step
	PermissionMode string        // claude --permission-mode; "": chosen by the sandbox
	Prices         *engines.PriceTable
	// FetchBase: start from origin/<base> (fetched) rather than the local
	// branch. Fleet mode sets it: a factory's checkouts may be stale.
	FetchBase bool
	// Supervisor is the executable that stops an engine and its verify
	// command if aq dies first (process.Spec.Supervisor): aq itself.
	Supervisor string
	// CheckpointInterval: while the engine runs, checkpoint its worktree
	// this often (and push it where the final checkpoint would be pushed),
	// so a lost host or a preemption costs at most one interval of work.
	// 0: only the checkpoint after the engine.
	CheckpointInterval time.Duration
	// Repos resolves a repo that is not under RepoBase to a clone URL
	// (AQ_REPO_URLS); nil: such a job fails repo_unavailable.
	Repos *repos.Resolver
	// Mirror is AQ_REPO_MIRROR, which on-demand clones borrow objects from.
	Mirror string
	// PoolSize is how many finished jobs' worktrees are kept per repository
	// (AQ_WORKTREE_POOL) for the next job on it, which resets one instead of
	// checking out every file. 0: none; a finished job's worktree stays
	// where it ran until aq gc removes it.
	PoolSize int
	// ClaudeTelemetry (AQ_CLAUDE_TELEMETRY) switches Claude Code's own
	// OpenTelemetry export on in the claude engine's environment
	// (telemetry.ClaudeEnv).
	ClaudeTelemetry bool
	// Engines are the engines this runner may run (AQ_ENGINES, resolved);
	// nil: all. A job for another engine fails capability_mismatch before
	// anything is prepared.
	Engines []string
	// EngineEnv are the further variables an engine gets (AQ_ENGINE_ENV)
	// beyond its documented base (engines.Environ).
	EngineEnv []string
	// CodexSandbox is codex's --sandbox (AQ_CODEX_SANDBOX); "" chooses by
	// the job's sandbox, as "" PermissionMode does (sandbox.go).
	CodexSandbox string
	// VerifyRounds (AQ_VERIFY_ROUNDS) is how many repair rounds a job whose
	// manifest and profile set no verify_rounds gets after a failed verify
	// (rounds.go). 0: none.
	VerifyRounds int
	// SandboxWritable (AQ_SANDBOX_WRITABLE) are host directories every
	// job's engine may also write in its sandbox (sandbox.Policy.Shared).
	SandboxWritable []string
	// LogMax (AQ_LOG_MAX) bounds what one run stores in each of the job's
	// logs: stdout, stderr, verify (internal/boundlog; 0: its default).
	LogMax int64
	// JobDiskMax (AQ_JOB_DISK_MAX) is a job's disk budget when its
	// manifest sets none (0: none); DiskReserve (AQ_DISK_RESERVE) the free
	// space no job may take $AQ_HOME's file system below (0: none).
	JobDiskMax, DiskReserve int64
	// ProtectedPaths (AQ_PROTECTED_PATHS) are the globs no change may
	// touch unless its manifest's may_change names them; nil: the default
	// (shipcheck.DefaultProtected).
	ProtectedPaths []string
}

// allows reports whether the runner may run engine name.
func (c Config) allows(name string) bool { return c.Engines == nil || slices.Contains(c.Engines, name) }

// Scope names this aq home in its engines' environment (AQ_SCOPE), so that
// killing a job's leftover processes never touches another home's job of
// the same id on the same host.
func Scope(home string) string {
	sum := sha256.Sum256([]byte(home))
	return "aq-" + hex.EncodeToString(sum[:6])
}

func (c Config) locksDir() string     { return filepath.Join(c.Home, "locks") }
func (c Config) worktreesDir() string { return filepath.Join(c.Home, "worktrees") }
func (c Config) logsDir() string      { return filepath.Join(c.Home, "logs") }

// pool is repo's pool of warm worktrees.
func (c Config) pool(repo string) worktree.Pool {
	return worktree.Pool{Dir: worktree.PoolDir(c.worktreesDir(), repo), Size: c.PoolSize}
}

// Engines finds an engine by name.
type Engines interface {
	Get(name string) (engines.Engine, bool)
	// Names lists the engines `engine: any` may use, in order of preference.
	Names() []string
}

// Shipper opens pull requests and enables auto-merge (ship: pr|merge).
type Shipper interface {
	// Ready is the pre-flight: the tool is installed and logged in. Its
	// error names the missing capability (e.g. has:gh).
	Ready(ctx context.Context, repoDir string) error
	// Ship pushes nothing itself: the branch is already on origin. It opens
	// the PR (and for merge enables auto-merge with branch deletion) and
	// returns the PR's URL.
	Ship(ctx context.Context, req ShipRequest) (url string, err error)
}

// ShipRequest describes a pull request to open.
type ShipRequest struct {
	RepoDir string
	Branch  string
	Base    string
	Title   string
	Body    string
	Merge   bool // enable auto-merge with branch deletion
}

// Lease is the fleet's hold on a job. Local runs have none.
type Lease interface {
	// Confirm renews the lease synchronously; it is called right before
	// every irreversible step (pushing the job branch, opening a PR). A
	// fenced or lost lease returns a *job.StopError.
	Confirm(ctx context.Context) error
	// Held says, without a network call, whether the lease is still held
	// with at least margin to spare (not fenced, not lost, not about to
	// expire). The WIP push asks it: blocking on a dead coordinator there
	// would turn an outage into a lost lease.
	Held(margin time.Duration) bool
}

// Options are per-run.
type Options struct {
	Attempt int
	// Checkpoint is the WIP commit the coordinator recorded for the job, if
	// any: the run resumes from it.
	Checkpoint string
	Lease      Lease
	// Previous is how the job's previous attempt ended, when the caller
	// knows (a local job's queue record, a claimed job's previous, this
	// factory's own record): the engine is told (rounds.go). nil: unknown.
	Previous *job.Previous
	// OnEvent, if set, is called synchronously, one event at a time, from the
	// run, the engine's meter and the periodic checkpoints (events.go).
	OnEvent func(Event)
}

// Outcome is how a run ended: a success stage, or a failure reason.
type Outcome struct {
	Stage      job.Stage    `json:"stage"` // review|testing|shipped on success; failed otherwise
	Reason     job.Reason   `json:"reason,omitempty"`
	Detail     string       `json:"detail,omitempty"`
	Insights   job.Insights `json:"insights"`
	Checkpoint string       `json:"checkpoint,omitempty"` // the WIP commit
	Branch     string       `json:"branch,omitempty"`     // set when the job branch holds a result commit
	Commit     string       `json:"commit,omitempty"`
	PRURL      string       `json:"prUrl,omitempty"`
	Pushed     bool         `json:"pushed,omitempty"` // job branch pushed to origin
	WIPPushed  bool         `json:"wipPushed,omitempty"`
	// OriginCheckpoint is the WIP commit on origin's aq/wip/<id> when the
	// run ended, as far as this run knows ("" = none): Checkpoint when it
	// was pushed (WIPPushed), an earlier one when it was not (a lost
	// lease's). A report names only this one: another factory resumes from
	// origin, never from a commit that stayed on this host.
	OriginCheckpoint string `json:"originCheckpoint,omitempty"`
	Fenced           bool   `json:"fenced,omitempty"`
	// Redelivered: an earlier attempt had put the result on origin; this run
	// reported it without running the engine.
	Redelivered bool `json:"redelivered,omitempty"`
	// Worktree is where the job ran; WarmStart says it was a pooled
	// worktree reset for the job, Pooled that it went back to the pool when
	// the job ended (Worktree no longer exists: the work is on the job's
	// branches).
	Worktree  string `json:"worktree,omitempty"`
	WarmStart bool   `json:"warmStart,omitempty"`
	Pooled    bool   `json:"pooled,omitempty"`
	// Parked (Reason rate_limited) says what the job waits for, e.g.
	// "claude usage limit", and ParkedUntil until when: the limit's reset
	// as the engine reported it, or job.ParkUntil's default.
	Parked      string    `json:"parked,omitempty"`
	ParkedUntil time.Time `json:"parkedUntil,omitzero"`
}

// Failed reports whether the run did not succeed: a failure, or a park
// (see Parked).
func (o Outcome) Failed() bool { return o.Reason != "" }

// IsParked reports whether the run was parked (an engine's rate or usage
// limit, exhausted credit) rather than failed: not an attempt, the job
// waits until ParkedUntil.
func (o Outcome) IsParked() bool { return o.Reason.Parks() }

// Runner runs jobs. Its fields are set once; Run may be called concurrently
// for jobs on different repos (the repo lock serialises the same repo).
type Runner struct {
	Cfg      Config
	Git      worktree.Git
	Engines  Engines
	Shipper  Shipper // nil: ship pr|merge fail pre-flight with capability_mismatch
	Log      *slog.Logger
	Redactor *secrets.Redactor
	Env      []string // the host environment engines inherit (minus aq's secrets)
	Now      func() time.Time
	// Tracer records the run's steps as children of the job's span in the
	// context Run is given (internal/telemetry); nil: no spans.
	Tracer trace.Tracer
	// Holds are the engines held until their limit resets: a run whose
	// engine hits a limit holds it, and a run for a held engine parks at
	// once. nil: nothing is held across runs.
	Holds *holds.Store
	// Sandbox runs each job's engine and verify in a sandbox of the job's
	// own (sandbox.go). nil: unsandboxed.
	Sandbox *sandbox.Host
	// Egress starts each sandboxed job's egress proxy. nil: sandboxed
	// engines have no network at all.
	Egress Egress
}

func (r *Runner) now() time.Time {
	if r.Now != nil {
		return r.Now()
	}
	return time.Now()
}

// run carries one job's state through the steps.
type run struct {
	r       *Runner
	j       *job.Job
	o       Options
	log     *slog.Logger
	out     Outcome
	repoDir string
	wtPath  string
	logDir  string
	eng     engines.Engine
	info    engines.Info
	baseSHA string // the base commit the job's work sits on
	start   string // the commit the worktree was made at

	originOnce sync.Once
	origin     bool
	// wipOnOrigin is origin's aq/wip/<id> when the run started ("" = none):
	// the WIP push is a compare-and-swap against it.
	wipOnOrigin string
	// wipInDoubt is a checkpoint whose push failed or was stopped: it may
	// have reached origin all the same (git updates the ref before it
	// reports), so the next push first asks origin (pushExpect).
	wipInDoubt string
	// jobOnOrigin is origin's aq/job/<id> when the run started ("" = none):
	// the result push is a compare-and-swap against it.
	jobOnOrigin string
	// pushWithResult: the checkpoint after the engine is pushed with the
	// result, in one atomic push, not alone before it (a job without a
	// verify command: nothing long runs between the two). wipPending is
	// that checkpoint until it is pushed (guarded by cpMu).
	pushWithResult bool
	wipPending     string
	// originSaw is what one ls-remote said of the job's two refs on origin
	// when the run started (lookOnOrigin); nil until asked.
	originSaw map[string]string
	// refsAt are the refs prepareWorktree resolved in one git (ref →
	// commit, "" for one that is not there), while none of them moved.
	refsAt map[string]string

	// cpMu serialises checkpoints (periodic ones while the engine runs, the
	// final one after) and guards wipOnOrigin and lastPeriodic.
	cpMu         sync.Mutex
	lastPeriodic string                 // the latest periodic checkpoint ("" = none yet)
	cpr          *worktree.Checkpointer // takes the periodic checkpoints
	evMu         sync.Mutex

	cpRound   int    // the run whose checkpoint after the engine was taken (-1: none yet)
	cpAfter   string // the checkpoint taken after the engine's last run ("" if it failed)
	cpPartial bool   // that checkpoint left out files git could not read
	// cpSeen is what that checkpoint's git read (HEAD, its tree, the job
	// branch, base's tree), for the result commit right after it.
	cpSeen worktree.Seen
	// indexTo is the result commit the worktree's index is still to be
	// brought to, unless the worktree goes to the pool (release).
	indexTo string
	// resumedFrom is the WIP checkpoint the worktree was made from ("":
	// the base).
	resumedFrom string

	// The attempt's engine runs (rounds.go): round is the current one (0:
	// the first, k: repair round k after a failed verify), spent and
	// engineTime what the finished runs spent, least the least any of them
	// did, repair the failed verify the current round repairs, last the
	// last run's result and sessionUsage what its session has spent so far.
	round        int
	runTime      time.Duration // the last run's engine time
	spent        engines.Usage
	engineTime   time.Duration
	least        *runCost
	repair       *job.VerifyResult
	last         engines.Result
	sessionUsage engines.Usage

	// noOutcome: the engine's success is only its exit status
	// (engines.Result.NoStructuredOutcome).
	noOutcome bool

	// The job's sandbox (nil: none), its egress proxy, the engine's login
	// copied into the job's home, and the variables that point the engine
	// at it.
	jail     *sandbox.Jail
	proxy    EgressProxy
	logins   *sandbox.Logins
	loginEnv []string

	// gate is what the run's pushes were checked for (shipcheck.go).
	gate shipGate
}

// Run runs j once. It never panics: a panic inside is recovered, the work is
// checkpointed and the run fails with reason crash.
func (r *Runner) Run(ctx context.Context, j *job.Job, o Options) (out Outcome) {
	start := r.now()
	ru := &run{r: r, j: j, o: o, log: r.logger().With("job", j.ID, "repo", j.Repo), cpRound: -1}
	ru.logDir = filepath.Join(r.Cfg.logsDir(), j.ID)
	ru.event(Preparing{})
	// An aq that abandons a step after a stop signal marks the job, so the
	// next aq recovers it as interrupted, not as a crash (internal/abandon).
	defer abandon.Running(r.Cfg.Home, j.ID)()
	defer func() {
		if p := recover(); p != nil {
			ru.log.Error("panic while running job", "panic", fmt.Sprint(p))
			ru.checkpoint(ctx)
			ru.flushWIP(ctx)
			ru.fail(job.ReasonCrash, fmt.Sprintf("aq panicked: %v", p))
		}
		ru.out.Insights.WallMS = r.now().Sub(start).Milliseconds()
		ru.endShipGate()
		ru.cpMu.Lock()
		ru.out.OriginCheckpoint = ru.wipOnOrigin
		ru.cpMu.Unlock()
		if ru.out.Insights.Engine == "" && ru.eng != nil {
			ru.out.Insights.Engine = ru.eng.Name()
		}
		out = ru.out
	}()
	ru.do(ctx)
	return ru.out
}

func (r *Runner) tracer() trace.Tracer {
	if r.Tracer != nil {
		return r.Tracer
	}
	return telemetry.Off().Tracer()
}

// step begins a child span of the job's span for one step of the run.
func (ru *run) step(ctx context.Context, name string, attrs ...attribute.KeyValue) (context.Context, trace.Span) {
	return telemetry.Step(ctx, ru.r.tracer(), name, attrs...)
}

// endStep ends a step's span, an error when ok is false (with the run's
// failure reason).
func (ru *run) endStep(span trace.Span, ok bool) {
	var reason job.Reason
	if !ok {
		reason = ru.out.Reason
		if reason == "" {
			reason = job.ReasonCrash
		}
	}
	telemetry.EndStep(span, reason)
}

func (r *Runner) logger() *slog.Logger {
	if r.Log != nil {
		return r.Log
	}
	return slog.New(slog.DiscardHandler)
}

func (ru *run) fail(reason job.Reason, detail string) {
	if ru.out.Reason == "" {
		ru.out.Reason, ru.out.Detail = reason, detail
	}
	ru.out.Stage = job.Failed
	if reason == job.ReasonFenced {
		ru.out.Fenced = true
	}
}

// park ends the run as parked: not a failure, the job waits until until
// for what (e.g. "claude usage limit").
func (ru *run) park(what string, until time.Time, detail string) {
	if ru.out.Reason != "" {
		return
	}
	ru.out.Stage, ru.out.Reason, ru.out.Detail = job.Failed, job.ReasonRateLimited, detail
	ru.out.Parked, ru.out.ParkedUntil = what, until.UTC()
	ru.log.Warn("job parked: the engine's account hit a limit", "parked", what, "until", until.UTC().Format(time.RFC3339), "detail", detail)
}

func (ru *run) event(e Event) {
	// Events come from the run, the engine's meter and the periodic
	// checkpoints: the caller sees them one at a time.
	ru.evMu.Lock()
	defer ru.evMu.Unlock()
	if ru.o.OnEvent != nil {
		ru.o.OnEvent(e)
	}
}

// stopped maps a cancelled context to a failure; it reports whether ctx was.
func (ru *run) stopped(ctx context.Context, during string) bool {
	reason, detail, ok := job.StopReason(ctx)
	if !ok {
		return false
	}
	if detail == "" {
		detail = during
	} else {
		detail = during + ": " + detail
	}
	ru.fail(reason, detail)
	return true
}

func (ru *run) do(ctx context.Context) {
	j := ru.j
	// 1. Pre-flight, before any worktree: engine, shipping tools, repo.
	pctx, span := ru.step(ctx, telemetry.SpanPreflight)
	ok := ru.preflight(pctx)
	ru.endStep(span, ok)
	if !ok {
		return
	}
	// 2. The per-(host, repo) lock: same-repo jobs run one after another.
	wctx, wspan := ru.step(ctx, telemetry.SpanWorktree)
	lock, err := worktree.LockRepo(wctx, ru.r.Cfg.locksDir(), j.Repo)
	if err != nil {
		if !ru.stopped(ctx, "waiting for the repo lock") {
			ru.fail(job.ReasonRepoUnavailable, "cannot take the repo lock: "+err.Error())
		}
		ru.endStep(wspan, false)
		return
	}
	defer lock.Unlock()
	telemetry.Event(wctx, "repo.locked")

	// An earlier attempt's result already on origin is reported, not made
	// again: the engine runs at most once for a delivered result.
	if sha, ok := ru.deliveredOnOrigin(wctx); ok {
		ru.endStep(wspan, true)
		sctx, sspan := ru.step(ctx, telemetry.SpanShip, attribute.Bool("aq.redelivered", true))
		ru.redeliver(sctx, sha)
		ru.endStep(sspan, !ru.out.Failed())
		return
	}

	// 3. The worktree, from the WIP checkpoint if there is one, else base.
	ok = ru.prepareWorktree(wctx)
	ru.endStep(wspan, ok)
	if !ok {
		return
	}
	// Last of all (after the checkpoint deferred below), the worktree goes
	// back to the pool for the next job on the repository.
	defer ru.release(ctx)
	// The job's sandbox, gone before the worktree is pooled.
	if !ru.openSandbox(ctx) {
		return
	}
	defer ru.closeSandbox()
	// An engine pointed at a gateway: can it be reached through the job's
	// way out? If not, fail in seconds, saying why, and hold the engine.
	if !ru.checkGateway(ctx) {
		return
	}
	ru.event(EngineStarted{Engine: ru.eng.Name()})

	// 4. The engine; then the checkpoint, whatever happened.
	//
	// Its push: a job with a verify command pushes the checkpoint as soon
	// as it is taken, alone — verify (and repair rounds) may run for long,
	// and a host lost meanwhile must not take the engine's work with it.
	// A job without one has nothing between the checkpoint and the
	// result's push but the result's commit: the two refs go in one
	// atomic push (deliver.go), after the same lease confirmation and
	// change check; on any other way out the checkpoint is pushed alone
	// before the run reports (flushWIP, deferred before the checkpoint so
	// it runs after it). Either way origin has the checkpoint before the
	// job's report, as before (#35).
	ru.pushWithResult = j.Verify == "" && j.Ship != "none"
	defer ru.flushWIP(ctx)
	defer ru.checkpoint(ctx)
	if !ru.engineRun(ctx) {
		return
	}

	// 5. The result commit on the job branch, then verify — and while it
	// fails, with rounds and budget left, a repair round: the engine again
	// with the failure in hand, its checkpoint, commit and verify
	// (rounds.go) — then ship.
	prBody, ok := ru.result(ctx)
	if !ok {
		return
	}
	sctx, sspan := ru.step(ctx, telemetry.SpanShip, attribute.String("aq.ship", j.Ship))
	ru.ship(sctx, prBody)
	ru.settleStat(ctx)
	ru.endStep(sspan, !ru.out.Failed())
}
