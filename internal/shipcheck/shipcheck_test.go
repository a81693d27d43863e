package shipcheck_test

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/hex"
	"io"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/aqfleet/aq/internal/shipcheck"
	"github.com/aqfleet/aq/internal/testenv"
	"github.com/aqfleet/aq/worktree"
)

func TestMain(m *testing.M) { os.Exit(testenv.Main(m)) }

// key is a made-up engine key (never a real one).
const key = "sk-ant-api03-TESTKEYaqShipcheck0123456789abcdefXYZ"

var policy = shipcheck.Policy{Secrets: []shipcheck.Secret{{Value: key, Source: "the claude login"}}}

// commitAll writes files (path → content; "" removes it) in repo and
// commits them, returning the commit.
func commitAll(t *testing.T, repo string, files map[string]string) string {
	t.Helper()
	for p, c := range files {
		full := filepath.Join(repo, p)
		if c == "" {
			os.Remove(full)
			continue
		}
		os.MkdirAll(filepath.Dir(full), 0o755)
		if err := os.WriteFile(full, []byte(c), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	testenv.Git(t, repo, "add", "-A")
	testenv.Git(t, repo, "commit", "-q", "--allow-empty", "-m", "change")
	return testenv.Git(t, repo, "rev-parse", "HEAD")
}

// setup is a repository whose origin has main with a workflow, a file
// that already holds the key (origin's own: not the change's) and a
// binary.
func setup(t *testing.T) (repo string, have []string) {
	t.Helper()
	repo = testenv.NewRepo(t, t.TempDir(), "r", map[string]string{
		"README.md":                 "hello\n",
		".github/workflows/ci.yml":  "on: push\n",
		"docs/old.md":               "the key was " + key + " once\n",
		"src/main.go":               "package main\n",
		"img/logo.bin":              "\x00\x01\x02",
		".github/ISSUE_TEMPLATE.md": "template\n",
	})
	testenv.AddOrigin(t, repo)
	h, err := shipcheck.OriginHas(context.Background(), worktree.Git{}, repo, "origin")
	if err != nil || len(h) == 0 {
		t.Fatalf("OriginHas = %v, %v; want main's commit", h, err)
	}
	return repo, h
}

func TestCheckFindsSecretsInEveryForm(t *testing.T) {
	testenv.Slow(t, "scans many real repositories")
	b64 := base64.StdEncoding.EncodeToString([]byte("token=" + key + "\n"))
	cases := []struct {
		name  string
		files map[string]string
		where string // Hit.Where of the first hit; "" none
		how   string
	}{
		{"plain in a new file", map[string]string{"src/key.go": "package main\n\nconst k = \"" + key + "\"\n"}, "src/key.go:3", "plain"},
		{"base64 inside a longer text", map[string]string{"config/blob.txt": "a\nb\n" + b64 + "\n"}, "config/blob.txt:3", "base64"},
		{"URL-encoded", map[string]string{"u.txt": "https://x.example/?k=" + url.QueryEscape(key+"/+") + "\n"}, "u.txt:1", "plain"},
		{"hex", map[string]string{"h.txt": "x\nk=" + hex.EncodeToString([]byte(key)) + "\n"}, "h.txt:2", "hex"},
		{"hex, upper case", map[string]string{"h.txt": strings.ToUpper(hex.EncodeToString([]byte(key))) + "\n"}, "h.txt:1", "hex"},
		{"in a binary file", map[string]string{"img/logo.bin": "\x00\x01\x02PNG" + key}, "img/logo.bin (binary, byte 6)", "plain"},
		{"an added copy in a file that had it", map[string]string{"docs/old.md": "the key was " + key + " once\nand again " + key + "\n"}, "docs/old.md:2", "plain"},
		{"the file's name", map[string]string{"keys/" + key + ".txt": "x\n"}, "the name of keys/***.txt", "plain"},
		{"none: the file already held it", map[string]string{"docs/old.md": "intro\nthe key was " + key + " once\n"}, "", ""},
		{"none: a short value is not looked for", map[string]string{"a.txt": key[:15] + "\n"}, "", ""},
		{"none: a clean change", map[string]string{"src/main.go": "package main\n\nfunc main() {}\n"}, "", ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			repo, have := setup(t)
			tip := commitAll(t, repo, tc.files)
			res, err := shipcheck.Check(context.Background(), worktree.Git{}, repo, tip, have, policy)
			if err != nil {
				t.Fatal(err)
			}
			if res.Commits != 1 {
				t.Errorf("looked at %d commits, want 1 (only the new one)", res.Commits)
			}
			// The same found without a walk, when the tip's parent is known
			// and on origin (#35), with the diffstat counted by the same git.
			cg := &countGit{}
			parent := testenv.Git(t, repo, "rev-parse", tip+"^")
			known, err := shipcheck.CheckRange(context.Background(), cg, repo, shipcheck.Range{
				Tip: tip, Have: have, Parents: map[string][]string{tip: {parent}}, Numstat: tip,
			}, policy)
			if err != nil {
				t.Fatal(err)
			}
			if cg.ran("rev-list") {
				t.Errorf("the tip's parent is known and on origin, yet the commits were walked: %v", cg.kinds)
			}
			if !slices.EqualFunc(known.Secrets, res.Secrets, func(a, b shipcheck.Hit) bool { return a == b }) || known.Commits != res.Commits {
				t.Errorf("with a known parent: %+v; walked: %+v", known, res)
			}
			if want := numstat(t, repo, parent, tip); known.Numstat == nil || *known.Numstat != want {
				t.Errorf("Numstat = %+v, want %+v (git diff --numstat)", known.Numstat, want)
			}
			if tc.where == "" {
				if len(res.Secrets) != 0 {
					t.Fatalf("found %+v, want nothing", res.Secrets)
				}
				return
			}
			if len(res.Secrets) == 0 {
				t.Fatalf("found nothing; want a hit at %s", tc.where)
			}
			h := res.Secrets[0]
			if h.Where() != tc.where || h.Source != "the claude login" {
				t.Errorf("hit at %s (%s), want %s (the claude login)", h.Where(), h.Source, tc.where)
			}
			if tc.how != "" && !strings.Contains(tc.name, "URL") && h.How != tc.how {
				t.Errorf("how = %s, want %s", h.How, tc.how)
			}
			if !res.Refused() {
				t.Error("a change with a secret is not refused")
			}
			if line := res.SecretLine(); strings.Contains(line, key) || strings.Contains(line, key[5:30]) {
				t.Errorf("the line holds the secret: %s", line)
			}
		})
	}
}

// TestCheckURLEncodedForm: a key with characters URL-encoding changes
// is found in its encoded form.
func TestCheckURLEncodedForm(t *testing.T) {
	testenv.Slow(t, "scans many real repositories")
	weird := "tok/with+slash=and?0123456789"
	repo, have := setup(t)
	tip := commitAll(t, repo, map[string]string{"u.txt": "GET /cb?token=" + url.QueryEscape(weird) + "&x=1\n"})
	res, err := shipcheck.Check(context.Background(), worktree.Git{}, repo, tip, have,
		shipcheck.Policy{Secrets: []shipcheck.Secret{{Value: weird, Source: "GH token"}}})
	if err != nil || len(res.Secrets) != 1 || res.Secrets[0].How != "URL-encoded" || res.Secrets[0].Where() != "u.txt:1" {
		t.Fatalf("Check = %+v, %v; want one URL-encoded hit at u.txt:1", res, err)
	}
}

// TestCheckEveryCommitNotOnOrigin: a secret written in one checkpoint and
// removed in the next is still in what the push sends.
func TestCheckEveryCommitNotOnOrigin(t *testing.T) {
	testenv.Slow(t, "scans many real repositories")
	repo, have := setup(t)
	commitAll(t, repo, map[string]string{"leak.txt": key + "\n"})
	tip := commitAll(t, repo, map[string]string{"leak.txt": ""})
	res, err := shipcheck.Check(context.Background(), worktree.Git{}, repo, tip, have, policy)
	if err != nil || res.Commits != 2 || len(res.Secrets) != 1 || res.Secrets[0].Path != "leak.txt" {
		t.Fatalf("Check = %+v, %v; want the secret of the first of 2 commits", res, err)
	}
	// Once origin has them, nothing is new.
	testenv.Git(t, repo, "push", "-q", "origin", "HEAD:refs/heads/aq/wip/x")
	have2, _ := shipcheck.OriginHas(context.Background(), worktree.Git{}, repo, "origin")
	res, err = shipcheck.Check(context.Background(), worktree.Git{}, repo, tip, have2, policy)
	if err != nil || res.Commits != 0 || res.Refused() {
		t.Fatalf("after the push: Check = %+v, %v; want nothing to look at", res, err)
	}
}

func TestCheckProtectedPaths(t *testing.T) {
	testenv.Slow(t, "scans many real repositories")
	cases := []struct {
		name      string
		files     map[string]string
		protected []string // nil: the default
		may       []string
		want      []string
		allowed   []string
	}{
		{"a workflow changed", map[string]string{".github/workflows/ci.yml": "on: [push, pull_request]\n"}, nil, nil, []string{".github/workflows/ci.yml"}, nil},
		{"a workflow added deep", map[string]string{".github/workflows/sub/x.yaml": "x\n"}, nil, nil, []string{".github/workflows/sub/x.yaml"}, nil},
		{"a workflow removed", map[string]string{".github/workflows/ci.yml": ""}, nil, nil, []string{".github/workflows/ci.yml"}, nil},
		{"an action", map[string]string{".github/actions/a/action.yml": "x\n"}, nil, nil, []string{".github/actions/a/action.yml"}, nil},
		{"CODEOWNERS at the root, .github and docs", map[string]string{"CODEOWNERS": "* @x\n", ".github/CODEOWNERS": "* @x\n", "docs/CODEOWNERS": "* @x\n", "src/CODEOWNERS": "* @y\n"},
			nil, nil, []string{".github/CODEOWNERS", "CODEOWNERS", "docs/CODEOWNERS"}, nil},
		{"gitlab, circleci, buildkite, aq", map[string]string{".gitlab-ci.yml": "x\n", ".circleci/config.yml": "x\n", ".buildkite/pipeline.yml": "x\n", ".aq/profile.md": "x\n"},
			nil, nil, []string{".aq/profile.md", ".buildkite/pipeline.yml", ".circleci/config.yml", ".gitlab-ci.yml"}, nil},
		{"allowed by may_change", map[string]string{".github/workflows/ci.yml": "x\n", ".github/workflows/other.yml": "y\n"},
			nil, []string{".github/workflows/ci.yml"}, []string{".github/workflows/other.yml"}, []string{".github/workflows/ci.yml"}},
		{"allowed by a glob", map[string]string{".github/workflows/ci.yml": "x\n"}, nil, []string{".github/**"}, nil, []string{".github/workflows/ci.yml"}},
		{"not protected: an issue template, a nested repo's workflows", map[string]string{".github/ISSUE_TEMPLATE.md": "x\n", "vendor/x/.github/workflows/ci.yml": "x\n"}, nil, nil, nil, nil},
		{"AQ_PROTECTED_PATHS replaces the default", map[string]string{".github/workflows/ci.yml": "x\n", "Makefile": "all:\n"},
			[]string{"Makefile"}, nil, []string{"Makefile"}, nil},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			repo, have := setup(t)
			tip := commitAll(t, repo, tc.files)
			res, err := shipcheck.Check(context.Background(), worktree.Git{}, repo, tip, have,
				shipcheck.Policy{Protected: tc.protected, MayChange: tc.may})
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(res.Protected, tc.want) || !slices.Equal(res.Allowed, tc.allowed) {
				t.Errorf("protected %q allowed %q, want %q and %q", res.Protected, res.Allowed, tc.want, tc.allowed)
			}
			if res.Refused() != (len(tc.want) > 0) {
				t.Errorf("Refused = %v", res.Refused())
			}
		})
	}
}

// TestCheckRangeRemoteTracking: origin's remote-tracking branches count as
// had without asking origin.
func TestCheckRangeRemoteTracking(t *testing.T) {
	testenv.Slow(t, "scans many real repositories")
	repo, _ := setup(t)
	tip := commitAll(t, repo, map[string]string{".github/workflows/ci.yml": "changed\n", "x.txt": key + "\n"})
	res, err := shipcheck.CheckRange(context.Background(), worktree.Git{}, repo, shipcheck.Range{Tip: tip, Remote: "origin"}, policy)
	if err != nil || res.Commits != 1 || len(res.Secrets) != 1 || len(res.Protected) != 1 {
		t.Fatalf("CheckRange = %+v, %v; want the one new commit's secret and workflow", res, err)
	}
}

// TestCheckMergeBringsOnlyItsOwn: merging origin's newer main (which
// changed a workflow) into the job's work is not the job's change.
func TestCheckMergeBringsOnlyItsOwn(t *testing.T) {
	testenv.Slow(t, "scans many real repositories")
	repo, _ := setup(t)
	base := testenv.Git(t, repo, "rev-parse", "HEAD")
	upstream := commitAll(t, repo, map[string]string{".github/workflows/ci.yml": "on: [push]\n"})
	testenv.Git(t, repo, "push", "-q", "origin", "main")
	testenv.Git(t, repo, "checkout", "-q", "-b", "work", base)
	commitAll(t, repo, map[string]string{"src/a.go": "package a\n"})
	testenv.Git(t, repo, "merge", "-q", "--no-edit", upstream)
	tip := testenv.Git(t, repo, "rev-parse", "HEAD")
	have, _ := shipcheck.OriginHas(context.Background(), worktree.Git{}, repo, "origin")
	res, err := shipcheck.Check(context.Background(), worktree.Git{}, repo, tip, have, policy)
	if err != nil || res.Commits != 2 || res.Refused() {
		t.Fatalf("Check = %+v, %v; want 2 commits and nothing refused", res, err)
	}
}

// TestScanLargeBlobAcrossChunks: a secret straddling the scanner's chunk
// boundary in a file larger than a chunk is found once, at its line.
func TestScanLargeBlobAcrossChunks(t *testing.T) {
	testenv.Slow(t, "scans many real repositories")
	repo, have := setup(t)
	var b bytes.Buffer
	line := strings.Repeat("x", 99) + "\n"
	const at = 1<<20 - 10 // the key straddles the first chunk's end
	lines := at / len(line)
	for range lines {
		b.WriteString(line)
	}
	b.WriteString(strings.Repeat("y", at-b.Len()))
	b.WriteString(key + "\n")
	for b.Len() < 3<<20 {
		b.WriteString(line)
	}
	tip := commitAll(t, repo, map[string]string{"big.txt": b.String()})
	res, err := shipcheck.Check(context.Background(), worktree.Git{}, repo, tip, have, policy)
	if err != nil || len(res.Secrets) != 1 {
		t.Fatalf("Check = %+v, %v; want one hit", res, err)
	}
	if h := res.Secrets[0]; h.Line != lines+1 || h.Offset != at {
		t.Errorf("hit at line %d byte %d, want line %d byte %d", h.Line, h.Offset, lines+1, at)
	}
}

func TestCheckGlob(t *testing.T) {
	for _, g := range []string{".github/workflows/**", "CODEOWNERS", "docs/*.md", "**/CODEOWNERS", "a/{b,c}/d"} {
		if err := shipcheck.CheckGlob(g); err != nil {
			t.Errorf("CheckGlob(%q) = %v", g, err)
		}
	}
	for g, want := range map[string]string{
		"../x": "outside the repository", "a/../../x": "outside the repository", "/etc/passwd": "absolute",
		`C:\x`: "absolute", "a[b": "not a valid glob", "{a,b": "not a valid glob", `a\b`: "'/'",
	} {
		if err := shipcheck.CheckGlob(g); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("CheckGlob(%q) = %v, want an error saying %q", g, err, want)
		}
	}
	if _, err := shipcheck.ParseGlobs(".github/**, a[b"); err == nil {
		t.Error("ParseGlobs took a malformed glob")
	}
	if got, err := shipcheck.ParseGlobs(" .github/** ,, Makefile "); err != nil || !slices.Equal(got, []string{".github/**", "Makefile"}) {
		t.Errorf("ParseGlobs = %q, %v", got, err)
	}
}

func TestLoginValues(t *testing.T) {
	long := "sk-ant-oat01-AAAAAAAAAAAAAAAAAAAAAAAA"
	cases := map[string]struct {
		data string
		want []string
	}{
		"claude": {`{"claudeAiOauth":{"accessToken":"` + long + `","refreshToken":"sk-ant-ort01-BBBBBBBBBBBBBBBBBBBB","expiresAt":1890000000000,"scopes":["user:inference"],"subscriptionType":"max"}}`,
			[]string{long, "sk-ant-ort01-BBBBBBBBBBBBBBBBBBBB"}},
		"codex": {`{"OPENAI_API_KEY":null,"tokens":{"id_token":"eyJhbGciOiJSUzI1NiJ9.payload.sig","access_token":"eyJaccess0123456789","refresh_token":"rt_0123456789abcdef","account_id":"acct-0123456789abcdef0"},"last_refresh":"2026-01-01T00:00:00Z"}`,
			[]string{"eyJhbGciOiJSUzI1NiJ9.payload.sig", "eyJaccess0123456789", "rt_0123456789abcdef"}},
		"devin toml": {"[auth]\ntoken = \"dv_0123456789abcdefghij\"\nuser = \"someone@example.com.long\"\nrefresh_token = 'dvr_0123456789abcdefghij'\nshort_key = \"abc\"\n",
			[]string{"dv_0123456789abcdefghij", "dvr_0123456789abcdefghij"}},
	}
	for name, tc := range cases {
		got := shipcheck.LoginValues([]byte(tc.data))
		slices.Sort(got)
		slices.Sort(tc.want)
		if !slices.Equal(got, tc.want) {
			t.Errorf("%s: LoginValues = %q, want %q", name, got, tc.want)
		}
	}
}

// countGit is worktree.Git, noting the subcommand of every git it runs.
type countGit struct {
	g     worktree.Git
	kinds []string
}

func (c *countGit) Run(ctx context.Context, dir string, args ...string) (string, error) {
	c.kinds = append(c.kinds, args[0])
	return c.g.Run(ctx, dir, args...)
}

func (c *countGit) Stream(ctx context.Context, dir string, stdin io.Reader, out io.Writer, args ...string) error {
	c.kinds = append(c.kinds, args[0])
	return c.g.Stream(ctx, dir, stdin, out, args...)
}

func (c *countGit) ran(kind string) bool { return slices.Contains(c.kinds, kind) }

// numstat is `git diff --numstat from to`, summed.
func numstat(t *testing.T, repo, from, to string) shipcheck.Numstat {
	t.Helper()
	var n shipcheck.Numstat
	for _, line := range strings.Split(testenv.Git(t, repo, "diff", "--numstat", "--no-renames", from, to), "\n") {
		f := strings.SplitN(line, "\t", 3)
		if len(f) != 3 {
			continue
		}
		n.Files++
		a, _ := strconv.Atoi(f[0])
		d, _ := strconv.Atoi(f[1])
		n.Added += a
		n.Deleted += d
	}
	return n
}

// TestCheckRangeKnownParentsNotOnOrigin: a tip whose known parent is not
// on origin is walked as before — the secret of a commit under it is
// found — and a tip whose parent is on origin beside it is not walked
// again; the diffstat is the tip's alone.
func TestCheckRangeKnownParentsNotOnOrigin(t *testing.T) {
	repo, have := setup(t)
	first := commitAll(t, repo, map[string]string{"leak.txt": key + "\n"})
	tip := commitAll(t, repo, map[string]string{"leak.txt": "", "a.txt": "one\ntwo\n"})
	cg := &countGit{}
	res, err := shipcheck.CheckRange(context.Background(), cg, repo, shipcheck.Range{
		Tip: tip, Have: have, Parents: map[string][]string{tip: {first}}, Numstat: tip,
	}, policy)
	if err != nil || res.Commits != 2 || len(res.Secrets) != 1 || res.Secrets[0].Path != "leak.txt" {
		t.Fatalf("CheckRange = %+v, %v; want the secret of the first of 2 commits", res, err)
	}
	if !cg.ran("rev-list") {
		t.Errorf("a known parent not on origin was not walked: %v", cg.kinds)
	}
	if want := numstat(t, repo, first, tip); res.Numstat == nil || *res.Numstat != want {
		t.Errorf("Numstat = %+v, want %+v", res.Numstat, want)
	}
	// A tip already on origin: nothing to look at, no walk either.
	cg = &countGit{}
	res, err = shipcheck.CheckRange(context.Background(), cg, repo, shipcheck.Range{
		Tip: tip, Have: append(slices.Clone(have), first, tip), Parents: map[string][]string{tip: {first}}, Numstat: tip,
	}, policy)
	if err != nil || res.Commits != 0 || res.Numstat != nil || len(cg.kinds) != 0 {
		t.Fatalf("CheckRange of a tip origin has = %+v, %v (gits %v); want nothing looked at", res, err, cg.kinds)
	}
}
