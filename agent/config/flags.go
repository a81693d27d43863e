package config

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/pflag"
)

// Group is a set of keys that the same commands read. A command offers the
// flags of the groups it reads (AddFlags), so `aq <cmd> --help` shows what
// that command uses; the environment and the config file set every key
// whatever the command.
type Group string

// The groups, in the order help shows them.
const (
	GroupGlobal Group = "global" // every command: --config, --home, --log-*
	GroupRepo   Group = "repo"   // where repositories live
	GroupFleet  Group = "fleet"  // the coordinator
	GroupBroker Group = "broker" // Azure Service Bus delivery
	GroupEngine Group = "engine" // how engines run
	GroupDaemon Group = "daemon" // the long-running factory
	GroupGC     Group = "gc"     // clean-up
	// GroupObserve: notifications and broker depth (run and daemon).
	GroupObserve Group = "observe"
)

// Groups lists every group, in help order.
var Groups = []Group{GroupRepo, GroupFleet, GroupBroker, GroupEngine, GroupDaemon, GroupObserve, GroupGC, GroupGlobal}

// Title is the heading of the group's flags in help.
func (g Group) Title() string {
	switch g {
	case GroupGlobal:
		return "Global flags"
	case GroupRepo:
		return "Repository flags"
	case GroupFleet:
		return "Fleet flags"
	case GroupBroker:
		return "Broker flags"
	case GroupEngine:
		return "Engine flags"
	case GroupDaemon:
		return "Daemon flags"
	case GroupGC:
		return "GC flags"
	case GroupObserve:
		return "Observability flags"
	}
	return string(g)
}

// GroupAnnotation is the pflag annotation that names a key flag's group
// (help sorts flags under their group's heading by it).
const GroupAnnotation = "aq_config_group"

// AddFlags registers a typed flag for every key of the given groups on fs
// (every key when no group is given).
func AddFlags(fs *pflag.FlagSet, groups ...Group) {
	for _, k := range Keys {
		if len(groups) > 0 && !slices.Contains(groups, k.Group) {
			continue
		}
		addFlag(fs, k)
	}
}

// OperatorKeys are what an operator's call to the coordinator reads (aq job
// show|logs|requeue|ship|reject|rm): whether fleet mode is on, where the
// coordinator is and the token. A command that reads only these offers only
// their flags, not the whole Fleet group (heartbeats, polls, leases).
var OperatorKeys = []string{"fleet", "fleet_route", "fleet_shadow", "fleet_api", "fleet_token", "product_id"}

// AddKeyFlags registers the typed flags of the named keys on fs, under
// their groups' headings. An unknown name panics: it is a programming error.
func AddKeyFlags(fs *pflag.FlagSet, names ...string) {
	for _, n := range names {
		i := slices.IndexFunc(Keys, func(k Key) bool { return k.Name == n })
		if i < 0 {
			panic("config: no key " + n)
		}
		addFlag(fs, Keys[i])
	}
}

func addFlag(fs *pflag.FlagSet, k Key) {
	v := &keyValue{typ: k.Type}
	def := k.Default
	switch k.Type {
	case "bool":
		def = strconv.FormatBool(boolWords[def])
	case "duration":
		if d, err := time.ParseDuration(def); err == nil && d == 0 {
			def = "0" // help leaves a zero default out
		}
	}
	fl := fs.VarPF(v, k.Flag, "", k.Usage+" [$"+k.Env[0]+"]")
	fl.DefValue = def
	if k.Type == "bool" {
		fl.NoOptDefVal = "true"
	}
	_ = fs.SetAnnotation(k.Flag, GroupAnnotation, []string{string(k.Group)})
}

// keyValue is a key's flag: it checks that the text is of the key's type
// (so `--slots two` fails at parse time with the flag's name) and keeps the
// text as written, which Load then validates like any other source.
type keyValue struct {
	typ string
	raw string
}

func (v *keyValue) String() string { return v.raw }

func (v *keyValue) Type() string {
	if v.typ == "" {
		return "string"
	}
	return v.typ
}

func (v *keyValue) Set(s string) error {
	switch v.typ {
	case "bool":
		if _, ok := boolWords[strings.ToLower(strings.TrimSpace(s))]; !ok {
			return fmt.Errorf("not a boolean (use true or false, 1 or 0)")
		}
	case "int":
		if _, err := strconv.Atoi(strings.TrimSpace(s)); err != nil {
			return fmt.Errorf("not a whole number")
		}
	case "duration":
		if _, err := time.ParseDuration(strings.TrimSpace(s)); err != nil {
			return fmt.Errorf("not a duration (use Go syntax such as 90s, 45m or 336h)")
		}
	}
	v.raw = s
	return nil
}
