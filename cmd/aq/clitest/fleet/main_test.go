//go:build !unit

package fleet

import (
	"os"
	"testing"

	"github.com/aqfleet/aq/internal/testenv"
)

func TestMain(m *testing.M) { os.Exit(testenv.Main(m)) }
