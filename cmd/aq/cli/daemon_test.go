//go:build unix

package cli

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/aqfleet/aq/cmd/aq/clitest"
	"github.com/aqfleet/aq/internal/testenv"
)

// Configuration errors exit 2 before anything is dialled.
func TestDaemonConfigErrorsExit2(t *testing.T) {
	clitest.CleanEnv(t)
	for _, tc := range []struct {
		env  map[string]string
		want string
	}{
		{map[string]string{}, "fleet mode is off"},
		{map[string]string{"AQ_FLEET": "1"}, "needs AQ_FLEET_API"},
		{map[string]string{"AQ_FLEET": "1", "AQ_FLEET_API": "http://127.0.0.1:9/api", "AQ_DRAIN_TIMEOUT": "soon"}, "AQ_DRAIN_TIMEOUT"},
	} {
		for k, v := range tc.env {
			t.Setenv(k, v)
		}
		_, errOut, code := runAQ(t, "daemon")
		if code != 2 || !strings.Contains(errOut, tc.want) || strings.Count(strings.TrimSpace(errOut), "\n") != 0 {
			t.Errorf("%v: exit %d, stderr %q", tc.env, code, errOut)
		}
		for k := range tc.env {
			os.Unsetenv(k)
		}
	}
}

// The stub's publisher takes its connection string from a file (never
// argv); a development string towards another host, or a file it cannot
// read, is a usage error.
func TestDemoCoordinatorBrokerFlags(t *testing.T) {
	clitest.CleanEnv(t)
	dir := t.TempDir()
	remote := filepath.Join(dir, "remote")
	testenv.WriteFile(t, remote, "Endpoint=sb://bus.example.net;SharedAccessKeyName=k;SharedAccessKey=c2VjcmV0;UseDevelopmentEmulator=true\n")
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--broker-connection-string-file", filepath.Join(dir, "missing")}, "cannot read"},
		{[]string{"--broker-connection-string-file", remote}, "not loopback"},
		{[]string{"--routes", "newest"}, "--routes \"newest\" is not a route set"},
		{[]string{"--routes", "legacy", "--broker-connection-string-file", remote}, "publishes no dispatch messages"},
		{[]string{"--log-cap", "0"}, "--log-cap-per-job 64, --log-cap 0"},
		{[]string{"--log-cap-per-job", "2048"}, "the per-job cap at most the total"},
		{[]string{"--log-cap", "lots"}, `invalid argument "lots" for "--log-cap"`},
	} {
		_, errOut, code := runAQ(t, append([]string{"demo", "coordinator", "--listen", "127.0.0.1:0"}, tc.args...)...)
		if code != 2 || !strings.Contains(errOut, tc.want) || strings.Contains(errOut, "c2VjcmV0") {
			t.Errorf("%v: exit %d, stderr %q", tc.args, code, errOut)
		}
	}
}
