//go:build linux

package chaos

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
)

// sandbox is a run's directory tree:
//
//	origins/rN.git          bare origins (post-receive hook → pushlog.jsonl)
//	fN/home, fN/src/rN      each factory's AQ_HOME and clones
//	shared/engine.sh        the scripted engine, and its step log per job
//	shared/runs/<job>/      and run: a directory every engine may write in
//	                        its sandbox (the factories' AQ_SANDBOX_WRITABLE)
//	coord/                  the stub's state file and call log
//	peer/                   the broker peer's state and event log
//	logs/                   every process's output
type sandbox struct {
	dir     string
	gitEnv  []string
	origins map[string]string // repo → bare origin
}

func (s *sandbox) path(p ...string) string { return filepath.Join(append([]string{s.dir}, p...)...) }

func (s *sandbox) pushLog() string { return s.path("pushlog.jsonl") }
func (s *sandbox) shared() string  { return s.path("shared") }
func (s *sandbox) engine() string  { return s.path("shared", "engine.sh") }
func (s *sandbox) runsDir() string { return s.path("shared", "runs") }

// stragglerMark is on the command line of every straggler of this run
// (the harness finds the ones left by it).
func (s *sandbox) stragglerMark() string { return "chaos-straggler:" + s.runsDir() }

// git runs git in dir with the sandbox's isolated configuration.
func (s *sandbox) git(dir string, args ...string) (string, error) {
	cmd := exec.Command("git", args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), s.gitEnv...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		return out.String(), fmt.Errorf("git %s (in %s): %v: %s", strings.Join(args, " "), dir, err, strings.TrimSpace(errb.String()))
	}
	return strings.TrimRight(out.String(), "\n"), nil
}

// newSandbox lays out dir: an isolated git configuration, the origins with
// their push hook, the engine script.
func newSandbox(dir string, repos int) (*sandbox, error) {
	s := &sandbox{dir: dir, origins: map[string]string{}}
	for _, d := range []string{"origins", "shared/runs", "coord", "peer", "logs", "seed"} {
		if err := os.MkdirAll(s.path(d), 0o755); err != nil {
			return nil, err
		}
	}
	gitcfg := s.path("gitconfig")
	if err := os.WriteFile(gitcfg, nil, 0o644); err != nil {
		return nil, err
	}
	s.gitEnv = []string{"GIT_CONFIG_GLOBAL=" + gitcfg, "GIT_CONFIG_NOSYSTEM=1",
		"GIT_AUTHOR_NAME=chaos", "GIT_AUTHOR_EMAIL=chaos@localhost", "GIT_COMMITTER_NAME=chaos", "GIT_COMMITTER_EMAIL=chaos@localhost"}
	if err := os.WriteFile(s.engine(), []byte(engineScript), 0o755); err != nil {
		return nil, err
	}
	hook := strings.ReplaceAll(pushHook, "@LOG@", s.pushLog())
	for k := 1; k <= repos; k++ {
		name := "r" + strconv.Itoa(k)
		bare := s.path("origins", name+".git")
		if _, err := s.git(s.dir, "init", "-q", "--bare", "-b", "main", bare); err != nil {
			return nil, err
		}
		if err := os.WriteFile(filepath.Join(bare, "hooks", "post-receive"), []byte(hook), 0o755); err != nil {
			return nil, err
		}
		seed := s.path("seed", name)
		if _, err := s.git(s.dir, "init", "-q", "-b", "main", seed); err != nil {
			return nil, err
		}
		files := map[string]string{
			"README.md":          "# " + name + "\n\nA repository of the chaos run.\n",
			"src/lib.txt":        strings.Repeat("line of "+name+"\n", 40),
			".gitignore":         "build/\n",
			"chaos/.gitkeep":     "",
			"docs/notes/keep.md": "kept\n",
		}
		for p, c := range files {
			fp := filepath.Join(seed, p)
			if err := os.MkdirAll(filepath.Dir(fp), 0o755); err != nil {
				return nil, err
			}
			if err := os.WriteFile(fp, []byte(c), 0o644); err != nil {
				return nil, err
			}
		}
		for _, a := range [][]string{{"add", "-A"}, {"commit", "-q", "-m", "initial"}, {"push", "-q", bare, "main"}} {
			if _, err := s.git(seed, a...); err != nil {
				return nil, err
			}
		}
		s.origins[name] = bare
	}
	return s, nil
}

// cloneAll clones every origin into base.
func (s *sandbox) cloneAll(base string) error {
	if err := os.MkdirAll(base, 0o755); err != nil {
		return err
	}
	for name, bare := range s.origins {
		if _, err := s.git(base, "clone", "-q", bare, filepath.Join(base, name)); err != nil {
			return err
		}
	}
	return nil
}

// pushHook logs every ref update an origin takes, with who pushed it (the
// factory's CHAOS_FACTORY, inherited by git push and receive-pack over a
// local path) and why (CHAOS_PHASE: run, or gc).
const pushHook = `#!/bin/sh
repo=$(basename "$PWD" .git)
while read old new ref; do
  printf '{"t":%s,"factory":"%s","phase":"%s","repo":"%s","old":"%s","new":"%s","ref":"%s"}\n' \
    "$(date +%s.%N)" "${CHAOS_FACTORY:-}" "${CHAOS_PHASE:-run}" "$repo" "$old" "$new" "$ref" >> '@LOG@'
done
`

// engineScript is the scripted engine: engine.sh PLAN K T1 T2 [straggle].
// Each run of a job takes the next run number from a counter on the shared
// file system (runs/<job>/<n>, made atomically with mkdir), writes
// chaos/<job>.log (one line per run: resumed work accumulates), sleeps T1,
// writes part 1, then per plan fails (exit 1), hangs past any budget, or
// goes on; sleeps T2, writes part 2 and exits 0. A job with verify: needs
// chaos/<job>.fixed, which the engine writes only when its prompt carries
// verify's failure ("FAIL: chaos/<job>.fixed is missing"): from a repair
// round (or a retry told the previous attempt's verify output) — so those
// jobs run repair rounds under the faults. With straggle, the run first
// daemonises a straggler — its environment emptied (the job's tag gone),
// a session of its own (out of the engine's process group) — that
// refreshes runs/<job>/<n>/straggler every 200 ms for as long as it lives,
// and carries the run's directory on its command line (the harness finds
// it there).
const engineScript = `#!/bin/sh
plan=$1 k=$2 t1=$3 t2=$4
id=$AQ_JOB_ID
d="$CHAOS_RUNS/$id"
mkdir -p "$d"
n=1
while ! mkdir "$d/$n" 2>/dev/null; do n=$((n+1)); done
echo "${CHAOS_FACTORY:-?} $$" > "$d/$n/who"
date +%s.%N > "$d/$n/start"
# alive: refreshed while this engine lives (the loop ends with it).
( while kill -0 $$ 2>/dev/null; do date +%s.%N > "$d/$n/alive.t" && mv "$d/$n/alive.t" "$d/$n/alive"; sleep 0.2; done ) &
if [ "$5" = straggle ]; then
  env -i CHAOS_D="$d/$n" PATH="$PATH" setsid /bin/sh -c 'while :; do date +%s.%N > "$CHAOS_D/straggler.t" && mv "$CHAOS_D/straggler.t" "$CHAOS_D/straggler"; sleep 0.2; done' "chaos-straggler:$d/$n" </dev/null >/dev/null 2>&1 &
  while [ ! -e "$d/$n/straggler" ]; do sleep 0.01; done
fi
prompt=$(cat)
mkdir -p chaos
if printf '%s\n' "$prompt" | grep -q "FAIL: chaos/$id.fixed is missing"; then echo "fixed in run $n" > "chaos/$id.fixed"; fi
[ -f "chaos/$id.part1" ] && cp "chaos/$id.part1" "$d/$n/found1"
echo "$id run $n on ${CHAOS_FACTORY:-?}" >> "chaos/$id.log"
echo "::aq-usage tokens_in=$((n*1000)) tokens_out=$((n*100)) cost_usd=0.01 turns=$n"
sleep "$t1"
echo "part one, run $n" > "chaos/$id.part1"
date +%s.%N > "$d/$n/part1"
case "$plan" in
  fail) if [ "$n" -le "$k" ]; then echo "run $n fails (plan: fail $k)" >&2; exit 1; fi ;;
  always) echo "run $n fails (plan: always)" >&2; exit 1 ;;
  hang) if [ "$n" -le "$k" ]; then echo "run $n hangs (plan: hang $k)" >&2; sleep 3600; fi ;;
esac
sleep "$t2"
echo "part two, run $n" > "chaos/$id.part2"
date +%s.%N > "$d/$n/done"
exit 0
`

// manifest is job j's manifest file (bodyMd) and, for PlanInvalid, the
// valid version the stub gets as the normalised manifest.
func (s *sandbox) manifest(j JobSpec, wall string) (body, valid string) {
	var b strings.Builder
	fmt.Fprintf(&b, "---\nid: %s\ntitle: chaos job %s\nrepo: %s\nbase: main\nengine: script\n", j.ID, j.ID, j.Repo)
	straggle := ""
	if j.Straggler {
		straggle = " straggle"
	}
	fmt.Fprintf(&b, "script: /bin/sh %s %s %d %.2f %.2f%s\n", s.engine(), j.Plan, j.K, j.T1, j.T2, straggle)
	fmt.Fprintf(&b, "ship: branch\npriority: %s\nbudget: { wall: %s }\nretry: { max: 2, backoff: 1s }\n", j.Priority, wall)
	if j.Verify {
		fmt.Fprintf(&b, "verify: |\n  test -s chaos/%[1]s.log && { test -f chaos/%[1]s.fixed || { echo \"FAIL: chaos/%[1]s.fixed is missing\"; exit 1; }; }\n", j.ID)
	}
	head := b.String()
	tailMd := fmt.Sprintf("---\n# Chaos job %s\n\nWrite chaos/%s.log and its two parts.\n\n## Acceptance\n- chaos/%s.log names this run\n", j.ID, j.ID, j.ID)
	valid = head + tailMd
	if j.Plan == PlanInvalid {
		return head + "colour: blue\n" + tailMd, valid
	}
	return valid, valid
}
