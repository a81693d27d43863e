//go:build !unit

package jobs

import (
	"bytes"
	"context"
	"strings"
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

// runAQ runs one aq command line in-process (the tests here that run a
// coordinator stub drive aq both ways) and returns its output and code.
func runAQ(t *testing.T, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	return runAQContext(t, context.Background(), args...)
}

// runAQContext is runAQ under ctx.
func runAQContext(t *testing.T, ctx context.Context, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	var out, errb bytes.Buffer
	code = cli.Run(ctx, args, cli.IO{In: strings.NewReader(""), Out: &out, Err: &errb})
	return out.String(), errb.String(), code
}
