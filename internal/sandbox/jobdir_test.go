package sandbox

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

func TestSandboxEnv(t *testing.T) {
	in := []string{"PATH=/usr/bin", "HOME=/root", "TMPDIR=/var/folders/x", "SSH_AUTH_SOCK=/tmp/ssh-x/agent", "XDG_RUNTIME_DIR=/run/user/0",
		"HTTPS_PROXY=http://corp:8080", "no_proxy=corp", "ANTHROPIC_API_KEY=sk-x", "AQ_JOB_ID=j1"}
	got := sandboxEnv(in, "/home/u", "/tmp", "http://127.0.0.1:3128")
	for _, w := range []string{"PATH=/usr/bin", "HOME=/home/u", "TMPDIR=/tmp", "IS_SANDBOX=1", "ANTHROPIC_API_KEY=sk-x", "AQ_JOB_ID=j1",
		"HTTPS_PROXY=http://127.0.0.1:3128", "https_proxy=http://127.0.0.1:3128", "ALL_PROXY=http://127.0.0.1:3128", "NO_PROXY=localhost,127.0.0.1,::1"} {
		if !slices.Contains(got, w) {
			t.Errorf("env lacks %s: %v", w, got)
		}
	}
	for _, kv := range got {
		for _, gone := range []string{"SSH_AUTH_SOCK=", "XDG_RUNTIME_DIR=", "HTTPS_PROXY=http://corp", "no_proxy=corp", "HOME=/root"} {
			if strings.HasPrefix(kv, gone) {
				t.Errorf("env keeps %s", kv)
			}
		}
	}
	none := sandboxEnv(in, "/home/u", "/tmp", "")
	for _, kv := range none {
		if strings.Contains(strings.ToLower(kv), "_proxy=") {
			t.Errorf("no proxy, yet %s", kv)
		}
	}
}

func TestNewPolicy(t *testing.T) {
	root := t.TempDir()
	home := filepath.Join(root, "home")
	aq := filepath.Join(root, "aq")
	repo := filepath.Join(root, "src", "app")
	wt := filepath.Join(aq, "worktrees", "app", "j1")
	gitdir := filepath.Join(repo, ".git", "worktrees", "j1")
	for _, d := range []string{wt, gitdir, filepath.Join(home, ".local", "bin"), filepath.Join(home, "go", "pkg", "mod"), filepath.Join(home, "tools", "bin")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	engine := filepath.Join(home, ".local", "share", "claude", "versions", "2.1")
	os.MkdirAll(filepath.Dir(engine), 0o755)
	os.WriteFile(engine, nil, 0o755)
	link := filepath.Join(home, ".local", "bin", "claude")
	os.Symlink(engine, link)

	in := Paths{Worktree: wt, JobDir: filepath.Join(aq, "sandbox", "j1"), Home: home, Hide: []string{aq, filepath.Join(root, "src")},
		Env: []string{"PATH=" + filepath.Join(home, "tools", "bin") + ":/usr/bin", "GOMODCACHE=" + filepath.Join(home, "mods")}, Engine: link}
	// The worktree's .git is the engine's to rewrite: git metadata is bound
	// only as the caller (aq's record) names it, never read from that file
	// — a .git pointing at the home would have had it bound into the job.
	os.WriteFile(filepath.Join(wt, ".git"), []byte("gitdir: "+home+"\n"), 0o644)
	if p := NewPolicy(in); len(p.GitDirs) != 0 {
		t.Errorf("git dirs read from the worktree's .git: %v", p.GitDirs)
	}
	in.GitDirs = []string{filepath.Join(repo, ".git"), gitdir}
	p := NewPolicy(in)
	if !slices.Equal(p.GitDirs, in.GitDirs) {
		t.Errorf("git dirs %v, want %v", p.GitDirs, in.GitDirs)
	}
	for _, w := range []string{filepath.Join(home, "tools", "bin"), filepath.Join(home, ".local", "bin"), filepath.Dir(engine)} {
		if !slices.Contains(p.ReadOnly, w) {
			t.Errorf("read-only lacks %s: %v", w, p.ReadOnly)
		}
	}
	if slices.Contains(p.ReadOnly, "/usr/bin") {
		t.Error("a PATH entry outside the home and the hidden trees is bound again")
	}
	for _, w := range []string{filepath.Join(home, "go", "pkg", "mod"), filepath.Join(home, "mods")} {
		if !slices.Contains(p.Caches, w) {
			t.Errorf("caches lack %s: %v", w, p.Caches)
		}
	}
	for _, w := range []string{aq, filepath.Join(root, "src")} {
		if !slices.Contains(p.Hidden, w) {
			t.Errorf("hidden lacks %s: %v", w, p.Hidden)
		}
	}
	if os.Geteuid() == 0 && !slices.Contains(p.HiddenFiles, "/etc/shadow") {
		t.Errorf("aq runs as root, yet /etc/shadow is not hidden: %v", p.HiddenFiles)
	}
}

// TestPolicyShowsAnNpmEnginesInstall: an engine installed by npm below a
// tree the sandbox does not show as the host has it (/tmp or the home, the
// job's own inside; here the home) is run through node_modules/.bin/<name>, a link into its
// package, and finds its native binary in another package of the same
// node_modules (codex's @openai/codex-linux-x64): the whole node_modules
// stays readable. Without it the sandboxed codex of a clone under /tmp
// failed "Missing optional dependency @openai/codex-linux-x64".
func TestPolicyShowsAnNpmEnginesInstall(t *testing.T) {
	root := t.TempDir() // the home below
	nm := filepath.Join(root, "realcli", "node_modules")
	js := filepath.Join(nm, "@openai", "codex", "bin", "codex.js")
	for _, d := range []string{filepath.Dir(js), filepath.Join(nm, ".bin"), filepath.Join(nm, "@openai", "codex-linux-x64", "vendor")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(js, nil, 0o755); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(nm, ".bin", "codex")
	if err := os.Symlink("../@openai/codex/bin/codex.js", link); err != nil {
		t.Fatal(err)
	}
	p := NewPolicy(Paths{Worktree: filepath.Join(root, "wt"), JobDir: filepath.Join(root, "job"), Home: root, Engine: link})
	if !slices.Contains(p.ReadOnly, nm) {
		t.Errorf("read-only %v lacks the engine's node_modules %s", p.ReadOnly, nm)
	}
	if got := nodeModules("/usr/local/bin/codex"); got != "" {
		t.Errorf("nodeModules of a path in none = %q", got)
	}
}
