// Package runner runs one job through DESIGN §6, whatever its source (the
// local folder queue or the fleet): engine pre-flight, the per-(host, repo)
// lock, a linked worktree started from the job's WIP checkpoint or its base,
// the engine under its budgets and the kill ladder, a checkpoint on every exit
// path, verify, the commit on the job branch, and shipping. It owns the kill
// and the checkpoint; the engine process only runs the engine.
//
// The runner does not know queues or coordinators: the caller hands it a
// job and a context (cancelled with a job.StopError cause when a lease is
// lost), and gets back an Outcome to record.
package runner

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/aqfleet/aq/agent/job"
	"github.com/aqfleet/aq/engines"
	"github.com/aqfleet/aq/internal/process"
	"github.com/aqfleet/aq/internal/secrets"
	"github.com/aqfleet/aq/worktree"
)

// Config is what the runner needs of aq's configuration.
type Config struct {
	Home           string
	RepoBase       string
	Grace          time.Duration // kill ladder step
	PermissionMode string        // claude --permission-mode
	Prices         *engines.PriceTable
	// FetchBase: start from origin/<base> (fetched) rather than the local
	// branch. Fleet mode sets it: a factory's checkouts may be stale.
	FetchBase bool
}

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

// wipLeaseMargin is how far from its expiry a lease must be for the WIP
// checkpoint to be pushed (the push itself is a compare-and-swap besides).
const wipLeaseMargin = 5 * time.Second

// Event reports progress to the caller (live progress, the checkpoints a
// fleet job records).
type Event struct {
	Kind       string // "started", "usage", "checkpoint"
	Usage      engines.Usage
	Checkpoint string
	Engine     string
}

// Options are per-run.
type Options struct {
	Attempt int
	// Checkpoint is the WIP commit the coordinator recorded for the job, if
	// any: the run resumes from it.
	Checkpoint string
	Lease      Lease
	// OnEvent, if set, is called synchronously from the run.
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
	Fenced     bool         `json:"fenced,omitempty"`
	Worktree   string       `json:"worktree,omitempty"`
}

// Failed reports whether the outcome is a failure.
func (o Outcome) Failed() bool { return o.Reason != "" }

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

	cpOnce    sync.Once
	cpAfter   string // the checkpoint taken after the engine ("" if it failed)
	cpPartial bool   // that checkpoint left out files git could not read

	// noOutcome: the engine's success is only its exit status
	// (engines.Result.NoStructuredOutcome).
	noOutcome bool
}

// Run runs j once. It never panics: a panic inside is recovered, the work is
// checkpointed and the run fails with reason crash.
func (r *Runner) Run(ctx context.Context, j *job.Job, o Options) (out Outcome) {
	start := r.now()
	ru := &run{r: r, j: j, o: o, log: r.logger().With("job", j.ID, "repo", j.Repo)}
	ru.logDir = filepath.Join(r.Cfg.logsDir(), j.ID)
	defer func() {
		if p := recover(); p != nil {
			ru.log.Error("panic while running job", "panic", fmt.Sprint(p))
			ru.checkpoint(ctx)
			ru.fail(job.ReasonCrash, fmt.Sprintf("aq panicked: %v", p))
		}
		ru.out.Insights.WallMS = r.now().Sub(start).Milliseconds()
		if ru.out.Insights.Engine == "" && ru.eng != nil {
			ru.out.Insights.Engine = ru.eng.Name()
		}
		out = ru.out
	}()
	ru.do(ctx)
	return ru.out
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

func (ru *run) event(e Event) {
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
	if !ru.preflight(ctx) {
		return
	}
	// 2. The per-(host, repo) lock: same-repo jobs run one after another.
	lock, err := worktree.LockRepo(ctx, ru.r.Cfg.locksDir(), j.Repo)
	if err != nil {
		if !ru.stopped(ctx, "waiting for the repo lock") {
			ru.fail(job.ReasonRepoUnavailable, "cannot take the repo lock: "+err.Error())
		}
		return
	}
	defer lock.Unlock()

	// 3. The worktree, from the WIP checkpoint if there is one, else base.
	if !ru.prepareWorktree(ctx) {
		return
	}
	ru.event(Event{Kind: "started", Engine: ru.eng.Name()})

	// 4. The engine; then the checkpoint, whatever happened.
	defer ru.checkpoint(ctx)
	res, runErr := ru.runEngine(ctx)
	ru.checkpoint(ctx)
	if !ru.judgeEngine(ctx, res, runErr) {
		return
	}

	// 5. The result commit on the job branch, then verify, then ship.
	prBody, ok := ru.commitResult(ctx)
	if !ok {
		return
	}
	if !ru.verify(ctx) {
		return
	}
	ru.ship(ctx, prBody)
}

func (ru *run) preflight(ctx context.Context) bool {
	j := ru.j
	eng, info, reason, detail := ru.pickEngine(ctx)
	if reason != "" {
		ru.fail(reason, detail)
		return false
	}
	ru.eng, ru.info = eng, info
	ru.out.Insights.Engine, ru.out.Insights.EngineVersion = eng.Name(), info.Version

	if j.Ship == "pr" || j.Ship == "merge" {
		if ru.r.Shipper == nil {
			ru.fail(job.ReasonCapabilityMismatch, "ship: "+j.Ship+" needs has:gh (the GitHub CLI), which this aq cannot use")
			return false
		}
	}
	repoDir := filepath.Join(ru.r.Cfg.RepoBase, j.Repo)
	if !worktree.IsRepo(repoDir) {
		if j.RepoURL == "" {
			ru.fail(job.ReasonRepoUnavailable, fmt.Sprintf("no git repository %s under AQ_REPO_BASE (clone it there or fix repo:)", repoDir))
			return false
		}
		if err := ru.clone(ctx, repoDir); err != nil {
			if !ru.stopped(ctx, "cloning the repo") {
				ru.fail(job.ReasonRepoUnavailable, err.Error())
			}
			return false
		}
	}
	ru.repoDir = repoDir
	if j.Ship == "pr" || j.Ship == "merge" {
		if err := ru.r.Shipper.Ready(ctx, repoDir); err != nil {
			ru.fail(job.ReasonCapabilityMismatch, err.Error())
			return false
		}
	}
	return true
}

func (ru *run) clone(ctx context.Context, dir string) error {
	if err := os.MkdirAll(filepath.Dir(dir), 0o755); err != nil {
		return fmt.Errorf("cannot create %s: %v", filepath.Dir(dir), err)
	}
	if _, err := ru.r.Git.Run(ctx, filepath.Dir(dir), "clone", "--", ru.j.RepoURL, dir); err != nil {
		return fmt.Errorf("cannot clone %s: %v", ru.j.RepoURL, err)
	}
	return nil
}

// pickEngine resolves the manifest's engine (any = the first installed) and
// runs its pre-flight.
func (ru *run) pickEngine(ctx context.Context) (engines.Engine, engines.Info, job.Reason, string) {
	names := []string{ru.j.Engine}
	if ru.j.Engine == "" || ru.j.Engine == "any" {
		names = ru.r.Engines.Names()
	}
	spec := ru.spec()
	var firstErr error
	for _, name := range names {
		eng, ok := ru.r.Engines.Get(name)
		if !ok {
			continue
		}
		info, err := eng.Preflight(ctx, spec)
		if err == nil {
			return eng, info, "", ""
		}
		var ue *engines.UnavailableError
		if errors.As(err, &ue) && len(names) == 1 {
			return nil, engines.Info{}, job.ReasonEngineUnavailable, err.Error()
		}
		if firstErr == nil {
			firstErr = err
		}
	}
	if firstErr == nil {
		firstErr = fmt.Errorf("engine %q is not available on this host", ru.j.Engine)
	}
	var ue *engines.UnavailableError
	if errors.As(firstErr, &ue) {
		return nil, engines.Info{}, job.ReasonEngineUnavailable, firstErr.Error()
	}
	return nil, engines.Info{}, job.ReasonNoEngine, firstErr.Error()
}

func (ru *run) spec() engines.Spec {
	j := ru.j
	withPersona := true
	if ru.eng != nil && ru.eng.Name() == "claude" {
		withPersona = false // claude takes it through --append-system-prompt
	}
	return engines.Spec{
		JobID:          j.ID,
		Scope:          Scope(ru.r.Cfg.Home),
		Dir:            ru.wtPath,
		Prompt:         j.Prompt(withPersona),
		Persona:        j.Persona,
		Model:          j.Model,
		Script:         j.Script,
		Budget:         engines.Budget{USD: j.Budget.USD, Tokens: j.Budget.Tokens, Turns: j.Budget.Turns},
		PermissionMode: ru.r.Cfg.PermissionMode,
		LogDir:         ru.logDir,
		Attempt:        ru.o.Attempt,
		Env:            secrets.EngineEnv(ru.r.env()),
		Grace:          ru.r.Cfg.Grace,
		Redactor:       ru.r.Redactor,
		Prices:         ru.r.Cfg.Prices,
	}
}

func (r *Runner) env() []string {
	if r.Env != nil {
		return r.Env
	}
	return os.Environ()
}

// prepareWorktree makes $AQ_HOME/worktrees/<repo>/<id> on aq/job/<id>. A
// worktree left by a crashed run is checkpointed before it is replaced, so no
// file in it is lost.
func (ru *run) prepareWorktree(ctx context.Context) bool {
	j, g := ru.j, ru.r.Git
	ru.wtPath = filepath.Join(ru.r.Cfg.worktreesDir(), j.Repo, j.ID)
	wip := "refs/heads/" + job.WIPBranch(j.ID)

	remoteWIP := "refs/remotes/origin/" + job.WIPBranch(j.ID)
	if ru.hasOrigin(ctx) {
		// Another host may have checkpointed this job: fetch its WIP ref
		// beside ours (never over it).
		// ls-remote first: it tells "none" from "cannot tell", and what it
		// says is the value a later WIP push must still find there.
		sha, ok, err := worktree.RemoteRef(ctx, g, ru.repoDir, "origin", wip)
		switch {
		case err != nil:
			ru.log.Warn("cannot look for a WIP checkpoint on origin", "err", err)
		case ok:
			ru.wipOnOrigin = sha
			if err := worktree.Fetch(ctx, g, ru.repoDir, "origin", "+"+wip+":"+remoteWIP); err != nil {
				ru.log.Warn("cannot fetch the WIP checkpoint from origin", "err", err)
			}
		default:
			// None on origin: forget a stale copy from an earlier run.
			_, _ = g.Run(ctx, ru.repoDir, "update-ref", "-d", remoteWIP)
		}
		if ru.r.Cfg.FetchBase {
			if err := worktree.Fetch(ctx, g, ru.repoDir, "origin", "+refs/heads/"+j.Base+":refs/remotes/origin/"+j.Base); err != nil && ctx.Err() == nil {
				ru.log.Warn("cannot fetch base from origin; using the local copy", "base", j.Base, "err", err)
			}
		}
	}
	if ctx.Err() != nil {
		ru.stopped(ctx, "preparing the worktree")
		return false
	}
	baseRef, ok := ru.resolveBase(ctx)
	if !ok {
		return false
	}

	if _, err := os.Stat(ru.wtPath); err == nil {
		// A run of this job died here (its aq was killed): its engine may
		// still be running and writing. Stop whatever carries the job's tag
		// first, so the checkpoint below is final and nothing keeps writing
		// into a worktree that is about to be replaced.
		if n, err := process.KillScoped(ctx, j.ID, Scope(ru.r.Cfg.Home), ru.r.Cfg.Grace); err != nil && !errors.Is(err, errors.ErrUnsupported) {
			ru.log.Warn("cannot stop the processes of an earlier run of this job", "err", err)
		} else if n > 0 {
			ru.log.Warn("stopped processes left running by an earlier run of this job", "count", n)
		}
		sha, err := worktree.Checkpoint(ctx, g, ru.wtPath, wip, ru.checkpointMessage("stale worktree"))
		var partial *worktree.PartialError
		switch {
		case errors.As(err, &partial):
			ru.log.Warn("checkpointed a stale worktree, but for files git cannot read, before replacing it", "checkpoint", partial.SHA, "err", err)
		case err != nil:
			// Its files may be the only copy of work no checkpoint has:
			// never remove it unrecorded.
			if !ru.stopped(ctx, "checkpointing the worktree of an earlier run") {
				ru.fail(job.ReasonCrash, "cannot checkpoint the worktree an earlier run left at "+ru.wtPath+" (it is kept as it is): "+err.Error())
			}
			return false
		default:
			ru.log.Info("checkpointed a stale worktree before replacing it", "checkpoint", sha)
		}
		if err := worktree.Remove(ctx, g, ru.repoDir, ru.wtPath); err != nil {
			ru.fail(job.ReasonRepoUnavailable, "cannot remove the stale worktree "+ru.wtPath+": "+err.Error())
			return false
		}
	}

	start, mb := baseRef, baseRef
	if sha := ru.resumePoint(ctx, wip, remoteWIP); sha != "" {
		start = sha
		ru.out.Checkpoint = sha
		ru.log.Info("resuming from WIP checkpoint", "checkpoint", sha)
		// The base commit the result is squashed onto: where base and the
		// start point meet (base itself when starting from base).
		if m, ok, err := worktree.MergeBase(ctx, g, ru.repoDir, start, baseRef); err == nil && ok {
			mb = m
		}
	}
	ru.baseSHA, ru.start = mb, start
	if err := worktree.Add(ctx, g, ru.repoDir, ru.wtPath, job.JobBranch(j.ID), start); err != nil {
		if !ru.stopped(ctx, "creating the worktree") {
			ru.fail(job.ReasonRepoUnavailable, "cannot create the worktree: "+err.Error())
		}
		_ = worktree.Remove(context.WithoutCancel(ctx), g, ru.repoDir, ru.wtPath)
		return false
	}
	ru.out.Worktree = ru.wtPath
	return true
}

// resumePoint picks the checkpoint to start from: the one the coordinator
// recorded when it is known here; else whichever of the local and origin WIP
// refs contains the other; else origin's (the latest owner's). The local ref is
// never moved here, so a diverged local checkpoint stays reachable (the next
// checkpoint takes it as a second parent).
func (ru *run) resumePoint(ctx context.Context, localRef, remoteRef string) string {
	g := ru.r.Git
	if h := ru.o.Checkpoint; h != "" {
		if sha, ok, _ := worktree.ResolveRef(ctx, g, ru.repoDir, h+"^{commit}"); ok {
			return sha
		}
		ru.log.Warn("the recorded checkpoint is not in this repository; using the WIP refs", "checkpoint", h)
	}
	local, lok, _ := worktree.ResolveRef(ctx, g, ru.repoDir, localRef)
	var remote string
	var rok bool
	if ru.hasOrigin(ctx) {
		remote, rok, _ = worktree.ResolveRef(ctx, g, ru.repoDir, remoteRef)
	}
	switch {
	case !lok && !rok:
		return ""
	case !rok || local == remote:
		return local
	case !lok:
		return remote
	}
	if anc, err := worktree.IsAncestor(ctx, g, ru.repoDir, remote, local); err == nil && anc {
		return local
	}
	return remote
}

// resolveBase finds the commit of the job's base branch.
func (ru *run) resolveBase(ctx context.Context) (string, bool) {
	g, base := ru.r.Git, ru.j.Base
	cands := []string{"refs/heads/" + base}
	if ru.hasOrigin(ctx) {
		cands = append(cands, "refs/remotes/origin/"+base)
		if ru.r.Cfg.FetchBase {
			cands[0], cands[1] = cands[1], cands[0]
		}
	}
	for _, ref := range cands {
		if sha, ok, _ := worktree.ResolveRef(ctx, g, ru.repoDir, ref); ok {
			return sha, true
		}
	}
	ru.fail(job.ReasonRepoUnavailable, fmt.Sprintf("base branch %q does not exist in %s (create it or fix base:)", base, ru.repoDir))
	return "", false
}

// hasOrigin reports whether the repository has an origin remote; asked once
// per run.
func (ru *run) hasOrigin(ctx context.Context) bool {
	ru.originOnce.Do(func() { ru.origin = worktree.HasRemote(ctx, ru.r.Git, ru.repoDir, "origin") })
	return ru.origin
}

func (ru *run) checkpointMessage(why string) string {
	return fmt.Sprintf("aq checkpoint: %s (%s)\n\naq-job: %s\naq-attempt: %d", ru.j.ID, why, ru.j.ID, ru.o.Attempt)
}

// checkpoint commits everything in the worktree to aq/wip/<id> — once, after
// the engine is dead — and pushes it to origin unless the job is fenced. It
// runs on a context that cannot be cancelled, with its own time limit.
func (ru *run) checkpoint(parent context.Context) {
	if ru.wtPath == "" {
		return
	}
	ru.cpOnce.Do(func() {
		ctx, cancel := context.WithTimeout(context.WithoutCancel(parent), 2*time.Minute)
		defer cancel()
		wip := "refs/heads/" + job.WIPBranch(ru.j.ID)
		sha, err := worktree.Checkpoint(ctx, ru.r.Git, ru.wtPath, wip, ru.checkpointMessage("after the engine"))
		var partial *worktree.PartialError
		if errors.As(err, &partial) {
			ru.log.Warn("checkpoint is partial: some paths could not be recorded", "err", err)
			sha, err, ru.cpPartial = partial.SHA, nil, true
		}
		if err != nil || sha == "" {
			ru.log.Error("checkpoint failed: the worktree is kept as it is", "worktree", ru.wtPath, "err", err)
			return
		}
		ru.out.Checkpoint, ru.cpAfter = sha, sha
		ru.log.Info("checkpointed", "checkpoint", sha, "ref", job.WIPBranch(ru.j.ID))
		ru.event(Event{Kind: "checkpoint", Checkpoint: sha})
		if ru.fencedNow(parent) || !ru.hasOrigin(ctx) {
			return
		}
		// A fleet job pushes its WIP only while it still holds the lease:
		// after a fence (or a lease it cannot confirm) another factory may be
		// working from origin's checkpoint, which must not move under it.
		if ru.o.Lease != nil && !ru.o.Lease.Held(wipLeaseMargin) {
			ru.log.Warn("not pushing the WIP checkpoint: this factory may no longer hold the job's lease; it is kept locally")
			return
		}
		if err := worktree.PushWithLease(ctx, ru.r.Git, ru.repoDir, "origin", wip, wip, ru.wipOnOrigin); err != nil {
			ru.log.Warn("cannot push the WIP checkpoint to origin; it is kept locally", "err", err)
			return
		}
		ru.wipOnOrigin = sha
		ru.out.WIPPushed = true
	})
}

// fencedNow reports whether the job's context says another factory owns it.
func (ru *run) fencedNow(ctx context.Context) bool {
	r, _, ok := job.StopReason(ctx)
	return ru.out.Fenced || (ok && r == job.ReasonFenced)
}

// wall is the job's wall budget, which bounds the engine and verify each.
func (ru *run) wall() time.Duration {
	if w := ru.j.Budget.Wall.D(); w > 0 {
		return w
	}
	return job.DefaultWall
}

// runEngine runs the engine under the wall, USD and token budgets.
func (ru *run) runEngine(ctx context.Context) (engines.Result, error) {
	j, wall := ru.j, ru.wall()
	runCtx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	runCtx, cancelT := context.WithTimeoutCause(runCtx, wall, job.Stop(job.ReasonTimeout, "wall budget "+wall.String()+" spent"))
	defer cancelT()

	spec := ru.spec()
	var (
		mu   sync.Mutex
		last engines.Usage
	)
	spec.Meter = engines.MeterFunc(func(u engines.Usage) {
		mu.Lock()
		last = u
		mu.Unlock()
		ru.event(Event{Kind: "usage", Usage: u, Engine: ru.eng.Name()})
		if j.Budget.USD > 0 && u.CostUSD > j.Budget.USD {
			cancel(job.Stop(job.ReasonBudgetExceeded, fmt.Sprintf("cost $%.4f over budget $%.2f", u.CostUSD, j.Budget.USD)))
		}
		if j.Budget.Tokens > 0 && u.Tokens() > j.Budget.Tokens {
			cancel(job.Stop(job.ReasonBudgetExceeded, fmt.Sprintf("%d tokens over budget %d", u.Tokens(), j.Budget.Tokens)))
		}
	})
	ru.log.Info("engine starting", "engine", ru.eng.Name(), "version", ru.info.Version, "attempt", ru.o.Attempt, "worktree", ru.wtPath)
	res, err := ru.eng.Run(runCtx, spec)
	mu.Lock()
	if res.Usage == (engines.Usage{}) {
		res.Usage = last
	}
	mu.Unlock()
	// The run's own stop cause (timeout, budget) wins over the parent's.
	if runCtx.Err() != nil && res.Outcome != engines.Succeeded {
		if reason, detail, ok := job.StopReason(runCtx); ok {
			ru.fail(reason, detail)
		}
	}
	return res, err
}

// judgeEngine records the engine's result and decides whether to go on.
func (ru *run) judgeEngine(ctx context.Context, res engines.Result, err error) bool {
	in := &ru.out.Insights
	in.Engine = ru.eng.Name()
	if res.Version != "" {
		in.EngineVersion = res.Version
	}
	in.Model = firstNonEmpty(res.Model, ru.j.Model)
	in.SessionID, in.Subtype = res.SessionID, res.Subtype
	in.TokensIn, in.TokensOut, in.TokensCached = res.Usage.TokensIn, res.Usage.TokensOut, res.Usage.TokensCached
	in.CostUSD, in.CostEstimated, in.Turns = res.Usage.CostUSD, res.Usage.Estimated, res.Usage.Turns
	in.ExitCode = res.ExitCode

	if ru.out.Reason != "" { // stopped by its own budget
		return false
	}
	if err != nil {
		if errors.Is(err, engines.ErrNotInstalled) {
			ru.fail(job.ReasonNoEngine, err.Error())
		} else if !ru.stopped(ctx, "engine") {
			ru.fail(job.ReasonCrash, "engine did not run: "+err.Error())
		}
		return false
	}
	if ru.stopped(ctx, "engine running") {
		return false
	}
	switch res.Outcome {
	case engines.Succeeded:
		ru.log.Info("engine finished", "engine", in.Engine, "turns", in.Turns, "cost_usd", in.CostUSD)
		ru.noOutcome = res.NoStructuredOutcome
		return true
	case engines.Unavailable:
		ru.fail(job.ReasonEngineUnavailable, firstNonEmpty(res.Detail, "the engine is unavailable"))
	case engines.Stopped:
		if res.BudgetExceeded { // the engine stopped itself at the budget aq gave it
			ru.fail(job.ReasonBudgetExceeded, firstNonEmpty(res.Detail, "the engine stopped at its budget"))
			break
		}
		ru.fail(job.ReasonCrash, firstNonEmpty(res.Detail, "the engine was stopped"))
	default:
		ru.fail(job.ReasonEngineFailed, firstNonEmpty(res.Detail, "the engine did not finish the task"))
	}
	return false
}

// prFile is the engine's PR description; it never reaches a commit.
const prFile = ".aq_pr.md"

// commitResult commits the engine's work onto the job branch as one commit on
// base, and records the size of the change.
func (ru *run) commitResult(ctx context.Context) (prBody string, ok bool) {
	j, g := ru.j, ru.r.Git
	hasPR := false
	if b, err := os.ReadFile(filepath.Join(ru.wtPath, prFile)); err == nil {
		prBody, hasPR = string(b), true
		if err := os.MkdirAll(ru.logDir, 0o700); err == nil {
			_ = os.WriteFile(filepath.Join(ru.logDir, "pr.md"), b, 0o600)
		}
		if err := os.Remove(filepath.Join(ru.wtPath, prFile)); err != nil {
			ru.fail(job.ReasonCrash, "cannot remove "+prFile+": "+err.Error())
			return "", false
		}
	}
	msg := fmt.Sprintf("%s\n\naq-job: %s\naq-engine: %s\naq-attempt: %d", firstNonEmpty(j.Title, "aq job "+j.ID), j.ID, ru.eng.Name(), ru.o.Attempt)
	sha, changed, done, err := ru.commitFromCheckpoint(ctx, msg, hasPR)
	if !done && err == nil {
		ru.log.Debug("committing the result by squashing the worktree")
		sha, changed, err = worktree.SquashOnto(ctx, g, ru.wtPath, ru.baseSHA, msg)
	}
	if err != nil {
		if !ru.stopped(ctx, "committing the result") {
			ru.fail(job.ReasonCrash, "cannot commit the result: "+err.Error())
		}
		return "", false
	}
	if !changed {
		if ru.noOutcome {
			// Exit 0 is all such an engine says; with nothing changed there
			// is no sign it did the task.
			ru.fail(job.ReasonEngineFailed, "the engine exited 0 without a machine-readable outcome and changed no file")
			return "", false
		}
		ru.log.Info("the engine made no changes")
		ru.out.Detail = "the engine finished without changing any file; nothing to ship"
		return prBody, true
	}
	ru.out.Commit, ru.out.Branch = sha, job.JobBranch(j.ID)
	files, added, deleted, err := worktree.DiffStat(ctx, g, ru.wtPath, ru.baseSHA, sha)
	if err == nil {
		ru.out.Insights.FilesChanged, ru.out.Insights.LinesAdded, ru.out.Insights.LinesDeleted = files, added, deleted
	}
	return prBody, true
}

// commitFromCheckpoint makes the result commit out of the checkpoint just
// taken, rather than staging the whole worktree a second time: the
// checkpoint's tree is everything in the worktree, so the result is that tree
// (without .aq_pr.md when the engine wrote one) as one commit on base, on the
// job branch, and the worktree's index is brought to it. It is SquashOnto's
// result at a fraction of the cost (no second `git add --all`, no `git commit`
// refreshing the index again).
//
// done is false, with no error, when the checkpoint cannot stand for the
// worktree, or the repository asks for more than commit-tree gives: no
// checkpoint, a partial one, HEAD not on the job branch or moved off base,
// or signed commits (commit.gpgSign). The caller then squashes the worktree.
func (ru *run) commitFromCheckpoint(ctx context.Context, msg string, dropPR bool) (sha string, changed, done bool, err error) {
	cp := ru.cpAfter // not out.Checkpoint: that may be the checkpoint the run started from
	if cp == "" || ru.cpPartial {
		return "", false, false, nil
	}
	wg := ru.r.Git
	branch := "refs/heads/" + job.JobBranch(ru.j.ID)
	// One git for HEAD, the checkpoint's tree, base's tree, the job branch
	// and the branch HEAD is on (cp and baseSHA are hashes aq resolved: no
	// option can hide in them).
	out, err := wg.Run(ctx, ru.wtPath, "rev-parse", "HEAD", cp+"^{tree}", ru.baseSHA+"^{tree}", branch, "--symbolic-full-name", "HEAD", "--")
	lines := strings.Split(out, "\n")
	if err != nil || len(lines) != 6 {
		return "", false, false, nil // no HEAD, or no job branch: squash what is there
	}
	head, tree, baseTree, old, onBranch := lines[0], lines[1], lines[2], lines[3], lines[4] == branch
	if head != ru.start {
		// The engine committed, or moved HEAD (even to another branch): the
		// worktree's content must still sit on base, or committing it on
		// base would revert base's newer commits.
		if anc, err := worktree.IsAncestor(ctx, wg, ru.wtPath, ru.baseSHA, head); err != nil || !anc {
			return "", false, false, nil
		}
	}
	cfg, err := wg.Run(ctx, ru.wtPath, "config", "--get-regexp", `^(user\.(name|email)|commit\.gpgsign)$`)
	if err != nil && !isExit(err, 1) {
		return "", false, false, nil
	}
	ident, sign := identityArgs(cfg)
	if sign {
		return "", false, false, nil // commit-tree would not sign it; git commit does
	}
	if dropPR {
		if tree, err = ru.treeWithout(ctx, tree, prFile); err != nil {
			return "", false, false, nil
		}
	}
	result := ru.baseSHA
	if tree != baseTree {
		args := append(ident, "commit-tree", "--no-gpg-sign", "-m", msg, "-p", ru.baseSHA, tree)
		if result, err = wg.Run(ctx, ru.wtPath, args...); err != nil {
			return "", false, true, err
		}
	}
	if result != old {
		// Compare-and-swap: nobody moved the branch meanwhile.
		if _, err := wg.Run(ctx, ru.wtPath, "update-ref", "-m", "aq: result of job "+ru.j.ID, branch, result, old); err != nil {
			return "", false, true, err
		}
	}
	if onBranch && result != head {
		// The index follows the branch; entries that did not change keep
		// their stat data, so the worktree reads clean at once. (An engine
		// that switched HEAD to a branch of its own keeps it.)
		if _, err := wg.Run(ctx, ru.wtPath, "read-tree", "--reset", result); err != nil {
			ru.log.Warn("the job branch holds the result, but the worktree's index could not be updated to it", "err", err)
		}
	}
	return result, tree != baseTree, true, nil
}

// treeWithout is tree less the top-level entry name, built in a throw-away
// index (the worktree's own is not touched).
func (ru *run) treeWithout(ctx context.Context, tree, name string) (string, error) {
	dir, err := os.MkdirTemp("", "aq-tree-")
	if err != nil {
		return "", err
	}
	defer os.RemoveAll(dir)
	ig := ru.r.Git
	ig.Env = append(append([]string(nil), ig.Env...), "GIT_INDEX_FILE="+filepath.Join(dir, "index"))
	if _, err := ig.Run(ctx, ru.wtPath, "read-tree", tree); err != nil {
		return "", err
	}
	if _, err := ig.Run(ctx, ru.wtPath, "update-index", "--force-remove", "--", name); err != nil {
		return "", err
	}
	return ig.Run(ctx, ru.wtPath, "write-tree")
}

// identityArgs reads `git config --get-regexp` output for user.name,
// user.email and commit.gpgsign: the -c options that give aq's commits an
// identity where the repository has none (as worktree's commits do), and
// whether commits are to be signed.
func identityArgs(cfg string) (args []string, sign bool) {
	var name, email bool
	for _, line := range strings.Split(cfg, "\n") {
		k, v, _ := strings.Cut(line, " ")
		v = strings.TrimSpace(v)
		switch strings.ToLower(k) {
		case "user.name":
			name = name || v != ""
		case "user.email":
			email = email || v != ""
		case "commit.gpgsign":
			sign = v == "true" || v == "yes" || v == "on" || v == "1"
		}
	}
	if !name {
		args = append(args, "-c", "user.name="+worktree.DefaultUserName)
	}
	if !email {
		args = append(args, "-c", "user.email="+worktree.DefaultUserEmail)
	}
	return args, sign
}

// isExit reports whether err is a git run that exited with code.
func isExit(err error, code int) bool {
	var ge *worktree.GitError
	return errors.As(err, &ge) && ge.ExitCode == code
}

// verify runs the manifest's verify: command in the worktree.
func (ru *run) verify(ctx context.Context) bool {
	cmd := strings.TrimSpace(ru.j.Verify)
	if cmd == "" {
		return true
	}
	f, err := os.OpenFile(filepath.Join(ru.logDir, "verify.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		ru.fail(job.ReasonCrash, "cannot open the verify log: "+err.Error())
		return false
	}
	defer f.Close()
	fmt.Fprintf(f, "=== aq job %s attempt %d: verify %q at %s ===\n", ru.j.ID, ru.o.Attempt, cmd, ru.r.now().UTC().Format(time.RFC3339))
	w := secrets.NewWriter(f, ru.r.Redactor)
	defer w.Flush()
	vctx, cancel := context.WithTimeoutCause(ctx, ru.wall(), job.Stop(job.ReasonTimeout, "verify ran past the wall budget"))
	defer cancel()
	res, err := process.Run(vctx, process.Spec{
		Path: "/bin/sh", Args: []string{"-c", cmd}, Dir: ru.wtPath,
		Env: secrets.EngineEnv(ru.r.env()), Stdout: w, Stderr: w, Tag: ru.j.ID, Scope: Scope(ru.r.Cfg.Home), Grace: ru.r.Cfg.Grace,
	})
	if err != nil {
		ru.fail(job.ReasonVerifyFailed, "verify could not start: "+err.Error())
		return false
	}
	if res.Stopped {
		if !ru.stopped(vctx, "verify") {
			ru.fail(job.ReasonVerifyFailed, "verify was stopped")
		}
		return false
	}
	if res.ExitCode != 0 {
		ru.fail(job.ReasonVerifyFailed, fmt.Sprintf("verify %q exited %d (see aq job logs %s)", cmd, res.ExitCode, ru.j.ID))
		return false
	}
	ru.log.Info("verify passed", "verify", cmd)
	return true
}

// ship delivers the result per ship: and sets the success stage. A fenced job
// never ships.
func (ru *run) ship(ctx context.Context, prBody string) {
	j := ru.j
	if ru.out.Commit == "" { // nothing changed: nothing to ship
		ru.out.Stage = job.Shipped
		return
	}
	if j.Ship == "none" {
		ru.out.Stage = job.Testing
		return
	}
	if !ru.confirmLease(ctx, "before pushing") {
		return
	}
	if !ru.hasOrigin(ctx) {
		if j.Ship == "branch" {
			ru.log.Info("no origin: the job branch stays local", "branch", ru.out.Branch)
			ru.out.Stage = job.Shipped
			return
		}
		ru.fail(job.ReasonShipFailed, "ship: "+j.Ship+" needs an origin remote to push "+ru.out.Branch+" to")
		return
	}
	ref := "refs/heads/" + ru.out.Branch
	if err := worktree.Push(ctx, ru.r.Git, ru.repoDir, "origin", "+"+ref+":"+ref); err != nil {
		if !ru.stopped(ctx, "pushing") {
			ru.fail(job.ReasonShipFailed, "cannot push "+ru.out.Branch+" to origin: "+err.Error())
		}
		return
	}
	ru.out.Pushed = true
	if j.Ship == "branch" {
		ru.out.Stage = job.Shipped
		return
	}
	if !ru.confirmLease(ctx, "before opening the pull request") {
		return
	}
	url, err := ru.r.Shipper.Ship(ctx, ShipRequest{
		RepoDir: ru.repoDir, Branch: ru.out.Branch, Base: j.Base,
		Title: firstNonEmpty(j.Title, "aq job "+j.ID), Body: ru.prBody(prBody), Merge: j.Ship == "merge",
	})
	// A PR that opened but whose auto-merge could not be enabled comes back
	// with its URL and an error: record the URL either way.
	ru.out.PRURL = url
	if err != nil {
		if !ru.stopped(ctx, "opening the pull request") {
			ru.fail(job.ReasonShipFailed, err.Error())
		}
		return
	}
	ru.out.Stage = job.Review
}

// confirmLease renews a fleet lease before an irreversible step.
func (ru *run) confirmLease(ctx context.Context, when string) bool {
	if ru.stopped(ctx, when) {
		return false
	}
	if ru.o.Lease == nil {
		return true
	}
	if err := ru.o.Lease.Confirm(ctx); err != nil {
		var se *job.StopError
		if errors.As(err, &se) {
			ru.fail(se.Reason, when+": "+se.Detail)
		} else {
			ru.fail(job.ReasonLeaseLost, when+": "+err.Error())
		}
		return false
	}
	return true
}

// prBody is the engine's .aq_pr.md, or one made from the manifest.
func (ru *run) prBody(fromEngine string) string {
	if strings.TrimSpace(fromEngine) != "" {
		return fromEngine
	}
	j, in := ru.j, ru.out.Insights
	var b strings.Builder
	fmt.Fprintf(&b, "%s\n\n", firstNonEmpty(j.Title, "aq job "+j.ID))
	if a := strings.TrimSpace(j.Acceptance); a != "" {
		fmt.Fprintf(&b, "## Acceptance\n\n%s\n\n", a)
	}
	fmt.Fprintf(&b, "## Run\n\n- job: `%s` (attempt %d)\n- engine: %s %s\n", j.ID, ru.o.Attempt, in.Engine, in.EngineVersion)
	if in.Model != "" {
		fmt.Fprintf(&b, "- model: %s\n", in.Model)
	}
	fmt.Fprintf(&b, "- tokens in/out: %d/%d, cost: $%.4f, turns: %d\n", in.TokensIn, in.TokensOut, in.CostUSD, in.Turns)
	fmt.Fprintf(&b, "- change: %d files, +%d/-%d\n", in.FilesChanged, in.LinesAdded, in.LinesDeleted)
	return b.String()
}

func firstNonEmpty(s ...string) string {
	for _, v := range s {
		if strings.TrimSpace(v) != "" {
			return v
		}
	}
	return ""
}
