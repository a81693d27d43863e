package egress

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Options configure a Proxy.
type Options struct {
	// Rules say what the proxy lets through.
	Rules Rules
	// UnixSocket, when set, is the path of a unix socket the proxy listens
	// on (created 0600; a stale socket there is replaced; removed by
	// Close): what a sandbox with its own network namespace bridges to.
	UnixSocket string
	// TCP makes the proxy listen on 127.0.0.1 on a port of its own (Addr)
	// as well: for a sandbox without a network namespace, whose TCP
	// connects are limited to that port.
	TCP bool
	// OnRefusal is called for every connection the rules refuse, with the
	// count of refusals of that host and port so far. It runs on the
	// connection's goroutine: it must not block.
	OnRefusal func(Refusal)
	// Log receives the proxy's diagnostics (default: none).
	Log *slog.Logger

	// Resolve looks a host name up (default: the system resolver). Tests
	// map names to loopback addresses with it.
	Resolve func(ctx context.Context, host string) ([]netip.Addr, error)
	// Dial connects to one resolved address (default: net.Dialer).
	Dial func(ctx context.Context, network, address string) (net.Conn, error)

	// MaxConns caps the connections served at once (default 256): past
	// it, new ones wait in the listener's backlog.
	MaxConns int
	// IdleTimeout ends a tunnel or request that moved no byte for this
	// long (default 10 minutes).
	IdleTimeout time.Duration
	// HeaderTimeout bounds reading a request's header (default 30 s).
	HeaderTimeout time.Duration
	// DialTimeout bounds resolving and connecting (default 30 s).
	DialTimeout time.Duration
}

// Refusal is what the proxy refused to one destination: how often, and
// why (the last reason given).
type Refusal struct {
	Host  string `json:"host"`
	Port  int    `json:"port"`
	Count int    `json:"count"`
	Why   string `json:"why"`
}

// Limits on what one connection may cost.
const (
	defaultMaxConns = 256
	maxHeaderBytes  = 64 << 10 // a request's line and header
	bufSize         = 32 << 10 // each direction of a tunnel copied through aq's memory
	// maxRefusalKeys bounds the refusal table: destinations past it are
	// counted together under otherHosts.
	maxRefusalKeys = 1024
	otherHosts     = "(other hosts)"
)

// Proxy is one job's egress proxy. Its methods may be called from several
// goroutines.
type Proxy struct {
	o      Options
	log    *slog.Logger
	socket string
	addr   string
	slots  chan struct{}
	stop   func() bool // detaches the context watch

	ctx    context.Context // cancelled by Close: ends lookups and dials
	cancel context.CancelFunc

	mu        sync.Mutex
	closed    bool
	done      <-chan struct{} // ctx.Done()
	listeners []net.Listener
	conns     map[net.Conn]struct{}
	refusals  map[refusalKey]*Refusal
	wg        sync.WaitGroup
	closeOnce sync.Once
	closeErr  error
}

type refusalKey struct {
	host string
	port int
}

// Start starts a proxy that serves until Close or until ctx ends. It
// listens on the unix socket, on 127.0.0.1, or both (at least one).
func Start(ctx context.Context, o Options) (*Proxy, error) {
	if o.UnixSocket == "" && !o.TCP {
		return nil, errors.New("egress proxy: neither a unix socket nor TCP to listen on")
	}
	if o.MaxConns <= 0 {
		o.MaxConns = defaultMaxConns
	}
	if o.IdleTimeout <= 0 {
		o.IdleTimeout = 10 * time.Minute
	}
	if o.HeaderTimeout <= 0 {
		o.HeaderTimeout = 30 * time.Second
	}
	if o.DialTimeout <= 0 {
		o.DialTimeout = 30 * time.Second
	}
	if o.Resolve == nil {
		o.Resolve = func(ctx context.Context, host string) ([]netip.Addr, error) {
			return net.DefaultResolver.LookupNetIP(ctx, "ip", host)
		}
	}
	if o.Dial == nil {
		var d net.Dialer
		o.Dial = d.DialContext
	}
	log := o.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	p := &Proxy{
		o: o, log: log, slots: make(chan struct{}, o.MaxConns),
		conns: map[net.Conn]struct{}{}, refusals: map[refusalKey]*Refusal{},
	}
	p.ctx, p.cancel = context.WithCancel(context.Background())
	p.done = p.ctx.Done()
	if o.UnixSocket != "" {
		l, err := listenUnix(o.UnixSocket)
		if err != nil {
			p.cancel()
			return nil, fmt.Errorf("egress proxy: %w", err)
		}
		p.socket = o.UnixSocket
		p.listeners = append(p.listeners, l)
	}
	if o.TCP {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			_ = p.closeListeners()
			p.cancel()
			return nil, fmt.Errorf("egress proxy: %w", err)
		}
		p.addr = l.Addr().String()
		p.listeners = append(p.listeners, l)
	}
	for _, l := range p.listeners {
		p.wg.Add(1)
		go p.serve(l)
	}
	p.stop = context.AfterFunc(ctx, func() { _ = p.Close() })
	return p, nil
}

// listenUnix listens on path, replacing a stale socket left there (by a
// killed aq) but nothing else, and makes it private to the user. A path
// longer than a socket address holds (about 107 bytes: a job's directory
// under a deep $AQ_HOME) is bound through a handle on its folder where the
// platform has one (bindLong). The socket file is removed by Close.
func listenUnix(path string) (net.Listener, error) {
	if fi, err := os.Lstat(path); err == nil {
		if fi.Mode().Type() != fs.ModeSocket {
			return nil, fmt.Errorf("%s exists and is not a socket", path)
		}
		if err := os.Remove(path); err != nil {
			return nil, err
		}
	}
	var l net.Listener
	var err error
	if len(path) < maxSocketPath {
		l, err = net.Listen("unix", path)
	} else {
		l, err = bindLong(path)
	}
	if err != nil {
		return nil, err
	}
	l.(*net.UnixListener).SetUnlinkOnClose(false) // Close removes it, by its real path
	if err := os.Chmod(path, 0o600); err != nil {
		_ = l.Close()
		_ = os.Remove(path)
		return nil, err
	}
	return l, nil
}

// maxSocketPath is the longest path a unix socket address holds on every
// platform aq runs on (sun_path: 108 bytes on Linux, 104 on macOS, with
// its terminating NUL).
const maxSocketPath = 104

// Socket is the unix socket's path ("" when the proxy has none).
func (p *Proxy) Socket() string { return p.socket }

// Addr is the proxy's 127.0.0.1:port ("" when it does not listen on TCP).
func (p *Proxy) Addr() string { return p.addr }

// Refusals are what the proxy refused so far, most refused first.
func (p *Proxy) Refusals() []Refusal {
	p.mu.Lock()
	out := make([]Refusal, 0, len(p.refusals))
	for _, r := range p.refusals {
		out = append(out, *r)
	}
	p.mu.Unlock()
	sort.Slice(out, func(i, j int) bool {
		if out[i].Count != out[j].Count {
			return out[i].Count > out[j].Count
		}
		if out[i].Host != out[j].Host {
			return out[i].Host < out[j].Host
		}
		return out[i].Port < out[j].Port
	})
	return out
}

// Close stops the proxy: no new connection is taken, every open one (a
// tunnel in the middle of a transfer included) is closed, and Close
// returns when every goroutine the proxy started has ended.
func (p *Proxy) Close() error {
	p.closeOnce.Do(func() {
		if p.stop != nil {
			p.stop()
		}
		p.mu.Lock()
		p.closed = true
		p.cancel()
		for c := range p.conns {
			c.Close()
		}
		p.mu.Unlock()
		p.closeErr = p.closeListeners()
		p.wg.Wait()
	})
	return p.closeErr
}

func (p *Proxy) closeListeners() error {
	var errs []error
	for _, l := range p.listeners {
		if err := l.Close(); err != nil && !errors.Is(err, net.ErrClosed) {
			errs = append(errs, err)
		}
	}
	if p.socket != "" {
		if fi, err := os.Lstat(p.socket); err == nil && fi.Mode().Type() == fs.ModeSocket {
			if err := os.Remove(p.socket); err != nil {
				errs = append(errs, err)
			}
		}
	}
	return errors.Join(errs...)
}

// serve accepts connections on l, at most MaxConns served at once.
func (p *Proxy) serve(l net.Listener) {
	defer p.wg.Done()
	for {
		select {
		case p.slots <- struct{}{}:
		case <-p.done:
			return
		}
		c, err := l.Accept()
		if err != nil {
			<-p.slots
			select {
			case <-p.done:
				return
			default:
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() || errors.Is(err, os.ErrDeadlineExceeded) || isTemporary(err) {
				p.log.Warn("egress proxy: accept", "err", err)
				select { // as net/http does: a short pause when out of file descriptors
				case <-time.After(10 * time.Millisecond):
				case <-p.done:
					return
				}
				continue
			}
			p.log.Error("egress proxy: accept failed; the proxy stops", "err", err)
			return
		}
		if !p.track(c) {
			c.Close()
			<-p.slots
			return
		}
		p.wg.Add(1)
		go func() {
			defer p.wg.Done()
			defer func() { <-p.slots }()
			defer p.untrack(c)
			p.handle(c)
		}()
	}
}

func isTemporary(err error) bool {
	var t interface{ Temporary() bool }
	return errors.As(err, &t) && t.Temporary()
}

// track records c so that Close can close it; false when the proxy is
// closed already.
func (p *Proxy) track(c net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return false
	}
	p.conns[c] = struct{}{}
	return true
}

func (p *Proxy) untrack(c net.Conn) {
	c.Close()
	p.mu.Lock()
	delete(p.conns, c)
	p.mu.Unlock()
}

// headerLimit lets a request's header be read from a connection up to a
// limit, and the body after it without one.
type headerLimit struct {
	r io.Reader
	n int // bytes left while reading a header; <0: no limit
}

func (h *headerLimit) Read(b []byte) (int, error) {
	if h.n < 0 {
		return h.r.Read(b)
	}
	if h.n == 0 {
		return 0, errHeaderTooLarge
	}
	if len(b) > h.n {
		b = b[:h.n]
	}
	n, err := h.r.Read(b)
	h.n -= n
	return n, err
}

var errHeaderTooLarge = errors.New("request header too large")

// handle serves one client connection: a CONNECT (then the connection is
// the tunnel) or a run of plain HTTP requests.
func (p *Proxy) handle(c net.Conn) {
	lim := &headerLimit{r: c}
	br := bufio.NewReaderSize(lim, 16<<10)
	for {
		lim.n = maxHeaderBytes
		_ = c.SetReadDeadline(time.Now().Add(p.o.HeaderTimeout))
		req, err := http.ReadRequest(br)
		if err != nil {
			if errors.Is(err, errHeaderTooLarge) {
				writeError(c, http.StatusRequestHeaderFieldsTooLarge, "aq egress proxy: request header over 64 KiB")
			} else if !errors.Is(err, io.EOF) && !errors.Is(err, net.ErrClosed) && !errors.Is(err, os.ErrDeadlineExceeded) {
				writeError(c, http.StatusBadRequest, "aq egress proxy: malformed request: "+err.Error())
			}
			return
		}
		lim.n = -1
		_ = c.SetReadDeadline(time.Time{})
		switch {
		case req.Method == http.MethodConnect:
			p.connect(c, br, req)
			return
		case req.URL.IsAbs() && strings.EqualFold(req.URL.Scheme, "http"):
			if !p.forward(c, br, req) {
				return
			}
		case req.URL.IsAbs():
			writeError(c, http.StatusBadRequest, "aq egress proxy: "+req.URL.Scheme+":// through a proxy goes by CONNECT (set HTTPS_PROXY, not an absolute "+req.URL.Scheme+" URL)")
			return
		default:
			writeError(c, http.StatusBadRequest, "aq egress proxy: this is a proxy: send CONNECT host:port or a request for an absolute http:// URL (HTTPS_PROXY / HTTP_PROXY)")
			return
		}
	}
}

// target splits a request's authority; defPort when it names none (0:
// a port is required).
func target(authority string, defPort int) (host string, port int, err error) {
	h, ps, err := net.SplitHostPort(authority)
	if err != nil {
		if defPort == 0 {
			return "", 0, fmt.Errorf("%q is not host:port", authority)
		}
		h, ps = authority, strconv.Itoa(defPort) // "host" or "[v6]": no port
	}
	port, err = strconv.Atoi(ps)
	if err != nil || port < 1 || port > 65535 {
		return "", 0, fmt.Errorf("%q has no valid port", authority)
	}
	h = normalHost(h)
	if h == "" {
		return "", 0, fmt.Errorf("%q has no host", authority)
	}
	return h, port, nil
}

// open decides on host:port and, when allowed, connects to it: the name
// is judged before any lookup, the addresses it resolves to after, and
// the connection goes to exactly those addresses. On a refusal it answers
// the client 403 and returns nil; on a failure to connect, 502.
func (p *Proxy) open(c net.Conn, host string, port int) net.Conn {
	if why := p.o.Rules.refuseName(host, port); why != "" {
		p.refuse(c, host, port, why)
		return nil
	}
	ctx, cancel := context.WithTimeout(p.ctx, p.o.DialTimeout)
	defer cancel()
	var addrs []netip.Addr
	if a, err := netip.ParseAddr(host); err == nil {
		addrs = []netip.Addr{a}
	} else {
		found, err := p.o.Resolve(ctx, host)
		if err != nil || len(found) == 0 {
			writeError(c, http.StatusBadGateway, fmt.Sprintf("aq egress proxy: cannot resolve %s: %v", host, errOr(err, "no address")))
			return nil
		}
		addrs = found
	}
	if why := p.o.Rules.refuseAddrs(host, port, addrs); why != "" {
		p.refuse(c, host, port, why)
		return nil
	}
	var firstErr error
	for _, a := range addrs {
		up, err := p.o.Dial(ctx, "tcp", netip.AddrPortFrom(a.Unmap(), uint16(port)).String())
		if err == nil {
			if !p.track(up) {
				up.Close()
				return nil
			}
			return up
		}
		if firstErr == nil {
			firstErr = err
		}
		if ctx.Err() != nil {
			break
		}
	}
	writeError(c, http.StatusBadGateway, fmt.Sprintf("aq egress proxy: cannot connect to %s:%d: %v", host, port, firstErr))
	return nil
}

func errOr(err error, s string) string {
	if err != nil {
		return err.Error()
	}
	return s
}

// refuse counts a refusal, reports it, and tells the client.
func (p *Proxy) refuse(c net.Conn, host string, port int, why string) {
	k := refusalKey{host, port}
	p.mu.Lock()
	r, ok := p.refusals[k]
	if !ok {
		if len(p.refusals) >= maxRefusalKeys {
			k = refusalKey{otherHosts, 0}
			why = "more destinations refused than the proxy lists one by one"
		}
		if r, ok = p.refusals[k]; !ok {
			r = &Refusal{Host: k.host, Port: k.port}
			p.refusals[k] = r
		}
	}
	r.Count++
	r.Why = why
	rep := *r
	p.mu.Unlock()
	p.log.Debug("egress proxy: refused", "host", host, "port", port, "count", rep.Count, "why", why)
	if p.o.OnRefusal != nil {
		p.o.OnRefusal(rep)
	}
	writeRefusal(c, host, port, why)
}

// connect serves a CONNECT: a tunnel to the target.
func (p *Proxy) connect(c net.Conn, br *bufio.Reader, req *http.Request) {
	host, port, err := target(req.Host, 0)
	if err != nil {
		writeError(c, http.StatusBadRequest, "aq egress proxy: CONNECT "+err.Error())
		return
	}
	up := p.open(c, host, port)
	if up == nil {
		return
	}
	defer p.untrack(up)
	if _, err := io.WriteString(c, "HTTP/1.1 200 Connection established\r\n\r\n"); err != nil {
		return
	}
	// Bytes the client sent after its request (a TLS hello, eagerly) are
	// in br: they go first.
	if n := br.Buffered(); n > 0 {
		b, _ := br.Peek(n)
		if _, err := up.Write(b); err != nil {
			return
		}
		_, _ = br.Discard(n)
	}
	p.tunnel(c, up)
}

// hopHeaders are a single hop's, never forwarded (RFC 9110 §7.6.1).
var hopHeaders = []string{"Connection", "Proxy-Connection", "Keep-Alive", "Proxy-Authenticate", "Proxy-Authorization", "Te", "Trailer", "Transfer-Encoding", "Upgrade"}

func removeHop(h http.Header) {
	for _, f := range h.Values("Connection") {
		for _, k := range strings.Split(f, ",") {
			if k = strings.TrimSpace(k); k != "" {
				h.Del(k)
			}
		}
	}
	for _, k := range hopHeaders {
		h.Del(k)
	}
}

// forward serves one plain HTTP request over a connection of its own to
// the target; it reports whether the client connection may carry another.
func (p *Proxy) forward(c net.Conn, br *bufio.Reader, req *http.Request) bool {
	host, port, err := target(req.URL.Host, 80)
	if err != nil {
		writeError(c, http.StatusBadRequest, "aq egress proxy: "+err.Error())
		return false
	}
	up := p.open(c, host, port)
	if up == nil {
		// A refused request's body was not read: the connection cannot
		// carry another request.
		return false
	}
	defer p.untrack(up)
	keep := !req.Close && req.ProtoAtLeast(1, 1)
	removeHop(req.Header)
	req.RequestURI = ""
	req.Close = true // one request per upstream connection
	idle := &idleConn{Conn: up, d: p.o.IdleTimeout}
	if err := req.Write(idle); err != nil {
		writeError(c, http.StatusBadGateway, fmt.Sprintf("aq egress proxy: sending to %s:%d: %v", host, port, err))
		return false
	}
	resp, err := http.ReadResponse(bufio.NewReaderSize(idle, 16<<10), req)
	if err != nil {
		writeError(c, http.StatusBadGateway, fmt.Sprintf("aq egress proxy: reading from %s:%d: %v", host, port, err))
		return false
	}
	defer resp.Body.Close()
	removeHop(resp.Header)
	if resp.ContentLength < 0 && resp.Body != http.NoBody && req.Method != http.MethodHead {
		keep = false // the body ends when the connection does
	}
	resp.Close = !keep
	if err := resp.Write(&idleConn{Conn: c, d: p.o.IdleTimeout}); err != nil {
		return false
	}
	return keep
}

// idleConn refreshes its deadline before each read and write: a
// transfer that stalls for d fails.
type idleConn struct {
	net.Conn
	d time.Duration
}

func (i *idleConn) Read(b []byte) (int, error) {
	_ = i.Conn.SetReadDeadline(time.Now().Add(i.d))
	return i.Conn.Read(b)
}

func (i *idleConn) Write(b []byte) (int, error) {
	_ = i.Conn.SetWriteDeadline(time.Now().Add(i.d))
	return i.Conn.Write(b)
}

// writeRefusal answers a refused request: 403, and in the body the reason
// and how to allow the destination.
func writeRefusal(c net.Conn, host string, port int, why string) {
	msg := fmt.Sprintf("aq egress proxy: %s refused: %s (docs/sandbox.md, Network)",
		net.JoinHostPort(host, strconv.Itoa(port)), why)
	writeResponse(c, http.StatusForbidden, msg, "refused")
}

func writeError(c net.Conn, code int, msg string) {
	writeResponse(c, code, msg, "error")
}

// writeResponse writes a short text response that closes the connection.
func writeResponse(c net.Conn, code int, msg, kind string) {
	body := msg + "\n"
	_ = c.SetWriteDeadline(time.Now().Add(5 * time.Second))
	fmt.Fprintf(c, "HTTP/1.1 %d %s\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: %d\r\nConnection: close\r\nX-Aq-Egress: %s\r\n\r\n%s",
		code, http.StatusText(code), len(body), kind, body)
}
