package egress

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"net/url"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aqfleet/aq/internal/testenv"
)

// startProxy starts a proxy on TCP (and on a unix socket when sock),
// closed when the test ends.
func startProxy(t *testing.T, o Options, sock bool) *Proxy {
	t.Helper()
	o.TCP = true
	// No packet leaves the host, whatever the proxy decides: with the real
	// dialer, a dial to anything but loopback fails the test instead of
	// being made (a test's own Dial is a fake, or dials its loopback server).
	if o.Dial == nil {
		o.Dial = func(ctx context.Context, network, addr string) (net.Conn, error) {
			if ap, err := netip.ParseAddrPort(addr); err != nil || !ap.Addr().Unmap().IsLoopback() {
				t.Errorf("the proxy dialled %s: only loopback may be dialled in a test", addr)
				return nil, fmt.Errorf("test: %s is not loopback", addr)
			}
			var d net.Dialer
			return d.DialContext(ctx, network, addr)
		}
	}
	if sock {
		dir, err := os.MkdirTemp("", "egress") // short: a socket path is at most 107 bytes
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { os.RemoveAll(dir) })
		o.UnixSocket = filepath.Join(dir, "proxy.sock")
	}
	p, err := Start(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	return p
}

func mustRules(t *testing.T, s string) Rules {
	t.Helper()
	r, err := ParseRules(s)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// client is srv's client, through the proxy (over TCP, or over its unix
// socket when sock).
func client(srv *httptest.Server, p *Proxy, sock bool) *http.Client {
	tr := srv.Client().Transport.(*http.Transport).Clone()
	tr.Proxy = http.ProxyURL(&url.URL{Scheme: "http", Host: p.Addr()})
	if sock {
		tr.Proxy = http.ProxyURL(&url.URL{Scheme: "http", Host: "aq-proxy:3128"})
		tr.DialContext = func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", p.Socket())
		}
	}
	return &http.Client{Transport: tr, Timeout: time.Minute}
}

func get(t *testing.T, c *http.Client, u string) (int, string) {
	t.Helper()
	resp, err := c.Get(u)
	if err != nil {
		t.Fatalf("GET %s: %v", u, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// TestProxyAllows: HTTPS through CONNECT and plain HTTP through absolute
// URLs, over TCP and over the unix socket, to a host the rules name.
func TestProxyAllows(t *testing.T) {
	hello := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "hello %s %s", r.Host, r.URL.Path)
	})
	tlsSrv := httptest.NewTLSServer(hello)
	defer tlsSrv.Close()
	plainSrv := httptest.NewServer(hello)
	defer plainSrv.Close()
	_, tlsPort, _ := net.SplitHostPort(tlsSrv.Listener.Addr().String())
	_, plainPort, _ := net.SplitHostPort(plainSrv.Listener.Addr().String())

	var asked []string
	var mu sync.Mutex
	p := startProxy(t, Options{
		Rules: mustRules(t, "allowed.example.com,127.0.0.1"),
		Resolve: func(ctx context.Context, host string) ([]netip.Addr, error) {
			mu.Lock()
			asked = append(asked, host)
			mu.Unlock()
			if host == "allowed.example.com" {
				return []netip.Addr{netip.MustParseAddr("127.0.0.1")}, nil
			}
			return nil, errors.New("no such host")
		},
	}, true)
	for _, sock := range []bool{false, true} {
		c := client(tlsSrv, p, sock)
		for _, u := range []string{tlsSrv.URL + "/a", "https://allowed.example.com:" + tlsPort + "/b"} {
			code, body := get(t, c, u)
			if code != 200 || !strings.HasPrefix(body, "hello ") {
				t.Errorf("sock=%v GET %s: %d %q", sock, u, code, body)
			}
		}
		pc := client(plainSrv, p, sock)
		for i := range 2 { // twice: the client keeps its connection to the proxy
			code, body := get(t, pc, "http://allowed.example.com:"+plainPort+"/plain")
			if code != 200 || body != "hello allowed.example.com:"+plainPort+" /plain" {
				t.Errorf("sock=%v plain GET %d: %d %q", sock, i, code, body)
			}
		}
	}
	if got := p.Refusals(); len(got) != 0 {
		t.Errorf("refusals: %+v", got)
	}
}

// TestProxyRefusesBeforeDialing: special addresses, named or resolved,
// and names the rules do not allow are refused with a 403 that says why,
// counted and reported — and no connection is attempted (the dialler
// fails the test if called), no lookup made for a name refused by name.
func TestProxyRefusesBeforeDialing(t *testing.T) {
	resolved := map[string][]string{
		"rebind.test":   {refusedAddr},
		"private.test":  {"10.0.0.7"},
		"mixed.test":    {"140.82.112.3", "192.168.1.10"},
		"loopback.test": {"::1"},
		"mapped.test":   {"::ffff:127.0.0.1"},
		"nat64.test":    {refusedNAT64},
	}
	var mu sync.Mutex
	var lookups []string
	var reports []Refusal
	p := startProxy(t, Options{
		Rules: mustRules(t, "*"),
		Resolve: func(ctx context.Context, host string) ([]netip.Addr, error) {
			mu.Lock()
			lookups = append(lookups, host)
			mu.Unlock()
			var out []netip.Addr
			for _, a := range resolved[host] {
				out = append(out, netip.MustParseAddr(a))
			}
			return out, nil
		},
		Dial: func(ctx context.Context, network, addr string) (net.Conn, error) {
			t.Errorf("dialled %s: a refused destination must not be dialled", addr)
			return nil, errors.New("test: no dialling")
		},
		OnRefusal: func(r Refusal) {
			mu.Lock()
			reports = append(reports, r)
			mu.Unlock()
		},
	}, false)
	for _, tc := range []struct{ target, why string }{
		{refusedAddr + ":80", refusedAddr + " is a documentation address"},
		{refusedAddr + ":80", "documentation"},
		{"10.0.0.5:443", "a private address"},
		{"[fd12:3456::7]:80", "a private (unique local) address"},
		{"[::ffff:" + refusedAddr + "]:80", "a documentation address"},
		{"0.0.0.0:22", "a 'this network' address"},
		{"127.0.0.1:" + portOf(t, p.Addr()), "a loopback address"}, // the proxy itself
		{"rebind.test:443", "rebind.test resolved to " + refusedAddr},
		{"private.test:443", "resolved to 10.0.0.7, a private address"},
		{"mixed.test:443", "resolved to 192.168.1.10"},
		{"loopback.test:443", "resolved to ::1, a loopback address"},
		{"mapped.test:443", "resolved to 127.0.0.1"},
		{"nat64.test:443", "resolved to " + refusedNAT64 + ", a documentation address"},
	} {
		code, body := connectRaw(t, p.Addr(), tc.target)
		if code != http.StatusForbidden || !strings.Contains(body, tc.why) || !strings.Contains(body, "refused") {
			t.Errorf("CONNECT %s: %d %q, want 403 with %q", tc.target, code, body, tc.why)
		}
	}
	// Plain HTTP is judged the same way.
	resp := plainVia(t, p.Addr(), "http://"+refusedAddr+"/latest/meta-data/")
	if resp.StatusCode != http.StatusForbidden || resp.Header.Get("X-Aq-Egress") != "refused" {
		t.Errorf("plain GET of a refused address: %d %v", resp.StatusCode, resp.Header)
	}

	// A name the rules do not allow is refused without a lookup.
	p2 := startProxy(t, Options{
		Rules: mustRules(t, "github.com:443"),
		Resolve: func(ctx context.Context, host string) ([]netip.Addr, error) {
			t.Errorf("looked %s up: a name refused by the rules must not be resolved", host)
			return nil, errors.New("test: no lookups")
		},
		Dial: func(ctx context.Context, network, addr string) (net.Conn, error) {
			t.Errorf("dialled %s", addr)
			return nil, errors.New("test: no dialling")
		},
	}, false)
	for _, tc := range []struct{ target, why string }{
		{"evil.example:443", "evil.example is not allowed: add it to AQ_SANDBOX_NET"},
		{"github.com:22", "github.com is allowed on port 443 only"},
		{"8.8.8.8:53", "8.8.8.8 is not allowed"},
	} {
		if code, body := connectRaw(t, p2.Addr(), tc.target); code != 403 || !strings.Contains(body, tc.why) {
			t.Errorf("CONNECT %s: %d %q, want 403 with %q", tc.target, code, body, tc.why)
		}
	}

	got := p.Refusals()
	if len(got) == 0 || got[0].Host != refusedAddr || got[0].Port != 80 || got[0].Count != 3 {
		t.Errorf("most refused: %+v, want %s:80 three times (two CONNECTs, one GET)", got, refusedAddr)
	}
	if len(got) != 12 {
		t.Errorf("%d destinations refused, want 12: %+v", len(got), got)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(reports) != 14 {
		t.Errorf("OnRefusal called %d times, want once per refused connection (14)", len(reports))
	}
	for i, want := range []int{1, 2} {
		if reports[i].Host != refusedAddr || reports[i].Count != want {
			t.Errorf("report %d: %+v, want count %d", i, reports[i], want)
		}
	}
	for _, l := range lookups {
		if net.ParseIP(l) != nil {
			t.Errorf("looked an address up: %s", l)
		}
	}
}

func portOf(t *testing.T, addr string) string {
	_, port, err := net.SplitHostPort(addr)
	if err != nil {
		t.Fatal(err)
	}
	return port
}

// connectRaw sends one CONNECT to the proxy at addr and returns the
// answer's status and body (the connection is closed).
func connectRaw(t *testing.T, addr, target string) (int, string) {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	fmt.Fprintf(c, "CONNECT %s HTTP/1.1\r\nHost: %s\r\n\r\n", target, target)
	resp, err := http.ReadResponse(bufio.NewReader(c), &http.Request{Method: http.MethodConnect})
	if err != nil {
		t.Fatalf("CONNECT %s: %v", target, err)
	}
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func plainVia(t *testing.T, proxyAddr, u string) *http.Response {
	t.Helper()
	c := &http.Client{Transport: &http.Transport{Proxy: http.ProxyURL(&url.URL{Scheme: "http", Host: proxyAddr})}}
	resp, err := c.Get(u)
	if err != nil {
		t.Fatal(err)
	}
	io.ReadAll(resp.Body)
	resp.Body.Close()
	return resp
}

// TestProxyDialsTheDecidedAddress: the connection goes to exactly the
// address the decision was taken on, not to a fresh lookup's.
func TestProxyDialsTheDecidedAddress(t *testing.T) {
	var lookups atomic.Int32
	var dialled []string
	var mu sync.Mutex
	up, upConn := net.Pipe()
	defer up.Close()
	go func() { // the "public host": echoes one line
		line, _ := bufio.NewReader(up).ReadString('\n')
		io.WriteString(up, "echo "+line)
	}()
	p := startProxy(t, Options{
		Rules: mustRules(t, "pkg.example"),
		Resolve: func(ctx context.Context, host string) ([]netip.Addr, error) {
			if lookups.Add(1) > 1 {
				// A second answer would be the rebinding one.
				return []netip.Addr{netip.MustParseAddr(refusedAddr)}, nil
			}
			return []netip.Addr{netip.MustParseAddr("93.184.215.14")}, nil
		},
		Dial: func(ctx context.Context, network, addr string) (net.Conn, error) {
			mu.Lock()
			dialled = append(dialled, network+" "+addr)
			mu.Unlock()
			return upConn, nil
		},
	}, false)
	c, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	// The request and the first tunnelled bytes in one write: they must
	// reach the target in order.
	io.WriteString(c, "CONNECT pkg.example:443 HTTP/1.1\r\nHost: pkg.example:443\r\n\r\nping\n")
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, &http.Request{Method: http.MethodConnect})
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("CONNECT: %v %v", resp, err)
	}
	line, err := br.ReadString('\n')
	if err != nil || line != "echo ping\n" {
		t.Fatalf("through the tunnel: %q %v", line, err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(dialled) != 1 || dialled[0] != "tcp 93.184.215.14:443" || lookups.Load() != 1 {
		t.Errorf("dialled %v after %d lookups, want exactly tcp 93.184.215.14:443 after one", dialled, lookups.Load())
	}
}

// TestProxyBadRequests: each malformed or misdirected request gets a
// status and a line that says what to send instead.
func TestProxyBadRequests(t *testing.T) {
	p := startProxy(t, Options{Rules: mustRules(t, "*")}, false)
	for _, tc := range []struct {
		req  string
		code int
		want string
	}{
		{"GET / HTTP/1.1\r\nHost: x\r\n\r\n", 400, "this is a proxy: send CONNECT host:port"},
		{"CONNECT example.com HTTP/1.1\r\nHost: example.com\r\n\r\n", 400, `"example.com" is not host:port`},
		{"CONNECT example.com:99999 HTTP/1.1\r\nHost: example.com:99999\r\n\r\n", 400, "has no valid port"},
		{"GET https://example.com/ HTTP/1.1\r\nHost: example.com\r\n\r\n", 400, "https:// through a proxy goes by CONNECT"},
		{"NONSENSE\r\n\r\n", 400, "malformed request"},
		{"GET http://example.com/ HTTP/1.1\r\nX: " + strings.Repeat("a", 70<<10) + "\r\n\r\n", 431, "request header over 64 KiB"},
	} {
		c, err := net.Dial("tcp", p.Addr())
		if err != nil {
			t.Fatal(err)
		}
		go io.WriteString(c, tc.req)
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			t.Fatalf("%q: %v", tc.req[:min(len(tc.req), 40)], err)
		}
		b, _ := io.ReadAll(resp.Body)
		c.Close()
		if resp.StatusCode != tc.code || !strings.Contains(string(b), tc.want) {
			t.Errorf("%q: %d %q, want %d with %q", tc.req[:min(len(tc.req), 40)], resp.StatusCode, b, tc.code, tc.want)
		}
	}
	if got := p.Refusals(); len(got) != 0 {
		t.Errorf("bad requests counted as refusals: %+v", got)
	}
}

// TestProxyIdleTunnelEnds: a tunnel that moves nothing for IdleTimeout is
// closed; one whose other direction is busy is not.
func TestProxyIdleTunnelEnds(t *testing.T) {
	testenv.Slow(t, "waits out the proxy's idle timeout")
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	stop := make(chan struct{})
	// Cleanups, not defers: the parallel modes below run after this
	// function returns, and need the server until they end.
	t.Cleanup(func() { close(stop); ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() { // the first byte says: 's' stay silent, 't' trickle
				defer c.Close()
				b := make([]byte, 1)
				if _, err := c.Read(b); err != nil || b[0] == 's' {
					io.Copy(io.Discard, c)
					return
				}
				tick := time.NewTicker(20 * time.Millisecond)
				defer tick.Stop()
				for range 150 {
					select {
					case <-tick.C:
						if _, err := c.Write([]byte{'.'}); err != nil {
							return
						}
					case <-stop:
						return
					}
				}
			}()
		}
	}()
	const idle = 2 * time.Second // a hundred ticks: a busy direction is never mistaken for an idle one
	for _, mode := range []string{"watched", "copied"} {
		t.Run(mode, func(t *testing.T) {
			t.Parallel() // each its own proxy; both wait out the idle time
			o := Options{Rules: mustRules(t, "127.0.0.1"), IdleTimeout: idle}
			if mode == "copied" {
				// Not a *net.TCPConn: no kernel account, each direction
				// times itself.
				o.Dial = func(ctx context.Context, network, addr string) (net.Conn, error) {
					var d net.Dialer
					c, err := d.DialContext(ctx, network, addr)
					return struct{ net.Conn }{c}, err
				}
			}
			idleTunnel(t, startProxy(t, o, false), ln.Addr().String(), idle)
		})
	}
}

func idleTunnel(t *testing.T, p *Proxy, target string, idle time.Duration) {

	open := func(first byte) (net.Conn, *bufio.Reader) {
		c, err := net.Dial("tcp", p.Addr())
		if err != nil {
			t.Fatal(err)
		}
		fmt.Fprintf(c, "CONNECT %s HTTP/1.1\r\nHost: x\r\n\r\n", target)
		br := bufio.NewReader(c)
		if resp, err := http.ReadResponse(br, &http.Request{Method: http.MethodConnect}); err != nil || resp.StatusCode != 200 {
			t.Fatalf("CONNECT: %v %v", resp, err)
		}
		c.Write([]byte{first})
		return c, br
	}
	// Silent both ways: the proxy ends it (the read sees the end).
	silent, sbr := open('s')
	defer silent.Close()
	start := time.Now()
	if _, err := sbr.ReadByte(); !errors.Is(err, io.EOF) {
		t.Errorf("idle tunnel: read %v, want the end of the stream", err)
	}
	if time.Since(start) < idle/2 {
		t.Errorf("idle tunnel closed after %v, before its idle timeout %v", time.Since(start), idle)
	}
	// The client sends nothing for 3 s while the target trickles: alive.
	busy, bbr := open('t')
	defer busy.Close()
	n, err := io.Copy(io.Discard, bbr)
	if n != 150 || err != nil {
		t.Errorf("one-way tunnel: got %d bytes (%v), want all 150: it was cut while busy", n, err)
	}
}

// TestProxyMaxConns: past MaxConns, connections wait; no more than
// MaxConns are served at once, and every one is served in the end.
func TestProxyMaxConns(t *testing.T) {
	echo := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	defer echo.Close()
	p := startProxy(t, Options{Rules: mustRules(t, "127.0.0.1"), MaxConns: 2}, false)
	target := echo.Listener.Addr().String()
	dialTunnel := func() net.Conn {
		c, err := net.Dial("tcp", p.Addr())
		if err != nil {
			t.Error(err)
			return nil
		}
		fmt.Fprintf(c, "CONNECT %s HTTP/1.1\r\nHost: x\r\n\r\n", target)
		if resp, err := http.ReadResponse(bufio.NewReader(c), &http.Request{Method: http.MethodConnect}); err != nil || resp.StatusCode != 200 {
			t.Errorf("CONNECT: %v %v", resp, err)
		}
		return c
	}
	held := []net.Conn{dialTunnel(), dialTunnel()}
	served := make(chan net.Conn, 3)
	for range 3 {
		go func() { served <- dialTunnel() }()
	}
	// Each tunnel closed lets one waiting connection in.
	for i := range 3 {
		held[i].Close()
		c := <-served
		held = append(held, c)
		if n := p.clients(); n > 2 {
			t.Errorf("%d connections served at once, want at most 2", n)
		}
	}
	for _, c := range held[3:] {
		c.Close()
	}
}

// clients is how many client connections are being served (a test's
// view of the slots).
func (p *Proxy) clients() int { return len(p.slots) }

// TestProxyCloseEndsEverything: Close, in the middle of a transfer, ends
// every connection and every goroutine of the proxy before it returns.
func TestProxyCloseEndsEverything(t *testing.T) {
	gate := make(chan struct{})
	slow := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Write([]byte("first"))
		w.(http.Flusher).Flush()
		select {
		case <-gate:
		case <-r.Context().Done():
		}
	}))
	defer slow.Close()
	defer close(gate)
	p := startProxy(t, Options{Rules: mustRules(t, "127.0.0.1")}, true)
	// A tunnel in the middle of a response, a plain request waiting for
	// its body, and an idle client connection.
	tun, err := net.Dial("unix", p.Socket())
	if err != nil {
		t.Fatal(err)
	}
	defer tun.Close()
	fmt.Fprintf(tun, "CONNECT %s HTTP/1.1\r\nHost: x\r\n\r\nGET / HTTP/1.1\r\nHost: x\r\n\r\n", slow.Listener.Addr())
	tbr := bufio.NewReader(tun)
	http.ReadResponse(tbr, &http.Request{Method: http.MethodConnect})
	if resp, err := http.ReadResponse(tbr, nil); err != nil {
		t.Fatal(err)
	} else {
		b := make([]byte, 5)
		io.ReadFull(resp.Body, b)
	}
	plain, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer plain.Close()
	fmt.Fprintf(plain, "GET %s/ HTTP/1.1\r\nHost: x\r\n\r\n", slow.URL)
	pbr := bufio.NewReader(plain)
	if _, err := http.ReadResponse(pbr, nil); err != nil {
		t.Fatal(err)
	}
	idle, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer idle.Close()

	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	// Close has waited for every connection's goroutine to be done; one
	// may still be on its way out (after its wg.Done, a few instructions
	// from its end): wait for that, within a guard that only a goroutine
	// still at work would exceed.
	left := proxyGoroutines()
	for deadline := time.Now().Add(10 * time.Second); left != "" && time.Now().Before(deadline); left = proxyGoroutines() {
		time.Sleep(10 * time.Millisecond)
	}
	if left != "" {
		t.Errorf("goroutines of the proxy after Close:\n%s", left)
	}
	for name, c := range map[string]io.Reader{"tunnel": tbr, "plain": pbr, "idle": idle} {
		if _, err := io.Copy(io.Discard, c); err != nil && !errors.Is(err, net.ErrClosed) {
			var ne net.Error
			if !errors.As(err, &ne) { // a reset is an end too
				t.Errorf("%s: %v", name, err)
			}
		}
	}
	if _, err := os.Lstat(p.Socket()); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the socket is still there after Close: %v", err)
	}
	if _, err := net.Dial("tcp", p.Addr()); err == nil {
		t.Error("the proxy still accepts connections after Close")
	}
}

// proxyGoroutines lists the goroutines running the proxy's code.
func proxyGoroutines() string {
	buf := make([]byte, 1<<20)
	buf = buf[:runtime.Stack(buf, true)]
	var out []string
	for _, g := range strings.Split(string(buf), "\n\n") {
		if strings.Contains(g, "internal/egress.(*Proxy)") && !strings.Contains(g, "internal/egress.proxyGoroutines") {
			out = append(out, g)
		}
	}
	return strings.Join(out, "\n\n")
}

// TestProxyStartAndStop: the socket file (a stale socket replaced,
// anything else refused), and a context that ends the proxy.
func TestProxyStartAndStop(t *testing.T) {
	dir, err := os.MkdirTemp("", "egress")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	if _, err := Start(context.Background(), Options{}); err == nil {
		t.Error("Start with nothing to listen on: no error")
	}
	file := filepath.Join(dir, "file")
	os.WriteFile(file, nil, 0o600)
	if _, err := Start(context.Background(), Options{UnixSocket: file}); err == nil || !strings.Contains(err.Error(), "not a socket") {
		t.Errorf("Start on a regular file: %v, want refused", err)
	}
	if b, _ := os.ReadFile(file); b == nil {
		if _, err := os.Stat(file); err != nil {
			t.Errorf("the regular file was removed: %v", err)
		}
	}
	sock := filepath.Join(dir, "s")
	stale, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	stale.(*net.UnixListener).SetUnlinkOnClose(false)
	stale.Close() // a killed aq leaves its socket file behind
	ctx, cancel := context.WithCancel(context.Background())
	p, err := Start(ctx, Options{UnixSocket: sock, Rules: mustRules(t, "")})
	if err != nil {
		t.Fatalf("Start over a stale socket: %v", err)
	}
	if fi, err := os.Stat(sock); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("socket mode: %v %v, want 0600", fi, err)
	}
	cancel()
	p.wg.Wait() // the context's end closes it
	testenv.WaitFor(t, time.Minute, "the socket removed after the context ended", func() bool {
		_, err := os.Lstat(sock)
		return errors.Is(err, os.ErrNotExist)
	})

	// A job's directory under a deep $AQ_HOME: a path longer than a socket
	// address holds.
	deep := filepath.Join(dir, strings.Repeat("d", 60), strings.Repeat("e", 60))
	if err := os.MkdirAll(deep, 0o700); err != nil {
		t.Fatal(err)
	}
	long := filepath.Join(deep, "proxy.sock")
	p, err = Start(context.Background(), Options{UnixSocket: long, Rules: mustRules(t, "")})
	if runtime.GOOS != "linux" {
		if err == nil {
			p.Close()
		}
		return
	}
	if err != nil {
		t.Fatalf("Start on a %d-byte socket path: %v", len(long), err)
	}
	c, err := DialUnix(context.Background(), long) // as aq's gateway pre-flight dials it
	if err != nil {
		t.Fatalf("DialUnix of the long socket: %v", err)
	}
	c.Close()
	c, err = net.Dial("unix", "/proc/self/fd/"+strconv.Itoa(openDir(t, deep))+"/proxy.sock")
	if err != nil {
		t.Fatalf("dial the long socket: %v", err)
	}
	fmt.Fprintf(c, "CONNECT example.com:443 HTTP/1.1\r\nHost: x\r\n\r\n")
	if resp, err := http.ReadResponse(bufio.NewReader(c), nil); err != nil || resp.StatusCode != http.StatusForbidden {
		t.Errorf("through the long socket: %v %v", resp, err)
	}
	c.Close()
	if fi, err := os.Stat(long); err != nil || fi.Mode().Perm() != 0o600 || p.Socket() != long {
		t.Errorf("long socket: %v %v, Socket() %q", fi, err, p.Socket())
	}
	p.Close()
	if _, err := os.Lstat(long); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("long socket left after Close: %v", err)
	}
}

// openDir is an O_PATH handle on dir (closed when the test ends).
func openDir(t *testing.T, dir string) int {
	f, err := os.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return int(f.Fd())
}
