package testenv

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestMain(m *testing.M) { os.Exit(Main(m)) }

// make race builds aq once and names it in PrebuiltEnv: a test binary
// takes it instead of building its own, and a wrong name is an error that
// says so rather than a silent build.
func TestBuildTakesThePrebuiltBinary(t *testing.T) {
	bin := filepath.Join(t.TempDir(), "aq")
	WriteFile(t, bin, "#!/bin/sh\n")
	for _, tc := range []struct {
		name, env, wantErr string
	}{
		{"a file", bin, ""},
		{"missing", bin + ".gone", PrebuiltEnv},
		{"a folder", filepath.Dir(bin), "not a built aq binary"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv(PrebuiltEnv, tc.env)
			got, err := build()
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("build() = %q, %v; want an error naming %q", got, err, tc.wantErr)
				}
				return
			}
			if err != nil || got != tc.env {
				t.Fatalf("build() = %q, %v; want %q", got, err, tc.env)
			}
		})
	}
}
