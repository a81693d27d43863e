package sandbox

import (
	"os"
	"path/filepath"
	"strings"
)

// Paths are what a job's Policy is built from: the job's own paths and
// aq's.
type Paths struct {
	// Worktree is the job's worktree; JobDir its own directory
	// ($AQ_HOME/sandbox/<id>).
	Worktree, JobDir string
	// Home is the user's home ($HOME).
	Home string
	// Hide are aq's trees: $AQ_HOME, the repo base, the mirror folder.
	Hide []string
	// Env is the engine's environment: its PATH entries below a hidden
	// tree or the home stay readable, as do the caches it names
	// (GOMODCACHE, GOCACHE, npm_config_cache).
	Env []string
	// Engine is the engine's binary: its directory, and the directory of
	// what it links to, stay readable.
	Engine string
	// Shared are host directories every job's engine may also write
	// (AQ_SANDBOX_WRITABLE).
	Shared []string
	// GitDirs are the worktree's git metadata as aq's record has it
	// (worktree.GitDirsOf): the engine may have rewritten the worktree's
	// .git file, so it is never read for this: none, no git metadata bound.
	GitDirs []string
}

// HomeToolchains are the toolchains below the user's home that stay
// readable (read-only) in the sandbox: installed compilers, language
// managers and the engines' own installs (docs/sandbox.md).
var HomeToolchains = []string{
	".local/bin", ".local/share/claude", ".local/share/mise", ".local/share/pnpm",
	".cargo/bin", ".rustup", "go/bin", "sdk", ".bun", ".deno", ".volta", ".sdkman", ".asdf",
	".rbenv", ".nix-profile", ".dotnet", ".gradle/wrapper",
}

// HomeCaches are the package caches and install trees below the user's
// home that the sandbox shares read-only with a writable layer of the
// job's own (Linux: overlayfs), so builds find what is already downloaded
// and installs land in the job's layer (docs/sandbox.md).
var HomeCaches = []string{
	"go/pkg/mod", ".cache/go-build", ".npm", ".cache/pip", ".cache/uv", ".cache/yarn", ".cache/pnpm",
	".cargo/registry", ".cargo/git", ".m2/repository", ".gradle/caches",
	".pyenv", ".nvm", ".local/lib",
}

// hostHidden are host trees no job sees: the user's runtime and system
// sockets (the docker socket, ssh and gpg agents, dbus).
var hostHidden = []string{"/run", "/var/run"}

// rootHidden are what a factory running as root must hide on top: the
// engine keeps root's file ownership (without its capabilities), so files
// only root may read would otherwise be readable.
var (
	rootHidden      = []string{"/root", "/etc/ssh", "/etc/sudoers.d", "/var/lib/sudo"}
	rootHiddenFiles = []string{"/etc/shadow", "/etc/shadow-", "/etc/gshadow", "/etc/gshadow-", "/etc/sudoers"}
)

// NewPolicy is the Policy of one job on this host (docs/sandbox.md has it
// as a table).
func NewPolicy(in Paths) Policy {
	p := Policy{
		Worktree: in.Worktree,
		GitDirs:  in.GitDirs,
		Home:     in.Home,
		JobDir:   in.JobDir,
		Shared:   in.Shared,
	}
	for _, h := range append(append([]string{}, in.Hide...), hostHidden...) {
		if h == "" {
			continue
		}
		if st, err := os.Lstat(h); err == nil && st.IsDir() { // /var/run is often a link to /run
			p.Hidden = append(p.Hidden, h)
		}
	}
	if os.Geteuid() == 0 {
		p.Hidden = append(p.Hidden, rootHidden...)
		p.HiddenFiles = append(p.HiddenFiles, rootHiddenFiles...)
	}
	// covered: a path the sandbox does not show as the host has it (the
	// home and /tmp are the job's own there, the hidden trees empty).
	covered := func(path string) bool {
		if in.Home != "" && in.Home != "/" && within(path, filepath.Clean(in.Home)) {
			return true
		}
		if within(path, "/tmp") || within(path, "/var/tmp") {
			return true
		}
		for _, h := range p.Hidden {
			if within(path, filepath.Clean(h)) {
				return true
			}
		}
		return false
	}
	if in.Home != "" && in.Home != "/" {
		for _, t := range HomeToolchains {
			p.ReadOnly = append(p.ReadOnly, filepath.Join(in.Home, t))
		}
		for _, c := range HomeCaches {
			p.Caches = append(p.Caches, filepath.Join(in.Home, c))
		}
	}
	for _, v := range []string{"GOMODCACHE", "GOCACHE", "npm_config_cache"} {
		if c := envOf(in.Env, v); filepath.IsAbs(c) && covered(c) {
			p.Caches = append(p.Caches, c)
		}
	}
	for _, dir := range filepath.SplitList(envOf(in.Env, "PATH")) {
		if filepath.IsAbs(dir) && covered(dir) {
			p.ReadOnly = append(p.ReadOnly, dir)
		}
	}
	if in.Engine != "" && filepath.IsAbs(in.Engine) {
		for _, bin := range []string{in.Engine, resolved(in.Engine)} {
			if d := filepath.Dir(bin); bin != "" && covered(d) {
				p.ReadOnly = append(p.ReadOnly, d)
			}
			// An npm-installed engine finds its platform binary in a
			// package beside its own (codex: @openai/codex-linux-x64
			// next to @openai/codex): the whole node_modules tree it was
			// installed into stays readable, not only its bin folder.
			if nm := nodeModules(bin); nm != "" && covered(nm) {
				p.ReadOnly = append(p.ReadOnly, nm)
			}
		}
	}
	// A toolchain or cache that holds another is shared as the outer one.
	p = p.Clean()
	p.ReadOnly = dropNested(p.ReadOnly, p.Caches)
	return p
}

// dropNested leaves out read-only entries that lie within a cache (its
// overlay already shows them).
func dropNested(ro, caches []string) []string {
	var out []string
	for _, r := range ro {
		inCache := false
		for _, c := range caches {
			if within(r, c) {
				inCache = true
			}
		}
		if !inCache {
			out = append(out, r)
		}
	}
	return out
}

// nodeModules is the outermost node_modules folder path lies in ("" for
// none): the tree an npm install put a package and its dependencies in.
func nodeModules(path string) string {
	const nm = string(filepath.Separator) + "node_modules" + string(filepath.Separator)
	if i := strings.Index(path, nm); i >= 0 {
		return path[:i+len(nm)-1]
	}
	return ""
}

func resolved(path string) string {
	r, err := filepath.EvalSymlinks(path)
	if err != nil || r == path {
		return ""
	}
	return r
}

func envOf(env []string, key string) string {
	v := ""
	for _, kv := range env {
		if k, val, ok := strings.Cut(kv, "="); ok && k == key {
			v = val
		}
	}
	return v
}
