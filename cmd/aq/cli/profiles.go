package cli

import (
	"fmt"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/aqfleet/aq/internal/aqerr"
	"github.com/aqfleet/aq/internal/mdmeta"
	"github.com/aqfleet/aq/job"
)

func init() { register(newProfilesCmd) }

func newProfilesCmd(f *Factory) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "profiles",
		Short: "List and show the persona/capability profiles jobs can name",
		Long: `Profiles are personas with job defaults (engine, model, capabilities,
budget). They are built into aq; $AQ_HOME/profiles/NAME.md replaces the
built-in profile NAME or adds a new one. A manifest names one with
'profile: NAME' and overrides any of its fields.`,
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) > 0 {
				return aqerr.Usagef("use 'aq profiles list' or 'aq profiles show NAME'", "unknown command %q for aq profiles", args[0])
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error { return cmd.Help() },
	}
	cmd.AddCommand(newProfilesListCmd(f), newProfilesShowCmd(f))
	return cmd
}

type profilesListOptions struct {
	JSON bool
}

func newProfilesListCmd(f *Factory) *cobra.Command {
	opts := &profilesListOptions{}
	cmd := &cobra.Command{
		Use:   "list",
		Short: "List the profiles: name, engine, model, capabilities, budget, source",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			return runProfilesList(f, opts)
		},
	}
	cmd.Flags().BoolVar(&opts.JSON, "json", false, "print as JSON: [{name, engine, model, capabilities, budget, source}]")
	return cmd
}

func runProfilesList(f *Factory, opts *profilesListOptions) error {
	cat, err := loadProfiles(f)
	if err != nil {
		return err
	}
	list := cat.List()
	if opts.JSON {
		for i := range list {
			list[i].Persona = "" // `aq profiles show NAME` has it
		}
		return writeJSON(f.IO.Out, list)
	}
	tw := table(f.IO.Out)
	fmt.Fprintln(tw, "NAME\tENGINE\tMODEL\tCAPABILITIES\tBUDGET\tSOURCE")
	for _, p := range list {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", p.Name, orDash(p.Engine), orDash(p.Model),
			orDash(strings.Join(p.Capabilities, ",")), budgetSummary(p.Budget), p.Source)
	}
	return tw.Flush()
}

type profilesShowOptions struct {
	Name string
	JSON bool
}

func newProfilesShowCmd(f *Factory) *cobra.Command {
	opts := &profilesShowOptions{}
	cmd := &cobra.Command{
		Use:   "show NAME",
		Short: "Show one profile, persona prompt included",
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) != 1 {
				return aqerr.Usagef("run 'aq profiles list' for the names", "aq profiles show takes exactly one profile name")
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			opts.Name = args[0]
			return runProfilesShow(f, opts)
		},
	}
	cmd.Flags().BoolVar(&opts.JSON, "json", false, "print as JSON: {name, engine, model, capabilities, budget, persona, source}")
	return cmd
}

func runProfilesShow(f *Factory, opts *profilesShowOptions) error {
	cat, err := loadProfiles(f)
	if err != nil {
		return err
	}
	p, ok := cat.Get(opts.Name)
	if !ok {
		fix := "known profiles: " + strings.Join(cat.Names(), ", ")
		if s := mdmeta.Suggest(opts.Name, cat.Names()); s != "" {
			fix = fmt.Sprintf("did you mean %q? %s", s, fix)
		}
		return aqerr.Usagef(fix, "no profile named %q", opts.Name)
	}
	if opts.JSON {
		return writeJSON(f.IO.Out, p)
	}
	tw := table(f.IO.Out)
	fmt.Fprintf(tw, "name:\t%s\n", p.Name)
	fmt.Fprintf(tw, "engine:\t%s\n", orDash(p.Engine))
	fmt.Fprintf(tw, "model:\t%s\n", orDash(p.Model))
	fmt.Fprintf(tw, "capabilities:\t%s\n", orDash(strings.Join(p.Capabilities, ", ")))
	fmt.Fprintf(tw, "budget:\t%s\n", budgetSummary(p.Budget))
	fmt.Fprintf(tw, "source:\t%s\n", p.Source)
	if err := tw.Flush(); err != nil {
		return err
	}
	_, err = fmt.Fprintf(f.IO.Out, "\n%s\n", p.Persona)
	return err
}

// budgetSummary renders a budget compactly ("wall=45m usd=5 tokens=2000000
// turns=100"), leaving out unset fields.
func budgetSummary(b job.Budget) string {
	var parts []string
	if b.Wall > 0 {
		parts = append(parts, "wall="+compactDuration(b.Wall.D()))
	}
	if b.USD > 0 {
		parts = append(parts, fmt.Sprintf("usd=%g", b.USD))
	}
	if b.Tokens > 0 {
		parts = append(parts, fmt.Sprintf("tokens=%d", b.Tokens))
	}
	if b.Turns > 0 {
		parts = append(parts, fmt.Sprintf("turns=%d", b.Turns))
	}
	if len(parts) == 0 {
		return "-"
	}
	return strings.Join(parts, " ")
}

// compactDuration is d without zero trailing units: 1h, 1h30m, 45m, 90s.
func compactDuration(d time.Duration) string {
	s := d.String()
	if strings.HasSuffix(s, "m0s") {
		s = strings.TrimSuffix(s, "0s")
	}
	if strings.HasSuffix(s, "h0m") {
		s = strings.TrimSuffix(s, "0m")
	}
	return s
}
