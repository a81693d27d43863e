package worktree

// aq's own record of where a linked worktree's git directory is. The
// worktree's .git file ("gitdir: …") is the engine's to rewrite: one that
// points it at another repository would send aq's next commit or push
// there, and make Reset clear another worktree's git directory. The
// repository's own registration of its worktrees
// (<common>/worktrees/<name>/gitdir, which names the worktree's .git) is
// not: with the sandbox on, the repository's git directory is read-only to
// the engine. So for a worktree of a repository aq runs jobs of
// (TrustRepo), the git directory is found from that registration, and
// every git aq runs there gets GIT_DIR and GIT_COMMON_DIR pinned to it.

import (
	"os"
	"path/filepath"
	"strings"
	"sync"

	"github.com/aqfleet/aq/internal/safefs"
)

var records struct {
	sync.Mutex
	commons map[string]bool   // the common git directories of trusted repositories
	byPath  map[string]string // a worktree's absolute path → its git directory
}

// TrustRepo records repoDir as a repository aq runs jobs of: the git
// directory of each of its linked worktrees is found from the
// repository's registration, not from the worktree's .git file.
func TrustRepo(repoDir string) {
	abs, err := filepath.Abs(repoDir)
	if err != nil {
		return
	}
	var common string
	switch dotgit := filepath.Join(abs, ".git"); {
	case dirExists(dotgit):
		common = dotgit
	case isGitDir(abs):
		common = abs // bare
	default:
		return
	}
	records.Lock()
	defer records.Unlock()
	if records.commons == nil {
		records.commons = map[string]bool{}
		records.byPath = map[string]string{}
	}
	records.commons[common] = true
}

// recordedGitDir is the git directory and common directory of the linked
// worktree at abs as a trusted repository registered it; ok is false for
// a directory no trusted repository has as a worktree.
func recordedGitDir(abs string) (gitDir, commonDir string, ok bool) {
	want := filepath.Join(abs, ".git")
	records.Lock()
	defer records.Unlock()
	if len(records.commons) == 0 {
		return "", "", false
	}
	if x, hit := records.byPath[abs]; hit && pointsAt(x, want) {
		return x, filepath.Dir(filepath.Dir(x)), true
	}
	delete(records.byPath, abs)
	for c := range records.commons {
		ents, err := os.ReadDir(filepath.Join(c, "worktrees"))
		if err != nil {
			continue
		}
		for _, e := range ents {
			x := filepath.Join(c, "worktrees", e.Name())
			if e.IsDir() && pointsAt(x, want) {
				records.byPath[abs] = x
				return x, c, true
			}
		}
	}
	return "", "", false
}

// pointsAt reports whether the worktree git directory x is registered for
// the worktree whose .git is want.
func pointsAt(x, want string) bool {
	b, err := os.ReadFile(filepath.Join(x, "gitdir"))
	if err != nil {
		return false
	}
	got := filepath.Clean(strings.TrimSpace(string(b)))
	if got == want {
		return true
	}
	// One side may have been written through a symbolic link (a TMPDIR
	// under /var on macOS).
	rg, err1 := filepath.EvalSymlinks(filepath.Dir(got))
	rw, err2 := filepath.EvalSymlinks(filepath.Dir(want))
	return err1 == nil && err2 == nil && rg == rw
}

// GitDirsOf are the worktree's git metadata outside it, as aq's record
// has it: the repository's common git directory and the worktree's own;
// nil for a directory no trusted repository has as a worktree.
func GitDirsOf(path string) []string {
	abs, err := filepath.Abs(path)
	if err != nil {
		return nil
	}
	x, c, ok := recordedGitDir(abs)
	if !ok {
		return nil
	}
	return []string{c, x}
}

// RestoreDotGit puts back the worktree's .git file as aq's record has it
// when the engine changed it (pointed it elsewhere, or made it a link, a
// directory, a FIFO), so that every git after aq's — gh's, a person's —
// finds the right repository too. It reports whether it had to; a
// worktree of no trusted repository is left as it is.
func RestoreDotGit(path string) (bool, error) {
	abs, err := filepath.Abs(path)
	if err != nil {
		return false, err
	}
	x, _, ok := recordedGitDir(abs)
	if !ok {
		return false, nil
	}
	b, err := safefs.ReadFile("worktree", abs, ".git", 4096)
	if err == nil {
		if got, ok := strings.CutPrefix(strings.TrimSpace(string(b)), "gitdir:"); ok && filepath.Clean(strings.TrimSpace(got)) == x {
			return false, nil
		}
	}
	if err := os.RemoveAll(filepath.Join(abs, ".git")); err != nil { // RemoveAll follows no link
		return true, err
	}
	return true, safefs.WriteFile("worktree", abs, ".git", []byte("gitdir: "+x+"\n"), 0o644)
}
