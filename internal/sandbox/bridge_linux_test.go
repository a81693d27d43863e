package sandbox

import (
	"bufio"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// TestBridgeOutlivesCollections: the bridge reaches the job's proxy
// through the handle on its socket's folder that init opened before the
// pivot, and keeps reaching it after garbage collections — the handle is
// the bridge's, not left to a finalizer (which closed it, and reset every
// connection after init's first collection).
func TestBridgeOutlivesCollections(t *testing.T) {
	dir := t.TempDir()
	up, err := net.Listen("unix", filepath.Join(dir, "proxy.sock"))
	if err != nil {
		t.Fatal(err)
	}
	defer up.Close()
	go func() {
		for {
			c, err := up.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				line, _ := bufio.NewReader(c).ReadString('\n')
				_, _ = c.Write([]byte("proxied " + line))
			}()
		}
	}()
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	func() { // the handle is the bridge's alone, as in init
		d, err := os.OpenFile(dir, unix.O_PATH|unix.O_DIRECTORY, 0)
		if err != nil {
			t.Fatal(err)
		}
		go bridge(ln, d, "proxy.sock")
	}()
	for i := range 20 {
		runtime.GC() // a finalizer runs after a collection, on its own goroutine: twenty rounds give it every chance
		c, err := net.Dial("tcp4", ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		_, _ = c.Write([]byte("hello\n"))
		b := make([]byte, 64)
		n, _ := c.Read(b)
		c.Close()
		if got := string(b[:n]); !strings.HasPrefix(got, "proxied hello") {
			t.Fatalf("round %d after a collection: the bridge answered %q, want the proxy's answer", i, got)
		}
	}
}
