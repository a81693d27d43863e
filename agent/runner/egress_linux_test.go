package runner_test

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/aqfleet/aq/agent/runner"
	"github.com/aqfleet/aq/internal/egress"
	"github.com/aqfleet/aq/internal/sandbox"
	"github.com/aqfleet/aq/internal/testenv"
	"github.com/aqfleet/aq/job"
)

// TestSandboxedRunEgress: a sandboxed engine, through the job's real
// egress proxy, reaches the host AQ_SANDBOX_NET names and is refused the
// rest — a host not named, the metadata service — with the reason in the
// answer; the first refusal of each destination is an event of the job,
// and the job's insights count them all. The engine's environment is
// built (engines.Environ: the factory's own proxy and JVM settings do not
// pass as they are) with the proxy's variables over it: both spellings,
// NODE_USE_ENV_PROXY, Yarn's, the JVM's.
func TestSandboxedRunEgress(t *testing.T) {
	testenv.Slow(t, "runs whole jobs with real git, processes and waits")
	f := newFixture(t)
	sandboxed(t, f, sandbox.ModeAuto)
	if lvl := f.r.Sandbox.Level(); lvl != sandbox.LevelFull {
		t.Skipf("this host sandboxes at level %s", lvl)
	}
	var served atomic.Int32
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		served.Add(1)
		w.Write([]byte("allowed and served\n"))
	}))
	defer up.Close()
	_, port, _ := net.SplitHostPort(up.Listener.Addr().String())
	// The upstream lives on the host's loopback: its address and port are
	// named, as an operator names an internal registry's.
	rules, err := egress.ParseRules("127.0.0.1:" + port)
	if err != nil {
		t.Fatal(err)
	}
	// The factory sits behind a proxy of its own and tunes Node and the JVM:
	// none of it reaches the sandboxed engine as it is.
	f.r.Env = append(f.r.Env, "HTTPS_PROXY=http://corp-proxy.invalid:3128", "no_proxy=.corp.invalid",
		"NODE_USE_ENV_PROXY=0", "JAVA_TOOL_OPTIONS=-Dhttps.proxyHost=corp-proxy.invalid", "GH_TOKEN=gh-secret-egress")
	f.r.Egress = runner.EgressProxies{Rules: rules, Env: f.r.Env}
	var mu sync.Mutex
	var events []job.EgressRefusal
	o := runner.Options{Attempt: 1, OnEvent: func(e runner.Event) {
		if r, ok := e.(runner.EgressRefused); ok {
			mu.Lock()
			events = append(events, r.Refusal)
			mu.Unlock()
		}
	}}
	// The engine talks to its proxy itself (bash, no curl needed), through
	// the variables the sandbox gives it.
	j := f.job("egress", `bash <<'SH'
hp=${http_proxy#http://}
req() { exec 3<>/dev/tcp/${hp%:*}/${hp##*:} && printf "$1" >&3 && cat <&3; exec 3<&-; }
req "GET http://127.0.0.1:`+port+`/ok HTTP/1.0\r\n\r\n" > allowed.txt
req "CONNECT evil.example:443 HTTP/1.0\r\n\r\n" > refused.txt
req "CONNECT evil.example:443 HTTP/1.0\r\n\r\n" >> refused.txt
req "GET http://127.0.0.2:`+port+`/ok HTTP/1.0\r\n\r\n" > special.txt
SH
env | sort > env.txt`)
	out := f.run(context.Background(), j, o)
	if out.Failed() {
		t.Fatalf("the job failed: %s %s", out.Reason, out.Detail)
	}
	files := testenv.TreeFiles(t, f.repo, out.Commit)
	if !strings.Contains(files["allowed.txt"], "allowed and served") || served.Load() != 1 {
		t.Errorf("the allowed host: %q (served %d)", files["allowed.txt"], served.Load())
	}
	env := map[string]string{}
	for _, l := range strings.Split(files["env.txt"], "\n") {
		if k, v, ok := strings.Cut(l, "="); ok {
			env[k] = v
		}
	}
	proxy := env["http_proxy"]
	if !strings.HasPrefix(proxy, "http://127.0.0.1:") {
		t.Fatalf("the engine's proxy: %q\n%s", proxy, files["env.txt"])
	}
	for k, want := range map[string]string{
		"HTTPS_PROXY": proxy, "https_proxy": proxy, "HTTP_PROXY": proxy, "ALL_PROXY": proxy, "all_proxy": proxy,
		"NO_PROXY": "localhost,127.0.0.1,::1", "no_proxy": "localhost,127.0.0.1,::1",
		"NODE_USE_ENV_PROXY": "1", "YARN_HTTPS_PROXY": proxy, "YARN_HTTP_PROXY": proxy,
	} {
		if env[k] != want {
			t.Errorf("the engine's %s=%q, want %q", k, env[k], want)
		}
	}
	if jt := env["JAVA_TOOL_OPTIONS"]; strings.Contains(jt, "corp-proxy") || !strings.Contains(jt, "-Dhttps.proxyHost=127.0.0.1") {
		t.Errorf("the engine's JAVA_TOOL_OPTIONS=%q, want the job's proxy only", jt)
	}
	if _, ok := env["GH_TOKEN"]; ok {
		t.Error("GH_TOKEN reached the sandboxed engine")
	}
	if got := files["refused.txt"]; strings.Count(got, "403 Forbidden") != 2 || !strings.Contains(got, "evil.example is not allowed: add it to AQ_SANDBOX_NET") {
		t.Errorf("a host not named: %q", got)
	}
	// A special address not named is refused before any dial (a loopback
	// one here; the metadata service's link-local one is internal/egress's
	// test, behind a dialer that refuses anything but loopback).
	if got := files["special.txt"]; !strings.Contains(got, "403 Forbidden") || !strings.Contains(got, "127.0.0.2 is a loopback address") {
		t.Errorf("a special address not named: %q", got)
	}
	in := out.Insights.EgressRefused
	if len(in) != 2 || in[0].Host != "evil.example" || in[0].Port != 443 || in[0].Count != 2 ||
		in[1].Host != "127.0.0.2" || fmt.Sprint(in[1].Port) != port || in[1].Count != 1 || in[1].Why == "" {
		t.Errorf("insights: %+v, want evil.example:443 twice then 127.0.0.2:%s once", in, port)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(events) != 2 || events[0].Count != 1 || events[1].Count != 1 {
		t.Errorf("events: %+v, want the first refusal of each destination", events)
	}
}

// TestSandboxedRunReachesLoopbackGateways (#33 item 4): a gateway on the
// host's loopback — named in AQ_SANDBOX_NET by address and port or as
// localhost:port — is reached from inside the sandbox at the same URL
// (NO_PROXY sends loopback direct; the sandbox's init listens there and
// carries the connection through the job's proxy); a loopback port not
// named is not. On main the engine's connections were refused inside the
// sandbox's own loopback, and the proxy never asked.
func TestSandboxedRunReachesLoopbackGateways(t *testing.T) {
	testenv.Slow(t, "runs whole jobs with real git, processes and waits")
	f := newFixture(t)
	sandboxed(t, f, sandbox.ModeAuto)
	if lvl := f.r.Sandbox.Level(); lvl != sandbox.LevelFull {
		t.Skipf("this host sandboxes at level %s", lvl)
	}
	var served sync.Map
	gw := func(name string) string {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			served.Store(name+" "+r.URL.Path, true)
			fmt.Fprintf(w, "gateway %s served %s\n", name, r.URL.Path)
		}))
		t.Cleanup(srv.Close)
		_, port, _ := net.SplitHostPort(srv.Listener.Addr().String())
		return port
	}
	byAddr, byName := gw("by-address"), gw("by-name")
	unnamed := gw("unnamed")
	rules, err := egress.ParseRules("127.0.0.1:" + byAddr + ",localhost:" + byName)
	if err != nil {
		t.Fatal(err)
	}
	f.r.Egress = runner.EgressProxies{Rules: rules, Env: f.r.Env}
	j := f.job("loopback-gw", `bash <<'SH'
get() { exec 3<>/dev/tcp/$1/$2 && printf "GET /$3 HTTP/1.0\r\nHost: $1\r\n\r\n" >&3 && cat <&3; exec 3<&-; }
get 127.0.0.1 `+byAddr+` v1/messages > by-address.txt 2>&1
get localhost `+byName+` v1/responses > by-name.txt 2>&1
get 127.0.0.1 `+unnamed+` nope > unnamed.txt 2>&1
true
SH`)
	out := f.run(context.Background(), j, runner.Options{Attempt: 1})
	if out.Failed() {
		t.Fatalf("the job failed: %s %s", out.Reason, out.Detail)
	}
	files := testenv.TreeFiles(t, f.repo, out.Commit)
	if got := files["by-address.txt"]; !strings.Contains(got, "gateway by-address served /v1/messages") {
		t.Errorf("127.0.0.1:%s from inside the sandbox: %q", byAddr, got)
	}
	if got := files["by-name.txt"]; !strings.Contains(got, "gateway by-name served /v1/responses") {
		t.Errorf("localhost:%s from inside the sandbox: %q", byName, got)
	}
	if _, ok := served.Load("unnamed /nope"); ok || strings.Contains(files["unnamed.txt"], "served") {
		t.Errorf("a loopback port not named was reached: %q", files["unnamed.txt"])
	}
	if len(out.Insights.EgressRefused) != 0 {
		t.Errorf("refusals: %+v", out.Insights.EgressRefused)
	}
}

// TestSandboxedGatewayOfTheEngine (#33 item 4): the host of an engine's
// base URL — set in its environment or in its own settings file that aq
// copies into the job's home — is its gateway: allowed whatever it
// resolves to, and on loopback bridged. The proxy a job of engine claude
// gets allows the localhost gateway its settings.json names (and tells
// the sandbox to bridge it), and the 127.0.0.1 one of its environment.
func TestSandboxedGatewayOfTheEngine(t *testing.T) {
	home := t.TempDir()
	if err := os.MkdirAll(filepath.Join(home, ".claude"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(home, ".claude", "settings.json"), []byte(`{"env":{"ANTHROPIC_BASE_URL":"http://localhost:4010"}}`), 0o600); err != nil {
		t.Fatal(err)
	}
	e := runner.EgressProxies{Env: []string{"HOME=" + home, "ANTHROPIC_BASE_URL=http://127.0.0.1:4011/anthropic"}}
	sock := filepath.Join(t.TempDir(), "p.sock")
	p, err := e.Start(context.Background(), "gw", "claude", sock, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	g, ok := p.(interface{ Gateways() []string })
	if !ok {
		t.Fatal("the job's proxy does not say its gateways")
	}
	if got, want := g.Gateways(), []string{"127.0.0.1:4011", "localhost:4010"}; !slices.Equal(got, want) {
		t.Errorf("gateways %v, want %v", got, want)
	}
	// A script job's proxy has none of claude's.
	p2, err := e.Start(context.Background(), "gw2", "script", filepath.Join(t.TempDir(), "p.sock"), false, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer p2.Close()
	if got := p2.(interface{ Gateways() []string }).Gateways(); len(got) != 0 {
		t.Errorf("a script job's gateways: %v", got)
	}
}
