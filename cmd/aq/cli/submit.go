package cli

import (
	"errors"
	"fmt"

	"github.com/spf13/cobra"

	"github.com/aqfleet/aq/agent/config"
	"github.com/aqfleet/aq/agent/manifest"
	"github.com/aqfleet/aq/agent/queue"
	"github.com/aqfleet/aq/internal/aqerr"
	"github.com/aqfleet/aq/job"
)

func init() { register(newSubmitCmd) }

type submitOptions struct {
	Files []string
	JSON  bool
}

// submitted is one accepted job, as `aq submit --json` prints it.
type submitted struct {
	ID    string    `json:"id"`
	Stage job.Stage `json:"stage"`
	File  string    `json:"file"`
}

func newSubmitCmd(f *Factory) *cobra.Command {
	opts := &submitOptions{}
	cmd := &cobra.Command{
		Use:   "submit FILE.md...",
		Short: "Validate job manifests and enqueue them",
		Long: `Validate each manifest, then enqueue it: into $AQ_HOME/queue/inbox (or blocked/,
until its deps ship) in local mode. Nothing is enqueued if any manifest is
invalid. A job whose idempotencyKey matches an existing job is refused with
that job's id. A job this host could not run or ship (its engine not
installed, its repository not found, gh missing for ship: pr or merge) is
queued with a "FILE: warning:" line on stderr saying what is missing.`,
		Args: cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			opts.Files = args
			if fleetRouted(f) { // fleet mode: POST /fleet/jobs (fleet.go)
				return runFleetSubmit(cmd.Context(), f, opts)
			}
			return runSubmit(f, opts)
		},
	}
	cmd.Flags().BoolVar(&opts.JSON, "json", false, "print the accepted jobs as JSON: [{id, stage, file}]")
	return configFlags(cmd, config.GroupRepo, config.GroupFleet)
}

func runSubmit(f *Factory, opts *submitOptions) error {
	a, err := f.Local()
	if err != nil {
		return err
	}
	ms, err := readManifests(f, opts.Files, func(file string, raw []byte) (*job.Job, error) { return manifest.Parse(file, raw, a.Catalog) })
	if err != nil {
		return err
	}
	return submitEach(f, opts, ms, func(s job.Stage) string { return string(s) }, func(m manifestFile) (submitted, error) {
		st, err := a.Queue.Submit(m.j, m.raw)
		if err != nil {
			var dup *queue.DuplicateError
			if errors.As(err, &dup) {
				err = aqerr.Wrap(aqerr.Usage, err, fmt.Sprintf("%s: job %s duplicates job %s (idempotencyKey %q, in %s)", m.file, m.j.ID, dup.ExistingID, dup.Key, dup.Stage), "see `aq job show "+dup.ExistingID+"`")
			}
			return submitted{}, err
		}
		return submitted{ID: st.ID, Stage: st.Stage, File: m.file}, nil
	})
}

// manifestFile is one manifest read and validated for submission.
type manifestFile struct {
	file string
	j    *job.Job
	raw  []byte
}

// readManifests reads and validates every file before anything is
// submitted: a bad file must not leave half a batch queued. Each problem is
// printed on stderr; any bad file is a usage error (exit 2).
func readManifests(f *Factory, files []string, parse func(file string, raw []byte) (*job.Job, error)) ([]manifestFile, error) {
	var ms []manifestFile
	bad := 0
	for _, file := range files {
		raw, err := manifest.ReadFile(file)
		if err != nil {
			printProblems(f, err)
			bad++
			continue
		}
		j, err := parse(file, raw)
		if err != nil {
			printProblems(f, err)
			bad++
			continue
		}
		ms = append(ms, manifestFile{file, j, raw})
	}
	if bad > 0 {
		fmt.Fprintf(f.IO.Err, "aq: %d of %d manifests are invalid; nothing was submitted (fix the lines above, `aq validate` checks without submitting)\n", bad, len(files))
		return nil, &aqerr.Silent{Code: aqerr.Usage}
	}
	return ms, nil
}

// submitEach submits each manifest, prints each refusal on stderr and the
// accepted jobs on stdout ("submitted ID to " + where(stage), or --json);
// the exit code is the first refusal's.
func submitEach(f *Factory, opts *submitOptions, ms []manifestFile, where func(job.Stage) string, submit func(manifestFile) (submitted, error)) error {
	out := []submitted{}
	var firstErr error
	for _, m := range ms {
		s, err := submit(m)
		if err != nil {
			fmt.Fprintln(f.IO.Err, "aq: "+aqerr.Message(err))
			if firstErr == nil {
				firstErr = err
			}
			continue
		}
		out = append(out, s)
		warnHost(f, m.file, m.j, fleetRouted(f))
	}
	if opts.JSON {
		if err := writeJSON(f.IO.Out, out); err != nil {
			return err
		}
	} else {
		for _, s := range out {
			fmt.Fprintf(f.IO.Out, "submitted %s to %s\n", s.ID, where(s.Stage))
		}
	}
	if firstErr != nil {
		return &aqerr.Silent{Code: aqerr.ExitCode(firstErr)}
	}
	return nil
}
