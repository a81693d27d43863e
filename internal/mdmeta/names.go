package mdmeta

import (
	"fmt"
	"regexp"
	"strings"
	"sync"
)

// NamePattern is the grammar of job ids, repo names, product ids and profile
// names (docs/manifest.md, "Keys"). It admits no path separators, no shell metacharacters
// and no leading dot or dash; "..", which the pattern alone would allow, is
// refused by CheckName.
var NamePattern = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$`) })

// CheckName returns what is wrong with s as a name ("contains \"..\"", ...),
// for the caller to put after the name, or "" when s is valid.
func CheckName(s string) string {
	switch {
	case s == "":
		return "is empty"
	case len(s) > 128:
		return fmt.Sprintf("is %d bytes long, over the limit of 128", len(s))
	case strings.Contains(s, ".."):
		return `contains ".."`
	case !NamePattern().MatchString(s):
		return "must start with a letter or digit and use only letters, digits, '.', '_' and '-'"
	}
	return ""
}

// Suggest returns the entry of known closest to s — the same word in another
// case or spelling (depsmode, deps_mode for depsMode), or within a small edit
// distance — or "" when none is close.
func Suggest(s string, known []string) string {
	norm := func(x string) string {
		return strings.ToLower(strings.NewReplacer("_", "", "-", "", " ", "").Replace(x))
	}
	for _, k := range known {
		if norm(k) == norm(s) {
			return k
		}
	}
	best, bestD := "", 0
	limit := 2
	if len(s) <= 4 {
		limit = 1
	}
	for _, k := range known {
		if d := distance(strings.ToLower(s), strings.ToLower(k)); d <= limit && (best == "" || d < bestD) {
			best, bestD = k, d
		}
	}
	return best
}

// distance is the Levenshtein distance between a and b, with an adjacent
// transposition counted as one edit (titel → title).
func distance(a, b string) int {
	ra, rb := []rune(a), []rune(b)
	if len(ra) > 64 || len(rb) > 64 {
		if a == b {
			return 0
		}
		return 1 << 20
	}
	d := make([][]int, len(ra)+1)
	for i := range d {
		d[i] = make([]int, len(rb)+1)
		d[i][0] = i
	}
	for j := range d[0] {
		d[0][j] = j
	}
	for i := 1; i <= len(ra); i++ {
		for j := 1; j <= len(rb); j++ {
			cost := 1
			if ra[i-1] == rb[j-1] {
				cost = 0
			}
			d[i][j] = min(d[i-1][j]+1, d[i][j-1]+1, d[i-1][j-1]+cost)
			if i > 1 && j > 1 && ra[i-1] == rb[j-2] && ra[i-2] == rb[j-1] {
				d[i][j] = min(d[i][j], d[i-2][j-2]+1)
			}
		}
	}
	return d[len(ra)][len(rb)]
}
