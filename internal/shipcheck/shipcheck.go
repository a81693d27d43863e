// Package shipcheck decides whether a change may leave the host: before
// aq pushes anything to origin — a WIP checkpoint while the engine runs,
// the checkpoint after it, the job branch, an orphan's checkpoint at
// recovery — the commits the push would add to what origin already has
// are looked at (docs/sandbox.md, "What ships is checked"):
//
//   - secrets: every value this factory holds (the engine's login and API
//     key, the factory token, GH tokens, what the redactor masks), at least
//     MinSecretLen long, in plain, base64, URL-encoded and hex forms, in the
//     files a commit adds or changes (binary ones too) and in their names —
//     a secret a file already held on origin is not the change's;
//   - protected paths: CI and ownership configuration (DefaultProtected,
//     AQ_PROTECTED_PATHS) a commit adds, changes or removes, unless the
//     job's manifest names them in may_change.
//
// It is a leaf package; it runs git through the hardened runner it is
// given (worktree.Git) and never prints a secret: a hit names the file,
// the line (a byte offset in a binary file), the form and whose secret it
// is.
package shipcheck

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"slices"
	"sort"
	"strconv"
	"strings"
)

// Git runs git in a repository; worktree.Git is one.
type Git interface {
	Run(ctx context.Context, dir string, args ...string) (string, error)
	Stream(ctx context.Context, dir string, stdin io.Reader, out io.Writer, args ...string) error
}

// Policy is what a change is checked against.
type Policy struct {
	Secrets []Secret
	// Protected are the protected globs; nil: DefaultProtected.
	Protected []string
	// MayChange are the globs of the job's may_change: protected paths
	// the change may touch.
	MayChange []string
}

func (p Policy) protected() []string {
	if p.Protected == nil {
		return DefaultProtected
	}
	return p.Protected
}

// Hit is a secret found in a change. It never holds the secret.
type Hit struct {
	Commit string
	Path   string
	Line   int   // 1-based; 0 in a binary file or a name
	Offset int64 // byte offset in the file
	Binary bool
	InName bool   // the secret is (part of) the file's name
	How    string // plain, base64, URL-encoded or hex
	Source string // whose secret (Secret.Source)
}

// Where is the hit's place: "path:line", "path (binary, byte 123)" or
// "the name of path".
func (h Hit) Where() string {
	switch {
	case h.InName:
		return "the name of " + h.Path
	case h.Binary:
		return fmt.Sprintf("%s (binary, byte %d)", h.Path, h.Offset)
	}
	return fmt.Sprintf("%s:%d", h.Path, h.Line)
}

// Result is what Check found.
type Result struct {
	// Commits is how many commits were looked at.
	Commits int
	// Secrets found (at most maxHits).
	Secrets []Hit
	// Protected are the protected paths the change touches that may_change
	// does not name; Allowed those it names.
	Protected []string
	Allowed   []string
	// Numstat is Range.Numstat's change against its first parent, as
	// `git diff --numstat` counts it; nil when that commit was not in the
	// range (or none was asked for).
	Numstat *Numstat
}

// Numstat counts a commit's change: files, and lines added and deleted
// (a binary file counts as a file, without lines).
type Numstat struct {
	Files, Added, Deleted int
}

// Refused reports whether the change may not be pushed.
func (r *Result) Refused() bool { return r != nil && (len(r.Secrets) > 0 || len(r.Protected) > 0) }

// maxHits bounds the hits kept: the first ones say enough.
const maxHits = 20

// SecretLine says where the secrets are, never what they are: "a secret
// (the claude login's, base64) in src/a.go:12; ...".
func (r *Result) SecretLine() string {
	var parts []string
	for i, h := range r.Secrets {
		if i == 3 {
			parts = append(parts, fmt.Sprintf("and %d more", len(r.Secrets)-3))
			break
		}
		parts = append(parts, fmt.Sprintf("%s (%s, %s)", h.Where(), h.Source, h.How))
	}
	return strings.Join(parts, "; ")
}

// ProtectedLine lists the protected paths touched (at most 10).
func (r *Result) ProtectedLine() string { return listLine(r.Protected) }

// AllowedLine lists the protected paths may_change allowed (at most 10).
func (r *Result) AllowedLine() string { return listLine(r.Allowed) }

func listLine(ps []string) string {
	if len(ps) > 10 {
		return strings.Join(ps[:10], ", ") + fmt.Sprintf(" and %d more", len(ps)-10)
	}
	return strings.Join(ps, ", ")
}

const zeroSHA = "0000000000000000000000000000000000000000"

// entry is one path a commit changes.
type entry struct {
	commit string
	path   string
	newSHA string   // "" when the commit removes it (or it is a submodule)
	oldSHA []string // its blobs in the parents that have it
}

// Check looks at the commits reachable from tip and not from have (what
// origin already has: OriginHas, plus what the caller knows origin has)
// — what pushing tip would add to origin.
func Check(ctx context.Context, g Git, repoDir, tip string, have []string, p Policy) (*Result, error) {
	return CheckRange(ctx, g, repoDir, Range{Tip: tip, Have: have}, p)
}

// Range is what a push would add: the commits reachable from Tip and not
// from Have, nor from Remote's remote-tracking branches when Remote is set
// (what this repository last saw of origin: no network call).
type Range struct {
	Tip string
	// More are further tips pushed with Tip (an atomic push of several
	// refs): the range is what any of them adds, checked in one pass.
	More   []string
	Have   []string
	Remote string
	// Parents are the parents of tips the caller made itself (a
	// checkpoint, a result commit: aq's commit-tree named them). When
	// every tip's parents are known and in Have, the range is the tips
	// themselves and no walk is needed (#35: one git fewer per push).
	Parents map[string][]string
	// Numstat names a commit (one of the tips) whose change against its
	// first parent Result.Numstat counts, in the same git that lists
	// what the commits change (#35: the job's diffstat).
	Numstat string
}

// CheckRange is Check over a Range.
func CheckRange(ctx context.Context, g Git, repoDir string, r Range, p Policy) (*Result, error) {
	commits, err := newCommits(ctx, g, repoDir, r)
	if err != nil {
		return nil, err
	}
	res := &Result{Commits: len(commits)}
	entries, stat, err := changes(ctx, g, repoDir, commits, r.Numstat)
	if err != nil {
		return nil, err
	}
	res.Numstat = stat
	prot, allowed := map[string]bool{}, map[string]bool{}
	for _, e := range entries {
		if Match(p.protected(), e.path) {
			if Match(p.MayChange, e.path) {
				allowed[e.path] = true
			} else {
				prot[e.path] = true
			}
		}
	}
	res.Protected, res.Allowed = sortedKeys(prot), sortedKeys(allowed)
	sc := newScanner(p.Secrets)
	if len(sc.forms) == 0 {
		return res, nil
	}
	for _, e := range entries {
		for _, i := range sc.inName(e.path) {
			res.add(sc, Hit{Commit: e.commit, Path: e.path, InName: true, How: sc.forms[i].how, Source: sc.secrets[sc.forms[i].secret].Source})
		}
	}
	// Every new blob once, then the old versions of those with a hit: a
	// secret a file already held (on origin) is not the change's.
	var want []string
	for _, e := range entries {
		if e.newSHA != "" {
			want = append(want, e.newSHA)
		}
	}
	newFound, err := scanBlobs(ctx, g, repoDir, sc, want)
	if err != nil {
		return nil, err
	}
	want = want[:0]
	for _, e := range entries {
		if f := newFound[e.newSHA]; f != nil && f.any() {
			want = append(want, e.oldSHA...)
		}
	}
	oldFound, err := scanBlobs(ctx, g, repoDir, sc, want)
	if err != nil {
		return nil, err
	}
	for _, e := range entries {
		f := newFound[e.newSHA]
		if f == nil || !f.any() {
			continue
		}
		for i, n := range f.count {
			had := 0
			for _, o := range e.oldSHA {
				if of := oldFound[o]; of != nil {
					had = max(had, of.count[i])
				}
			}
			if n <= had {
				continue
			}
			// The first occurrence past those the old version had: where
			// an added copy most likely is.
			pos := f.at[i][min(had, len(f.at[i])-1)]
			h := Hit{Commit: e.commit, Path: e.path, Offset: pos.offset, Line: pos.line, Binary: f.binary,
				How: sc.forms[i].how, Source: sc.secrets[sc.forms[i].secret].Source}
			if h.Binary {
				h.Line = 0
			}
			res.add(sc, h)
		}
	}
	return res, nil
}

func (r *Result) add(sc *scanner, h Hit) {
	h.Path = sc.mask(h.Path)
	for _, o := range r.Secrets {
		if o.Path == h.Path && o.Source == h.Source && o.InName == h.InName {
			return // one hit per file and secret says it
		}
	}
	if len(r.Secrets) < maxHits {
		r.Secrets = append(r.Secrets, h)
	}
}

func sortedKeys(m map[string]bool) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

type commit struct {
	sha     string
	parents []string
}

// newCommits lists the commits reachable from tip and not from have,
// oldest first, each with its parents.
func newCommits(ctx context.Context, g Git, repoDir string, r Range) ([]commit, error) {
	if cs, ok := knownCommits(r); ok {
		return cs, nil
	}
	var in bytes.Buffer
	for _, t := range append([]string{r.Tip}, r.More...) {
		if t != "" {
			in.WriteString(t + "\n")
		}
	}
	for _, h := range r.Have {
		if h != "" {
			in.WriteString("^" + h + "\n")
		}
	}
	args := []string{"rev-list", "--reverse", "--topo-order", "--parents", "--stdin"}
	if r.Remote != "" {
		// After --stdin, which git reads where it stands in argv.
		args = append(args, "--not", "--remotes="+r.Remote)
	}
	var out bytes.Buffer
	if err := g.Stream(ctx, repoDir, &in, &out, args...); err != nil {
		return nil, fmt.Errorf("cannot list the commits to push: %w", err)
	}
	var cs []commit
	for _, line := range strings.Split(strings.TrimSpace(out.String()), "\n") {
		if f := strings.Fields(line); len(f) > 0 {
			cs = append(cs, commit{sha: f[0], parents: f[1:]})
		}
	}
	return cs, nil
}

// knownCommits is the range without a walk, when it is the tips alone:
// every tip's parents known (Range.Parents) and in Have. A tip in Have is
// left out, as the walk leaves it out. ok is false when a walk is needed.
func knownCommits(r Range) ([]commit, bool) {
	if len(r.Parents) == 0 {
		return nil, false
	}
	have := map[string]bool{}
	for _, h := range r.Have {
		have[h] = true
	}
	var cs []commit
	for _, t := range append([]string{r.Tip}, r.More...) {
		if t == "" || have[t] || slices.ContainsFunc(cs, func(c commit) bool { return c.sha == t }) {
			continue
		}
		ps, ok := r.Parents[t]
		if !ok || len(ps) == 0 { // a root commit: the walk finds what it is
			return nil, false
		}
		for _, p := range ps {
			if !have[p] {
				return nil, false
			}
		}
		cs = append(cs, commit{sha: t, parents: ps})
	}
	return cs, true
}

// changes are the paths each commit changes: against its parent,
// against nothing for a root commit, and for a merge the paths that differ
// from every parent (what the merge itself brings, not what a side
// already had). One `git diff-tree --stdin` for all of them; with
// numstat naming one of them, the same git also counts its change against
// its first parent (--numstat).
func changes(ctx context.Context, g Git, repoDir string, commits []commit, numstat string) ([]entry, *Numstat, error) {
	if len(commits) == 0 {
		return nil, nil, nil
	}
	// One input line per (commit, parent) pair, or the commit alone for a
	// root; --always prints each line's header even when its diff is
	// empty, so the output's headers follow the input's lines.
	type pair struct{ c, n int } // commit index, parent index
	var in bytes.Buffer
	var pairs []pair
	for i, c := range commits {
		if len(c.parents) == 0 {
			in.WriteString(c.sha + "\n")
			pairs = append(pairs, pair{i, 0})
		}
		for n, p := range c.parents {
			in.WriteString(c.sha + " " + p + "\n")
			pairs = append(pairs, pair{i, n})
		}
	}
	args := []string{"diff-tree", "--stdin", "--always", "--root", "-r", "-z", "--no-renames", "--no-ext-diff", "--no-textconv"}
	var stat *Numstat
	if numstat != "" && slices.ContainsFunc(commits, func(c commit) bool { return c.sha == numstat && len(c.parents) > 0 }) {
		args = append(args, "--raw", "--numstat")
		stat = &Numstat{}
	}
	var out bytes.Buffer
	if err := g.Stream(ctx, repoDir, &in, &out, args...); err != nil {
		return nil, nil, fmt.Errorf("cannot list what the commits to push change: %w", err)
	}
	perParent := make([][]map[string]entry, len(commits))
	for i, c := range commits {
		perParent[i] = make([]map[string]entry, max(len(c.parents), 1))
	}
	f := strings.Split(out.String(), "\x00")
	k := -1
	for i := 0; i < len(f); i++ {
		if f[i] == "" {
			continue
		}
		if stat != nil && !strings.HasPrefix(f[i], ":") && strings.Contains(f[i], "\t") {
			// --numstat's "added<TAB>deleted<TAB>path" (a header is a
			// hash alone, a path follows its raw line).
			a, d, err := numstatLine(f[i])
			if err != nil || k < 0 {
				return nil, nil, fmt.Errorf("cannot read git diff-tree's line %q", f[i])
			}
			if pp := pairs[k]; commits[pp.c].sha == numstat && pp.n == 0 {
				stat.Files++
				stat.Added += a
				stat.Deleted += d
			}
			continue
		}
		if !strings.HasPrefix(f[i], ":") { // a header: the next input line's
			k++
			if k >= len(pairs) {
				return nil, nil, fmt.Errorf("git diff-tree printed more than it was asked")
			}
			pp := pairs[k]
			perParent[pp.c][pp.n] = map[string]entry{}
			continue
		}
		meta := strings.Fields(f[i][1:])
		if len(meta) < 5 || i+1 >= len(f) || k < 0 {
			return nil, nil, fmt.Errorf("cannot read git diff-tree's line %q", f[i])
		}
		i++
		pp := pairs[k]
		e := entry{commit: commits[pp.c].sha, path: f[i]}
		if meta[1] != "160000" && meta[3] != zeroSHA {
			e.newSHA = meta[3]
		}
		if meta[0] != "160000" && meta[2] != zeroSHA {
			e.oldSHA = []string{meta[2]}
		}
		perParent[pp.c][pp.n][e.path] = e
	}
	if k != len(pairs)-1 {
		return nil, nil, fmt.Errorf("git diff-tree printed %d of %d diffs", k+1, len(pairs))
	}
	var es []entry
	for i := range commits {
		first := perParent[i][0]
		var paths []string
		for p := range first {
			paths = append(paths, p)
		}
		sort.Strings(paths)
		for _, p := range paths {
			e := first[p]
			inAll := true
			for _, other := range perParent[i][1:] {
				o, ok := other[p]
				if !ok {
					inAll = false
					break
				}
				e.oldSHA = append(e.oldSHA, o.oldSHA...)
			}
			if inAll {
				es = append(es, e)
			}
		}
	}
	return es, stat, nil
}

// numstatLine reads one --numstat -z record: "added<TAB>deleted<TAB>path",
// "-" for both counts of a binary file (0 lines).
func numstatLine(rec string) (added, deleted int, err error) {
	f := strings.SplitN(rec, "\t", 3)
	if len(f) != 3 {
		return 0, 0, fmt.Errorf("not a numstat record")
	}
	if f[0] == "-" && f[1] == "-" {
		return 0, 0, nil
	}
	a, err1 := strconv.Atoi(f[0])
	d, err2 := strconv.Atoi(f[1])
	if err1 != nil || err2 != nil || a < 0 || d < 0 {
		return 0, 0, fmt.Errorf("not a numstat record")
	}
	return a, d, nil
}

// scanBlobs scans each blob once (`git cat-file --batch`, streamed: a
// large file costs time, not memory).
func scanBlobs(ctx context.Context, g Git, repoDir string, sc *scanner, shas []string) (map[string]*found, error) {
	res := map[string]*found{}
	var in bytes.Buffer
	for _, s := range shas {
		if _, ok := res[s]; !ok {
			res[s] = nil
			in.WriteString(s + "\n")
		}
	}
	if in.Len() == 0 {
		return res, nil
	}
	pr, pw := io.Pipe()
	errc := make(chan error, 1)
	go func() {
		err := g.Stream(ctx, repoDir, &in, pw, "cat-file", "--batch")
		pw.CloseWithError(err)
		errc <- err
	}()
	perr := readBatch(bufio.NewReaderSize(pr, 64*1024), sc, res)
	pr.CloseWithError(io.ErrClosedPipe) // let git finish if we stopped early
	gerr := <-errc
	if perr != nil {
		return nil, fmt.Errorf("cannot read the change's files: %w", perr)
	}
	if gerr != nil {
		return nil, fmt.Errorf("cannot read the change's files: %w", gerr)
	}
	return res, nil
}

func readBatch(r *bufio.Reader, sc *scanner, res map[string]*found) error {
	for {
		head, err := r.ReadString('\n')
		if err == io.EOF && head == "" {
			return nil
		}
		if err != nil {
			return err
		}
		f := strings.Fields(head)
		if len(f) == 2 && f[1] == "missing" {
			return fmt.Errorf("object %s is missing", f[0])
		}
		if len(f) != 3 {
			return fmt.Errorf("cannot read git cat-file's header %q", strings.TrimSpace(head))
		}
		size, err := strconv.ParseInt(f[2], 10, 64)
		if err != nil {
			return fmt.Errorf("cannot read git cat-file's header %q", strings.TrimSpace(head))
		}
		got, err := sc.scan(io.LimitReader(r, size))
		if err != nil {
			return err
		}
		if _, err := r.Discard(1); err != nil { // the newline after the object
			return err
		}
		res[f[0]] = got
	}
}

// OriginHas lists the commits remote's branches and tags point at that
// repoDir has too: what a push to remote need not send, and what Check
// takes as already there. A remote that cannot be read is an error: the
// push would fail as well, and nothing is pushed unchecked.
func OriginHas(ctx context.Context, g Git, repoDir, remote string) ([]string, error) {
	out, err := g.Run(ctx, repoDir, "ls-remote", "--heads", "--tags", "--end-of-options", remote)
	if err != nil {
		return nil, fmt.Errorf("cannot read what %s has: %w", remote, err)
	}
	seen := map[string]bool{}
	var in bytes.Buffer
	for _, line := range strings.Split(out, "\n") {
		sha, _, ok := strings.Cut(line, "\t")
		if ok && len(sha) >= 40 && !seen[sha] {
			seen[sha] = true
			in.WriteString(sha + "\n")
		}
	}
	if in.Len() == 0 {
		return nil, nil
	}
	var known bytes.Buffer
	if err := g.Stream(ctx, repoDir, &in, &known, "cat-file", "--batch-check"); err != nil {
		return nil, fmt.Errorf("cannot look up %s's refs here: %w", remote, err)
	}
	var have []string
	for _, line := range strings.Split(known.String(), "\n") {
		f := strings.Fields(line)
		if len(f) == 3 && (f[1] == "commit" || f[1] == "tag") {
			have = append(have, f[0])
		}
	}
	return have, nil
}
