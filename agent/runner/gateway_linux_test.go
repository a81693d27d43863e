package runner_test

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/aqfleet/aq/agent/holds"
	"github.com/aqfleet/aq/agent/runner"
	"github.com/aqfleet/aq/engines"
	"github.com/aqfleet/aq/internal/sandbox"
	"github.com/aqfleet/aq/internal/testenv"
	"github.com/aqfleet/aq/job"
)

// gatewayEngine is a script engine that answers to claude's name: what
// the runner does for an engine pointed at a gateway, without a login.
type gatewayEngine struct{ engines.Script }

func (gatewayEngine) Name() string { return "claude" }

// closedPort is a 127.0.0.1 port nothing listens on (opened, then closed).
func closedPort(t *testing.T) string {
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	_, port, _ := net.SplitHostPort(ln.Addr().String())
	ln.Close()
	return port
}

// TestGatewayPreflight (#33 item 5): an engine pointed at a gateway nothing
// listens on fails in seconds — engine_unavailable, naming the URL, the
// setting and what refused it — before the engine starts, unsandboxed and
// through the job's egress proxy alike; the engine is then held on this
// factory, so the next job of it parks instead of failing the same way.
// On main the engine ran and retried for minutes.
func TestGatewayPreflight(t *testing.T) {
	testenv.Slow(t, "runs whole jobs with real git, processes and waits")
	for _, mode := range []string{"unsandboxed", "sandboxed", "sandboxed-deep"} {
		t.Run(mode, func(t *testing.T) {
			f := newFixture(t, &gatewayEngine{})
			if mode == "sandboxed-deep" {
				// The job's proxy socket under a $AQ_HOME deep enough that
				// its path does not fit a socket address: the pre-flight
				// dialled it as it was and read "invalid argument".
				f.r.Cfg.Home = filepath.Join(f.r.Cfg.Home, strings.Repeat("h", 60), strings.Repeat("i", 60))
			}
			if mode != "unsandboxed" {
				sandboxed(t, f, sandbox.ModeAuto)
				if lvl := f.r.Sandbox.Level(); lvl != sandbox.LevelFull {
					t.Skipf("this host sandboxes at level %s", lvl)
				}
				f.r.Egress = runner.EgressProxies{Env: f.r.Env}
			}
			f.r.Holds = holds.Open(filepath.Join(t.TempDir(), "holds.json"), nil)
			url := "http://127.0.0.1:" + closedPort(t)
			f.r.Env = append(f.r.Env, "ANTHROPIC_BASE_URL="+url)
			if eg, ok := f.r.Egress.(runner.EgressProxies); ok {
				eg.Env = f.r.Env
				f.r.Egress = eg
			}
			j := f.job("gw-"+mode, `touch "$MARK/ran"`)
			j.Engine = "claude"
			start := time.Now()
			out := f.run(context.Background(), j, runner.Options{Attempt: 1})
			if out.Reason != job.ReasonEngineUnavailable || !strings.Contains(out.Detail, url) ||
				!strings.Contains(out.Detail, "(ANTHROPIC_BASE_URL) cannot be reached: nothing listens") {
				t.Fatalf("outcome %s %q", out.Reason, out.Detail)
			}
			if took := time.Since(start); took > 2*runner.GatewayCheckTimeout {
				t.Errorf("the pre-flight took %s", took) // a bound on a hang, not a speed claim
			}
			if _, err := os.Stat(f.marker("ran")); err == nil {
				t.Error("the engine started against an unreachable gateway")
			}
			h, ok := f.r.Holds.Held("claude")
			if !ok || h.Why != runner.HoldUnreachable || h.Job != j.ID {
				t.Fatalf("hold: %+v %v", h, ok)
			}
			j2 := f.job("gw2-"+mode, `touch "$MARK/ran"`)
			j2.Engine = "claude"
			out = f.run(context.Background(), j2, runner.Options{Attempt: 1})
			if !out.IsParked() || !strings.Contains(out.Detail, "its API was unreachable (met by job "+j.ID+")") {
				t.Errorf("the next job: %s %q parked %v", out.Reason, out.Detail, out.IsParked())
			}
		})
	}
}
