// Package cli is aq's command line: one cobra command per file, each an
// options struct, a constructor that binds flags, and a run function that calls
// into the packages that do the work. Only Main prints errors and maps them to
// exit codes (README.md, "Exit codes").
package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"sync"
	"syscall"

	"github.com/spf13/cobra"
	"golang.org/x/term"

	"github.com/aqfleet/aq/agent/config"
	"github.com/aqfleet/aq/agent/local"
	"github.com/aqfleet/aq/agent/queue"
	"github.com/aqfleet/aq/internal/aqerr"
	"github.com/aqfleet/aq/internal/logging"
	"github.com/aqfleet/aq/internal/process"
	"github.com/aqfleet/aq/internal/sandbox"
	"github.com/aqfleet/aq/internal/secrets"
	"github.com/aqfleet/aq/internal/termstyle"
	"github.com/aqfleet/aq/job"
)

// IO is where a command reads and writes. User output goes to Out; logs and
// diagnostics to Err, so that --json output is never corrupted.
type IO struct {
	In  io.Reader
	Out io.Writer
	Err io.Writer
	// OutTTY/ErrTTY say whether Out/Err are terminals (live progress lines).
	OutTTY bool
	ErrTTY bool
}

// Factory hands commands their dependencies, built lazily so that `aq version`
// or `aq validate` never load more than they need, and never dial anything.
type Factory struct {
	IO    IO
	Flags func() *cobra.Command // the root, whose persistent flags hold the global config keys
	// Supervisor is the executable that supervises engines (aq itself);
	// Main sets it, in-process test runs leave it empty.
	Supervisor string

	// active is the command being run: its flags (its own configuration
	// groups and the root's global ones) are what Config reads.
	active *cobra.Command

	cfgOnce sync.Once
	cfg     *config.Config
	cfgErr  error

	logOnce sync.Once
	logger  *slog.Logger

	redOnce  sync.Once
	redactor *secrets.Redactor

	localOnce sync.Once
	local     *local.Agent
	localErr  error

	obs observeState // traces and notifications (observe.go)

	// noColor is --no-color: nothing styled, as NO_COLOR (termstyle.Plain).
	noColor bool
	// quietInfo keeps info and debug lines off a terminal's live view
	// (aq run without -v): the logger logs warnings and errors only.
	quietInfo bool
}

// Plain says whether output must carry no colour or style (--no-color,
// NO_COLOR, TERM=dumb).
func (f *Factory) Plain() bool { return termstyle.Plain(f.noColor, os.Getenv) }

// Local builds the local agent (queue, runner, profiles) once.
func (f *Factory) Local() (*local.Agent, error) {
	f.localOnce.Do(func() {
		cfg, err := f.Config()
		if err != nil {
			f.localErr = err
			return
		}
		f.local, f.localErr = local.New(cfg, f.Logger(), f.Redactor(), local.Parts{Queue: []queue.Option{f.queueWait()}})
	})
	return f.local, f.localErr
}

// queueWait makes the queue's lock waits obey the command's context
// (Ctrl-C, SIGTERM) and say, after a second, what they wait for.
func (f *Factory) queueWait() queue.Option {
	ctx := context.Background()
	if f.active != nil && f.active.Context() != nil {
		ctx = f.active.Context()
	}
	return queue.WithWait(ctx, func(msg string) { fmt.Fprintln(f.IO.Err, "aq: "+msg) })
}

// Config loads and validates the configuration once.
func (f *Factory) Config() (*config.Config, error) {
	f.cfgOnce.Do(func() {
		fs := f.Flags().PersistentFlags()
		if f.active != nil {
			fs = f.active.Flags()
		}
		f.cfg, f.cfgErr = config.Load(fs)
		if f.cfg != nil {
			f.cfg.Supervisor = f.Supervisor
		}
	})
	return f.cfg, f.cfgErr
}

// Redactor masks aq's secrets and every secret-named environment value.
func (f *Factory) Redactor() *secrets.Redactor {
	f.redOnce.Do(func() {
		f.redactor = secrets.FromEnviron()
		if c, err := f.Config(); err == nil {
			f.redactor.Add(c.Secrets()...)
		}
	})
	return f.redactor
}

// Logger is the one slog logger, on stderr, formatted per configuration.
func (f *Factory) Logger() *slog.Logger {
	f.logOnce.Do(func() {
		format, level := "text", "info"
		if c, err := f.Config(); err == nil {
			format, level = c.LogFormat, c.LogLevel
		}
		if f.quietInfo && logging.ParseLevel(level) < slog.LevelWarn {
			level = "warn"
		}
		f.logger = logging.New(f.IO.Err, format, level, f.Redactor())
	})
	return f.logger
}

// Main runs aq with the process's arguments and standard streams under a
// context that is cancelled on SIGINT/SIGTERM, and returns the exit code.
func Main() int {
	// A sandbox's init and an engine's supervisor are aq re-executed: they
	// must not parse a command line or start anything else
	// (internal/sandbox, init_linux.go; internal/process, supervise.go).
	if code, ok := sandbox.MaybeInit(); ok {
		return code
	}
	if code, ok := process.MaybeSupervise(); ok {
		return code
	}
	io := IO{
		In: os.Stdin, Out: os.Stdout, Err: os.Stderr,
		OutTTY: term.IsTerminal(int(os.Stdout.Fd())),
		ErrTTY: term.IsTerminal(int(os.Stderr.Fd())),
	}
	exe, err := os.Executable()
	if err != nil {
		fmt.Fprintln(io.Err, "aq: cannot find its own executable to supervise engines with:", err)
		return int(aqerr.Failed)
	}
	bound, err := stopBound(os.Getenv)
	if err != nil {
		fmt.Fprintln(io.Err, "aq: "+aqerr.Message(err))
		return int(aqerr.ExitCode(err))
	}
	// Signals always win (stop.go): the command runs beside a watch that
	// abandons it a bounded time after the stop began.
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM)
	defer signal.Stop(sigs)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan int, 1)
	go func() { done <- run(ctx, os.Args[1:], io, exe) }()
	return awaitStop(done, sigs, cancel, stopStage(os.Args[1:]), bound, commandName(os.Args[1:]), io.Err)
}

// Run executes one aq command line and returns its exit code. Errors are
// printed here, once, as one line on stderr.
func Run(ctx context.Context, args []string, io IO) int { return run(ctx, args, io, "") }

// run is Run with the engines' supervisor (Main passes aq's own path).
func run(ctx context.Context, args []string, io IO, supervisor string) int {
	f := &Factory{IO: io, Supervisor: supervisor}
	root := NewRoot(f)
	f.Flags = func() *cobra.Command { return root }
	root.SetArgs(args)
	root.SetIn(io.In)
	root.SetOut(io.Out)
	root.SetErr(io.Err)
	err := root.ExecuteContext(ctx)
	f.closeObserve()
	if err == nil {
		return int(aqerr.OK)
	}
	code := aqerr.ExitCode(err)
	if !aqerr.IsSilent(err) {
		// An error may quote what a coordinator, a manifest or an engine
		// said: shown, never obeyed (no escape sequence reaches a terminal).
		msg := job.Printable(f.Redactor().String(aqerr.Message(err)), false)
		fmt.Fprintln(io.Err, "aq: "+msg)
	}
	return int(code)
}

// NewRoot builds the command tree.
func NewRoot(f *Factory) *cobra.Command {
	var showVersion bool
	root := &cobra.Command{
		Use:   "aq",
		Short: "aq: the factory agent that runs coding engines on jobs in isolated git worktrees",
		Long: `aq turns a machine into a factory: it takes coding jobs (markdown manifests),
runs an engine (claude, codex, devin or a script) on the job's repository in an
isolated git worktree, checkpoints work in progress and ships a branch or PR.

Local mode (default) takes jobs from a folder queue under $AQ_HOME/queue.
Fleet mode (AQ_FLEET=1) takes them from the coordinator.`,
		SilenceErrors: true,
		SilenceUsage:  true,
		// Completion comes from cobra's default `completion` command.
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) > 0 {
				return aqerr.Usagef("run 'aq --help' for the list of commands", "unknown command %q", args[0])
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			if showVersion {
				return runVersion(f, &versionOptions{})
			}
			return cmd.Help()
		},
	}
	// --version and -v are the root's own (a local flag): `aq gc -v` stays
	// gc's --verbose.
	root.Flags().BoolVarP(&showVersion, "version", "v", false, "print the version, commit and Go version, as aq version does")
	config.AddFlags(root.PersistentFlags(), config.GroupGlobal)
	root.PersistentFlags().BoolVar(&f.noColor, "no-color", false, "no colours or styles on a terminal (as NO_COLOR=1 does)")
	root.SetUsageTemplate(usageTemplate)
	root.PersistentPreRunE = func(cmd *cobra.Command, _ []string) error {
		f.active = cmd
		// Every command, including those that load no configuration
		// (aq version): a wrong --log-format is a usage error, not ignored.
		if fl := cmd.Flags().Lookup("log-format"); fl != nil && fl.Changed && fl.Value.String() != "text" && fl.Value.String() != "json" {
			return aqerr.Usagef("use --log-format text or --log-format json", "--log-format %q is not a log format", fl.Value.String())
		}
		return nil
	}
	root.SetFlagErrorFunc(func(c *cobra.Command, err error) error {
		return aqerr.Usagef(fmt.Sprintf("run '%s --help'", c.CommandPath()), "%v", err)
	})
	root.AddCommand(
		newVersionCmd(f),
		newConfigCmd(f),
	)
	for _, add := range extraCommands {
		root.AddCommand(add(f))
	}
	wrapArgs(root)
	return root
}

// extraCommands lets each command file register itself (in its init), so
// that adding a command does not mean editing this file.
var extraCommands []func(*Factory) *cobra.Command

func register(c func(*Factory) *cobra.Command) { extraCommands = append(extraCommands, c) }

// wrapArgs turns cobra's argument-count errors into usage errors (exit 2).
func wrapArgs(c *cobra.Command) {
	if c.Args != nil {
		orig := c.Args
		c.Args = func(cmd *cobra.Command, args []string) error {
			if err := orig(cmd, args); err != nil {
				var typed *aqerr.Error
				if errors.As(err, &typed) {
					return err
				}
				return aqerr.Usagef("run '"+cmd.CommandPath()+" --help'", "%v", err)
			}
			return nil
		}
	}
	for _, sub := range c.Commands() {
		wrapArgs(sub)
	}
}
