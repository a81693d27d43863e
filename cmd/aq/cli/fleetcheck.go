package cli

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/aqfleet/aq/agent/config"
	"github.com/aqfleet/aq/agent/fleet"
	"github.com/aqfleet/aq/agent/fleetcheck"
	"github.com/aqfleet/aq/internal/aqerr"
	"github.com/aqfleet/aq/internal/version"
)

func init() { register(newFleetCmd) }

func newFleetCmd(f *Factory) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "fleet",
		Short: "The fleet's coordinator: check it against aq's contract",
		Args:  cobra.NoArgs,
		RunE:  func(cmd *cobra.Command, args []string) error { return cmd.Help() },
	}
	cmd.AddCommand(newFleetCheckCmd(f))
	return cmd
}

type fleetCheckOptions struct {
	JSON    bool
	Park    time.Duration
	Product string
}

func newFleetCheckCmd(f *Factory) *cobra.Command {
	opts := &fleetCheckOptions{}
	cmd := &cobra.Command{
		Use:   "check [--json] [--park D] [--product ID]",
		Short: "Check a coordinator against aq's fleet contract: what is there, what is missing, what is wrong",
		Long: `Run aq's fleet contract (docs/contract.md) against the coordinator at
AQ_FLEET_API and print, per route and rule, present, missing or wrong, and
what aq does about it.

The check enrolls a factory of its own (aq-check-<nonce>) with the
enrollment token in AQ_FLEET_TOKEN — it never uses or changes this host's
$AQ_HOME/credentials — and submits two jobs of its own, on product
aq-fleet-check (--product) and repository aq-check-<nonce>, each needing
the capability has:aq-check-<nonce> that no factory offers, so no real
factory takes them.
It takes them through claim and accept, renewals, stage reports and their
re-sends, a stale epoch's writes, a re-sent checkpoint, a park with
notBefore (it waits --park for the job to come back), release,
/fleet/fail, artifacts, operator reads and an action, a replace, then ends
both jobs, gives back every lease it holds, removes the jobs and
deregisters. It runs no engine and touches no repository. A coordinator
without the remove route keeps the jobs' records: the check names them. A real job that a claim hands the
check (one that needs no capability the check lacks) is given back at
once, unstarted, and named.

missing means aq falls back (the last column says how); wrong means aq
cannot work correctly against this coordinator.

Exit status: 0 nothing wrong (missing routes have fallbacks); 1 a route or
rule is wrong, or the check could not finish; 2 no AQ_FLEET_API or
enrollment token, or the URL is unreachable or not an aq coordinator; 5
the coordinator refused the enrollment token.

--json prints {api, factoryId, productId, repo, jobs[], rows:[{id,
section, check, route, verdict, seen?, aq?}], left:[{kind, id, state}],
incomplete?}; verdict is present, missing, wrong or "not checked".`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			return runFleetCheck(cmd.Context(), f, opts)
		},
	}
	cmd.Flags().BoolVar(&opts.JSON, "json", false, "print the report as JSON")
	cmd.Flags().DurationVar(&opts.Park, "park", fleetcheck.DefaultPark, "how long the park check holds its job (notBefore): the check waits this long")
	cmd.Flags().StringVar(&opts.Product, "product", fleetcheck.ProductID, "the product the check's jobs are tagged with (x-product-id): a test product of the coordinator's")
	return configFlags(cmd, config.GroupFleet)
}

func runFleetCheck(ctx context.Context, f *Factory, opts *fleetCheckOptions) error {
	if opts.Park < time.Second {
		return aqerr.Usagef("give --park a duration of a second or more, e.g. 15s", "--park %s is too short", opts.Park)
	}
	cfg, err := f.Config()
	if err != nil {
		return err
	}
	if cfg.FleetAPI == "" {
		return aqerr.Usagef("set AQ_FLEET_API (or --fleet-api) to the coordinator's base URL, e.g. https://host/api", "aq fleet check needs the coordinator's URL")
	}
	if cfg.FleetToken == "" {
		return aqerr.Usagef("set AQ_FLEET_TOKEN (or --fleet-token-file) to an enrollment token: the check enrolls a factory of its own and never acts as this host's",
			"aq fleet check needs an enrollment token")
	}
	log := slog.New(slog.DiscardHandler) // the table says what the client would warn about
	if cfg.LogLevel == "debug" {
		log = f.Logger()
	}
	rep, err := fleetcheck.Run(ctx, fleetcheck.Options{API: cfg.FleetAPI, EnrollToken: cfg.FleetToken, Park: opts.Park, Product: opts.Product,
		Redactor: f.Redactor(), Log: log, Version: version.Get().Version})
	if err != nil {
		return fleetCheckError(err)
	}
	if opts.JSON {
		err = writeJSON(f.IO.Out, rep)
	} else {
		err = fleetcheck.Render(f.IO.Out, rep)
	}
	if err != nil {
		return err
	}
	var wrong []string
	for _, r := range rep.Rows {
		if r.Verdict == fleetcheck.Wrong {
			wrong = append(wrong, r.Check)
		}
	}
	switch {
	case len(wrong) > 0:
		return aqerr.New(aqerr.Failed, fmt.Sprintf("the coordinator at %s breaks the fleet contract: %s", rep.API, strings.Join(wrong, "; ")),
			"docs/contract.md says what each route and rule must do")
	case rep.Incomplete != "":
		return aqerr.New(aqerr.Failed, "the check could not finish: "+rep.Incomplete, "run it again; the rows it reached are above")
	}
	return nil
}

// fleetCheckError maps what stopped the check before its table.
func fleetCheckError(err error) error {
	var (
		nc *fleetcheck.NotCoordinatorError
		oe *fleetcheck.OptionError
		ae *fleet.AuthError
	)
	switch {
	case errors.As(err, &oe):
		return aqerr.Wrap(aqerr.Usage, err, oe.What, oe.Fix)
	case errors.As(err, &nc):
		return aqerr.Wrap(aqerr.Usage, err, nc.Error(), nc.Fix())
	case errors.As(err, &ae):
		return aqerr.Wrap(aqerr.AuthFail, err, fmt.Sprintf("the coordinator refused AQ_FLEET_TOKEN as an enrollment token (%d)", ae.Status),
			"aq fleet check enrolls a factory of its own: set AQ_FLEET_TOKEN to an enrollment token the coordinator issued")
	case errors.Is(err, fleetcheck.ErrNoToken):
		return aqerr.Wrap(aqerr.Usage, err, err.Error(), "set AQ_FLEET_TOKEN (or --fleet-token-file)")
	}
	return fleetError(err)
}
