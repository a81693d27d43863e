package cli

import (
	"encoding/json"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/aqfleet/aq/agent/fleetcheck"
	"github.com/aqfleet/aq/cmd/aq/clitest"
	"github.com/aqfleet/aq/demo/coord"
	"github.com/aqfleet/aq/demo/coord/coordtest"
	"github.com/aqfleet/aq/internal/testenv"
)

// checkEnv starts a coordinator stub with o and points AQ_FLEET_API and
// AQ_FLEET_TOKEN (its enrollment token) at it.
func checkEnv(t *testing.T, o coord.Options) *coord.Server {
	t.Helper()
	clitest.CleanEnv(t)
	s := coordtest.Start(t, o) // its reaper runs: a parked job comes due
	t.Setenv("AQ_FLEET_API", s.API)
	t.Setenv("AQ_FLEET_TOKEN", s.EnrollToken())
	return s.Server
}

// aq fleet check against the stub: the table on stdout, exit 0 for the
// full and the legacy route set (missing routes have fallbacks), and this
// host's credentials never written.
func TestFleetCheckCommand(t *testing.T) {
	testenv.Slow(t, "runs commands end to end with real git and a coordinator")
	for _, routes := range coord.RouteSets {
		t.Run(routes, func(t *testing.T) {
			checkEnv(t, coord.Options{Routes: routes})
			out, errOut, code := runAQ(t, "fleet", "check", "--park", "3s")
			if code != 0 || errOut != "" {
				t.Fatalf("exit %d, stderr %q\n%s", code, errOut, out)
			}
			for _, want := range []string{"aq fleet check of http://127.0.0.1:", "\nLeases and fencing\n", "a write with a stale lease epoch is refused (409)", " 0 wrong,"} {
				if !strings.Contains(out, want) {
					t.Errorf("no %q in\n%s", want, out)
				}
			}
			if routes == coord.RoutesLegacy && !strings.Contains(out, "POST /fleet/fail") {
				t.Errorf("legacy: %s", out)
			}
			if _, err := os.Stat(filepath.Join(os.Getenv("AQ_HOME"), "credentials")); !os.IsNotExist(err) {
				t.Errorf("the check wrote this host's credentials: %v", err)
			}
		})
	}
}

// A coordinator that breaks a rule: the table says wrong, exit 1 with one
// line naming the rule; --json carries the same.
func TestFleetCheckWrongExits1(t *testing.T) {
	// The legacy set: it keeps the check's jobs (no DELETE), to look at.
	s := checkEnv(t, coord.Options{Routes: coord.RoutesLegacy, Breaks: []string{coord.BreakStaleEpoch}})
	out, errOut, code := runAQ(t, "fleet", "check", "--park", "3s", "--json", "--product", "qa-check")
	if code != 1 || strings.Count(errOut, "\n") != 1 || !strings.Contains(errOut, "breaks the fleet contract: a write with a stale lease epoch is refused (409)") {
		t.Fatalf("exit %d, stderr %q", code, errOut)
	}
	var rep fleetcheck.Report
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatalf("--json: %v\n%s", err, out)
	}
	if r := rep.Row(fleetcheck.RuleStaleEpoch); r == nil || r.Verdict != fleetcheck.Wrong || r.Seen == "" || r.AQ == "" {
		t.Fatalf("row %+v", r)
	}
	if rep.Count(fleetcheck.Wrong) != 1 {
		t.Fatalf("%d wrong rows", rep.Count(fleetcheck.Wrong))
	}
	for _, id := range rep.Jobs {
		if j, ok := s.Job(id); !ok || j.ProductID != "qa-check" {
			t.Errorf("job %s: product %q", id, j.ProductID)
		}
	}
	if len(rep.Jobs) != 2 || rep.ProductID != "qa-check" {
		t.Errorf("report %+v", rep)
	}
}

// Bad input: one line on stderr, nothing on stdout, exit 2 (5 for a
// refused enrollment token), at once.
func TestFleetCheckBadInput(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := "http://" + ln.Addr().String() + "/api"
	ln.Close()
	html := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/html")
		_, _ = w.Write([]byte("<html><body>Welcome to nginx!</body></html>"))
	}))
	t.Cleanup(html.Close)
	notFound := httptest.NewServer(http.NotFoundHandler())
	t.Cleanup(notFound.Close)
	for _, tc := range []struct {
		name      string
		api, tok  string
		args      []string
		code      int
		wantInErr string
	}{
		{"no API", "", "tok", nil, 2, "needs the coordinator's URL"},
		{"no token", "stub", "", nil, 2, "needs an enrollment token"},
		{"not a URL", "ftp://host/api", "tok", nil, 2, "is not an http(s) URL"},
		{"unreachable", closed, "tok", nil, 2, "is not an aq coordinator: no answer"},
		{"an HTML page", html.URL, "tok", nil, 2, "is not an aq coordinator"},
		{"no such routes", notFound.URL + "/api", "tok", nil, 2, "has no POST /fleet/factories/enroll route"},
		{"refused token", "stub", "not-the-token", nil, 5, "refused AQ_FLEET_TOKEN as an enrollment token (401)"},
		{"bad park", "stub", "stub", []string{"--park", "0s"}, 2, "--park 0s is too short"},
		{"bad product", "stub", "stub", []string{"--product", "../x"}, 2, `product "../x"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := checkEnv(t, coord.Options{})
			api, tok := tc.api, tc.tok
			if api == "stub" {
				api = os.Getenv("AQ_FLEET_API")
			}
			if tok == "stub" {
				tok = s.EnrollToken()
			}
			t.Setenv("AQ_FLEET_API", api)
			t.Setenv("AQ_FLEET_TOKEN", tok)
			out, errOut, code := runAQ(t, append([]string{"fleet", "check"}, tc.args...)...)
			if code != tc.code || out != "" || strings.Count(errOut, "\n") != 1 || !strings.Contains(errOut, tc.wantInErr) {
				t.Fatalf("exit %d, stdout %q, stderr %q; want exit %d and one line with %q", code, out, errOut, tc.code, tc.wantInErr)
			}
			if strings.Contains(errOut, s.EnrollToken()) {
				t.Fatalf("the token is in the error: %q", errOut)
			}
		})
	}
}

func TestDemoCoordinatorBreakFlag(t *testing.T) {
	clitest.CleanEnv(t)
	if _, errOut, code := runAQ(t, "demo", "coordinator", "--break", "everything"); code != 2 || !strings.Contains(errOut, "stale-epoch") {
		t.Fatalf("bad --break: %d %q", code, errOut)
	}
}
