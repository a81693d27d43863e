package selftest

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/aqfleet/aq/agent/config"
	"github.com/aqfleet/aq/internal/fixture"
	"github.com/aqfleet/aq/profiles"
	"github.com/aqfleet/aq/worktree"
)

// hostEnv is what the host checks look at: the configuration, the
// environment and the binaries on its PATH.
type hostEnv struct {
	o      *Options
	env    []string
	path   string
	cfg    *config.Config
	cfgErr error
	exe    string
	token  string // random per run: in probe file names and job ids

	fleetOnce sync.Once
	fleet     *fleetProbe
}

func newHostEnv(o *Options) *hostEnv {
	h := &hostEnv{o: o, env: o.Env, cfg: o.Config, cfgErr: o.ConfigErr, exe: o.Exe, token: fixture.RandomHex(4)}
	h.path = envValue(o.Env, "PATH")
	if h.exe == "" {
		h.exe = defaultExe()
	}
	return h
}

// lookPath finds an executable named name on the host PATH (absolute
// entries only), or "".
func (h *hostEnv) lookPath(name string) string {
	for _, d := range filepath.SplitList(h.path) {
		if d == "" || !filepath.IsAbs(d) {
			continue
		}
		p := filepath.Join(d, name)
		if fi, err := os.Stat(p); err == nil && fi.Mode().IsRegular() && fi.Mode().Perm()&0o111 != 0 {
			return p
		}
	}
	return ""
}

// home is $AQ_HOME as configured (or its default when the configuration
// did not load).
func (h *hostEnv) home() string {
	if h.cfg != nil {
		return h.cfg.Home
	}
	if v := envValue(h.env, "AQ_HOME"); v != "" {
		return v
	}
	if d, err := os.UserHomeDir(); err == nil {
		return filepath.Join(d, ".aq")
	}
	return ""
}

func envValue(env []string, key string) string {
	v := ""
	for _, kv := range env {
		if k, val, ok := strings.Cut(kv, "="); ok && k == key {
			v = val
		}
	}
	return v
}

// workspace is the pipeline's temp dir and what every pipeline scenario
// shares: the isolated git configuration, the engines' environment, the
// profile catalog and the job ids used (for the clean-up checks).
type workspace struct {
	o     *Options
	h     *hostEnv
	root  string
	token string
	// git is how aq's code runs git here: the host's git with an empty,
	// private global configuration and no system configuration, so nothing
	// outside the workspace is read or written.
	git    worktree.Git
	gitEnv []string
	// setupGit adds an identity, for the checks' own set-up commits.
	setupGit worktree.Git
	// engineEnv is what engines and child processes start from: the host
	// environment without aq's variables, plus the git isolation.
	engineEnv []string
	cat       *profiles.Catalog

	mu      sync.Mutex
	tagList []Tag
	// before is what the clean-up checks compare with.
	before snapshot
	// removeErr is why the workspace could not be removed.
	removeErr error
}

func newWorkspace(ctx context.Context, o *Options, h *hostEnv) (*workspace, error) {
	snap := takeSnapshot(h)
	dir := o.TempDir
	if dir == "" {
		dir = os.TempDir()
	}
	root, err := os.MkdirTemp(dir, "aq-selftest-")
	if err != nil {
		return nil, fmt.Errorf("cannot make the selftest's temp dir under %s: %w", dir, err)
	}
	if abs, err := filepath.EvalSymlinks(root); err == nil {
		root = abs
	}
	w := &workspace{o: o, h: h, root: root, token: h.token, before: snap}
	if w.gitEnv, err = fixture.IsolatedGit(root); err != nil {
		os.RemoveAll(root)
		return nil, err
	}
	w.git = worktree.Git{Env: w.gitEnv}
	w.setupGit = worktree.Git{Env: append(append([]string(nil), w.gitEnv...),
		"GIT_AUTHOR_NAME=aq selftest", "GIT_AUTHOR_EMAIL=selftest@aq.invalid",
		"GIT_COMMITTER_NAME=aq selftest", "GIT_COMMITTER_EMAIL=selftest@aq.invalid")}
	w.engineEnv = append(fixture.WithoutHost(o.Env), w.gitEnv...)
	if w.cat, err = profiles.Embedded(); err != nil {
		os.RemoveAll(root)
		return nil, fmt.Errorf("the embedded profiles do not load: %w", err)
	}
	return w, nil
}

// id is a job id unique to this run (job processes are found host-wide by
// their id), remembered with scope for the clean-up checks.
func (w *workspace) id(name, scope string) string {
	id := "st-" + w.token + "-" + name
	w.tag(id, scope)
	return id
}

func (w *workspace) tag(id, scope string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.tagList = append(w.tagList, Tag{ID: id, Scope: scope})
}

func (w *workspace) tags() []Tag {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]Tag(nil), w.tagList...)
}

// dir makes a fresh directory under the workspace.
func (w *workspace) dir(parts ...string) (string, error) {
	p := filepath.Join(append([]string{w.root}, parts...)...)
	return p, os.MkdirAll(p, 0o755)
}

// close removes the workspace.
func (w *workspace) close() {
	w.removeErr = os.RemoveAll(w.root)
}

// gitRun runs git with an identity in dir (the checks' own set-up).
func (w *workspace) gitRun(ctx context.Context, dir string, args ...string) (string, error) {
	return w.setupGit.Run(ctx, dir, args...)
}

// newRepo makes a git repository base/name on main with files in one
// commit; with origin, a bare repository under the workspace becomes its
// origin and main is pushed there. It returns the repository and the bare
// origin ("" without).
func (w *workspace) newRepo(ctx context.Context, base, name string, files map[string]string, origin bool) (string, string, error) {
	dir, err := fixture.NewRepo(ctx, w.gitRun, base, name, files)
	if err != nil || !origin {
		return dir, "", err
	}
	odir, err := w.dir("origins", filepath.Base(base)+"-"+fixture.RandomHex(3))
	if err != nil {
		return "", "", err
	}
	bare := filepath.Join(odir, name+".git")
	if err := fixture.AddOrigin(ctx, w.gitRun, dir, bare); err != nil {
		return "", "", err
	}
	return dir, bare, nil
}

// clone clones bare into dir.
func (w *workspace) clone(ctx context.Context, bare, dir string) error {
	if err := os.MkdirAll(filepath.Dir(dir), 0o755); err != nil {
		return err
	}
	_, err := w.gitRun(ctx, filepath.Dir(dir), "clone", "-q", "--", bare, dir)
	return err
}

// remoteRefs lists the refs of repository dir (or a bare one) under prefix.
func (w *workspace) remoteRefs(ctx context.Context, dir, prefix string) (map[string]string, error) {
	return fixture.RemoteRefs(ctx, w.gitRun, dir, prefix)
}

// treeHas reports whether commit-ish rev of repository dir holds path.
func (w *workspace) treeHas(ctx context.Context, dir, rev, path string) bool {
	_, err := w.gitRun(ctx, dir, "cat-file", "-e", rev+":"+path)
	return err == nil
}

// revParse resolves ref in dir ("" when it does not exist).
func (w *workspace) revParse(ctx context.Context, dir, ref string) string {
	sha, ok, err := worktree.ResolveRef(ctx, w.git, dir, ref)
	if err != nil || !ok {
		return ""
	}
	return sha
}

func readFile(p string) string {
	b, _ := os.ReadFile(p)
	return string(b)
}

// shq quotes s for /bin/sh.
func shq(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }

// yamlBlock is "key: |" with text indented under it.
func yamlBlock(key, text string) string {
	var b strings.Builder
	b.WriteString(key + ": |\n")
	for _, line := range strings.Split(strings.TrimRight(text, "\n"), "\n") {
		b.WriteString("  " + line + "\n")
	}
	return strings.TrimRight(b.String(), "\n")
}

func ms(d time.Duration) string { return d.Round(time.Millisecond).String() }
