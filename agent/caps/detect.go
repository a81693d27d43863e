package caps

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode"

	"github.com/aqfleet/aq/engines"
	"github.com/aqfleet/aq/internal/aqerr"
	"github.com/aqfleet/aq/internal/sandbox"
	"github.com/aqfleet/aq/internal/secrets"
	"github.com/aqfleet/aq/job"
	"github.com/aqfleet/aq/worktree"
)

// DefaultProbeTimeout bounds each `<bin> --version` probe.
const DefaultProbeTimeout = 3 * time.Second

// ScriptEngine is aq's built-in engine that runs a user command.
const ScriptEngine = "script"

// defaultTools is the one list of tools whose presence on PATH becomes a
// has:<tool> capability. Only presence is detected: no version, no login
// state. Keep it sorted; DefaultTools returns a copy.
var defaultTools = []string{
	"az", "bun", "cargo", "cmake", "curl", "deno", "docker", "dotnet", "gcc",
	"gh", "git", "go", "gradle", "java", "jq", "kubectl", "make", "mvn", "node",
	"npm", "pip3", "pnpm", "psql", "python3", "ruby", "rustc", "sqlite3",
	"terraform", "uv", "yarn",
}

// DefaultTools returns the tools Detect looks for when DetectOptions.Tools is
// nil: each one found on PATH is offered as has:<tool>.
func DefaultTools() []string { return append([]string(nil), defaultTools...) }

// repoNamePattern is the id rule of docs/manifest.md ("Keys"): a repo: name is a manifest's
// repo value, so a folder whose name could not be written there is no repo.
var repoNamePattern = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$`) })

// ValidRepoName reports whether name satisfies the repo id rule.
func ValidRepoName(name string) bool { return repoNamePattern().MatchString(name) }

// DetectOptions says where and how Detect looks.
type DetectOptions struct {
	// RepoBase is the folder whose git repositories (directly below it)
	// become repo:<name> (AQ_REPO_BASE). Empty: no repos, and a note.
	RepoBase string
	// Path is the PATH list searched for engines and tools; empty means
	// os.Getenv("PATH"). Relative entries are ignored (a version probe must
	// never run a binary from the current directory).
	Path string
	// Env is the environment of the version probes; nil means os.Environ().
	// aq's secrets are always removed and PATH is set to Path.
	Env []string
	// ProbeTimeout bounds each version probe; 0 means DefaultProbeTimeout.
	ProbeTimeout time.Duration
	// Tools are the tools looked for on PATH; nil means DefaultTools().
	Tools []string
	// Clonable are repos this host clones on demand (AQ_REPO_URLS): they
	// are offered as repo:<name> beside the ones already under RepoBase.
	Clonable []string
	// Probes caches the engines' --version and --help probes by binary
	// (engines.NewProbeCache); nil probes every time.
	Probes *engines.ProbeCache
	// Sandbox is AQ_SANDBOX's Host (the runner's): what it finds is
	// offered as sandbox:<level> (nil: no sandbox token, nothing probed).
	Sandbox *sandbox.Host
	// HelpTimeout bounds each engine's --help probe; 0 means
	// engines.DefaultHelpTimeout (a cold start of a 250 MB CLI can take
	// seconds; the answer is cached per binary).
	HelpTimeout time.Duration
	// Engines are the engines this factory may offer (AQ_ENGINES, as
	// config.RunEngines resolves it): an engine found but not listed is
	// neither probed nor offered, and script is offered only when listed.
	// nil: every engine found, and script.
	Engines []string
	// EnginesListed: Engines was set by the operator (AQ_ENGINES), so a
	// coding engine it lists but this host lacks is noted (Host.Unlisted).
	EnginesListed bool
}

// allows reports whether o lets the host offer engine name.
func (o DetectOptions) allows(name string) bool {
	return o.Engines == nil || slices.Contains(o.Engines, name)
}

// EngineInfo is one engine this host can run.
type EngineInfo struct {
	Name string `json:"name"`
	// Path is the binary found on PATH; empty for the built-in script engine.
	Path string `json:"path"`
	// Version is the first line `<bin> --version` printed; empty when the
	// probe failed or timed out (a note says which).
	Version string `json:"version"`
	// Builtin is true for the script engine, which is part of aq.
	Builtin bool `json:"builtin,omitempty"`
	// Flags are the flags aq passes that the CLI's --help has, Dropped the
	// optional ones it lacks (aq runs without them), from the --help probe
	// (engines.ProbeFlags). Both empty for the script engine, or when the
	// probe failed (then Refused says why).
	Flags   []string `json:"flags"`
	Dropped []string `json:"dropped"`
	// Refused says in one line why aq will not run this engine: a required
	// flag it lacks, a --help that fails or hangs. A refused engine is not
	// offered as engine:<name>.
	Refused string `json:"refused,omitempty"`
}

// Host is what Detect found: the capabilities this factory offers. It is not
// modified after Detect returns and is safe to share.
type Host struct {
	OS   string
	Arch string
	// Engines in name order: those found on PATH and, unless AQ_ENGINES
	// leaves it out, the built-in script engine.
	Engines []EngineInfo
	// Node is node's major version; 0 when node is not on PATH or its
	// version could not be read.
	Node int
	// Tools maps each tool found on PATH to its path.
	Tools map[string]string
	// ToolsProbed are the tools that were looked for (found or not); nil
	// when unknown (a Host built by FromTokens).
	ToolsProbed []string
	// Repos are the names of the git repositories directly under RepoBase,
	// sorted.
	Repos    []string
	RepoBase string
	// Sandbox is how this host runs jobs' engines (nil: unknown, offered
	// as none).
	Sandbox *Sandbox
	// Manifest are the manifest features this aq understands
	// (job.ManifestFeatures), offered as manifest:<feature>: a job using
	// one goes only to a factory that does.
	Manifest []string
	// Notes explain what was skipped or could not be probed, one line each.
	Notes []string
	// Missing are engines AQ_ENGINES lists that this host does not have:
	// not offered (LogEngines says so once at start).
	Missing []string
	// Withheld are engines this host has that AQ_ENGINES leaves out.
	Withheld []string
}

// Detect finds what this host offers: os, arch, engines (with versions),
// node's major version, tools on PATH and the git repositories under
// RepoBase. Version probes and the repo scan run concurrently; each probe is
// bounded by ProbeTimeout and runs without a shell. A probe that fails or
// hangs is a note, never an error. Errors: the repo base exists but cannot be
// read or is not a directory (*aqerr.Error), or ctx was cancelled.
func Detect(ctx context.Context, opts DetectOptions) (*Host, error) {
	if opts.Path == "" {
		opts.Path = os.Getenv("PATH")
	}
	if opts.Env == nil {
		opts.Env = os.Environ()
	}
	if opts.ProbeTimeout <= 0 {
		opts.ProbeTimeout = DefaultProbeTimeout
	}
	tools := opts.Tools
	if tools == nil {
		tools = defaultTools
	}
	dirs := searchDirs(opts.Path)
	env := probeEnv(opts.Env, opts.Path)

	h := &Host{
		OS:       runtime.GOOS,
		Arch:     runtime.GOARCH,
		Tools:    map[string]string{},
		RepoBase: opts.RepoBase,
		Manifest: append([]string(nil), job.ManifestFeatures...),
	}
	seen := map[string]bool{}
	for _, t := range tools {
		if t == "" || seen[t] {
			continue
		}
		seen[t] = true
		h.ToolsProbed = append(h.ToolsProbed, t)
		if p := lookPath(t, dirs); p != "" {
			h.Tools[t] = p
		}
	}
	sort.Strings(h.ToolsProbed)

	// Each probe owns its slot; nothing is shared until wg.Wait.
	type engineProbe struct {
		info      EngineInfo
		note      string
		flagNotes []string
		unknown   bool // its --help timed out: offered with every flag
	}
	var found []*engineProbe
	for _, name := range engines.Coding() { // found by their binary on PATH; script is built in
		p := lookPath(name, dirs)
		switch {
		case p != "" && opts.allows(name):
			found = append(found, &engineProbe{info: EngineInfo{Name: name, Path: p}})
		case p != "":
			h.Withheld = append(h.Withheld, name)
			h.Notes = append(h.Notes, fmt.Sprintf("engine %s is installed but not in AQ_ENGINES: not offered", name))
		case opts.EnginesListed && opts.allows(name):
			h.Missing = append(h.Missing, name)
			h.Notes = append(h.Notes, fmt.Sprintf("engine %s is in AQ_ENGINES but not installed: not offered", name))
		}
	}
	nodePath := h.Tools["node"]
	if nodePath == "" {
		nodePath = lookPath("node", dirs)
	}
	var (
		wg        sync.WaitGroup
		nodeMajor int
		nodeNote  string
		repos     []string
		repoNotes []string
		repoErr   error
	)
	version := func(bin string) (string, error) {
		return opts.Probes.Version(ctx, bin, func() (string, error) {
			return probeVersion(ctx, bin, env, opts.ProbeTimeout)
		})
	}
	for _, e := range found {
		wg.Go(func() {
			v, err := version(e.info.Path)
			e.info.Version = v
			if err != nil {
				e.note = fmt.Sprintf("engine %s: %v; listed without a version", e.info.Name, err)
			}
			e.info.Flags, e.info.Dropped = []string{}, []string{}
			fs, err := engines.ProbeFlags(ctx, e.info.Name, e.info.Path, env, opts.HelpTimeout, opts.Probes)
			switch {
			case err != nil:
				e.info.Refused = oneLine.Replace(err.Error())
			case fs != nil:
				e.info.Flags, e.info.Dropped = fs.Found, fs.Dropped
				e.info.Refused = fs.Refusal(engines.HelpSpecs[e.info.Name].Needs)
				e.flagNotes, e.unknown = fs.Notes, fs.Unknown
			}
		})
	}
	if nodePath != "" {
		wg.Go(func() {
			v, err := version(nodePath)
			if err != nil {
				nodeNote = fmt.Sprintf("node: %v; no node:<major> capability", err)
				return
			}
			major, ok := ParseNodeMajor(v)
			if !ok {
				nodeNote = fmt.Sprintf("node: cannot read a major version from %s --version output %q; no node:<major> capability", nodePath, v)
				return
			}
			nodeMajor = major
		})
	}
	wg.Go(func() {
		repos, repoNotes, repoErr = scanRepos(opts.RepoBase)
	})
	if opts.Sandbox != nil {
		wg.Go(func() { h.Sandbox = SandboxOf(opts.Sandbox) }) // a trial sandbox, once per process
	}
	wg.Wait()

	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if repoErr != nil {
		return nil, repoErr
	}
	for _, e := range found {
		h.Engines = append(h.Engines, e.info)
		if e.note != "" {
			h.Notes = append(h.Notes, e.note)
		}
		if e.info.Refused != "" {
			h.Notes = append(h.Notes, fmt.Sprintf("engine %s refused, not offered: %s", e.info.Name, e.info.Refused))
		}
		for _, n := range e.flagNotes {
			if e.unknown {
				h.Notes = append(h.Notes, "engine "+n)
				continue
			}
			h.Notes = append(h.Notes, "engine "+n+" (dropped)")
		}
	}
	if opts.allows(ScriptEngine) {
		h.Engines = append(h.Engines, EngineInfo{Name: ScriptEngine, Builtin: true, Flags: []string{}, Dropped: []string{}})
	} else {
		h.Withheld = append(h.Withheld, ScriptEngine)
	}
	sort.Slice(h.Engines, func(i, j int) bool { return h.Engines[i].Name < h.Engines[j].Name })
	h.Node = nodeMajor
	if nodeNote != "" {
		h.Notes = append(h.Notes, nodeNote)
	}
	h.Repos = mergeSorted(repos, opts.Clonable)
	h.Notes = append(h.Notes, repoNotes...)
	return h, nil
}

// searchDirs splits a PATH list, keeping absolute directories once each.
func searchDirs(path string) []string {
	var out []string
	seen := map[string]bool{}
	for _, d := range filepath.SplitList(path) {
		if d == "" || !filepath.IsAbs(d) || seen[d] {
			continue
		}
		seen[d] = true
		out = append(out, d)
	}
	return out
}

// lookPath returns the first dirs/name that is an executable regular file
// (symbolic links followed), or "".
func lookPath(name string, dirs []string) string {
	if name == "" || strings.ContainsRune(name, filepath.Separator) {
		return ""
	}
	for _, d := range dirs {
		p := filepath.Join(d, name)
		fi, err := os.Stat(p)
		if err != nil || !fi.Mode().IsRegular() || fi.Mode().Perm()&0o111 == 0 {
			continue
		}
		return p
	}
	return ""
}

// probeEnv is the environment of a version probe: an engine's base
// (engines.Environ: nothing of aq's), with PATH set to the searched path so
// that a script's interpreter (#!/usr/bin/env node) is found where the
// binary was.
func probeEnv(env []string, path string) []string {
	out := secrets.EngineEnv(engines.Environ(env, "", nil), "PATH")
	return append(out, "PATH="+path)
}

// maxVersionLine bounds the version string kept from a probe.
const maxVersionLine = 200

// probeWaitDelay bounds how long a probe waits for its output pipes after the
// process exited or was killed (a grandchild may hold them open).
const probeWaitDelay = 500 * time.Millisecond

// probeVersion runs `bin --version` (no shell) under timeout and returns the
// first non-empty line it printed on stdout (else stderr). A timeout, a
// non-zero exit or empty output is an error that says so in words; a
// cancelled ctx returns ctx.Err().
func probeVersion(ctx context.Context, bin string, env []string, timeout time.Duration) (string, error) {
	pctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	cmd := exec.CommandContext(pctx, bin, "--version")
	cmd.Env = env
	var stdout, stderr capWriter
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	cmd.WaitDelay = probeWaitDelay
	ownProcessGroup(cmd)
	runErr := cmd.Run()
	if err := ctx.Err(); err != nil {
		return "", err
	}
	if runErr != nil && errors.Is(pctx.Err(), context.DeadlineExceeded) {
		return "", fmt.Errorf("%s --version did not finish within %s", bin, timeout)
	}
	if runErr != nil {
		var ee *exec.ExitError
		if errors.As(runErr, &ee) {
			if msg := firstLine(stderr.Bytes()); msg != "" {
				return "", fmt.Errorf("%s --version failed (%v: %s)", bin, ee, msg)
			}
			return "", fmt.Errorf("%s --version failed (%v)", bin, ee)
		}
		return "", fmt.Errorf("%s --version could not run: %v", bin, runErr)
	}
	v := firstLine(stdout.Bytes())
	if v == "" {
		v = firstLine(stderr.Bytes())
	}
	if v == "" {
		return "", fmt.Errorf("%s --version printed nothing", bin)
	}
	return v, nil
}

// capWriter keeps the first capLimit bytes written and discards the rest
// without failing, so a chatty probe is never killed by a closed pipe.
type capWriter struct{ buf bytes.Buffer }

const capLimit = 16 << 10

func (w *capWriter) Write(p []byte) (int, error) {
	if room := capLimit - w.buf.Len(); room > 0 {
		w.buf.Write(p[:min(room, len(p))])
	}
	return len(p), nil
}

func (w *capWriter) Bytes() []byte { return w.buf.Bytes() }

// firstLine is the first non-blank line of b, trimmed, with control
// characters removed and at most maxVersionLine runes long.
func firstLine(b []byte) string {
	for _, line := range strings.Split(string(b), "\n") {
		line = strings.TrimSpace(strings.Map(func(r rune) rune {
			if r == '\t' {
				return ' '
			}
			if unicode.IsControl(r) {
				return -1
			}
			return r
		}, line))
		if line == "" {
			continue
		}
		if r := []rune(line); len(r) > maxVersionLine {
			line = string(r[:maxVersionLine])
		}
		return line
	}
	return ""
}

// ParseNodeMajor reads node's major version from `node --version` output
// ("v20.20.2" → 20).
func ParseNodeMajor(s string) (int, bool) {
	s = strings.TrimSpace(s)
	s = strings.TrimPrefix(strings.TrimPrefix(s, "v"), "V")
	major, _, _ := strings.Cut(s, ".")
	n, err := strconv.Atoi(major)
	if err != nil || n <= 0 || major != strconv.Itoa(n) {
		return 0, false
	}
	return n, true
}

// scanRepos lists the git repositories directly under base: directories
// (or symbolic links to directories) holding a .git directory or a .git file
// that points at one (linked worktree, submodule), whose names pass the repo
// id rule. A missing base is a note; an unreadable one is an error.
func scanRepos(base string) ([]string, []string, error) {
	if base == "" {
		return nil, []string{"no repo base configured: no repo:<name> capabilities (set AQ_REPO_BASE)"}, nil
	}
	fi, err := os.Stat(base)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, []string{fmt.Sprintf("repo base %s does not exist: no repo:<name> capabilities (create it or set AQ_REPO_BASE)", base)}, nil
	}
	if err != nil {
		return nil, nil, aqerr.Wrap(aqerr.Usage, err, fmt.Sprintf("cannot read repo base %s: %v", base, unwrapPath(err)), "check AQ_REPO_BASE and the folder's permissions")
	}
	if !fi.IsDir() {
		return nil, nil, aqerr.New(aqerr.Usage, fmt.Sprintf("repo base %s is not a directory", base), "set AQ_REPO_BASE to the folder that holds your git checkouts")
	}
	entries, err := os.ReadDir(base)
	if err != nil {
		return nil, nil, aqerr.Wrap(aqerr.Usage, err, fmt.Sprintf("cannot list repo base %s: %v", base, unwrapPath(err)), "check AQ_REPO_BASE and the folder's permissions")
	}
	var repos, notes []string
	for _, e := range entries {
		name := e.Name()
		if strings.HasPrefix(name, ".") {
			continue // hidden: never a repo to offer (a clone in progress is .<name>.clone-*)
		}
		dir := filepath.Join(base, name)
		isDir := e.IsDir()
		if e.Type()&fs.ModeSymlink != 0 {
			if st, err := os.Stat(dir); err == nil && st.IsDir() {
				isDir = true
			}
		}
		if !isDir || !isGitCheckout(dir) {
			continue
		}
		if !ValidRepoName(name) {
			notes = append(notes, fmt.Sprintf("skipped git repository %q in %s: not a valid repo name (letters, digits, '.', '_', '-'; starting with a letter or digit; at most 128)", name, base))
			continue
		}
		repos = append(repos, name)
	}
	sort.Strings(repos)
	return repos, notes, nil
}

// isGitCheckout reports whether dir has a .git directory, or a .git file
// that is a gitdir link ("gitdir: <path>", as in linked worktrees and
// submodules) to a directory that exists — a link left dangling by a removed
// main repository is no repository. Plain file system checks: measured
// against go-git and a git process in BenchmarkRepoDetect (docs/BENCHMARKS.md).
func isGitCheckout(dir string) bool {
	p := filepath.Join(dir, ".git")
	fi, err := os.Stat(p)
	if err != nil {
		return false
	}
	if fi.IsDir() {
		// As the runner judges it (worktree.IsRepo): a .git that a clone in
		// progress has only just made is no repository yet — offered, its
		// job would be claimed and fail repo_unavailable.
		return worktree.IsGitDir(p)
	}
	if !fi.Mode().IsRegular() || fi.Size() > 4096 {
		return false
	}
	b, err := os.ReadFile(p)
	if err != nil {
		return false
	}
	link, ok := bytes.CutPrefix(b, []byte("gitdir:"))
	if !ok {
		return false
	}
	target := strings.TrimSpace(string(link))
	if target == "" {
		return false
	}
	if !filepath.IsAbs(target) {
		target = filepath.Join(dir, target)
	}
	st, err := os.Stat(target)
	return err == nil && st.IsDir()
}

func unwrapPath(err error) error {
	var pe *fs.PathError
	if errors.As(err, &pe) {
		return pe.Err
	}
	return err
}

// mergeSorted is the sorted union of a and b.
func mergeSorted(a, b []string) []string {
	if len(b) == 0 {
		return a
	}
	out := append(append([]string{}, a...), b...)
	sort.Strings(out)
	return slices.Compact(out)
}
