// Package sbpeertest runs demo/sbpeer — the local AMQP 1.0 stand-in for Azure
// Service Bus — for tests and benchmarks: Start launches it through
// sbpeerproc (the one launcher, which the demo and selftest use too), stops
// it when the test ends, and skips the test, saying how to fix it, when node
// or the peer's packages are missing; nothing else is a reason to skip.
package sbpeertest

import (
	"os/exec"
	"testing"

	"github.com/aqfleet/aq/demo/sbpeer/sbpeerproc"
)

// The launcher's types, under the names tests have always used.
type (
	Options = sbpeerproc.Options
	Peer    = sbpeerproc.Peer
	Event   = sbpeerproc.Event
)

// ServerName is the TLS server name in the peer's certificate.
const ServerName = sbpeerproc.ServerName

var (
	// Launch starts a peer without a testing.TB; call Stop.
	Launch = sbpeerproc.Launch
	// PeerDir finds demo/sbpeer above the working directory.
	PeerDir = sbpeerproc.PeerDir
	// Filter returns the events for which keep is true.
	Filter = sbpeerproc.Filter
	// TokenHash is how the peer logs a token: never the token itself.
	TokenHash = sbpeerproc.TokenHash
)

// Start launches a peer for tb and stops it when tb ends. It skips tb when
// node or the peer's node_modules are missing, and fails it on anything else.
func Start(tb testing.TB, opts Options) *Peer {
	tb.Helper()
	if testing.Short() {
		tb.Skip("skipped under -short: starts the Node AMQP peer (make test runs it)")
	}
	if reason := Missing(); reason != "" {
		tb.Skip(reason)
	}
	if opts.Dir == "" {
		opts.Dir = tb.TempDir()
	}
	p, err := sbpeerproc.Launch(opts)
	if err != nil {
		tb.Fatalf("sbpeer: %v", err)
	}
	tb.Cleanup(p.Stop)
	return p
}

// Missing says why the peer cannot run here, and how to fix it; "" when it can.
func Missing() string {
	if _, err := exec.LookPath("node"); err != nil {
		return "sbpeer needs node (Node.js >= 18) on PATH: install it (e.g. apt-get install nodejs npm), then run 'make sbpeer'"
	}
	dir, err := sbpeerproc.PeerDir()
	if err != nil {
		return "sbpeer: " + err.Error()
	}
	if !sbpeerproc.Installed(dir) {
		return "sbpeer's packages are not installed: run 'npm ci --prefix demo/sbpeer' (or 'make sbpeer') in the module root"
	}
	return ""
}
