package demo

import (
	"bytes"
	"os"
	"path/filepath"
)

// FindPeerDir finds demo/sbpeer (the local AMQP peer) in a checkout of aq:
// walking up from the working directory, then from the directory of exe
// (links resolved; bin/aq's parent in a clone), to the module root. "" when
// neither is inside a checkout with demo/sbpeer/sbpeer.js.
func FindPeerDir(exe string) string {
	var starts []string
	if wd, err := os.Getwd(); err == nil {
		starts = append(starts, wd)
	}
	if exe != "" {
		if p, err := filepath.EvalSymlinks(exe); err == nil {
			starts = append(starts, filepath.Dir(p))
		}
	}
	for _, dir := range starts {
		for {
			if b, err := os.ReadFile(filepath.Join(dir, "go.mod")); err == nil && bytes.Contains(b, []byte("module github.com/aqfleet/aq\n")) {
				if _, err := os.Stat(filepath.Join(dir, "demo", "sbpeer", "sbpeer.js")); err == nil {
					return filepath.Join(dir, "demo", "sbpeer")
				}
			}
			parent := filepath.Dir(dir)
			if parent == dir {
				break
			}
			dir = parent
		}
	}
	return ""
}
