package local_test

import (
	"bytes"
	"log/slog"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/aqfleet/aq/agent/config"
	"github.com/aqfleet/aq/agent/local"
	"github.com/aqfleet/aq/internal/process"
	"github.com/aqfleet/aq/internal/sandbox"
	"github.com/aqfleet/aq/internal/secrets"
	"github.com/aqfleet/aq/internal/testenv"
)

// TestMain lets the test binary stand in for aq where a test gives the
// runner a supervisor and a sandbox (the sandboxed benchmark): re-executed,
// it is the sandbox's init or the engine's supervisor.
func TestMain(m *testing.M) {
	if code, ok := sandbox.MaybeInit(); ok {
		os.Exit(code)
	}
	if code, ok := process.MaybeSupervise(); ok {
		os.Exit(code)
	}
	os.Exit(testenv.Main(m))
}

// newAgent builds the local agent the way `aq run` does, on h, with a short
// kill ladder. Its log goes to the test's log (benchmarks: discarded).
func newAgent(tb testing.TB, h *testenv.Home, parts ...local.Parts) *local.Agent {
	tb.Helper()
	// MARK reaches the engines as an operator passes a variable
	// (AQ_ENGINE_ENV): an engine's environment is built, not inherited.
	cfg := &config.Config{Home: h.Dir, RepoBase: h.RepoBase, KillGrace: 200 * time.Millisecond, Poll: time.Second, WorktreePool: 1,
		EngineEnv: []string{"MARK"}}
	var p local.Parts
	if len(parts) > 0 {
		p = parts[0]
	}
	a, err := local.New(cfg, testLogger(tb), secrets.FromEnviron(), p)
	if err != nil {
		tb.Fatal(err)
	}
	return a
}

// testLogger writes slog lines to the test's log, so a failing test shows
// what aq did; benchmarks discard them.
func testLogger(tb testing.TB) *slog.Logger {
	if _, ok := tb.(*testing.B); ok {
		return slog.New(slog.DiscardHandler)
	}
	w := &tbWriter{tb: tb}
	tb.Cleanup(w.stop)
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

// tbWriter forwards whole lines to tb.Log until the test ends (a late line
// from a goroutine must not log after the test returned).
type tbWriter struct {
	mu   sync.Mutex
	tb   testing.TB
	done bool
	buf  bytes.Buffer
}

func (w *tbWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.done {
		return len(p), nil
	}
	w.buf.Write(p)
	for {
		line, err := w.buf.ReadString('\n')
		if err != nil {
			w.buf.WriteString(line)
			break
		}
		w.tb.Log(line[:len(line)-1])
	}
	return len(p), nil
}

func (w *tbWriter) stop() {
	w.mu.Lock()
	w.done = true
	w.mu.Unlock()
}
