package sandbox

import (
	"path/filepath"
	"strings"
)

// HiddenFix is what to do about a path a job names that its sandbox hides.
const HiddenFix = "put it in the repository, name its folder in AQ_SANDBOX_WRITABLE, or set AQ_SANDBOX=off"

// HiddenIn lists, one line each, the paths command names (CommandPaths) that
// policy p hides from the job, with why: "/tmp/fix.sh (/tmp is the job's
// own inside the sandbox)".
func (p Policy) HiddenIn(command, home string) []string {
	var out []string
	for _, path := range CommandPaths(command, home) {
		if ok, why := p.Visible(path); !ok {
			out = append(out, path+" ("+why+")")
		}
	}
	return out
}

// CommandPaths are the host paths a shell command line names: each
// command's first word and every other word that is an absolute path or
// starts with ~/ or $HOME/ (with home put in), except the targets of
// output redirections (what the command writes, not what it needs).
// Relative words are the worktree's and are left out; so are bare command
// names (PATH's directories stay readable inside the sandbox).
func CommandPaths(command, home string) []string {
	var out []string
	seen := map[string]bool{}
	add := func(w string) {
		switch {
		case strings.HasPrefix(w, "~/") && home != "":
			w = filepath.Join(home, w[2:])
		case strings.HasPrefix(w, "$HOME/") && home != "":
			w = filepath.Join(home, w[6:])
		case strings.HasPrefix(w, "${HOME}/") && home != "":
			w = filepath.Join(home, w[8:])
		}
		if filepath.IsAbs(w) && !seen[filepath.Clean(w)] {
			seen[filepath.Clean(w)] = true
			out = append(out, filepath.Clean(w))
		}
	}
	redirect := false
	for _, w := range shellWords(command) {
		switch {
		case w == ";" || w == "|" || w == "&" || w == "&&" || w == "||" || w == "(" || w == ")":
			redirect = false
			continue
		case strings.HasSuffix(w, ">") || strings.HasSuffix(w, ">>") || w == ">|":
			redirect = true // the next word is written to
			continue
		case redirect:
			redirect = false
			continue
		}
		if _, v, ok := strings.Cut(w, "="); ok && !strings.HasPrefix(w, "/") {
			w = v // --config=/etc/x, or an assignment: its value
		}
		add(w)
	}
	return out
}

// shellWords splits a command line into words and operators the way a
// reader would: quotes group and are removed, ; | & ( ) < > separate.
func shellWords(s string) []string {
	var (
		out   []string
		cur   strings.Builder
		quote rune
		inW   bool
	)
	flush := func() {
		if inW {
			out = append(out, cur.String())
			cur.Reset()
			inW = false
		}
	}
	rs := []rune(s)
	for i := 0; i < len(rs); i++ {
		r := rs[i]
		switch {
		case quote != 0:
			if r == quote {
				quote = 0
			} else {
				cur.WriteRune(r)
			}
		case r == '\'' || r == '"':
			quote, inW = r, true
		case r == ' ' || r == '\t' || r == '\n':
			flush()
		case strings.ContainsRune(";|&()<>`", r):
			// 2>file: the digit is the operator's.
			if (r == '>' || r == '<') && inW && isDigits(cur.String()) {
				cur.Reset()
				inW = false
			}
			flush()
			op := string(r)
			for i+1 < len(rs) && strings.ContainsRune("|&>", rs[i+1]) && r != '(' && r != ')' && r != ';' {
				i++
				op += string(rs[i])
			}
			out = append(out, op)
		default:
			cur.WriteRune(r)
			inW = true
		}
	}
	flush()
	return out
}

func isDigits(s string) bool {
	if s == "" {
		return false
	}
	for _, r := range s {
		if r < '0' || r > '9' {
			return false
		}
	}
	return true
}
