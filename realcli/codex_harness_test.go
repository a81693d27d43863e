//go:build linux

// The codex end-to-end tests are Linux-only: their unsandboxed runs need a
// network namespace of the test's own (unshare(CLONE_NEWNET)).

package realcli_test

import (
	"encoding/json"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/aqfleet/aq/agent/queue"
	"github.com/aqfleet/aq/internal/fakellm"
	"github.com/aqfleet/aq/internal/testenv"
)

// codexModel is a model both codex 0.171.0's catalogue and aq's price
// table know (codex warns "Model metadata … not found" for others and
// offers other tools).
const codexModel = "gpt-5.5"

// codexAPIKey is the test's API key: the fake sees it in Authorization,
// nowhere else may it appear.
const codexAPIKey = "sk-codex-test-0123456789"

// codexSecretMarker is what aq's own secrets are set to: no request to
// the API may carry it.
const codexSecretMarker = "AQ-SECRET-MARKER-7f3e"

// codexNetns runs functions on one OS thread that lives in a network
// namespace of its own, with only loopback up: what it starts (aq, and so
// codex) and the listeners it opens see no other network. The thread is
// never unlocked, so it ends with its goroutine.
type codexNetns struct {
	do chan func()
}

func codexNewNetns(t *testing.T) *codexNetns {
	t.Helper()
	n := &codexNetns{do: make(chan func())}
	ready := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread dies with this goroutine
		if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
			ready <- fmt.Errorf("unshare(CLONE_NEWNET): %w", err)
			return
		}
		if err := codexLoopbackUp(); err != nil {
			ready <- err
			return
		}
		ready <- nil
		for f := range n.do {
			f()
		}
	}()
	if err := <-ready; err != nil {
		t.Skipf("cannot make a network namespace of the test's own (%v): the AQ_SANDBOX=off runs need one so that nothing leaves the machine", err)
	}
	t.Cleanup(func() { close(n.do) })
	return n
}

// codexLoopbackUp sets lo up in the calling thread's network namespace.
func codexLoopbackUp() error {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	ifr, err := unix.NewIfreq("lo")
	if err != nil {
		return err
	}
	if err := unix.IoctlIfreq(fd, unix.SIOCGIFFLAGS, ifr); err != nil {
		return fmt.Errorf("lo flags: %w", err)
	}
	ifr.SetUint16(ifr.Uint16() | unix.IFF_UP)
	if err := unix.IoctlIfreq(fd, unix.SIOCSIFFLAGS, ifr); err != nil {
		return fmt.Errorf("lo up: %w", err)
	}
	return nil
}

// Do runs f on the namespace's thread and waits for it.
func (n *codexNetns) Do(f func()) {
	done := make(chan struct{})
	n.do <- func() { defer close(done); f() }
	<-done
}

// codexRig is one test's factory: an aq home with a repository that has an
// origin, a CODEX_HOME whose config.toml points codex at the fake, and the
// fake, all in a network namespace of the test's own.
type codexRig struct {
	t         *testing.T
	h         *testenv.Home
	ns        *codexNetns
	fake      *fakellm.ResponsesServer
	codexHome string
	origin    string
}

// codexConfig is the config.toml the test writes into CODEX_HOME (aq
// copies it into the job's home): the fake's base URL (codex 0.171.0 reads
// no OPENAI_BASE_URL from its environment), no update check, no analytics,
// no feedback upload.
func codexConfig(baseURL string) string {
	line := ""
	if baseURL != "" {
		line = fmt.Sprintf("openai_base_url = %q\n", baseURL)
	}
	return line + `check_for_update_on_startup = false

[analytics]
enabled = false

[feedback]
enabled = false
`
}

// codexBaseURLFromEnv, in codexNewRig's env, gives aq OPENAI_BASE_URL set
// to the fake's URL instead of writing it into config.toml.
const codexBaseURLFromEnv = "OPENAI_BASE_URL=<fake>"

// codexNewRig starts the fake with script inside a new namespace and makes
// the aq home (AQ_SANDBOX=off unless env says otherwise) with a repository
// "app" holding files.
func codexNewRig(t *testing.T, script fakellm.ResponsesScript, files map[string]string, env ...string) *codexRig {
	t.Helper()
	bin := testenv.RealCLI(t, "codex")
	r := &codexRig{t: t, ns: codexNewNetns(t)}
	var err error
	r.ns.Do(func() {
		var ln net.Listener
		if ln, err = net.Listen("tcp", "127.0.0.1:0"); err == nil {
			r.fake = fakellm.ServeResponses(ln, script)
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = r.fake.Close() })
	r.h = testenv.NewHome(t)
	r.h.Bin = testenv.BuildAQ(t)
	// codex refuses to make its helper links under /tmp; the home is not
	// there either way in CI, but keep it out of TMPDIR's root.
	r.codexHome = filepath.Join(t.TempDir(), "codex-home")
	inFile := r.fake.URL()
	for i, e := range env {
		if e == codexBaseURLFromEnv {
			env[i], inFile = "OPENAI_BASE_URL="+r.fake.URL(), ""
		}
	}
	testenv.WriteFile(t, filepath.Join(r.codexHome, "config.toml"), codexConfig(inFile))
	r.h.Env = append(r.h.Env,
		"AQ_SANDBOX=off",
		"PATH="+filepath.Dir(bin)+string(os.PathListSeparator)+os.Getenv("PATH"),
		"CODEX_HOME="+r.codexHome,
		"CODEX_API_KEY="+codexAPIKey,
		// aq's own secrets, set to a marker no request may carry.
		"AQ_FLEET_TOKEN="+codexSecretMarker,
		"AQ_SB_CONNECTION_STRING=Endpoint=sb://"+codexSecretMarker+".example/;SharedAccessKey="+codexSecretMarker,
		"GH_TOKEN="+codexSecretMarker,
	)
	r.h.Env = append(r.h.Env, env...)
	repo := r.h.Repo(t, "app", files)
	r.origin = testenv.AddOrigin(t, repo)
	return r
}

// codexManifest is a codex job's front matter for the repository "app".
func codexManifest(extra ...string) string {
	return strings.Join(append([]string{"repo: app", "engine: codex", "model: " + codexModel}, extra...), "\n")
}

// run runs aq with args from inside the namespace.
func (r *codexRig) run(args ...string) testenv.Result {
	r.t.Helper()
	var res testenv.Result
	r.ns.Do(func() { res = testenv.RunCmd(r.t, r.h.Command(r.t, args...)) })
	return res
}

// submit submits the job the test calls name with the manifest front.
func (r *codexRig) submit(name, front string) {
	r.t.Helper()
	path := testenv.Manifest(r.t, r.t.TempDir(), testenv.ID(name), front)
	if res := r.run("submit", path); res.Code != 0 {
		r.t.Fatalf("aq submit %s: %s", name, res)
	}
}

// codexView is what the tests read of `aq job show --json`.
type codexView struct {
	queue.State
	Logs string `json:"logs"`
}

func (r *codexRig) show(name string) codexView {
	r.t.Helper()
	res := r.run("job", "show", "--json", testenv.ID(name))
	if res.Code != 0 {
		r.t.Fatalf("aq job show %s: %s", name, res)
	}
	var v codexView
	if err := json.Unmarshal([]byte(res.Stdout), &v); err != nil {
		r.t.Fatalf("job show --json: %v\n%s", err, res.Stdout)
	}
	return v
}

// logs is the job's log (aq job logs).
func (r *codexRig) logs(name string) string {
	r.t.Helper()
	return r.run("job", "logs", testenv.ID(name)).Stdout
}

// codexLeftRunning is the processes still running whose working
// directory is under dir (the aq home: the job's worktree is there, and
// codex and what it starts run in it): none may outlive a job.
func codexLeftRunning(t *testing.T, dir string) []string {
	t.Helper()
	procs, _ := filepath.Glob("/proc/[0-9]*")
	var left []string
	for _, p := range procs {
		cwd, err := os.Readlink(filepath.Join(p, "cwd"))
		if err != nil || !strings.HasPrefix(cwd, dir+string(os.PathSeparator)) {
			continue
		}
		cmdline, _ := os.ReadFile(filepath.Join(p, "cmdline"))
		left = append(left, filepath.Base(p)+" "+strings.ReplaceAll(string(cmdline), "\x00", " "))
	}
	return left
}

// codexNoSecrets fails t when any request the fake saw carries a marker
// of aq's secrets, and when the API key appears anywhere but in
// Authorization.
func codexNoSecrets(t *testing.T, fake *fakellm.ResponsesServer) {
	t.Helper()
	for i, req := range fake.Requests() {
		for k, vs := range req.Header {
			for _, v := range vs {
				if strings.Contains(v, codexSecretMarker) {
					t.Errorf("request %d (%s %s): header %s carries aq's secret", i, req.Method, req.Path, k)
				}
				if strings.Contains(v, codexAPIKey) && !strings.EqualFold(k, "Authorization") {
					t.Errorf("request %d: header %s carries the API key", i, k)
				}
			}
		}
		if strings.Contains(string(req.Body), codexSecretMarker) {
			t.Errorf("request %d (%s %s): the body carries aq's secret", i, req.Method, req.Path)
		}
		if strings.Contains(string(req.Body), codexAPIKey) {
			t.Errorf("request %d (%s %s): the body carries the API key", i, req.Method, req.Path)
		}
	}
}
