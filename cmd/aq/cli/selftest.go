package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"regexp"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/aqfleet/aq/agent/config"
	"github.com/aqfleet/aq/internal/aqerr"
	"github.com/aqfleet/aq/internal/logging"
	"github.com/aqfleet/aq/selftest"
)

func init() { register(newSelftestCmd) }

type selftestOptions struct {
	Engines bool
	JSON    bool
	Only    string
	Group   string
	List    bool
	Timeout time.Duration
}

func newSelftestCmd(f *Factory) *cobra.Command {
	opts := &selftestOptions{}
	cmd := &cobra.Command{
		Use:   "selftest [--json] [--group host|pipeline|engines] [--engines] [--only PATTERN] [--list]",
		Short: "Check this host and this build, offline: named checks, pass/fail/skip; non-zero exit on any failure",
		Long: `Run aq's self-checks, in two groups:

  host      is this machine ready to be a factory: git and its version, gh and
            its login, each engine and its pre-flight, $AQ_HOME (writable,
            locks, free space), the repo base, file locks, the clock, the
            configuration, prices, profiles, the credentials file, and in fleet
            mode the coordinator (reachable, token, clock) and the Service Bus
            settings. A check that does not apply is skipped, with the reason.
  pipeline  does this build work: an offline end-to-end run in a temp dir with
            real git repositories and bare origins, the real queue, worktrees,
            locks, checkpoints, the kill ladder, budgets, verify, retries,
            recovery after kill -9 (a child aq), the engine sandbox (a hostile
            job's every escape tried inside a real sandbox: any that succeeds
            fails; skipped where the host cannot sandbox, failed there under
            AQ_SANDBOX=on), the fleet contract against the coordinator stub
            (fencing, /fleet/fail, the spool, the gated poll), Service Bus
            delivery through the local AMQP peer (when Node and 'make sbpeer'
            are there), gc and secrets. It leaves nothing behind: the last
            checks prove it.
  engines   only with --engines (or --group engines): each engine CLI
            installed here runs a tiny job in this host's engine sandbox
            against an in-process fake of its API, with an empty login — no
            token is spent, nothing reaches a real API.

Each check prints one line: PASS, FAIL or SKIP, its name, its duration and a
one-line reason. --list names every check with what it proves.

--only PATTERN runs the checks whose name matches the regular expression
(e.g. --only 'fleet|broker'); --group limits the run to one group.

--json prints one object (stable field names; docs/selftest.md):
  {ok, version, startedAt, durationMs,
   counts: {total, pass, fail, skip},
   checks: [{name, group, status: pass|fail|skip, reason, durationMs}]}
With --list --json: [{name, group, description}].

Exit codes: 0 no check failed, 1 a check failed, 2 usage error.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			// --engines here is the selftest's own switch, not the
			// configuration key of that name (AQ_ENGINES still sets it):
			// the configuration must not read "true" as a list of engines.
			if fl := cmd.Flags().Lookup("engines"); fl != nil {
				fl.Changed = false
			}
			return runSelftest(cmd.Context(), f, opts)
		},
	}
	fl := cmd.Flags()
	fl.BoolVar(&opts.JSON, "json", false, "print the report as JSON: {ok, counts, checks: [{name, group, status, reason, durationMs}]}")
	fl.StringVar(&opts.Only, "only", "", "run only the checks whose name matches this regular expression")
	fl.StringVar(&opts.Group, "group", "", "run only one group: host, pipeline or engines")
	fl.BoolVar(&opts.Engines, "engines", false, "also run the engines group: each engine CLI installed here, a tiny job against a fake API in the sandbox")
	fl.BoolVar(&opts.List, "list", false, "list the checks (name and what each proves) without running them")
	fl.DurationVar(&opts.Timeout, "timeout", 3*time.Minute, "give up on the whole run after this long (each check has its own, shorter deadline)")
	_ = fl.MarkHidden("timeout")
	// Every key of these groups as a flag but engines (AQ_ENGINES): on this
	// command --engines is the engines group's switch.
	keys := pflag.NewFlagSet("keys", pflag.ContinueOnError)
	config.AddFlags(keys, config.GroupRepo, config.GroupFleet, config.GroupBroker, config.GroupEngine, config.GroupDaemon)
	keys.VisitAll(func(k *pflag.Flag) {
		if k.Name != "engines" {
			fl.AddFlag(k)
		}
	})
	return cmd
}

// engineSelftestTimeout is the least overall deadline of a run with the
// engines group.
const engineSelftestTimeout = 8 * time.Minute

func runSelftest(ctx context.Context, f *Factory, opts *selftestOptions) error {
	o := selftest.Options{Timeout: opts.Timeout}
	if opts.Group != "" {
		g, err := selftest.ParseGroup(opts.Group)
		if err != nil {
			return aqerr.Usagef("use --group host, --group pipeline or --group engines", "--group: %v", err)
		}
		o.Group = g
	}
	o.Engines = opts.Engines
	if (o.Engines || o.Group == selftest.GroupEngines) && opts.Timeout < engineSelftestTimeout {
		// Each engine's job takes tens of seconds on a busy host.
		o.Timeout = engineSelftestTimeout
	}
	if opts.Only != "" {
		re, err := regexp.Compile(opts.Only)
		if err != nil {
			return aqerr.Usagef("give a regular expression, e.g. --only 'fleet|broker'", "--only %q is not a regular expression: %v", opts.Only, err)
		}
		o.Only = re
	}
	checks := selftest.Select(o)
	if len(checks) == 0 {
		return aqerr.Usagef("`aq selftest --list` names every check", "no check matches --only %q", opts.Only)
	}
	if opts.List {
		return listChecks(f.IO.Out, checks, opts.JSON)
	}

	o.Config, o.ConfigErr = f.Config()
	o.Log = slog.New(slog.DiscardHandler)
	if o.Config != nil && o.Config.LogLevel == "debug" {
		o.Log = logging.New(f.IO.Err, o.Config.LogFormat, o.Config.LogLevel, f.Redactor())
	}
	out := f.IO.Out
	if !opts.JSON {
		hostN, pipeN, engN := 0, 0, 0
		for _, c := range checks {
			switch c.Group {
			case selftest.GroupHost:
				hostN++
			case selftest.GroupEngines:
				engN++
			default:
				pipeN++
			}
		}
		if engN > 0 {
			fmt.Fprintf(out, "aq selftest: %d checks (host %d, pipeline %d, engines %d)\n", len(checks), hostN, pipeN, engN)
		} else {
			fmt.Fprintf(out, "aq selftest: %d checks (host %d, pipeline %d)\n", len(checks), hostN, pipeN)
		}
		width := 0
		for _, c := range checks {
			width = max(width, len(c.Name))
		}
		o.OnResult = func(r selftest.Result) {
			fmt.Fprintf(out, "%s  %-*s  %7s  %s\n", strings.ToUpper(string(r.Status)), width, r.Name, durationText(r.Duration), r.Reason)
		}
	}
	rep, err := selftest.Run(ctx, o)
	if err != nil {
		return aqerr.Wrap(aqerr.Failed, err, "selftest: "+err.Error(), "")
	}
	if opts.JSON {
		if err := writeReport(out, rep); err != nil {
			return err
		}
	} else {
		c := rep.Counts
		fmt.Fprintf(out, "%d checks: %d passed, %d failed, %d skipped in %s\n", c.Total, c.Pass, c.Fail, c.Skip,
			(time.Duration(rep.DurationMS) * time.Millisecond).Round(100*time.Millisecond))
		if failed := rep.Failed(); len(failed) > 0 {
			names := make([]string, len(failed))
			for i, r := range failed {
				names[i] = r.Name
			}
			fmt.Fprintf(out, "failed: %s\n", strings.Join(names, ", "))
		}
	}
	if !rep.OK {
		return &aqerr.Silent{Code: aqerr.Failed}
	}
	return nil
}

func listChecks(w io.Writer, checks []selftest.Check, asJSON bool) error {
	if asJSON {
		return writeReport(w, checks)
	}
	tw := table(w)
	for _, c := range checks {
		fmt.Fprintf(tw, "%s\t%s\n", c.Name, c.Description)
	}
	return tw.Flush()
}

// writeReport prints v as indented JSON, leaving <, > and & as they are
// (reasons quote versions such as ">= 2.36").
func writeReport(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetEscapeHTML(false)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// durationText is a check's duration for the text report.
func durationText(d time.Duration) string {
	switch {
	case d < time.Millisecond:
		return "0ms"
	case d < time.Second:
		return fmt.Sprintf("%dms", d.Milliseconds())
	}
	return fmt.Sprintf("%.1fs", d.Seconds())
}
