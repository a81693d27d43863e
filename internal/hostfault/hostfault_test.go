//go:build unix

package hostfault

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

func TestIs(t *testing.T) {
	for _, c := range []struct {
		err  error
		want bool
	}{
		{&fs.PathError{Op: "write", Path: "/h/x", Err: syscall.ENOSPC}, true},
		{fmt.Errorf("write sidecar: %w", &fs.PathError{Op: "write", Path: "/h/x", Err: syscall.EROFS}), true},
		{syscall.EIO, true},
		{&Error{Dir: "/h", Err: errors.New("odd")}, true},
		{&fs.PathError{Op: "open", Path: "/h/x", Err: fs.ErrNotExist}, false},
		{errors.New("script exited 3"), false},
		{nil, false},
	} {
		if got := Is(c.err); got != c.want {
			t.Errorf("Is(%v) = %v, want %v", c.err, got, c.want)
		}
	}
}

func TestProbe(t *testing.T) {
	dir := t.TempDir()
	if err := Probe(filepath.Join(dir, "state")); err != nil {
		t.Fatalf("a writable dir: %v", err)
	}
	if ents, _ := os.ReadDir(filepath.Join(dir, "state")); len(ents) != 0 {
		t.Fatalf("the probe left %v", ents)
	}
	file := filepath.Join(dir, "file")
	os.WriteFile(file, nil, 0o600)
	err := Probe(filepath.Join(file, "state"))
	if err == nil || !Is(err) || !strings.HasPrefix(err.Error(), "this host cannot write "+filepath.Join(file, "state")+": ") {
		t.Fatalf("under a file: %v", err)
	}
}
