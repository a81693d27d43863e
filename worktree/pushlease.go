package worktree

import (
	"context"
	"fmt"
	"strings"
)

// PushWithLease replaces ref on remote with the local ref src only while the
// remote ref still points at expect ("" = the remote must not have it yet):
// `git push --force-with-lease=<ref>:<expect>`. It is a compare-and-swap on
// origin: a WIP checkpoint pushed by another factory since this one looked
// is never overwritten; the push is refused (a *PushError) instead. Only
// refs under refs/heads/aq/ may be pushed this way.
func PushWithLease(ctx context.Context, g Git, repoDir, remote, src, ref, expect string) error {
	full := fullBranchRef(ref)
	if !strings.HasPrefix(full, aqRefPrefix) {
		return fmt.Errorf("push: refusing to force-push %q: aq only rewrites refs under %s", ref, aqRefPrefix)
	}
	args := []string{"push", "--porcelain", "--no-verify", "--force-with-lease=" + full + ":" + expect,
		"--end-of-options", remote, fullBranchRef(src) + ":" + full}
	return push(ctx, g, repoDir, remote, args)
}

// Lease is one ref of PushAtomicWithLease: the local ref Src replaces Ref
// on the remote only while the remote's Ref still points at Expect ("" =
// the remote must not have it yet).
type Lease struct {
	Src, Ref, Expect string
}

// PushAtomicWithLease is PushWithLease of several refs in one `git push
// --atomic`: each is a compare-and-swap, and either every ref is updated or
// none is. A push refused for one ref is refused for all (a *PushError
// listing them; git names the others "atomic push failed"); a remote that
// cannot push atomically refuses it too. Only refs under refs/heads/aq/ may
// be pushed this way.
func PushAtomicWithLease(ctx context.Context, g Git, repoDir, remote string, leases ...Lease) error {
	if len(leases) == 0 {
		return fmt.Errorf("push: no ref")
	}
	args := []string{"push", "--porcelain", "--no-verify", "--atomic"}
	var specs []string
	for _, l := range leases {
		full := fullBranchRef(l.Ref)
		if !strings.HasPrefix(full, aqRefPrefix) {
			return fmt.Errorf("push: refusing to force-push %q: aq only rewrites refs under %s", l.Ref, aqRefPrefix)
		}
		args = append(args, "--force-with-lease="+full+":"+l.Expect)
		specs = append(specs, fullBranchRef(l.Src)+":"+full)
	}
	args = append(append(args, "--end-of-options", remote), specs...)
	return push(ctx, g, repoDir, remote, args)
}
