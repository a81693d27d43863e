package selftest

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/aqfleet/aq/agent/queue"
	"github.com/aqfleet/aq/internal/fixture"
	"github.com/aqfleet/aq/internal/process"
	"github.com/aqfleet/aq/job"
)

// --- retries and the dead letter ---------------------------------------------------

func retryScenario() *scenario {
	g := GroupPipeline
	return &scenario{name: "retry", group: g, workspace: true, checks: []Check{
		check(g, "pipeline.retry.backoff", "a failed job with retries left returns to the inbox and is not taken before its backoff ends"),
		check(g, "pipeline.retry.resume", "the retry starts from the failed attempt's checkpoint and finishes the work"),
		check(g, "pipeline.retry.dead-letter", "a job that fails with no retries left goes to dead_letter, its work checkpointed"),
	}, run: func(ctx context.Context, s *session) {
		var mu sync.Mutex
		now := time.Now().UTC()
		clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
		advance := func(d time.Duration) { mu.Lock(); now = now.Add(d); mu.Unlock() }
		l := s.newLocal(ctx, "retry", localOpt{clock: clock}, "app")
		if l == nil {
			return
		}
		repo := l.repoDir("app")
		flaky := l.id("flaky")
		twoSteps := "if [ -f step-1.txt ]; then echo two > step-2.txt; else echo one > step-1.txt; echo 'failing after step 1' >&2; exit 1; fi"
		if !s.step(ctx, "pipeline.retry.backoff", 20*time.Second, func(ctx context.Context) (string, error) {
			if _, err := l.submit(flaky, "repo: app\nengine: script\nretry: { max: 1, backoff: 10m }\n"+yamlBlock("script", twoSteps), ""); err != nil {
				return "", err
			}
			r, err := l.runOne(ctx, flaky)
			if err != nil {
				return "", err
			}
			st, err := l.state(flaky)
			if err != nil {
				return "", err
			}
			if r.Outcome.Reason != job.ReasonEngineFailed || st.Stage != job.Inbox || !st.NotBefore.Equal(clock().Round(0).Add(10*time.Minute)) {
				return "", failf("attempt 1 ended %s; stage %s, not before %s: want engine_failed, inbox, now+10m", outcomeText(r), st.Stage, st.NotBefore)
			}
			if r2, err := l.a.RunOne(ctx); !errors.Is(err, queue.ErrNoJob) {
				return "", failf("during the backoff RunOne took %v (%v)", r2, err)
			}
			return "engine_failed on attempt 1: back in the inbox, not taken during its 10m backoff", nil
		}) {
			return
		}
		s.step(ctx, "pipeline.retry.resume", 20*time.Second, func(ctx context.Context) (string, error) {
			advance(10*time.Minute + time.Second)
			r, err := l.runOne(ctx, flaky)
			if err != nil {
				return "", err
			}
			if r.Outcome.Failed() || r.Attempt != 2 || r.Stage != job.Shipped {
				return "", failf("attempt %d ended %s, want attempt 2 shipped", r.Attempt, outcomeText(r))
			}
			br := job.JobBranch(flaky)
			if !s.ws.treeHas(ctx, repo, br, "step-1.txt") || !s.ws.treeHas(ctx, repo, br, "step-2.txt") {
				return "", failf("%s lacks step-1.txt or step-2.txt: the retry did not start from the checkpoint", br)
			}
			return "attempt 2 started from attempt 1's checkpoint (step-1.txt there), wrote step-2.txt and shipped", nil
		})
		s.step(ctx, "pipeline.retry.dead-letter", 20*time.Second, func(ctx context.Context) (string, error) {
			id := l.id("doomed")
			if _, err := l.submit(id, "repo: app\nengine: script\nretry: { max: 1, backoff: 1m }\nscript: \"echo try >> tries.txt; exit 3\"", ""); err != nil {
				return "", err
			}
			if r, err := l.runOne(ctx, id); err != nil || r.Stage != job.Inbox {
				return "", failf("attempt 1 ended %s (%v), want the inbox", outcomeText(r), err)
			}
			advance(time.Minute + time.Second)
			r, err := l.runOne(ctx, id)
			if err != nil {
				return "", err
			}
			st, err := l.state(id)
			if err != nil {
				return "", err
			}
			if r.Stage != job.DeadLetter || st.Stage != job.DeadLetter || st.Attempts != 2 || st.Reason != job.ReasonEngineFailed {
				return "", failf("attempt 2 ended %s; sidecar %s, %d attempts: want dead_letter after 2", outcomeText(r), st.Stage, st.Attempts)
			}
			if st.Checkpoint == "" || !s.ws.treeHas(ctx, repo, st.Checkpoint, "tries.txt") {
				return "", failf("the dead letter's work is not checkpointed")
			}
			return "2 attempts, both engine_failed: dead_letter, tries.txt kept in its checkpoint", nil
		})
	}}
}

// --- budgets --------------------------------------------------------------------------

func budgetScenario() *scenario {
	g := GroupPipeline
	return &scenario{name: "budget", group: g, workspace: true, checks: []Check{
		check(g, "pipeline.budget.wall", "the wall budget stops a hung engine (timeout) through the kill ladder; its grandchild ignoring SIGINT dies too; work checkpointed"),
		check(g, "pipeline.budget.tokens", "a token budget stops an engine whose ::aq-usage goes over it (budget_exceeded), work checkpointed"),
		check(g, "pipeline.budget.usd", "a USD budget stops an engine whose reported cost goes over it (budget_exceeded)"),
	}, run: func(ctx context.Context, s *session) {
		l := s.newLocal(ctx, "budget", localOpt{}, "app")
		if l == nil {
			return
		}
		repo := l.repoDir("app")
		s.step(ctx, "pipeline.budget.wall", 30*time.Second, func(ctx context.Context) (string, error) {
			id := l.id("wall")
			pidFile := l.markFile("wall-grandchild.pid")
			script := "echo partial > wip.txt\n(trap '' INT TERM; exec sleep 60) &\necho $! > " + shq(pidFile) + "\nwait"
			if _, err := l.submit(id, "repo: app\nengine: script\nbudget: { wall: 1s }\n"+yamlBlock("script", script), ""); err != nil {
				return "", err
			}
			start := time.Now()
			r, err := l.runOne(ctx, id)
			took := time.Since(start)
			if err != nil {
				return "", err
			}
			if r.Outcome.Reason != job.ReasonTimeout {
				return "", failf("ended %s, want timeout", outcomeText(r))
			}
			pid, _ := strconv.Atoi(strings.TrimSpace(readFile(pidFile)))
			if pid <= 0 || process.Alive(pid) {
				return "", failf("the engine's grandchild (pid %d), which ignores SIGINT and SIGTERM, outlived the job", pid)
			}
			if left, _ := process.FindScoped(id, l.scope); len(left) > 0 {
				return "", failf("processes %v of the job are still alive", left)
			}
			if r.Outcome.Checkpoint == "" || !s.ws.treeHas(ctx, repo, r.Outcome.Checkpoint, "wip.txt") {
				return "", failf("the stopped engine's work was not checkpointed")
			}
			return fmt.Sprintf("timeout after the 1s wall budget (job took %s): engine and its SIGINT-ignoring grandchild gone, wip.txt checkpointed", ms(took)), nil
		})
		loop := func(usage string) string {
			return "n=0\nwhile [ $n -lt 400 ]; do\n  n=$((n + 1))\n  echo \"step $n\" >> scratch.txt\n  echo \"" + usage + "\"\n  sleep 0.05\ndone"
		}
		s.step(ctx, "pipeline.budget.tokens", 30*time.Second, func(ctx context.Context) (string, error) {
			id := l.id("tokens")
			script := loop("::aq-usage tokens_in=$((n * 1500)) tokens_out=100 turns=$n")
			if _, err := l.submit(id, "repo: app\nengine: script\nbudget: { tokens: 5000, wall: 1m }\n"+yamlBlock("script", script), ""); err != nil {
				return "", err
			}
			r, err := l.runOne(ctx, id)
			if err != nil {
				return "", err
			}
			in := r.Outcome.Insights
			if r.Outcome.Reason != job.ReasonBudgetExceeded || in.TokensIn+in.TokensOut <= 5000 || in.TokensIn > 60000 {
				return "", failf("ended %s with %d tokens, want budget_exceeded just over 5000", outcomeText(r), in.TokensIn+in.TokensOut)
			}
			if r.Outcome.Checkpoint == "" || !s.ws.treeHas(ctx, repo, r.Outcome.Checkpoint, "scratch.txt") {
				return "", failf("the partial work was not checkpointed")
			}
			return fmt.Sprintf("budget_exceeded at %d tokens (budget 5000): %s; scratch.txt checkpointed", in.TokensIn+in.TokensOut, r.Outcome.Detail), nil
		})
		s.step(ctx, "pipeline.budget.usd", 30*time.Second, func(ctx context.Context) (string, error) {
			id := l.id("usd")
			script := loop("::aq-usage tokens_in=$((n * 10)) tokens_out=1 cost_usd=$((n / 100)).$(printf %02d $((n % 100))) turns=$n")
			if _, err := l.submit(id, "repo: app\nengine: script\nbudget: { usd: 0.05, wall: 1m }\n"+yamlBlock("script", script), ""); err != nil {
				return "", err
			}
			r, err := l.runOne(ctx, id)
			if err != nil {
				return "", err
			}
			if r.Outcome.Reason != job.ReasonBudgetExceeded || r.Outcome.Insights.CostUSD <= 0.05 || r.Outcome.Insights.CostUSD > 1 {
				return "", failf("ended %s at $%.2f, want budget_exceeded just over $0.05", outcomeText(r), r.Outcome.Insights.CostUSD)
			}
			return fmt.Sprintf("budget_exceeded at $%.2f (budget $0.05): %s", r.Outcome.Insights.CostUSD, r.Outcome.Detail), nil
		})
	}}
}

// --- secrets ----------------------------------------------------------------------------

func secretsScenario() *scenario {
	g := GroupPipeline
	return &scenario{name: "secrets", group: g, workspace: true, checks: []Check{
		check(g, "pipeline.secrets.engine-env", "aq's secrets (AQ_FLEET_TOKEN, AQ_SB_CONNECTION_STRING) and settings (AQ_HOME) are not in the engine's environment; the job tag and a variable AQ_ENGINE_ENV names are"),
		check(g, "pipeline.secrets.masked", "a secret-named variable's value the engine prints is masked (***) in the job logs"),
		check(g, "pipeline.secrets.verify-env", "the verify: command does not get aq's secrets either"),
	}, run: func(ctx context.Context, s *session) {
		fleetTok, sbKey, apiTok := "aqf_"+fixture.RandomHex(12), fixture.RandomHex(16), "sk-selftest-"+fixture.RandomHex(12)
		extra := []string{
			"AQ_FLEET_TOKEN=" + fleetTok,
			"AQ_SB_CONNECTION_STRING=Endpoint=sb://127.0.0.1;SharedAccessKeyName=selftest;SharedAccessKey=" + sbKey,
			"SELFTEST_API_TOKEN=" + apiTok,
		}
		l := s.newLocal(ctx, "secrets", localOpt{env: append(extra, "AQ_HOME=/nonexistent/aq-home"), pass: []string{"SELFTEST_API_TOKEN"}}, "app")
		if l == nil {
			return
		}
		id := l.id("secrets")
		engineEnv, verifyEnv := l.markFile("engine-env.txt"), l.markFile("verify-env.txt")
		script := "env > " + shq(engineEnv) + "\necho \"the engine sees SELFTEST_API_TOKEN=$SELFTEST_API_TOKEN\"\necho \"on stderr: $SELFTEST_API_TOKEN\" >&2\necho done > out.txt"
		var ran bool
		run := func(ctx context.Context) error {
			if ran {
				return nil
			}
			ran = true
			if _, err := l.submit(id, "repo: app\nengine: script\n"+yamlBlock("script", script)+"\nverify: env > "+shq(verifyEnv)+"", ""); err != nil {
				return err
			}
			r, err := l.runOne(ctx, id)
			if err != nil {
				return err
			}
			if r.Outcome.Failed() {
				return failf("the job ended %s", outcomeText(r))
			}
			return nil
		}
		noAQSecrets := func(file string) error {
			env := readFile(file)
			if env == "" {
				return failf("%s was not written", filepath.Base(file))
			}
			for _, bad := range []string{"AQ_FLEET_TOKEN=", "AQ_SB_CONNECTION_STRING=", "AQ_HOME=", fleetTok, sbKey} {
				if strings.Contains(env, bad) {
					return failf("aq's secret %s reached the environment", strings.TrimSuffix(strings.SplitN(bad, "=", 2)[0], "="))
				}
			}
			if !strings.Contains(env, process.TagEnv+"="+id+"\n") {
				return failf("the job tag %s=%s is missing from the environment", process.TagEnv, id)
			}
			return nil
		}
		if !s.step(ctx, "pipeline.secrets.engine-env", 30*time.Second, func(ctx context.Context) (string, error) {
			if err := run(ctx); err != nil {
				return "", err
			}
			if err := noAQSecrets(engineEnv); err != nil {
				return "", err
			}
			if !strings.Contains(readFile(engineEnv), "SELFTEST_API_TOKEN=") {
				return "", failf("a variable AQ_ENGINE_ENV names (SELFTEST_API_TOKEN) was dropped")
			}
			return "the engine's environment has AQ_JOB_ID and what AQ_ENGINE_ENV names, but not AQ_FLEET_TOKEN, AQ_SB_CONNECTION_STRING or AQ_HOME", nil
		}) {
			return
		}
		s.step(ctx, "pipeline.secrets.masked", 10*time.Second, func(ctx context.Context) (string, error) {
			dir := filepath.Join(l.cfg.LogsDir(), id)
			out, errl := readFile(filepath.Join(dir, "stdout.log")), readFile(filepath.Join(dir, "stderr.log"))
			if strings.Contains(out+errl, apiTok) {
				return "", failf("the value of SELFTEST_API_TOKEN is in the job logs in clear")
			}
			if !strings.Contains(out, "SELFTEST_API_TOKEN=***") || !strings.Contains(errl, "on stderr: ***") {
				return "", failf("the job logs do not show the masked value (stdout.log %d bytes, stderr.log %d bytes)", len(out), len(errl))
			}
			return "stdout.log and stderr.log show SELFTEST_API_TOKEN=***, never its value", nil
		})
		s.step(ctx, "pipeline.secrets.verify-env", 10*time.Second, func(ctx context.Context) (string, error) {
			if err := noAQSecrets(verifyEnv); err != nil {
				return "", err
			}
			return "verify: ran with the job tag and without aq's secrets", nil
		})
	}}
}

// --- kill -9 and recovery --------------------------------------------------------------

func recoverScenario() *scenario {
	g := GroupPipeline
	return &scenario{name: "recover", group: g, workspace: true, checks: []Check{
		check(g, "pipeline.recover.kill9", "a child `aq run --once` killed -9 mid-job leaves its job in building/"),
		check(g, "pipeline.recover.engine-stopped", "the dead aq's engine is stopped by its supervisor (nothing carries the job's tag), and recovery takes the job back"),
		check(g, "pipeline.recover.checkpoint", "recovery checkpoints the orphan's worktree first, then requeues the job (reason crash)"),
		check(g, "pipeline.recover.resume", "the re-run resumes from that checkpoint and ships"),
	}, run: func(ctx context.Context, s *session) {
		w := s.ws
		exe := s.h.exe
		var l *localSetup
		var repo, id string
		if !s.step(ctx, "pipeline.recover.kill9", 45*time.Second, func(ctx context.Context) (string, error) {
			if exe == "" {
				return "", skipf("no aq binary to run as a child process (this is a Go test binary; pass Options.Exe)")
			}
			var err error
			if l, err = w.newLocal("recover", localOpt{}); err != nil {
				return "", err
			}
			if repo, _, err = l.repo(ctx, "app", nil, false); err != nil {
				return "", err
			}
			id = l.id("orphan")
			started := l.markFile("orphan.started")
			script := strings.Join([]string{
				"if [ -f first.txt ]; then echo resumed > second.txt; exit 0; fi",
				"echo before > first.txt",
				"i=0; while [ $i -lt 1200 ]; do i=$((i+1)); echo $i > p.tmp && mv p.tmp progress; [ $i = 1 ] && touch " + shq(started) + "; sleep 0.05; done",
			}, "\n")
			if _, err := l.submit(id, "repo: app\nengine: script\n"+yamlBlock("script", script), ""); err != nil {
				return "", err
			}
			childTag := w.id("aq-child", l.scope)
			cmd := exec.Command(exe, "run", "--once")
			cmd.Env = append(append([]string(nil), w.engineEnv...),
				"AQ_HOME="+l.home, "AQ_REPO_BASE="+l.base, "AQ_FLEET=0", "AQ_KILL_GRACE="+killGrace.String(),
				"AQ_LOG_LEVEL=warn", "XDG_CONFIG_HOME="+filepath.Join(w.root, "xdg"), "GORACE=atexit_sleep_ms=0",
				// Unsandboxed: the engine marks its start outside its
				// worktree, and these checks are of the supervisor's
				// recovery (a sandboxed engine ends with its aq by
				// construction: internal/sandbox's tests).
				"AQ_SANDBOX=off",
				process.TagEnv+"="+childTag, process.ScopeEnv+"="+l.scope)
			cmd.Dir = l.dir
			logf, err := os.Create(filepath.Join(l.dir, "aq-child.log"))
			if err != nil {
				return "", err
			}
			defer logf.Close()
			cmd.Stdout, cmd.Stderr = logf, logf
			process.SetGroup(cmd)
			if err := cmd.Start(); err != nil {
				return "", failf("cannot start %s run --once: %v", exe, err)
			}
			pid := cmd.Process.Pid
			exited := make(chan error, 1)
			go func() { exited <- cmd.Wait() }()
			err = fixture.WaitFor(ctx, "the child aq's engine to start", func() bool {
				select {
				case e := <-exited:
					exited <- e
					return true
				default:
				}
				return fixture.Exists(started)
			})
			if err != nil || !fixture.Exists(started) {
				_ = process.KillGroup(pid)
				return "", failf("the child aq's engine did not start (%v; the child aq then %v): %s", err, <-exited, lastLines(readFile(filepath.Join(l.dir, "aq-child.log")), 2))
			}
			_ = cmd.Process.Kill() // aq only: its engine is in a group of its own, watched by its supervisor
			if werr := <-exited; werr == nil {
				return "", failf("the child aq exited 0 before it was killed: the test never interrupted its job")
			}
			st, err := l.state(id)
			if err != nil {
				return "", err
			}
			if st.Stage != job.Building || st.PID != pid {
				return "", failf("after kill -9 the job is in %s (pid %d), want building by pid %d", st.Stage, st.PID, pid)
			}
			return fmt.Sprintf("%s run --once (pid %d) killed -9 while its engine ran: %s left in building/", filepath.Base(exe), pid, id), nil
		}) {
			return
		}
		var recovered []string
		if !s.step(ctx, "pipeline.recover.engine-stopped", 30*time.Second, func(ctx context.Context) (string, error) {
			if _, err := process.FindScoped(id, l.scope); err != nil {
				return "", skipf("processes cannot be found by tag here: %v", err)
			}
			// No engine runs on without its aq: its supervisor takes it
			// through the kill ladder (two graces) and sweeps its tag.
			wctx, cancel := context.WithTimeout(ctx, 10*killGrace+10*time.Second)
			err := fixture.WaitFor(wctx, "the dead aq's engine to be stopped by its supervisor", func() bool {
				now, _ := process.FindScoped(id, l.scope)
				return len(now) == 0
			})
			cancel()
			if err != nil {
				now, _ := process.FindScoped(id, l.scope)
				return "", failf("the dead aq's engine runs on unsupervised: %v carry the job's tag", now)
			}
			recovered, err = l.a.Recover(ctx)
			if err != nil {
				return "", err
			}
			if !slices.Contains(recovered, id) {
				return "", failf("Recover returned %v, want %s", recovered, id)
			}
			return "the engine was stopped with its aq (nothing carries the job's tag); recovery took the job back", nil
		}) {
			return
		}
		s.step(ctx, "pipeline.recover.checkpoint", 10*time.Second, func(ctx context.Context) (string, error) {
			st, err := l.state(id)
			if err != nil {
				return "", err
			}
			if st.Stage != job.Inbox || st.Reason != job.ReasonCrash || st.Attempts != 1 || st.Checkpoint == "" {
				return "", failf("after recovery: stage %s, reason %s, %d attempts, checkpoint %q", st.Stage, st.Reason, st.Attempts, st.Checkpoint)
			}
			for _, f := range []string{"first.txt", "progress"} {
				if !w.treeHas(ctx, repo, st.Checkpoint, f) {
					return "", failf("the recovery checkpoint lacks %s", f)
				}
			}
			return fmt.Sprintf("worktree checkpointed to %.10s (first.txt, progress), job back in the inbox: crash, attempt 1 counted", st.Checkpoint), nil
		})
		s.step(ctx, "pipeline.recover.resume", 30*time.Second, func(ctx context.Context) (string, error) {
			r, err := l.runOne(ctx, id)
			if err != nil {
				return "", err
			}
			if r.Outcome.Failed() || r.Stage != job.Shipped || r.Attempt != 2 {
				return "", failf("the re-run (attempt %d) ended %s", r.Attempt, outcomeText(r))
			}
			br := job.JobBranch(id)
			if !w.treeHas(ctx, repo, br, "first.txt") || !w.treeHas(ctx, repo, br, "second.txt") {
				return "", failf("%s lacks first.txt or second.txt", br)
			}
			return "attempt 2 started from the recovery checkpoint (first.txt there), wrote second.txt and shipped", nil
		})
	}}
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, " | ")
}
