package cli

import (
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/aqfleet/aq/internal/abandon"
)

// TestAbandonMarksRunningJobs: when aq abandons a blocked command, the jobs
// it runs are marked for the aq that recovers them (interrupted, not
// crash), and its line names them.
func TestAbandonMarksRunningJobs(t *testing.T) {
	home := t.TempDir()
	done := abandon.Running(home, "job-blocked")
	defer done()
	sigs := make(chan os.Signal, 1)
	sigs <- syscall.SIGTERM
	var out strings.Builder
	code := awaitStop(make(chan int), sigs, func() {}, 1, 50*time.Millisecond, "aq run", &out)
	if code != 1 || !strings.Contains(out.String(), "the next aq run recovers job-blocked and fails it interrupted") {
		t.Fatalf("exit %d, line %q", code, out.String())
	}
	why, ok := abandon.Take(home, "job-blocked", os.Getpid())
	if !ok || why != "aq run was stopped by SIGTERM and abandoned the step it was in after AQ_STOP_BOUND (50ms)" {
		t.Fatalf("mark: %q %v", why, ok)
	}
}
