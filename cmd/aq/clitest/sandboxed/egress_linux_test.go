package sandboxed

import (
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/aqfleet/aq/cmd/aq/clitest"
	"github.com/aqfleet/aq/internal/testenv"
	"github.com/aqfleet/aq/job"
)

// TestSandboxNet: through the aq binary, a sandboxed job's engine reaches
// the host AQ_SANDBOX_NET names through the job's egress proxy, and is
// refused one it does not name and the metadata service; the job ships,
// and `aq job show` lists what was refused, with counts and reasons. A
// malformed AQ_SANDBOX_NET stops aq before it runs anything: exit 2, one
// line naming the key and the entry.
func TestSandboxNet(t *testing.T) {
	if b, err := os.ReadFile("/proc/sys/user/max_user_namespaces"); err == nil && strings.TrimSpace(string(b)) == "0" {
		t.Skip("user namespaces are blocked on this host: no full sandbox to test")
	}
	h := clitest.BinHome(t)
	var served atomic.Int32
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		served.Add(1)
		w.Write([]byte("from the allowed host\n"))
	}))
	defer up.Close()
	_, port, _ := net.SplitHostPort(up.Listener.Addr().String())
	repo := h.Repo(t, "app", map[string]string{"README.md": "app\n"})
	testenv.AddOrigin(t, repo)

	h.Submit(t, "net", clitest.ScriptJob("app", `bash <<'SH'
hp=${http_proxy#http://}
req() { exec 3<>/dev/tcp/${hp%:*}/${hp##*:} && printf "$1" >&3 && cat <&3; exec 3<&-; }
req "GET http://127.0.0.1:`+port+`/pkg HTTP/1.0\r\n\r\n" > allowed.txt
req "CONNECT registry.npmjs.org:443 HTTP/1.0\r\n\r\n" > refused.txt
req "CONNECT registry.npmjs.org:443 HTTP/1.0\r\n\r\n" >> refused.txt
req "GET http://127.0.0.2:`+port+`/pkg HTTP/1.0\r\n\r\n" > special.txt
SH`, "ship: branch"))
	h.Env = append(h.Env, "AQ_SANDBOX_NET=github.com, exa mple.com")
	r := h.Run(t, "run", "--once")
	if r.Code != 2 || strings.Count(strings.TrimSpace(r.Stderr), "\n") != 0 ||
		!strings.Contains(r.Stderr, `AQ_SANDBOX_NET="github.com, exa mple.com"`) || !strings.Contains(r.Stderr, `entry "exa mple.com" is not a host name`) {
		t.Fatalf("a malformed AQ_SANDBOX_NET: %s", r)
	}
	h.Env[len(h.Env)-1] = "AQ_SANDBOX_NET=127.0.0.1:" + port // the upstream's address, named
	if v := show(t, h, "net"); v.State.Stage != job.Inbox || v.State.Attempts != 0 {
		t.Fatalf("the job ran under a malformed AQ_SANDBOX_NET: %+v", v.State)
	}
	if r := h.Run(t, "run", "--once"); r.Code != 0 {
		for _, n := range []string{"stdout.log", "stderr.log"} { // the engine's side of it
			b, _ := os.ReadFile(filepath.Join(h.Dir, "logs", testenv.ID("net"), n))
			t.Logf("the engine's %s:\n%s", n, b)
		}
		t.Fatalf("run: %s", r)
	}
	v := show(t, h, "net")
	if v.State.Stage != job.Shipped {
		t.Fatalf("the job is %s, want shipped", v.State.Stage)
	}
	files := testenv.TreeFiles(t, repo, job.JobBranch(testenv.ID("net")))
	if !strings.Contains(files["allowed.txt"], "from the allowed host") || served.Load() != 1 {
		t.Errorf("the allowed host: %q (served %d)", files["allowed.txt"], served.Load())
	}
	if got := files["refused.txt"]; strings.Count(got, "403 Forbidden") != 2 || !strings.Contains(got, "registry.npmjs.org is not allowed: add it to AQ_SANDBOX_NET") {
		t.Errorf("a host not named: %q", got)
	}
	// A special address not named is refused before any dial.
	if got := files["special.txt"]; !strings.Contains(got, "127.0.0.2 is a loopback address") {
		t.Errorf("a special address not named: %q", got)
	}
	in := v.State.Insights
	if in == nil || len(in.EgressRefused) != 2 || in.EgressRefused[0].Host != "registry.npmjs.org" || in.EgressRefused[0].Count != 2 ||
		in.EgressRefused[1].Host != "127.0.0.2" || fmt.Sprint(in.EgressRefused[1].Port) != port {
		t.Fatalf("insights: %+v", in)
	}
	text := h.Run(t, "job", "show", testenv.ID("net"))
	for _, want := range []string{"egress refused", "registry.npmjs.org:443  2×  registry.npmjs.org is not allowed", "127.0.0.2:" + port + "  1×"} {
		if !strings.Contains(text.Stdout, want) {
			t.Errorf("aq job show lacks %q:\n%s", want, text.Stdout)
		}
	}
}
