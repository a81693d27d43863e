package sandbox

// The engine's login in the job's home: copied in, and what a refresh
// changed written back — only as a login, by field (docs/sandbox.md, "The
// engine's login"). The job's home is the engine's to write: the copies
// are created exclusively there (internal/safefs), and the copy written
// back is read as a regular file of at most safefs.MaxLogin bytes, of the
// original's format, in which only the fields a refresh may change
// changed; else nothing is written back.

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"reflect"
	"slices"
	"sort"
	"strings"
	"sync"

	"github.com/pelletier/go-toml/v2"

	"github.com/aqfleet/aq/internal/atomicfile"
	"github.com/aqfleet/aq/internal/safefs"
)

// LoginFile is one file of an engine's login that the job's home gets a
// copy of (engines.LoginOf says which).
type LoginFile struct {
	// Src is the file on the host; Rel is where the copy goes, relative to
	// the job's home.
	Src string
	Rel string
	// Rotates: the engine may rewrite it (an OAuth token refreshed, the
	// refresh token rotated): WriteBack carries the new content to Src.
	Rotates bool
	// Refresh are the fields a refresh may change, dotted paths ("*" one
	// key, "**" any keys below): only these may differ between the copy
	// and the original for the copy to be written back.
	Refresh []string
}

// format is the login file's format, by its name: JSON or TOML.
func (f LoginFile) format() string {
	if strings.HasSuffix(f.Rel, ".toml") {
		return "TOML"
	}
	return "JSON"
}

// Logins are the login files copied into one job's home.
type Logins struct {
	home   string
	copied []copiedLogin
}

type copiedLogin struct {
	f    LoginFile
	orig []byte // Src's content when copied (or last written back)
}

// loginLock serialises write-backs within this aq (two jobs refreshing
// the same login).
var loginLock sync.Mutex

// CopyLogins copies files that exist into the job's home (0600; their
// directories 0700), each created exclusively — whatever an earlier
// engine left in its place is unlinked, never followed — and returns
// what was copied, for WriteBack.
func (j *Jail) CopyLogins(files []LoginFile) (*Logins, error) {
	l := &Logins{home: j.p.JobHome()}
	if len(files) == 0 {
		return l, nil
	}
	home, err := safefs.OpenRoot("home", l.home)
	if err != nil {
		return l, fmt.Errorf("copy the engine's login: the job's home: %w", err)
	}
	defer home.Close()
	for _, f := range files {
		b, err := os.ReadFile(f.Src)
		if os.IsNotExist(err) {
			continue
		}
		if err != nil {
			return l, fmt.Errorf("copy the engine's login %s: %w", f.Src, err)
		}
		if err := home.WriteFile(f.Rel, b, 0o600); err != nil {
			return l, fmt.Errorf("copy the engine's login %s: %w", f.Src, err)
		}
		l.copied = append(l.copied, copiedLogin{f: f, orig: b})
	}
	return l, nil
}

// WriteBack carries what the engine rewrote in its copies of rotating
// login files back to the originals, so that a refreshed token (and a
// rotated refresh token, which invalidates the one the original holds)
// is not lost with the job's home. A copy is written back only as a
// login: a regular file of at most safefs.MaxLogin bytes, of the
// original's format, in which only its Refresh fields changed — the
// account's identity and everything else as copied. An original that
// changed since the copy (another job, or the user, refreshed it
// meanwhile) is kept as it is: the newer of the two cannot be told, and
// the user's own wins. It returns one note per file written back or kept,
// and the copies refused as files (a link, a FIFO, too big).
func (l *Logins) WriteBack() (notes []string, refused []*safefs.Refused) {
	if l == nil || len(l.copied) == 0 {
		return nil, nil
	}
	loginLock.Lock()
	defer loginLock.Unlock()
	home, err := safefs.OpenRoot("home", l.home)
	if err != nil {
		return []string{"the engine's copy of its login was not written back: the job's home: " + err.Error()}, nil
	}
	defer home.Close()
	for i, c := range l.copied {
		if !c.f.Rotates {
			continue
		}
		now, err := home.ReadFile(c.f.Rel, safefs.MaxLogin)
		if ref, ok := safefs.AsRefused(err); ok {
			refused = append(refused, ref)
			notes = append(notes, fmt.Sprintf("the engine's copy of its login was not written back: %s is %s", c.f.Rel, ref.Why))
			continue
		}
		if err != nil || len(bytes.TrimSpace(now)) == 0 || bytes.Equal(now, c.orig) {
			continue // gone, unchanged, or emptied: nothing worth carrying back
		}
		if why := loginChange(c.f, c.orig, now); why != "" {
			notes = append(notes, fmt.Sprintf("the engine's copy of its login was not written back: %s: %s", c.f.Rel, why))
			continue
		}
		orig, err := os.ReadFile(c.f.Src)
		if err != nil {
			notes = append(notes, fmt.Sprintf("login %s: not written back (%v)", c.f.Src, err))
			continue
		}
		if !bytes.Equal(orig, c.orig) {
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
		l.copied[i].orig = now
		notes = append(notes, fmt.Sprintf("login %s: the engine refreshed it; written back", c.f.Src))
	}
	return notes, refused
}

// loginChange says why now is not the login orig with only f's Refresh
// fields changed ("" when it is).
func loginChange(f LoginFile, orig, now []byte) string {
	format := f.format()
	parse := func(b []byte) (map[string]any, error) {
		var m map[string]any
		var err error
		if format == "TOML" {
			err = toml.Unmarshal(b, &m)
		} else {
			d := json.NewDecoder(bytes.NewReader(b))
			d.UseNumber()
			if err = d.Decode(&m); err == nil && d.More() {
				err = fmt.Errorf("more than one JSON value")
			}
		}
		if err == nil && m == nil {
			err = fmt.Errorf("not an object")
		}
		return m, err
	}
	was, err := parse(orig)
	if err != nil {
		return "the original is not " + format + " (" + err.Error() + ")"
	}
	is, err := parse(now)
	if err != nil {
		return "not " + format + " like the original"
	}
	var changed []string
	diffFields(nil, was, is, f.Refresh, &changed)
	if len(changed) == 0 {
		return ""
	}
	sort.Strings(changed)
	if len(changed) > 5 {
		changed = append(changed[:5], "…")
	}
	return "fields a refresh does not change changed: " + strings.Join(changed, ", ")
}

// diffFields adds to changed the dotted paths below path where was and is
// differ, other than the refreshable ones (a refreshable field may take a
// new scalar value, or appear or go).
func diffFields(path []string, was, is map[string]any, refresh []string, changed *[]string) {
	keys := map[string]bool{}
	for k := range was {
		keys[k] = true
	}
	for k := range is {
		keys[k] = true
	}
	for k := range keys {
		p := append(slices.Clip(path), k)
		a, inA := was[k]
		b, inB := is[k]
		if refreshable(p, refresh) {
			if inB && !scalar(b) && !refreshableBelow(p, refresh) {
				*changed = append(*changed, strings.Join(p, "."))
			}
			continue
		}
		am, aMap := a.(map[string]any)
		bm, bMap := b.(map[string]any)
		switch {
		case inA && inB && aMap && bMap:
			diffFields(p, am, bm, refresh, changed)
		case inA != inB || !reflect.DeepEqual(a, b):
			*changed = append(*changed, strings.Join(p, "."))
		}
	}
}

func scalar(v any) bool {
	switch v.(type) {
	case map[string]any, []any:
		return false
	}
	return true
}

// refreshable says whether the field at path matches one of patterns.
func refreshable(path []string, patterns []string) bool {
	for _, p := range patterns {
		if match(strings.Split(p, "."), path) {
			return true
		}
	}
	return false
}

// refreshableBelow: a pattern ending in "**" takes the whole subtree.
func refreshableBelow(path []string, patterns []string) bool {
	for _, p := range patterns {
		if strings.HasSuffix(p, ".**") && match(strings.Split(strings.TrimSuffix(p, ".**"), "."), path) {
			return true
		}
	}
	return false
}

func match(pat, path []string) bool {
	if len(pat) == 0 {
		return len(path) == 0
	}
	if pat[0] == "**" {
		for i := 0; i <= len(path); i++ {
			if match(pat[1:], path[i:]) {
				return true
			}
		}
		return false
	}
	if len(path) == 0 || (pat[0] != "*" && pat[0] != path[0]) {
		return false
	}
	return match(pat[1:], path[1:])
}
