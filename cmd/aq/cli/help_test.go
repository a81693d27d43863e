package cli

import (
	"slices"
	"strings"
	"testing"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/aqfleet/aq/agent/config"
	"github.com/aqfleet/aq/cmd/aq/clitest"
)

// flagsOf lists, for each command path, the configuration keys it offers as
// flags (its own and inherited).
func flagsOf(t *testing.T) map[string][]string {
	t.Helper()
	f := &Factory{}
	root := NewRoot(f)
	f.Flags = func() *cobra.Command { return root }
	out := map[string][]string{}
	var walk func(c *cobra.Command)
	walk = func(c *cobra.Command) {
		var keys []string
		visit := func(fl *pflag.Flag) {
			if len(fl.Annotations[config.GroupAnnotation]) > 0 {
				keys = append(keys, fl.Name)
			}
		}
		c.LocalFlags().VisitAll(visit)
		c.InheritedFlags().VisitAll(visit)
		out[c.CommandPath()] = keys
		for _, sub := range c.Commands() {
			walk(sub)
		}
	}
	walk(root)
	return out
}

// Every key is a flag of a command that reads it, typed, with an
// environment binding; and a command shows only the groups it reads.
func TestEveryKeyIsAFlagOfItsCommands(t *testing.T) {
	byCmd := flagsOf(t)
	offered := map[string][]string{}
	for cmd, flags := range byCmd {
		for _, fl := range flags {
			offered[fl] = append(offered[fl], cmd)
		}
	}
	for _, k := range config.Keys {
		if len(offered[k.Flag]) == 0 {
			t.Errorf("key %s: no command offers --%s", k.Name, k.Flag)
		}
		if len(k.Env) == 0 {
			t.Errorf("key %s has no environment binding", k.Name)
		}
		if k.Group == "" || !slices.Contains(config.Groups, k.Group) {
			t.Errorf("key %s: group %q is not one of %v", k.Name, k.Group, config.Groups)
		}
	}
	tests := []struct {
		cmd        string
		has, hasnt []string
	}{
		{"aq run", []string{"fleet", "sb-namespace", "kill-grace", "repo-base", "home"}, []string{"slots", "drain-timeout", "metrics-addr", "gc-wip-retention"}},
		{"aq daemon", []string{"slots", "drain-timeout", "metrics-addr", "fleet", "sb-topic", "kill-grace"}, []string{"gc-wip-retention"}},
		{"aq gc", []string{"gc-wip-retention", "repo-base"}, []string{"slots", "fleet", "sb-topic"}},
		{"aq servicebus ensure-subscription", []string{"sb-namespace", "factory-id"}, []string{"slots", "kill-grace"}},
		{"aq version", []string{"home", "config", "log-level", "log-format"}, []string{"repo-base", "fleet", "slots"}},
		{"aq validate", nil, []string{"fleet", "slots", "sb-topic"}},
		{"aq config", []string{"slots", "fleet", "sb-topic", "gc-wip-retention", "kill-grace", "repo-base"}, nil},
	}
	for _, tc := range tests {
		flags, ok := byCmd[tc.cmd]
		if !ok {
			t.Errorf("no command %q", tc.cmd)
			continue
		}
		for _, h := range tc.has {
			if !slices.Contains(flags, h) {
				t.Errorf("%s does not offer --%s", tc.cmd, h)
			}
		}
		for _, h := range tc.hasnt {
			if slices.Contains(flags, h) {
				t.Errorf("%s offers --%s, which it does not read", tc.cmd, h)
			}
		}
	}
}

func TestHelpGroupsTypedFlags(t *testing.T) {
	clitest.CleanEnv(t)
	out, _, code := runAQ(t, "daemon", "--help")
	if code != 0 {
		t.Fatalf("exit %d", code)
	}
	for _, want := range []string{"\nFlags:\n", "\nFleet flags:\n", "\nBroker flags:\n", "\nDaemon flags:\n", "\nGlobal flags:\n",
		"--slots int", "--drain-timeout duration", "--heartbeat-sec int", "--fleet  ", "(default 30)"} {
		if !strings.Contains(out, want) {
			t.Errorf("aq daemon --help lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "--fleet string") || strings.Contains(out, "--slots string") {
		t.Errorf("flags still typed string:\n%s", out)
	}
	if i, j := strings.Index(out, "Fleet flags:"), strings.Index(out, "Global flags:"); i < 0 || j < i {
		t.Errorf("global flags must come last:\n%s", out)
	}
}

// A typed flag refuses a value of the wrong type at parse time: one line,
// exit 2; the same value from the environment is refused by Load.
func TestTypedFlagRefusesWrongType(t *testing.T) {
	clitest.CleanEnv(t)
	for _, args := range [][]string{
		{"daemon", "--slots", "two"},
		{"run", "--kill-grace", "soon"},
		{"run", "--fleet=maybe"},
		{"daemon", "--idle-timeout", "soon"},
		{"daemon", "--max-jobs", "-1"},
	} {
		_, errOut, code := runAQ(t, args...)
		lines := strings.Split(strings.TrimRight(errOut, "\n"), "\n")
		if code != 2 || len(lines) != 1 || !strings.HasPrefix(lines[0], "aq: ") || !strings.Contains(lines[0], strings.SplitN(args[1], "=", 2)[0]) {
			t.Errorf("%v: exit %d, stderr %q; want exit 2 and one line naming the flag", args, code, errOut)
		}
	}
}
