package cli

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/spf13/cobra"

	"github.com/aqfleet/aq/agent/config"
	"github.com/aqfleet/aq/agent/manifest"
	"github.com/aqfleet/aq/agent/preflight"
	"github.com/aqfleet/aq/internal/aqerr"
	"github.com/aqfleet/aq/internal/mdmeta"
	"github.com/aqfleet/aq/internal/sandbox"
	"github.com/aqfleet/aq/job"
	"github.com/aqfleet/aq/profiles"
)

func init() { register(newValidateCmd) }

type validateOptions struct {
	Files []string
	JSON  bool
}

func newValidateCmd(f *Factory) *cobra.Command {
	opts := &validateOptions{}
	cmd := &cobra.Command{
		Use:   "validate FILE.md...",
		Short: "Check job manifests: an ok line per valid file (--json: the normalised jobs), or every error as FILE:LINE",
		Long: `Parse each job manifest (YAML front matter + markdown prompt), merge its
profile (embedded, or $AQ_HOME/profiles/NAME.md) and apply the defaults.

Each valid file prints "ok FILE id=... repo=... engine=..." on stdout; every
problem prints one "FILE:LINE: what is wrong (how to fix)" line on stderr,
all problems of a file at once. A valid job that this host could not run or
ship — its engine not installed, its repository not under AQ_REPO_BASE nor
in AQ_REPO_URLS, gh missing for ship: pr or merge — gets a "FILE: warning:"
line on stderr; it stays valid (another host may have what this one lacks). With --json, stdout is a JSON array of the
valid jobs, normalised (the fields of 'aq validate --json' are stable).

Exit status: 0 all files are valid, 1 any file is invalid, 2 usage or
configuration error: a file that does not exist or cannot be read, or a
broken $AQ_HOME/profiles file.`,
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) == 0 {
				return aqerr.Usagef("name one or more manifests, e.g. aq validate jobs/*.md", "no manifest files given")
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			opts.Files = args
			return runValidate(f, opts)
		},
	}
	cmd.Flags().BoolVar(&opts.JSON, "json", false, "print the valid jobs as a JSON array of normalised jobs")
	// Where the warnings look for the job's repository.
	config.AddKeyFlags(cmd.Flags(), "repo_base", "repo_urls")
	return cmd
}

// warnHost prints, for a valid job, what this host lacks to run and ship
// it (agent/preflight): one "FILE: warning: ..." line each on stderr. They
// are warnings: the job is valid and, with submit, queued. fleet adds that
// another factory may have what this host lacks.
func warnHost(f *Factory, file string, j *job.Job, fleet bool) {
	cfg, err := f.Config()
	if err != nil {
		return
	}
	red := f.Redactor()
	host := preflight.Host{RepoBase: cfg.RepoBase, RepoURLs: cfg.RepoURLs, Engines: cfg.RunEngines(fleet)}
	host.Visible, host.Home = sandboxVisible(cfg)
	for _, w := range preflight.Check(j, host) {
		if fleet {
			w += " — in fleet mode the coordinator may give it to a factory that has it"
		}
		fmt.Fprintln(f.IO.Err, red.String(file+": warning: "+w))
	}
}

// sandboxVisible is what a job's sandbox on this host shows of a host path
// (sandbox.Policy.Visible, for the paths every job has: the home, aq's
// trees, the engine's PATH, AQ_SANDBOX_WRITABLE), and the home; nil with
// AQ_SANDBOX=off.
func sandboxVisible(cfg *config.Config) (func(string) (bool, string), string) {
	home, _ := os.UserHomeDir()
	if cfg.Sandbox == sandbox.ModeOff {
		return nil, home
	}
	var hide []string
	for _, h := range []string{cfg.Home, cfg.RepoBase, cfg.RepoMirror} {
		if h != "" {
			hide = append(hide, h)
		}
	}
	p := sandbox.NewPolicy(sandbox.Paths{Home: home, Hide: hide, Env: os.Environ(), Shared: cfg.SandboxWritable})
	return p.Visible, home
}

func runValidate(f *Factory, opts *validateOptions) error {
	cat, err := loadProfiles(f)
	if err != nil {
		return err
	}
	jobs := []*job.Job{}
	bad, unreadable := 0, 0
	for _, file := range opts.Files {
		j, err := manifest.ParseFile(file, cat)
		if err != nil {
			bad++
			var ue *manifest.UnreadableError
			if errors.As(err, &ue) {
				unreadable++
			}
			printProblems(f, err)
			continue
		}
		jobs = append(jobs, j)
		if !opts.JSON {
			fmt.Fprintf(f.IO.Out, "ok %s id=%s repo=%s engine=%s\n", file, j.ID, j.Repo, j.Engine)
		}
		warnHost(f, file, j, false)
	}
	if opts.JSON {
		if err := writeJSON(f.IO.Out, jobs); err != nil {
			return err
		}
	}
	switch {
	case unreadable > 0:
		// A path that names no readable file is the command line's mistake.
		return &aqerr.Silent{Code: aqerr.Usage}
	case bad > 0:
		return &aqerr.Silent{Code: aqerr.Failed}
	}
	return nil
}

// loadProfiles returns the embedded profiles with $AQ_HOME/profiles laid
// over them. A broken override is a configuration error (exit 2): its
// problems are printed one per line.
func loadProfiles(f *Factory) (*profiles.Catalog, error) {
	cfg, err := f.Config()
	if err != nil {
		return nil, err
	}
	cat, err := profiles.Load(filepath.Join(cfg.Home, "profiles"))
	if err != nil {
		printProblems(f, err)
		return nil, &aqerr.Silent{Code: aqerr.Usage}
	}
	return cat, nil
}

// printProblems writes each FILE:LINE problem on its own stderr line,
// redacted (a manifest may quote a secret by mistake).
func printProblems(f *Factory, err error) {
	var es mdmeta.Errors
	if !errors.As(err, &es) {
		es = mdmeta.Errors{{Msg: err.Error()}}
	}
	red := f.Redactor()
	for _, e := range es {
		_, _ = io.WriteString(f.IO.Err, red.String(e.Error())+"\n")
	}
}
