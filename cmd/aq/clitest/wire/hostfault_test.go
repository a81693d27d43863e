//go:build linux

package wire

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/aqfleet/aq/cmd/aq/clitest"
	"github.com/aqfleet/aq/demo/coord"
	"github.com/aqfleet/aq/internal/process"
	"github.com/aqfleet/aq/internal/testenv"
)

// inSmallHome runs script (sh) with $AQ_HOME on a tmpfs of size, mounted in
// a user and mount namespace of the test's own (nothing of the host's mount
// table changes, and the file system is gone when the script ends): a real
// file system that fills up. $AQ is the aq binary.
func inSmallHome(t *testing.T, h *testenv.Home, size, script string) testenv.Result {
	t.Helper()
	if err := exec.Command("unshare", "-Urm", "true").Run(); err != nil {
		t.Skip("no user and mount namespaces here (unshare -Urm):", err)
	}
	if err := os.MkdirAll(h.Dir, 0o700); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("unshare", "-Urm", "sh", "-c", `mount -t tmpfs -o size=`+size+` tmpfs "$AQ_HOME" && `+script)
	cmd.Env = append(h.Environ(), "AQ="+h.Bin)
	cmd.Dir = h.RepoBase
	process.SetGroup(cmd)
	return testenv.RunCmd(t, cmd)
}

// Finding 8: a full disk is the host's fault. $AQ_HOME on a real file
// system that fills up while the engine runs: the job used to fail
// engine_failed ("echo: I/O error") and stay in building. Now it fails
// host_unavailable — one line that says the host cannot write $AQ_HOME —
// and the coordinator has it back in queued for another factory.
func TestWireFullDiskIsTheHosts(t *testing.T) {
	e := newWireEnv(t, coord.Options{})
	id := testenv.ID("wire-full")
	// The engine fills the disk, then fails as an engine does when its
	// writes fail.
	e.post(id, "repo: app\nengine: script\nship: branch\nscript: dd if=/dev/zero of=big bs=1M count=64 2>/dev/null; echo written; exit 3", "# job")
	r := inSmallHome(t, e.h, "8m", `exec "$AQ" run --once`)
	line := oneAQLine(t, r)
	if r.Code != 1 || !strings.Contains(line, "failed (host_unavailable): this host cannot write "+filepath.Join(e.h.Dir, "state")+": no space left on device") ||
		!strings.Contains(line, "the coordinator has it in inbox") {
		t.Fatalf("want exit 1 and one line blaming the host:\n%s", clipped(r))
	}
	if j := e.job(id); j.Stage != coord.StageQueued || j.Reason != "host_unavailable" {
		t.Fatalf("the coordinator has the job %s (%s), want queued (host_unavailable): released for another factory", j.Stage, j.Reason)
	}
	// Its work is on origin's aq/wip/<id> for the next factory; no result.
	for ref := range testenv.RemoteRefs(t, e.origin, "refs/heads/aq/") {
		if !strings.HasPrefix(ref, "refs/heads/aq/wip/") {
			t.Fatalf("a result was pushed: %s", ref)
		}
	}
}

// Finding 8, locally: the job goes back to the inbox (host_unavailable),
// even though $AQ_HOME can record nothing — not dead_letter, not stranded
// in building with a dead pid — and the CLI says one thing.
func TestFullDiskLocalJobBackToInbox(t *testing.T) {
	h := clitest.BinHome(t)
	h.Env = append(h.Env, "AQ_SANDBOX=off") // aq's handling of a full disk, not the sandbox's
	h.Repo(t, "app", nil)
	m := testenv.Manifest(t, t.TempDir(), "full-local", "repo: app\nengine: script\nretry: { max: 0 }\nscript: dd if=/dev/zero of=big bs=1M count=64 2>/dev/null; exit 3")
	list := filepath.Join(t.TempDir(), "list")
	r := inSmallHome(t, h, "8m", `"$AQ" submit `+m+` >/dev/null && "$AQ" run --once; code=$?; ls "$AQ_HOME/queue/inbox" "$AQ_HOME/queue/building" > `+list+` 2>&1; exit $code`)
	line := oneAQLine(t, r)
	if r.Code != 1 || !strings.Contains(line, "failed (host_unavailable): this host cannot write ") || !strings.Contains(line, "it is now in inbox") {
		t.Fatalf("want exit 1 and one line: host_unavailable, back in the inbox:\n%s", clipped(r))
	}
	ls := testenv.ReadFile(t, list)
	// ls lists building first, then inbox.
	building, in, _ := strings.Cut(ls, "/queue/inbox:")
	if !strings.Contains(in, "full-local.md") || strings.Contains(building, ".md") {
		t.Fatalf("the job is not back in the inbox:\n%s", ls)
	}
}
