package runner

// Untrusted files: what aq refused to read or write in the trees an
// engine could write (internal/safefs; docs/sandbox.md, "What aq reads
// from the engine's trees"). A refusal is an event of the job, a line in
// its log and an entry of its insights — never a crash, never a hang.

import (
	"github.com/aqfleet/aq/internal/safefs"
	"github.com/aqfleet/aq/job"
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
