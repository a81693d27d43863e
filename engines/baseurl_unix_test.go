//go:build unix

package engines

import (
	"os"
	"path/filepath"
	"syscall"
	"testing"
)

// TestBaseURLsFIFO: a settings file that is a FIFO (an open would block
// until someone writes) sets no base URL, and BaseURLs returns.
func TestBaseURLsFIFO(t *testing.T) {
	home := t.TempDir()
	cfg := filepath.Join(home, ".codex", "config.toml")
	if err := os.MkdirAll(filepath.Dir(cfg), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mkfifo(cfg, 0o600); err != nil {
		t.Fatal(err)
	}
	if b := BaseURLs("codex", []string{"HOME=" + home}); len(b) != 0 {
		t.Errorf("a FIFO config.toml: %v", b)
	}
}
