//go:build unix

package wire

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"io"
	"io/fs"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aqfleet/aq/agent/fleet"
	"github.com/aqfleet/aq/agent/manifest"
	"github.com/aqfleet/aq/cmd/aq/clitest"
	"github.com/aqfleet/aq/demo/coord"
	"github.com/aqfleet/aq/internal/testenv"
	"github.com/aqfleet/aq/job"
	"github.com/aqfleet/aq/profiles"
)

// The hostile coordinator of issue #26: a real HTTP server on 127.0.0.1
// that answers aq's fleet routes as the coordinator stub does, except where
// a test rewrites an answer — a claimed job's id or manifest, a Date header
// from a clock two minutes behind, a 400 to a report, a login page. The aq
// under test is the real binary, run as a factory would run it.

// exchange is one call to the hostile coordinator, as the stub answered it;
// a tamper may rewrite any of it before it is written.
type exchange struct {
	Method, Path string // Path without the API prefix, e.g. /fleet/claim
	ReqBody      []byte
	Status       int
	Header       http.Header
	Body         []byte
}

// route reports whether the exchange is "METHOD /path" (a trailing '*'
// matches any rest of the path).
func (x *exchange) route(r string) bool {
	m, p, _ := strings.Cut(r, " ")
	if m != x.Method {
		return false
	}
	if rest, ok := strings.CutSuffix(p, "*"); ok {
		return strings.HasPrefix(x.Path, rest)
	}
	return x.Path == p
}

type hostileCoord struct {
	t    *testing.T
	stub *coord.Server
	URL  string // the API base (…/api)

	mu      sync.Mutex
	tampers []func(*exchange)
	// reqTampers rewrite a request's body before the stub sees it (the
	// factory is told nothing: a coordinator that ignores what it sent).
	reqTampers []func(x *exchange)
	// aliases map an id the hostile coordinator handed out to the stub's
	// job: requests that name it are sent to the stub as the real one.
	aliases map[string]string
	// clock is the coordinator's clock for the Date header (nil: real).
	clock func() time.Time
	calls []exchange
}

// newHostile starts the stub behind the hostile front.
func newHostile(t *testing.T, o coord.Options) *hostileCoord {
	t.Helper()
	if o.ReapEvery == 0 {
		o.ReapEvery = 100 * time.Millisecond
	}
	if o.MaxBackoff == 0 {
		o.MaxBackoff = 50 * time.Millisecond
	}
	s, err := coord.New(o)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	s.Start(ctx)
	h := &hostileCoord{t: t, stub: s, aliases: map[string]string{}}
	hs := httptest.NewServer(h)
	t.Cleanup(func() {
		hs.Close()
		cancel()
		s.Close()
	})
	h.URL = hs.URL + "/api"
	return h
}

// tamper adds a rewrite, applied to every exchange in the order added.
func (h *hostileCoord) tamper(fn func(*exchange)) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.tampers = append(h.tampers, fn)
}

// tamperRequest adds a rewrite of requests (x.ReqBody) before the stub
// answers them.
func (h *hostileCoord) tamperRequest(fn func(x *exchange)) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.reqTampers = append(h.reqTampers, fn)
}

// alias makes requests naming fake go to the stub's job real.
func (h *hostileCoord) alias(fake, real string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.aliases[fake] = real
}

// requests returns the calls made to route so far, as sent.
func (h *hostileCoord) requests(route string) []exchange {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []exchange
	for _, x := range h.calls {
		if x.route(route) {
			out = append(out, x)
		}
	}
	return out
}

func (h *hostileCoord) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	h.mu.Lock()
	tampers := append([]func(*exchange){}, h.tampers...)
	reqTampers := append([]func(*exchange){}, h.reqTampers...)
	aliases := make(map[string]string, len(h.aliases))
	for k, v := range h.aliases {
		aliases[k] = v
	}
	clock := h.clock
	h.mu.Unlock()
	path := strings.TrimPrefix(r.URL.Path, "/api")
	sent := append([]byte{}, body...)
	fwdPath := r.URL.EscapedPath()
	for fake, real := range aliases {
		fj, _ := json.Marshal(fake)
		rj, _ := json.Marshal(real)
		body = bytes.ReplaceAll(body, fj, rj)
		fwdPath = strings.ReplaceAll(fwdPath, url.PathEscape(fake), url.PathEscape(real))
	}
	for _, fn := range reqTampers {
		x := &exchange{Method: r.Method, Path: path, ReqBody: body}
		fn(x)
		body = x.ReqBody
	}
	req := r.Clone(r.Context())
	req.Body = io.NopCloser(bytes.NewReader(body))
	req.ContentLength = int64(len(body))
	req.URL.RawPath = ""
	req.URL.Path, _ = url.PathUnescape(fwdPath)
	rec := httptest.NewRecorder()
	h.stub.ServeHTTP(rec, req)
	x := &exchange{Method: r.Method, Path: path, ReqBody: sent, Status: rec.Code, Header: rec.Header().Clone(), Body: rec.Body.Bytes()}
	if clock == nil {
		clock = time.Now
	}
	x.Header.Set("Date", clock().UTC().Format(http.TimeFormat))
	for _, fn := range tampers {
		fn(x)
	}
	h.mu.Lock()
	h.calls = append(h.calls, *x)
	h.mu.Unlock()
	for k, v := range x.Header {
		w.Header()[k] = v
	}
	w.Header().Set("Content-Length", "")
	w.Header().Del("Content-Length")
	w.WriteHeader(x.Status)
	w.Write(x.Body)
}

// editJSON rewrites a JSON answer through fn (which gets it decoded into a
// generic map).
func editJSON(t *testing.T, body []byte, fn func(m map[string]any)) []byte {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal(body, &m); err != nil {
		t.Errorf("the stub's answer is not JSON: %v: %s", err, body)
		return body
	}
	fn(m)
	out, err := json.Marshal(m)
	if err != nil {
		t.Error(err)
	}
	return out
}

// claimedJob rewrites the job document of a claim or accept answer.
func claimedJob(t *testing.T, x *exchange, fn func(job map[string]any)) {
	if x.Status != http.StatusOK || !(x.route("POST /fleet/claim") || x.route("POST /fleet/accept")) {
		return
	}
	x.Body = editJSON(t, x.Body, func(m map[string]any) {
		if j, ok := m["job"].(map[string]any); ok {
			fn(j)
		}
	})
}

// wireEnv is one factory's home (real aq binary) against a hostile
// coordinator, with a repo "app" (and its bare origin) under the repo base.
type wireEnv struct {
	t      *testing.T
	h      *testenv.Home
	co     *hostileCoord
	root   string // the temp dir holding everything the test made
	origin string
	dir    string // manifests and scripts
}

func newWireEnv(t *testing.T, o coord.Options, env ...string) *wireEnv {
	t.Helper()
	testenv.Slow(t, "runs the aq binary") // before the coordinator and the repo, not after
	e := &wireEnv{t: t, h: testenv.NewHome(t), co: newHostile(t, o)}
	e.root = filepath.Dir(e.h.Dir)
	e.dir = filepath.Join(e.root, "in")
	if err := os.MkdirAll(e.dir, 0o755); err != nil {
		t.Fatal(err)
	}
	e.origin = testenv.AddOrigin(t, e.h.Repo(t, "app", nil))
	e.h.Env = append([]string{
		"AQ_FLEET=1", "AQ_FLEET_API=" + e.co.URL, "AQ_FLEET_TOKEN=" + e.co.stub.EnrollToken(), "AQ_FACTORY_ID=fw",
		"AQ_HEARTBEAT_SEC=1", "AQ_FLEET_LEASE_RENEW_SEC=1", "AQ_ENGINES=all",
		// What is under test is aq's side of the wire; the engines' scripts
		// live outside their worktrees, which the sandbox (#23, tested on
		// its own) would not let them read.
		"AQ_SANDBOX=off",
	}, env...)
	e.h.Bin = testenv.BuildAQ(t)
	return e
}

// post submits a manifest to the coordinator as a job author would, with no
// check of aq's on the way (the coordinator takes what it is given).
func (e *wireEnv) post(id, front, body string) string {
	e.t.Helper()
	raw := "---\nid: " + id + "\n" + front + "\n---\n" + body + "\n"
	cat, _ := profiles.Embedded()
	j, err := manifest.Parse(id+".md", []byte(raw), cat)
	if err != nil {
		// A manifest aq would refuse: the coordinator holds it anyway.
		j, err = manifest.Parse(id+".md", []byte("---\nid: "+id+"\nrepo: app\nengine: script\nscript: \"true\"\n---\n# x\n"), cat)
		if err != nil {
			e.t.Fatal(err)
		}
	}
	c, err := fleet.NewClient(fleet.ClientOptions{API: e.co.URL, Token: e.co.stub.EnrollToken()})
	if err != nil {
		e.t.Fatal(err)
	}
	if _, err := c.Submit(context.Background(), j, []byte(raw)); err != nil {
		e.t.Fatal(err)
	}
	return raw
}

// script writes a shell script for a job and returns its path.
func (e *wireEnv) script(name, text string) string {
	e.t.Helper()
	p := filepath.Join(e.dir, name+".sh")
	testenv.WriteFile(e.t, p, text)
	return p
}

func (e *wireEnv) run(args ...string) testenv.Result {
	e.t.Helper()
	return e.h.Run(e.t, args...)
}

// job is the stub's view of a job.
func (e *wireEnv) job(id string) coord.Job {
	e.t.Helper()
	j, ok := e.co.stub.Job(id)
	if !ok {
		e.t.Fatalf("the coordinator has no job %s", id)
	}
	return j
}

// tree lists every path under root (relative), for "nothing was created
// outside $AQ_HOME and the worktree".
func tree(t *testing.T, root string) map[string]bool {
	t.Helper()
	out := map[string]bool{}
	filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return nil
		}
		rel, _ := filepath.Rel(root, p)
		out[rel] = true
		return nil
	})
	return out
}

// assertOnlyUnder fails when a path appeared under root (between before and
// now) that is not below one of the allowed prefixes (relative to root).
func assertOnlyUnder(t *testing.T, root string, before map[string]bool, allowed ...string) {
	t.Helper()
	var stray []string
	for p := range tree(t, root) {
		if before[p] {
			continue
		}
		ok := false
		for _, a := range allowed {
			if p == a || strings.HasPrefix(p, a+string(filepath.Separator)) {
				ok = true
				break
			}
		}
		if !ok {
			stray = append(stray, p)
		}
	}
	sort.Strings(stray)
	if len(stray) > 0 {
		t.Fatalf("created outside $AQ_HOME and the worktree: %v", stray)
	}
}

// assertNoBranch fails when origin has a branch of aq's for id.
func (e *wireEnv) assertNoBranch(ids ...string) {
	e.t.Helper()
	refs := testenv.RemoteRefs(e.t, e.origin, "refs/heads/aq/")
	if len(refs) > 0 {
		e.t.Fatalf("branches pushed to origin: %v", refs)
	}
}

// oneLine fails unless stderr has exactly one "aq: " line (the error aq
// prints; log lines are key=value) and returns it.
func oneAQLine(t *testing.T, r testenv.Result) string {
	t.Helper()
	var lines []string
	for _, l := range strings.Split(r.Stderr, "\n") {
		if strings.HasPrefix(l, "aq: ") {
			lines = append(lines, l)
		}
	}
	if len(lines) != 1 {
		t.Fatalf("want one 'aq: ' line on stderr, got %d:\n%s", len(lines), clipped(r))
	}
	return lines[0]
}

// Finding 1: a claimed job's id is checked like a manifest's before
// anything touches the file system or git: an id that would climb out of
// $AQ_HOME, one with a '/', or 10 KB of it is refused with invalid_job
// (failed at the coordinator, not retried), in one clipped line, exit 1;
// nothing is created outside $AQ_HOME, no branch is pushed, the engine
// never runs and the report reaches the coordinator.
func TestWireClaimedIDChecked(t *testing.T) {
	for _, c := range []struct{ name, fake, shown string }{
		{"climbs out", "../../escape-x", `"../../escape-x"`},
		{"slash", "a/b", `"a/b"`},
		{"10 KB", strings.Repeat("x", 10<<10), `"` + strings.Repeat("x", 64) + `"… (10240 bytes)`},
	} {
		t.Run(c.name, func(t *testing.T) {
			e := newWireEnv(t, coord.Options{})
			id := testenv.ID("wire-id")
			ran := filepath.Join(e.root, "ran")
			e.post(id, "repo: app\nengine: script\nship: branch\nscript: touch "+ran, "# job")
			e.co.alias(c.fake, id)
			e.co.tamper(func(x *exchange) {
				claimedJob(t, x, func(j map[string]any) {
					j["id"] = c.fake // the manifest in bodyMd keeps its own, valid id
				})
			})
			before := tree(t, e.root)
			r := e.run("run", "--once")
			line := oneAQLine(t, r)
			if r.Code != 1 || !strings.Contains(line, "invalid_job") || !strings.Contains(line, c.shown) || len(line) > 600 {
				t.Fatalf("want exit 1 and one line naming invalid_job and %s:\n%s", c.shown, clipped(r))
			}
			assertOnlyUnder(t, e.root, before, "home")
			for _, p := range []string{"worktrees", "logs", "locks/jobs"} {
				if ents, _ := os.ReadDir(filepath.Join(e.h.Dir, p, "app")); p == "worktrees" && len(ents) > 0 {
					t.Fatalf("a worktree was made: %v", ents)
				}
			}
			if testenv.Exists(ran) {
				t.Fatal("the engine ran")
			}
			e.assertNoBranch()
			if j := e.job(id); j.Stage != coord.StageFailed || j.Reason != "invalid_job" {
				t.Fatalf("the coordinator has the job %s (%s), want failed (invalid_job)", j.Stage, j.Reason)
			}
			if dead, _ := os.ReadDir(filepath.Join(e.h.Dir, "spool", "dead")); len(dead) > 0 {
				t.Fatalf("a report was refused: %v", dead)
			}
		})
	}
}

// clipped is r for a failure message, with runs of a repeated character
// (a 10 KB id) cut short.
func clipped(r testenv.Result) string {
	s := r.String()
	var b strings.Builder
	run := 0
	for i := 0; i < len(s); i++ {
		if i > 0 && s[i] == s[i-1] {
			run++
		} else {
			run = 0
		}
		if run < 80 {
			b.WriteByte(s[i])
		} else if run == 80 {
			b.WriteString("…")
		}
	}
	return b.String()
}

// Finding 3: a fleet factory does not offer the script engine unless its
// operator opts in (AQ_ENGINES): a script job is not claimed, and one a
// coordinator hands out anyway is refused (capability_mismatch: another
// factory may run it) before anything runs; an engine AQ_ENGINES lists but
// the host lacks is said once at start.
func TestWireScriptIsOptIn(t *testing.T) {
	e := newWireEnv(t, coord.Options{}, "AQ_ENGINES=", "PATH=/usr/local/bin:/usr/bin:/bin")
	id := testenv.ID("wire-script")
	ran := filepath.Join(e.root, "ran")
	e.post(id, "repo: app\nengine: script\nship: branch\nscript: touch "+ran, "# job")
	before := tree(t, e.root)

	r := e.run("run", "--once")
	if r.Code != 3 || !strings.Contains(r.Stderr, "no runnable job in the fleet") {
		t.Fatalf("a factory with the default AQ_ENGINES: want exit 3, no job:\n%s", clipped(r))
	}
	for _, x := range append(e.co.requests("POST /fleet/claim"), e.co.requests("POST /fleet/factories/enroll")...) {
		if bytes.Contains(x.ReqBody, []byte(`"engine:script"`)) || bytes.Contains(x.ReqBody, []byte(`"script"`)) {
			t.Fatalf("%s %s offers script: %s", x.Method, x.Path, x.ReqBody)
		}
	}

	// A coordinator that hands the job out all the same.
	e.co.tamperRequest(func(x *exchange) {
		if x.route("POST /fleet/claim") {
			x.ReqBody = bytes.Replace(x.ReqBody, []byte(`"capabilities":[`), []byte(`"capabilities":["engine:script",`), 1)
		}
	})
	r = e.run("run", "--once")
	line := oneAQLine(t, r)
	if r.Code != 1 || !strings.Contains(line, "refused (capability_mismatch): engine script is not offered by this factory (AQ_ENGINES: claude,codex,devin)") {
		t.Fatalf("want exit 1 and the refusal:\n%s", clipped(r))
	}
	if testenv.Exists(ran) {
		t.Fatal("the script ran")
	}
	assertOnlyUnder(t, e.root, before, "home")
	e.assertNoBranch()
	if j := e.job(id); j.Reason != string(job.ReasonCapabilityMismatch) || j.Stage == coord.StageShipped {
		t.Fatalf("the coordinator has the job %s (%s), want it failed capability_mismatch and retryable", j.Stage, j.Reason)
	}

	// Listed but not installed: one line at start.
	e.h.Env = append(e.h.Env, "AQ_ENGINES=devin,script")
	r = e.run("run", "--once")
	if n := strings.Count(r.Stderr, "engine devin is in AQ_ENGINES but not installed: not offered"); n != 1 {
		t.Fatalf("want the line once, got %d:\n%s", n, clipped(r))
	}
}

// Finding 2: in fleet mode a job names its repository; one that names it
// by URL (file:// to a repository the factory never offered) is refused
// with invalid_job before anything is cloned or pushed, and `aq submit` in
// fleet mode refuses to post it.
func TestWireRepoIsAName(t *testing.T) {
	e := newWireEnv(t, coord.Options{})
	secret := testenv.AddOrigin(t, testenv.NewRepo(t, filepath.Join(e.root, "elsewhere"), "secret", nil))
	id := testenv.ID("wire-url")
	ran := filepath.Join(e.root, "ran")
	front := "repo: file://" + secret + "\nengine: script\nship: branch\nscript: touch " + ran
	e.post(id, front, "# job")
	// The coordinator keeps the name the manifest's URL ends in.
	e.co.tamper(func(x *exchange) { claimedJob(t, x, func(j map[string]any) { j["repo"] = "secret" }) })
	before := tree(t, e.root)
	r := e.run("run", "--once")
	line := oneAQLine(t, r)
	if r.Code != 1 || !strings.Contains(line, "refused (invalid_job): repo: \"file://"+secret+"\" is a URL or a path; in fleet mode a job names a repository (repo: secret)") {
		t.Fatalf("want exit 1 and the refusal:\n%s", clipped(r))
	}
	if testenv.Exists(ran) || testenv.Exists(filepath.Join(e.h.RepoBase, "secret")) {
		t.Fatal("the job ran, or the repository was cloned into the repo base")
	}
	assertOnlyUnder(t, e.root, before, "home")
	if refs := testenv.RemoteRefs(t, secret, "refs/heads/aq/"); len(refs) > 0 {
		t.Fatalf("pushed into the repository named by URL: %v", refs)
	}
	if j := e.job(id); j.Stage != coord.StageFailed || j.Reason != "invalid_job" {
		t.Fatalf("the coordinator has the job %s (%s), want failed (invalid_job)", j.Stage, j.Reason)
	}

	// aq submit in fleet mode: nothing posted.
	m := filepath.Join(e.dir, "url.md")
	testenv.WriteFile(t, m, "---\nid: url-job\n"+front+"\n---\n# job\n")
	r = e.run("submit", m)
	if r.Code != 2 || !strings.Contains(r.Stderr, "is a URL or a path; in fleet mode a job names a repository") {
		t.Fatalf("aq submit: want exit 2 and the reason:\n%s", clipped(r))
	}
	if _, ok := e.co.stub.Job("url-job"); ok {
		t.Fatal("the job was posted")
	}
}

// Finding 4: the engine's environment is built from a documented base,
// its own credential and AQ_ENGINE_ENV — aq's settings (AQ_HOME, the fleet
// URL, the repo base), the credentials aq ships with (GITHUB_TOKEN,
// GH_TOKEN), git's credential variables and SSH_AUTH_SOCK do not reach it,
// so a job cannot commit the factory's token to its branch; and a secret it
// does get (passed on purpose) is masked base64- and URL-encoded as well as
// plain, in the logs and in the uploaded artifacts.
func TestWireEngineEnvironment(t *testing.T) {
	const apiKey = "sk-wire-0123456789abcdef+/=&?"
	e := newWireEnv(t, coord.Options{},
		"GITHUB_TOKEN=ghp_wire0123456789", "GH_TOKEN=gho_wire0123456789", "SSH_AUTH_SOCK=/tmp/wire-agent.sock",
		"GIT_ASKPASS=/bin/echo", "GIT_SSH_COMMAND=ssh -i /nonexistent", "AQ_REPO_URLS=file:///nonexistent/{repo}.git",
		"MY_API_KEY="+apiKey, "MY_TOOL_HOME=/opt/tool", "AQ_ENGINE_ENV=MY_API_KEY,MY_TOOL_HOME")
	id := testenv.ID("wire-env")
	// The key's value stays out of the change (#32: aq refuses to push a
	// secret it holds); that the engine has the variable is what counts.
	script := e.script("env", `env | sed 's/^MY_API_KEY=.*/MY_API_KEY=(set)/' | sort > env.txt
cat "$AQ_HOME/credentials" > creds.txt 2>/dev/null || true
printf %s "$MY_API_KEY" | base64
printf 'x%s' "$MY_API_KEY" | base64
echo "url: $(printf %s "$MY_API_KEY" | sed -e 's/+/%2B/g; s|/|%2F|g; s/=/%3D/g; s/&/%26/g; s/?/%3F/g')"
echo "plain: $MY_API_KEY" >&2
`)
	e.post(id, "repo: app\nengine: script\nship: branch\nscript: /bin/sh "+script, "# job")
	r := e.run("run", "--once")
	if r.Code != 0 {
		t.Fatalf("the job: %s", clipped(r))
	}
	files := testenv.TreeFiles(t, e.origin, "aq/job/"+id)
	env := files["env.txt"]
	if env == "" {
		t.Fatalf("no env.txt on the pushed branch: %v", files)
	}
	for _, gone := range []string{"AQ_HOME", "AQ_FLEET_API", "AQ_REPO_BASE", "AQ_REPO_URLS", "AQ_FLEET_TOKEN", "AQ_ENGINES", "GITHUB_TOKEN", "GH_TOKEN",
		"SSH_AUTH_SOCK", "GIT_ASKPASS", "GIT_SSH_COMMAND"} {
		if strings.Contains("\n"+env, "\n"+gone+"=") {
			t.Errorf("%s reached the engine", gone)
		}
	}
	for _, kept := range []string{"PATH=", "HOME=", "AQ_JOB_ID=" + id, "MY_TOOL_HOME=/opt/tool", "MY_API_KEY="} {
		if !strings.Contains("\n"+env, "\n"+kept) {
			t.Errorf("%s is missing from the engine's environment", kept)
		}
	}
	creds, _ := os.ReadFile(filepath.Join(e.h.Dir, "credentials"))
	tok := ""
	var c struct{ Token string }
	if json.Unmarshal(creds, &c) == nil {
		tok = c.Token
	}
	if tok == "" || strings.Contains(files["creds.txt"], tok) || files["creds.txt"] != "" {
		t.Errorf("the engine read the factory's credentials (token %q): %q", tok, files["creds.txt"])
	}

	// What the engine printed, in the logs and in the uploaded artifacts.
	enc := []string{apiKey, base64.StdEncoding.EncodeToString([]byte(apiKey)), strings.TrimRight(base64.StdEncoding.EncodeToString([]byte("x"+apiKey)), "=")[4:20],
		url.QueryEscape(apiKey), strings.NewReplacer("+", "%2B", "/", "%2F", "=", "%3D", "&", "%26", "?", "%3F").Replace(apiKey)}
	var texts []string
	for _, n := range []string{"stdout.log", "stderr.log"} {
		texts = append(texts, testenv.ReadFile(t, filepath.Join(e.h.Dir, "logs", id, n)))
	}
	testenv.WaitFor(t, time.Minute, "the job's artifacts", func() bool { return len(e.co.stub.Artifacts(id)) >= 2 })
	for _, a := range e.co.stub.Artifacts(id) {
		b, _ := e.co.stub.ArtifactContent(a.ID)
		texts = append(texts, string(b))
	}
	all := strings.Join(texts, "\n")
	if !strings.Contains(all, "plain: ***") || !strings.Contains(all, "url: ***") {
		t.Errorf("the logs do not show the masked lines:\n%s", all)
	}
	for _, s := range enc {
		if strings.Contains(all, s) {
			t.Errorf("%q (a form of the secret) is in the logs or artifacts", s)
		}
	}
}

// Finding 5: a coordinator whose clock is 120 s behind the factory's (its
// Date header and lease expiries say so) used to fail every job lease_lost
// after the engine ran, with no renewal tried: leases are timed on the
// factory's clock from the durations granted, the job renews and ships,
// and the skew is said once, with both clocks.
func TestWireCoordinatorClockBehind(t *testing.T) {
	skew := -120 * time.Second
	clock := func() time.Time { return time.Now().Add(skew) }
	e := newWireEnv(t, coord.Options{LeaseTTL: 6 * time.Second, Now: clock})
	e.co.clock = clock
	id := testenv.ID("wire-clock")
	// Longer than the lease: it must be renewed while the engine runs.
	e.post(id, "repo: app\nengine: script\nship: branch\nscript: sleep 8; echo done > done.txt", "# job")
	r := e.run("run", "--once")
	if r.Code != 0 || !strings.Contains(r.Stdout, "job "+id+": shipped") {
		t.Fatalf("the job: %s", clipped(r))
	}
	if n := e.co.stub.Stats().Routes[coord.RouteRenew].Status["200"]; n < 2 {
		t.Fatalf("%d renewals, want the lease renewed while the engine ran", n)
	}
	lines := 0
	for _, l := range strings.Split(r.Stderr, "\n") {
		// The Date header has a second's resolution.
		if strings.Contains(l, "the coordinator's clock is 2m0s behind this host's") || strings.Contains(l, "the coordinator's clock is 2m1s behind this host's") {
			lines++
			if !strings.Contains(l, "coordinator=") || !strings.Contains(l, "factory=") {
				t.Errorf("the skew line does not give both clocks: %s", l)
			}
		}
	}
	if lines != 1 {
		t.Fatalf("the skew was said %d times, want once:\n%s", lines, clipped(r))
	}
}

// Finding 6: a report the coordinator refuses is not called success. A 400
// (or a 200 whose JSON is cut off) to the terminal PATCH makes `aq run`
// exit 6 with one line, keeps the report in spool/dead and `aq job show`
// says so; a 400 to the building PATCH stops the job before its engine.
func TestWireRefusedReports(t *testing.T) {
	terminal := func(x *exchange) bool {
		return x.route("PATCH /fleet/jobs/*") && !bytes.Contains(x.ReqBody, []byte(`"stage":"building"`))
	}
	for _, c := range []struct {
		name   string
		status int
		body   string
		ctype  string
		want   string
	}{
		{"400", http.StatusBadRequest, `{"error":"stage shipped is not allowed for this product"}`, "application/json", "400 Bad Request: stage shipped is not allowed for this product"},
		{"200 with cut JSON", http.StatusOK, `{"id":"x","stage":"shi`, "application/json", "is not the contract's JSON: unexpected end of JSON input"},
	} {
		t.Run("terminal "+c.name, func(t *testing.T) {
			e := newWireEnv(t, coord.Options{})
			id := testenv.ID("wire-report")
			e.post(id, "repo: app\nengine: script\nship: branch\nscript: echo x > x.txt", "# job")
			e.co.tamper(func(x *exchange) {
				if terminal(x) {
					x.Status, x.Body = c.status, []byte(c.body)
					x.Header.Set("Content-Type", c.ctype)
				}
			})
			r := e.run("run", "--once")
			line := oneAQLine(t, r)
			if r.Code != 6 || !strings.Contains(line, "aq: job "+id+" ended shipped") || !strings.Contains(line, "but the coordinator refused its report") ||
				!strings.Contains(line, c.want) || !strings.Contains(line, "spool/dead") {
				t.Fatalf("want exit 6 and one line saying the report was refused (%s):\n%s", c.want, clipped(r))
			}
			if dead, _ := os.ReadDir(filepath.Join(e.h.Dir, "spool", "dead")); len(dead) != 1 {
				t.Fatalf("the refused report is not kept in spool/dead: %v", dead)
			}
			show := e.run("job", "show", id)
			if show.Code != 0 || !strings.Contains(show.Stdout, "refused by the coordinator: ") || !strings.Contains(show.Stdout, c.want) {
				t.Fatalf("aq job show does not say the report was refused:\n%s", clipped(show))
			}
		})
	}
	t.Run("building 400", func(t *testing.T) {
		e := newWireEnv(t, coord.Options{})
		id := testenv.ID("wire-building")
		ran := filepath.Join(e.root, "ran")
		e.post(id, "repo: app\nengine: script\nship: branch\nscript: touch "+ran, "# job")
		e.co.tamper(func(x *exchange) {
			if x.route("PATCH /fleet/jobs/*") && bytes.Contains(x.ReqBody, []byte(`"stage":"building"`)) {
				x.Status, x.Body = http.StatusBadRequest, []byte(`{"error":"no such stage"}`)
			}
		})
		r := e.run("run", "--once")
		line := oneAQLine(t, r)
		if r.Code != 6 || !strings.Contains(line, "was stopped before its engine, but the coordinator refused its report") || !strings.Contains(line, "no such stage") {
			t.Fatalf("want exit 6 and the job stopped before its engine:\n%s", clipped(r))
		}
		if testenv.Exists(ran) {
			t.Fatal("the engine ran after the building report was refused")
		}
		e.assertNoBranch()
		if j := e.job(id); j.Reason != "report_refused" || j.Stage == coord.StageBuilding || j.Stage == coord.StageAssigned {
			t.Fatalf("the coordinator has the job %s (%s), want it released with report_refused", j.Stage, j.Reason)
		}
	})
}

// Finding 7: a coordinator answering HTML (a proxy's login page) or an
// answer over the size cap is a configuration error before any job ran —
// exit 2, one line that names the content type or the cap and AQ_FLEET_API
// — not "a job failed" (1) with "unexpected end of JSON input".
func TestWireAnswerNotTheContract(t *testing.T) {
	big := append([]byte(`{"job":{"id":"j","bodyMd":"`), bytes.Repeat([]byte("x"), 9<<20)...)
	for _, c := range []struct {
		name, ctype string
		body        []byte
		want        string
	}{
		{"login page", "text/html; charset=utf-8", []byte("<!DOCTYPE html>\n<html><body><form>Sign in</form></body></html>"),
			`(200 OK, text/html; charset=utf-8) is not the contract's JSON: it starts with "<!DOCTYPE html>`},
		{"garbage", "application/json", []byte("\x00\x01 not json"), "(200 OK, application/json) is not the contract's JSON"},
		{"over the cap", "application/json", big, "(200 OK, application/json) is over the 8 MiB cap on an answer"},
	} {
		t.Run(c.name, func(t *testing.T) {
			e := newWireEnv(t, coord.Options{})
			id := testenv.ID("wire-html")
			ran := filepath.Join(e.root, "ran")
			e.post(id, "repo: app\nengine: script\nship: branch\nscript: touch "+ran, "# job")
			e.co.tamper(func(x *exchange) {
				if x.route("POST /fleet/claim") {
					x.Status, x.Body = http.StatusOK, c.body
					x.Header.Set("Content-Type", c.ctype)
				}
			})
			before := tree(t, e.root)
			r := e.run("run", "--once")
			line := oneAQLine(t, r)
			if r.Code != 2 || !strings.Contains(line, "the coordinator's answer to POST /fleet/claim "+c.want) || !strings.Contains(line, "check AQ_FLEET_API") {
				t.Fatalf("want exit 2 and one line naming %q and AQ_FLEET_API:\n%s", c.want, clipped(r))
			}
			if testenv.Exists(ran) {
				t.Fatal("a job ran")
			}
			assertOnlyUnder(t, e.root, before, "home")
			e.assertNoBranch()
		})
	}
}

// Finding 9: a lost lease is told one way. The coordinator keeps the lease
// (its own clock says it holds) while it tells the factory the lease is
// short and answers every renewal 503: the factory counts the lease lost,
// stops the engine, keeps its work on this host and says exactly that —
// the checkpoint is not pushed, and the /fleet/fail it sends (delivered)
// names no checkpoint origin does not have; docs/fleet.md says the same.
func TestWireLeaseLostToldOneWay(t *testing.T) {
	e := newWireEnv(t, coord.Options{LeaseTTL: 5 * time.Minute})
	id := testenv.ID("wire-lost")
	e.post(id, "repo: app\nengine: script\nship: branch\nscript: echo work > work.txt; sleep 60", "# job")
	e.co.tamper(func(x *exchange) {
		switch {
		case x.route("POST /fleet/jobs/*") && strings.HasSuffix(x.Path, "/lease/renew"):
			x.Status, x.Body = http.StatusServiceUnavailable, []byte(`{"error":"try later"}`)
		case x.route("POST /fleet/claim"):
			date, _ := http.ParseTime(x.Header.Get("Date"))
			// Long enough for a loaded host to prepare the job and start
			// its engine (which writes its work at once) before the lease
			// runs out: at 4 s the race-built aq under make test's load
			// could lose it before the engine ran.
			x.Body = editJSON(t, x.Body, func(m map[string]any) { m["leaseExpiresAt"] = date.Add(12 * time.Second).Format(time.RFC3339Nano) })
		}
	})
	r := e.run("run", "--once")
	line := oneAQLine(t, r)
	want := "aq: job " + id + " lost its lease (lease_lost): "
	said := "its work is checkpointed on aq/wip/" + id + " on this host, not pushed (the lease may be another factory's); nothing else was pushed; " +
		"the coordinator was told (/fleet/fail lease_lost, report delivered)"
	if r.Code != 4 || !strings.HasPrefix(line, want) || !strings.Contains(line, said) {
		t.Fatalf("want exit 4 and the one message:\n  %s…%s\n%s", want, said, clipped(r))
	}
	fails := e.co.requests("POST /fleet/fail")
	if len(fails) != 1 {
		t.Fatalf("%d fail reports, want 1", len(fails))
	}
	var f struct{ Reason, Checkpoint string }
	json.Unmarshal(fails[0].ReqBody, &f)
	if f.Reason != "lease_lost" || f.Checkpoint != "" {
		t.Fatalf("the fail report names reason %q, checkpoint %q: a checkpoint that was never pushed", f.Reason, f.Checkpoint)
	}
	if refs := testenv.RemoteRefs(t, e.origin, "refs/heads/aq/"); len(refs) > 0 {
		t.Fatalf("pushed after the lease was lost: %v", refs)
	}
	if got := testenv.Git(t, e.h.RepoBase+"/app", "rev-parse", "--verify", "refs/heads/aq/wip/"+id); got == "" {
		t.Fatal("the work is not checkpointed on this host")
	}
	doc := testenv.ReadFile(t, filepath.Join(clitest.ModuleRoot(t), "docs", "fleet.md"))
	if !strings.Contains(strings.Join(strings.Fields(doc), " "), "checkpointed on aq/wip/<id> on this host, not pushed (the lease may be another factory's); nothing else was pushed;") {
		t.Fatal("docs/fleet.md does not say what the CLI says of a lost lease")
	}
}

// Finding 11, smaller ones: a title taken from the body keeps no escape
// sequence (aq job show printed it raw); a 10 KB id is not echoed whole;
// base HEAD and the job's own aq/job/<id> are refused by validate, not at
// run time.
func TestWireSmallerInputs(t *testing.T) {
	h := clitest.BinHome(t)
	h.Repo(t, "app", nil)
	dir := t.TempDir()
	esc := filepath.Join(dir, "esc.md")
	testenv.WriteFile(t, esc, "---\nid: esc-title\nrepo: app\nengine: script\nscript: \"true\"\n---\n# Fix \x1b[2J\x1b[31mthe\x1b]0;owned\x07 thing\n\nDo it.\n")
	if r := h.Run(t, "submit", esc); r.Code != 0 {
		t.Fatalf("submit: %s", r)
	}
	show := h.Run(t, "job", "show", "esc-title")
	if show.Code != 0 || strings.ContainsAny(show.Stdout, "\x1b\x07") || !strings.Contains(show.Stdout, "Fix [2J[31mthe]0;owned thing") {
		t.Fatalf("aq job show printed control characters: %q", show.Stdout)
	}

	long := filepath.Join(dir, "long.md")
	testenv.WriteFile(t, long, "---\nid: "+strings.Repeat("x", 10<<10)+"\nrepo: app\n---\n# x\n")
	r := h.Run(t, "validate", long)
	if r.Code != 1 || len(r.Stderr) > 600 || !strings.Contains(r.Stderr, "… (10240 bytes)") {
		t.Fatalf("a 10 KB id: want one short line: exit %d, %d bytes of stderr: %.300q", r.Code, len(r.Stderr), r.Stderr)
	}

	for _, c := range []struct{ base, want string }{
		{"HEAD", `base "HEAD" is not a branch name`},
		{"aq/job/self-base", `base "aq/job/self-base" is this job's own result branch`},
		{"aq/wip/other", `base "aq/wip/other" is an aq checkpoint branch, not a base`},
	} {
		m := filepath.Join(dir, "base.md")
		testenv.WriteFile(t, m, "---\nid: self-base\nrepo: app\nbase: "+c.base+"\n---\n# x\n")
		if r := h.Run(t, "validate", m); r.Code != 1 || !strings.Contains(r.Stderr, m+":4: "+c.want) {
			t.Fatalf("base %s: want exit 1 and %q: %s", c.base, c.want, r)
		}
	}
}

// Finding 11: a spool file whose name differs from its jobId was re-sent
// at every start (its removal looked for the name its content implied). It
// is corrupt: moved to spool/dead at once, with a line, and never sent.
func TestWireSpoolNameMismatch(t *testing.T) {
	e := newWireEnv(t, coord.Options{})
	spool := filepath.Join(e.h.Dir, "spool")
	if err := os.MkdirAll(filepath.Join(spool, "dead"), 0o700); err != nil {
		t.Fatal(err)
	}
	testenv.WriteFile(t, filepath.Join(spool, "00000000000000000001-renamed.json"),
		`{"v":1,"seq":1,"kind":"fail","jobId":"real-job","leaseEpoch":1,"fail":{"jobId":"real-job","leaseEpoch":1,"reason":"crash","retryable":true}}`)
	for i := 0; i < 2; i++ {
		if r := e.run("run", "--once"); r.Code != 3 {
			t.Fatalf("run %d: %s", i, clipped(r))
		}
	}
	if n := len(e.co.requests("POST /fleet/fail")); n != 0 {
		t.Fatalf("the mismatched spool file was sent %d times", n)
	}
	if _, err := os.Stat(filepath.Join(spool, "dead", "00000000000000000001-renamed.json")); err != nil {
		t.Fatalf("not moved to spool/dead: %v", err)
	}
}
