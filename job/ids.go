package job

import (
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"unicode"
	"unicode/utf8"
)

// idPattern is the grammar of a job id (docs/manifest.md): letters, digits,
// '.', '_' and '-', starting with a letter or digit, at most 128 bytes. It
// admits no path separator and no shell metacharacter.
var idPattern = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$`) })

// MaxIDLen is the longest job id, in bytes.
const MaxIDLen = 128

// CheckID returns what is wrong with id as a job id, for the caller to put
// after the id ("is empty", `contains ".."`, …), or "" when it is valid.
//
// An id names files under $AQ_HOME (the job's record, lock, logs, worktree,
// spool entries) and the branches aq/job/<id> and aq/wip/<id>: it may not
// hold a path separator or "..", and may not end in ".lock" or ".", which
// git refuses in a branch name. It is the one rule for every job, wherever
// it came from: a manifest, a claim, an accept or a broker message.
func CheckID(id string) string {
	switch {
	case id == "":
		return "is empty"
	case len(id) > MaxIDLen:
		return fmt.Sprintf("is %d bytes long, over the limit of %d", len(id), MaxIDLen)
	case strings.Contains(id, ".."):
		return `contains ".."`
	case !idPattern().MatchString(id):
		return "must start with a letter or digit and use only letters, digits, '.', '_' and '-'"
	case strings.HasSuffix(id, ".lock") || strings.HasSuffix(id, "."):
		return `ends in ".lock" or ".", which git refuses in the branch aq/job/<id>`
	}
	return ""
}

// ValidID reports whether id is a valid job id (CheckID).
func ValidID(id string) bool { return CheckID(id) == "" }

// showMax is how much of an untrusted value Show keeps.
const showMax = 64

// Show renders an untrusted value (an id or a name from a manifest, a
// coordinator or a broker message) for one line of a message or a log: a
// valid id as it is; anything else quoted with its control characters
// escaped and cut to 64 characters, so that a 10 KB id or an escape sequence
// never reaches a terminal or a log whole.
func Show(v string) string {
	if ValidID(v) {
		return v
	}
	cut := ""
	if utf8.RuneCountInString(v) > showMax {
		r := []rune(v)
		v, cut = string(r[:showMax]), fmt.Sprintf("… (%d bytes)", len(v))
	}
	return strconv.Quote(v) + cut
}

// Printable returns s with every control character (an ESC that would
// steer a terminal, a NUL, a carriage return) removed, and other
// non-graphic runes replaced by U+FFFD: for text that came from a job's
// author or a coordinator and is shown on a terminal (a title, a detail).
// Tabs become spaces; newlines are kept only when keepNewlines is set.
func Printable(s string, keepNewlines bool) string {
	clean := true
	for _, r := range s {
		if r == utf8.RuneError || !unicode.IsGraphic(r) {
			clean = false
			break
		}
	}
	if clean {
		return s
	}
	return strings.Map(func(r rune) rune {
		switch {
		case r == '\n' && keepNewlines:
			return r
		case r == '\t':
			return ' '
		case unicode.IsControl(r):
			return -1
		case r == utf8.RuneError || !unicode.IsGraphic(r):
			return '\uFFFD'
		}
		return r
	}, s)
}
