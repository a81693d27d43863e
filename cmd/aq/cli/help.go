package cli

import (
	"strings"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/aqfleet/aq/agent/config"
)

// configFlags gives cmd the typed flags of the configuration groups it
// reads; help lists them under their group's heading.
func configFlags(cmd *cobra.Command, groups ...config.Group) *cobra.Command {
	config.AddFlags(cmd.Flags(), groups...)
	return cmd
}

func init() { cobra.AddTemplateFunc("aqFlags", groupedFlags) }

// groupedFlags renders a command's flags for help: its own first, then the
// configuration flags it reads under their group's heading (Fleet flags,
// Broker flags, …), the global ones last.
func groupedFlags(c *cobra.Command) string {
	own := pflag.NewFlagSet("own", pflag.ContinueOnError)
	byGroup := map[config.Group]*pflag.FlagSet{}
	add := func(fl *pflag.Flag) {
		if fl.Hidden {
			return
		}
		g := fl.Annotations[config.GroupAnnotation]
		if len(g) == 0 {
			own.AddFlag(fl)
			return
		}
		fs := byGroup[config.Group(g[0])]
		if fs == nil {
			fs = pflag.NewFlagSet(g[0], pflag.ContinueOnError)
			byGroup[config.Group(g[0])] = fs
		}
		fs.AddFlag(fl)
	}
	c.LocalFlags().VisitAll(add)
	c.InheritedFlags().VisitAll(add)
	var b strings.Builder
	section := func(title string, fs *pflag.FlagSet) {
		if fs == nil || !fs.HasAvailableFlags() {
			return
		}
		b.WriteString("\n\n" + title + ":\n" + strings.TrimRight(fs.FlagUsages(), " \n"))
	}
	section("Flags", own)
	for _, g := range config.Groups {
		section(g.Title(), byGroup[g])
	}
	return b.String()
}

// usageTemplate is cobra's default with the flag sections replaced by
// groupedFlags.
const usageTemplate = `Usage:{{if .Runnable}}
  {{.UseLine}}{{end}}{{if .HasAvailableSubCommands}}
  {{.CommandPath}} [command]{{end}}{{if gt (len .Aliases) 0}}

Aliases:
  {{.NameAndAliases}}{{end}}{{if .HasExample}}

Examples:
{{.Example}}{{end}}{{if .HasAvailableSubCommands}}

Available Commands:{{range .Commands}}{{if (or .IsAvailableCommand (eq .Name "help"))}}
  {{rpad .Name .NamePadding }} {{.Short}}{{end}}{{end}}{{end}}{{aqFlags .}}{{if .HasHelpSubCommands}}

Additional help topics:{{range .Commands}}{{if .IsAdditionalHelpTopicCommand}}
  {{rpad .CommandPath .CommandPathPadding}} {{.Short}}{{end}}{{end}}{{end}}{{if .HasAvailableSubCommands}}

Use "{{.CommandPath}} [command] --help" for more information about a command.{{end}}
`
