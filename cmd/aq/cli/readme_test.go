package cli

import (
	"path/filepath"
	"testing"

	"github.com/aqfleet/aq/cmd/aq/clitest"
)

// TestReadmeEngineManifestIsValid: the README's "same job with Claude Code
// or Codex" manifest passes aq validate (it is not run: that needs the
// engine's account).
func TestReadmeEngineManifestIsValid(t *testing.T) {
	_, jobs := manifestEnv(t)
	m := clitest.ReadmeBlock(t, "### The same job with Claude Code or Codex", "markdown")
	file := writeFile(t, filepath.Join(jobs, "fix-title.md"), m)
	out, errOut, code := runAQ(t, "validate", file)
	if code != 0 || out != "ok "+file+" id=fix-title repo=webapp engine=claude\n" {
		t.Fatalf("the README's claude manifest: exit %d stdout %q stderr %q\n%s", code, out, errOut, m)
	}
}
