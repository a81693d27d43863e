package sandbox

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"sync"

	"github.com/aqfleet/aq/internal/atomicfile"
)

// The job's own directory (Policy.JobDir) holds, for as long as the run:
// home/ (the engine's $HOME, with copies of its login files), tmp/ (its
// $TMPDIR), state/ (files aq and the engine exchange), cache/<n>/ (the
// writable layers of the shared caches), etc/ (the sandbox's passwd and
// group, an empty file that hides files) and root/ (the empty directory a
// full sandbox's / is built on).

// makeJobDir makes the job's directory, 0700, and what is in it.
func makeJobDir(p Policy) error {
	for _, d := range []string{p.JobDir, p.JobHome(), p.JobTmp(), p.StateDir(),
		filepath.Join(p.JobDir, "etc"), filepath.Join(p.JobDir, "root"), filepath.Join(p.JobDir, "cache")} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return err
		}
	}
	empty := filepath.Join(p.JobDir, "etc", "empty")
	if _, err := os.Stat(empty); errors.Is(err, fs.ErrNotExist) {
		if err := os.WriteFile(empty, nil, 0o444); err != nil {
			return err
		}
	}
	return nil
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

// LoginFile is one file of an engine's login that the job's home gets a
// copy of (engines.LoginFiles says which).
type LoginFile struct {
	// Src is the file on the host; Rel is where the copy goes, relative to
	// the job's home.
	Src string
	Rel string
	// Rotates: the engine may rewrite it (an OAuth token refreshed, the
	// refresh token rotated): WriteBack carries the new content to Src.
	Rotates bool
}

// Logins are the login files copied into one job's home.
type Logins struct {
	home   string
	copied []copiedLogin
}

type copiedLogin struct {
	f   LoginFile
	sum [32]byte // Src's content when copied
}

// loginLock serialises write-backs within this aq (two jobs refreshing
// the same login).
var loginLock sync.Mutex

// CopyLogins copies files that exist into the job's home (0600; their
// directories 0700) and returns what was copied, for WriteBack.
func (j *Jail) CopyLogins(files []LoginFile) (*Logins, error) {
	l := &Logins{home: j.p.JobHome()}
	for _, f := range files {
		b, err := os.ReadFile(f.Src)
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return l, fmt.Errorf("copy the engine's login %s: %w", f.Src, err)
		}
		dst := filepath.Join(l.home, f.Rel)
		if err := os.MkdirAll(filepath.Dir(dst), 0o700); err != nil {
			return l, err
		}
		if err := os.WriteFile(dst, b, 0o600); err != nil {
			return l, fmt.Errorf("copy the engine's login %s: %w", f.Src, err)
		}
		l.copied = append(l.copied, copiedLogin{f: f, sum: sha256.Sum256(b)})
	}
	return l, nil
}

// WriteBack carries what the engine rewrote in its copies of rotating
// login files back to the originals, so that a refreshed token (and a
// rotated refresh token, which invalidates the one the original holds)
// is not lost with the job's home. An original that changed since the
// copy (another job, or the user, refreshed it meanwhile) is kept as it
// is: the newer of the two cannot be told, and the user's own wins. It
// returns one note per file written back or kept.
func (l *Logins) WriteBack() []string {
	if l == nil {
		return nil
	}
	loginLock.Lock()
	defer loginLock.Unlock()
	var notes []string
	for i, c := range l.copied {
		if !c.f.Rotates {
			continue
		}
		now, err := os.ReadFile(filepath.Join(l.home, c.f.Rel))
		if err != nil || len(bytes.TrimSpace(now)) == 0 || sha256.Sum256(now) == c.sum {
			continue // unchanged, or emptied: nothing worth carrying back
		}
		orig, err := os.ReadFile(c.f.Src)
		if err != nil {
			notes = append(notes, fmt.Sprintf("login %s: not written back (%v)", c.f.Src, err))
			continue
		}
		if sha256.Sum256(orig) != c.sum {
			notes = append(notes, fmt.Sprintf("login %s: changed on the host while the job ran; kept, the job's refreshed copy dropped", c.f.Src))
			continue
		}
		mode := os.FileMode(0o600)
		if st, err := os.Stat(c.f.Src); err == nil {
			mode = st.Mode().Perm() &^ 0o077 // never wider than the owner's
		}
		if err := atomicfile.WriteFile(c.f.Src, now, mode); err != nil {
			notes = append(notes, fmt.Sprintf("login %s: not written back (%v)", c.f.Src, err))
			continue
		}
		l.copied[i].sum = sha256.Sum256(now)
		notes = append(notes, fmt.Sprintf("login %s: the engine refreshed it; written back", c.f.Src))
	}
	return notes
}
