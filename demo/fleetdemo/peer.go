package fleetdemo

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/aqfleet/aq/demo/sbpeer/sbpeerproc"
)

// peerMissing says why the peer cannot run with this environment ("" when it
// can): node on PATH, and demo/sbpeer with its node_modules installed.
func peerMissing(env []string, dir string) string {
	if _, err := lookPath("node", env); err != nil {
		return "Node.js (node) is not on PATH"
	}
	if dir == "" {
		return "demo/sbpeer was not found (run aq demo from a clone of aq)"
	}
	if !sbpeerproc.Installed(dir) {
		return "the peer's packages are not installed (run: make sbpeer)"
	}
	return ""
}

// startPeer runs the local AMQP 1.0 stand-in for Azure Service Bus
// (demo/sbpeer) with one subscription per factory on topic, each with the
// correlation rule targetFactoryId = '<factory>'.
func startPeer(dir, work string, env []string, topic string, factories []string) (*sbpeerproc.Peer, error) {
	node, err := lookPath("node", env)
	if err != nil {
		return nil, err
	}
	opts := sbpeerproc.Options{Dir: work, Node: node, PeerDir: dir, Env: env, LockDuration: 30 * time.Second, MaxDelivery: 10}
	for _, f := range factories {
		opts.Subs = append(opts.Subs, topic+"/"+f)
	}
	return sbpeerproc.Launch(opts)
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
