package sandbox

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
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
		go bridge(ln, d, "proxy.sock", "")
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

// TestGatewayBridge (#33 item 4): a gateway's bridge asks the proxy for a
// tunnel to the gateway (CONNECT host:port), then carries the engine's
// bytes both ways; when the proxy refuses, the engine gets the proxy's
// answer as it is — its 403, its X-Aq-Egress marker and its reason — so
// that the engine's error says what refused it.
func TestGatewayBridge(t *testing.T) {
	dir := t.TempDir()
	up, err := net.Listen("unix", filepath.Join(dir, "proxy.sock"))
	if err != nil {
		t.Fatal(err)
	}
	defer up.Close()
	go func() { // a proxy: localhost:4000 is allowed (echoes, upper-cased after the tunnel), the rest refused
		for {
			c, err := up.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				br := bufio.NewReader(c)
				req, err := http.ReadRequest(br)
				if err != nil {
					return
				}
				if req.Method != http.MethodConnect || req.Host != "localhost:4000" {
					body := "aq egress proxy: " + req.Host + " refused: not allowed\n"
					fmt.Fprintf(c, "HTTP/1.1 403 Forbidden\r\nX-Aq-Egress: refused\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s", len(body), body)
					return
				}
				_, _ = c.Write([]byte("HTTP/1.1 200 Connection established\r\n\r\nhello from upstream\n"))
				line, _ := br.ReadString('\n')
				_, _ = c.Write([]byte(strings.ToUpper(line)))
			}()
		}
	}()
	d, err := os.OpenFile(dir, unix.O_PATH|unix.O_DIRECTORY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	listen := func(target string) string {
		ln, err := net.Listen("tcp4", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { ln.Close() })
		go bridge(ln, d, "proxy.sock", target)
		return ln.Addr().String()
	}
	c, err := net.Dial("tcp4", listen("localhost:4000"))
	if err != nil {
		t.Fatal(err)
	}
	_, _ = c.Write([]byte("ping\n"))
	got, _ := io.ReadAll(c)
	c.Close()
	if string(got) != "hello from upstream\nPING\n" {
		t.Errorf("through the tunnel: %q", got)
	}
	resp, err := http.Get("http://" + listen("localhost:4001") + "/v1/messages")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 403 || resp.Header.Get("X-Aq-Egress") != "refused" || !strings.Contains(string(body), "aq egress proxy: localhost:4001 refused") {
		t.Errorf("a refused gateway: %d %v %q", resp.StatusCode, resp.Header, body)
	}
}
