package shipcheck

import (
	"fmt"
	"path"
	"strings"

	"github.com/bmatcuk/doublestar/v4"
)

// DefaultProtected are the paths a change may not touch unless its
// manifest's may_change names them (docs/sandbox.md, "What ships is
// checked"): CI and ownership configuration, whose change runs with the
// repository's secrets on the next push, and aq's own. AQ_PROTECTED_PATHS
// replaces the list.
var DefaultProtected = []string{
	".github/workflows/**",
	".github/actions/**",
	".gitlab-ci.yml",
	".circleci/**",
	".buildkite/**",
	"CODEOWNERS",
	".github/CODEOWNERS",
	"docs/CODEOWNERS",
	".aq/**",
}

// ParseGlobs splits a comma-separated list of globs (AQ_PROTECTED_PATHS)
// and checks each with CheckGlob; empty items are skipped.
func ParseGlobs(list string) ([]string, error) {
	var out []string
	for _, g := range strings.Split(list, ",") {
		g = strings.TrimSpace(g)
		if g == "" {
			continue
		}
		if err := CheckGlob(g); err != nil {
			return nil, err
		}
		out = append(out, g)
	}
	return out, nil
}

// CheckGlob says what is wrong with a protected-path or may_change glob:
// a doublestar pattern (`**` for any depth) relative to the repository's
// root, with '/' between its parts — never absolute, never with a '..'
// part (nothing outside the repository is ever in a change).
func CheckGlob(g string) error {
	switch {
	case g == "":
		return fmt.Errorf("an empty path")
	case strings.HasPrefix(g, "/") || strings.HasPrefix(g, `\`) || (len(g) > 1 && g[1] == ':'):
		return fmt.Errorf("%q is absolute: write it relative to the repository's root (e.g. .github/workflows/ci.yml)", g)
	case strings.Contains(g, `\`):
		return fmt.Errorf("%q has a '\\': separate its parts with '/' (e.g. .github/workflows/ci.yml)", g)
	}
	for _, part := range strings.Split(g, "/") {
		if part == ".." {
			return fmt.Errorf("%q is outside the repository: write a path below its root, without '..' (e.g. .github/workflows/ci.yml)", g)
		}
	}
	if !doublestar.ValidatePattern(g) {
		return fmt.Errorf("%q is not a valid glob (an unclosed '[' or '{'?): e.g. .github/workflows/** or docs/*.md", g)
	}
	return nil
}

// Match reports whether the repository path p matches one of globs. A
// glob ending in "/**" also matches the directory itself (a file put where
// the directory was).
func Match(globs []string, p string) bool {
	p = strings.TrimPrefix(path.Clean("/"+p), "/")
	for _, g := range globs {
		if doublestar.MatchUnvalidated(g, p) {
			return true
		}
	}
	return false
}
