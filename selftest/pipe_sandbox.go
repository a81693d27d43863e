package selftest

import (
	"context"
	"fmt"
	"maps"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/aqfleet/aq/agent/config"
	"github.com/aqfleet/aq/internal/fixture"
	"github.com/aqfleet/aq/internal/sandbox"
	"github.com/aqfleet/aq/internal/sandbox/hostile"
	"github.com/aqfleet/aq/job"
)

// --- the engine sandbox: the escape set, from inside a real sandbox ------------------

// sandboxScenario runs the hostile engine (internal/sandbox/hostile: the
// hostile-engine suite's own script) as a real job in the sandbox this
// host gives engines (AQ_SANDBOX, aq itself as the sandbox's init), and
// fails if any escape the host's level denies succeeds. Where the host
// cannot sandbox, the checks skip saying why — but under AQ_SANDBOX=on a
// host that cannot sandbox fully fails them.
func sandboxScenario() *scenario {
	g := GroupPipeline
	return &scenario{name: "sandbox", group: g, workspace: true, checks: []Check{
		check(g, "pipeline.sandbox.level", "engines run in a sandbox here (AQ_SANDBOX): its level and the guarantees that hold; under AQ_SANDBOX=on the full level"),
		check(g, "pipeline.sandbox.files", "a hostile job's engine cannot read $AQ_HOME, the factory's or the user's credentials, another job, worktree or repository, write outside its own, or plant a hook or core.fsmonitor; the job still ships"),
		check(g, "pipeline.sandbox.network", "the hostile engine reaches no loopback port, not the coordinator, not a host no job is allowed"),
		check(g, "pipeline.sandbox.processes", "the hostile engine cannot see, signal or read aq"),
		check(g, "pipeline.sandbox.stragglers", "the daemonised straggler the hostile engine leaves (its tag dropped, its group left) ends with the job"),
	}, run: func(ctx context.Context, s *session) {
		var (
			sb    *sandbox.Host
			level sandbox.Level
			run   *hostileRun
		)
		if !s.step(ctx, "pipeline.sandbox.level", 20*time.Second, func(ctx context.Context) (string, error) {
			mode, limits := sandbox.ModeAuto, sandbox.Limits{}
			if c := s.h.cfg; c != nil {
				mode, limits = c.Sandbox, sandbox.Limits{MemoryBytes: c.SandboxMemory, Pids: c.SandboxPids}
			}
			switch {
			case mode == sandbox.ModeOff:
				return "", skipf("AQ_SANDBOX=off: engines run unsandboxed here")
			case s.h.exe == "" && mode == sandbox.ModeOn:
				return "", failf("AQ_SANDBOX=on and there is no aq binary to run the sandbox's init with (a Go test binary without Options.Exe)")
			case s.h.exe == "":
				return "", skipf("no aq binary to run the sandbox's init with (a Go test binary; pass Options.Exe)")
			}
			sb = sandbox.Open(sandbox.Options{Init: s.h.exe, Mode: mode, Limits: limits})
			r := sb.Report()
			level = r.Level
			if err := sb.Refuses(); err != nil {
				return "", failf("%s", strings.TrimPrefix(err.Error(), sandbox.ErrUnavailable.Error()+": "))
			}
			if level == sandbox.LevelNone {
				return "", skipf("this host cannot sandbox engines: %s", r.MissingLine())
			}
			held := make([]string, len(r.Holds))
			for i, g := range r.Holds {
				held[i] = string(g)
			}
			msg := fmt.Sprintf("%s (%s): %s hold", level, r.Mechanism, strings.Join(held, ", "))
			if m := r.MissingLine(); m != "" {
				msg += "; missing: " + m
			}
			return msg, nil
		}) {
			return
		}
		if !s.step(ctx, "pipeline.sandbox.files", 90*time.Second, func(ctx context.Context) (string, error) {
			var err error
			if run, err = s.runHostile(ctx, level); err != nil {
				return "", err
			}
			if bad := run.escapes(level, sandbox.GuaranteeFiles); len(bad) > 0 {
				return "", failf("escapes succeeded inside the %s sandbox: %s", level, strings.Join(bad, "; "))
			}
			return fmt.Sprintf("%d file escapes denied, nothing written outside the job's own; the hostile job shipped", len(hostile.Denied(level, sandbox.GuaranteeFiles))), nil
		}) {
			return
		}
		s.step(ctx, "pipeline.sandbox.network", 10*time.Second, func(ctx context.Context) (string, error) {
			return judgeGuarantee(sb.Report(), level, sandbox.GuaranteeNetwork, run)
		})
		s.step(ctx, "pipeline.sandbox.processes", 10*time.Second, func(ctx context.Context) (string, error) {
			return judgeGuarantee(sb.Report(), level, sandbox.GuaranteeProcesses, run)
		})
		s.step(ctx, "pipeline.sandbox.stragglers", 40*time.Second, func(ctx context.Context) (string, error) {
			mark := run.args.StragglerMark()
			defer hostile.KillMarked(mark)
			if _, err := hostile.Marked(mark); err != nil {
				return "", skipf("%v", err)
			}
			if !sb.Report().Has(sandbox.GuaranteeStragglers) {
				return "", skipf("the %s level does not end stragglers: %s", level, missingWhy(sb.Report(), sandbox.GuaranteeStragglers))
			}
			wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
			defer cancel()
			if err := fixture.WaitFor(wctx, "the straggler to end with its sandbox", func() bool {
				pids, _ := hostile.Marked(mark)
				return len(pids) == 0
			}); err != nil {
				pids, _ := hostile.Marked(mark)
				return "", failf("the hostile engine's straggler (pids %v) outlived its job", pids)
			}
			return "the straggler (tag dropped, own session) ended with the job's sandbox", nil
		})
	}}
}

// hostileRun is one run of the hostile job.
type hostileRun struct {
	args     hostile.Args
	probes   map[string]string
	accepted *atomic.Int64
}

// escapes are the escapes of guarantee g that level denies and that
// succeeded in run: what the script printed, and for files the writes and
// plants found on the host, for the network the connections the host's
// listeners took.
func (run *hostileRun) escapes(level sandbox.Level, g sandbox.Guarantee) []string {
	bad := hostile.Escaped(hostile.Denied(level, g), run.probes)
	switch g {
	case sandbox.GuaranteeFiles:
		for _, name := range slices.Sorted(maps.Keys(run.args.Writes())) {
			if p := run.args.Writes()[name]; fixture.Exists(p) {
				bad = append(bad, name+": a write landed on the host at "+p)
			}
		}
		if hook, _, _ := run.args.Plants(); fixture.Exists(hook) {
			bad = append(bad, "plant_hook: a hook was planted at "+hook)
		}
	case sandbox.GuaranteeNetwork:
		if n := run.accepted.Load(); n > 0 {
			bad = append(bad, fmt.Sprintf("the host's listeners accepted %d connections from the sandbox", n))
		}
	}
	return bad
}

// judgeGuarantee fails the check when an escape of g that level denies
// succeeded, and skips it when the level denies none of g's escapes
// (saying why g does not hold here).
func judgeGuarantee(r sandbox.Report, level sandbox.Level, g sandbox.Guarantee, run *hostileRun) (string, error) {
	denied := hostile.Denied(level, g)
	if len(denied) == 0 {
		return "", skipf("the %s level does not hold %s: %s", level, g, missingWhy(r, g))
	}
	if bad := run.escapes(level, g); len(bad) > 0 {
		return "", failf("escapes succeeded inside the %s sandbox: %s", level, strings.Join(bad, "; "))
	}
	names := make([]string, len(denied))
	for i, p := range denied {
		names[i] = p.Name
	}
	msg := strings.Join(names, ", ") + ": denied"
	if !r.Has(g) {
		msg += " (partly held at the " + string(level) + " level: " + missingWhy(r, g) + ")"
	}
	return msg, nil
}

func missingWhy(r sandbox.Report, g sandbox.Guarantee) string {
	for _, m := range r.Missing {
		if m.Guarantee == g {
			return m.Why
		}
	}
	return "?"
}

// runHostile sets up a factory's world — $AQ_HOME with its credentials
// and another job's manifest, logs and worktree, a repo base with another
// product's repository, a user's home with keys, listeners on the host's
// loopback and on 127.0.0.2, a coordinator-like HTTP server — and runs
// the hostile job in it through the local agent, in the host's sandbox.
func (s *session) runHostile(ctx context.Context, level sandbox.Level) (*hostileRun, error) {
	w := s.ws
	mode := sandbox.ModeAuto
	if s.h.cfg != nil {
		mode = s.h.cfg.Sandbox
	}
	dir, err := w.dir("sandbox-user")
	if err != nil {
		return nil, err
	}
	userHome := filepath.Join(dir, "home")
	run := &hostileRun{accepted: new(atomic.Int64)}
	l, err := w.newLocal("sandbox", localOpt{env: []string{"HOME=" + userHome}, config: func(c *config.Config) {
		c.Supervisor, c.Sandbox, c.WorktreePool = s.h.exe, mode, 0
		if s.h.cfg != nil {
			c.SandboxMemory, c.SandboxPids = s.h.cfg.SandboxMemory, s.h.cfg.SandboxPids
		}
	}})
	if err != nil {
		return nil, err
	}
	if got := l.a.Runner.Sandbox.Level(); got != level {
		return nil, failf("the runner's sandbox is at level %s, the host's at %s", got, level)
	}
	for path, content := range map[string]string{
		filepath.Join(userHome, ".ssh", "id_ed25519"):   "-----BEGIN OPENSSH PRIVATE KEY----- selftest",
		filepath.Join(userHome, ".aws", "credentials"):  "[default]\naws_secret_access_key = selftest",
		filepath.Join(userHome, ".config/gh/hosts.yml"): "github.com:\n  oauth_token: gho_selftest",
		filepath.Join(l.home, "credentials"):            "factory-token-selftest",
	} {
		if err := fixture.WriteFile(path, content); err != nil {
			return nil, err
		}
	}
	if _, _, err := l.repo(ctx, "app", map[string]string{"hostile.sh": hostile.Script}, false); err != nil {
		return nil, err
	}
	if _, _, err := l.repo(ctx, "other", map[string]string{"secret.txt": "another product's secret\n"}, false); err != nil {
		return nil, err
	}
	listen := func(addr string, serve func(net.Listener)) (int, error) {
		ln, err := net.Listen("tcp4", addr)
		if err != nil {
			return 0, err
		}
		context.AfterFunc(ctx, func() { ln.Close() })
		go serve(ln)
		return ln.Addr().(*net.TCPAddr).Port, nil
	}
	count := func(ln net.Listener) {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			run.accepted.Add(1)
			c.Close()
		}
	}
	args := hostile.Args{AQHome: l.home, RepoBase: l.base, UserHome: userHome, AQPIDs: []int{os.Getpid()},
		Nonce: w.token + "-" + fixture.RandomHex(3), Repo: "app"}
	if args.Port, err = listen("127.0.0.1:0", count); err != nil {
		return nil, err
	}
	if args.ForbiddenPort, err = listen("127.0.0.2:0", count); err != nil {
		// 127.0.0.2 is not a local address here (macOS): a second
		// loopback port stands in for the host no job is allowed.
		if args.ForbiddenPort, err = listen("127.0.0.1:0", count); err != nil {
			return nil, err
		}
	}
	coordLike := http.HandlerFunc(func(rw http.ResponseWriter, _ *http.Request) {
		run.accepted.Add(1)
		fmt.Fprintln(rw, `{"productId":"selftest","version":1}`)
	})
	if args.CoordPort, err = listen("127.0.0.1:0", func(ln net.Listener) { _ = http.Serve(ln, coordLike) }); err != nil {
		return nil, err
	}
	run.args = args
	cleanup := func() {
		for _, p := range args.Writes() {
			os.Remove(p)
		}
		_, hookRan, fsmonitorRan := args.Plants()
		os.Remove(hookRan)
		os.Remove(fsmonitorRan)
	}
	context.AfterFunc(ctx, cleanup)

	// Another job first: its manifest, logs and worktree stay in $AQ_HOME.
	other := l.id("sandbox-other")
	if _, err := l.submit(other, "repo: other\nengine: script\nship: branch\nscript: \"echo other > other-work.txt\"", ""); err != nil {
		return nil, err
	}
	if r, err := l.runOne(ctx, other); err != nil || r.Outcome.Failed() {
		return nil, failf("the other job: %s (%v)", outcomeText(r), err)
	}
	id := l.id("sandbox-hostile")
	if _, err := l.submit(id, "repo: app\nengine: script\nship: branch\nretry: { max: 0 }\n"+yamlBlock("script", args.Command("hostile.sh")), ""); err != nil {
		return nil, err
	}
	r, err := l.runOne(ctx, id)
	if err != nil {
		return nil, err
	}
	out := readFile(filepath.Join(l.cfg.LogsDir(), id, "stdout.log"))
	run.probes = hostile.Parse(out)
	if r.Outcome.Failed() || r.Stage != job.Shipped {
		return nil, failf("the hostile job did not ship: %s (its log: %s)", outcomeText(r), lastLines(out, 2))
	}
	if len(run.probes) == 0 {
		return nil, failf("the hostile engine ran no probe (its log: %s)", lastLines(out, 2))
	}
	if !w.treeHas(ctx, l.repoDir("app"), job.JobBranch(id), "result.txt") {
		return nil, failf("the hostile job's work is not on %s", job.JobBranch(id))
	}
	return run, nil
}
