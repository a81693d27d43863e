//go:build unix

package cli

import (
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"

	"github.com/aqfleet/aq/cmd/aq/clitest"
	"github.com/aqfleet/aq/demo/coord"
	"github.com/aqfleet/aq/internal/testenv"
)

// Live logs in-process; those with real processes (a job under `aq daemon`
// followed from another AQ_HOME) are in cmd/aq/clitest/fleet.

// TestLiveLogFollowWithoutOne: a coordinator without the live log's route,
// or one that answers it with what is not a live log (a proxy's page), is
// said once by aq job logs -f, which then shows the job's output from its
// artifact at the end, as before live logs.
func TestLiveLogFollowWithoutOne(t *testing.T) {
	testenv.Slow(t, "runs commands end to end with real git and a coordinator")
	for _, tc := range []struct {
		name string
		via  func(s *coord.Served) http.Handler
		want string
	}{
		{"no route", func(s *coord.Served) http.Handler {
			s.SetWithout(coord.RouteLogRead)
			return s.Server
		}, "· the coordinator has no GET /fleet/jobs/:id/log: the engine's output shows when the job ends (from its artifacts)"},
		{"garbage", func(s *coord.Served) http.Handler {
			return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if r.Method == http.MethodGet && strings.HasSuffix(r.URL.Path, "/log") {
					w.Header().Set("Content-Type", "text/html")
					w.Write([]byte("<html>Sign in</html>"))
					return
				}
				s.ServeHTTP(w, r)
			})
		}, "! the coordinator's live log cannot be read"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, dir, _ := clitest.FleetEnv(t)
			id := testenv.ID("live-without-" + strings.ReplaceAll(tc.name, " ", "-"))
			m := clitest.WriteManifest(t, dir, id, "script: echo the engine was here > /dev/stdout; echo x > x.txt\nship: branch")
			if _, errOut, code := runAQ(t, "submit", m); code != 0 {
				t.Fatal(errOut)
			}
			if _, errOut, code := runAQ(t, "run", "--once"); code != 0 {
				t.Fatal(errOut)
			}
			front := httptest.NewServer(tc.via(s))
			t.Cleanup(front.Close)
			t.Setenv("AQ_FLEET_API", front.URL+"/api")
			t.Setenv("AQ_HOME", filepath.Join(dir, "operator-home"))
			out, errOut, code := runAQ(t, "job", "logs", "-f", id)
			if code != 0 {
				t.Fatalf("logs -f: %d %q", code, errOut)
			}
			if n := strings.Count(out, tc.want); n != 1 || !strings.Contains(out, "engine output of attempt 1, from factory cli-factory") ||
				!strings.Contains(out, "the engine was here") || strings.Contains(out, "live from factory") {
				t.Fatalf("said %d times; output:\n%s", n, out)
			}
		})
	}
}
