package cli

import (
	"errors"
	"fmt"
	"io"
	"path/filepath"

	"github.com/spf13/cobra"

	"github.com/aqfleet/aq/agent/manifest"
	"github.com/aqfleet/aq/internal/aqerr"
	"github.com/aqfleet/aq/internal/mdmeta"
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
		Short: "Check job manifests: print each normalised job, or every error as FILE:LINE",
		Long: `Parse each job manifest (YAML front matter + markdown prompt), merge its
profile (embedded, or $AQ_HOME/profiles/NAME.md) and apply the defaults.

Each valid file prints "ok FILE id=... repo=... engine=..." on stdout; every
problem prints one "FILE:LINE: what is wrong (how to fix)" line on stderr,
all problems of a file at once. With --json, stdout is a JSON array of the
valid jobs, normalised (the fields of 'aq validate --json' are stable).

Exit status: 0 all files are valid, 1 any file is invalid or unreadable,
2 usage or configuration error (such as a broken $AQ_HOME/profiles file).`,
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
	return cmd
}

func runValidate(f *Factory, opts *validateOptions) error {
	cat, err := loadProfiles(f)
	if err != nil {
		return err
	}
	jobs := []*job.Job{}
	bad := 0
	for _, file := range opts.Files {
		j, err := manifest.ParseFile(file, cat)
		if err != nil {
			bad++
			printProblems(f, err)
			continue
		}
		jobs = append(jobs, j)
		if !opts.JSON {
			fmt.Fprintf(f.IO.Out, "ok %s id=%s repo=%s engine=%s\n", file, j.ID, j.Repo, j.Engine)
		}
	}
	if opts.JSON {
		if err := writeJSON(f.IO.Out, jobs); err != nil {
			return err
		}
	}
	if bad > 0 {
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
