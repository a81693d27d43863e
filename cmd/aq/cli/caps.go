package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/aqfleet/aq/agent/caps"
	"github.com/aqfleet/aq/agent/config"
	"github.com/aqfleet/aq/agent/holds"
	"github.com/aqfleet/aq/agent/repos"
	"github.com/aqfleet/aq/agent/runner"
	"github.com/aqfleet/aq/engines"
	"github.com/aqfleet/aq/internal/aqerr"
)

func init() { register(newCapsCmd) }

type capsOptions struct {
	JSON         bool
	ProbeTimeout time.Duration
	HelpTimeout  time.Duration // 0: engines.DefaultHelpTimeout
}

func newCapsCmd(f *Factory) *cobra.Command {
	opts := &capsOptions{}
	cmd := &cobra.Command{
		Use:   "caps",
		Short: "Show this host's capabilities, engines and local repositories",
		Long: `Detect what this host offers to jobs, as capability tokens (docs/manifest.md):

  os:<goos> arch:<goarch>   this build's platform
  engine:<name>             claude, codex, devin when their binary is on PATH
                            (version from '<bin> --version') and its --help
                            has every flag aq needs; engine:script always
  node:<major>              from 'node --version'
  has:<tool>                a tool on PATH (presence only); aq looks for:
                            ` + wrapWords(caps.DefaultTools(), 50, "\n                            ") + `
  repo:<name>               each git repository directly under AQ_REPO_BASE
  sandbox:<level>           the level engines run sandboxed at here
                            (AQ_SANDBOX; docs/sandbox.md): full offers
                            sandbox:full and sandbox:partial, partial
                            sandbox:partial, unsandboxed neither

A job runs here only if every capability it requires is offered.
The sandbox section says which of its guarantees (files, network,
processes, stragglers, limits) hold on this host, and why the others
are missing (a trial sandbox, about 10 ms, finds out).
Version probes run at once, each bounded by --probe-timeout; a probe that
fails or hangs leaves the engine listed without a version, and a note.
Each engine's --help is probed for the flags aq passes (docs/engines.md
lists them), bounded by 10s (or --probe-timeout when given) and cached per binary in
$AQ_HOME/engines/probes.json: flags lists those found, dropped the
optional ones the CLI lacks (aq runs without them), and refused says why
an engine is not offered (a required flag missing, a --help that fails or
hangs). Engines held until their rate or usage limit resets are listed.

--json prints one object:
  {tokens[], os, arch, engines:[{name, path, version, builtin?, flags[],
   dropped[], refused?}], node, tools:{tool: path}, toolsProbed[], repos[],
   repoBase, sandbox:{mode, level, mechanism?, holds[], missing:[{guarantee,
   why}], landlockAbi, userns?, cgroup?, cgroupWhy?, refused?}, notes[],
   holds:[{engine, until, why, job, since}]}
node is null when node is absent or its version unreadable; path and version
are "" when unknown; lists are [] (never null).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if cmd.Flags().Changed("probe-timeout") {
				opts.HelpTimeout = opts.ProbeTimeout
			}
			return runCaps(cmd.Context(), f, opts)
		},
	}
	cmd.Flags().BoolVar(&opts.JSON, "json", false, "print as JSON: {tokens, os, arch, engines, node, tools, toolsProbed, repos, repoBase, sandbox, notes, holds}")
	cmd.Flags().DurationVar(&opts.ProbeTimeout, "probe-timeout", caps.DefaultProbeTimeout, "time each '<bin> --version' probe may take (and, when given, each --help probe: 10s otherwise)")
	config.AddKeyFlags(cmd.Flags(), "sandbox")
	return configFlags(cmd, config.GroupRepo)
}

// capsReport is the stable --json form of `aq caps`.
type capsReport struct {
	Tokens      []string          `json:"tokens"`
	OS          string            `json:"os"`
	Arch        string            `json:"arch"`
	Engines     []caps.EngineInfo `json:"engines"`
	Node        *int              `json:"node"`
	Tools       map[string]string `json:"tools"`
	ToolsProbed []string          `json:"toolsProbed"`
	Repos       []string          `json:"repos"`
	RepoBase    string            `json:"repoBase"`
	// Sandbox is how engines run here (AQ_SANDBOX and the host's probe).
	Sandbox *caps.Sandbox `json:"sandbox"`
	Notes   []string      `json:"notes"`
	// Holds are the engines held until their limit resets (agent/holds).
	Holds []holds.Hold `json:"holds"`
}

func newCapsReport(h *caps.Host) capsReport {
	r := capsReport{
		Tokens:      h.Tokens(),
		OS:          h.OS,
		Arch:        h.Arch,
		Engines:     nonNil(h.Engines),
		Tools:       h.Tools,
		ToolsProbed: nonNil(h.ToolsProbed),
		Repos:       nonNil(h.Repos),
		RepoBase:    h.RepoBase,
		Sandbox:     h.Sandbox,
		Notes:       nonNil(h.Notes),
		Holds:       []holds.Hold{},
	}
	if r.Tools == nil {
		r.Tools = map[string]string{}
	}
	if h.Node > 0 {
		n := h.Node
		r.Node = &n
	}
	return r
}

func nonNil[T any](s []T) []T {
	if s == nil {
		return []T{}
	}
	return s
}

func runCaps(ctx context.Context, f *Factory, opts *capsOptions) error {
	if opts.ProbeTimeout <= 0 {
		return aqerr.Usagef("give a positive duration, e.g. --probe-timeout 5s", "--probe-timeout must be positive, got %s", opts.ProbeTimeout)
	}
	cfg, err := f.Config()
	if err != nil {
		return err
	}
	h, err := caps.Detect(ctx, caps.DetectOptions{RepoBase: cfg.RepoBase, ProbeTimeout: opts.ProbeTimeout, HelpTimeout: opts.HelpTimeout,
		Clonable: repos.Clonable(cfg.RepoURLs), Probes: engines.NewProbeCache(runner.ProbeCachePath(cfg.Home)),
		Engines: cfg.RunEngines(useFleet(cfg)), EnginesListed: cfg.EnginesExplicit(),
		Sandbox: runner.OpenSandbox(cfg, nil)}) // shown here, not announced
	if err != nil {
		var typed *aqerr.Error
		switch {
		case errors.As(err, &typed):
			return err
		case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
			return aqerr.Wrap(aqerr.Failed, err, "capability detection was interrupted", "run 'aq caps' again")
		}
		return aqerr.Wrap(aqerr.Failed, err, "capability detection failed: "+err.Error(), "")
	}
	held := holds.Open(runner.HoldsPath(cfg.Home), nil).List()
	if opts.JSON {
		r := newCapsReport(h)
		r.Holds = held
		return writeJSON(f.IO.Out, r)
	}
	if err := printCaps(f.IO.Out, h); err != nil {
		return err
	}
	if len(held) > 0 {
		fmt.Fprintln(f.IO.Out, "\nheld (not run until their limit resets):")
		for _, x := range held {
			fmt.Fprintf(f.IO.Out, "  %s (met by job %s)\n", x, orDash(x.Job))
		}
	}
	return nil
}

func printCaps(w io.Writer, h *caps.Host) error {
	tw := table(w)
	fmt.Fprintf(tw, "platform:\t%s/%s\n", h.OS, h.Arch)
	node := "- (not on PATH, or its version could not be read)"
	if h.Node > 0 {
		node = strconv.Itoa(h.Node)
	}
	fmt.Fprintf(tw, "node:\t%s\n", node)
	fmt.Fprintf(tw, "repo base:\t%s\n", orDash(h.RepoBase))

	fmt.Fprintln(tw, "\nengines:")
	for _, e := range h.Engines {
		switch {
		case e.Builtin:
			fmt.Fprintf(tw, "  %s\t(built in)\n", e.Name)
		default:
			fmt.Fprintf(tw, "  %s\t%s\t%s\n", e.Name, orDash(e.Version), e.Path)
			if e.Refused != "" {
				fmt.Fprintf(tw, "  \trefused:\t%s\n", e.Refused)
			}
			if len(e.Flags) > 0 {
				fmt.Fprintf(tw, "  \tflags:\t%s\n", strings.Join(e.Flags, " "))
			}
			if len(e.Dropped) > 0 {
				fmt.Fprintf(tw, "  \tdropped:\t%s\n", strings.Join(e.Dropped, " "))
			}
		}
	}

	fmt.Fprintln(tw, "\ntools:")
	names := make([]string, 0, len(h.Tools))
	for t := range h.Tools {
		names = append(names, t)
	}
	slices.Sort(names)
	for _, t := range names {
		fmt.Fprintf(tw, "  %s\t%s\n", t, orDash(h.Tools[t]))
	}
	var absent []string
	for _, t := range h.ToolsProbed {
		if _, ok := h.Tools[t]; !ok {
			absent = append(absent, t)
		}
	}
	if len(names) == 0 && len(absent) == 0 {
		fmt.Fprintln(tw, "  none looked for")
	}
	if len(absent) > 0 {
		fmt.Fprintf(tw, "  not found:\t%s\n", strings.Join(absent, " "))
	}

	printSandbox(tw, h.Sandbox)

	fmt.Fprintf(tw, "\nrepos (%d):\n", len(h.Repos))
	for _, r := range h.Repos {
		fmt.Fprintf(tw, "  %s\n", r)
	}

	fmt.Fprintln(tw, "\ntokens:")
	fmt.Fprintf(tw, "  %s\n", strings.Join(h.Tokens(), " "))

	if len(h.Notes) > 0 {
		fmt.Fprintln(tw, "\nnotes:")
		for _, n := range h.Notes {
			fmt.Fprintf(tw, "  - %s\n", n)
		}
	}
	return tw.Flush()
}

// wrapWords joins words with spaces, breaking with sep before a line would
// exceed width.
func wrapWords(words []string, width int, sep string) string {
	var b strings.Builder
	line := 0
	for i, w := range words {
		if i > 0 {
			if line+1+len(w) > width {
				b.WriteString(sep)
				line = 0
			} else {
				b.WriteByte(' ')
				line++
			}
		}
		b.WriteString(w)
		line += len(w)
	}
	return b.String()
}

// printSandbox is the sandbox section of aq caps: the level engines run
// at here, the guarantees that hold, and those missing with why.
func printSandbox(w io.Writer, s *caps.Sandbox) {
	if s == nil {
		return
	}
	fmt.Fprintln(w, "\nsandbox (docs/sandbox.md):")
	level := string(s.Level)
	if s.Mechanism != "" {
		level += " (" + s.Mechanism + ")"
	}
	fmt.Fprintf(w, "  level:\t%s, AQ_SANDBOX=%s\n", level, s.Mode)
	if s.Refused != "" {
		fmt.Fprintf(w, "  refused:\tevery job (sandbox_unavailable): %s\n", s.Lacks())
	}
	holds := make([]string, len(s.Holds))
	for i, g := range s.Holds {
		holds[i] = string(g)
	}
	fmt.Fprintf(w, "  holds:\t%s\n", orDash(strings.Join(holds, " ")))
	for _, m := range s.Missing {
		fmt.Fprintf(w, "  missing:\t%s: %s\n", m.Guarantee, m.Why)
	}
}
