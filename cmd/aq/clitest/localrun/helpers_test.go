//go:build !unit

package localrun

import (
	"testing"

	"github.com/aqfleet/aq/cmd/aq/cli"
	"github.com/aqfleet/aq/cmd/aq/clitest"
	"github.com/aqfleet/aq/internal/testenv"
)

// show is `aq job show --json ID` of the job a test calls name (its id is
// testenv.ID(name)).
func show(t *testing.T, h *testenv.Home, name string) cli.JobView {
	t.Helper()
	return clitest.JSON[cli.JobView](t, h, "job", "show", "--json", testenv.ID(name))
}

// board is `aq status --json`.
func board(t *testing.T, h *testenv.Home) cli.Board {
	t.Helper()
	return clitest.JSON[cli.Board](t, h, "status", "--json")
}
