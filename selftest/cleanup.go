package selftest

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"time"

	"github.com/aqfleet/aq/internal/fixture"
	"github.com/aqfleet/aq/internal/process"
)

// snapshot is what the clean-up checks compare with: the git configuration
// files outside the workspace, and the real $AQ_HOME.
type snapshot struct {
	gitFiles   map[string]string // path → sha256 ("" = absent)
	home       string
	homeExists bool
}

// gitConfigFiles are the git configuration files git would read on this
// host outside any repository.
func gitConfigFiles(env []string) []string {
	var out []string
	if g := envValue(env, "GIT_CONFIG_GLOBAL"); g != "" {
		out = append(out, g)
	} else {
		home := envValue(env, "HOME")
		if home == "" {
			home, _ = os.UserHomeDir()
		}
		xdg := envValue(env, "XDG_CONFIG_HOME")
		if xdg == "" && home != "" {
			xdg = filepath.Join(home, ".config")
		}
		if home != "" {
			out = append(out, filepath.Join(home, ".gitconfig"))
		}
		if xdg != "" {
			out = append(out, filepath.Join(xdg, "git", "config"))
		}
	}
	if g := envValue(env, "GIT_CONFIG_SYSTEM"); g != "" {
		out = append(out, g)
	} else {
		out = append(out, "/etc/gitconfig")
	}
	return out
}

func hashFile(p string) string {
	b, err := os.ReadFile(p)
	if err != nil {
		return ""
	}
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}

func takeSnapshot(h *hostEnv) snapshot {
	s := snapshot{gitFiles: map[string]string{}, home: h.home()}
	for _, f := range gitConfigFiles(h.env) {
		s.gitFiles[f] = hashFile(f)
	}
	s.homeExists = s.home != "" && fixture.Exists(s.home)
	return s
}

func cleanupScenario() *scenario {
	g := GroupPipeline
	return &scenario{name: "cleanup", group: g, workspace: true, last: true, checks: []Check{
		check(g, "pipeline.cleanup.processes", "no process carrying one of the selftest's job tags is left (found through /proc, or kern.procargs2 on macOS)"),
		check(g, "pipeline.cleanup.workspace", "the selftest's temp dir is gone"),
		check(g, "pipeline.cleanup.git-config", "no git configuration outside the temp dir changed"),
		check(g, "pipeline.cleanup.aq-home", "the real $AQ_HOME holds nothing the selftest made"),
	}, run: func(ctx context.Context, s *session) {
		w := s.ws
		s.step(ctx, "pipeline.cleanup.processes", 20*time.Second, func(ctx context.Context) (string, error) {
			if runtime.GOOS != "linux" && runtime.GOOS != "darwin" {
				return "", skipf("finding processes by tag needs /proc (Linux) or sysctl kern.procargs2 (macOS)")
			}
			tags := w.tags()
			seen := map[string]bool{}
			var left []string
			for _, t := range tags {
				if seen[t.ID] {
					continue
				}
				seen[t.ID] = true
				// Any scope: the id is unique to this run.
				pids, err := process.FindTagged(t.ID)
				if err != nil {
					return "", failf("cannot look for tagged processes: %v", err)
				}
				if len(pids) > 0 {
					left = append(left, fmt.Sprintf("%s: %v", t.ID, pids))
					_, _ = process.KillTagged(context.WithoutCancel(ctx), t.ID, 200*time.Millisecond)
				}
			}
			if len(left) > 0 {
				return "", failf("processes outlived their checks (now killed): %s", strings.Join(left, "; "))
			}
			return fmt.Sprintf("none of the %d job tags used is carried by a live process", len(seen)), nil
		})
		s.step(ctx, "pipeline.cleanup.workspace", 20*time.Second, func(ctx context.Context) (string, error) {
			if w.removeErr != nil {
				// Try once more (a process may have held a file).
				if err := os.RemoveAll(w.root); err != nil {
					return "", failf("cannot remove %s: %v", w.root, err)
				}
			}
			if _, err := os.Lstat(w.root); !errors.Is(err, fs.ErrNotExist) {
				return "", failf("%s is still there (%v)", w.root, err)
			}
			return w.root + " removed", nil
		})
		s.step(ctx, "pipeline.cleanup.git-config", 5*time.Second, func(ctx context.Context) (string, error) {
			var changed, kept []string
			for _, f := range sortedKeys(w.before.gitFiles) {
				if hashFile(f) != w.before.gitFiles[f] {
					changed = append(changed, f)
				} else if w.before.gitFiles[f] != "" {
					kept = append(kept, f)
				}
			}
			if len(changed) > 0 {
				return "", failf("git configuration changed during the selftest: %s", strings.Join(changed, ", "))
			}
			if len(kept) == 0 {
				return "no git configuration file outside the workspace, and none was created", nil
			}
			return "unchanged: " + strings.Join(kept, ", "), nil
		})
		s.step(ctx, "pipeline.cleanup.aq-home", 5*time.Second, func(ctx context.Context) (string, error) {
			home := w.before.home
			if home == "" {
				return "", skipf("no AQ_HOME")
			}
			if !w.before.homeExists {
				if fixture.Exists(home) {
					return "", failf("AQ_HOME %s did not exist before the selftest and does now", home)
				}
				return "AQ_HOME " + home + " did not exist before and does not now", nil
			}
			var left []string
			for _, dir := range []string{home, filepath.Join(home, "locks")} {
				ents, _ := os.ReadDir(dir)
				for _, e := range ents {
					if strings.Contains(e.Name(), w.token) || strings.Contains(e.Name(), "selftest") {
						left = append(left, filepath.Join(dir, e.Name()))
					}
				}
			}
			if len(left) > 0 {
				return "", failf("left in AQ_HOME: %s", strings.Join(left, ", "))
			}
			return "AQ_HOME " + home + " holds no probe or lock of the selftest", nil
		})
	}}
}
