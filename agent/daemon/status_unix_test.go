//go:build unix

package daemon_test

import (
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/aqfleet/aq/agent/daemon"
	"github.com/aqfleet/aq/internal/safefs"
)

// TestReadStatusRefusesWhatIsNotAFile: a FIFO or a link in the status
// file's place is refused at once (os.ReadFile blocked on the FIFO until
// a writer came, and followed the link); a missing file is still
// fs.ErrNotExist.
func TestReadStatusRefusesWhatIsNotAFile(t *testing.T) {
	dir := t.TempDir()
	if _, err := daemon.ReadStatus(dir); !os.IsNotExist(err) {
		t.Fatalf("no status: %v, want not-exist", err)
	}
	p := filepath.Join(dir, daemon.StatusFile)
	if err := syscall.Mkfifo(p, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := daemon.ReadStatus(dir); err == nil {
		t.Fatal("a FIFO read as a status")
	} else if _, ok := safefs.AsRefused(err); !ok {
		t.Fatalf("a FIFO: %v, want a refusal", err)
	}
	os.Remove(p)
	target := filepath.Join(t.TempDir(), "daemon.json")
	if err := os.WriteFile(target, []byte(`{"stage":"running"}`), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(target, p); err != nil {
		t.Fatal(err)
	}
	if _, err := daemon.ReadStatus(dir); err == nil {
		t.Fatal("a link followed to a status elsewhere")
	}
}
