package runner

// Sandbox: the job's sandbox (internal/sandbox, docs/sandbox.md) — its
// Policy from the job's paths and aq's, the job's own directory with the
// engine's login copied into its home, the route out through the job's
// egress proxy, the engines' autonomy that the sandbox makes safe, and
// what is left to do when the run ends: refreshed logins written back, the
// job's directory removed.

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/aqfleet/aq/engines"
	"github.com/aqfleet/aq/internal/process"
	"github.com/aqfleet/aq/internal/sandbox"
	"github.com/aqfleet/aq/job"
	"github.com/aqfleet/aq/worktree"
)

// Egress starts a job's egress proxy (internal/egress): the engine's only
// route out of its sandbox. A runner without one gives sandboxed engines
// no network at all.
type Egress interface {
	// Start starts the proxy of job jobID, whose engine is engine (its own
	// API endpoints are allowed), listening on the unix socket sock, and
	// also on 127.0.0.1 when tcp (a sandbox without a network namespace of
	// its own reaches it there). onRefusal is called for every connection
	// it refuses, with the count for that destination so far.
	Start(ctx context.Context, jobID, engine, sock string, tcp bool, onRefusal func(job.EgressRefusal)) (EgressProxy, error)
}

// EgressProxy is one job's running proxy.
type EgressProxy interface {
	// Port is its TCP port on 127.0.0.1 (0 when it listens on the socket
	// only).
	Port() int
	// Refusals are what it refused so far, most refused first.
	Refusals() []job.EgressRefusal
	// Close stops it.
	Close() error
}

// An EgressProxy may also have Gateways() []string: the destinations on
// the host's loopback it allows by address and port, which the sandbox
// then makes reachable at that same address (sandbox.Net.Gateways).

// sandboxDir is where the jobs' own directories live ($AQ_HOME/sandbox).
func (c Config) sandboxDir() string { return filepath.Join(c.Home, "sandbox") }

// SandboxLevel is the level this runner's engines run at: its sandbox's,
// none without one (the admission's manifest.Policy.Sandbox).
func (r *Runner) SandboxLevel() sandbox.Level {
	if r.Sandbox == nil {
		return sandbox.LevelNone
	}
	return r.Sandbox.Level()
}

// refuseUnsandboxed fails the run when the host cannot sandbox as
// AQ_SANDBOX=on demands; it reports whether the run may go on. (A job that
// requires a level this host lacks — sandbox: required — is refused at
// admission, manifest.Check, before it reaches the runner.)
func (ru *run) refuseUnsandboxed() bool {
	if ru.r.Sandbox == nil {
		return true
	}
	if err := ru.r.Sandbox.Refusal(); err != nil {
		ru.fail(job.ReasonSandboxUnavailable, err.Error())
		return false
	}
	return true
}

// openSandbox makes the job's sandbox once its worktree exists: the
// policy, the proxy, the job's directory and the engine's login in its
// home. It reports whether the run may go on (a failure is
// sandbox_unavailable; the worktree and branch are left as they are).
func (ru *run) openSandbox(ctx context.Context) bool {
	sb := ru.r.Sandbox
	if sb == nil || sb.Level() == sandbox.LevelNone {
		return true
	}
	host := ru.r.env()
	home := envValue(host, "HOME")
	if home == "" {
		home, _ = os.UserHomeDir()
	}
	var hide []string
	for _, h := range []string{ru.r.Cfg.Home, ru.r.Cfg.RepoBase, ru.r.Cfg.Mirror} {
		if h != "" {
			hide = append(hide, h)
		}
	}
	p := sandbox.NewPolicy(sandbox.Paths{
		Worktree: ru.wtPath, JobDir: filepath.Join(ru.r.Cfg.sandboxDir(), ru.j.ID), Home: home,
		Hide: hide, Env: host, Engine: ru.info.Path, Shared: ru.r.Cfg.SandboxWritable,
		GitDirs: worktree.GitDirsOf(ru.wtPath),
	})
	// The job's directory is made afresh for every run (a recovered
	// attempt included): nothing a crashed engine planted there survives
	// into the next one. Repair rounds of this run keep it.
	if err := sandbox.FreshJobDir(p.JobDir); err != nil {
		ru.fail(job.ReasonSandboxUnavailable, "the job's sandbox could not be made: "+err.Error())
		return false
	}
	if eg := ru.r.Egress; eg != nil {
		sock := filepath.Join(p.JobDir, "proxy.sock")
		proxy, err := eg.Start(ctx, ru.j.ID, ru.eng.Name(), sock, sb.Level() != sandbox.LevelFull, ru.egressRefused)
		if err != nil {
			ru.fail(job.ReasonSandboxUnavailable, "the job's egress proxy did not start: "+err.Error())
			return false
		}
		ru.proxy = proxy
		p.Net = sandbox.Net{ProxySocket: sock, ProxyPort: proxy.Port()}
		if g, ok := proxy.(interface{ Gateways() []string }); ok {
			p.Net.Gateways = g.Gateways()
		}
	}
	j, err := sb.Jail(p)
	if err != nil {
		ru.closeSandbox()
		ru.fail(job.ReasonSandboxUnavailable, "the job's sandbox could not be made: "+err.Error())
		return false
	}
	ru.jail = j
	login := engines.LoginOf(ru.eng.Name(), host)
	if ru.logins, err = j.CopyLogins(login.Files); err != nil {
		ru.closeSandbox()
		ru.fail(job.ReasonSandboxUnavailable, err.Error())
		return false
	}
	for _, v := range login.Env {
		ru.loginEnv = append(ru.loginEnv, v.Name+"="+filepath.Join(j.Home(), v.Rel))
	}
	ru.log.Debug("sandbox ready", "level", j.Level(), "job_dir", p.JobDir, "home", j.Home())
	return true
}

// hiddenFrom says, for a failure detail, which paths command names that the
// job's sandbox hides from it ("" when none, or when there is no
// sandbox): a script or program there reads as missing — exit 127,
// "command not found" — though the host has it (#34).
func (ru *run) hiddenFrom(command string) string {
	if ru.jail == nil || command == "" {
		return ""
	}
	home := envValue(ru.r.env(), "HOME")
	if home == "" {
		home, _ = os.UserHomeDir()
	}
	hidden := ru.jail.Policy().HiddenIn(command, home)
	if len(hidden) == 0 {
		return ""
	}
	return "; the sandbox hides " + strings.Join(hidden, ", ") + ": " + sandbox.HiddenFix
}

// afterSandboxed logs what the sandbox's last start left aside and writes
// back the logins the engine refreshed; after every engine run.
func (ru *run) afterSandboxed() {
	if ru.jail == nil {
		return
	}
	for _, n := range ru.jail.Notes() {
		ru.log.Warn("sandbox: "+n, "job", ru.j.ID)
	}
	notes, refused := ru.logins.WriteBack()
	for _, n := range notes {
		ru.log.Info("sandbox: " + n)
	}
	for _, ref := range refused {
		ru.untrusted(ref)
	}
}

// closeSandbox ends what openSandbox started; at the end of the run.
func (ru *run) closeSandbox() {
	ru.afterSandboxed()
	if ru.proxy != nil {
		ru.keepRefusals()
		if err := ru.proxy.Close(); err != nil {
			ru.log.Warn("the job's egress proxy did not stop cleanly", "err", err)
		}
		ru.proxy = nil
	}
	if ru.jail != nil {
		if err := ru.jail.Remove(); err != nil {
			ru.log.Warn("cannot remove the job's sandbox directory; aq gc will", "dir", ru.jail.Policy().JobDir, "err", err)
		}
		ru.jail = nil
	}
}

// jailed is the job's sandbox as the process layer takes it (nil when the
// engine runs unsandboxed).
func (ru *run) jailed() process.Jail {
	if ru.jail == nil {
		return nil
	}
	return ru.jail
}

// sandboxEnv is env with what the engine's login needs in the job's home.
func (ru *run) sandboxEnv(env []string) []string {
	if len(ru.loginEnv) == 0 {
		return env
	}
	names := map[string]bool{}
	for _, kv := range ru.loginEnv {
		k, _, _ := strings.Cut(kv, "=")
		names[k] = true
	}
	out := make([]string, 0, len(env)+len(ru.loginEnv))
	for _, kv := range env {
		if k, _, _ := strings.Cut(kv, "="); !names[k] {
			out = append(out, kv)
		}
	}
	return append(out, ru.loginEnv...)
}

// permissionMode is claude's --permission-mode for this run (autonomy).
func (ru *run) permissionMode() string {
	m, _ := autonomy(ru.r.Cfg.PermissionMode, ru.r.Cfg.CodexSandbox, ru.jail != nil)
	return m
}

// codexSandbox is codex's --sandbox for this run (autonomy).
func (ru *run) codexSandbox() string {
	_, c := autonomy(ru.r.Cfg.PermissionMode, ru.r.Cfg.CodexSandbox, ru.jail != nil)
	return c
}

// autonomy is the engines' modes: the configured ones, else, inside the
// sandbox (which is what makes it safe: the engine can run the build and
// the tests it is asked to), claude's bypassPermissions and codex's
// danger-full-access (codex's own sandbox would take the network away
// again); outside it acceptEdits and workspace-write. devin follows
// claude's.
func autonomy(perm, codex string, sandboxed bool) (string, string) {
	if perm == "" {
		perm = engines.DefaultPermissionMode
		if sandboxed {
			perm = "bypassPermissions"
		}
	}
	if codex == "" {
		codex = engines.DefaultCodexSandbox
		if sandboxed {
			codex = "danger-full-access"
		}
	}
	return perm, codex
}

// sandboxFailure maps an engine or verify that could not start in its
// sandbox, or that the kernel killed for memory at the sandbox's limit,
// to its reason; it reports whether it did.
func (ru *run) sandboxFailure(what string, err error, oom bool) bool {
	switch {
	case errors.Is(err, sandbox.ErrUnavailable):
		ru.fail(job.ReasonSandboxUnavailable, what+" did not start in its sandbox: "+err.Error())
		return true
	case oom:
		lim := ""
		if ru.jail != nil && ru.jail.Policy().Limits.MemoryBytes > 0 {
			lim = fmt.Sprintf(" (%d MiB, AQ_SANDBOX_MEMORY)", ru.jail.Policy().Limits.MemoryBytes>>20)
		}
		ru.fail(job.ReasonOutOfMemory, what+" was killed for memory at the sandbox's limit"+lim)
		return true
	}
	return false
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

// sandboxLevel names the level the engine runs at ("none" unsandboxed).
func (ru *run) sandboxLevel() string {
	if ru.jail == nil {
		return string(sandbox.LevelNone)
	}
	return string(ru.jail.Level())
}
