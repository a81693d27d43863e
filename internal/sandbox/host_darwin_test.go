package sandbox

import (
	"bytes"
	"context"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/aqfleet/aq/internal/process"
)

// TestSeatbeltOnMac runs a script under the darwin launcher (sandbox-exec
// with the profile generated from the job's policy) and checks what the
// profile promises: the worktree, the job's home and tmp writable, the
// git metadata readable and not writable, $AQ_HOME and the user's home
// hidden, the host's /tmp out of reach, TCP only to the proxy's port.
// Not yet run on a Mac (docs/platforms.md says what to check first).
func TestSeatbeltOnMac(t *testing.T) {
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	h := Open(Options{Init: exe, Mode: ModeAuto})
	if h.Level() != LevelPartial {
		t.Fatalf("level %s, want partial (seatbelt): %s", h.Level(), h.Report().MissingLine())
	}
	root := canonical(t.TempDir())
	aqHome, base, home := filepath.Join(root, "aq"), filepath.Join(root, "src"), filepath.Join(root, "home")
	wt, gitDir := filepath.Join(aqHome, "worktrees", "app", "job"), filepath.Join(base, "app", ".git")
	for path, content := range map[string]string{
		filepath.Join(aqHome, "credentials"): "token", filepath.Join(wt, "README"): "mine",
		filepath.Join(gitDir, "config"): "[core]\n", filepath.Join(home, ".ssh", "id_ed25519"): "key",
	} {
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	proxy, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer proxy.Close()
	other, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	port := func(l net.Listener) string { return strconv.Itoa(l.Addr().(*net.TCPAddr).Port) }
	j, err := h.Jail(Policy{Worktree: wt, GitDirs: []string{gitDir}, Home: home, JobDir: filepath.Join(aqHome, "sandbox", "job"),
		Hidden: []string{aqHome, base}, Net: Net{ProxyPort: proxy.Addr().(*net.TCPAddr).Port}})
	if err != nil {
		t.Fatal(err)
	}
	defer j.Remove()
	script := `probe() { n=$1; shift; if ("$@") >/dev/null 2>&1; then echo "$n ok"; else echo "$n denied"; fi; }
probe read_worktree cat README
probe write_worktree sh -c 'echo x > made'
probe write_home sh -c 'echo x > "$HOME/x"'
probe write_tmpdir sh -c 'echo x > "$TMPDIR/x"'
probe read_gitdir cat "` + gitDir + `/config"
probe write_gitdir sh -c 'echo x >> "` + gitDir + `/config"'
probe read_credentials cat "` + aqHome + `/credentials"
probe read_ssh_key cat "` + home + `/.ssh/id_ed25519"
probe write_host_tmp sh -c 'echo x > /tmp/aq-seatbelt-test'
probe proxy nc -z 127.0.0.1 ` + port(proxy) + `
probe loopback nc -z 127.0.0.1 ` + port(other) + `
`
	var out bytes.Buffer
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	res, err := process.Run(ctx, process.Spec{Path: "/bin/sh", Args: []string{"-c", script}, Dir: wt, Env: []string{"PATH=/usr/bin:/bin"},
		Stdout: &out, Stderr: &out, Tag: "seatbelt-test", Jail: j})
	if err != nil || res.ExitCode != 0 {
		t.Fatalf("exit %d, %v:\n%s", res.ExitCode, err, out.String())
	}
	want := map[string]string{"read_worktree": "ok", "write_worktree": "ok", "write_home": "ok", "write_tmpdir": "ok", "read_gitdir": "ok",
		"write_gitdir": "denied", "read_credentials": "denied", "read_ssh_key": "denied", "write_host_tmp": "denied", "proxy": "ok", "loopback": "denied"}
	for _, l := range strings.Split(strings.TrimSpace(out.String()), "\n") {
		if f := strings.Fields(l); len(f) == 2 && want[f[0]] != "" && want[f[0]] != f[1] {
			t.Errorf("%s: %s, want %s", f[0], f[1], want[f[0]])
		}
	}
	t.Log(out.String())
}
