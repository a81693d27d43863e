package cli

import (
	"os"
	"testing"

	"github.com/aqfleet/aq/internal/testenv"
)

// The tests here call aq's commands in-process; those that run the built
// aq binary live in cmd/aq/clitest/... (#35: packages of their own, so
// they run beside these and beside each other).

func TestMain(m *testing.M) { os.Exit(testenv.Main(m)) }
