package sandbox

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

var updateSeatbelt = flag.Bool("update-seatbelt", false, "rewrite testdata/seatbelt/*.sb from the current output")

// seatbeltPolicy is a job's policy on a Mac: its worktree under
// $AQ_HOME, the repository's git metadata under the repo base, a
// toolchain and a cache in the user's home, a token file inside the
// toolchain, and its egress proxy's port.
func seatbeltPolicy() Policy {
	return Policy{
		Worktree:    "/Users/dev/.aq/worktrees/app/fix-login",
		GitDirs:     []string{"/Users/dev/src/app/.git", "/Users/dev/src/app/.git/worktrees/fix-login"},
		Home:        "/Users/dev",
		JobDir:      "/Users/dev/.aq/sandbox/fix-login",
		Hidden:      []string{"/Users/dev/.aq", "/Users/dev/src", "/var/run"},
		HiddenFiles: []string{"/Users/dev/.cargo/bin/credentials.toml"},
		ReadOnly:    []string{"/Users/dev/.local/bin", "/Users/dev/.cargo/bin"},
		Caches:      []string{"/Users/dev/go/pkg/mod", "/Users/dev/.npm"},
		Net:         Net{ProxyPort: 41873},
	}
}

// darwinResolve is how macOS resolves the policy's paths: /tmp, /var and
// /etc are links into /private.
func darwinResolve(p string) string {
	for _, l := range []string{"/tmp", "/var", "/etc"} {
		if within(p, l) {
			return "/private" + p
		}
	}
	return p
}

// TestSeatbeltGolden: the profile generated from a policy, byte for byte
// (go test ./internal/sandbox -run TestSeatbeltGolden -update-seatbelt
// after an intended change; review the diff).
func TestSeatbeltGolden(t *testing.T) {
	odd := seatbeltPolicy()
	odd.Worktree = `/Users/dev/.aq/worktrees/app/a "quoted" \ job`
	odd.Net = Net{}
	for name, tc := range map[string]struct {
		p       Policy
		resolve func(string) string
	}{
		"job":          {seatbeltPolicy(), darwinResolve},
		"no-network":   {func() Policy { p := seatbeltPolicy(); p.Net = Net{}; return p }(), darwinResolve},
		"quoted-paths": {odd, nil},
	} {
		t.Run(name, func(t *testing.T) {
			got := Seatbelt(tc.p, tc.resolve)
			golden := filepath.Join("testdata", "seatbelt", name+".sb")
			if *updateSeatbelt {
				if err := os.MkdirAll(filepath.Dir(golden), 0o755); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(golden, []byte(got), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			want, err := os.ReadFile(golden)
			if err != nil {
				t.Fatalf("%v (run with -update-seatbelt to create it)", err)
			}
			if got != string(want) {
				t.Errorf("the profile differs from %s (run with -update-seatbelt if intended):\n%s", golden, got)
			}
			if _, err := parseSBPL(got); err != nil {
				t.Errorf("the profile does not parse: %v", err)
			}
		})
	}
}

// TestSeatbeltMeaning reads the generated profile as Seatbelt does — the
// last rule that matches an operation on a path decides, (deny default)
// when none does — and checks what the engine may do, path by path: the
// policy of docs/sandbox.md, as a Mac would enforce it.
func TestSeatbeltMeaning(t *testing.T) {
	prof, err := parseSBPL(Seatbelt(seatbeltPolicy(), darwinResolve))
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		op, target string
		allow      bool
	}{
		// The job's own.
		{"file-read-data", "/Users/dev/.aq/worktrees/app/fix-login/main.go", true},
		{"file-write-create", "/Users/dev/.aq/worktrees/app/fix-login/new.go", true},
		{"file-write-data", "/Users/dev/.aq/sandbox/fix-login/home/.claude.json", true},
		{"file-write-create", "/Users/dev/.aq/sandbox/fix-login/tmp/x", true},
		{"file-write-create", "/Users/dev/.aq/sandbox/fix-login/state/prompt", true},
		// The way there: metadata only.
		{"file-read-metadata", "/Users/dev/.aq", true},
		{"file-read-metadata", "/Users/dev/.aq/worktrees/app", true},
		{"file-read-data", "/Users/dev/.aq/worktrees/app", false},
		{"file-read-metadata", "/Users/dev/.aq/credentials", false},
		// aq's trees, other jobs, other repositories, the user's home.
		{"file-read-data", "/Users/dev/.aq/credentials", false},
		{"file-read-data", "/Users/dev/.aq/queue/inbox/other.md", false},
		{"file-read-data", "/Users/dev/.aq/worktrees/app/other-job/x", false},
		{"file-read-data", "/Users/dev/.aq/sandbox/other-job/home/.claude.json", false},
		{"file-read-data", "/Users/dev/.aq/sandbox/fix-login/cache/0/x", false},
		{"file-read-data", "/Users/dev/src/other/secret.txt", false},
		{"file-read-data", "/Users/dev/.ssh/id_ed25519", false},
		{"file-read-data", "/Users/dev/Library/Keychains/login.keychain-db", false},
		{"file-write-create", "/Users/dev/aq-escape", false},
		{"file-read-data", "/private/var/run/docker.sock", false},
		// The job's git metadata: readable, never writable.
		{"file-read-data", "/Users/dev/src/app/.git/config", true},
		{"file-write-data", "/Users/dev/src/app/.git/config", false},
		{"file-write-create", "/Users/dev/src/app/.git/hooks/post-commit", false},
		{"file-write-create", "/Users/dev/src/app/.git/worktrees/fix-login/index", false},
		// Toolchains and caches: read-only; a token inside them hidden.
		{"file-read-data", "/Users/dev/.local/bin/claude", true},
		{"file-write-data", "/Users/dev/.local/bin/claude", false},
		{"file-read-data", "/Users/dev/go/pkg/mod/cache/x.zip", true},
		{"file-write-create", "/Users/dev/go/pkg/mod/evil", false},
		{"file-read-data", "/Users/dev/.cargo/bin/cargo", true},
		{"file-read-data", "/Users/dev/.cargo/bin/credentials.toml", false},
		// The host: read-only; its temporary directories out of sight.
		{"file-read-data", "/usr/bin/git", true},
		{"file-write-create", "/usr/local/aq-escape", false},
		{"file-read-data", "/private/etc/hosts", true},
		{"file-read-data", "/private/tmp/aq-other", false},
		{"file-write-create", "/private/tmp/aq-escape", false},
		{"file-read-data", "/private/var/folders/xy/abc/T/aq-pr-body", false},
		// Devices a shell writes to.
		{"file-write-data", "/dev/null", true},
		{"file-write-data", "/dev/ttys003", true},
		{"file-write-data", "/dev/fd/1", true},
		{"file-write-data", "/dev/disk0", false},
		// Processes and the network.
		{"process-exec", "/bin/sh", true},
		{"signal", "same-sandbox", true},
		{"signal", "others", false},
		{"process-info-pidinfo", "others", false},
		{"network-outbound", "tcp localhost:41873", true},
		{"network-outbound", "tcp localhost:22", false},
		{"network-outbound", "tcp *:443", false},
		{"network-outbound", "udp *:53", false},
		{"network-bind", "tcp localhost:8080", false},
		{"mach-lookup", "com.apple.system.opendirectoryd.libinfo", true},
		{"mach-lookup", "com.apple.SecurityServer", false},
		{"sysctl-read", "hw.ncpu", true},
		{"sysctl-read", "kern.procargs2", false},
		{"sysctl-read", "kern.proc.all", false},
	} {
		if got := prof.allows(tc.op, tc.target); got != tc.allow {
			t.Errorf("%s %s: allowed %v, want %v", tc.op, tc.target, got, tc.allow)
		}
	}
	// Without a proxy, no network at all.
	none, err := parseSBPL(Seatbelt(Policy{Worktree: "/w", JobDir: "/j"}, nil))
	if err != nil {
		t.Fatal(err)
	}
	if none.allows("network-outbound", "tcp localhost:41873") {
		t.Error("a job without a proxy reaches localhost")
	}
}

// sbplRule is one (allow|deny OPERATION... FILTER...) of a profile.
type sbplRule struct {
	allow   bool
	ops     []string
	filters [][]string // (kind arg...)
}

type sbplProfile struct{ rules []sbplRule }

// allows is Seatbelt's decision for op on target: the last matching rule.
func (p sbplProfile) allows(op, target string) bool {
	allow := false
	for _, r := range p.rules {
		if r.matches(op, target) {
			allow = r.allow
		}
	}
	return allow
}

func (r sbplRule) matches(op, target string) bool {
	opOK := false
	for _, o := range r.ops {
		switch {
		case o == "default", o == op:
			opOK = true
		case strings.HasSuffix(o, "*") && strings.HasPrefix(op, strings.TrimSuffix(o, "*")):
			opOK = true
		}
	}
	if !opOK {
		return false
	}
	if len(r.filters) == 0 {
		return true
	}
	for _, f := range r.filters {
		switch f[0] {
		case "subpath":
			if within(target, f[1]) {
				return true
			}
		case "literal":
			if target == f[1] {
				return true
			}
		case "regex":
			if regexp.MustCompile(f[1]).MatchString(target) {
				return true
			}
		case "target", "global-name", "sysctl-name":
			if target == f[1] {
				return true
			}
		case "sysctl-name-prefix":
			if strings.HasPrefix(target, f[1]) {
				return true
			}
		case "remote":
			if target == f[1]+" "+f[2] {
				return true
			}
		}
	}
	return false
}

// parseSBPL reads the subset of SBPL the generator writes: comments,
// strings, #"regex" literals, symbols and lists.
func parseSBPL(src string) (sbplProfile, error) {
	toks, err := sbplTokens(src)
	if err != nil {
		return sbplProfile{}, err
	}
	var prof sbplProfile
	i := 0
	var list func() ([]any, error)
	list = func() ([]any, error) {
		if toks[i] != "(" {
			return nil, fmt.Errorf("want ( at token %d, got %q", i, toks[i])
		}
		i++
		var out []any
		for i < len(toks) && toks[i] != ")" {
			if toks[i] == "(" {
				l, err := list()
				if err != nil {
					return nil, err
				}
				out = append(out, l)
				continue
			}
			out = append(out, toks[i])
			i++
		}
		if i >= len(toks) {
			return nil, fmt.Errorf("unbalanced parentheses")
		}
		i++
		return out, nil
	}
	for i < len(toks) {
		form, err := list()
		if err != nil {
			return prof, err
		}
		head, _ := form[0].(string)
		switch head {
		case "version":
			continue
		case "allow", "deny":
		default:
			return prof, fmt.Errorf("unknown form %q", head)
		}
		r := sbplRule{allow: head == "allow"}
		for _, x := range form[1:] {
			switch v := x.(type) {
			case string:
				r.ops = append(r.ops, v)
			case []any:
				var f []string
				for _, a := range v {
					s, ok := a.(string)
					if !ok {
						return prof, fmt.Errorf("nested filter in %v", v)
					}
					f = append(f, strings.TrimPrefix(s, "\x00"))
				}
				r.filters = append(r.filters, f)
			}
		}
		if len(r.ops) == 0 {
			return prof, fmt.Errorf("a rule without an operation: %v", form)
		}
		prof.rules = append(prof.rules, r)
	}
	return prof, nil
}

// sbplTokens splits src into "(", ")", symbols and the values of string
// and regex literals (marked with a NUL, so a literal "(" is no list).
func sbplTokens(src string) ([]string, error) {
	var out []string
	for i := 0; i < len(src); {
		c := src[i]
		switch {
		case c == ';':
			for i < len(src) && src[i] != '\n' {
				i++
			}
		case c == ' ' || c == '\n' || c == '\t':
			i++
		case c == '(' || c == ')':
			out = append(out, string(c))
			i++
		case c == '"' || c == '#' && i+1 < len(src) && src[i+1] == '"':
			if c == '#' {
				i++
			}
			i++
			var b strings.Builder
			for ; i < len(src) && src[i] != '"'; i++ {
				if src[i] == '\\' && c == '"' {
					i++
				}
				if i < len(src) {
					b.WriteByte(src[i])
				}
			}
			if i >= len(src) {
				return nil, fmt.Errorf("unterminated string")
			}
			i++
			out = append(out, "\x00"+b.String())
		default:
			j := i
			for j < len(src) && !strings.ContainsRune(" \n\t()\";", rune(src[j])) {
				j++
			}
			out = append(out, src[i:j])
			i = j
		}
	}
	return out, nil
}
