package fleetdemo

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// peer is the local AMQP 1.0 stand-in for Azure Service Bus (demo/sbpeer,
// Node + rhea) as a child process on 127.0.0.1. demo/sbpeer/sbpeertest does
// the same for tests; it imports package testing, which the aq binary must
// not link, hence this small launcher.
type peer struct {
	cmd    *exec.Cmd
	port   int
	events string
	done   chan struct{}
	stderr bytes.Buffer
}

// peerMissing says why the peer cannot run with this environment ("" when it
// can): node on PATH, and demo/sbpeer with its node_modules installed.
func peerMissing(env []string, dir string) string {
	if _, err := lookPath("node", env); err != nil {
		return "Node.js (node) is not on PATH"
	}
	if dir == "" {
		return "demo/sbpeer was not found (run aq demo from a clone of aq)"
	}
	if _, err := os.Stat(filepath.Join(dir, "node_modules", "rhea", "package.json")); err != nil {
		return "the peer's packages are not installed (run: make sbpeer)"
	}
	return ""
}

// startPeer runs the peer with one subscription per factory on topic, each
// with the correlation rule targetFactoryId = '<factory>'.
func startPeer(dir, work string, env []string, topic string, factories []string) (*peer, error) {
	node, err := lookPath("node", env)
	if err != nil {
		return nil, err
	}
	p := &peer{events: filepath.Join(work, "sbpeer-events.jsonl"), done: make(chan struct{})}
	args := []string{filepath.Join(dir, "sbpeer.js"), "--host", "127.0.0.1", "--port", "0", "--events", p.events,
		"--lock-ms", "30000", "--max-delivery", "10"}
	for _, f := range factories {
		args = append(args, "--sub", topic+"/"+f)
	}
	cmd := exec.Command(node, args...)
	cmd.Dir = dir
	cmd.Env = env
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Stderr = &p.stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start node: %w", err)
	}
	p.cmd = cmd
	r := bufio.NewReader(out)
	line, rerr := r.ReadBytes('\n') // the first line says where it listens
	go func() {
		_, _ = io.Copy(io.Discard, r)
		_ = cmd.Wait()
		close(p.done)
	}()
	var ready struct {
		Event string `json:"event"`
		Port  int    `json:"port"`
	}
	if rerr != nil || json.Unmarshal(line, &ready) != nil || ready.Event != "listening" {
		p.stop()
		return nil, fmt.Errorf("the peer did not start: %s", strings.TrimSpace(p.stderr.String()))
	}
	p.port = ready.Port
	return p, nil
}

// connectionString is a development connection string pinned to loopback.
func (p *peer) connectionString() string {
	return "Endpoint=sb://127.0.0.1:" + strconv.Itoa(p.port) + ";SharedAccessKeyName=sbpeer;SharedAccessKey=c2JwZWVyLWxvY2FsLWtleQ==;UseDevelopmentEmulator=true"
}

// stop ends the peer: SIGTERM (it saves and exits), SIGKILL of its group
// after 5 s.
func (p *peer) stop() {
	if p == nil || p.cmd == nil || p.cmd.Process == nil {
		return
	}
	select {
	case <-p.done:
		return
	default:
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(5 * time.Second):
		_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
		<-p.done
	}
}

// exited reports whether the peer's process is gone (and reaped).
func (p *peer) exited() bool {
	if p == nil || p.cmd == nil {
		return true
	}
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// peerEvent is one line of the peer's event log (the fields the demo reads).
type peerEvent struct {
	Event     string         `json:"event"`
	MessageID string         `json:"messageId"`
	RoutedTo  []string       `json:"routedTo"`
	Queue     string         `json:"queue"`
	Outcome   string         `json:"outcome"`
	App       map[string]any `json:"app"`
}

// peerEvents reads the event log as it stands.
func (p *peer) peerEvents() []peerEvent {
	if p == nil {
		return nil
	}
	b, err := os.ReadFile(p.events)
	if err != nil {
		return nil
	}
	var evs []peerEvent
	for _, line := range bytes.Split(b, []byte("\n")) {
		var e peerEvent
		if len(bytes.TrimSpace(line)) > 0 && json.Unmarshal(line, &e) == nil {
			evs = append(evs, e)
		}
	}
	return evs
}

// lookPath finds an executable in env's PATH (not this process's: a test
// may hide node from the demo).
func lookPath(name string, env []string) (string, error) {
	path := ""
	for _, kv := range env {
		if v, ok := strings.CutPrefix(kv, "PATH="); ok {
			path = v
		}
	}
	for _, dir := range filepath.SplitList(path) {
		if dir == "" {
			dir = "."
		}
		p := filepath.Join(dir, name)
		if st, err := os.Stat(p); err == nil && !st.IsDir() && st.Mode()&0o111 != 0 {
			return p, nil
		}
	}
	return "", errors.New(name + " is not on PATH")
}
