package sandbox

import (
	"bufio"
	"bytes"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/aqfleet/aq/internal/safefs"
)

// The job's own directory (Policy.JobDir) holds, for as long as the run:
// home/ (the engine's $HOME, with copies of its login files), tmp/ (its
// $TMPDIR), state/ (files aq and the engine exchange), cache/<n>/ (the
// writable layers of the shared caches; on Linux, where aq may mount, a
// tmpfs of the job's own: cachelayer_linux.go), etc/ (the sandbox's passwd and
// group, an empty file that hides files) and root/ (the empty directory a
// full sandbox's / is built on).

// FreshJobDir makes dir, a job's own directory, afresh for a run: what a
// crashed run left there (a home whose login copies an engine replaced
// with links or FIFOs) is removed first — never followed — and dir is
// made anew, 0700. Repair rounds of one run keep the directory; a new
// run (a recovered attempt) never sees what an earlier engine planted.
func FreshJobDir(dir string) error {
	if err := removeTree(dir); err != nil {
		return fmt.Errorf("remove what a previous run left in the job's directory %s: %w", dir, err)
	}
	if err := os.MkdirAll(filepath.Dir(dir), 0o700); err != nil {
		return err
	}
	if err := os.Mkdir(dir, 0o700); err != nil { // exclusive: nobody else's
		return fmt.Errorf("make the job's directory afresh: %w", err)
	}
	return nil
}

// makeJobDir makes the job's directory, 0700, and what is in it; the
// files aq writes there are created exclusively (internal/safefs).
func makeJobDir(p Policy) error {
	for _, d := range []string{p.JobDir, p.JobHome(), p.JobTmp(), p.StateDir(),
		filepath.Join(p.JobDir, "etc"), filepath.Join(p.JobDir, "root"), filepath.Join(p.JobDir, "cache")} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return err
		}
	}
	return safefs.WriteFile("job", p.JobDir, "etc/empty", nil, 0o444)
}

// replaceEntry returns the colon-separated database db without the lines
// whose field idx is id or whose name is the new entry's, and with entry.
func replaceEntry(db []byte, idx int, id, entry string) []byte {
	name, _, _ := strings.Cut(entry, ":")
	var out bytes.Buffer
	sc := bufio.NewScanner(bytes.NewReader(db))
	for sc.Scan() {
		line := sc.Text()
		f := strings.Split(line, ":")
		if len(f) > idx && (f[idx] == id || f[0] == name) {
			continue
		}
		out.WriteString(line + "\n")
	}
	out.WriteString(entry + "\n")
	return out.Bytes()
}

// Remove removes the job's directory and everything the engine left in it
// (directories it made unreadable included).
func (j *Jail) Remove() error { return removeTree(j.p.JobDir) }

// RemoveJobDir removes a job's directory a run left behind (aq gc), as
// Remove does.
func RemoveJobDir(dir string) error { return removeTree(dir) }

func removeTree(dir string) error {
	// The caches' layers' tmpfs first (Linux, where aq mounted one): its
	// pages go with it, and the tree below can then be removed.
	unmountCacheLayer(filepath.Join(dir, "cache"))
	if err := os.RemoveAll(dir); err == nil {
		return nil
	}
	// Something below refused (a directory made 0000, an overlay's work
	// directory): open every directory up to its owner, then again.
	_ = filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if d != nil && d.IsDir() {
			_ = os.Chmod(path, 0o700)
		}
		return nil
	})
	return os.RemoveAll(dir)
}
