// Package local is aq's local-mode demo: the embedded default, end to end.
// It makes a throw-away workspace (AQ_HOME, two git repositories with bare
// origins), submits a handful of embedded jobs run by a scripted engine, runs
// them through the real queue and pipeline, narrates what happens, and checks
// that every expected event happened.
package local

import (
	"context"
	"embed"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/aqfleet/aq/agent/config"
	agentlocal "github.com/aqfleet/aq/agent/local"
	"github.com/aqfleet/aq/agent/queue"
	"github.com/aqfleet/aq/agent/runner"
	"github.com/aqfleet/aq/demo"
	"github.com/aqfleet/aq/internal/brief"
	"github.com/aqfleet/aq/internal/process"
	"github.com/aqfleet/aq/internal/secrets"
	"github.com/aqfleet/aq/job"
)

//go:embed jobs/*.md
var jobFiles embed.FS

// Options configure a demo run.
type Options struct {
	// Dir is the workspace; empty means a new temp dir, removed afterwards
	// unless Keep.
	Dir  string
	Keep bool
	Out  io.Writer
	// Log receives aq's own logs (discarded when nil).
	Log *slog.Logger
}

// Row is one job in the summary.
type Row struct {
	ID       string     `json:"id"`
	Repo     string     `json:"repo"`
	Stage    job.Stage  `json:"stage"`
	Reason   job.Reason `json:"reason,omitempty"`
	Attempts int        `json:"attempts"`
	Branch   string     `json:"branch,omitempty"`
	CostUSD  float64    `json:"costUsd"`
	// RepairRounds ran in the job's last attempt (a failed verify handed
	// back to the engine).
	RepairRounds int `json:"repairRounds,omitempty"`
}

// Summary is what the demo saw and checked.
type Summary struct {
	Workspace string   `json:"workspace"`
	Rows      []Row    `json:"rows"`
	Checks    []Check  `json:"checks"`
	Order     []string `json:"order"` // job runs in order, as id#attempt
}

// Check is one expected event.
type Check = demo.Check

// Passed reports whether every check passed.
func (s *Summary) Passed() bool { return demo.AllPassed(s.Checks) }

// Run runs the local demo.
func Run(ctx context.Context, o Options) (*Summary, error) {
	out := o.Out
	if out == nil {
		out = io.Discard
	}
	say := func(format string, a ...any) { fmt.Fprintf(out, format+"\n", a...) }
	dir, cleanup, err := demo.Workspace(o.Dir, "aq-demo-", o.Keep)
	if err != nil {
		return nil, err
	}
	defer cleanup()
	sum := &Summary{Workspace: dir}
	cfg := &config.Config{
		Home: filepath.Join(dir, "aq-home"), RepoBase: filepath.Join(dir, "src"),
		KillGrace: 300 * time.Millisecond, Poll: time.Second, ClaudePermissionMode: "acceptEdits",
		FleetRoute: true, LogFormat: "text", LogLevel: "info", GCWIPRetention: 336 * time.Hour, Slots: 1,
	}
	say("aq local demo — the embedded default: a folder queue, no coordinator, no cloud, no engine account")
	say("workspace %s", dir)
	say("")
	say("1. Two repositories, each with a bare origin")
	for repo, files := range map[string]map[string]string{
		"notes":  {"README.md": "# Notes\n", "ideas.md": "# Ideas\n", "todo.md": "# Todo\n"},
		"webapp": {"index.html": "<html><head><title>Helo</title></head><body></body></html>\n"},
	} {
		if err := makeRepo(ctx, cfg.RepoBase, filepath.Join(dir, "origins"), repo, files); err != nil {
			return nil, err
		}
		say("   %s: %s (origin %s)", repo, filepath.Join(cfg.RepoBase, repo), filepath.Join(dir, "origins", repo+".git"))
	}

	log := o.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	a, err := agentlocal.New(cfg, log, secrets.FromEnviron(), agentlocal.Parts{})
	if err != nil {
		return nil, err
	}

	say("")
	say("2. Submit six jobs (engine: script — a shell script stands in for claude/codex/devin)")
	names, _ := fs.Glob(jobFiles, "jobs/*.md")
	sort.Strings(names)
	jobsDir := filepath.Join(dir, "jobs")
	if err := os.MkdirAll(jobsDir, 0o755); err != nil {
		return nil, err
	}
	for _, n := range names {
		raw, _ := jobFiles.ReadFile(n)
		p := filepath.Join(jobsDir, filepath.Base(n))
		if err := os.WriteFile(p, raw, 0o644); err != nil {
			return nil, err
		}
		j, err := a.Parse(p)
		if err != nil {
			return nil, fmt.Errorf("embedded job %s: %w", n, err)
		}
		st, err := a.Queue.Submit(j, raw)
		if err != nil {
			return nil, err
		}
		extra := ""
		if len(j.Deps) > 0 {
			extra = " (waits for " + strings.Join(j.Deps, ", ") + " to ship)"
		}
		say("   %-13s → %-7s repo %-6s priority %s%s", j.ID, st.Stage, j.Repo, job.PriorityName(j.Priority), extra)
	}

	say("")
	say("3. aq run: take the best runnable job, run it in its own worktree, checkpoint, verify, ship")
	for {
		res, err := a.RunOne(ctx)
		if errors.Is(err, queue.ErrNoJob) {
			wait, ok := nextBackoff(a.Queue)
			if !ok || ctx.Err() != nil {
				break
			}
			say("   … waiting %s for a retry backoff", wait.Round(100*time.Millisecond))
			select {
			case <-ctx.Done():
			case <-time.After(wait):
			}
			continue
		}
		if err != nil {
			return sum, err
		}
		sum.Order = append(sum.Order, fmt.Sprintf("%s#%d", res.JobID, res.Attempt))
		narrate(say, res)
	}

	say("")
	say("4. Summary")
	entries, err := a.Queue.List()
	if err != nil {
		return sum, err
	}
	for _, e := range entries {
		s := e.State
		r := Row{ID: s.ID, Repo: s.Repo, Stage: s.Stage, Reason: s.Reason, Attempts: s.Attempts, Branch: s.Branch}
		if s.Insights != nil {
			r.CostUSD, r.RepairRounds = s.Insights.CostUSD, s.Insights.RepairRounds
		}
		sum.Rows = append(sum.Rows, r)
	}
	sort.Slice(sum.Rows, func(i, j int) bool { return sum.Rows[i].ID < sum.Rows[j].ID })
	fmt.Fprintf(out, "   %-13s %-6s %-11s %-16s %-8s %s\n", "JOB", "REPO", "STAGE", "REASON", "ATTEMPTS", "COST")
	for _, r := range sum.Rows {
		fmt.Fprintf(out, "   %-13s %-6s %-11s %-16s %-8d $%.3f\n", r.ID, r.Repo, r.Stage, orDash(string(r.Reason)), r.Attempts, r.CostUSD)
	}
	sum.Checks = check(ctx, cfg, sum)
	say("")
	say("5. Expected events")
	demo.WriteChecks(out, sum.Checks)
	if o.Keep || o.Dir != "" {
		say("")
		say("workspace kept: AQ_HOME=%s AQ_REPO_BASE=%s aq status", cfg.Home, cfg.RepoBase)
	}
	return sum, nil
}

func narrate(say func(string, ...any), r *agentlocal.Result) {
	o := r.Outcome
	in := o.Insights
	head := fmt.Sprintf("   ▶ %s (attempt %d)", r.JobID, r.Attempt)
	if r.Attempt > 1 && o.Checkpoint != "" {
		head += ", resuming from its WIP checkpoint"
	}
	say("%s", head)
	for _, run := range in.Runs {
		if run.Round > 0 {
			say("     ↻ verify failed (exit %d): repair round %d — the engine ran again with verify's output in its prompt", in.Runs[run.Round-1].VerifyExit, run.Round)
		}
	}
	if o.Failed() {
		say("     ✗ %s: %s", o.Reason, o.Detail)
		if o.Checkpoint != "" {
			say("       work checkpointed to %s (%s)", job.WIPBranch(r.JobID), brief.SHA(o.Checkpoint))
		}
		say("       → %s", r.Stage)
		return
	}
	what := "no changes"
	if o.Branch != "" {
		what = fmt.Sprintf("%s, %d files +%d/-%d", o.Branch, in.FilesChanged, in.LinesAdded, in.LinesDeleted)
		if o.Pushed {
			what += ", pushed to origin"
		}
	}
	say("     ✓ %s: %s; %d tokens, $%.3f, %d turns", r.Stage, what, in.TokensIn+in.TokensOut, in.CostUSD, in.Turns)
}

// nextBackoff is how long until the earliest inbox job's backoff ends.
func nextBackoff(q *queue.Queue) (time.Duration, bool) {
	entries, err := q.List()
	if err != nil {
		return 0, false
	}
	var best time.Time
	for _, e := range entries {
		if e.State.Stage == job.Inbox && !e.State.NotBefore.IsZero() && (best.IsZero() || e.State.NotBefore.Before(best)) {
			best = e.State.NotBefore
		}
	}
	if best.IsZero() {
		return 0, false
	}
	d := time.Until(best) + 50*time.Millisecond
	if d < 0 {
		d = 0
	}
	return d, true
}

func check(ctx context.Context, cfg *config.Config, s *Summary) []Check {
	row := map[string]Row{}
	for _, r := range s.Rows {
		row[r.ID] = r
	}
	pos := func(run string) int {
		for i, o := range s.Order {
			if o == run {
				return i
			}
		}
		return -1
	}
	var cs []Check
	add := func(ok bool, what, note string) { cs = append(cs, Check{What: what, OK: ok, Note: note}) }
	onOrigin := func(repo, ref string) bool {
		out, err := exec.CommandContext(ctx, "git", "-C", filepath.Join(filepath.Dir(cfg.RepoBase), "origins", repo+".git"), "rev-parse", "--verify", "--quiet", ref).Output()
		return err == nil && len(strings.TrimSpace(string(out))) == 40
	}
	fileIn := func(repo, ref, path string) bool {
		return exec.CommandContext(ctx, "git", "-C", filepath.Join(cfg.RepoBase, repo), "cat-file", "-e", ref+":"+path).Run() == nil
	}
	add(row["notes-index"].Stage == job.Shipped && onOrigin("notes", "refs/heads/aq/job/notes-index"),
		"notes-index shipped and its branch is on origin", "")
	add(pos("notes-index#1") == 0, "the high-priority job ran first", strings.Join(s.Order, " "))
	add(row["web-title"].Stage == job.Shipped && row["web-footer"].Stage == job.Shipped && pos("web-title#1") < pos("web-footer#1"),
		"web-footer waited in blocked/ until its dep web-title shipped", "")
	add(row["notes-resume"].Stage == job.Shipped && row["notes-resume"].Attempts == 2 && fileIn("notes", "aq/job/notes-resume", "step-1.txt") && fileIn("notes", "aq/job/notes-resume", "step-2.txt"),
		"notes-resume failed once, was retried from its checkpoint, and shipped both steps", "")
	add(row["web-budget"].Reason == job.ReasonBudgetExceeded && fileIn("webapp", "aq/wip/web-budget", "scratch.txt"),
		"web-budget was stopped at its token budget and its partial work checkpointed", string(row["web-budget"].Stage))
	todo := row["notes-todo"]
	add(todo.Stage == job.Shipped && todo.Attempts == 1 && todo.RepairRounds == 1 && fileIn("notes", "aq/job/notes-todo", "todo.md"),
		"notes-todo failed its verify, got the failure back in a repair round, and shipped in the same attempt", fmt.Sprintf("%d repair round(s)", todo.RepairRounds))
	pids, err := process.FindScoped("web-budget", runner.Scope(cfg.Home))
	add(err == nil && len(pids) == 0, "no engine process outlived its job", "")
	return cs
}

func makeRepo(ctx context.Context, base, origins, name string, files map[string]string) error {
	dir := filepath.Join(base, name)
	bare := filepath.Join(origins, name+".git")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	for f, body := range files {
		if err := os.WriteFile(filepath.Join(dir, f), []byte(body), 0o644); err != nil {
			return err
		}
	}
	git := func(dir string, args ...string) error {
		cmd := exec.CommandContext(ctx, "git", args...)
		cmd.Dir = dir
		cmd.Env = append(os.Environ(), "GIT_AUTHOR_NAME=aq demo", "GIT_AUTHOR_EMAIL=demo@aq.invalid", "GIT_COMMITTER_NAME=aq demo", "GIT_COMMITTER_EMAIL=demo@aq.invalid")
		if out, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("git %s: %v: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
		}
		return nil
	}
	if err := os.MkdirAll(origins, 0o755); err != nil {
		return err
	}
	for _, step := range []struct {
		dir  string
		args []string
	}{
		{origins, []string{"init", "-q", "--bare", "-b", "main", bare}},
		{dir, []string{"init", "-q", "-b", "main"}},
		{dir, []string{"add", "-A"}},
		{dir, []string{"commit", "-q", "-m", "initial commit"}},
		{dir, []string{"remote", "add", "origin", bare}},
		{dir, []string{"push", "-q", "origin", "main"}},
	} {
		if err := git(step.dir, step.args...); err != nil {
			return err
		}
	}
	return nil
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
