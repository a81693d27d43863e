package worktree

import (
	"bytes"
	"context"
	"io"
)

// Stream runs git with args in dir, hardened like Run, with stdin (nil:
// empty) and its stdout written to out as it comes: for plumbing whose
// input or output is too large to hold (`cat-file --batch` over a change's
// blobs, `rev-list --stdin` over many refs). A failure is a *GitError.
func (g Git) Stream(ctx context.Context, dir string, stdin io.Reader, out io.Writer, args ...string) error {
	g = g.at(dir)
	cmd, err := g.command(ctx, dir, args, nil)
	if err != nil {
		return err
	}
	var stderr bytes.Buffer
	cmd.Stdin, cmd.Stdout, cmd.Stderr = stdin, out, &stderr
	if err := cmd.Run(); err != nil {
		gerr := &GitError{Args: append([]string(nil), args...), Dir: dir, ExitCode: exitCode(err), Stderr: stderr.String(), Err: err}
		if cerr := ctx.Err(); cerr != nil {
			gerr.Err = cerr
		}
		return gerr
	}
	return nil
}
