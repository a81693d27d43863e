package worktree

// Git queries and batched deletions for garbage collection. Every query here
// costs a fixed number of git processes however many refs there are (a
// repository may hold tens of thousands of aq/ refs), and every deletion is a
// compare-and-swap on the value the plan saw.

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/aqfleet/aq/internal/brief"
)

// RefInfo is a ref, the commit it points at and that commit's committer
// time.
type RefInfo struct {
	Name string
	SHA  string
	Time time.Time // zero when the ref does not point at a commit
}

// ListRefInfo lists the refs under prefix (e.g. "refs/heads/aq/") with their
// tips' committer times, in one `git for-each-ref`.
func ListRefInfo(ctx context.Context, g Git, dir, prefix string) ([]RefInfo, error) {
	out, err := g.at(dir).Run(ctx, dir, "for-each-ref", "--format=%(objectname) %(committerdate:unix) %(refname)", "--end-of-options", prefix)
	if err != nil {
		return nil, err
	}
	var refs []RefInfo
	for _, line := range strings.Split(out, "\n") {
		f := strings.SplitN(line, " ", 3)
		if len(f) != 3 {
			continue
		}
		refs = append(refs, RefInfo{Name: f[2], SHA: f[0], Time: unixTime(f[1])})
	}
	return refs, nil
}

func unixTime(s string) time.Time {
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil || n <= 0 {
		return time.Time{}
	}
	return time.Unix(n, 0).UTC()
}

// MergedInto returns the refs under prefix whose tips are ancestors of (or
// equal to) base, a commit or ref: `git for-each-ref --merged=<base>`, one
// process for any number of refs.
func MergedInto(ctx context.Context, g Git, dir, base, prefix string) (map[string]bool, error) {
	out, err := g.at(dir).Run(ctx, dir, "for-each-ref", "--merged="+base, "--format=%(refname)", "--end-of-options", prefix)
	if err != nil {
		return nil, err
	}
	merged := map[string]bool{}
	for _, name := range strings.Split(out, "\n") {
		if name != "" {
			merged[name] = true
		}
	}
	return merged, nil
}

// ListRemoteRefs asks remote for its refs matching patterns (`git ls-remote
// --refs`, e.g. "refs/heads/aq/*"): one round trip.
func ListRemoteRefs(ctx context.Context, g Git, dir, remote string, patterns ...string) ([]Ref, error) {
	args := append([]string{"ls-remote", "--refs", "--end-of-options", remote}, patterns...)
	out, err := g.at(dir).Run(ctx, dir, args...)
	if err != nil {
		return nil, err
	}
	var refs []Ref
	for _, line := range strings.Split(out, "\n") {
		sha, name, ok := strings.Cut(line, "\t")
		if ok {
			refs = append(refs, Ref{Name: name, SHA: sha})
		}
	}
	return refs, nil
}

// CommitTimes returns the committer time of each of shas that is a commit
// present in dir; absent ones are left out (an origin ref pushed from
// elsewhere and never fetched). Two processes for any number of shas.
func CommitTimes(ctx context.Context, g Git, dir string, shas []string) (map[string]time.Time, error) {
	times := map[string]time.Time{}
	if len(shas) == 0 {
		return times, nil
	}
	out, err := g.runStdin(ctx, dir, strings.NewReader(strings.Join(shas, "\n")+"\n"),
		"cat-file", "--batch-check=%(objectname) %(objecttype)")
	if err != nil {
		return nil, err
	}
	var present []string
	for _, line := range strings.Split(string(out), "\n") {
		sha, typ, _ := strings.Cut(line, " ")
		if typ == "commit" {
			present = append(present, sha)
		}
	}
	if len(present) == 0 {
		return times, nil
	}
	out, err = g.runStdin(ctx, dir, strings.NewReader(strings.Join(present, "\n")+"\n"),
		"log", "--no-walk=unsorted", "--stdin", "--format=%H %ct")
	if err != nil {
		return nil, err
	}
	for _, line := range strings.Split(string(out), "\n") {
		sha, t, ok := strings.Cut(line, " ")
		if ok {
			times[sha] = unixTime(t)
		}
	}
	return times, nil
}

// SquashOptions bound SquashMerged's work.
type SquashOptions struct {
	// Window is how many of base's latest commits are searched for the
	// candidates' parents (default 100000). Only commits newer than the
	// oldest parent found get a patch id.
	Window int
	// Workers run `git merge-tree` checks in parallel (default: CPUs, at
	// most 8).
	Workers int
}

// Evidence that a commit's change is in base (RefState.Squashed).
const (
	SquashPatchID   = "patch-id"
	SquashMergeTree = "merge-tree"
)

// SquashMerged finds which candidates (commits that are not ancestors of any
// of baseTips) have their change in base anyway — what a squash merge, a
// rebase merge or a cherry-pick leaves behind — and says how it knows:
//
//   - "patch-id": the candidate is a single commit on top of base's history
//     (its only parent is among base's latest commits) and a commit of base
//     that is newer than that parent makes the same change: the same raw
//     diff (paths and blobs), else the same `git patch-id --stable`. This is
//     `git cherry`'s test; a squash merge of aq's one-commit job branch
//     passes it. All candidates cost four or five processes together.
//   - "merge-tree": `git merge-tree --write-tree <tip> <candidate>` is clean
//     and its tree is the tip's: merging the candidate into base would change
//     nothing. This catches branches of several commits and squash merges
//     whose context changed; it costs one process per candidate left.
//
// A candidate missing from the result has no such evidence: its change, or
// part of it, is not in base.
func SquashMerged(ctx context.Context, g Git, dir string, baseTips, candidates []string, o SquashOptions) (map[string]string, error) {
	found := map[string]string{}
	if len(baseTips) == 0 || len(candidates) == 0 {
		return found, nil
	}
	if o.Window <= 0 {
		o.Window = 100000
	}
	if o.Workers <= 0 {
		o.Workers = min(runtime.NumCPU(), 8)
	}
	parents, err := commitParents(ctx, g, dir, candidates)
	if err != nil {
		return nil, err
	}
	want := map[string]bool{}
	for _, c := range candidates {
		if p := parents[c]; len(p) == 1 {
			want[p[0]] = true
		}
	}
	window, pos, err := baseWindow(ctx, g, dir, baseTips, want, o.Window)
	if err != nil {
		return nil, err
	}
	var eligible []string
	deepest := 0 // a match must be newer than its parent: nothing older counts
	for _, c := range candidates {
		if p := parents[c]; len(p) == 1 {
			if i, ok := pos[p[0]]; ok {
				eligible = append(eligible, c)
				deepest = max(deepest, i)
			}
		}
	}
	window = window[:min(deepest, len(window))]
	same, err := samePatch(ctx, g, dir, eligible, window, pos, parents)
	if err != nil {
		return nil, err
	}
	for c := range same {
		found[c] = SquashPatchID
	}
	var rest []string
	for _, c := range candidates {
		if _, ok := found[c]; !ok {
			rest = append(rest, c)
		}
	}
	contained, err := mergeTreeContained(ctx, g, dir, baseTips, rest, o.Workers)
	if err != nil {
		return nil, err
	}
	for _, c := range contained {
		found[c] = SquashMergeTree
	}
	return found, nil
}

func slicesClone(s []string) []string { return append([]string(nil), s...) }

// samePatch finds the eligible candidates (one commit whose parent is at
// pos[parent] in window) that a newer commit of window carries the same
// change as. First the cheap test, which reads no file: the same raw diff
// (paths, modes, blobs before and after) is the same patch. Then, for the
// rest, `git patch-id --stable` (which ignores line numbers and whitespace),
// computed only for the window commits that touch a path those candidates
// touch.
func samePatch(ctx context.Context, g Git, dir string, eligible, window []string, pos map[string]int, parents map[string][]string) (map[string]bool, error) {
	same := map[string]bool{}
	if len(eligible) == 0 {
		return same, nil
	}
	raw, err := rawDiffs(ctx, g, dir, append(slicesClone(eligible), window...))
	if err != nil {
		return nil, err
	}
	match := func(key func(string) (string, bool), among []string, cands []string) {
		newest := map[string]int{} // a match must be newer than the candidate's parent
		for _, s := range among {
			if k, ok := key(s); ok {
				if _, seen := newest[k]; !seen {
					newest[k] = pos[s]
				}
			}
		}
		for _, c := range cands {
			if k, ok := key(c); ok {
				if i, ok := newest[k]; ok && i < pos[parents[c][0]] {
					same[c] = true
				}
			}
		}
	}
	rawKey := func(s string) (string, bool) { d, ok := raw[s]; return d.key, ok && d.key != "" }
	match(rawKey, window, eligible)

	var rest []string
	paths := map[string]bool{}
	for _, c := range eligible {
		if !same[c] {
			rest = append(rest, c)
			for _, p := range raw[c].paths {
				paths[p] = true
			}
		}
	}
	if len(rest) == 0 {
		return same, nil
	}
	var touching []string
	for _, s := range window {
		for _, p := range raw[s].paths {
			if paths[p] {
				touching = append(touching, s)
				break
			}
		}
	}
	if len(touching) == 0 {
		return same, nil
	}
	ids, err := patchIDs(ctx, g, dir, append(slicesClone(rest), touching...))
	if err != nil {
		return nil, err
	}
	match(func(s string) (string, bool) { id, ok := ids[s]; return id, ok }, touching, rest)
	return same, nil
}

// rawDiff is a commit's change against its parent as `git diff-tree --raw`
// shows it: key is every line, sorted (equal keys: the same patch); paths
// are the paths it touches.
type rawDiff struct {
	key   string
	paths []string
}

// rawDiffs reads the raw diffs of shas in one `git diff-tree --stdin`; it
// reads trees only, never file contents. Merge commits get none.
func rawDiffs(ctx context.Context, g Git, dir string, shas []string) (map[string]rawDiff, error) {
	out, err := g.runStdin(ctx, dir, strings.NewReader(strings.Join(shas, "\n")+"\n"),
		"diff-tree", "--stdin", "-r", "--raw", "--no-renames", "--full-index")
	if err != nil {
		return nil, err
	}
	diffs := map[string]rawDiff{}
	var cur string
	var lines []string
	flush := func() {
		if cur != "" {
			sort.Strings(lines)
			d := rawDiff{key: strings.Join(lines, "\n")}
			for _, l := range lines {
				if _, p, ok := strings.Cut(l, "\t"); ok {
					d.paths = append(d.paths, p)
				}
			}
			diffs[cur] = d
		}
		cur, lines = "", nil
	}
	for _, line := range strings.Split(string(out), "\n") {
		switch {
		case strings.HasPrefix(line, ":"):
			if cur != "" {
				lines = append(lines, line)
			}
		case line != "":
			flush()
			cur, _, _ = strings.Cut(line, " ")
		}
	}
	flush()
	return diffs, nil
}

// commitParents maps each of shas to its parents (`git rev-list --no-walk
// --parents`).
func commitParents(ctx context.Context, g Git, dir string, shas []string) (map[string][]string, error) {
	out, err := g.runStdin(ctx, dir, strings.NewReader(strings.Join(shas, "\n")+"\n"),
		"rev-list", "--no-walk=unsorted", "--parents", "--stdin")
	if err != nil {
		return nil, err
	}
	parents := map[string][]string{}
	for _, line := range strings.Split(string(out), "\n") {
		f := strings.Fields(line)
		if len(f) > 0 {
			parents[f[0]] = f[1:]
		}
	}
	return parents, nil
}

// baseWindow lists base's latest commits, newest first (`git rev-list`, by
// commit date), up to max, stopping early a little after every wanted commit
// has been seen. pos maps each listed commit to its index.
func baseWindow(ctx context.Context, g Git, dir string, tips []string, want map[string]bool, max int) ([]string, map[string]int, error) {
	const margin = 256 // commits read past the last wanted one (clock skew between parent and squash)
	if len(want) == 0 {
		return nil, map[string]int{}, nil
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	args := append([]string{"rev-list", "--max-count=" + strconv.Itoa(max), "--end-of-options"}, tips...)
	cmd, err := g.at(dir).command(ctx, dir, args, nil)
	if err != nil {
		return nil, nil, err
	}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, nil, err
	}
	var window []string
	pos := map[string]int{}
	left, after := len(want), -1
	sc := bufio.NewScanner(stdout)
	for sc.Scan() {
		sha := sc.Text()
		pos[sha] = len(window)
		window = append(window, sha)
		if want[sha] {
			left--
		}
		if left == 0 && after < 0 {
			after = margin
		}
		if after == 0 {
			cancel() // stopped on purpose: not an error
			break
		}
		if after > 0 {
			after--
		}
	}
	_, _ = io.Copy(io.Discard, stdout) // drain: git must not block on a full pipe before Wait
	werr := cmd.Wait()
	if werr != nil && after != 0 {
		if ctxErr := ctx.Err(); ctxErr != nil {
			return nil, nil, ctxErr
		}
		return nil, nil, &GitError{Args: args, Dir: dir, ExitCode: exitCode(werr), Stderr: stderr.String(), Err: werr}
	}
	return window, pos, nil
}

// patchIDs maps each of shas that has a diff against its only parent to its
// `git patch-id --stable` (merge commits have none): `git log -p` piped into
// `git patch-id`.
func patchIDs(ctx context.Context, g Git, dir string, shas []string) (map[string]string, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	gd := g.at(dir)
	logArgs := []string{"log", "--no-walk=unsorted", "--stdin", "-p", "--format=commit %H", "--no-color",
		"--no-ext-diff", "--no-textconv", "--no-renames", "--diff-merges=off"}
	logCmd, err := gd.command(ctx, dir, logArgs, nil)
	if err != nil {
		return nil, err
	}
	logCmd.Stdin = strings.NewReader(strings.Join(shas, "\n") + "\n")
	var logErr, pidErr bytes.Buffer
	logCmd.Stderr = &logErr
	pipe, err := logCmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	pidArgs := []string{"patch-id", "--stable"}
	pidCmd, err := gd.command(ctx, dir, pidArgs, nil)
	if err != nil {
		return nil, err
	}
	pidCmd.Stdin = pipe
	var out bytes.Buffer
	pidCmd.Stdout, pidCmd.Stderr = &out, &pidErr
	if err := logCmd.Start(); err != nil {
		return nil, err
	}
	if err := pidCmd.Start(); err != nil {
		cancel()
		_ = logCmd.Wait()
		return nil, err
	}
	pidWait := pidCmd.Wait()
	if pidWait != nil {
		cancel()
	}
	logWait := logCmd.Wait()
	if logWait != nil {
		return nil, &GitError{Args: logArgs, Dir: dir, ExitCode: exitCode(logWait), Stderr: logErr.String(), Err: logWait}
	}
	if pidWait != nil {
		return nil, &GitError{Args: pidArgs, Dir: dir, ExitCode: exitCode(pidWait), Stderr: pidErr.String(), Err: pidWait}
	}
	ids := map[string]string{}
	for _, line := range strings.Split(out.String(), "\n") {
		id, sha, ok := strings.Cut(line, " ")
		if ok {
			ids[sha] = id
		}
	}
	return ids, nil
}

// mergeTreeContained returns the candidates that merging into one of tips
// would not change: `git merge-tree --write-tree` is clean and yields the
// tip's own tree. A git too old for --write-tree (before 2.38) finds none.
func mergeTreeContained(ctx context.Context, g Git, dir string, tips, candidates []string, workers int) ([]string, error) {
	if len(candidates) == 0 {
		return nil, nil
	}
	gd := g.at(dir)
	trees := make([]string, len(tips))
	for i, t := range tips {
		tree, err := gd.Run(ctx, dir, "rev-parse", "--verify", "--end-of-options", t+"^{tree}")
		if err != nil {
			return nil, err
		}
		trees[i] = tree
	}
	var (
		mu       sync.Mutex
		out      []string
		firstErr error
		wg       sync.WaitGroup
		jobs     = make(chan string)
	)
	unsupported := false
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for c := range jobs {
				for i, t := range tips {
					res, err := gd.Run(ctx, dir, "merge-tree", "--write-tree", "--no-messages", "--end-of-options", t, c)
					code := exitCode(err)
					if err != nil && code != 1 { // 1: conflicts
						mu.Lock()
						if code == 129 { // usage: no --write-tree in this git
							unsupported = true
						} else if firstErr == nil {
							firstErr = err
						}
						mu.Unlock()
						break
					}
					if err == nil && brief.FirstLine(res, 0) == trees[i] {
						mu.Lock()
						out = append(out, c)
						mu.Unlock()
						break
					}
				}
			}
		}()
	}
feed:
	for _, c := range candidates {
		mu.Lock()
		stop := unsupported || firstErr != nil
		mu.Unlock()
		if stop {
			break
		}
		select {
		case jobs <- c:
		case <-ctx.Done():
			break feed
		}
	}
	close(jobs)
	wg.Wait()
	if firstErr != nil {
		return nil, firstErr
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	return out, nil
}

// RefOutcome is what happened to one ref a batched delete was asked to
// delete.
type RefOutcome string

const (
	RefDeleted    RefOutcome = "deleted"
	RefGone       RefOutcome = "gone"        // it no longer existed: nothing to do
	RefChanged    RefOutcome = "changed"     // it points elsewhere now: kept
	RefCheckedOut RefOutcome = "checked-out" // a worktree has it checked out: kept
	RefFailed     RefOutcome = "failed"      // Err says why
)

// RefResult is the outcome of deleting one ref.
type RefResult struct {
	Ref     Ref
	Outcome RefOutcome
	Now     string // for RefChanged: where it points now
	Err     error  // for RefFailed
}

// refBatch bounds one ref transaction or push: the argument list of a push
// and the lock files of a transaction stay small.
const refBatch = 1000

// DeleteRefs deletes local refs (full names under refs/heads/aq/), each
// only while it still points at its SHA (compare-and-swap), in `git
// update-ref --stdin` transactions of up to 1000 refs. A branch checked out
// in any worktree is not deleted. When a transaction fails because some ref
// moved or vanished, its refs are retried one by one, so one changed ref
// never blocks the rest. Every ref gets a result, in order.
func DeleteRefs(ctx context.Context, g Git, dir string, refs []Ref) ([]RefResult, error) {
	results := make([]RefResult, len(refs))
	if len(refs) == 0 {
		return results, nil
	}
	wts, err := List(ctx, g, dir)
	if err != nil {
		return nil, err
	}
	out := map[string]bool{}
	for _, w := range wts {
		if w.Branch != "" {
			out[fullBranchRef(w.Branch)] = true
		}
	}
	var todo []int
	for i, r := range refs {
		results[i].Ref = r
		switch {
		case !strings.HasPrefix(r.Name, aqRefPrefix) || r.SHA == "":
			results[i].Outcome, results[i].Err = RefFailed, fmt.Errorf("delete ref: refusing %q: aq only deletes refs under %s, with the value it expects", r.Name, aqRefPrefix)
		case out[r.Name]:
			results[i].Outcome = RefCheckedOut
		default:
			todo = append(todo, i)
		}
	}
	gd := g.at(dir)
	for start := 0; start < len(todo); start += refBatch {
		batch := todo[start:min(start+refBatch, len(todo))]
		var in strings.Builder
		for _, i := range batch {
			fmt.Fprintf(&in, "delete %s %s\n", refs[i].Name, refs[i].SHA)
		}
		if _, err := gd.runStdin(ctx, dir, strings.NewReader(in.String()), "update-ref", "-m", "aq gc", "--stdin"); err == nil {
			for _, i := range batch {
				results[i].Outcome = RefDeleted
			}
			continue
		} else if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		for _, i := range batch {
			results[i] = deleteOneRef(ctx, gd, dir, refs[i])
		}
	}
	return results, nil
}

func deleteOneRef(ctx context.Context, gd Git, dir string, r Ref) RefResult {
	res := RefResult{Ref: r}
	now, ok, err := ResolveRef(ctx, gd, dir, r.Name)
	switch {
	case err != nil:
		res.Outcome, res.Err = RefFailed, err
	case !ok:
		res.Outcome = RefGone
	case now != r.SHA:
		res.Outcome, res.Now = RefChanged, now
	default:
		_, err := gd.Run(ctx, dir, "update-ref", "-m", "aq gc", "-d", r.Name, r.SHA)
		if err != nil && len(clearRefLocks(dir, staleRefLock, []string{r.Name})) > 0 {
			// A dead git's lock on the ref (ClearRefLocks): once more.
			_, err = gd.Run(ctx, dir, "update-ref", "-m", "aq gc", "-d", r.Name, r.SHA)
		}
		if err != nil {
			// It may have moved between the look and the delete.
			if now2, ok2, _ := ResolveRef(ctx, gd, dir, r.Name); !ok2 {
				res.Outcome = RefGone
			} else if now2 != r.SHA {
				res.Outcome, res.Now = RefChanged, now2
			} else {
				res.Outcome, res.Err = RefFailed, err
			}
			return res
		}
		res.Outcome = RefDeleted
	}
	return res
}

// DeleteRemoteRefs deletes refs (full names under refs/heads/aq/) on
// remote, each only while it still points at its SHA there
// (--force-with-lease=<ref>:<sha> per ref), with one `git push --atomic`
// per 1000 refs (again without --atomic when a lease fails or the server
// cannot do atomic pushes). A ref the remote refuses because it moved or vanished is reported
// RefChanged or RefGone (one `git ls-remote` tells them apart); one refused
// for another reason (a protected branch, a hook) is RefFailed. A push that
// fails as a whole (network, authentication) fails its refs with that error.
func DeleteRemoteRefs(ctx context.Context, g Git, dir, remote string, refs []Ref) ([]RefResult, error) {
	results := make([]RefResult, len(refs))
	var todo []int
	for i, r := range refs {
		results[i].Ref = r
		if !strings.HasPrefix(r.Name, aqRefPrefix) || r.SHA == "" {
			results[i].Outcome, results[i].Err = RefFailed, fmt.Errorf("delete remote ref: refusing %q: aq only deletes refs under %s, with the value it expects", r.Name, aqRefPrefix)
			continue
		}
		todo = append(todo, i)
	}
	gd := g.at(dir)
	var stale []int
	atomic := true
	for start := 0; start < len(todo); start += refBatch {
		batch := todo[start:min(start+refBatch, len(todo))]
		args := []string{"push", "--porcelain", "--no-verify"}
		for _, i := range batch {
			args = append(args, "--force-with-lease="+refs[i].Name+":"+refs[i].SHA)
		}
		args = append(args, "--end-of-options", remote)
		for _, i := range batch {
			args = append(args, ":"+refs[i].Name)
		}
		// One atomic push first: the server updates its refs in one
		// transaction (a files-backend server rewrites packed-refs once,
		// not once per ref). If any lease fails, nothing happened, and the
		// batch is pushed again without --atomic, ref by ref.
		if atomic {
			atomicArgs := append([]string{"push", "--atomic"}, args[1:]...)
			if _, err := gd.run(ctx, dir, nil, atomicArgs); err == nil {
				for _, i := range batch {
					results[i].Outcome = RefDeleted
				}
				continue
			} else if ctx.Err() != nil {
				return nil, ctx.Err()
			} else if ge := (*GitError)(nil); errors.As(err, &ge) && strings.Contains(ge.Stderr, "does not support --atomic") {
				atomic = false
			}
		}
		out, err := gd.run(ctx, dir, nil, args)
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		lines := parsePorcelain(string(out))
		for _, i := range batch {
			u, ok := lines[refs[i].Name]
			switch {
			case ok && u.Flag == "-":
				results[i].Outcome = RefDeleted
			case ok && u.Flag == "!" && strings.Contains(u.Summary, "stale info"):
				stale = append(stale, i) // the lease failed: moved or gone
			case ok && u.Flag == "!":
				results[i].Outcome, results[i].Err = RefFailed, fmt.Errorf("%s refused deleting %s: %s", remote, refs[i].Name, u.Summary)
			case err != nil:
				results[i].Outcome, results[i].Err = RefFailed, err
			default: // "=" or no line: nothing was there to delete
				results[i].Outcome = RefGone
			}
		}
	}
	if len(stale) > 0 {
		now, err := ListRemoteRefs(ctx, g, dir, remote, aqRefPrefix+"*")
		if err != nil {
			for _, i := range stale {
				results[i].Outcome, results[i].Err = RefFailed, err
			}
			return results, nil
		}
		at := map[string]string{}
		for _, r := range now {
			at[r.Name] = r.SHA
		}
		for _, i := range stale {
			if sha, ok := at[refs[i].Name]; ok {
				results[i].Outcome, results[i].Now = RefChanged, sha
			} else {
				results[i].Outcome = RefGone
			}
		}
	}
	return results, nil
}

// parsePorcelain reads `git push --porcelain` lines
// ("<flag>\t<src>:<dst>\t<summary>") by destination ref.
func parsePorcelain(out string) map[string]RefUpdate {
	lines := map[string]RefUpdate{}
	for _, line := range strings.Split(out, "\n") {
		f := strings.SplitN(line, "\t", 3)
		if len(f) != 3 || len(f[0]) != 1 {
			continue
		}
		src, dst, _ := strings.Cut(f[1], ":")
		lines[dst] = RefUpdate{Flag: f[0], Src: src, Dst: dst, Summary: strings.TrimSpace(f[2])}
	}
	return lines
}

// Preserve makes sure commit sha stays reachable from ref (a full ref
// under refs/heads/aq/): ref is created at sha if it does not exist; if sha
// is already in ref's history nothing changes; otherwise ref gets a commit
// with ref's tree whose parents are ref and sha (Checkpoint's parent rule).
// gc uses it for the detached HEAD of a worktree whose directory is gone,
// before `git worktree prune` forgets it. It returns ref's value after.
func Preserve(ctx context.Context, g Git, dir, ref, sha, message string) (string, error) {
	if !strings.HasPrefix(ref, aqRefPrefix) {
		return "", fmt.Errorf("preserve: refusing %q: aq only writes refs under %s", ref, aqRefPrefix)
	}
	gd := g.at(dir)
	cur, ok, err := ResolveRef(ctx, g, dir, ref)
	if err != nil {
		return "", err
	}
	if !ok {
		if _, err := gd.Run(ctx, dir, "update-ref", "-m", "aq gc", ref, sha, ""); err != nil {
			return "", err
		}
		return sha, nil
	}
	if in, err := IsAncestor(ctx, g, dir, sha, cur); err != nil || in {
		return cur, err
	}
	id, err := g.identity(ctx, dir)
	if err != nil {
		return "", err
	}
	args := append(id, "commit-tree", "--no-gpg-sign", "-m", message, "-p", cur, "-p", sha, cur+"^{tree}")
	merged, err := gd.Run(ctx, dir, args...)
	if err != nil {
		return "", err
	}
	if _, err := gd.Run(ctx, dir, "update-ref", "-m", "aq gc", ref, merged, cur); err != nil {
		return "", err
	}
	return merged, nil
}
