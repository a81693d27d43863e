//go:build !unit

package main

import (
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// buildAQ builds the aq binary once per test binary run.
func buildAQ(tb testing.TB) string {
	tb.Helper()
	bin := filepath.Join(tb.TempDir(), "aq")
	cmd := exec.Command("go", "build", "-trimpath", "-o", bin, ".")
	cmd.Env = append(cmd.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		tb.Fatalf("go build: %v\n%s", err, out)
	}
	return bin
}

// TestBinaryExitCodes checks the real binary's exit statuses and that errors
// reach stderr as one line, through main's os.Exit.
func TestBinaryExitCodes(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary")
	}
	bin := buildAQ(t)
	home := t.TempDir()
	env := []string{"HOME=" + home, "AQ_HOME=" + filepath.Join(home, "aq"), "PATH=/usr/bin:/bin"}
	for _, tc := range []struct {
		args []string
		env  []string
		code int
	}{
		{[]string{"version"}, nil, 0},
		{[]string{"nope"}, nil, 2},
		{[]string{"config"}, []string{"AQ_HEARTBEAT_SEC=120"}, 2},
	} {
		cmd := exec.Command(bin, tc.args...)
		cmd.Env = append(append([]string{}, env...), tc.env...)
		var stderr strings.Builder
		cmd.Stderr = &stderr
		err := cmd.Run()
		code := 0
		if ee, ok := err.(*exec.ExitError); ok {
			code = ee.ExitCode()
		} else if err != nil {
			t.Fatal(err)
		}
		if code != tc.code {
			t.Errorf("aq %v: exit %d, want %d (stderr %q)", tc.args, code, tc.code, stderr.String())
		}
		if tc.code != 0 && strings.Count(stderr.String(), "\n") != 1 {
			t.Errorf("aq %v: stderr must be one line, got %q", tc.args, stderr.String())
		}
	}
}

// BenchmarkVersionStartup measures a whole `aq version` process: exec, Go
// runtime start, command tree construction, output.
func BenchmarkVersionStartup(b *testing.B) {
	bin := buildAQ(b)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if out, err := exec.Command(bin, "version").Output(); err != nil || len(out) == 0 {
			b.Fatalf("aq version: %v", err)
		}
	}
}
