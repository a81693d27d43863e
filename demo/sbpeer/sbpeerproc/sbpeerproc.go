// Package sbpeerproc launches demo/sbpeer — the local AMQP 1.0 stand-in for
// Azure Service Bus — as a real child process on 127.0.0.1: it starts the
// peer on a free port, waits until it listens, hands out a loopback-pinned
// connection string (or a TLS config for the token-credential path), reads
// the peer's JSON event log, and kills or restarts the peer on the same port.
//
// It is the one launcher: the demo's fleet act and aq selftest use it
// directly, and tests through sbpeertest, which adds testing.TB plumbing.
// It must not import package testing: the aq binary links it.
//
// The peer needs `node` and its packages installed once with
// `npm ci --prefix demo/sbpeer` (make sbpeer); Missing says which is absent.
package sbpeerproc

import (
	"bufio"
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/aqfleet/aq/internal/process"
)

// Options configure the peer. Zero values take the peer's defaults (lock 30 s,
// max delivery count 10, duplicate window 10 min).
type Options struct {
	// Subs are the subscriptions, as the peer's --sub flag takes them:
	// "TOPIC/NAME" (correlation filter targetFactoryId = NAME),
	// "TOPIC/NAME=FACTORY" (filter targetFactoryId = FACTORY) or
	// "TOPIC/NAME=*" (matches every message, like a left-over $Default rule).
	Subs         []string
	LockDuration time.Duration
	MaxDelivery  int
	DupWindow    time.Duration
	// TLS makes the peer listen with a fresh self-signed certificate, for the
	// token-credential path (which always dials amqps://).
	TLS bool
	// Persist keeps queued messages in a state file, so that Restart finds
	// them again. Without it a restart starts empty (like a new namespace).
	Persist bool
	// Dir holds the event log, state and certificate (required).
	Dir string
	// Node is the node executable; default: node on this process's PATH.
	Node string
	// PeerDir is demo/sbpeer; default: found above the working directory.
	PeerDir string
	// Env is the peer's environment; nil: this process's.
	Env []string
	// Admin makes the peer serve the management API's read of a
	// subscription's runtime properties over HTTPS on a port of its own
	// (AdminConnectionString, AdminHTTPClient): what a scaler reads.
	Admin bool
	// Sessions are the subscriptions (among Subs, as "TOPIC/NAME"; "*":
	// all) that require sessions (RequiresSession): their messages are
	// grouped by SessionId and received only over a session receiver
	// (AcceptSession*, AcceptNextSession*).
	Sessions []string
	// SessionWait is how long an AcceptNextSession waits for a free session
	// when the client gives no com.microsoft:timeout (the SDK gives one only
	// with a ctx deadline); default the service's 60 s.
	SessionWait time.Duration
}

// Peer is one running (or killed) sbpeer process.
type Peer struct {
	opts       Options
	script     string
	dir        string
	eventsPath string
	statePath  string
	certPath   string
	keyPath    string
	roots      *x509.CertPool

	mu        sync.Mutex
	port      int
	adminPort int
	cmd       *exec.Cmd
	done      chan struct{}
	stderr    *syncBuffer
	stdin     io.WriteCloser // the peer's control channel
	controls  int
}

// ServerName is the TLS server name in the peer's certificate.
const ServerName = "sbpeer.localhost"

// Installed reports whether the peer's packages are installed in dir
// (demo/sbpeer): `npm ci --prefix demo/sbpeer`, or make sbpeer.
func Installed(dir string) bool {
	_, err := os.Stat(filepath.Join(dir, "node_modules", "rhea", "package.json"))
	return err == nil
}

// PeerDir finds demo/sbpeer from the working directory by walking up to the
// module root (the go.mod of github.com/aqfleet/aq).
func PeerDir() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if b, err := os.ReadFile(filepath.Join(dir, "go.mod")); err == nil && bytes.Contains(b, []byte("module github.com/aqfleet/aq\n")) {
			return filepath.Join(dir, "demo", "sbpeer"), nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("cannot find the aq module root (go.mod) above the working directory")
		}
		dir = parent
	}
}

// Launch starts a peer; call Stop.
func Launch(opts Options) (*Peer, error) {
	dir := opts.PeerDir
	if dir == "" {
		var err error
		if dir, err = PeerDir(); err != nil {
			return nil, err
		}
	}
	if opts.Node == "" {
		node, err := exec.LookPath("node")
		if err != nil {
			return nil, err
		}
		opts.Node = node
	}
	if opts.Dir == "" {
		return nil, errors.New("Options.Dir is required with Launch")
	}
	p := &Peer{
		opts:       opts,
		script:     filepath.Join(dir, "sbpeer.js"),
		dir:        opts.Dir,
		eventsPath: filepath.Join(opts.Dir, "sbpeer-events.jsonl"),
	}
	if opts.Persist {
		p.statePath = filepath.Join(opts.Dir, "sbpeer-state.json")
	}
	if opts.TLS || opts.Admin {
		if err := p.makeCert(); err != nil {
			return nil, err
		}
	}
	if err := p.start(0, 0); err != nil {
		return nil, err
	}
	return p, nil
}

func (p *Peer) args(port, adminPort int) []string {
	a := []string{p.script, "--host", "127.0.0.1", "--port", strconv.Itoa(port), "--events", p.eventsPath}
	for _, s := range p.opts.Subs {
		a = append(a, "--sub", s)
	}
	for _, s := range p.opts.Sessions {
		a = append(a, "--sessions", s)
	}
	if p.opts.SessionWait > 0 {
		a = append(a, "--session-wait-ms", strconv.FormatInt(p.opts.SessionWait.Milliseconds(), 10))
	}
	if p.opts.LockDuration > 0 {
		a = append(a, "--lock-ms", strconv.FormatInt(p.opts.LockDuration.Milliseconds(), 10))
	}
	if p.opts.MaxDelivery > 0 {
		a = append(a, "--max-delivery", strconv.Itoa(p.opts.MaxDelivery))
	}
	if p.opts.DupWindow > 0 {
		a = append(a, "--dup-window-ms", strconv.FormatInt(p.opts.DupWindow.Milliseconds(), 10))
	}
	if p.statePath != "" {
		a = append(a, "--state", p.statePath)
	}
	if p.opts.TLS {
		a = append(a, "--tls-cert", p.certPath, "--tls-key", p.keyPath)
	}
	if p.opts.Admin {
		a = append(a, "--admin-cert", p.certPath, "--admin-key", p.keyPath, "--admin-port", strconv.Itoa(adminPort))
	}
	return a
}

func (p *Peer) start(port, adminPort int) error {
	cmd := exec.Command(p.opts.Node, p.args(port, adminPort)...)
	cmd.Dir = filepath.Dir(p.script)
	cmd.Env = p.opts.Env
	process.SetGroup(cmd)
	stderr := &syncBuffer{}
	cmd.Stderr = stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		return err
	}
	in, err := cmd.StdinPipe()
	if err != nil {
		return err
	}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start node: %w", err)
	}
	done := make(chan struct{})
	// The first stdout line says where the peer listens; no clock is needed:
	// if the peer dies first, stdout closes and the read ends.
	r := bufio.NewReader(out)
	line, rerr := r.ReadBytes('\n')
	go func() {
		_, _ = io.Copy(io.Discard, r)
		_ = cmd.Wait()
		close(done)
	}()
	var ready struct {
		Event     string `json:"event"`
		Port      int    `json:"port"`
		AdminPort int    `json:"adminPort"`
	}
	if rerr != nil || json.Unmarshal(line, &ready) != nil || ready.Event != "listening" {
		_ = cmd.Process.Kill()
		<-done
		return fmt.Errorf("the peer did not start (%v): %s", rerr, strings.TrimSpace(stderr.String()))
	}
	p.mu.Lock()
	p.port, p.adminPort, p.cmd, p.done, p.stderr, p.stdin = ready.Port, ready.AdminPort, cmd, done, stderr, in
	p.mu.Unlock()
	return nil
}

// ExpireSessionLock tells the peer that the lock on session (of subscription
// "TOPIC/NAME") has run out now, as if its holder had not renewed it: the
// session is free again, the messages its holder had locked come back, and
// the holder's link is detached with com.microsoft:session-lock-lost. It
// returns once the peer has done it, or an error when the session was not
// held (or the peer did not answer within controlWait).
func (p *Peer) ExpireSessionLock(subscription, session string) error {
	topic, name, ok := strings.Cut(subscription, "/")
	if !ok {
		return fmt.Errorf("subscription %q: want TOPIC/NAME", subscription)
	}
	res, err := p.control(map[string]string{"op": "expire-session-lock", "queue": topic + "/Subscriptions/" + name, "session": session})
	if err != nil {
		return err
	}
	if res != "expired" {
		return fmt.Errorf("the peer did not expire session %s of %s: %s", session, subscription, res)
	}
	return nil
}

// controlWait bounds the wait for the peer's answer to a control command (a
// deadlock guard: the peer answers at once).
const controlWait = 30 * time.Second

// control sends the peer one command on its stdin and waits for the
// acknowledging line in its event log; it returns the result.
func (p *Peer) control(cmd map[string]string) (string, error) {
	p.mu.Lock()
	p.controls++
	id := fmt.Sprintf("c%d-%d", os.Getpid(), p.controls)
	in := p.stdin
	p.mu.Unlock()
	if in == nil {
		return "", errors.New("the peer is not running")
	}
	cmd["id"] = id
	line, err := json.Marshal(cmd)
	if err != nil {
		return "", err
	}
	if _, err := in.Write(append(line, '\n')); err != nil {
		return "", fmt.Errorf("write to the peer: %w", err)
	}
	deadline := time.Now().Add(controlWait)
	for time.Now().Before(deadline) {
		evs, err := p.Events()
		if err != nil {
			return "", err
		}
		for _, e := range evs {
			if e.Event == "control" && e.ID == id {
				return e.Result, nil
			}
		}
		time.Sleep(5 * time.Millisecond)
	}
	return "", fmt.Errorf("the peer did not answer control command %s", id)
}

// Port is the TCP port the peer listens on (kept across Restart).
func (p *Peer) Port() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.port
}

// Addr is "127.0.0.1:PORT".
func (p *Peer) Addr() string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(p.Port())) }

// ConnectionString is a development connection string pinned to loopback:
// UseDevelopmentEmulator=true makes the SDK dial plain amqp:// to this host.
func (p *Peer) ConnectionString() string {
	return "Endpoint=sb://" + p.Addr() + ";SharedAccessKeyName=sbpeer;SharedAccessKey=c2JwZWVyLWxvY2FsLWtleQ==;UseDevelopmentEmulator=true"
}

// AdminConnectionString is a connection string for the management API
// (Options.Admin): its endpoint is the HTTPS port the peer answers the
// subscription runtime-properties read on. The SDK's admin client signs
// with its key; the peer checks only that a signature is there.
func (p *Peer) AdminConnectionString() string { return p.AdminConnectionStringFor("sbpeer") }

// AdminConnectionStringFor is AdminConnectionString signed with another key
// name: the peer's only key with Manage rights is "sbpeer", so any other
// (say "listen") is refused with 401, as the service refuses a policy
// without Manage.
func (p *Peer) AdminConnectionStringFor(keyName string) string {
	p.mu.Lock()
	port := p.adminPort
	p.mu.Unlock()
	return "Endpoint=sb://" + net.JoinHostPort("127.0.0.1", strconv.Itoa(port)) + ";SharedAccessKeyName=" + keyName + ";SharedAccessKey=c2JwZWVyLWxvY2FsLWtleQ=="
}

// AdminHTTPClient trusts the peer's self-signed certificate, for the admin
// client's transport (azcore.ClientOptions.Transport).
func (p *Peer) AdminHTTPClient() *http.Client {
	return &http.Client{Transport: &http.Transport{TLSClientConfig: p.TLSConfig()}, Timeout: 10 * time.Second}
}

// TLSConfig trusts the peer's self-signed certificate (Options.TLS). go-amqp
// would otherwise use "host:port" as the server name.
func (p *Peer) TLSConfig() *tls.Config {
	return &tls.Config{RootCAs: p.roots, ServerName: ServerName, MinVersion: tls.VersionTLS12}
}

// Kill ends the peer abruptly (SIGKILL), as a broker outage would.
func (p *Peer) Kill() {
	p.mu.Lock()
	cmd, done := p.cmd, p.done
	p.mu.Unlock()
	if cmd == nil {
		return
	}
	_ = process.KillGroup(cmd.Process.Pid)
	<-done
}

// Restart starts the peer again on the same port (after Kill, or killing it
// first). With Options.Persist it finds the messages it held.
func (p *Peer) Restart() error {
	p.Kill()
	p.mu.Lock()
	port, adminPort := p.port, p.adminPort
	p.mu.Unlock()
	return p.start(port, adminPort)
}

// Stop ends the peer gracefully (SIGTERM: it saves its state and exits),
// and kills its group if it has not exited within stopGrace.
func (p *Peer) Stop() {
	if p == nil {
		return
	}
	p.mu.Lock()
	cmd, done := p.cmd, p.done
	p.mu.Unlock()
	if cmd == nil {
		return
	}
	select {
	case <-done:
		return
	default:
	}
	_ = process.Terminate(cmd.Process)
	select {
	case <-done:
	case <-time.After(stopGrace):
		_ = process.KillGroup(cmd.Process.Pid)
		<-done
	}
}

// stopGrace is how long Stop waits for the peer to save and exit before it
// kills the peer's group.
const stopGrace = 5 * time.Second

// Exited reports whether the peer's process is gone and reaped (a nil peer,
// never started, has).
func (p *Peer) Exited() bool {
	if p == nil {
		return true
	}
	p.mu.Lock()
	done := p.done
	p.mu.Unlock()
	if done == nil {
		return true
	}
	select {
	case <-done:
		return true
	default:
		return false
	}
}

// Stderr is what the peer wrote to stderr (for failure messages).
func (p *Peer) Stderr() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.stderr == nil {
		return ""
	}
	return p.stderr.String()
}

// Event is one line of the peer's event log.
type Event struct {
	T             time.Time      `json:"t"`
	Event         string         `json:"event"` // attach, put-token, send, duplicate, deliver, disposition, redelivery, dead-letter, management, connection, ...
	Address       string         `json:"address,omitempty"`
	Role          string         `json:"role,omitempty"` // attach: the client's role (receiver/sender)
	Kind          string         `json:"kind,omitempty"` // attach: entity, rpc-request, rpc-reply
	Refused       string         `json:"refused,omitempty"`
	Audience      string         `json:"audience,omitempty"`
	Path          string         `json:"path,omitempty"`
	Type          string         `json:"type,omitempty"` // put-token: servicebus.windows.net:sastoken or jwt
	TokenHash     string         `json:"tokenHash,omitempty"`
	Status        int            `json:"status,omitempty"`
	Topic         string         `json:"topic,omitempty"`
	Queue         string         `json:"queue,omitempty"`
	MessageID     string         `json:"messageId,omitempty"`
	Seq           int64          `json:"seq,omitempty"`
	RoutedTo      []string       `json:"routedTo,omitempty"`
	App           map[string]any `json:"app,omitempty"`
	Outcome       string         `json:"outcome,omitempty"` // disposition: complete, abandon, release, dead-letter
	Result        string         `json:"result,omitempty"`  // disposition: lock-lost
	Reason        string         `json:"reason,omitempty"`  // redelivery / dead-letter
	Description   string         `json:"description,omitempty"`
	DeliveryCount int            `json:"deliveryCount,omitempty"`
	Operation     string         `json:"operation,omitempty"`
	Error         string         `json:"error,omitempty"`
	// Session is the session a session-* event, a delivery, a send or a
	// management call is about; Link the receiving link's name (attach,
	// deliver, session-*).
	Session string `json:"session,omitempty"`
	Link    string `json:"link,omitempty"`
	// Named: a session-accept of a named session (AcceptSession*), not the
	// next free one.
	Named bool `json:"named,omitempty"`
	// LockedUntil: session-accept and session-renew.
	LockedUntil time.Time `json:"lockedUntil,omitzero"`
	// ID is a control command's id (event "control").
	ID string `json:"id,omitempty"`
	// TimeoutMs: session-wait, how long the peer waits for a free session.
	TimeoutMs int64 `json:"timeoutMs,omitempty"`
}

// Events reads the event log as it stands (across restarts).
func (p *Peer) Events() ([]Event, error) {
	if p == nil {
		return nil, nil
	}
	b, err := os.ReadFile(p.eventsPath)
	if err != nil {
		return nil, err
	}
	var evs []Event
	for _, line := range bytes.Split(b, []byte("\n")) {
		if len(bytes.TrimSpace(line)) == 0 {
			continue
		}
		var e Event
		if err := json.Unmarshal(line, &e); err != nil {
			return nil, fmt.Errorf("event log line %q: %w", line, err)
		}
		evs = append(evs, e)
	}
	return evs, nil
}

// Filter returns the events for which keep is true.
func Filter(evs []Event, keep func(Event) bool) []Event {
	var out []Event
	for _, e := range evs {
		if keep(e) {
			out = append(out, e)
		}
	}
	return out
}

// TokenHash is how the peer logs a token: never the token itself.
func TokenHash(token string) string {
	sum := sha256.Sum256([]byte(token))
	return hex.EncodeToString(sum[:])[:16]
}

func (p *Peer) makeCert() error {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return err
	}
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: ServerName},
		DNSNames:              []string{ServerName},
		IPAddresses:           []net.IP{net.ParseIP("127.0.0.1")},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(24 * time.Hour),
		KeyUsage:              x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return err
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return err
	}
	p.certPath = filepath.Join(p.dir, "sbpeer-cert.pem")
	p.keyPath = filepath.Join(p.dir, "sbpeer-key.pem")
	certPEM := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
	if err := os.WriteFile(p.certPath, certPEM, 0o600); err != nil {
		return err
	}
	if err := os.WriteFile(p.keyPath, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER}), 0o600); err != nil {
		return err
	}
	p.roots = x509.NewCertPool()
	p.roots.AppendCertsFromPEM(certPEM)
	return nil
}

// syncBuffer is a bytes.Buffer safe for the child's writer and a reader.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
