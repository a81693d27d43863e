package runner

// Results: the result commit on the job branch (one commit on base, without
// the PR description file) and verify.

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"go.opentelemetry.io/otel/attribute"

	"github.com/aqfleet/aq/internal/boundlog"
	"github.com/aqfleet/aq/internal/process"
	"github.com/aqfleet/aq/internal/safefs"
	"github.com/aqfleet/aq/internal/secrets"
	"github.com/aqfleet/aq/internal/telemetry"
	"github.com/aqfleet/aq/job"
	"github.com/aqfleet/aq/worktree"
)

// prFile is the engine's PR description; it never reaches a commit.
const prFile = ".aq_pr.md"

// commitResult commits the engine's work onto the job branch as one commit on
// base, and records the size of the change.
func (ru *run) commitResult(ctx context.Context) (prBody string, ok bool) {
	j, g := ru.j, ru.r.Git
	prBody, hasPR, err := ru.takePRBody()
	if err != nil {
		ru.fail(job.ReasonCrash, "cannot remove "+prFile+": "+err.Error())
		return "", false
	}
	msg := fmt.Sprintf("%s\n\naq-job: %s\naq-engine: %s\naq-attempt: %d", firstNonEmpty(j.Title, "aq job "+j.ID), j.ID, ru.eng.Name(), ru.o.Attempt)
	if ru.round > 0 {
		msg += fmt.Sprintf("\naq-repair-rounds: %d", ru.round)
	}
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
		// A repair round that undid the work: no result commit stands.
		ru.out.Commit, ru.out.Branch = "", ""
		ru.out.Insights.FilesChanged, ru.out.Insights.LinesAdded, ru.out.Insights.LinesDeleted = 0, 0, 0
		return prBody, true
	}
	ru.out.Commit, ru.out.Branch = sha, job.JobBranch(j.ID)
	if ru.pushWithResult && ru.madeResult(sha) {
		// Its push's change check counts it in its own git (#35);
		// settleStat counts it when no check does.
		ru.gate.mu.Lock()
		ru.gate.statFor = sha
		ru.gate.mu.Unlock()
		return prBody, true
	}
	ru.countStat(ctx, sha)
	return prBody, true
}

// takePRBody takes the engine's .aq_pr.md out of the worktree: its text
// when it is a regular file within safefs.MaxPRBody (kept in the job's
// logs as pr.md), nothing when it is anything else (a symbolic link to a
// host file, a FIFO, an oversized file: refused, and the PR body is made
// from the manifest). Whatever was there is removed, never followed, and
// never committed; present says there was an entry.
func (ru *run) takePRBody() (body string, present bool, err error) {
	if _, err := os.Lstat(filepath.Join(ru.wtPath, prFile)); err != nil {
		return "", false, nil
	}
	b, rerr := safefs.ReadFile("worktree", ru.wtPath, prFile, safefs.MaxPRBody)
	switch {
	case rerr == nil:
		body = string(b)
		if err := os.MkdirAll(ru.logDir, 0o700); err == nil {
			_ = os.WriteFile(filepath.Join(ru.logDir, "pr.md"), b, 0o600)
		}
	case ru.untrusted(rerr):
	default:
		ru.log.Warn("cannot read "+prFile+"; the PR body is made from the manifest", "err", rerr)
	}
	if err := safefs.Remove("worktree", ru.wtPath, prFile); err != nil {
		// A directory of that name: removed with what is in it (RemoveAll
		// follows no link).
		if err := os.RemoveAll(filepath.Join(ru.wtPath, prFile)); err != nil {
			return "", true, err
		}
	}
	return body, true, nil
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
	head, tree, baseTree, old, onBranch, ok := ru.seenByCheckpoint(branch)
	if !ok {
		// One git for HEAD, the checkpoint's tree, base's tree, the job
		// branch and the branch HEAD is on (cp and baseSHA are hashes aq
		// resolved: no option can hide in them).
		out, err := wg.Run(ctx, ru.wtPath, "rev-parse", "HEAD", cp+"^{tree}", ru.baseSHA+"^{tree}", branch, "--symbolic-full-name", "HEAD", "--")
		lines := strings.Split(out, "\n")
		if err != nil || len(lines) != 6 {
			return "", false, false, nil // no HEAD, or no job branch: squash what is there
		}
		head, tree, baseTree, old, onBranch = lines[0], lines[1], lines[2], lines[3], lines[4] == branch
	}
	if head == "" || old == "" {
		return "", false, false, nil // no HEAD, or no job branch: squash what is there
	}
	if head != ru.start {
		// The engine committed, or moved HEAD (even to another branch): the
		// worktree's content must still sit on base, or committing it on
		// base would revert base's newer commits.
		if anc, err := worktree.IsAncestor(ctx, wg, ru.wtPath, ru.baseSHA, head); err != nil || !anc {
			return "", false, false, nil
		}
	}
	// As `git config --get-regexp` answers, from the configuration aq
	// already read for this worktree (no git of its own: #35).
	cfg, err := wg.ConfigGet(ctx, ru.wtPath, "user.name", "user.email", "commit.gpgsign")
	if err != nil {
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
		ru.madeCommit(result, []string{ru.baseSHA})
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
		//
		// Not yet when nothing runs in the worktree before it is released
		// (no verify: pushWithResult): a worktree that goes to the pool is
		// reset there by the next job's checkout, and the git would only
		// have been for nobody to see (#35); one that stays has its index
		// brought to the result then (syncIndex).
		ru.indexTo = result
		if !ru.pushWithResult {
			ru.syncIndex(ctx)
		}
	}
	return result, tree != baseTree, true, nil
}

// syncIndex brings the worktree's index to the result commit (indexTo)
// when commitFromCheckpoint left it for later.
func (ru *run) syncIndex(ctx context.Context) {
	to := ru.indexTo
	if to == "" {
		return
	}
	ru.indexTo = ""
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
	defer cancel()
	if _, err := ru.r.Git.Run(ctx, ru.wtPath, "read-tree", "--reset", to); err != nil {
		ru.log.Warn("the job branch holds the result, but the worktree's index could not be updated to it", "err", err)
	}
}

// madeResult reports whether the run made sha itself, on base (its
// diffstat is then its change against its one parent).
func (ru *run) madeResult(sha string) bool {
	ru.gate.mu.Lock()
	defer ru.gate.mu.Unlock()
	ps := ru.gate.made[sha]
	return len(ps) == 1 && ps[0] == ru.baseSHA
}

// seenByCheckpoint is what commitFromCheckpoint reads — HEAD, the
// checkpoint's tree, base's tree, the job branch ("" for none: then head
// or old is "") and whether HEAD is on it — from the checkpoint after the
// engine, which read them in its own git a moment before (nothing runs in
// the worktree between the two), and HEAD's file (worktree.HeadBranch).
// ok is false when one of them is not known there: the caller asks git.
func (ru *run) seenByCheckpoint(branch string) (head, tree, baseTree, old string, onBranch, ok bool) {
	s := ru.cpSeen
	old, okOld := s.Names[branch]
	baseTree = s.Names[ru.baseSHA+"^{tree}"]
	if !okOld || baseTree == "" || s.Tree == "" {
		return "", "", "", "", false, false
	}
	if s.Head == "" || old == "" {
		return s.Head, s.Tree, baseTree, old, false, true // squashed: no need to know more
	}
	on, known := worktree.HeadBranch(ru.wtPath)
	if !known {
		return "", "", "", "", false, false
	}
	return s.Head, s.Tree, baseTree, old, on == branch, true
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

// verify runs the manifest's verify: command in the worktree. passed: it
// exited 0, or there is none. A verify that ran and failed comes back as v,
// recorded in the insights (the tail of its output, masked and bounded:
// job.VerifyTailLines, job.VerifyTailBytes; the whole output is in
// verify.log), for the caller to decide on a repair round; one that could
// not run, or was stopped, has failed the run (v nil).
func (ru *run) verify(ctx context.Context) (v *job.VerifyResult, passed bool) {
	cmd := strings.TrimSpace(ru.j.Verify)
	if cmd == "" {
		return nil, true
	}
	ctx, span := ru.step(ctx, telemetry.SpanVerify, attribute.Int("aq.verify.round", ru.round))
	defer func() { ru.endStep(span, passed) }()
	ru.event(VerifyStarted{Round: ru.round, Command: cmd})
	f, err := boundlog.Open(filepath.Join(ru.logDir, "verify.log"), ru.r.Cfg.LogMax)
	if err != nil {
		ru.fail(job.ReasonCrash, "cannot open the verify log: "+err.Error())
		return nil, false
	}
	defer f.Close()
	after := ""
	if ru.round > 0 {
		after = fmt.Sprintf(" (after repair %d/%d)", ru.round, ru.rounds())
	}
	fmt.Fprintf(f, "=== aq job %s attempt %d%s: verify %q at %s ===\n", ru.j.ID, ru.o.Attempt, after, cmd, ru.r.now().UTC().Format(time.RFC3339))
	// The tail the engine and the next attempt are shown is taken after
	// masking, as the log is.
	tail := &tailBuffer{max: 4 * job.VerifyTailBytes}
	w := secrets.NewWriter(io.MultiWriter(f, tail), ru.r.Redactor)
	vctx, cancel := context.WithTimeoutCause(ctx, ru.wall(), job.Stop(job.ReasonTimeout, "verify ran past the wall budget"))
	defer cancel()
	res, err := process.Run(vctx, process.Spec{
		Path: "/bin/sh", Args: []string{"-c", cmd}, Dir: ru.wtPath,
		Env: telemetry.EngineEnv(vctx, ru.engineEnv("")), Stdout: w, Stderr: w, Tag: ru.j.ID, Scope: Scope(ru.r.Cfg.Home), Grace: ru.r.Cfg.Grace,
		Supervisor: ru.r.Cfg.Supervisor, Jail: ru.jailed(),
	})
	w.Flush()
	if ru.sandboxFailure("verify", err, res.OOM && res.ExitCode != 0) {
		return nil, false
	}
	if err != nil {
		ru.fail(job.ReasonVerifyFailed, "verify could not start: "+err.Error())
		return nil, false
	}
	if res.Stopped {
		if !ru.stopped(vctx, "verify") {
			ru.fail(job.ReasonVerifyFailed, "verify was stopped")
		}
		return nil, false
	}
	vr := job.VerifyResult{Command: cmd, ExitCode: res.ExitCode, Passed: res.ExitCode == 0}
	if !vr.Passed {
		vr.Tail, vr.Cut = job.Tail(tail.bytes(), job.VerifyTailLines, job.VerifyTailBytes)
		vr.Cut = vr.Cut || tail.dropped
	}
	ru.out.Insights.Verify = &vr
	if runs := ru.out.Insights.Runs; len(runs) > 0 {
		runs[len(runs)-1].VerifyPassed, runs[len(runs)-1].VerifyExit = vr.Passed, vr.ExitCode
	}
	ru.event(Verified{Round: ru.round, Result: vr})
	if !vr.Passed {
		ru.log.Warn("verify failed", "verify", cmd, "exit", res.ExitCode, "round", ru.round)
		return &vr, false
	}
	ru.log.Info("verify passed", "verify", cmd, "round", ru.round)
	return &vr, true
}

// tailBuffer keeps the last bytes written to it, at least max of them.
type tailBuffer struct {
	max     int
	buf     []byte
	dropped bool // something was written before what it keeps
}

func (t *tailBuffer) Write(p []byte) (int, error) {
	t.buf = append(t.buf, p...)
	if len(t.buf) > 2*t.max {
		t.buf = append(t.buf[:0:0], t.buf[len(t.buf)-t.max:]...)
		t.dropped = true
	}
	return len(p), nil
}

func (t *tailBuffer) bytes() []byte {
	if len(t.buf) > t.max {
		return t.buf[len(t.buf)-t.max:]
	}
	return t.buf
}
