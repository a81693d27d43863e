package selftest

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/aqfleet/aq/agent/manifest"
	"github.com/aqfleet/aq/agent/queue"
	"github.com/aqfleet/aq/internal/brief"
	"github.com/aqfleet/aq/internal/fixture"
	"github.com/aqfleet/aq/internal/process"
	"github.com/aqfleet/aq/job"
)

// pipelineScenarios is every pipeline scenario, in catalog order.
func pipelineScenarios() []*scenario {
	return []*scenario{
		manifestScenario(),
		queueScenario(),
		ladderScenario(),
		localRunScenario(),
		locksScenario(),
		failuresScenario(),
		retryScenario(),
		budgetScenario(),
		secretsScenario(),
		recoverScenario(),
		sandboxScenario(),
		fleetBasicScenario(),
		fleetFenceScenario(),
		fleetFailScenario(),
		fleetSpoolScenario(),
		fleetGateScenario(),
		fleetResumeScenario(),
		brokerScenario(),
		cleanupScenario(),
	}
}

// --- manifests ---------------------------------------------------------------

func manifestScenario() *scenario {
	g := GroupPipeline
	return &scenario{name: "manifest", group: g, workspace: true, checks: []Check{
		check(g, "pipeline.manifest.parse", "a full manifest parses: profile merged under it, defaults, budget, retry, deps, acceptance"),
		check(g, "pipeline.manifest.unknown-key", "an unknown key is refused with FILE:LINE and a suggestion"),
		check(g, "pipeline.manifest.bad-id", "an id that could escape a directory (../x) is refused"),
		check(g, "pipeline.manifest.crlf-bom", "CRLF line ends and a UTF-8 BOM are accepted"),
		check(g, "pipeline.profiles.merge", "every embedded profile merges under a manifest (the manifest wins)"),
	}, run: func(ctx context.Context, s *session) {
		cat := s.ws.cat
		s.step(ctx, "pipeline.manifest.parse", 5*time.Second, func(ctx context.Context) (string, error) {
			text := "---\nid: st-parse\ntitle: Parse me\nrepo: app\nprofile: backend-dev\nengine: script\nscript: make fix\n" +
				"capabilities: [os:linux, \"node:>=18\"]\npriority: high\nbudget: { wall: 45m, usd: 5 }\n" +
				"deps: [st-other]\nidempotencyKey: tracker-1\nretry: { max: 2, backoff: 60s }\nverify: make test\nship: none\n---\n" +
				"# Fix it\n\nDo the thing.\n\n## Acceptance\n- the tests pass\n"
			j, err := manifest.Parse("st-parse.md", []byte(text), cat)
			if err != nil {
				return "", err
			}
			var bad []string
			want := func(ok bool, what string) {
				if !ok {
					bad = append(bad, what)
				}
			}
			want(j.ID == "st-parse" && j.Repo == "app" && j.Base == job.DefaultBase, "id/repo/base")
			want(j.Engine == "script" && j.Script == "make fix", "engine: script (the manifest over the profile's any)")
			want(j.Priority == job.PriorityHigh, "priority high")
			want(j.Budget.Wall.D() == 45*time.Minute && j.Budget.USD == 5, "budget from the manifest")
			want(j.Budget.Tokens == 4000000, "budget.tokens from the profile")
			want(j.Retry.Max == 2 && j.Retry.Backoff.D() == time.Minute, "retry")
			want(slices.Equal(j.Deps, []string{"st-other"}) && j.DepsMode == "all", "deps")
			want(slices.Contains(j.Capabilities, "has:git") && slices.Contains(j.Capabilities, "os:linux"), "capabilities merged with the profile's")
			want(strings.Contains(j.Acceptance, "the tests pass") && strings.Contains(j.Persona, "backend"), "acceptance and persona")
			want(j.Ship == "none" && j.Verify == "make test" && j.IdempotencyKey == "tracker-1", "ship, verify, idempotencyKey")
			if len(bad) > 0 {
				return "", failf("parsed, but wrong: %s", strings.Join(bad, "; "))
			}
			return "profile backend-dev merged under the manifest; defaults, budgets, retry, deps and acceptance as written", nil
		})
		s.step(ctx, "pipeline.manifest.unknown-key", 5*time.Second, func(ctx context.Context) (string, error) {
			text := "---\nid: st-typo\nrepo: app\ntitel: Oops\n---\nBody.\n"
			_, err := manifest.Parse("st-typo.md", []byte(text), cat)
			if err == nil {
				return "", failf("a manifest with the unknown key titel was accepted")
			}
			msg := err.Error()
			if !strings.Contains(msg, "st-typo.md:4:") || !strings.Contains(msg, `"titel"`) || !strings.Contains(msg, `"title"`) {
				return "", failf("refused, but the error does not name FILE:LINE and the fix: %s", msg)
			}
			return "refused: " + brief.FirstLine(msg, 0), nil
		})
		s.step(ctx, "pipeline.manifest.bad-id", 5*time.Second, func(ctx context.Context) (string, error) {
			for _, id := range []string{"../escape", "a/../b", ".hidden"} {
				text := "---\nid: " + id + "\nrepo: app\n---\nBody.\n"
				if _, err := manifest.Parse("bad.md", []byte(text), cat); err == nil {
					return "", failf("the id %q was accepted", id)
				}
			}
			return `ids "../escape", "a/../b" and ".hidden" are refused`, nil
		})
		s.step(ctx, "pipeline.manifest.crlf-bom", 5*time.Second, func(ctx context.Context) (string, error) {
			text := "\ufeff---\r\nid: st-crlf\r\nrepo: app\r\nengine: script\r\nscript: true\r\n---\r\n# CRLF\r\n\r\nBody.\r\n"
			j, err := manifest.Parse("st-crlf.md", []byte(text), cat)
			if err != nil {
				return "", failf("a manifest with a BOM and CRLF line ends was refused: %v", err)
			}
			if j.ID != "st-crlf" || j.Script != "true" || strings.Contains(j.Body, "\r") {
				return "", failf("parsed wrong: id %q script %q", j.ID, j.Script)
			}
			return "BOM and CRLF accepted; the body is normalised to LF", nil
		})
		s.step(ctx, "pipeline.profiles.merge", 5*time.Second, func(ctx context.Context) (string, error) {
			names := cat.Names()
			for _, n := range names {
				text := "---\nid: st-prof\nrepo: app\nprofile: " + n + "\nengine: script\nscript: true\nbudget: { wall: 5m }\n---\n# Profile " + n + "\n"
				j, err := manifest.Parse("st-prof.md", []byte(text), cat)
				if err != nil {
					return "", failf("profile %s: %v", n, err)
				}
				p, _ := cat.Get(n)
				if j.Engine != "script" || j.Budget.Wall.D() != 5*time.Minute || j.Profile != n {
					return "", failf("profile %s: the manifest's engine and wall did not win (%s, %s)", n, j.Engine, j.Budget.Wall)
				}
				if strings.TrimSpace(p.Persona) != "" && strings.TrimSpace(j.Persona) == "" {
					return "", failf("profile %s: its persona was not merged", n)
				}
			}
			return fmt.Sprintf("%d profiles merge: %s", len(names), strings.Join(names, ", ")), nil
		})
	}}
}

// --- the folder queue ----------------------------------------------------------

func queueScenario() *scenario {
	g := GroupPipeline
	return &scenario{name: "queue", group: g, workspace: true, checks: []Check{
		check(g, "pipeline.queue.submit", "submit writes the manifest and its sidecar into inbox/; a second job with the same id is refused"),
		check(g, "pipeline.queue.idempotency", "a job whose idempotencyKey a queued job has is refused"),
		check(g, "pipeline.queue.priority", "jobs are taken critical > high > normal > low, then oldest first"),
		check(g, "pipeline.queue.deps", "a job waits in blocked/ until its dependency ships, then runs"),
		check(g, "pipeline.queue.exclusive", "concurrent takers (separate queue handles) never take the same job"),
	}, run: func(ctx context.Context, s *session) {
		w := s.ws
		var mu sync.Mutex
		now := time.Now().UTC()
		clock := func() time.Time {
			mu.Lock()
			defer mu.Unlock()
			now = now.Add(time.Second) // every read is later: "oldest" is well defined
			return now
		}
		open := func(name string) (*queue.Queue, string, error) {
			dir, err := w.dir("queue-" + name)
			if err != nil {
				return nil, "", err
			}
			q, err := queue.Open(filepath.Join(dir, "queue"), queue.WithClock(clock))
			return q, dir, err
		}
		submit := func(q *queue.Queue, dir, id, front string) (queue.State, error) {
			text := manifestText(id, "repo: app\nengine: script\nscript: true\n"+front, "")
			j, err := manifest.Parse(id+".md", []byte(text), w.cat)
			if err != nil {
				return queue.State{}, err
			}
			return q.Submit(j, []byte(text))
		}
		s.step(ctx, "pipeline.queue.submit", 10*time.Second, func(ctx context.Context) (string, error) {
			q, dir, err := open("submit")
			if err != nil {
				return "", err
			}
			st, err := submit(q, dir, "st-sub", "")
			if err != nil {
				return "", err
			}
			md, side := filepath.Join(q.Dir(), "inbox", "st-sub.md"), filepath.Join(q.Dir(), "inbox", "st-sub.json")
			if st.Stage != job.Inbox || !fixture.Exists(md) || !fixture.Exists(side) {
				return "", failf("after submit: stage %s, manifest there %v, sidecar there %v", st.Stage, fixture.Exists(md), fixture.Exists(side))
			}
			_, err = submit(q, dir, "st-sub", "")
			var ee *queue.ExistsError
			if !errors.As(err, &ee) {
				return "", failf("a second job st-sub was not refused as existing: %v", err)
			}
			return "inbox/st-sub.md and inbox/st-sub.json written; a second st-sub refused: " + err.Error(), nil
		})
		s.step(ctx, "pipeline.queue.idempotency", 10*time.Second, func(ctx context.Context) (string, error) {
			q, dir, err := open("idem")
			if err != nil {
				return "", err
			}
			if _, err := submit(q, dir, "st-key-1", "idempotencyKey: tracker-42"); err != nil {
				return "", err
			}
			_, err = submit(q, dir, "st-key-2", "idempotencyKey: tracker-42")
			var de *queue.DuplicateError
			if !errors.As(err, &de) || de.ExistingID != "st-key-1" {
				return "", failf("a second job with idempotencyKey tracker-42 was not refused: %v", err)
			}
			return "refused: " + err.Error(), nil
		})
		s.step(ctx, "pipeline.queue.priority", 10*time.Second, func(ctx context.Context) (string, error) {
			q, dir, err := open("prio")
			if err != nil {
				return "", err
			}
			for _, jb := range []struct{ id, prio string }{
				{"st-low", "low"}, {"st-normal-old", "normal"}, {"st-critical", "critical"}, {"st-normal-new", "normal"}, {"st-high", "high"},
			} {
				if _, err := submit(q, dir, jb.id, "priority: "+jb.prio); err != nil {
					return "", err
				}
			}
			var got []string
			for {
				e, err := q.Next(nil)
				if errors.Is(err, queue.ErrNoJob) {
					break
				}
				if err != nil {
					return "", err
				}
				got = append(got, e.State.ID)
			}
			want := []string{"st-critical", "st-high", "st-normal-old", "st-normal-new", "st-low"}
			if !slices.Equal(got, want) {
				return "", failf("taken in the order %v, want %v", got, want)
			}
			return "taken " + strings.Join(got, " > "), nil
		})
		s.step(ctx, "pipeline.queue.deps", 10*time.Second, func(ctx context.Context) (string, error) {
			q, dir, err := open("deps")
			if err != nil {
				return "", err
			}
			st, err := submit(q, dir, "st-after", "deps: [st-first]\npriority: critical")
			if err != nil {
				return "", err
			}
			if st.Stage != job.Blocked {
				return "", failf("a job whose dep has not shipped went to %s, want blocked", st.Stage)
			}
			if _, err := submit(q, dir, "st-first", "priority: low"); err != nil {
				return "", err
			}
			e, err := q.Next(nil)
			if err != nil || e.State.ID != "st-first" {
				return "", failf("took %v (%v) first, want st-first: the blocked job must wait", entryID(e), err)
			}
			if _, err := q.Next(nil); !errors.Is(err, queue.ErrNoJob) {
				return "", failf("the blocked job was runnable before its dep shipped: %v", err)
			}
			if err := q.Finish("st-first", job.Shipped, nil); err != nil {
				return "", err
			}
			e, err = q.Next(nil)
			if err != nil || e.State.ID != "st-after" {
				return "", failf("after st-first shipped, took %v (%v), want st-after", entryID(e), err)
			}
			return "st-after waited in blocked/ and ran once st-first shipped", nil
		})
		s.step(ctx, "pipeline.queue.exclusive", 20*time.Second, func(ctx context.Context) (string, error) {
			q, dir, err := open("race")
			if err != nil {
				return "", err
			}
			const jobs, takers = 24, 8
			for i := range jobs {
				if _, err := submit(q, dir, fmt.Sprintf("st-race-%02d", i), ""); err != nil {
					return "", err
				}
			}
			var (
				mu    sync.Mutex
				taken = map[string]int{}
				errs  []error
				wg    sync.WaitGroup
			)
			for range takers {
				qi, err := queue.Open(q.Dir(), queue.WithClock(clock)) // its own handle, as another aq would have
				if err != nil {
					return "", err
				}
				wg.Go(func() {
					for ctx.Err() == nil {
						e, err := qi.Next(nil)
						if errors.Is(err, queue.ErrNoJob) {
							return
						}
						mu.Lock()
						if err != nil {
							errs = append(errs, err)
							mu.Unlock()
							return
						}
						taken[e.State.ID]++
						mu.Unlock()
					}
				})
			}
			wg.Wait()
			if len(errs) > 0 {
				return "", errs[0]
			}
			for id, n := range taken {
				if n > 1 {
					return "", failf("job %s was taken %d times", id, n)
				}
			}
			if len(taken) != jobs {
				return "", failf("%d of %d jobs taken", len(taken), jobs)
			}
			return fmt.Sprintf("%d takers took %d jobs, each exactly once", takers, jobs), nil
		})
	}}
}

func entryID(e *queue.Entry) string {
	if e == nil {
		return "nothing"
	}
	return e.State.ID
}

// --- the kill ladder --------------------------------------------------------

func ladderScenario() *scenario {
	g := GroupPipeline
	return &scenario{name: "ladder", group: g, workspace: true, checks: []Check{
		check(g, "pipeline.ladder.sigint", "an engine that stops on SIGINT is stopped at the ladder's first step"),
		check(g, "pipeline.ladder.sigterm", "an engine that ignores SIGINT is stopped by SIGTERM after the grace"),
		check(g, "pipeline.ladder.sigkill", "an engine that ignores SIGINT and SIGTERM is killed by SIGKILL"),
		check(g, "pipeline.ladder.grandchild", "a grandchild that ignores SIGINT and SIGTERM dies with its process group"),
		check(g, "pipeline.ladder.escaped", "a tagged process that left the group (setsid) is found by its tag and killed"),
	}, run: func(ctx context.Context, s *session) {
		w := s.ws
		dir, err := w.dir("ladder")
		if err != nil {
			s.stop = &Result{Status: Fail, Reason: err.Error()}
			return
		}
		scope := "aq-selftest-" + w.token
		// stopAt runs script under the process layer, cancels it once it
		// wrote its start mark, and returns what the ladder did.
		stopAt := func(ctx context.Context, name, script string) (process.Result, string, error) {
			tag := w.id("ladder-"+name, scope)
			mark := filepath.Join(dir, name+".started")
			pidFile := filepath.Join(dir, name+".pid")
			script = strings.ReplaceAll(strings.ReplaceAll(script, "$MARK", shq(mark)), "$PIDFILE", shq(pidFile))
			rctx, cancel := context.WithCancelCause(ctx)
			defer cancel(nil)
			go func() {
				if fixture.WaitFor(rctx, "the start mark", func() bool { return fixture.Exists(mark) }) == nil {
					cancel(errors.New("selftest: stop"))
				}
			}()
			res, err := process.Run(rctx, process.Spec{Path: "/bin/sh", Args: []string{"-c", script}, Dir: dir, Env: w.engineEnv,
				Tag: tag, Scope: scope, Grace: ladderGrace})
			if err != nil {
				return res, tag, err
			}
			if left, _ := process.FindScoped(tag, scope); len(left) > 0 {
				return res, tag, failf("processes %v of the stopped engine are still alive", left)
			}
			if !fixture.Exists(mark) {
				return res, tag, failf("the engine never started (exit %d)", res.ExitCode)
			}
			return res, tag, nil
		}
		expect := func(res process.Result, step, sig string) error {
			if !res.Stopped || res.LadderStep != step {
				return failf("the ladder's last step was %q (stopped %v), want %s", res.LadderStep, res.Stopped, step)
			}
			if sig != "" && res.Signal != sig {
				return failf("the engine ended by %q (exit %d), want %s", res.Signal, res.ExitCode, sig)
			}
			return nil
		}
		s.step(ctx, "pipeline.ladder.sigint", 15*time.Second, func(ctx context.Context) (string, error) {
			res, _, err := stopAt(ctx, "sigint", `touch $MARK; exec sleep 30`)
			if err == nil {
				err = expect(res, "SIGINT", "SIGINT")
			}
			if err != nil {
				return "", err
			}
			return fmt.Sprintf("stopped by SIGINT in %s", ms(res.Duration)), nil
		})
		s.step(ctx, "pipeline.ladder.sigterm", 15*time.Second, func(ctx context.Context) (string, error) {
			res, _, err := stopAt(ctx, "sigterm", `trap '' INT; touch $MARK; while :; do sleep 0.05; done`)
			if err == nil {
				err = expect(res, "SIGTERM", "SIGTERM")
			}
			if err != nil {
				return "", err
			}
			return fmt.Sprintf("SIGINT ignored; stopped by SIGTERM after %s (grace %s)", ms(res.Duration), ladderGrace), nil
		})
		s.step(ctx, "pipeline.ladder.sigkill", 15*time.Second, func(ctx context.Context) (string, error) {
			res, _, err := stopAt(ctx, "sigkill", `trap '' INT TERM; touch $MARK; while :; do sleep 0.05; done`)
			if err == nil {
				err = expect(res, "SIGKILL", "SIGKILL")
			}
			if err != nil {
				return "", err
			}
			return fmt.Sprintf("SIGINT and SIGTERM ignored; killed by SIGKILL after %s", ms(res.Duration)), nil
		})
		s.step(ctx, "pipeline.ladder.grandchild", 15*time.Second, func(ctx context.Context) (string, error) {
			ready := shq(filepath.Join(dir, "grandchild.ready"))
			res, _, err := stopAt(ctx, "grandchild", `(trap '' INT TERM; touch `+ready+`; exec sleep 30) &
echo $! > $PIDFILE
i=0; while [ ! -f `+ready+` ] && [ $i -lt 500 ]; do sleep 0.01; i=$((i+1)); done
touch $MARK; wait`)
			if err != nil {
				return "", err
			}
			pid, _ := strconv.Atoi(strings.TrimSpace(readFile(filepath.Join(dir, "grandchild.pid"))))
			if pid <= 0 {
				return "", failf("the engine did not record its grandchild's pid")
			}
			if process.Alive(pid) {
				return "", failf("grandchild %d (ignoring SIGINT and SIGTERM) survived its engine", pid)
			}
			return fmt.Sprintf("the engine stopped at %s; its grandchild %d, which ignored SIGINT and SIGTERM, died with the group", res.LadderStep, pid), nil
		})
		s.step(ctx, "pipeline.ladder.escaped", 15*time.Second, func(ctx context.Context) (string, error) {
			setsid := s.h.lookPath("setsid")
			if setsid == "" {
				return "", skipf("no setsid (util-linux) on PATH to make a process leave its group")
			}
			tag := w.id("ladder-escaped", scope)
			esc := filepath.Join(dir, "escaped.started")
			// The engine exits once its escapee has become sleep, with its
			// environment readable: a process caught in the middle of an
			// exec shows an empty /proc/<pid>/environ (see the report).
			script := fmt.Sprintf(`%s /bin/sh -c 'trap "" INT TERM; touch %s; exec sleep 30' &
p=$!
i=0
while [ $i -lt 500 ]; do
  if [ -f %s ] && [ "$(cat /proc/$p/comm 2>/dev/null)" = sleep ] && grep -qa %s /proc/$p/environ 2>/dev/null; then break; fi
  sleep 0.01; i=$((i+1))
done`, shq(setsid), shq(esc), shq(esc), shq(process.TagEnv+"="+tag))
			res, err := process.Run(ctx, process.Spec{Path: "/bin/sh", Args: []string{"-c", script}, Dir: dir, Env: w.engineEnv, Tag: tag, Scope: scope, Grace: killGrace})
			if err != nil {
				return "", err
			}
			if !fixture.Exists(esc) {
				return "", failf("the escaping process never started")
			}
			if left, _ := process.FindScoped(tag, scope); len(left) > 0 {
				return "", failf("tagged processes %v outlived the engine", left)
			}
			if res.Escaped != 1 {
				return "", failf("%d escaped processes were killed, want 1", res.Escaped)
			}
			return "a setsid'd child that ignored SIGINT and SIGTERM was found by its tag after the engine exited, and killed", nil
		})
	}}
}

// ladderGrace is the wait between ladder steps in the ladder checks: long
// enough that a loaded host still sees the engine end at the step that
// stopped it, rather than at the next one.
const ladderGrace = time.Second
