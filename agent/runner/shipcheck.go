package runner

// What ships is checked (docs/sandbox.md, "What ships is checked"): every
// push to origin — a periodic checkpoint, the checkpoint after the engine,
// the job branch — is first checked by internal/shipcheck against what
// origin already has. A refusal stops every later push of the run (its
// checkpoints stay on this host), keeps the worktree where it is for an
// operator, and ends the run with secret_in_change or protected_change.

import (
	"context"
	"fmt"
	"io"
	"maps"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/aqfleet/aq/engines"
	"github.com/aqfleet/aq/internal/mdmeta"
	"github.com/aqfleet/aq/internal/secrets"
	"github.com/aqfleet/aq/internal/shipcheck"
	"github.com/aqfleet/aq/job"
	"github.com/aqfleet/aq/worktree"
)

// GHToken reads the token gh uses for a repository (`gh auth token`); ""
// when gh is missing or logged out. agent/ship.GH has it.
type GHToken interface {
	Token(ctx context.Context, repoDir string) string
}

// shipGate is a run's record of what its pushes were checked for.
type shipGate struct {
	mu      sync.Mutex
	once    sync.Once
	held    []shipcheck.Secret
	refused job.Reason // "" while nothing was refused
	line    string
	allowed []string // protected paths may_change allowed, every push's
	// passed are the tips that passed a check.
	passed map[string]bool
	// made are the commits this run made (its checkpoints after the
	// engine, its result), each with its parents: a push of those alone,
	// on commits origin has, needs no walk (shipcheck.Range.Parents).
	made map[string][]string
	// statFor is the result commit whose diffstat waits for the push's
	// change check, which counts it in its own git (settleStat: #35).
	statFor string
}

// madeCommit notes a commit this run made and its parents.
func (ru *run) madeCommit(sha string, parents []string) {
	if sha == "" || len(parents) == 0 {
		return
	}
	g := &ru.gate
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.made == nil {
		g.made = map[string][]string{}
	}
	g.made[sha] = parents
}

// PushCheck checks a push outside a run: an orphan's checkpoint, pushed
// when a daemon recovers the job (agent/daemon). A run checks its own
// pushes with the runner's parts.
type PushCheck struct {
	Git       worktree.Git
	Redactor  *secrets.Redactor
	Env       []string // the environment engines inherit; nil: aq's
	Shipper   Shipper  // a GHToken when it is one
	Protected []string // AQ_PROTECTED_PATHS; nil: the default
}

// Check checks what pushing tip from repoDir to origin would add to what
// origin has (and the commits in known), for a job of engine whose
// manifest allows mayChange.
func (p PushCheck) Check(ctx context.Context, repoDir, engine string, mayChange []string, tip string, known ...string) (*shipcheck.Result, error) {
	have, err := shipcheck.OriginHas(ctx, p.Git, repoDir, "origin")
	if err != nil {
		return nil, err
	}
	for _, k := range known {
		if k != "" {
			have = append(have, k)
		}
	}
	return shipcheck.Check(ctx, p.Git, repoDir, tip, have, shipcheck.Policy{
		Secrets: p.Held(ctx, engine, repoDir), Protected: p.Protected, MayChange: mayChange,
	})
}

// maxLogin bounds a login file read for its credentials.
const maxLogin = 64 << 10

// Held are the secrets this factory holds that a change must not carry:
// what the redactor masks (the factory token, the connection string,
// every secret-named variable of aq's environment), the secret-named
// variables of the engine's environment (its API key), the credentials in
// engine's login files, and gh's token.
func (p PushCheck) Held(ctx context.Context, engine, repoDir string) []shipcheck.Secret {
	var held []shipcheck.Secret
	add := func(source string, vs ...string) {
		for _, v := range vs {
			held = append(held, shipcheck.Secret{Value: v, Source: source})
		}
	}
	env := p.Env
	if env == nil {
		env = os.Environ()
	}
	add("a secret aq masks", p.Redactor.Values()...)
	add("a secret of the engine's environment", secrets.NewRedactor(env).Values()...)
	for _, f := range engines.LoginOf(engine, env).Files {
		if data, err := readLogin(f.Src); err == nil {
			add("the "+engine+" login", shipcheck.LoginValues(data)...)
		}
	}
	if t, ok := p.Shipper.(GHToken); ok {
		if tok := t.Token(ctx, repoDir); tok != "" {
			add("the GH token", tok)
		}
	}
	return held
}

// pushCheck is the runner's PushCheck.
func (r *Runner) pushCheck() PushCheck {
	return PushCheck{Git: r.Git, Redactor: r.Redactor, Env: r.Env, Shipper: r.Shipper, Protected: r.Cfg.ProtectedPaths}
}

// heldSecrets are PushCheck.Held, read once per run.
func (ru *run) heldSecrets(ctx context.Context) []shipcheck.Secret {
	ru.gate.once.Do(func() {
		name := ru.j.Engine
		if ru.eng != nil {
			name = ru.eng.Name()
		}
		ru.gate.held = ru.r.pushCheck().Held(ctx, name, ru.repoDir)
	})
	return ru.gate.held
}

// readLogin reads a login file of the host's, a regular file of at most
// maxLogin bytes (never a FIFO: opened without blocking).
func readLogin(path string) ([]byte, error) {
	f, kind, err := mdmeta.OpenRegular(path)
	if err != nil {
		return nil, err
	}
	if kind != "" {
		return nil, fmt.Errorf("%s is %s", path, kind)
	}
	defer f.Close()
	return io.ReadAll(io.LimitReader(f, maxLogin))
}

// pushAllowed checks what pushing tip to origin would add to what origin
// has (and the commits in known, which origin has as far as the run
// knows) and reports whether the push may go ahead. A refusal is
// recorded once and refuses every later push of the run; a check that
// cannot run (origin unreadable) refuses this push only — the push would
// have failed too — and the next one tries again. Call it with cpMu held
// or from the run's own goroutine.
func (ru *run) pushAllowed(ctx context.Context, what, tip string, known ...string) bool {
	return ru.pushAllowedTips(ctx, what, []string{tip}, known...)
}

// pushAllowedTips is pushAllowed for a push of several tips at once (the
// atomic push of the WIP checkpoint with the result): what any of them
// adds, checked in one pass.
func (ru *run) pushAllowedTips(ctx context.Context, what string, tips []string, known ...string) bool {
	g := &ru.gate
	g.mu.Lock()
	refused, passed := g.refused, true
	for _, t := range tips {
		passed = passed && g.passed[t]
	}
	g.mu.Unlock()
	if refused != "" {
		ru.log.Info("not pushing "+what+": an earlier push of this run was refused", "reason", refused)
		return false
	}
	if passed {
		return true
	}
	// What origin has: what the run knows it has (the base, origin's job
	// and WIP refs as seen or pushed) and origin's remote-tracking
	// branches — no call to origin for each push. What is not known there
	// is looked at too: more, never less, than the push adds.
	have := []string{ru.baseSHA}
	for _, k := range known {
		if k != "" {
			have = append(have, k)
		}
	}
	rg := shipcheck.Range{Tip: tips[0], More: tips[1:], Have: have, Remote: "origin"}
	g.mu.Lock()
	rg.Parents, rg.Numstat = maps.Clone(g.made), g.statFor
	g.mu.Unlock()
	res, err := shipcheck.CheckRange(ctx, ru.r.Git, ru.repoDir, rg, shipcheck.Policy{
		Secrets: ru.heldSecrets(ctx), Protected: ru.r.Cfg.ProtectedPaths, MayChange: ru.j.MayChange,
	})
	if err != nil {
		ru.log.Warn("not pushing "+what+": its change cannot be checked", "err", err)
		return false
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if n := res.Numstat; n != nil && rg.Numstat != "" && g.statFor == rg.Numstat {
		ru.out.Insights.FilesChanged, ru.out.Insights.LinesAdded, ru.out.Insights.LinesDeleted = n.Files, n.Added, n.Deleted
		g.statFor = ""
	}
	for _, p := range res.Allowed {
		if !slices.Contains(g.allowed, p) {
			g.allowed = append(g.allowed, p)
		}
	}
	if !res.Refused() || g.refused != "" {
		if g.refused == "" {
			if g.passed == nil {
				g.passed = map[string]bool{}
			}
			for _, t := range tips {
				g.passed[t] = true
			}
		}
		return g.refused == ""
	}
	id, wip := ru.j.ID, job.WIPBranch(ru.j.ID)
	again := "delete the local branch " + wip + " (or fix it there), then: aq job requeue " + id
	if len(res.Secrets) > 0 {
		g.refused = job.ReasonSecretInChange
		g.line = "the change holds a secret this factory holds: " + res.SecretLine() +
			"; nothing of it was pushed (its checkpoint and the worktree " + ru.wtPath + " stay on this host): remove it, " + again
	} else {
		g.refused = job.ReasonProtectedChange
		g.line = "the change touches protected paths its manifest's may_change does not name: " + res.ProtectedLine() +
			" (AQ_PROTECTED_PATHS; pushing the branch alone would run on: push workflows); nothing of it was pushed, the worktree " + ru.wtPath +
			" stays on this host: to allow them, add may_change: [" + strings.Join(res.Protected, ", ") + "] to the manifest and submit it again; else " + again
	}
	ru.log.Error("not pushing "+what+": "+g.line, "reason", g.refused, "commit", strings.Join(tips, " "))
	return false
}

// settleStat records the result's diffstat when the push's change check did
// not count it (commitResult left it to the check: the result was not
// pushed, or not checked again).
func (ru *run) settleStat(ctx context.Context) {
	g := &ru.gate
	g.mu.Lock()
	sha := g.statFor
	g.statFor = ""
	g.mu.Unlock()
	if sha == "" || sha != ru.out.Commit {
		return
	}
	// As when the result was committed: a stop since does not cost the
	// report its size.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
	defer cancel()
	ru.countStat(ctx, sha)
}

// countStat records the result sha's diffstat against base, as git diff
// counts it (the insights' files, lines added and deleted).
func (ru *run) countStat(ctx context.Context, sha string) {
	if files, added, deleted, err := worktree.DiffStat(ctx, ru.r.Git, ru.wtPath, ru.baseSHA, sha); err == nil {
		ru.out.Insights.FilesChanged, ru.out.Insights.LinesAdded, ru.out.Insights.LinesDeleted = files, added, deleted
	}
}

// shipRefused is the refusal of the run's pushes ("" for none) and its line.
func (ru *run) shipRefused() (job.Reason, string) {
	ru.gate.mu.Lock()
	defer ru.gate.mu.Unlock()
	return ru.gate.refused, ru.gate.line
}

// protectedAllowed are the protected paths may_change let the change touch.
func (ru *run) protectedAllowed() []string {
	ru.gate.mu.Lock()
	defer ru.gate.mu.Unlock()
	return slices.Clone(ru.gate.allowed)
}

// endShipGate ends the run with the refusal, if a push was refused: it
// outranks every failure but a fence (another factory owns the job then).
func (ru *run) endShipGate() {
	reason, line := ru.shipRefused()
	if allowed := ru.protectedAllowed(); len(allowed) > 0 {
		ru.out.Insights.ProtectedChanged = allowed
	}
	if reason == "" || ru.out.Fenced {
		return
	}
	ru.out.Stage, ru.out.Reason, ru.out.Detail = job.Failed, reason, line
}

// recheckDelivered checks a result an earlier attempt put on origin before
// its pull request is opened (or merged): what the job branch adds to the
// rest of origin, against this manifest's may_change — the attempt that
// pushed it may have been a factory that did not check, or a manifest
// since changed. A refusal fails the run (no PR is opened); the protected
// paths it allows are recorded, so ship: merge does not auto-merge them.
func (ru *run) recheckDelivered(ctx context.Context, sha string) bool {
	have, err := shipcheck.OriginHas(ctx, ru.r.Git, ru.repoDir, "origin")
	if err == nil {
		have = slices.DeleteFunc(have, func(h string) bool { return h == sha })
		var res *shipcheck.Result
		res, err = shipcheck.Check(ctx, ru.r.Git, ru.repoDir, sha, have, shipcheck.Policy{
			Secrets: ru.heldSecrets(ctx), Protected: ru.r.Cfg.ProtectedPaths, MayChange: ru.j.MayChange,
		})
		if err == nil {
			ru.gate.mu.Lock()
			ru.gate.allowed = res.Allowed
			ru.gate.mu.Unlock()
			switch {
			case len(res.Secrets) > 0:
				ru.fail(job.ReasonSecretInChange, "the job's branch on origin (an earlier attempt's) holds a secret this factory holds: "+res.SecretLine()+
					"; no pull request was opened: remove the branch "+ru.out.Branch+" from origin and rotate the secret")
				return false
			case len(res.Protected) > 0:
				ru.fail(job.ReasonProtectedChange, "the job's branch on origin (an earlier attempt's) touches protected paths its manifest's may_change does not name: "+
					res.ProtectedLine()+"; no pull request was opened: to allow them, add may_change: ["+strings.Join(res.Protected, ", ")+"] to the manifest and submit it again")
				return false
			}
			return true
		}
	}
	if !ru.stopped(ctx, "checking the delivered result") {
		ru.fail(job.ReasonShipFailed, "cannot check the job's branch on origin before opening its pull request: "+err.Error())
	}
	return false
}
