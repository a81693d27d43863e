package testenv

import (
	"bytes"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// RealCLI is the path of a real engine CLI ("claude" or "codex") installed
// from realcli's pinned package.json and lockfile (`make realcli`,
// which make test and .ci/run call). It skips tb only where npm cannot run
// at all; where npm runs but the CLIs are not installed (the registry could
// not be reached, or nobody ran make realcli) it fails tb with the fix, so
// CI notices rather than skipping the real-engine tests in silence.
func RealCLI(tb testing.TB, name string) string {
	tb.Helper()
	Slow(tb, "runs a real engine CLI (make test installs them with make realcli)")
	dir, err := RealCLIDir()
	if err != nil {
		tb.Fatal(err)
	}
	bin := filepath.Join(dir, "node_modules", ".bin", name)
	if _, err := os.Stat(bin); err == nil {
		return bin
	}
	if _, err := exec.LookPath("npm"); err != nil {
		tb.Skipf("the real %s CLI is not installed and npm is not on PATH: install Node.js and npm, then run 'make realcli'", name)
	}
	tb.Fatalf("the real %s CLI is not installed in %s: run 'make realcli' (npm ci from the pinned lockfile; it needs the npm registry)", name, dir)
	return ""
}

// RealCLIEnv names a directory that holds other versions of the CLIs in
// its node_modules instead of realcli (`make engines-latest`: the
// newest published versions, installed into a temp copy).
const RealCLIEnv = "REALCLI_DIR"

// RealCLIDir is realcli in the module that holds the working
// directory, or $REALCLI_DIR when set.
func RealCLIDir() (string, error) {
	if dir := os.Getenv(RealCLIEnv); dir != "" {
		return filepath.Abs(dir)
	}
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if b, err := os.ReadFile(filepath.Join(dir, "go.mod")); err == nil && bytes.Contains(b, []byte("module github.com/aqfleet/aq\n")) {
			return filepath.Join(dir, "realcli"), nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("cannot find the aq module root (go.mod) above the working directory")
		}
		dir = parent
	}
}
