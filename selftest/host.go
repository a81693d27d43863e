package selftest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/aqfleet/aq/agent/caps"
	"github.com/aqfleet/aq/agent/manifest"
	"github.com/aqfleet/aq/agent/ship"
	"github.com/aqfleet/aq/engines"
	"github.com/aqfleet/aq/internal/brief"
	"github.com/aqfleet/aq/internal/fixture"
	"github.com/aqfleet/aq/internal/secrets"
	"github.com/aqfleet/aq/internal/version"
	"github.com/aqfleet/aq/profiles"
	"github.com/aqfleet/aq/worktree"
)

// minGit is the oldest git aq works with: `git worktree list --porcelain
// -z`, which worktree.List reads, came with git 2.36.
var minGit = [2]int{2, 36}

// squashGit is the git from which gc detects squash-merged job branches
// with `git merge-tree --write-tree` (older gits: such branches are kept).
var squashGit = [2]int{2, 38}

func hostScenarios() []*scenario {
	g := GroupHost
	claude := engineScenario("claude", &engines.Claude{})
	codex := engineScenario("codex", &engines.Codex{})
	devin := engineScenario("devin", &engines.Devin{})
	return []*scenario{
		single(g, "host.git.present", "git is on PATH", 5*time.Second, checkGitPresent),
		single(g, "host.git.version", "git is new enough for what aq relies on (>= 2.36: worktree list -z)", 10*time.Second, checkGitVersion),
		single(g, "host.gh.present", "the GitHub CLI is on PATH (needed for ship: pr|merge; skipped when absent and no queued job needs it)", 10*time.Second, checkGHPresent),
		single(g, "host.gh.auth", "gh is logged in (gh auth status)", 40*time.Second, checkGHAuth),
		claude[0], claude[1], codex[0], codex[1], devin[0], devin[1],
		single(g, "host.engine.script", "the built-in script engine can run (/bin/sh)", 5*time.Second, checkScriptEngine),
		single(g, "host.engine.any", "at least one coding engine (claude, codex, devin) is installed, for engine: any", 5*time.Second, checkAnyEngine),
		homeScenario(),
		{name: "repobase", group: g, checks: []Check{
			check(g, "host.caps.detect", "capability detection finishes: os, arch, engines, node, tools, repos"),
			check(g, "host.repobase.readable", "AQ_REPO_BASE is a readable directory"),
			check(g, "host.repobase.repos", "every repository under AQ_REPO_BASE is one git accepts (no dubious ownership)"),
		}, run: runRepoBase},
		single(g, "host.locks.exclusive", "two flocks on one file exclude each other, and a blocked lock waits", 10*time.Second, checkLocksExclusive),
		single(g, "host.locks.child", "a lock held by a child process reads as held, and is free once the child is killed -9", 15*time.Second, checkLocksChild),
		single(g, "host.proc.tagged", "a process is found and killed by its job tag (/proc/<pid>/environ; kern.procargs2 on macOS), as escaped engines are", 15*time.Second, checkProcTagged),
		single(g, "host.clock.build", "the clock is not before this build's date", 2*time.Second, checkClockBuild),
		single(g, "host.clock.monotonic", "the monotonic clock advances and the wall clock agrees with it", 5*time.Second, checkClockMonotonic),
		single(g, "host.clock.coordinator", "fleet mode: the clock is within 30s of the coordinator's (its Date header)", 15*time.Second, checkClockCoordinator),
		single(g, "host.config.valid", "the configuration loads and every value is valid (flag > env > file > default)", 2*time.Second, checkConfigValid),
		single(g, "host.config.file", "the config file, when there is one, is not writable by group or others", 2*time.Second, checkConfigFile),
		single(g, "host.prices", "the price table loads (built-in, merged with AQ_PRICE_TABLE)", 5*time.Second, checkPrices),
		single(g, "host.profiles", "the profiles load (embedded, with $AQ_HOME/profiles over them)", 5*time.Second, checkProfiles),
		single(g, "host.queue.manifests", "every queued manifest in the local queue still parses with these profiles", 15*time.Second, checkQueuedManifests),
		single(g, "host.credentials.mode", "the credentials file, when present, is mode 0600", 2*time.Second, checkCredentialsMode),
		single(g, "host.credentials.valid", "the credentials file, when present, holds a factory id and token", 2*time.Second, checkCredentialsValid),
		single(g, "host.fleet.settings", "fleet mode: the coordinator URL and a token (or stored credentials) are set", 2*time.Second, checkFleetSettings),
		single(g, "host.fleet.reachable", "fleet mode: the coordinator answers (GET /fleet/queue-state)", 20*time.Second, checkFleetReachable),
		single(g, "host.fleet.token", "fleet mode: the coordinator accepts this factory's token", 20*time.Second, checkFleetToken),
		single(g, "host.sb.settings", "Service Bus settings are coherent: a namespace or a connection string, not both", 5*time.Second, checkSBSettings),
		single(g, "host.sb.emulator", "a development (emulator) connection string points at loopback only", 2*time.Second, checkSBEmulator),
		single(g, "host.sb.fleet", "Service Bus delivery is only configured together with fleet mode", 2*time.Second, checkSBFleet),
		single(g, "host.tmp.writable", "the temp dir is writable (PR bodies, temporary indexes, this selftest)", 5*time.Second, checkTmpWritable),
	}
}

// --- git -------------------------------------------------------------------

func checkGitPresent(ctx context.Context, s *session) (string, error) {
	p := s.h.lookPath("git")
	if p == "" {
		return "", failf("git is not on PATH: install git (>= %d.%d)", minGit[0], minGit[1])
	}
	return "git at " + p, nil
}

var gitVersionRE = regexp.MustCompile(`git version (\d+)\.(\d+)(?:\.(\d+))?`)

// gitVersion runs git --version and returns its major and minor version.
func (h *hostEnv) gitVersion(ctx context.Context) (string, [2]int, error) {
	p := h.lookPath("git")
	if p == "" {
		return "", [2]int{}, skipf("git is not on PATH (see host.git.present)")
	}
	out, err := h.output(ctx, p, "--version")
	if err != nil {
		return "", [2]int{}, failf("%s --version failed: %v", p, err)
	}
	m := gitVersionRE.FindStringSubmatch(out)
	if m == nil {
		return "", [2]int{}, failf("cannot read a version from %q", strings.TrimSpace(out))
	}
	maj, _ := strconv.Atoi(m[1])
	mnr, _ := strconv.Atoi(m[2])
	return strings.TrimPrefix(m[0], "git version "), [2]int{maj, mnr}, nil
}

func atLeast(v, want [2]int) bool { return v[0] > want[0] || v[0] == want[0] && v[1] >= want[1] }

func checkGitVersion(ctx context.Context, s *session) (string, error) {
	text, v, err := s.h.gitVersion(ctx)
	if err != nil {
		return "", err
	}
	if !atLeast(v, minGit) {
		return "", failf("git %s is too old: aq needs >= %d.%d (git worktree list --porcelain -z); upgrade git", text, minGit[0], minGit[1])
	}
	note := "gc detects squash-merged branches"
	if !atLeast(v, squashGit) {
		note = fmt.Sprintf("gc cannot detect squash-merged branches before %d.%d (it keeps them)", squashGit[0], squashGit[1])
	}
	return fmt.Sprintf("git %s (>= %d.%d for worktree list -z; %s)", text, minGit[0], minGit[1], note), nil
}

// output runs bin with args in the host environment, bounded by ctx, and
// returns its stdout; a failure carries the first line of stderr.
func (h *hostEnv) output(ctx context.Context, bin string, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Env = secrets.EngineEnv(h.env)
	cmd.WaitDelay = time.Second
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		if line := brief.FirstLine(errb.String(), 0); line != "" {
			return out.String(), fmt.Errorf("%v: %s", err, line)
		}
		return out.String(), err
	}
	return out.String(), nil
}

// --- gh --------------------------------------------------------------------

// ghNeeded lists queued local jobs that ship pr or merge: gh is then required.
func (h *hostEnv) ghNeeded() []string {
	var ids []string
	for _, m := range h.queuedManifests() {
		if m.job != nil && (m.job.Ship == "pr" || m.job.Ship == "merge") {
			ids = append(ids, m.job.ID)
		}
	}
	return ids
}

type queued struct {
	path string
	job  *jobView
	err  error
}

// jobView is what the host checks read of a queued manifest.
type jobView struct{ ID, Ship string }

// queuedManifests parses the manifests waiting in the local queue (inbox,
// blocked, building), read-only.
func (h *hostEnv) queuedManifests() []queued {
	home := h.home()
	if home == "" {
		return nil
	}
	var paths []string
	for _, st := range []string{"inbox", "blocked", "building"} {
		m, _ := filepath.Glob(filepath.Join(home, "queue", st, "*.md"))
		paths = append(paths, m...)
	}
	if len(paths) == 0 {
		return nil
	}
	cat, err := profiles.Load(filepath.Join(home, "profiles"))
	if err != nil {
		cat, _ = profiles.Embedded()
	}
	var out []queued
	for _, p := range paths {
		j, err := manifest.ParseFile(p, cat)
		q := queued{path: p, err: err}
		if err == nil {
			q.job = &jobView{ID: j.ID, Ship: j.Ship}
		}
		out = append(out, q)
	}
	return out
}

func checkGHPresent(ctx context.Context, s *session) (string, error) {
	need := s.h.ghNeeded()
	p := s.h.lookPath("gh")
	if p == "" {
		if len(need) > 0 {
			return "", failf("gh is not on PATH, but queued jobs ship pr|merge (%s): install it from https://cli.github.com", strings.Join(need, ", "))
		}
		return "", skipf("gh is not installed; no queued job ships pr|merge (install it from https://cli.github.com to ship pull requests)")
	}
	out, err := s.h.output(ctx, p, "--version")
	if err != nil {
		return "", failf("%s --version failed: %v", p, err)
	}
	return fmt.Sprintf("%s at %s", brief.FirstLine(out, 0), p), nil
}

func checkGHAuth(ctx context.Context, s *session) (string, error) {
	need := s.h.ghNeeded()
	p := s.h.lookPath("gh")
	if p == "" {
		if len(need) > 0 {
			return "", failf("gh is not on PATH, but queued jobs ship pr|merge (%s)", strings.Join(need, ", "))
		}
		return "", skipf("gh is not installed (see host.gh.present)")
	}
	err := ship.GH{Bin: p, Env: s.h.env}.Ready(ctx, "")
	if err == nil {
		return "gh is logged in (gh auth status)", nil
	}
	if len(need) > 0 {
		return "", failf("%v; queued jobs need it: %s", err, strings.Join(need, ", "))
	}
	return "", skipf("%v; no queued job ships pr|merge yet", err)
}

// --- engines ---------------------------------------------------------------

// engineScenario is the presence and pre-flight checks of one engine.
func engineScenario(name string, eng engines.Engine) [2]*scenario {
	g := GroupHost
	present := single(g, "host.engine."+name, name+" is installed (on PATH), with its version; skipped when not installed", 10*time.Second,
		func(ctx context.Context, s *session) (string, error) {
			p := s.h.lookPath(name)
			if p == "" {
				return "", skipf("%s is not installed: jobs with engine: %s wait for a host that has it", name, name)
			}
			return name + " at " + p, nil
		})
	preflight := single(g, "host.engine."+name+".preflight", name+"'s pre-flight passes: version readable, credentials present", 30*time.Second,
		func(ctx context.Context, s *session) (string, error) {
			if s.h.lookPath(name) == "" {
				return "", skipf("%s is not installed", name)
			}
			spec := engines.Spec{JobID: "st-" + s.h.token + "-preflight", Env: secrets.EngineEnv(s.h.env), Grace: 500 * time.Millisecond}
			if s.h.cfg != nil {
				spec.PermissionMode = s.h.cfg.ClaudePermissionMode
			}
			info, err := eng.Preflight(ctx, spec)
			var ue *engines.UnavailableError
			switch {
			case err == nil:
				return fmt.Sprintf("%s %s ready", name, info.Version), nil
			case errors.Is(err, engines.ErrNotInstalled):
				return "", skipf("%v", err)
			case errors.As(err, &ue):
				return "", failf("%v: jobs for %s would fail engine_unavailable", err, name)
			}
			return "", err
		})
	return [2]*scenario{present, preflight}
}

func checkScriptEngine(ctx context.Context, s *session) (string, error) {
	info, err := (&engines.Script{}).Preflight(ctx, engines.Spec{Script: "true", Env: secrets.EngineEnv(s.h.env)})
	if err != nil {
		return "", err
	}
	return "script engine runs through " + info.Path, nil
}

func checkAnyEngine(ctx context.Context, s *session) (string, error) {
	var have []string
	for _, n := range engines.Coding() {
		if s.h.lookPath(n) != "" {
			have = append(have, n)
		}
	}
	if len(have) == 0 {
		return "", skipf("no coding engine (%s) is installed: only engine: script jobs can run here", strings.Join(engines.Coding(), ", "))
	}
	return "coding engines: " + strings.Join(have, ", "), nil
}

// --- AQ_HOME ---------------------------------------------------------------

// homeScenario probes the real $AQ_HOME: write, locks, free space. What it
// creates (the home itself on a fresh host) it removes again.
func homeScenario() *scenario {
	g := GroupHost
	return &scenario{name: "home", group: g, checks: []Check{
		check(g, "host.home.writable", "$AQ_HOME can be created and written (a probe file, removed again)"),
		check(g, "host.home.locks", "file locks work in $AQ_HOME/locks: a held lock excludes a second one"),
		check(g, "host.home.space", "$AQ_HOME's file system has room for worktrees (>= 1 GiB free)"),
	}, run: func(ctx context.Context, s *session) {
		home := s.h.home()
		var created []string
		defer func() {
			for i := len(created) - 1; i >= 0; i-- {
				_ = os.Remove(created[i]) // only if still empty
			}
		}()
		mkdir := func(dir string) error {
			var missing []string
			for d := dir; ; d = filepath.Dir(d) {
				if _, err := os.Stat(d); err == nil {
					break
				}
				missing = append(missing, d)
				if filepath.Dir(d) == d {
					break
				}
			}
			if err := os.MkdirAll(dir, 0o700); err != nil {
				return err
			}
			for i := len(missing) - 1; i >= 0; i-- {
				created = append(created, missing[i])
			}
			return nil
		}
		s.step(ctx, "host.home.writable", 10*time.Second, func(ctx context.Context) (string, error) {
			if home == "" {
				return "", failf("AQ_HOME is not set and there is no home directory: set AQ_HOME")
			}
			existed := fixture.Exists(home)
			if err := mkdir(home); err != nil {
				return "", failf("cannot create AQ_HOME %s: %v (set AQ_HOME to a writable directory)", home, unwrapPath(err))
			}
			probe := filepath.Join(home, ".aq-selftest-"+s.h.token)
			if err := os.WriteFile(probe, []byte("aq selftest probe\n"), 0o600); err != nil {
				return "", failf("cannot write in AQ_HOME %s: %v", home, unwrapPath(err))
			}
			b, err := os.ReadFile(probe)
			rmErr := os.Remove(probe)
			if err != nil || string(b) != "aq selftest probe\n" {
				return "", failf("a file written in AQ_HOME %s does not read back: %v", home, err)
			}
			if rmErr != nil {
				return "", failf("cannot remove the probe file %s: %v", probe, rmErr)
			}
			if !existed {
				return fmt.Sprintf("AQ_HOME %s can be created and written (it did not exist: made for the probe and removed again)", home), nil
			}
			return fmt.Sprintf("AQ_HOME %s is writable (probe file written, read back, removed)", home), nil
		})
		s.step(ctx, "host.home.locks", 10*time.Second, func(ctx context.Context) (string, error) {
			if home == "" {
				return "", skipf("no AQ_HOME (see host.home.writable)")
			}
			locks := filepath.Join(home, "locks")
			if err := mkdir(locks); err != nil {
				return "", failf("cannot create %s: %v", locks, unwrapPath(err))
			}
			name := "aq-selftest-" + s.h.token
			path := filepath.Join(locks, name+".lock")
			defer os.Remove(path)
			l1, ok, err := worktree.TryLockRepo(locks, name)
			if err != nil || !ok {
				return "", failf("cannot take a lock in %s: %v", locks, err)
			}
			defer l1.Unlock()
			l2, ok, err := worktree.TryLockRepo(locks, name)
			if err != nil {
				return "", failf("a second lock attempt failed instead of being refused: %v", err)
			}
			if ok {
				l2.Unlock()
				return "", failf("two locks on %s were both granted: flock does not work there (is %s on NFS?); aq needs a local file system", path, locks)
			}
			if held, err := worktree.Held(locks, name); err != nil || !held {
				return "", failf("a held lock does not read as held (%v)", err)
			}
			l1.Unlock()
			if held, err := worktree.Held(locks, name); err != nil || held {
				return "", failf("a released lock still reads as held (%v)", err)
			}
			return "flock works in " + locks + ": a held lock refuses a second one and is free once released", nil
		})
		s.step(ctx, "host.home.space", 5*time.Second, func(ctx context.Context) (string, error) {
			dir := home
			for dir != "" && !fixture.Exists(dir) && filepath.Dir(dir) != dir {
				dir = filepath.Dir(dir)
			}
			free, err := freeBytes(dir)
			if err != nil {
				return "", skipf("cannot read the free space of %s: %v", dir, err)
			}
			const min = 1 << 30
			if free < min {
				return "", failf("only %s free on the file system of %s: worktrees need room (free space, or move AQ_HOME; >= 1 GiB)", human(free), home)
			}
			return fmt.Sprintf("%s free on the file system of %s", human(free), dir), nil
		})
	}}
}

func human(n uint64) string {
	switch {
	case n >= 1<<30:
		return fmt.Sprintf("%.1f GiB", float64(n)/(1<<30))
	case n >= 1<<20:
		return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
	}
	return fmt.Sprintf("%d KiB", n>>10)
}

func unwrapPath(err error) error {
	var pe *fs.PathError
	if errors.As(err, &pe) {
		return pe.Err
	}
	return err
}

// --- repo base and capabilities --------------------------------------------

func runRepoBase(ctx context.Context, s *session) {
	var host *caps.Host
	var detectErr error
	base := ""
	if s.h.cfg != nil {
		base = s.h.cfg.RepoBase
	}
	s.step(ctx, "host.caps.detect", 20*time.Second, func(ctx context.Context) (string, error) {
		host, detectErr = caps.Detect(ctx, caps.DetectOptions{RepoBase: base, Path: s.h.path, Env: s.h.env})
		if detectErr != nil {
			return "", failf("capability detection failed: %v", detectErr)
		}
		toks := host.Tokens()
		var shown []string
		for _, t := range toks {
			if !strings.HasPrefix(t, "repo:") {
				shown = append(shown, t)
			}
		}
		r := fmt.Sprintf("%d capabilities: %s", len(toks), strings.Join(shown, " "))
		if n := len(host.Repos); n > 0 {
			r += fmt.Sprintf(" + %d repo:<name>", n)
		}
		for _, note := range host.Notes {
			if strings.Contains(note, "did not finish") || strings.Contains(note, "failed") {
				r += "; note: " + note
			}
		}
		return r, nil
	})
	s.step(ctx, "host.repobase.readable", 10*time.Second, func(ctx context.Context) (string, error) {
		if s.h.cfg == nil {
			return "", skipf("the configuration did not load (see host.config.valid)")
		}
		if base == "" {
			return "", skipf("AQ_REPO_BASE is empty: no repo:<name> capabilities")
		}
		fi, err := os.Stat(base)
		if errors.Is(err, fs.ErrNotExist) {
			return "", skipf("AQ_REPO_BASE %s does not exist: no local repositories (create it and clone repos into it, or set AQ_REPO_BASE)", base)
		}
		if err != nil {
			return "", failf("cannot read AQ_REPO_BASE %s: %v (check its permissions)", base, unwrapPath(err))
		}
		if !fi.IsDir() {
			return "", failf("AQ_REPO_BASE %s is not a directory", base)
		}
		if detectErr != nil {
			return "", failf("%v", detectErr)
		}
		if _, err := os.ReadDir(base); err != nil {
			return "", failf("cannot list AQ_REPO_BASE %s: %v", base, unwrapPath(err))
		}
		n := 0
		if host != nil {
			n = len(host.Repos)
		}
		return fmt.Sprintf("AQ_REPO_BASE %s is readable: %d git repositories", base, n), nil
	})
	s.step(ctx, "host.repobase.repos", 30*time.Second, func(ctx context.Context) (string, error) {
		if host == nil || len(host.Repos) == 0 {
			return "", skipf("no git repository under AQ_REPO_BASE")
		}
		if s.h.lookPath("git") == "" {
			return "", skipf("git is not on PATH (see host.git.present)")
		}
		var bad []string
		for _, r := range host.Repos {
			dir := filepath.Join(base, r)
			if err := worktree.CheckRepo(ctx, worktree.Git{Bin: s.h.lookPath("git")}, dir); err != nil {
				bad = append(bad, fmt.Sprintf("%s: %v", r, err))
			}
		}
		if len(bad) > 0 {
			return "", failf("%d of %d repositories are not usable: %s", len(bad), len(host.Repos), strings.Join(bad, "; "))
		}
		return fmt.Sprintf("%d repositories, each a git repository: %s", len(host.Repos), strings.Join(host.Repos, ", ")), nil
	})
}

// --- locks and processes ---------------------------------------------------

func checkLocksExclusive(ctx context.Context, s *session) (string, error) {
	dir, err := os.MkdirTemp("", "aq-selftest-locks-")
	if err != nil {
		return "", err
	}
	defer os.RemoveAll(dir)
	l1, ok, err := worktree.TryLockRepo(dir, "probe")
	if err != nil || !ok {
		return "", failf("cannot take a lock in %s: %v", dir, err)
	}
	if _, ok, _ := worktree.TryLockRepo(dir, "probe"); ok {
		return "", failf("two flocks on one file were both granted: flock(2) does not exclude here")
	}
	wctx, cancel := context.WithTimeout(ctx, 150*time.Millisecond)
	_, werr := worktree.LockRepo(wctx, dir, "probe")
	cancel()
	if werr == nil {
		return "", failf("a blocking lock was granted while another held it")
	}
	released := make(chan struct{})
	got := make(chan error, 1)
	go func() {
		l, err := worktree.LockRepo(ctx, dir, "probe")
		if err == nil {
			select {
			case <-released:
			default:
				err = errors.New("granted before the holder released it")
			}
			l.Unlock()
		}
		got <- err
	}()
	time.Sleep(50 * time.Millisecond)
	close(released)
	l1.Unlock()
	if err := <-got; err != nil {
		return "", failf("a waiting lock: %v", err)
	}
	return "a second flock on a held file is refused; a blocked one waits and gets it once the first is released", nil
}

// --- clock -----------------------------------------------------------------

func checkClockBuild(ctx context.Context, s *session) (string, error) {
	now := time.Now()
	if now.Year() < 2024 {
		return "", failf("the clock says %s: fix the system time (NTP)", now.UTC().Format(time.RFC3339))
	}
	d := version.Get().Date
	built, err := time.Parse(time.RFC3339, d)
	if d == "" || err != nil {
		return "", skipf("this build carries no build date (make build stamps one); the clock reads %s", now.UTC().Format(time.RFC3339))
	}
	if now.Before(built.Add(-time.Minute)) {
		return "", failf("the clock (%s) is before this build's date (%s): fix the system time (NTP)", now.UTC().Format(time.RFC3339), built.UTC().Format(time.RFC3339))
	}
	return fmt.Sprintf("the clock (%s) is after the build date (%s)", now.UTC().Format(time.RFC3339), built.UTC().Format(time.RFC3339)), nil
}

func checkClockMonotonic(ctx context.Context, s *session) (string, error) {
	const nap = 50 * time.Millisecond
	t0 := time.Now()
	time.Sleep(nap)
	t1 := time.Now()
	mono := t1.Sub(t0)
	wall := t1.Round(0).Sub(t0.Round(0))
	if mono < nap {
		return "", failf("the monotonic clock advanced %s over a %s sleep", mono, nap)
	}
	if skew := wall - mono; skew > time.Second || skew < -time.Second {
		return "", failf("the wall clock moved %s while the monotonic clock moved %s: the time is being stepped (check NTP)", wall, mono)
	}
	return fmt.Sprintf("monotonic %s and wall %s over a %s sleep", ms(mono), ms(wall), nap), nil
}

// --- configuration ---------------------------------------------------------

func checkConfigValid(ctx context.Context, s *session) (string, error) {
	if s.h.cfgErr != nil {
		return "", s.h.cfgErr
	}
	c := s.h.cfg
	if c == nil {
		return "", skipf("no configuration was given")
	}
	mode := "local mode"
	if c.Fleet {
		mode = "fleet mode (" + c.FleetAPI + ")"
	}
	file := "no config file"
	if c.ConfigFile != "" {
		file = "config file " + c.ConfigFile
	}
	return fmt.Sprintf("AQ_HOME=%s AQ_REPO_BASE=%s, %s, %s", c.Home, c.RepoBase, mode, file), nil
}

func checkConfigFile(ctx context.Context, s *session) (string, error) {
	c := s.h.cfg
	if c == nil {
		return "", skipf("the configuration did not load (see host.config.valid)")
	}
	if c.ConfigFile == "" {
		return "", skipf("no config file: environment and defaults only")
	}
	fi, err := os.Stat(c.ConfigFile)
	if err != nil {
		return "", failf("cannot stat %s: %v", c.ConfigFile, unwrapPath(err))
	}
	if m := fi.Mode().Perm(); m&0o022 != 0 {
		return "", failf("config file %s is writable by group or others (mode %04o): whoever can write it decides where the factory token is sent; run chmod go-w %s", c.ConfigFile, m, c.ConfigFile)
	}
	return fmt.Sprintf("config file %s (mode %04o)", c.ConfigFile, fi.Mode().Perm()), nil
}

func checkPrices(ctx context.Context, s *session) (string, error) {
	path := ""
	if s.h.cfg != nil {
		path = s.h.cfg.PriceTable
	} else if s.h.cfgErr != nil {
		return "", skipf("the configuration did not load (see host.config.valid)")
	}
	t, err := engines.LoadPrices(path)
	if err != nil {
		return "", failf("%v (fix the file or unset AQ_PRICE_TABLE)", err)
	}
	if path == "" {
		return fmt.Sprintf("built-in price table: %d models", len(t.Models)), nil
	}
	return fmt.Sprintf("AQ_PRICE_TABLE %s merged over the built-in prices: %d models", path, len(t.Models)), nil
}

func checkProfiles(ctx context.Context, s *session) (string, error) {
	home := s.h.home()
	dir := ""
	if home != "" {
		dir = filepath.Join(home, "profiles")
	}
	cat, err := profiles.Load(dir)
	if err != nil {
		return "", failf("%v", err)
	}
	names := cat.Names()
	r := fmt.Sprintf("%d profiles: %s", len(names), strings.Join(names, ", "))
	if dir != "" && fixture.Exists(dir) {
		r += " (with the overrides in " + dir + ")"
	}
	return r, nil
}

func checkQueuedManifests(ctx context.Context, s *session) (string, error) {
	home := s.h.home()
	if home == "" || !fixture.Exists(filepath.Join(home, "queue")) {
		return "", skipf("no local queue yet ($AQ_HOME/queue does not exist)")
	}
	qs := s.h.queuedManifests()
	if len(qs) == 0 {
		return "", skipf("the local queue holds no waiting job")
	}
	var bad []string
	for _, q := range qs {
		if q.err != nil {
			bad = append(bad, brief.OneLine(q.err.Error(), maxReason))
		}
	}
	if len(bad) > 0 {
		return "", failf("%d of %d queued manifests no longer parse (they will fail invalid_manifest): %s", len(bad), len(qs), bad[0])
	}
	return fmt.Sprintf("%d queued manifests parse", len(qs)), nil
}

// --- misc ------------------------------------------------------------------

func checkTmpWritable(ctx context.Context, s *session) (string, error) {
	f, err := os.CreateTemp("", "aq-selftest-")
	if err != nil {
		return "", failf("cannot create a file in %s: %v (set TMPDIR to a writable directory)", os.TempDir(), unwrapPath(err))
	}
	name := f.Name()
	_, werr := f.WriteString("probe")
	cerr := f.Close()
	rerr := os.Remove(name)
	if err := errors.Join(werr, cerr, rerr); err != nil {
		return "", failf("temp file %s: %v", name, err)
	}
	return "temp dir " + os.TempDir() + " is writable", nil
}

// sortedKeys returns m's keys, sorted.
func sortedKeys[V any](m map[string]V) []string { return slices.Sorted(maps.Keys(m)) }
