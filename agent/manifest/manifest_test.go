package manifest

import (
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/aqfleet/aq/job"
	"github.com/aqfleet/aq/profiles"
)

// mf builds a manifest: front matter lines, then a body.
func mf(front, body string) []byte { return []byte("---\n" + front + "---\n" + body) }

const body = "# Do the thing\n\nPlease do it.\n"

// testCatalog is the embedded profiles plus "tester" (engine codex, model,
// budget, capabilities) and "scripted" (engine script).
func testCatalog(t testing.TB) *profiles.Catalog {
	t.Helper()
	dir := t.TempDir()
	write(t, filepath.Join(dir, "tester.md"), "---\nengine: codex\nmodel: gpt-5-codex\ncapabilities: [has:git, os:linux, \"node:>=20\"]\nbudget: { wall: 1h, usd: 10, tokens: 4000000, turns: 120 }\nverify_rounds: 3\n---\nYou test things.\n")
	write(t, filepath.Join(dir, "scripted.md"), "---\nengine: script\n---\nYou run scripts.\n")
	cat, err := profiles.Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	return cat
}

func write(t testing.TB, path, content string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

func mustParse(t *testing.T, name string, data []byte) *job.Job {
	t.Helper()
	j, err := Parse(name, data, testCatalog(t))
	if err != nil {
		t.Fatalf("Parse(%s) failed:\n%v\n--- manifest:\n%s", name, err, data)
	}
	return j
}

// TestAccepts: valid manifests and what they normalise to.
func TestAccepts(t *testing.T) {
	tests := []struct {
		name  string
		file  string
		data  []byte
		check func(t *testing.T, j *job.Job)
	}{
		{"minimal manifest gets the defaults", "job.md", mf("repo: svc\n", body), func(t *testing.T, j *job.Job) {
			want := job.Job{ID: "job", Title: "Do the thing", Repo: "svc", Base: job.DefaultBase, Engine: job.DefaultEngine,
				Capabilities: []string{}, Priority: job.PriorityNormal, PriorityName: "normal",
				Budget: job.Budget{Wall: job.Duration(job.DefaultWall)}, Retry: job.Retry{Backoff: job.Duration(job.DefaultBackoff)}, DepsMode: job.DefaultDepsMode, Ship: job.DefaultShip,
				Body: strings.TrimSpace(body), Source: "job.md"}
			if !reflect.DeepEqual(*j, want) {
				t.Errorf("got  %+v\nwant %+v", *j, want)
			}
		}},
		{"id defaults to the file name without .md", "dir/fix-login.md", mf("repo: svc\n", body), func(t *testing.T, j *job.Job) {
			eq(t, j.ID, "fix-login")
		}},
		{"explicit id wins over the file name", "x.md", mf("id: other-id\nrepo: svc\n", body), func(t *testing.T, j *job.Job) {
			eq(t, j.ID, "other-id")
		}},
		{"numeric id is text", "x.md", mf("id: 1234\nrepo: svc\n", body), func(t *testing.T, j *job.Job) { eq(t, j.ID, "1234") }},
		{"CRLF, BOM and non-ASCII text", "x.md",
			[]byte("\ufeff---\r\nrepo: svc\r\ntitle: Überarbeitung — 日本語 ✓\r\n---\r\n# Titel\r\n\r\nÄndere das.\r\n\r\n## Acceptance\r\n- läuft\r\n"),
			func(t *testing.T, j *job.Job) {
				eq(t, j.Title, "Überarbeitung — 日本語 ✓")
				eq(t, j.Body, "# Titel\n\nÄndere das.\n\n## Acceptance\n- läuft")
				eq(t, j.Acceptance, "- läuft")
			}},
		{"lone CR line endings", "x.md", []byte("---\rrepo: svc\r---\rDo it.\r"), func(t *testing.T, j *job.Job) { eq(t, j.Body, "Do it.") }},
		{"https URL repo", "x.md", mf("repo: https://github.com/aqfleet/aq-demo.git\n", body), func(t *testing.T, j *job.Job) {
			eq(t, j.Repo, "aq-demo")
			eq(t, j.RepoURL, "https://github.com/aqfleet/aq-demo.git")
		}},
		{"https URL with a trailing slash", "x.md", mf("repo: https://git.example.com/org/svc/\n", body), func(t *testing.T, j *job.Job) { eq(t, j.Repo, "svc") }},
		{"ssh URL repo", "x.md", mf("repo: ssh://git@git.example.com:2222/org/svc.git\n", body), func(t *testing.T, j *job.Job) { eq(t, j.Repo, "svc") }},
		{"scp-like repo", "x.md", mf("repo: git@github.com:aqfleet/aq.git\n", body), func(t *testing.T, j *job.Job) {
			eq(t, j.Repo, "aq")
			eq(t, j.RepoURL, "git@github.com:aqfleet/aq.git")
		}},
		{"file URL repo", "x.md", mf("repo: file:///srv/git/svc.git\n", body), func(t *testing.T, j *job.Job) { eq(t, j.Repo, "svc") }},
		{"sandbox: required adds sandbox:full", "x.md", mf("repo: svc\ncapabilities: [has:git]\nsandbox: required\n", body), func(t *testing.T, j *job.Job) {
			eq(t, strings.Join(j.Capabilities, " "), "has:git sandbox:full")
		}},
		{"sandbox: required beside sandbox:full once", "x.md", mf("repo: svc\nsandbox: required\ncapabilities: [sandbox:full, sandbox:partial]\n", body), func(t *testing.T, j *job.Job) {
			eq(t, strings.Join(j.Capabilities, " "), "sandbox:full sandbox:partial")
		}},
		{"may_change adds manifest:may_change", "x.md", mf("repo: svc\nmay_change: [.github/workflows/ci.yml, \".github/actions/**\", .github/workflows/ci.yml]\n", body), func(t *testing.T, j *job.Job) {
			eq(t, strings.Join(j.MayChange, " "), ".github/workflows/ci.yml .github/actions/**")
			eq(t, strings.Join(j.Capabilities, " "), "manifest:may_change")
		}},
		{"may_change one path", "x.md", mf("repo: svc\nmay_change: CODEOWNERS\n", body), func(t *testing.T, j *job.Job) {
			eq(t, strings.Join(j.MayChange, " "), "CODEOWNERS")
		}},
		{"priority word", "x.md", mf("repo: svc\npriority: critical\n", body), func(t *testing.T, j *job.Job) {
			eq(t, j.Priority, job.PriorityCritical)
			eq(t, j.PriorityName, "critical")
		}},
		{"priority integer", "x.md", mf("repo: svc\npriority: 250\n", body), func(t *testing.T, j *job.Job) {
			eq(t, j.Priority, 250)
			eq(t, j.PriorityName, "250")
		}},
		{"priority zero", "x.md", mf("repo: svc\npriority: 0\n", body), func(t *testing.T, j *job.Job) { eq(t, j.Priority, 0) }},
		{"durations with several units", "x.md", mf("repo: svc\nbudget: { wall: 2h30m }\nretry: { max: 3, backoff: 90s }\n", body), func(t *testing.T, j *job.Job) {
			eq(t, j.Budget.Wall.D(), 150*time.Minute)
			eq(t, j.Retry, job.Retry{Max: 3, Backoff: job.Duration(90 * time.Second)})
		}},
		{"budget numbers", "x.md", mf("repo: svc\nbudget: { usd: 2.5, tokens: 2e6, turns: 40 }\n", body), func(t *testing.T, j *job.Job) {
			eq(t, j.Budget, job.Budget{Wall: job.Duration(job.DefaultWall), USD: 2.5, Tokens: 2000000, Turns: 40})
		}},
		{"zero budget means unlimited", "x.md", mf("repo: svc\nbudget: { usd: 0, tokens: 0 }\n", body), func(t *testing.T, j *job.Job) {
			eq(t, j.Budget.USD, 0.0)
		}},
		{"a single dep may be written without a list", "x.md", mf("repo: svc\ndeps: schema-migration\n", body), func(t *testing.T, j *job.Job) {
			eq(t, j.Deps, []string{"schema-migration"})
		}},
		{"deps as a block list, depsMode any", "x.md", mf("repo: svc\ndeps:\n  - a\n  - b\ndepsMode: any\n", body), func(t *testing.T, j *job.Job) {
			eq(t, j.Deps, []string{"a", "b"})
			eq(t, j.DepsMode, "any")
		}},
		{"capabilities are canonical and deduplicated", "x.md", mf("repo: svc\ncapabilities: [has:git, \"node:>= 20\", has:git, \"node:=22\"]\n", body), func(t *testing.T, j *job.Job) {
			eq(t, j.Capabilities, []string{"has:git", "node:>=20", "node:22"})
		}},
		{"a single capability may be written without a list", "x.md", mf("repo: svc\ncapabilities: has:docker\n", body), func(t *testing.T, j *job.Job) {
			eq(t, j.Capabilities, []string{"has:docker"})
		}},
		{"engine script with script", "x.md", mf("repo: svc\nengine: script\nscript: ./tools/fix.sh --all\n", body), func(t *testing.T, j *job.Job) {
			eq(t, j.Engine, "script")
			eq(t, j.Script, "./tools/fix.sh --all")
		}},
		{"every ship mode and engine", "x.md", mf("repo: svc\nengine: devin\nship: merge\nmodel: claude-opus-4-1[1m]\n", body), func(t *testing.T, j *job.Job) {
			eq(t, j.Ship, "merge")
			eq(t, j.Model, "claude-opus-4-1[1m]")
		}},
		{"base with slashes", "x.md", mf("repo: svc\nbase: release/2.x\n", body), func(t *testing.T, j *job.Job) { eq(t, j.Base, "release/2.x") }},
		{"title from a setext H1", "x.md", mf("repo: svc\n", "Intro line.\n\nBig *Title*\n==========\n\nText.\n"), func(t *testing.T, j *job.Job) {
			eq(t, j.Title, "Big *Title*")
		}},
		{"title from an ATX H1 with closing hashes", "x.md", mf("repo: svc\n", "## Sub\n\n# Real title ##\n"), func(t *testing.T, j *job.Job) {
			eq(t, j.Title, "Real title")
		}},
		{"explicit title wins over the H1", "x.md", mf("repo: svc\ntitle: Mine\n", body), func(t *testing.T, j *job.Job) { eq(t, j.Title, "Mine") }},
		{"no title and no H1: the id", "x-y.md", mf("repo: svc\n", "just text\n"), func(t *testing.T, j *job.Job) { eq(t, j.Title, "x-y") }},
		{"acceptance runs to the next level-2 heading and keeps level-3 ones", "x.md",
			mf("repo: svc\n", "# T\n\n## acceptance criteria:\n- one\n\n### Detail\n- two\n\n## Notes\nnot this\n"),
			func(t *testing.T, j *job.Job) { eq(t, j.Acceptance, "- one\n\n### Detail\n- two") }},
		{"acceptance at the end of the body", "x.md", mf("repo: svc\n", "Task.\n\nAcceptance\n----------\n\n1. works\n"), func(t *testing.T, j *job.Job) {
			eq(t, j.Acceptance, "1. works")
			eq(t, j.Body, "Task.\n\nAcceptance\n----------\n\n1. works")
		}},
		{"an Acceptance heading in a code block does not count", "x.md",
			mf("repo: svc\n", "Task.\n\n```\n## Acceptance\n- fake\n```\n"), func(t *testing.T, j *job.Job) { eq(t, j.Acceptance, "") }},
		{"a level-3 Acceptance heading does not count", "x.md", mf("repo: svc\n", "Task.\n\n### Acceptance\n- no\n"), func(t *testing.T, j *job.Job) { eq(t, j.Acceptance, "") }},
		{"blank lines before the front matter", "x.md", []byte("\n\n---\nrepo: svc\n---\nDo it.\n"), func(t *testing.T, j *job.Job) { eq(t, j.Repo, "svc") }},
		{"comments and anchors", "x.md", mf("# a comment\nrepo: &r svc\nproduct: *r\n", body), func(t *testing.T, j *job.Job) { eq(t, j.Product, "svc") }},
		{"idempotency key with spaces and unicode", "x.md", mf("repo: svc\nidempotencyKey: \"JIRA PROJ-12 — ü\"\n", body), func(t *testing.T, j *job.Job) {
			eq(t, j.IdempotencyKey, "JIRA PROJ-12 — ü")
		}},
		{"verify_rounds", "x.md", mf("repo: svc\nverify: make test\nverify_rounds: 1\n", body), func(t *testing.T, j *job.Job) {
			eq(t, *j.VerifyRounds, 1)
		}},
		{"verify_rounds 0 turns rounds off", "x.md", mf("repo: svc\nverify_rounds: 0\n", body), func(t *testing.T, j *job.Job) {
			eq(t, *j.VerifyRounds, 0)
		}},
		{"no verify_rounds: the factory decides", "x.md", mf("repo: svc\nverify: make test\n", body), func(t *testing.T, j *job.Job) {
			eq(t, j.VerifyRounds, (*int)(nil))
		}},
		{"multi-line verify", "x.md", mf("repo: svc\nverify: |\n  make lint\n  make test\n", body), func(t *testing.T, j *job.Job) {
			eq(t, j.Verify, "make lint\nmake test")
		}},
		{"a body indented as code keeps its indentation", "x.md", mf("repo: svc\n", "\n\n    code block\n"), func(t *testing.T, j *job.Job) {
			eq(t, j.Body, "    code block")
		}},
		{"exactly 1 MiB is accepted", "x.md", sized(MaxSize), func(t *testing.T, j *job.Job) { eq(t, len(j.Body) > 1000, true) }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tt.check(t, mustParse(t, tt.file, tt.data))
		})
	}
}

// sized is a valid manifest of exactly n bytes.
func sized(n int) []byte {
	head := mf("repo: svc\n", "")
	b := make([]byte, 0, n)
	b = append(b, head...)
	line := []byte("lorem ipsum dolor sit amet, consectetur adipiscing elit\n")
	for len(b)+len(line) <= n {
		b = append(b, line...)
	}
	for len(b) < n {
		b = append(b, 'x')
	}
	return b
}

func eq[T any](t *testing.T, got, want T) {
	t.Helper()
	if !reflect.DeepEqual(got, want) {
		t.Errorf("got %#v, want %#v", got, want)
	}
}

// TestRejects: each rule, with a manifest that breaks only that rule. Each
// case fails if its rule is removed (the manifest would then be accepted).
func TestRejects(t *testing.T) {
	long := strings.Repeat("a", 129)
	tests := []struct {
		name string
		file string
		data []byte
		line int    // expected line of the first problem; 0: the whole file
		want string // substring of the first problem
	}{
		// unknown and duplicate keys
		{"unknown key", "x.md", mf("repo: svc\ntitel: x\n", body), 3, `unknown key "titel" (did you mean "title"?)`},
		{"unknown key in other case", "x.md", mf("repo: svc\ndepsmode: all\n", body), 3, `did you mean "depsMode"?`},
		{"unknown key with snake case", "x.md", mf("repo: svc\nidempotency_key: k\n", body), 3, `did you mean "idempotencyKey"?`},
		{"unknown key far from any", "x.md", mf("repo: svc\nfoo: bar\n", body), 3, `unknown key "foo" (known keys: id, title`},
		{"unknown key in budget", "x.md", mf("repo: svc\nbudget: { wal: 45m }\n", body), 3, `unknown key "budget.wal" (did you mean "wall"?)`},
		{"unknown key in retry", "x.md", mf("repo: svc\nretry:\n  max: 1\n  backof: 5s\n", body), 5, `unknown key "retry.backof" (did you mean "backoff"?)`},
		{"duplicate key", "x.md", mf("repo: svc\nengine: claude\nengine: codex\n", body), 4, `duplicate key "engine", already set on line 3 (keep one of them)`},
		{"duplicate key in budget", "x.md", mf("repo: svc\nbudget:\n  usd: 1\n  usd: 2\n", body), 5, `duplicate key "budget.usd"`},
		{"merge key", "x.md", mf("repo: svc\nbudget: &b { wall: 1h }\nretry:\n  <<: *b\n", body), 5, `YAML merge keys (<<) are not supported`},

		// sandbox
		{"sandbox not required", "x.md", mf("repo: svc\nsandbox: yes\n", body), 3, `sandbox "yes" is not known (write sandbox: required`},
		{"sandbox a level", "x.md", mf("repo: svc\nsandbox: full\n", body), 3, `sandbox "full" is not known`},
		{"sandbox a list", "x.md", mf("repo: svc\nsandbox: [required]\n", body), 3, `sandbox`},
		{"sandbox capability of no level", "x.md", mf("repo: svc\ncapabilities: [sandbox:linux]\n", body), 3, `the sandbox levels are full and partial`},

		// may_change
		{"may_change outside the repository", "x.md", mf("repo: svc\nmay_change: [../x]\n", body), 3, `may_change: "../x" is outside the repository`},
		{"may_change absolute", "x.md", mf("repo: svc\nmay_change:\n  - ok/path\n  - /etc/x\n", body), 5, `may_change: "/etc/x" is absolute`},
		{"may_change a bad glob", "x.md", mf("repo: svc\nmay_change: [\".github/[x\"]\n", body), 3, `may_change: ".github/[x" is not a valid glob`},
		{"may_change empty", "x.md", mf("repo: svc\nmay_change:\n", body), 3, `may_change has no value`},

		// id
		{"id with a slash", "x.md", mf("id: a/b\nrepo: svc\n", body), 2, `id "a/b" must start with a letter or digit`},
		{"id with path traversal", "x.md", mf("id: ../etc\nrepo: svc\n", body), 2, `id "../etc" contains ".."`},
		{"id with .. inside", "x.md", mf("id: a..b\nrepo: svc\n", body), 2, `contains ".."`},
		{"id starting with a dash", "x.md", mf("id: -rf\nrepo: svc\n", body), 2, `must start with a letter or digit`},
		{"id starting with a dot", "x.md", mf("id: .hidden\nrepo: svc\n", body), 2, `must start with a letter or digit`},
		{"id with shell metacharacters", "x.md", mf("id: \"x;rm -rf ~\"\nrepo: svc\n", body), 2, `must start with a letter or digit and use only`},
		{"id with a space", "x.md", mf("id: a b\nrepo: svc\n", body), 2, `id "a b"`},
		{"id with non-ASCII", "x.md", mf("id: tâche\nrepo: svc\n", body), 2, `id "tâche"`},
		{"id too long", "x.md", mf("id: "+long+"\nrepo: svc\n", body), 2, `over the limit of 128`},
		{"id ending in .lock", "x.md", mf("id: fix.lock\nrepo: svc\n", body), 2, `ends in ".lock"`},
		{"id empty", "x.md", mf("id: \"\"\nrepo: svc\n", body), 2, `id is empty`},
		{"default id from a bad file name", "bad name!.md", mf("repo: svc\n", body), 1, `no id: is set and the file name gives the id "bad name!"`},
		{"default id from a .. file name", "a..b.md", mf("repo: svc\n", body), 1, `contains ".."`},

		// repo
		{"repo missing", "x.md", mf("title: t\n", body), 1, `repo is required`},
		{"repo with path traversal", "x.md", mf("repo: ../../etc\n", body), 2, `repo "../../etc" is neither a repository name nor a git URL`},
		{"repo with ..", "x.md", mf("repo: a..b\n", body), 2, `repo "a..b" contains ".."`},
		{"repo with a slash", "x.md", mf("repo: org/svc\n", body), 2, `is neither a repository name nor a git URL`},
		{"repo with shell metacharacters", "x.md", mf("repo: \"svc$(id)\"\n", body), 2, `repo "svc$(id)" must start with a letter or digit and use only`},
		{"repo URL over plain http", "x.md", mf("repo: http://example.com/svc.git\n", body), 2, `uses plain http`},
		{"repo URL with a token", "x.md", mf("repo: https://ghp_SECRET@github.com/org/svc.git\n", body), 2, `repo URL "https://github.com/org/svc.git" carries credentials`},
		{"repo URL without a name", "x.md", mf("repo: https://github.com/\n", body), 2, `must end in a repository name`},
		{"repo URL ending in ..", "x.md", mf("repo: git@github.com:org/..\n", body), 2, `contains ".."`},
		{"repo URL with .. inside", "x.md", mf("repo: https://host/a/../svc.git\n", body), 2, `contains ".."`},
		{"repo URL with a query", "x.md", mf("repo: https://host/org/svc.git?x=1\n", body), 2, `query or fragment`},
		{"repo URL with a bad last part", "x.md", mf("repo: https://host/org/-svc.git\n", body), 2, `its last part "-svc"`},
		{"repo URL of an unknown scheme", "x.md", mf("repo: ext::sh -c touch% /tmp/pwned\n", body), 2, `white space`},
		{"repo URL of a git remote helper", "x.md", mf("repo: \"ext::sh\"\n", body), 2, `repo "ext::sh" is neither a repository name nor a git URL`},
		{"repo URL git://", "x.md", mf("repo: git://host/svc.git\n", body), 2, `neither a repository name nor a git URL`},
		{"repo file URL with a host", "x.md", mf("repo: file://evil.example.com/svc.git\n", body), 2, `file:// URLs are local`},

		// enums
		{"unknown engine", "x.md", mf("repo: svc\nengine: gpt\n", body), 3, `engine "gpt" is not known (use one of: claude, codex, devin, script, any)`},
		{"misspelt engine", "x.md", mf("repo: svc\nengine: cluade\n", body), 3, `did you mean "claude"?`},
		{"engine in upper case", "x.md", mf("repo: svc\nengine: Claude\n", body), 3, `did you mean "claude"?`},
		{"unknown ship mode", "x.md", mf("repo: svc\nship: pull-request\n", body), 3, `ship "pull-request" is not known`},
		{"unknown depsMode", "x.md", mf("repo: svc\ndepsMode: some\n", body), 3, `depsMode "some" is not all or any`},
		{"unknown priority word", "x.md", mf("repo: svc\npriority: urgent\n", body), 3, `priority "urgent" is not a priority`},
		{"priority out of range", "x.md", mf("repo: svc\npriority: 1001\n", body), 3, `priority "1001"`},
		{"negative priority", "x.md", mf("repo: svc\npriority: -1\n", body), 3, `priority "-1"`},
		{"priority as a list", "x.md", mf("repo: svc\npriority: [1]\n", body), 3, `priority must be a single value, not a list`},

		// budget and retry
		{"wall without a unit", "x.md", mf("repo: svc\nbudget: { wall: 45 }\n", body), 3, `budget.wall "45" has no unit`},
		{"wall not a duration", "x.md", mf("repo: svc\nbudget: { wall: soon }\n", body), 3, `budget.wall "soon" is not a duration`},
		{"wall in days", "x.md", mf("repo: svc\nbudget: { wall: 2d }\n", body), 3, `write wall: 48h`},
		{"wall zero", "x.md", mf("repo: svc\nbudget: { wall: 0s }\n", body), 3, `budget.wall "0s" is out of range`},
		{"wall negative", "x.md", mf("repo: svc\nbudget: { wall: -5m }\n", body), 3, `out of range`},
		{"usd negative", "x.md", mf("repo: svc\nbudget: { usd: -1 }\n", body), 3, `budget.usd -1 is out of range`},
		{"usd as text", "x.md", mf("repo: svc\nbudget: { usd: \"$5\" }\n", body), 3, `budget.usd must be a number, not "$5"`},
		{"usd NaN", "x.md", mf("repo: svc\nbudget: { usd: .nan }\n", body), 3, `finite number`},
		{"usd infinite", "x.md", mf("repo: svc\nbudget: { usd: .inf }\n", body), 3, `finite number`},
		{"tokens negative", "x.md", mf("repo: svc\nbudget: { tokens: -5 }\n", body), 3, `budget.tokens -5 is out of range`},
		{"tokens fractional", "x.md", mf("repo: svc\nbudget: { tokens: 1.5 }\n", body), 3, `budget.tokens must be a whole number`},
		{"tokens as text", "x.md", mf("repo: svc\nbudget: { tokens: lots }\n", body), 3, `budget.tokens must be a whole number, not "lots"`},
		{"turns negative", "x.md", mf("repo: svc\nbudget: { turns: -1 }\n", body), 3, `budget.turns -1 is out of range`},
		{"budget not a mapping", "x.md", mf("repo: svc\nbudget: 5\n", body), 3, `budget must be a mapping of keys to values, not a single value`},
		{"retry max negative", "x.md", mf("repo: svc\nretry: { max: -1 }\n", body), 3, `retry.max -1 is out of range`},
		{"retry max too high", "x.md", mf("repo: svc\nretry: { max: 101 }\n", body), 3, `retry.max 101 is out of range`},
		{"retry backoff without unit", "x.md", mf("repo: svc\nretry: { backoff: 60 }\n", body), 3, `retry.backoff "60" has no unit`},
		{"verify_rounds negative", "x.md", mf("repo: svc\nverify: make test\nverify_rounds: -1\n", body), 4, `verify_rounds -1 is out of range (use a whole number from 0 to 10)`},
		{"verify_rounds not a number", "x.md", mf("repo: svc\nverify_rounds: two\n", body), 3, `verify_rounds must be a whole number, not "two" (write a whole number, e.g. verify_rounds: 2)`},
		{"verify_rounds fractional", "x.md", mf("repo: svc\nverify_rounds: 1.5\n", body), 3, `verify_rounds must be a whole number, not "1.5"`},
		{"verify_rounds too many", "x.md", mf("repo: svc\nverify_rounds: 11\n", body), 3, `verify_rounds 11 is out of range`},
		{"verify_rounds as a list", "x.md", mf("repo: svc\nverify_rounds: [2]\n", body), 3, `verify_rounds must be a single value, not a list`},
		{"retry backoff negative", "x.md", mf("repo: svc\nretry: { backoff: -1s }\n", body), 3, `out of range`},

		// deps
		{"dep not an id", "x.md", mf("repo: svc\ndeps: [a/b]\n", body), 3, `dep "a/b"`},
		{"deps written as one comma list", "x.md", mf("repo: svc\ndeps: a, b\n", body), 3, `dep "a, b"`},
		{"dep on itself", "x.md", mf("id: me\nrepo: svc\ndeps: [me]\n", body), 4, `the job "me" depends on itself`},
		{"dep on itself by file name", "me.md", mf("repo: svc\ndeps: [me]\n", body), 3, `depends on itself`},
		{"duplicate dep", "x.md", mf("repo: svc\ndeps:\n  - a\n  - a\n", body), 5, `dep "a" is listed twice, first on line 4`},
		{"deps as a mapping", "x.md", mf("repo: svc\ndeps: { a: b }\n", body), 3, `deps must be a list, not a mapping`},
		{"deps with a nested list", "x.md", mf("repo: svc\ndeps: [[a]]\n", body), 3, `deps[0] must be a single value, not a list`},

		// capabilities
		{"capability of unknown kind", "x.md", mf("repo: svc\ncapabilities: [gpu:a100]\n", body), 3, `unknown kind "gpu"`},
		{"capability without a value", "x.md", mf("repo: svc\ncapabilities: [has]\n", body), 3, `is not kind:value`},
		{"capability comparison on a non-numeric kind", "x.md", mf("repo: svc\ncapabilities: [\"has:>=2\"]\n", body), 3, `comparisons are only allowed for node`},
		{"capability on its own line", "x.md", mf("repo: svc\ncapabilities:\n  - has:git\n  - \"node:>=abc\"\n", body), 5, `needs a major version number`},
		{"contradictory os capabilities", "x.md", mf("repo: svc\ncapabilities: [os:linux, os:darwin]\n", body), 3, `os:linux and os:darwin can never both be satisfied`},
		{"engine capability against engine:", "x.md", mf("repo: svc\nengine: claude\ncapabilities: [engine:codex]\n", body), 4, `capability engine:codex contradicts engine: claude`},

		// script
		{"script without engine script", "x.md", mf("repo: svc\nscript: ./fix.sh\n", body), 3, `script: is only used with engine: script`},
		{"engine script without script", "x.md", mf("repo: svc\nengine: script\n", body), 3, `engine: script needs a script:`},
		{"engine script from the profile without script", "x.md", mf("repo: svc\nprofile: scripted\n", body), 3, `engine: script needs a script:`},

		// base
		{"base with ..", "x.md", mf("repo: svc\nbase: main..dev\n", body), 3, `base "main..dev" is not a valid git branch name: it contains ".."`},
		{"base with a space", "x.md", mf("repo: svc\nbase: my branch\n", body), 3, `contains ' '`},
		{"base starting with a dash", "x.md", mf("repo: svc\nbase: -main\n", body), 3, `starts with "-"`},
		{"base ending with /", "x.md", mf("repo: svc\nbase: feature/\n", body), 3, `ends with "/"`},
		{"base ending with .lock", "x.md", mf("repo: svc\nbase: main.lock\n", body), 3, `ending with ".lock"`},
		{"base part ending with .lock", "x.md", mf("repo: svc\nbase: a.lock/b\n", body), 3, `ending with ".lock"`},
		{"base with ~", "x.md", mf("repo: svc\nbase: main~1\n", body), 3, `contains '~'`},
		{"base with ^", "x.md", mf("repo: svc\nbase: main^\n", body), 3, `contains '^'`},
		{"base with :", "x.md", mf("repo: svc\nbase: \"a:b\"\n", body), 3, `contains ':'`},
		{"base with ?", "x.md", mf("repo: svc\nbase: a?b\n", body), 3, `contains '?'`},
		{"base with *", "x.md", mf("repo: svc\nbase: \"a*\"\n", body), 3, `contains '*'`},
		{"base with [", "x.md", mf("repo: svc\nbase: \"a[b\"\n", body), 3, `contains '['`},
		{"base with a backslash", "x.md", mf("repo: svc\nbase: a\\b\n", body), 3, `contains '\\'`},
		{"base with a control character", "x.md", mf("repo: svc\nbase: \"a\\tb\"\n", body), 3, `contains '\t'`},
		{"base with @{", "x.md", mf("repo: svc\nbase: a@{1}\n", body), 3, `contains "@{"`},
		{"base with a dot part", "x.md", mf("repo: svc\nbase: a/.b\n", body), 3, `part starting with "."`},

		// other values
		{"product not an id", "x.md", mf("repo: svc\nproduct: a/b\n", body), 3, `product "a/b"`},
		{"idempotency key empty", "x.md", mf("repo: svc\nidempotencyKey: \"  \"\n", body), 3, `idempotencyKey is empty`},
		{"idempotency key too long", "x.md", mf("repo: svc\nidempotencyKey: "+strings.Repeat("k", 257)+"\n", body), 3, `is 257 characters long, over the limit of 256`},
		{"idempotency key with a control character", "x.md", mf("repo: svc\nidempotencyKey: \"a\\ab\"\n", body), 3, `non-printable character U+0007`},
		{"title over two lines", "x.md", mf("repo: svc\ntitle: |\n  one\n  two\n", body), 3, `title spans more than one line`},
		{"title too long", "x.md", mf("repo: svc\ntitle: "+strings.Repeat("t", 257)+"\n", body), 3, `over the limit of 256`},
		{"title as a list", "x.md", mf("repo: svc\ntitle: [a]\n", body), 3, `title must be a single value, not a list`},
		{"repo as a mapping", "x.md", mf("repo: { a: b }\n", body), 2, `repo must be a single value, not a mapping`},
		{"key without a value", "x.md", mf("repo: svc\ntitle:\n", body), 3, `title has no value`},
		{"model like a flag", "x.md", mf("repo: svc\nmodel: --dangerously-skip-permissions\n", body), 3, `must not start with "-"`},
		{"model with a space", "x.md", mf("repo: svc\nmodel: a b\n", body), 3, `contains ' '`},
		{"unknown profile", "x.md", mf("repo: svc\nprofile: backend-devs\n", body), 3, `profile "backend-devs" does not exist (did you mean "backend-dev"?`},

		// body
		{"empty body", "x.md", mf("repo: svc\n", ""), 3, `the prompt (the markdown body after the front matter) is empty`},
		{"blank body", "x.md", mf("repo: svc\n", "\n  \n\t\n"), 3, `is empty`},
		{"empty acceptance section", "x.md", mf("repo: svc\n", "Task.\n\n## Acceptance\n\n## Notes\nx\n"), 6, `the ## Acceptance section is empty`},

		// the file as a whole
		{"over 1 MiB", "x.md", sized(MaxSize + 1), 0, `over the 1048576 byte (1 MiB) limit`},
		{"no front matter", "x.md", []byte("# Just markdown\n"), 1, `no YAML front matter`},
		{"TOML front matter", "x.md", []byte("+++\nrepo = \"svc\"\n+++\nbody\n"), 1, `no YAML front matter`},
		{"front matter never closed", "x.md", []byte("---\nrepo: svc\nbody\n"), 1, `never closed`},
		{"empty front matter", "x.md", []byte("---\n---\nbody\n"), 1, `repo is required`},
		{"front matter is a list", "x.md", mf("- repo\n- svc\n", body), 2, `front matter must be a mapping of keys to values, not a list`},
		{"front matter is a scalar", "x.md", mf("just text\n", body), 2, `not a single value`},
		{"YAML syntax error", "x.md", mf("repo: svc\ntitle: [unclosed\n", body), 3, `front matter is not valid YAML: did not find expected ',' or ']'`},
		{"YAML syntax error on the first line", "x.md", mf("repo: [\n", body), 2, `front matter is not valid YAML`},
		{"YAML bad indentation", "x.md", mf("repo: svc\nbudget:\n  wall: 1h\n usd: 2\n", body), 5, `front matter is not valid YAML`},
		{"YAML unknown anchor", "x.md", mf("repo: svc\nproduct: *nope\n", body), 2, `unknown anchor`},
		{"YAML tab indentation", "x.md", mf("repo: svc\nbudget:\n\twall: 1h\n", body), 4, `front matter is not valid YAML`},
		{"YAML document end marker", "x.md", mf("repo: svc\n...\nengine: claude\n", body), 4, `front matter is not valid YAML`},
		{"two YAML documents", "x.md", mf("repo: svc\n--- {engine: claude}\n", body), 3, `more than one YAML document`},
		{"invalid UTF-8", "x.md", append(mf("repo: svc\n", "ok\n"), 0xff, 0xfe), 5, `not valid UTF-8`},
		{"NUL byte", "x.md", mf("repo: svc\n", "a\x00b\n"), 4, `NUL byte`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			j, err := Parse(tt.file, tt.data, testCatalog(t))
			if err == nil {
				t.Fatalf("accepted, want an error containing %q\njob: %+v", tt.want, j)
			}
			if j != nil {
				t.Errorf("returned a job with the error")
			}
			var es Errors
			if !errors.As(err, &es) || len(es) == 0 {
				t.Fatalf("error is %T, want Errors: %v", err, err)
			}
			first := es[0]
			if first.Line != tt.line {
				t.Errorf("line %d, want %d: %v", first.Line, tt.line, first)
			}
			if !strings.Contains(first.Error(), tt.want) {
				t.Errorf("error\n  %v\ndoes not contain\n  %s", first, tt.want)
			}
			for _, e := range es {
				if strings.ContainsAny(e.Error(), "\r\n") {
					t.Errorf("error is not one line: %q", e.Error())
				}
				if e.File != tt.file {
					t.Errorf("error names file %q, want %q", e.File, tt.file)
				}
			}
			if strings.Contains(err.Error(), "ghp_SECRET") {
				t.Errorf("error echoes a credential: %v", err)
			}
		})
	}
}

// TestErrorFormat: every problem of a file is reported, in line order, each
// as "FILE:LINE: what (fix)".
func TestErrorFormat(t *testing.T) {
	data := []byte("\ufeff---\r\nengine: gpt\r\nrepo: a/b\r\nbudget: { wall: 45, usd: -1 }\r\nfoo: 1\r\n---\r\n\r\n")
	_, err := Parse("jobs/x.md", data, nil)
	want := []string{
		`jobs/x.md:2: engine "gpt" is not known (use one of: claude, codex, devin, script, any)`,
		`jobs/x.md:3: repo "a/b" is neither a repository name nor a git URL (name a repository under AQ_REPO_BASE (e.g. repo: my-service) or give a git URL (https://, ssh://, git@host:path, file://))`,
		`jobs/x.md:4: budget.wall "45" has no unit (write a duration with a unit, e.g. wall: 45m; units: s, m, h)`,
		`jobs/x.md:4: budget.usd -1 is out of range (use a number ≥ 0)`,
		`jobs/x.md:5: unknown key "foo" (known keys: id, title, repo, base, product, profile, engine, model, capabilities, priority, budget, deps, depsMode, idempotencyKey, retry, verify, verify_rounds, script, ship, sandbox, may_change)`,
		`jobs/x.md:6: the prompt (the markdown body after the front matter) is empty (write the task below the closing ---)`,
	}
	if err == nil {
		t.Fatal("accepted")
	}
	got := strings.Split(err.Error(), "\n")
	if !reflect.DeepEqual(got, want) {
		t.Errorf("got\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

// TestLineNumbers: lines count the opening ---, blank lines before it, a
// BOM and CRLF endings exactly as an editor shows them.
func TestLineNumbers(t *testing.T) {
	for name, data := range map[string]string{
		"plain":        "---\nrepo: svc\n\n# c\nengine: gpt\n---\nx\n",
		"crlf and bom": "\ufeff---\r\nrepo: svc\r\n\r\n# c\r\nengine: gpt\r\n---\r\nx\r\n",
		"blank lines":  "\n\n---\nrepo: svc\nengine: gpt\n---\nx\n",
	} {
		t.Run(name, func(t *testing.T) {
			_, err := Parse("x.md", []byte(data), nil)
			var es Errors
			if !errors.As(err, &es) || len(es) != 1 || es[0].Line != 5 {
				t.Errorf("want one error on line 5, got %v", err)
			}
		})
	}
}

// TestProfileMerge: the manifest wins field by field; capabilities are the
// union; defaults come last.
func TestProfileMerge(t *testing.T) {
	cat := testCatalog(t)
	parse := func(front string) *job.Job {
		t.Helper()
		j, err := Parse("x.md", mf(front, body), cat)
		if err != nil {
			t.Fatal(err)
		}
		return j
	}

	j := parse("repo: svc\nprofile: tester\n")
	eq(t, j.Profile, "tester")
	eq(t, j.Persona, "You test things.")
	eq(t, j.Engine, "codex")
	eq(t, j.Model, "gpt-5-codex")
	eq(t, j.Capabilities, []string{"has:git", "os:linux", "node:>=20"})
	eq(t, j.Budget, job.Budget{Wall: job.Duration(time.Hour), USD: 10, Tokens: 4000000, Turns: 120})

	j = parse("repo: svc\nprofile: tester\nengine: codex\nmodel: o3\nbudget: { usd: 2, turns: 0 }\n")
	eq(t, j.Model, "o3")
	eq(t, j.Budget, job.Budget{Wall: job.Duration(time.Hour), USD: 2, Tokens: 4000000, Turns: 0})

	j = parse("repo: svc\nprofile: tester\nengine: claude\n")
	eq(t, j.Engine, "claude")
	eq(t, j.Model, "") // the profile's model is codex's

	j = parse("repo: svc\nprofile: tester\ncapabilities: [has:docker, has:git, os:darwin]\n")
	eq(t, j.Capabilities, []string{"has:docker", "has:git", "os:darwin", "node:>=20"})

	j = parse("repo: svc\nprofile: tester\nbudget: { wall: 10m }\n")
	eq(t, j.Budget.Wall.D(), 10*time.Minute)

	// verify_rounds: the manifest's, else the profile's, else unset (the
	// factory's AQ_VERIFY_ROUNDS).
	eq(t, *parse("repo: svc\nprofile: tester\n").VerifyRounds, 3)
	eq(t, *parse("repo: svc\nprofile: tester\nverify_rounds: 0\n").VerifyRounds, 0)
	eq(t, parse("repo: svc\nprofile: scripted\nscript: x\n").VerifyRounds, (*int)(nil))

	// Without a profile, the defaults.
	j = parse("repo: svc\n")
	eq(t, j.Engine, job.DefaultEngine)
	eq(t, j.Budget.Wall.D(), job.DefaultWall)
	eq(t, j.Persona, "")

	// A nil catalog means the embedded profiles.
	j, err := Parse("x.md", mf("repo: svc\nprofile: frontend-dev\n", body), nil)
	if err != nil {
		t.Fatal(err)
	}
	eq(t, j.Profile, "frontend-dev")
	eq(t, j.Capabilities, []string{"has:git", "node:>=20"})
	if !strings.Contains(j.Persona, ".aq_pr.md") {
		t.Errorf("persona of frontend-dev: %q", j.Persona)
	}
}

func TestParseFile(t *testing.T) {
	dir := t.TempDir()
	good := filepath.Join(dir, "good-job.md")
	write(t, good, string(mf("repo: svc\n", body)))
	j, err := ParseFile(good, nil)
	if err != nil {
		t.Fatal(err)
	}
	eq(t, j.ID, "good-job")
	eq(t, j.Source, good)

	for name, tc := range map[string]struct {
		path string
		want string
	}{
		"missing":   {filepath.Join(dir, "nope.md"), dir + "/nope.md: cannot read: no such file or directory (check the path and its permissions)"},
		"directory": {dir, dir + ": is a directory, not a manifest"},
		"too big":   {filepath.Join(dir, "big.md"), "over the 1048576 byte (1 MiB) limit"},
	} {
		t.Run(name, func(t *testing.T) {
			if name == "too big" {
				write(t, tc.path, string(sized(MaxSize+10)))
			}
			_, err := ParseFile(tc.path, nil)
			var es Errors
			if !errors.As(err, &es) || len(es) != 1 {
				t.Fatalf("want one error, got %v", err)
			}
			if !strings.Contains(es[0].Error(), tc.want) || es[0].Line != 0 {
				t.Errorf("got %q, want %q without a line", es[0].Error(), tc.want)
			}
		})
	}
}

// TestCheckBranch covers the git ref rules on their own.
func TestCheckBranch(t *testing.T) {
	for _, ok := range []string{"main", "master", "release/2.x", "feature/a-b_c.d", "v1.0", "ü-branch"} {
		if msg := CheckBranch(ok); msg != "" {
			t.Errorf("CheckBranch(%q) = %q, want valid", ok, msg)
		}
	}
	for _, bad := range []string{"", "@", "-x", "/x", "x/", "x.", "a..b", "a//b", "a@{b", "a b", "a~", "a^", "a:b", "a?", "a*", "a[", `a\b`, "a\x7f", "a\x01", ".x", "a/.b", "x.lock", "a.lock/b", strings.Repeat("b", 256)} {
		if CheckBranch(bad) == "" {
			t.Errorf("CheckBranch(%q) accepted", bad)
		}
	}
}

// TestDeepNestingRefused: goldmark's work grows with the square of the
// nesting of quotes and lists, so a line nesting them absurdly deep is
// refused before it is parsed; 32 levels are still fine.
func TestDeepNestingRefused(t *testing.T) {
	ok := mf("repo: svc\n", "Task.\n\n"+strings.Repeat("> ", MaxNesting)+"quoted\n")
	if _, err := Parse("x.md", ok, nil); err != nil {
		t.Errorf("%d levels refused: %v", MaxNesting, err)
	}
	for name, line := range map[string]string{
		"quotes":        strings.Repeat(">", 1000) + " x",
		"ordered lists": strings.Repeat("1. ", 100) + "x",
		"mixed":         strings.Repeat("> - ", 20) + "x",
	} {
		_, err := Parse("x.md", mf("repo: svc\n", "Task.\n\n"+line+"\n"), nil)
		var es Errors
		if !errors.As(err, &es) || es[0].Line != 6 || !strings.Contains(es[0].Msg, "nests quotes or lists") {
			t.Errorf("%s: got %v", name, err)
		}
	}
}

// TestPathologicalBodies: inputs that make a markdown parser quadratic
// finish quickly (before the block-only parser and the nesting limit, some
// of these took minutes).
func TestPathologicalBodies(t *testing.T) {
	n := MaxSize - 100
	for name, b := range map[string]string{
		"nested quotes":       strings.Repeat(">", n),
		"nested ordered list": strings.Repeat("1. ", n/3),
		"unclosed links":      strings.Repeat("[a](", n/4),
		"link definitions":    strings.Repeat("[a]:\n", n/5),
		"brackets":            strings.Repeat("[", n),
		"emphasis":            strings.Repeat("_*", n/2),
	} {
		t.Run(name, func(t *testing.T) {
			done := make(chan struct{})
			go func() {
				defer close(done)
				Parse("x.md", mf("repo: svc\n", b), nil)
			}()
			select {
			case <-done:
			case <-time.After(20 * time.Second):
				t.Fatal("Parse took over 20 s")
			}
		})
	}
}

// TestProblemCap: a file with thousands of bad entries reports MaxProblems
// of them and says how many more there were.
func TestProblemCap(t *testing.T) {
	var front strings.Builder
	front.WriteString("repo: svc\n")
	for i := 0; i < 500; i++ {
		front.WriteString("bad" + strings.Repeat("x", i%7) + string(rune('a'+i%26)) + string(rune('a'+i/26)) + ": 1\n")
	}
	_, err := Parse("x.md", mf(front.String(), body), nil)
	var es Errors
	if !errors.As(err, &es) {
		t.Fatal(err)
	}
	if len(es) != 51 {
		t.Fatalf("%d problems reported, want 50 and a summary", len(es))
	}
	if last := es[len(es)-1].Error(); last != "x.md: 450 more problems not shown (fix the ones above first)" {
		t.Errorf("summary %q", last)
	}
}

// TestParseConcurrent: Parse shares its markdown parser and the embedded
// profiles between goroutines (run with -race).
func TestParseConcurrent(t *testing.T) {
	data := mf("repo: svc\nprofile: backend-dev\ncapabilities: [has:docker]\n", body+"\n## Acceptance\n- done\n")
	done := make(chan error)
	for i := 0; i < 8; i++ {
		go func() {
			var err error
			for k := 0; k < 20 && err == nil; k++ {
				var j *job.Job
				if j, err = Parse("x.md", data, nil); err == nil && j.Acceptance != "- done" {
					err = errors.New("wrong acceptance " + j.Acceptance)
				}
			}
			done <- err
		}()
	}
	for i := 0; i < 8; i++ {
		if err := <-done; err != nil {
			t.Error(err)
		}
	}
}
