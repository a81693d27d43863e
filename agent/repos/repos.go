// Package repos gives a factory the repositories its jobs name without a
// clone made by hand: AQ_REPO_URLS maps repo names to clone URLs, and a
// repository that is not under AQ_REPO_BASE is cloned there on first use as
// a blobless partial clone (--filter=blob:none), borrowing objects from a
// read-only mirror (AQ_REPO_MIRROR, --reference-if-able) when there is one,
// so a replica's cold start does not grow with the repository's history.
//
// Credentials come from git's credential helpers (gh auth git-credential, a
// mounted store): a URL that carries a password is refused, so no secret
// reaches argv, a log line or an error.
package repos

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"sync"

	"github.com/aqfleet/aq/internal/brief"
	"github.com/aqfleet/aq/worktree"
)

// Placeholder is replaced by the repo name in a URL template.
const Placeholder = "{repo}"

// Resolver maps repo names to clone URLs. The zero value (or nil) resolves
// nothing.
type Resolver struct {
	urls     map[string]string // name → URL
	bad      map[string]string // name → why its entry is unusable
	template string            // a URL with {repo}, for names not listed
}

// Parse reads AQ_REPO_URLS: either a URL template containing {repo} (e.g.
// https://github.com/ORG/{repo}.git) or the path of a file of `name url`
// lines ('#' comments and blank lines ignored; a `* template` line is the
// fallback for names not listed). A file that cannot be read is an error; a
// malformed line is not — its name resolves to an error (the job fails
// repo_unavailable, naming the line) and a line without a usable name is
// returned as a warning.
func Parse(spec string) (*Resolver, []string, error) {
	spec = strings.TrimSpace(spec)
	r := &Resolver{urls: map[string]string{}, bad: map[string]string{}}
	if spec == "" {
		return r, nil, nil
	}
	if strings.Contains(spec, Placeholder) {
		if err := checkURL(strings.ReplaceAll(spec, Placeholder, "x")); err != nil {
			return nil, nil, fmt.Errorf("AQ_REPO_URLS template %s", err)
		}
		r.template = spec
		return r, nil, nil
	}
	f, err := os.Open(spec)
	if err != nil {
		return nil, nil, fmt.Errorf("AQ_REPO_URLS is neither a URL template with %s nor a readable file: %v", Placeholder, errors.Unwrap(err))
	}
	defer f.Close()
	var warnings []string
	sc := bufio.NewScanner(f)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		fields := strings.Fields(line)
		name := fields[0]
		where := fmt.Sprintf("AQ_REPO_URLS %s line %d", spec, n)
		if !validName(name) {
			warnings = append(warnings, fmt.Sprintf("%s: %q is not a repo name (letters, digits, '.', '_', '-'); line ignored", where, brief.Clip(name, 120)))
			continue
		}
		var why string
		switch {
		case len(fields) != 2:
			why = fmt.Sprintf("want `name url`, found %d fields", len(fields))
		case name == "*" && !strings.Contains(fields[1], Placeholder):
			why = "the `*` line's URL needs " + Placeholder
		default:
			if err := checkURL(strings.ReplaceAll(fields[1], Placeholder, "x")); err != nil {
				why = "the URL " + err.Error()
			}
		}
		switch {
		case why != "":
			r.bad[name] = where + ": " + why
		case name == "*":
			r.template = fields[1]
		default:
			r.urls[name] = fields[1]
		}
	}
	if err := sc.Err(); err != nil {
		return nil, nil, fmt.Errorf("AQ_REPO_URLS %s: %v", spec, err)
	}
	return r, warnings, nil
}

// Resolve is repo name's clone URL: ok false when the resolver does not know
// it, an error when its entry is malformed.
func (r *Resolver) Resolve(name string) (u string, ok bool, err error) {
	if r == nil {
		return "", false, nil
	}
	if why, bad := r.bad[name]; bad {
		return "", false, errors.New(why)
	}
	if u, ok := r.urls[name]; ok {
		return u, true, nil
	}
	if r.template != "" && validName(name) && name != "*" {
		if why, bad := r.bad["*"]; bad {
			return "", false, errors.New(why)
		}
		return strings.ReplaceAll(r.template, Placeholder, name), true, nil
	}
	return "", false, nil
}

// Names are the repos the resolver lists by name (a template resolves any
// name, so it adds none): a factory advertises them as repos it can run.
func (r *Resolver) Names() []string {
	if r == nil {
		return nil
	}
	out := make([]string, 0, len(r.urls))
	for n := range r.urls {
		out = append(out, n)
	}
	sort.Strings(out)
	return out
}

// Clone clones url into dir as a blobless partial clone, borrowing objects
// from mirror's copy of the repo when there is one. It clones into a
// temporary directory beside dir and renames it into place, so a clone that
// fails (auth, not found, a full disk) leaves nothing behind, and one that
// lost a race to another job's clone of the same repo is simply dropped.
func Clone(ctx context.Context, g *worktree.Git, url, dir, mirror string) error {
	if err := checkURL(url); err != nil {
		return fmt.Errorf("cannot clone: the URL %s", err)
	}
	parent := filepath.Dir(dir)
	if err := os.MkdirAll(parent, 0o755); err != nil {
		return fmt.Errorf("cannot create %s: %v", parent, err)
	}
	tmp := filepath.Join(parent, "."+filepath.Base(dir)+".clone-"+suffix())
	args := []string{"clone", "--quiet", "--filter=blob:none", "--no-checkout"}
	if ref := mirrorOf(mirror, filepath.Base(dir)); ref != "" {
		args = append(args, "--reference-if-able", ref)
	}
	args = append(args, "--", url, tmp)
	if _, err := g.Run(ctx, parent, args...); err != nil {
		_ = os.RemoveAll(tmp)
		return fmt.Errorf("cannot clone %s: %s", url, brief.FirstLine(err.Error(), 0))
	}
	// The clone's own checkout of the default branch is left out (aq works
	// in worktrees); its HEAD still names the default branch.
	if err := os.Rename(tmp, dir); err != nil {
		_ = os.RemoveAll(tmp)
		if worktree.IsRepo(dir) {
			return nil // another job's clone won the race
		}
		return fmt.Errorf("cannot move the clone into %s: %v", dir, err)
	}
	return nil
}

// mirrorOf is mirror's copy of repo name (name.git or name), or "".
func mirrorOf(mirror, name string) string {
	if mirror == "" {
		return ""
	}
	for _, p := range []string{filepath.Join(mirror, name+".git"), filepath.Join(mirror, name)} {
		if fi, err := os.Stat(p); err == nil && fi.IsDir() {
			return p
		}
	}
	return ""
}

var scpLike = regexp.MustCompile(`^[A-Za-z0-9._-]+@[A-Za-z0-9.-]+:[^/].*`)

// checkURL refuses what is not a clone URL, and a URL with a password in it
// (credentials belong in a credential helper, never in argv or a log).
func checkURL(s string) error {
	if scpLike.MatchString(s) {
		return nil // git@github.com:org/repo.git
	}
	u, err := url.Parse(s)
	if err != nil || u.Scheme == "" {
		return fmt.Errorf("%q is not a git URL (https://, ssh://, git://, file:// or user@host:path)", brief.Clip(redactURL(s), 120))
	}
	switch u.Scheme {
	case "https", "http", "ssh", "git", "file":
	default:
		return fmt.Errorf("%q has scheme %q (want https, ssh, git or file)", brief.Clip(redactURL(s), 120), u.Scheme)
	}
	if _, has := u.User.Password(); has {
		return fmt.Errorf("%s carries a password: put the credential in a git credential helper (e.g. gh auth setup-git), never in the URL", u.Redacted())
	}
	if u.Scheme != "file" && u.Host == "" {
		return fmt.Errorf("%q has no host", brief.Clip(s, 120))
	}
	return nil
}

// redactURL masks a userinfo password in s for an error message.
func redactURL(s string) string {
	if u, err := url.Parse(s); err == nil {
		return u.Redacted()
	}
	if i := strings.Index(s, "@"); i > 0 {
		return "xxxxx" + s[i:]
	}
	return s
}

var namePattern = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$`) })

func validName(s string) bool {
	return s == "*" || (namePattern().MatchString(s) && !strings.Contains(s, ".."))
}

func suffix() string {
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// Clonable is Parse(spec).Names(), for a host's offer: what cannot be parsed
// offers nothing (the runner reports it when a job needs it).
func Clonable(spec string) []string {
	r, _, err := Parse(spec)
	if err != nil {
		return nil
	}
	return r.Names()
}
