package worktree

import (
	"context"
	"errors"
	"fmt"
	"strings"
)

// aqRefPrefix is aq's namespace: the only refs aq force-pushes or deletes
// (docs/gc.md, "Never": gc never touches refs outside aq/).
const aqRefPrefix = "refs/heads/aq/"

// Push pushes refspecs to remote from repoDir: `git push --porcelain
// --no-verify remote refspecs...`. Nothing is forced except a refspec that
// starts with "+", and that is allowed only when its destination is in aq's
// own namespace (refs/heads/aq/..., used for aq/wip/* checkpoints): a forced
// push anywhere else is refused before git runs. A push the remote refuses for
// some refs is a *PushError listing them (wrapping the *GitError); a network
// or authentication failure is the *GitError itself.
func Push(ctx context.Context, g Git, repoDir, remote string, refspecs ...string) error {
	if len(refspecs) == 0 {
		return errors.New("push: no refspec")
	}
	for _, rs := range refspecs {
		if err := checkRefspec(rs); err != nil {
			return err
		}
	}
	args := append([]string{"push", "--porcelain", "--no-verify", "--end-of-options", remote}, refspecs...)
	return push(ctx, g, repoDir, remote, args)
}

func push(ctx context.Context, g Git, repoDir, remote string, args []string) error {
	out, err := g.at(repoDir).run(ctx, repoDir, nil, args)
	if err == nil {
		return nil
	}
	if rejected := parsePushRejections(string(out)); len(rejected) > 0 {
		return &PushError{Remote: remote, Rejected: rejected, Err: err}
	}
	return err
}

// checkRefspec allows "src", "src:dst", ":dst" (a delete) and, for
// destinations under refs/heads/aq/, "+src:dst".
func checkRefspec(rs string) error {
	spec, forced := strings.CutPrefix(rs, "+")
	src, dst, hasColon := strings.Cut(spec, ":")
	if spec == "" || strings.HasPrefix(spec, "-") || (hasColon && dst == "") {
		return fmt.Errorf("push: invalid refspec %q", rs)
	}
	if !hasColon {
		dst = src
	}
	if (forced || src == "") && !strings.HasPrefix(fullBranchRef(dst), aqRefPrefix) {
		what := "force-push to"
		if src == "" {
			what = "delete"
		}
		return fmt.Errorf("push: refusing to %s %q: aq only rewrites refs under %s", what, dst, aqRefPrefix)
	}
	return nil
}

// parsePushRejections picks the refused refs from `git push --porcelain`
// output: "<flag>\t<src>:<dst>\t<summary>" lines whose flag is "!".
func parsePushRejections(out string) []RefUpdate {
	var rejected []RefUpdate
	for _, line := range strings.Split(out, "\n") {
		f := strings.SplitN(line, "\t", 3)
		if len(f) != 3 || f[0] != "!" {
			continue
		}
		src, dst, _ := strings.Cut(f[1], ":")
		rejected = append(rejected, RefUpdate{Flag: f[0], Src: src, Dst: dst, Summary: strings.TrimSpace(f[2])})
	}
	return rejected
}

// RemoteRef asks remote where ref points (`git ls-remote`); ok is false when
// the remote has no such ref.
func RemoteRef(ctx context.Context, g Git, dir, remote, ref string) (sha string, ok bool, err error) {
	full := fullBranchRef(ref)
	out, err := g.at(dir).Run(ctx, dir, "ls-remote", "--exit-code", "--end-of-options", remote, full)
	if err != nil {
		if exitCode(err) == 2 { // --exit-code: no matching ref
			return "", false, nil
		}
		return "", false, err
	}
	for _, line := range strings.Split(out, "\n") {
		s, name, _ := strings.Cut(line, "\t")
		if name == full {
			return s, true, nil
		}
	}
	return "", false, nil
}

// Fetch fetches refspecs from remote into repoDir (`git fetch --no-tags`),
// e.g. "+refs/heads/aq/wip/x:refs/remotes/origin/aq/wip/x" to see another
// factory's checkpoint without overwriting a local one.
func Fetch(ctx context.Context, g Git, repoDir, remote string, refspecs ...string) error {
	args := append([]string{"fetch", "--quiet", "--no-tags", "--no-write-fetch-head", "--end-of-options", remote}, refspecs...)
	_, err := g.at(repoDir).Run(ctx, repoDir, args...)
	return err
}

// Ref is a ref and the object it points at.
type Ref struct {
	Name string // full name, refs/heads/aq/wip/x
	SHA  string
}
