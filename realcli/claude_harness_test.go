package realcli_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/aqfleet/aq/agent/runner"
	"github.com/aqfleet/aq/internal/fakellm"
	"github.com/aqfleet/aq/internal/process"
	"github.com/aqfleet/aq/internal/testenv"
)

// Markers of aq's own secrets: the factory's environment carries them, and
// no request the engine makes may (nothing of aq's reaches an engine).
var secretMarkers = map[string]string{
	"AQ_FLEET_TOKEN":          "aqsecret-fleet-token-6f1c",
	"AQ_SB_CONNECTION_STRING": "Endpoint=sb://aqsecret-sb-77d2/;SharedAccessKey=aqsecret-sb-key-77d2",
	"GH_TOKEN":                "aqsecret-gh-token-91ab",
	"GITHUB_TOKEN":            "aqsecret-github-token-91ac",
}

// apiKey is the engine's own credential: it must reach the fake (that is
// how claude authenticates) and nothing else.
const apiKey = "sk-ant-api03-realcli-test-key-0000"

// rig is one aq installation with the real claude on its engine PATH and a
// fake Anthropic API, the aq processes and the fake in the test's own
// network namespace (AQ_SANDBOX=off).
type rig struct {
	t      *testing.T
	h      *testenv.Home
	ns     *netns
	fake   *fakellm.Server
	claude string
	home   string // the engine's HOME (claude's ~/.claude lives there)
}

// newRig makes an aq home whose claude will talk to the fake (serve starts
// it), with the test-only switches a factory sets through what aq passes to
// claude (its ANTHROPIC_*, CLAUDE_CODE_* and DISABLE_* variables:
// docs/engines.md), and aq's own secrets in aq's environment. The engine
// runs unsandboxed (AQ_SANDBOX=off), aq, claude and the fake in a network
// namespace of the test's own.
func newRig(t *testing.T, env ...string) *rig {
	t.Helper()
	return makeRig(t, false, env...)
}

// newSandboxedRig is newRig with the engine in aq's sandbox as a factory
// runs it (AQ_SANDBOX=on): the sandbox's own network namespace and egress
// proxy, the fake on the host's 127.0.0.1 reached through the sandbox's
// loopback bridge to a base URL's port. aq and the fake stay on the host.
func newSandboxedRig(t *testing.T, env ...string) *rig {
	t.Helper()
	return makeRig(t, true, env...)
}

func makeRig(t *testing.T, sandboxed bool, env ...string) *rig {
	t.Helper()
	bin := testenv.RealCLI(t, "claude")
	aq := testenv.BuildAQ(t) // before the namespace: building may fetch modules
	r := &rig{t: t, h: testenv.NewHome(t), claude: bin, home: t.TempDir()}
	mode := "on"
	if !sandboxed {
		r.ns, mode = newNetns(t), "off"
	}
	r.h.Bin = aq
	r.h.Env = append(r.h.Env,
		"AQ_SANDBOX="+mode,
		"PATH="+filepath.Dir(bin)+string(os.PathListSeparator)+os.Getenv("PATH"),
		"HOME="+r.home,
		"ANTHROPIC_API_KEY="+apiKey,
		"CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC=1",
		"DISABLE_AUTOUPDATER=1",
		"DISABLE_TELEMETRY=1",
		"DISABLE_ERROR_REPORTING=1",
		"CLAUDE_CODE_MAX_RETRIES=2",
	)
	for k, v := range secretMarkers {
		r.h.Env = append(r.h.Env, k+"="+v)
	}
	r.h.Env = append(r.h.Env, env...)
	// claude's --help answers in seconds, but not always within aq's 10 s
	// probe deadline on a loaded test machine (#33's "a busy host loses its
	// engine"): probe it once here with a generous deadline, as an operator
	// can (aq caps --probe-timeout); aq keeps a successful probe in
	// $AQ_HOME/engines/probes.json and the jobs' runs reuse it.
	if res := r.h.Run(t, "caps", "--probe-timeout", "3m"); res.Code != 0 || !strings.Contains(res.Stdout, "--max-budget-usd") {
		t.Fatalf("aq caps --probe-timeout 3m: %s", res)
	}
	return r
}

// do runs f in the rig's network namespace (on the host for a sandboxed
// rig: the sandbox makes the engine's).
func (r *rig) do(f func()) {
	if r.ns == nil {
		f()
		return
	}
	r.ns.do(f)
}

// serve starts the fake, playing script, in the rig's namespace, and points
// claude's ANTHROPIC_BASE_URL at it.
func (r *rig) serve(script fakellm.Script) *fakellm.Server {
	r.t.Helper()
	var lerr error
	r.do(func() {
		var ln net.Listener
		if ln, lerr = net.Listen("tcp", "127.0.0.1:0"); lerr == nil {
			r.fake = fakellm.Serve(ln, script)
		}
	})
	if lerr != nil {
		r.t.Fatal(lerr)
	}
	fake := r.fake
	r.t.Cleanup(func() { _ = fake.Close() })
	r.h.Env = append(r.h.Env, "ANTHROPIC_BASE_URL="+fake.URL)
	return fake
}

// submit writes a manifest with front matter front and body, and submits
// it; it returns the job's id.
func (r *rig) submit(name, front, body string) string {
	r.t.Helper()
	id := testenv.ID(name)
	path := filepath.Join(r.t.TempDir(), id+".md")
	testenv.WriteFile(r.t, path, fmt.Sprintf("---\nid: %s\n%s\n---\n%s\n", id, strings.TrimSpace(front), body))
	if res := r.h.Run(r.t, "submit", path); res.Code != 0 {
		r.t.Fatalf("aq submit %s: %s", name, res)
	}
	return id
}

// run runs aq with args from the namespace's thread, to its end.
func (r *rig) run(args ...string) testenv.Result {
	r.t.Helper()
	cmd := r.h.Command(r.t, args...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	var err error
	r.do(func() { err = cmd.Start() })
	if err != nil {
		r.t.Fatal(err)
	}
	res, err := testenv.Wait(cmd, &out, &errb, 6*time.Minute)
	if err != nil {
		r.t.Fatal(err)
	}
	return res
}

// jobView is the part of `aq job show --json` the tests read.
type jobView struct {
	Stage     string    `json:"stage"`
	Reason    string    `json:"reason"`
	Detail    string    `json:"detail"`
	Branch    string    `json:"branch"`
	Attempts  int       `json:"attempts"`
	NotBefore time.Time `json:"notBefore"`
	Insights  *struct {
		Engine        string  `json:"engine"`
		EngineVersion string  `json:"engineVersion"`
		Model         string  `json:"model"`
		SessionID     string  `json:"sessionId"`
		TokensIn      int64   `json:"tokensIn"`
		TokensOut     int64   `json:"tokensOut"`
		TokensCached  int64   `json:"tokensCached"`
		CostUSD       float64 `json:"costUsd"`
		CostEstimated bool    `json:"costEstimated"`
		Turns         int     `json:"turns"`
		RepairRounds  int     `json:"repairRounds"`
		Runs          []struct {
			TokensIn  int64   `json:"tokensIn"`
			TokensOut int64   `json:"tokensOut"`
			CostUSD   float64 `json:"costUsd"`
			Turns     int     `json:"turns"`
		} `json:"runs"`
	} `json:"insights"`
	Raw string `json:"-"`
}

func (r *rig) show(id string) jobView {
	r.t.Helper()
	res := r.h.Run(r.t, "job", "show", "--json", id)
	if res.Code != 0 {
		r.t.Fatalf("aq job show %s: %s", id, res)
	}
	var v jobView
	if err := json.Unmarshal([]byte(res.Stdout), &v); err != nil {
		r.t.Fatalf("aq job show --json: %v\n%s", err, res.Stdout)
	}
	v.Raw = res.Stdout
	return v
}

// turns are the requests that were the agent loop's turns (they offered
// tools), parsed.
func (r *rig) turns() []*fakellm.AnthropicRequest {
	r.t.Helper()
	var out []*fakellm.AnthropicRequest
	for _, req := range r.fake.Requests() {
		if req.Path != "/v1/messages" {
			continue
		}
		a, err := req.Anthropic()
		if err != nil {
			r.t.Fatal(err)
		}
		if len(a.Tools) > 0 {
			out = append(out, a)
		}
	}
	return out
}

// noSecrets fails the test if any request carried one of aq's secrets.
func (r *rig) noSecrets() {
	r.t.Helper()
	for _, req := range r.fake.Requests() {
		for k, v := range secretMarkers {
			for _, part := range strings.Split(v, ";") {
				if req.Contains(part) {
					r.t.Errorf("request %d (%s %s) carries %s", req.Seq, req.Method, req.Path, k)
				}
			}
		}
	}
}

// noneLeft fails the test if a process of the job is still running: its
// tag and this rig's aq home's scope in its environment (tests of both
// engines run at once in this binary, and ids repeat across them: "repair",
// "crash"; aq's own sweep is scoped the same way).
func (r *rig) noneLeft(t *testing.T, id string) {
	t.Helper()
	pids, err := process.FindScoped(id, runner.Scope(r.h.Dir))
	if err != nil {
		t.Fatal(err)
	}
	for _, pid := range pids {
		cmdline, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
		t.Errorf("a process of job %s is still running: %d %s", id, pid, bytes.ReplaceAll(cmdline, []byte{0}, []byte(" ")))
	}
}

// logs is the job's engine output log.
func (r *rig) logs(id string) string {
	b, _ := os.ReadFile(filepath.Join(r.h.Dir, "logs", id, "stdout.log"))
	return string(b)
}
