package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/aqfleet/aq/agent/config"
	"github.com/aqfleet/aq/agent/queue"
	"github.com/aqfleet/aq/engines"
	"github.com/aqfleet/aq/internal/aqerr"
	"github.com/aqfleet/aq/job"
)

func init() { register(newJobCmd) }

func newJobCmd(f *Factory) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "job",
		Short: "Inspect, move or remove one job: show, logs, requeue, ship, reject, rm (fleet mode: through the coordinator)",
		Args:  cobra.NoArgs,
		RunE:  func(cmd *cobra.Command, args []string) error { return cmd.Help() },
	}
	cmd.AddCommand(newJobShowCmd(f), newJobLogsCmd(f), newJobRequeueCmd(f), newJobShipCmd(f), newJobRejectCmd(f), newJobRmCmd(f))
	// What every job command reads besides the global keys: in fleet mode,
	// the coordinator.
	config.AddKeyFlags(cmd.PersistentFlags(), config.OperatorKeys...)
	return cmd
}

// jobEntry loads one job, turning "not found" into a usage error.
func jobEntry(f *Factory, id string) (*queue.Entry, error) {
	a, err := f.Local()
	if err != nil {
		return nil, err
	}
	e, err := a.Queue.Get(id)
	if errors.Is(err, queue.ErrNotFound) {
		return nil, aqerr.Usagef("`aq status` lists the jobs", "no job %q in %s", id, a.Queue.Dir())
	}
	return e, err
}

// JobView is `aq job show --json`.
type JobView struct {
	queue.State
	Manifest string `json:"manifest"`
	Logs     string `json:"logs"`
	// Worktree is the job's worktree while it has one ("" once it went
	// back to the pool, or before it ran).
	Worktree string `json:"worktree"`
}

func newJobShowCmd(f *Factory) *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "show ID",
		Short: "Show a job's state, history, insights and files",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			cfg, err := f.Config()
			if err != nil {
				return err
			}
			if useFleet(cfg) {
				return fleetJobShow(cmd.Context(), f, args[0], asJSON)
			}
			e, err := jobEntry(f, args[0])
			if err != nil {
				return err
			}
			v := JobView{State: e.State, Manifest: e.ManifestPath, Logs: filepath.Join(cfg.LogsDir(), e.State.ID)}
			// A finished job's worktree usually went back to the pool
			// (AQ_WORKTREE_POOL): then it has none.
			if wt := filepath.Join(cfg.WorktreesDir(), e.State.Repo, e.State.ID); exists(wt) {
				v.Worktree = wt
			}
			if asJSON {
				return writeJSON(f.IO.Out, v)
			}
			return printJob(f.IO.Out, v)
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print as JSON: the sidecar fields plus {manifest, logs, worktree}; fleet mode: {job, events, artifacts, missing, logs}")
	return cmd
}

func printJob(w io.Writer, v JobView) error {
	s := v.State
	tw := table(w)
	// Everything shown may have come from a job's author (a title, a
	// detail quoting the engine): no escape sequence reaches the terminal.
	row := func(k, val string) {
		if val != "" {
			fmt.Fprintf(tw, "%s\t%s\n", k, job.Printable(val, false))
		}
	}
	row("id", s.ID)
	row("title", s.Title)
	row("stage", string(s.Stage))
	row("repo", s.Repo)
	row("engine", s.Engine)
	row("priority", job.PriorityName(s.Priority))
	row("attempts", fmt.Sprint(s.Attempts))
	if s.Reason != "" {
		row("reason", string(s.Reason))
	}
	row("detail", s.Detail)
	row("branch", s.Branch)
	row("pr", s.PR)
	row("checkpoint", s.Checkpoint)
	if len(s.Deps) > 0 {
		row("deps", strings.Join(s.Deps, ", ")+" ("+s.DepsMode+")")
	}
	row("manifest", v.Manifest)
	row("logs", v.Logs)
	switch {
	case v.Worktree != "":
		row("worktree", v.Worktree)
	case s.Checkpoint != "":
		row("worktree", "none: it went back to the worktree pool when the job ended (its work is in the checkpoint and branch above)")
	}
	if in := s.Insights; in != nil {
		row("insights", fmt.Sprintf("engine %s %s, model %s, tokens in/out/cached %d/%d/%d, cost $%.4f%s, turns %d, wall %dms, files %d +%d/-%d",
			in.Engine, in.EngineVersion, in.Model, in.TokensIn, in.TokensOut, in.TokensCached, in.CostUSD, map[bool]string{true: " (estimated)"}[in.CostEstimated], in.Turns, in.WallMS, in.FilesChanged, in.LinesAdded, in.LinesDeleted))
	}
	row("previous", previousText(s.Previous))
	tw.Flush()
	printRounds(w, s.Insights)
	printRefused(w, s.Insights)
	if len(s.History) > 0 {
		fmt.Fprintln(w, "\nhistory:")
		for _, h := range s.History {
			line := fmt.Sprintf("  %s  %s → %s", h.At.Local().Format("2006-01-02 15:04:05"), orDash(string(h.From)), h.To)
			if h.Reason != "" {
				line += "  " + string(h.Reason)
			}
			if h.Detail != "" {
				line += ": " + h.Detail
			}
			fmt.Fprintln(w, job.Printable(line, false))
		}
	}
	return nil
}

func newJobLogsCmd(f *Factory) *cobra.Command {
	var (
		stream              string
		follow, raw, asJSON bool
	)
	cmd := &cobra.Command{
		Use:   "logs ID",
		Short: "Print a job's engine output (stdout, stderr) and verify log; -f follows a running job",
		Long: `Print a job's logs: the engine's output (stdout), its stderr and the verify
log, as they were written.

-f follows the job until it ends: the engine's events rendered for a person
(what it says, the tools it calls and on what, usage and cost as they accrue)
and the job's stage changes. With --raw, -f prints the engine's own
stream-json/JSONL lines on stdout instead (stage changes go to stderr).

--json prints one JSON object per line: {job, stream, text} for each line
of a log as written; with -f, {job, kind, text, usage?} for each engine
event (kind: attempt, system, text, tool, tool-error, usage, result,
error) and {job, kind: "event", text} for each stage change or note.

In fleet mode a job that ran (or runs) on another factory is read from the
coordinator: with -f its events and its live log while it runs (about a
second behind its engine; gaps shown as gaps), and its logs from the
artifacts its factory uploaded when it ended.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			cfg, err := f.Config()
			if err != nil {
				return err
			}
			names := map[string][]string{"all": {"stdout", "stderr", "verify"}, "stdout": {"stdout"}, "stderr": {"stderr"}, "verify": {"verify"}}[stream]
			if names == nil {
				return aqerr.Usagef("use stdout, stderr, verify or all", "--stream %q is not a log", stream)
			}
			switch {
			case raw && !follow:
				return aqerr.Usagef("--raw goes with -f (without -f the logs are printed as written)", "--raw without -f")
			case raw && asJSON:
				return aqerr.Usagef("use one of them: --raw prints the engine's own JSON lines, --json aq's records", "--raw and --json cannot be combined")
			}
			if follow {
				fo, err := newFollower(cmd.Context(), f, args[0], raw)
				if err != nil {
					return err
				}
				if raw {
					fo.meta = func(l string) { fmt.Fprintln(f.IO.Err, l) }
				}
				if asJSON {
					fo.rec = func(r logRecord) { _ = writeJSONLine(f.IO.Out, r) }
				}
				return fo.run(cmd.Context(), func(l string) { fmt.Fprintln(f.IO.Out, l) })
			}
			out := &logPrinter{f: f, id: args[0], many: len(names) > 1, json: asJSON}
			if useFleet(cfg) {
				return fleetJobLogs(cmd.Context(), f, out, names)
			}
			if _, err := jobEntry(f, args[0]); err != nil {
				return err
			}
			printLocalLogs(f, out, filepath.Join(cfg.LogsDir(), args[0]), names)
			return nil
		},
	}
	cmd.Flags().StringVar(&stream, "stream", "all", "which log: stdout|stderr|verify|all")
	cmd.Flags().BoolVarP(&follow, "follow", "f", false, "follow the job until it ends: its engine events rendered for a person, and its stage changes")
	cmd.Flags().BoolVar(&raw, "raw", false, "with -f: the engine's own stream-json/JSONL lines, as written")
	cmd.Flags().BoolVar(&asJSON, "json", false, "one JSON object per line: {job, stream, text} per log line; with -f {job, kind, text, usage?} per event")
	return cmd
}

// logRecord is one line of `aq job logs --json`. Field names are stable.
type logRecord struct {
	Job string `json:"job"`
	// Stream names the log a line was read from as written (stdout,
	// stderr, verify); empty with -f.
	Stream string `json:"stream,omitempty"`
	// Kind is, with -f, the engine event's kind (engines.Note), "event"
	// for a stage change or a note of aq's, or "gap" for a stretch of a
	// live log its factory could not stream.
	Kind  string         `json:"kind,omitempty"`
	Text  string         `json:"text"`
	Usage *engines.Usage `json:"usage,omitempty"`
}

// logPrinter prints a job's logs as written, or as JSON records.
type logPrinter struct {
	f     *Factory
	id    string
	many  bool // headed by "--- NAME.log ---" per log (text only)
	json  bool
	shown int
}

// log prints one log's content; head is its heading's text.
func (p *logPrinter) log(name, head string, b []byte) {
	p.shown++
	if !p.json {
		if p.many {
			fmt.Fprintf(p.f.IO.Out, "--- %s ---\n", head)
		}
		_, _ = p.f.IO.Out.Write(b)
		return
	}
	if len(b) == 0 {
		return
	}
	for _, l := range strings.Split(strings.TrimSuffix(string(b), "\n"), "\n") {
		_ = writeJSONLine(p.f.IO.Out, logRecord{Job: p.id, Stream: name, Text: strings.TrimSuffix(l, "\r")})
	}
}

// printLocalLogs prints the job's log files under dir.
func printLocalLogs(f *Factory, out *logPrinter, dir string, names []string) {
	for _, n := range names {
		b, err := os.ReadFile(filepath.Join(dir, n+".log"))
		if err != nil {
			continue
		}
		out.log(n, n+".log", b)
	}
	if out.shown == 0 {
		fmt.Fprintf(f.IO.Err, "aq: job %s has no %s log yet (it has not run)\n", out.id, strings.Join(names, ", "))
	}
}

func newJobRequeueCmd(f *Factory) *cobra.Command {
	return &cobra.Command{
		Use:   "requeue ID",
		Short: "Return a failed, dead-lettered, review or testing job to the inbox",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return jobAction(cmd.Context(), f, args[0], "requeue", "")
		},
	}
}

func newJobShipCmd(f *Factory) *cobra.Command {
	return &cobra.Command{
		Use:   "ship ID",
		Short: "Mark a job in review or testing as shipped (the manual gate)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return jobAction(cmd.Context(), f, args[0], "ship", "")
		},
	}
}

func newJobRejectCmd(f *Factory) *cobra.Command {
	var why string
	cmd := &cobra.Command{
		Use:   "reject ID",
		Short: "Move a waiting or finished job to failed (reason rejected); nothing is deleted",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return jobAction(cmd.Context(), f, args[0], "reject", why)
		},
	}
	cmd.Flags().StringVar(&why, "why", "rejected by an operator", "the reason recorded on the job")
	return cmd
}

func newJobRmCmd(f *Factory) *cobra.Command {
	return &cobra.Command{
		Use:   "rm ID",
		Short: "Remove a job that is not running (its worktree and branches are left to aq gc)",
		Long: `Remove a job from the queue — in fleet mode from the coordinator (DELETE
/fleet/jobs/:id) — so that a mistake need not live on under its id: a job
in any stage but building. A running job is refused and left as it is.

Nothing of its work is deleted: its worktree, its checkpoint aq/wip/<id> and
its branch aq/job/<id> are left to aq gc, which never deletes unmerged work
(docs/gc.md), and its logs stay under $AQ_HOME/logs/<id>. A job submitted
later under the same id starts afresh, but resumes from that checkpoint if it
is still there (delete the ref for a clean start). Jobs that name it in their
deps are listed on stderr: they wait until a job with its id ships.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return runJobRm(cmd.Context(), f, args[0])
		},
	}
}

// runJobRm is `aq job rm ID`. An unknown job gives the line and exit code
// aq job show gives.
func runJobRm(ctx context.Context, f *Factory, id string) error {
	cfg, err := f.Config()
	if err != nil {
		return err
	}
	var (
		was        string
		dependents []string
		where      string
	)
	if useFleet(cfg) {
		if err := checkJobID(id); err != nil {
			return err
		}
		c, err := operatorClient(ctx, f)
		if err != nil {
			return err
		}
		a, err := c.RemoveJob(ctx, id)
		if err != nil {
			return jobOpError(id, "remove", err)
		}
		was, dependents, where = "the coordinator had it in "+orDash(a.Stage), a.Dependents, "the coordinator"
	} else {
		if _, err := jobEntry(f, id); err != nil {
			return err
		}
		a, _ := f.Local()
		st, deps, err := a.Queue.Remove(id)
		if err != nil {
			return err
		}
		was, dependents, where = "it was in "+string(st.Stage), deps, "the queue"
	}
	fmt.Fprintf(f.IO.Out, "removed %s from %s (%s); its worktree and branches are left to aq gc, which never deletes unmerged work\n", id, where, was)
	if len(dependents) > 0 {
		fmt.Fprintf(f.IO.Err, "aq: warning: %s name %s in their deps: they wait until a job %s ships (`aq job rm` them, or give them new deps with `aq submit --replace`)\n",
			strings.Join(dependents, ", "), id, id)
	}
	return nil
}

// jobAction is `aq job requeue|ship|reject`: on the local queue, or in
// fleet mode through the coordinator.
func jobAction(ctx context.Context, f *Factory, id, action, why string) error {
	msg, err := act(ctx, f, id, action, why)
	if err != nil {
		return err
	}
	fmt.Fprintln(f.IO.Out, msg)
	return nil
}

// act applies a job action where the job lives and says what it did: the
// job commands and the board share it.
func act(ctx context.Context, f *Factory, id, action, why string) (string, error) {
	cfg, err := f.Config()
	if err != nil {
		return "", err
	}
	if useFleet(cfg) {
		return fleetAct(ctx, f, id, action, why)
	}
	return localAct(f, id, action, why)
}

// localAct is a job action on the local queue.
func localAct(f *Factory, id, action, why string) (string, error) {
	e, err := jobEntry(f, id)
	if err != nil {
		return "", err
	}
	a, _ := f.Local()
	switch action {
	case "requeue":
		if err := a.Queue.Requeue(id); err != nil {
			return "", stageErr(err)
		}
		return "requeued " + id, nil
	case "ship":
		if s := e.State.Stage; s != job.Review && s != job.Testing {
			return "", aqerr.Usagef("only jobs in review or testing can be shipped", "job %s is in %s", id, s)
		}
		if err := a.Queue.Move(id, job.Shipped, nil); err != nil {
			return "", stageErr(err)
		}
		return "shipped " + id, nil
	case "reject":
		if e.State.Stage == job.Building {
			return "", aqerr.Usagef("wait for it to finish, or stop the aq running it", "job %s is running", id)
		}
		if why == "" {
			why = "rejected by an operator"
		}
		err = a.Queue.Move(id, job.Failed, func(s *queue.State) {
			s.Reason, s.Detail = job.ReasonRejected, why
		})
		if err != nil {
			return "", stageErr(err)
		}
		return "rejected " + id, nil
	}
	return "", aqerr.Usagef("requeue, ship or reject", "unknown action %q", action)
}

// stageErr turns a queue stage error into a usage error.
func stageErr(err error) error {
	var se *queue.StageError
	if errors.As(err, &se) {
		return aqerr.Wrap(aqerr.Usage, err, err.Error(), "`aq job show` says where the job is")
	}
	return err
}

// previousText is how a job's previous attempt ended, on one line ("" when
// none is known).
func previousText(p *job.Previous) string {
	if p == nil {
		return ""
	}
	t := fmt.Sprintf("attempt %d ended %s", p.Attempt, p.Reason)
	if p.Attempt <= 0 {
		t = "the last run ended " + string(p.Reason)
	}
	if p.Detail != "" {
		t += ": " + strings.Join(strings.Fields(p.Detail), " ")
	}
	if p.RepairRounds > 0 {
		t += fmt.Sprintf(" (after %d repair round%s)", p.RepairRounds, map[bool]string{true: "s"}[p.RepairRounds != 1])
	}
	return t
}

// printRefused lists what the job's egress proxy refused its sandboxed
// engine: what an operator may want to allow in AQ_SANDBOX_NET.
func printRefused(w io.Writer, in *job.Insights) {
	if in == nil || len(in.EgressRefused) == 0 {
		return
	}
	fmt.Fprintln(w, "\negress refused (docs/sandbox.md, \"Network\"):")
	for _, r := range in.EgressRefused {
		fmt.Fprintf(w, "  %s  %d×  %s\n", net.JoinHostPort(r.Host, strconv.Itoa(r.Port)), r.Count, r.Why)
	}
}

// printRounds lists the engine's runs of a job's last attempt — the first
// and each repair round after a failed verify — with what each spent and
// what verify said after it, and the tail of a verify that failed.
func printRounds(w io.Writer, in *job.Insights) {
	if in == nil || len(in.Runs) == 0 {
		return
	}
	fmt.Fprintf(w, "\nruns (%d repair round%s):\n", in.RepairRounds, map[bool]string{true: "s"}[in.RepairRounds != 1])
	for _, r := range in.Runs {
		name := "first"
		if r.Round > 0 {
			name = fmt.Sprintf("repair %d", r.Round)
		}
		sess := ""
		if r.Session != "" {
			sess = ", continued session " + r.Session
		}
		after := "passed"
		switch {
		case r.VerifyExit < 0:
			after = "not run"
		case !r.VerifyPassed:
			after = fmt.Sprintf("exited %d", r.VerifyExit)
		}
		fmt.Fprintf(w, "  %-9s tokens in/out %d/%d, $%.4f, %d turns, %s%s; verify %s\n", name, r.TokensIn, r.TokensOut, r.CostUSD, r.Turns,
			time.Duration(r.EngineMS*int64(time.Millisecond)).Round(time.Millisecond), sess, after)
	}
	if v := in.Verify; v != nil && !v.Passed && v.Tail != "" {
		fmt.Fprintf(w, "\nlast verify (%s, exit %d), its output's end:\n", v.Command, v.ExitCode)
		for _, l := range strings.Split(v.Tail, "\n") {
			fmt.Fprintln(w, "  "+l)
		}
	}
}
