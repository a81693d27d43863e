package fleetcheck

import (
	"flag"
	"os"
	"testing"
)

// TestMain lets all of the package's checks run at once unless -parallel
// is given: go test's default (GOMAXPROCS, 2 on a two-core machine) ran them
// two by two, and a check spends its seconds waiting on the coordinator's
// clock — a parked job until its notBefore, a version that is due — not on
// the CPU (0.2 s of CPU in 30 s for the package).
func TestMain(m *testing.M) {
	flag.Parse()
	given := false
	flag.Visit(func(f *flag.Flag) { given = given || f.Name == "test.parallel" })
	if !given {
		_ = flag.Set("test.parallel", "16")
	}
	os.Exit(m.Run())
}
