package cli

import (
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/aqfleet/aq/internal/testenv"
)

// TestAwaitStop: the command's own exit wins until the stop began; then
// it has the bound, and past it it is abandoned (exit 1, one line). For
// aq daemon the bound starts at the second signal (the first drains).
func TestAwaitStop(t *testing.T) {
	testenv.Slow(t, "runs commands end to end with real git and a coordinator")
	for _, c := range []struct {
		name    string
		stage   int
		signals int
		returns bool // the command returns once cancelled
		want    int
		line    bool
	}{
		{name: "no signal", stage: 1, returns: true, want: 0},
		{name: "returns after the signal", stage: 1, signals: 1, returns: true, want: 0},
		{name: "blocked: abandoned", stage: 1, signals: 1, want: 1, line: true},
		{name: "daemon drain: not bounded", stage: 2, signals: 1, want: -1},
		{name: "daemon stop stage: abandoned", stage: 2, signals: 2, want: 1, line: true},
	} {
		t.Run(c.name, func(t *testing.T) {
			done := make(chan int, 1)
			sigs := make(chan os.Signal, 4)
			cancelled := make(chan struct{})
			cancel := func() {
				close(cancelled)
				if c.returns {
					done <- 0
				}
			}
			if c.signals == 0 {
				done <- 0
			}
			for range c.signals {
				sigs <- syscall.SIGTERM
			}
			var out strings.Builder
			got := make(chan int, 1)
			go func() { got <- awaitStop(done, sigs, cancel, c.stage, 50*time.Millisecond, "aq run", &out) }()
			select {
			case code := <-got:
				if c.want == -1 {
					t.Fatalf("returned %d while the daemon drains: the bound must wait for the stop stage", code)
				}
				if code != c.want {
					t.Errorf("exit %d, want %d", code, c.want)
				}
			case <-time.After(2 * time.Second): // far past the 50ms bound
				if c.want != -1 {
					t.Fatal("awaitStop did not return")
				}
			}
			if c.line != strings.Contains(out.String(), "aq run did not stop within 50ms of SIGTERM") {
				t.Errorf("line %q", out.String())
			}
		})
	}
}

func TestStopBoundAndStage(t *testing.T) {
	env := map[string]string{}
	get := func(k string) string { return env[k] }
	if d, err := stopBound(get); err != nil || d != defaultStopBound {
		t.Errorf("default: %v %v", d, err)
	}
	env["AQ_STOP_BOUND"] = "5s"
	if d, err := stopBound(get); err != nil || d != 5*time.Second {
		t.Errorf("5s: %v %v", d, err)
	}
	for _, bad := range []string{"soon", "-1s", "0"} {
		env["AQ_STOP_BOUND"] = bad
		if _, err := stopBound(get); err == nil || !strings.Contains(err.Error(), "AQ_STOP_BOUND") {
			t.Errorf("%q: %v", bad, err)
		}
	}
	for args, want := range map[string]int{"daemon": 2, "--home /srv/aq daemon": 2, "run --once": 1, "": 1, "-v": 1} {
		if got := stopStage(strings.Fields(args)); got != want {
			t.Errorf("stopStage(%q) = %d, want %d", args, got, want)
		}
	}
}
