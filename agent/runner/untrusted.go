package runner

// Untrusted files: what aq refused to read or write in the trees an
// engine could write (internal/safefs; docs/sandbox.md, "What aq reads
// from the engine's trees"). A refusal is an event of the job, a line in
// its log and an entry of its insights — never a crash, never a hang.

import (
	"github.com/aqfleet/aq/internal/safefs"
	"github.com/aqfleet/aq/job"
	"github.com/aqfleet/aq/worktree"
)

// untrusted records err when it is a refusal (internal/safefs) and
// reports whether it was one.
func (ru *run) untrusted(err error) bool {
	ref, ok := safefs.AsRefused(err)
	if !ok {
		return false
	}
	f := job.UntrustedFile{Tree: ref.Tree, Path: ref.Path, Why: ref.Why}
	ru.log.Warn("aq refused a file the engine left", "tree", f.Tree, "path", f.Path, "why", f.Why)
	ru.event(UntrustedFileRefused{File: f})
	ins := &ru.out.Insights
	for _, u := range ins.UntrustedFiles {
		if u == f {
			return true
		}
	}
	if len(ins.UntrustedFiles) < job.MaxUntrustedFiles {
		ins.UntrustedFiles = append(ins.UntrustedFiles, f)
	}
	return true
}

// removeSpecialFiles restores a rewritten .git and removes the FIFOs, sockets and devices the engine
// left in its worktree before aq runs git there (a FIFO named .gitignore
// hangs git status; git clean leaves them for the pool's next job), each
// recorded as refused.
func (ru *run) removeSpecialFiles() {
	// The .git file first: an engine that pointed it at another
	// repository gets it put back from aq's record (worktree/record.go).
	if restored, err := worktree.RestoreDotGit(ru.wtPath); restored {
		ru.untrusted(&safefs.Refused{Tree: "worktree", Path: ".git", Why: "rewritten by the engine (restored from aq's record)"})
		if err != nil {
			ru.log.Warn("cannot restore the worktree's .git", "err", err)
		}
	}
	removed, err := worktree.RemoveSpecialFiles(ru.wtPath)
	for _, f := range removed {
		ru.untrusted(&safefs.Refused{Tree: "worktree", Path: f.Path, Why: f.Kind + " (removed)"})
	}
	if err != nil {
		ru.log.Warn("cannot remove every FIFO, socket or device the engine left in its worktree", "err", err)
	}
}
