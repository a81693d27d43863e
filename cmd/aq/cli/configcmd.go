package cli

import (
	"fmt"

	"github.com/aqfleet/aq/agent/config"
	"github.com/spf13/cobra"
)

type configOptions struct {
	JSON bool
}

func newConfigCmd(f *Factory) *cobra.Command {
	opts := &configOptions{}
	cmd := &cobra.Command{
		Use:   "config",
		Short: "Show every effective configuration key, its value and where it came from",
		Long: `Show every configuration key with its effective value and its source:
flag, env, file, default or derived. Secrets are shown as ***.
Precedence: flag > environment > config file > default.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			return runConfig(f, opts)
		},
	}
	cmd.Flags().BoolVar(&opts.JSON, "json", false, "print as JSON: [{key, value, source, origin, env, flag, secret}]")
	return configFlags(cmd, config.GroupRepo, config.GroupFleet, config.GroupBroker, config.GroupEngine, config.GroupDaemon, config.GroupObserve, config.GroupGC)
}

func runConfig(f *Factory, opts *configOptions) error {
	cfg, err := f.Config()
	if err != nil {
		return err
	}
	settings := cfg.Settings()
	if opts.JSON {
		return writeJSON(f.IO.Out, settings)
	}
	tw := table(f.IO.Out)
	fmt.Fprintln(tw, "KEY\tVALUE\tSOURCE\tENV\tFLAG")
	for _, s := range settings {
		src := string(s.Source)
		if s.Origin != "" && s.Source != "flag" {
			src += " (" + s.Origin + ")"
		}
		if src == "" {
			src = "unset"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", s.Key, s.Value, src, s.Env, s.Flag)
	}
	return tw.Flush()
}
