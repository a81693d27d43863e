package worktree

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/aqfleet/aq/internal/testenv"
)

func TestParseConfigList(t *testing.T) {
	out := "system\x00file:/etc/gitconfig\x00credential.https://h.example.com.helper\ngcloud.sh\x00" +
		"local\x00file:.git/config\x00core.bare\nfalse\x00" +
		"local\x00file:.git/config\x00core.quiet\x00" + // a key without a value
		"worktree\x00file:/r/.git/worktrees/w/config.worktree\x00filter.X.clean\nsed -e 's/a/b/'\nline two\x00" +
		"command\x00command line:\x00user.name\naq\x00"
	got := parseConfigList([]byte(out), true, "/r")
	want := []configEntry{
		{"system", "/etc/gitconfig", "credential.https://h.example.com.helper", "gcloud.sh", false},
		{"local", "/r/.git/config", "core.bare", "false", false},
		{"local", "/r/.git/config", "core.quiet", "", true},
		{"worktree", "/r/.git/worktrees/w/config.worktree", "filter.X.clean", "sed -e 's/a/b/'\nline two", false},
		{"command", "", "user.name", "aq", false},
	}
	if !slices.Equal(got, want) {
		t.Errorf("parse:\n got %+v\nwant %+v", got, want)
	}
	plain := parseConfigList([]byte("include.path\ninc.cfg\x00core.fsmonitor\n/x\x00"), false, "")
	if len(plain) != 2 || plain[1].key != "core.fsmonitor" || plain[1].value != "/x" {
		t.Errorf("parse without scope: %+v", plain)
	}
	for _, tc := range []struct{ key, sec, sub, v string }{
		{"core.fsmonitor", "core", "", "fsmonitor"},
		{"url.https://github.com/.insteadof", "url", "https://github.com/", "insteadof"},
		{"credential.https://h.example.com.helper", "credential", "https://h.example.com", "helper"},
		{"include.path", "include", "", "path"},
	} {
		if sec, sub, v := splitKey(tc.key); sec != tc.sec || sub != tc.sub || v != tc.v {
			t.Errorf("splitKey(%q) = %q %q %q", tc.key, sec, sub, v)
		}
	}
}

// TestPlanHarden: what is pinned, to what, for a repository's planted
// keys, with and without trusted values for them.
func TestPlanHarden(t *testing.T) {
	local := func(k, v string) configEntry { return configEntry{"local", "/r/.git/config", k, v, false} }
	global := func(k, v string) configEntry { return configEntry{"global", "/h/.gitconfig", k, v, false} }
	env := map[string]string{}
	in := func(entries ...configEntry) hardenInput {
		return hardenInput{entries: entries, lookup: func(k string) (string, bool) { v, ok := env[k]; return v, ok },
			dir: "/r", worktree: true, gitBin: "/usr/bin/git", noHooks: "/dev/null", globals: []string{"/h/.gitconfig"}}
	}
	pinned := func(s pinSet) map[string][]string {
		m := map[string][]string{}
		for _, p := range s.pins {
			m[p[0]] = append(m[p[0]], p[1])
		}
		return m
	}

	// Nothing planted: the fixed pins, no early file.
	s := planHarden(in(global("user.name", "x")))
	p := pinned(s)
	for k, want := range map[string]string{
		"core.hookspath": "/dev/null", "core.fsmonitor": "false", "core.sshcommand": "ssh", "core.askpass": "",
		"gpg.program": "gpg", "gpg.openpgp.program": "gpg", "gpg.x509.program": "gpgsm", "gpg.ssh.program": "ssh-keygen",
		"credential.helper": "",
	} {
		if got := p[k]; len(got) != 1 || got[0] != want {
			t.Errorf("%s pinned %q, want [%q]", k, got, want)
		}
	}
	if len(s.early) != 0 {
		t.Errorf("an early file with nothing first-wins planted:\n%s", strings.Join(s.early, "\n"))
	}
	for _, want := range []string{"GIT_ALLOW_PROTOCOL=file:git:http:https:ssh", "GIT_PROXY_COMMAND=", "GIT_WORK_TREE=/r"} {
		if !slices.Contains(s.env, want) {
			t.Errorf("env %q lacks %q", s.env, want)
		}
	}

	// Planted, with trusted values where the operator set some.
	s = planHarden(in(
		global("credential.helper", "store"),
		global("credential.https://github.com.helper", "!gh auth git-credential"),
		global("filter.lfs.clean", "git-lfs clean -- %f"),
		global("core.sshcommand", "ssh -i /k"),
		global("protocol.codecommit.allow", "always"),
		local("credential.helper", "/evil"),
		local("core.fsmonitor", "/evil"),
		local("core.sshcommand", "/evil"),
		local("filter.lfs.clean", "/evil"),
		local("filter.x.process", "/evil"),
		local("filter.x.required", "true"),
		local("diff.x.textconv", "/evil"),
		local("diff.external", "/evil"),
		local("merge.x.driver", "/evil %A"),
		local("core.alternaterefscommand", "/evil"),
		local("http.https://h.example.com/.proxy", "http://evil:8080"),
		local("http.sslverify", "false"),
		local("http.extraheader", "X: evil"),
		local("remote.origin.receivepack", "/evil"),
		local("remote.origin.url", "https://github.com/o/r.git"),
		local("url.https://evil.example/.insteadof", "https://github.com/"),
		local("url.https://evil.example/.pushinsteadof", "https://github.com/o/r.git"),
		local("protocol.ext.allow", "always"),
	))
	p = pinned(s)
	for k, want := range map[string][]string{
		"credential.helper":                    {"", "store"},
		"credential.https://github.com.helper": {"!gh auth git-credential"},
		"core.fsmonitor":                       {"false"},
		"core.sshcommand":                      {"ssh -i /k"},
		"filter.lfs.clean":                     {"git-lfs clean -- %f"},
		"filter.x.process":                     {""},
		"filter.x.required":                    {"false"},
		"diff.x.textconv":                      {""},
		"diff.external":                        {""},
		"merge.x.driver":                       {"'/usr/bin/git' merge-file --marker-size=%L %A %O %B"},
		"core.alternaterefscommand":            {""},
		"http.https://h.example.com/.proxy":    {""},
		"http.sslverify":                       {"true"},
		"http.extraheader":                     {""},
	} {
		if got := p[k]; !slices.Equal(got, want) {
			t.Errorf("%s pinned %q, want %q", k, got, want)
		}
	}
	if !slices.Contains(s.env, "GIT_ALLOW_PROTOCOL=file:git:http:https:ssh:codecommit") {
		t.Errorf("env %q: the trusted protocol is not allowed (or a planted one is)", s.env)
	}
	early := strings.Join(s.early, "\n")
	for _, want := range []string{
		"[include]\n\tpath = \"/h/.gitconfig\"",
		"[remote \"origin\"]\n\treceivepack = \"git-receive-pack\"",
		"[url \"https://github.com/o/r.git\"]\n\tinsteadOf = \"https://github.com/o/r.git\"",
		"[url \"https://github.com/o/r.git\"]\n\tpushInsteadOf = \"https://github.com/o/r.git\"",
	} {
		if !strings.Contains(early, want) {
			t.Errorf("early file lacks %q:\n%s", want, early)
		}
	}
	if strings.Index(early, "[include]") > strings.Index(early, "[remote") {
		t.Errorf("the globals are not included first:\n%s", early)
	}

	// A trusted rewrite stays what the URL becomes.
	s = planHarden(in(
		global("url.git@github.com:.insteadof", "https://github.com/"),
		local("remote.origin.url", "https://github.com/o/r.git"),
		local("url.https://evil.example/.insteadof", "https://github.com/o/"),
	))
	if early := strings.Join(s.early, "\n"); !strings.Contains(early, "[url \"git@github.com:o/r.git\"]\n\tinsteadOf = \"https://github.com/o/r.git\"") {
		t.Errorf("early file:\n%s", early)
	}
	// The environment's settings win and are kept.
	env = map[string]string{"GIT_SSH_COMMAND": "ssh -v", "GIT_ASKPASS": "/a", "GIT_ALLOW_PROTOCOL": "https", "GIT_PROXY_COMMAND": "/p", "https_proxy": "http://corp:3128"}
	s = planHarden(in(local("http.proxy", "http://evil:1")))
	p = pinned(s)
	if _, ok := p["core.sshcommand"]; ok {
		t.Error("core.sshCommand pinned under GIT_SSH_COMMAND")
	}
	if _, ok := p["core.askpass"]; ok {
		t.Error("core.askPass pinned under GIT_ASKPASS")
	}
	if got := p["http.proxy"]; !slices.Equal(got, []string{"http://corp:3128"}) {
		t.Errorf("http.proxy pinned %q, want the environment's proxy", got)
	}
	for _, kv := range s.env {
		if strings.HasPrefix(kv, "GIT_ALLOW_PROTOCOL=") || strings.HasPrefix(kv, "GIT_PROXY_COMMAND=") {
			t.Errorf("env %q overrides the host's", kv)
		}
	}
}

// TestHardenCache: the repository's configuration is read once while its
// files are unchanged — recently written ones compared byte for byte —
// and again after any change, a same-size rewrite with its modification
// time put back included.
func TestHardenCache(t *testing.T) {
	repo := newRepo(t)
	g := Git{ConfigDir: t.TempDir()}
	ctx := ctxT(t)
	env := g.at(repo).environ(nil)
	pins := func() string {
		t.Helper()
		out, err := g.at(repo).hardenEnv(ctx, repo, env)
		if err != nil {
			t.Fatal(err)
		}
		return strings.Join(out, "\n")
	}
	reads := configReads.Load()
	first := pins()
	if n := configReads.Load() - reads; n != 1 {
		t.Fatalf("first run read the configuration %d times, want 1", n)
	}
	for range 3 {
		if pins() != first {
			t.Fatal("an unchanged configuration gave other pins")
		}
	}
	if n := configReads.Load() - reads; n != 1 {
		t.Fatalf("three more runs on an unchanged configuration read it %d times in all, want 1 (the cache)", n)
	}
	cfg := filepath.Join(repo, ".git", "config")
	testenv.Git(t, repo, "config", "filter.planted.clean", "/evil")
	if got := pins(); !strings.Contains(got, "=filter.planted.clean") {
		t.Fatalf("a planted driver is not pinned after the change:\n%s", got)
	}
	// The same size, the old modification time: the change time or the
	// bytes tell.
	b, _ := os.ReadFile(cfg)
	fi, _ := os.Stat(cfg)
	same := strings.Replace(string(b), "filter \"planted\"", "filter \"PLANTED\"", 1)
	if len(same) != len(b) || same == string(b) {
		t.Fatal("the rewrite is not a same-size change")
	}
	os.WriteFile(cfg, []byte(same), 0o644)
	os.Chtimes(cfg, fi.ModTime(), fi.ModTime())
	if got := pins(); !strings.Contains(got, "=filter.PLANTED.clean") {
		t.Fatalf("a same-size rewrite was not seen:\n%s", got)
	}
	// A planted include target that does not exist yet: its appearance
	// is a change.
	testenv.Git(t, repo, "config", "includeIf.onbranch:nowhere.path", "later.cfg")
	pins()
	testenv.Git(t, "", "config", "-f", filepath.Join(repo, ".git", "later.cfg"), "merge.later.driver", "/evil")
	if got := pins(); !strings.Contains(got, "=merge.later.driver") {
		t.Fatalf("a file an include names, created later, was not read:\n%s", got)
	}
}

// TestHardenCacheOnePerGitDir: a repository's configuration is read once
// whatever ceiling git is given (none, its parent, the same twice) and a
// worktree's once wherever it is moved (the pool and back, #35) — its pins
// still name its own path — while ConfigGet, which answers from the same
// cache, still sees a change at once.
func TestHardenCacheOnePerGitDir(t *testing.T) {
	repo := newRepo(t)
	g := Git{ConfigDir: t.TempDir()}
	ctx := ctxT(t)
	reads := configReads.Load()
	base := g.environ(nil)
	for _, env := range [][]string{
		base,
		append(slices.Clone(base), "GIT_CEILING_DIRECTORIES="+filepath.Dir(repo)),
		append(slices.Clone(base), "GIT_CEILING_DIRECTORIES="+filepath.Dir(repo), "GIT_CEILING_DIRECTORIES="+filepath.Dir(repo)),
	} {
		if _, err := g.hardenEnv(ctx, repo, env); err != nil {
			t.Fatal(err)
		}
	}
	if n := configReads.Load() - reads; n != 1 {
		t.Fatalf("the repository's configuration was read %d times for three ceilings, want 1", n)
	}

	wt := addWorktree(t, repo, "cache", "main")
	reads = configReads.Load()
	pins := func(dir string) string {
		t.Helper()
		out, err := g.at(dir).hardenEnv(ctx, dir, g.at(dir).environ(nil))
		if err != nil {
			t.Fatal(err)
		}
		return strings.Join(out, "\n")
	}
	if !strings.Contains(pins(wt), "GIT_WORK_TREE="+wt) {
		t.Fatalf("the worktree's pins do not name it")
	}
	moved := filepath.Join(filepath.Dir(wt), "pooled")
	testenv.Git(t, repo, "worktree", "move", wt, moved)
	if got := pins(moved); !strings.Contains(got, "GIT_WORK_TREE="+moved) || strings.Contains(got, "GIT_WORK_TREE="+wt+"\n") {
		t.Fatalf("the moved worktree's pins do not name its new path:\n%s", got)
	}
	if n := configReads.Load() - reads; n != 0 {
		t.Fatalf("the worktree's configuration was read %d times before and after a move, want 0 (the repository's, read above, is the same)", n)
	}

	testenv.Git(t, repo, "config", "user.name", "Ada")
	if got, err := g.ConfigGet(ctx, moved, "user.name", "user.email"); err != nil || !strings.Contains(got, "user.name Ada") {
		t.Fatalf("ConfigGet after a change = %q, %v; want user.name Ada", got, err)
	}
	testenv.Git(t, repo, "config", "user.name", "Grace")
	if got, _ := g.ConfigGet(ctx, moved, "user.name"); !strings.HasSuffix(got, "user.name Grace") { // the last value wins
		t.Fatalf("ConfigGet after a second change = %q, want user.name Grace", got)
	}
}

// TestHardenCacheWorktreeSharesRepo: a linked worktree takes its
// repository's cached configuration, read under the same environment, when
// git reads the same there (#35) — and reads its own when it may not: with
// an include of any kind (an includeIf's gitdir: and onbranch: are the
// worktree's own) or extensions.worktreeConfig (its config.worktree).
func TestHardenCacheWorktreeSharesRepo(t *testing.T) {
	ctx := ctxT(t)
	for _, tc := range []struct {
		name   string
		config [][]string // git config arguments, in the repository
		reads  int64      // the worktree's own reads
		pinned string     // what must be in the worktree's pins
	}{
		{"plain", nil, 0, ""},
		{"includeIf", [][]string{{"includeIf.gitdir:**/worktrees/**.path", "wt.cfg"}}, 1, ""},
		{"include", [][]string{{"include.path", "more.cfg"}}, 1, ""},
		{"worktreeConfig", [][]string{{"extensions.worktreeConfig", "true"}}, 1, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			repo := newRepo(t)
			for _, c := range tc.config {
				testenv.Git(t, repo, append([]string{"config"}, c...)...)
			}
			wt := addWorktree(t, repo, "share", "main")
			if tc.name == "worktreeConfig" {
				testenv.Git(t, wt, "config", "--worktree", "filter.wtonly.clean", "/evil")
			}
			if tc.name == "includeIf" {
				testenv.Git(t, "", "config", "-f", filepath.Join(repo, ".git", "wt.cfg"), "filter.wtonly.clean", "/evil")
			}
			g := Git{ConfigDir: t.TempDir()}
			if _, err := g.at(repo).hardenEnv(ctx, repo, g.at(repo).environ(nil)); err != nil {
				t.Fatal(err)
			}
			reads := configReads.Load()
			out, err := g.at(wt).hardenEnv(ctx, wt, g.at(wt).environ(nil))
			if err != nil {
				t.Fatal(err)
			}
			if n := configReads.Load() - reads; n != tc.reads {
				t.Errorf("the worktree's configuration was read %d times after its repository's, want %d", n, tc.reads)
			}
			pins := strings.Join(out, "\n")
			if !strings.Contains(pins, "GIT_WORK_TREE="+wt) {
				t.Errorf("the worktree's pins do not name it:\n%s", pins)
			}
			if tc.name == "worktreeConfig" || tc.name == "includeIf" {
				if !strings.Contains(pins, "=filter.wtonly.clean") {
					t.Errorf("the driver only the worktree reads is not pinned:\n%s", pins)
				}
			}
			// A change to the repository's configuration is the worktree's
			// too.
			testenv.Git(t, repo, "config", "filter.later.clean", "/evil")
			out, err = g.at(wt).hardenEnv(ctx, wt, g.at(wt).environ(nil))
			if err != nil {
				t.Fatal(err)
			}
			if pins := strings.Join(out, "\n"); !strings.Contains(pins, "=filter.later.clean") {
				t.Errorf("a driver planted after the worktree's first read is not pinned:\n%s", pins)
			}
		})
	}
}
