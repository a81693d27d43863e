// Command aq is the factory agent: it takes coding jobs, runs an engine on
// them in isolated git worktrees, checkpoints and ships the work.
package main

import (
	"os"

	"github.com/aqfleet/aq/cmd/aq/cli"
	// Before Bubble Tea's init: no terminal query at start (package doc).
	_ "github.com/aqfleet/aq/internal/termstyle"
)

func main() { os.Exit(cli.Main()) }
