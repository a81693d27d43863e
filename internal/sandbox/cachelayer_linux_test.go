package sandbox_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// isTmpfsMount reports whether dir is a tmpfs mounted at dir itself.
func isTmpfsMount(t *testing.T, dir string) bool {
	t.Helper()
	var st, parent unix.Stat_t
	if unix.Lstat(dir, &st) != nil || unix.Lstat(filepath.Dir(dir), &parent) != nil || st.Dev == parent.Dev {
		return false
	}
	var fs unix.Statfs_t
	return unix.Statfs(dir, &fs) == nil && fs.Type == unix.TMPFS_MAGIC
}

// TestCacheLayersVerifySeesTheEngine: a job's runs share their caches'
// writable layers (the engine, then verify, in one jail): what the engine
// put in a cache verify finds there, the host's cache never gets it, and
// the layers go with the job. Where aq may mount (root here), the layers
// live on a tmpfs of the job's own (#35 item 2), gone with it too.
func TestCacheLayersVerifySeesTheEngine(t *testing.T) {
	h := openFull(t)
	l := makeLayout(t, t.TempDir())
	j, err := h.Jail(l.policy)
	if err != nil {
		t.Fatal(err)
	}
	layers := filepath.Join(l.policy.JobDir, "cache")
	if os.Getuid() == 0 && !isTmpfsMount(t, layers) {
		t.Errorf("the caches' layers at %s are not on a tmpfs of the job's own", layers)
	}
	cache := filepath.Join(l.home, ".cache", "pkgs")
	out, res, err := runScript(context.Background(), j, l, `echo module > "$HOME/.cache/pkgs/from-engine" && echo wrote`, "0", "0", nonce(t), nil)
	if err != nil || res.ExitCode != 0 || !strings.Contains(out, "wrote") {
		t.Fatalf("engine: exit %d, %v:\n%s", res.ExitCode, err, out)
	}
	out, res, err = runScript(context.Background(), j, l, `cat "$HOME/.cache/pkgs/from-engine" "$HOME/.cache/pkgs/shared.txt"`, "0", "0", nonce(t), nil)
	if err != nil || res.ExitCode != 0 || out != "module\ncached" {
		t.Errorf("verify saw %q (exit %d, %v), want the engine's write and the host's cache", out, res.ExitCode, err)
	}
	if testenvExists(filepath.Join(cache, "from-engine")) {
		t.Error("the engine's write reached the host's cache")
	}
	for _, n := range j.Notes() {
		t.Errorf("sandbox note: %s", n)
	}
	if err := j.Remove(); err != nil {
		t.Fatal(err)
	}
	if testenvExists(l.policy.JobDir) {
		t.Errorf("the job's directory %s outlived Remove", l.policy.JobDir)
	}
	if mi, _ := os.ReadFile("/proc/self/mountinfo"); strings.Contains(string(mi), layers) {
		t.Errorf("a mount at %s outlived Remove", layers)
	}
}

// TestCacheLayerBounded: the tmpfs the caches' layers live on is bounded
// (Policy.CacheLayerMax; by default half the job's memory limit): a write
// past it fails with "no space left on device", one line, and the job's
// sandbox goes on.
func TestCacheLayerBounded(t *testing.T) {
	if os.Getuid() != 0 {
		t.Skip("only a root aq mounts the caches' layers on a tmpfs")
	}
	h := openFull(t)
	l := makeLayout(t, t.TempDir())
	p := l.policy
	p.CacheLayerMax = 8 << 20
	j, err := h.Jail(p)
	if err != nil {
		t.Fatal(err)
	}
	defer j.Remove()
	out, res, err := runScript(context.Background(), j, l, `head -c 12582912 /dev/zero > "$HOME/.cache/pkgs/big" 2>/tmp/err && echo wrote-all
cat /tmp/err; rm -f "$HOME/.cache/pkgs/big"; echo small > "$HOME/.cache/pkgs/small" && echo wrote-small`, "0", "0", nonce(t), nil)
	if err != nil || res.ExitCode != 0 {
		t.Fatalf("exit %d, %v:\n%s", res.ExitCode, err, out)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if strings.Contains(out, "wrote-all") || len(lines) != 2 || !strings.Contains(lines[0], "No space left on device") || lines[1] != "wrote-small" {
		t.Errorf("a 12 MiB write to an 8 MiB cache layer: got\n%s\nwant one line of \"No space left on device\", then the small write", out)
	}
}
