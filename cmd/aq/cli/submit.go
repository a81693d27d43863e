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
	// Replace gives an existing job that is not running the new manifest
	// (a new job when there is none).
	Replace bool
}

// submitted is one accepted job, as `aq submit --json` prints it.
type submitted struct {
	ID    string    `json:"id"`
	Stage job.Stage `json:"stage"`
	File  string    `json:"file"`
	// Replaced is the stage the job was in when --replace gave it this
	// manifest (the coordinator's stage name in fleet mode); empty for a
	// new job.
	Replaced string `json:"replaced,omitempty"`
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
queued with a "FILE: warning:" line on stderr saying what is missing.

--replace undoes a mistake: a job with the manifest's id that is not
running (inbox, blocked, failed or dead_letter) takes the new manifest and
goes back to the inbox (or blocked), keeping its history and attempts; a job
that runs, or whose work is done (review, testing, shipped), is refused and
left as it is. Without such a job the manifest is submitted as new. In fleet
mode through the coordinator (PUT /fleet/jobs/:id).`,
		Args: cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			opts.Files = args
			if fleetRouted(f) { // fleet mode: POST /fleet/jobs (fleet.go)
				return runFleetSubmit(cmd.Context(), f, opts)
			}
			return runSubmit(f, opts)
		},
	}
	cmd.Flags().BoolVar(&opts.JSON, "json", false, "print the accepted jobs as JSON: [{id, stage, file, replaced?}]")
	cmd.Flags().BoolVar(&opts.Replace, "replace", false, "give an existing job that is not running this manifest, keeping its history (a new job when there is none)")
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
		if opts.Replace {
			st, from, err := a.Queue.Replace(m.j, m.raw)
			if err == nil {
				return submitted{ID: st.ID, Stage: st.Stage, File: m.file, Replaced: string(from)}, nil
			}
			if !errors.Is(err, queue.ErrNotFound) {
				return submitted{}, duplicateOf(m, err)
			}
			// No such job: this manifest is a new one.
		}
		st, err := a.Queue.Submit(m.j, m.raw)
		if err != nil {
			return submitted{}, duplicateOf(m, err)
		}
		return submitted{ID: st.ID, Stage: st.Stage, File: m.file}, nil
	})
}

// duplicateOf names the file and the job whose idempotencyKey m's job has.
func duplicateOf(m manifestFile, err error) error {
	var dup *queue.DuplicateError
	if errors.As(err, &dup) {
		return aqerr.Wrap(aqerr.Usage, err, fmt.Sprintf("%s: job %s duplicates job %s (idempotencyKey %q, in %s)", m.file, m.j.ID, dup.ExistingID, dup.Key, dup.Stage), "see `aq job show "+dup.ExistingID+"`")
	}
	return err
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
			if s.Replaced != "" {
				fmt.Fprintf(f.IO.Out, "replaced %s (it was in %s): now in %s\n", s.ID, s.Replaced, where(s.Stage))
				continue
			}
			fmt.Fprintf(f.IO.Out, "submitted %s to %s\n", s.ID, where(s.Stage))
		}
	}
	if firstErr != nil {
		return &aqerr.Silent{Code: aqerr.ExitCode(firstErr)}
	}
	return nil
}
