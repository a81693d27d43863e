package manifest

import (
	"strings"
	"testing"

	"github.com/aqfleet/aq/job"
)

// TestAdmit: a job from the coordinator is admitted only when its id and
// repo are valid and agree with its manifest's, its repo is a name, its
// base is a branch to start from, and its engine is one the factory runs;
// each refusal has the reason that tells an operator where to look.
func TestAdmit(t *testing.T) {
	manifest := func(front string) string { return "---\n" + front + "---\n# Fix it\n\nDo it.\n" }
	ok := manifest("id: j1\nrepo: app\nengine: script\nscript: make\n")
	all := Policy{}
	noScript := Policy{Engines: []string{"claude", "codex", "devin"}}
	for _, c := range []struct {
		name   string
		w      Wire
		p      Policy
		reason job.Reason
		want   string // in the refusal's message
	}{
		{"valid", Wire{ID: "j1", Repo: "app", BodyMd: ok}, all, "", ""},
		{"no repo from the coordinator", Wire{ID: "j1", BodyMd: ok}, all, "", ""},
		{"accept answered the job asked for", Wire{ID: "j1", Asked: "j1", BodyMd: ok}, all, "", ""},
		{"id climbs out", Wire{ID: "../../x", Repo: "app", BodyMd: ok}, all, job.ReasonInvalidJob, `job id "../../x" contains ".."`},
		{"id with a slash", Wire{ID: "a/b", Repo: "app", BodyMd: ok}, all, job.ReasonInvalidJob, `"a/b" must start with`},
		{"id with an escape", Wire{ID: "a\x1b[2Jb", BodyMd: ok}, all, job.ReasonInvalidJob, `"a\x1b[2Jb"`},
		{"id of 10 KB", Wire{ID: strings.Repeat("x", 10<<10), BodyMd: ok}, all, job.ReasonInvalidJob, "… (10240 bytes) is 10240 bytes long"},
		{"empty id", Wire{ID: "", BodyMd: ok}, all, job.ReasonInvalidJob, "is empty"},
		{"id ending in .lock", Wire{ID: "j.lock", BodyMd: ok}, all, job.ReasonInvalidJob, `ends in ".lock"`},
		{"accept answered another job", Wire{ID: "j1", Asked: "j2", BodyMd: ok}, all, job.ReasonInvalidJob, "answered job j1 to an accept of job j2"},
		{"coordinator's repo is a path", Wire{ID: "j1", Repo: "../secret", BodyMd: ok}, all, job.ReasonInvalidJob, `repo "../secret"`},
		{"manifest's id differs", Wire{ID: "j2", Repo: "app", BodyMd: ok}, all, job.ReasonInvalidJob, "the manifest's id j1 is not the coordinator's job id j2"},
		{"manifest's repo differs", Wire{ID: "j1", Repo: "other", BodyMd: ok}, all, job.ReasonInvalidJob, "the manifest's repo app is not the coordinator's repo other"},
		{"repo by file URL", Wire{ID: "j1", Repo: "secret", BodyMd: manifest("id: j1\nrepo: file:///srv/secret.git\nengine: script\nscript: make\n")}, all,
			job.ReasonInvalidJob, "is a URL or a path; in fleet mode a job names a repository (repo: secret)"},
		{"repo by https URL", Wire{ID: "j1", BodyMd: manifest("id: j1\nrepo: https://example.com/org/app.git\nengine: script\nscript: make\n")}, all,
			job.ReasonInvalidJob, "is a URL or a path"},
		{"repo by scp-like URL", Wire{ID: "j1", BodyMd: manifest("id: j1\nrepo: git@example.com:org/app.git\nengine: script\nscript: make\n")}, all,
			job.ReasonInvalidJob, "is a URL or a path"},
		{"base HEAD", Wire{ID: "j1", BodyMd: manifest("id: j1\nrepo: app\nbase: HEAD\nengine: script\nscript: make\n")}, all,
			job.ReasonInvalidManifest, `base "HEAD" is not a branch name`},
		{"base is its own result", Wire{ID: "j1", BodyMd: manifest("id: j1\nrepo: app\nbase: aq/job/j1\nengine: script\nscript: make\n")}, all,
			job.ReasonInvalidManifest, "is this job's own result branch"},
		{"base is a checkpoint", Wire{ID: "j1", BodyMd: manifest("id: j1\nrepo: app\nbase: aq/wip/j0\nengine: script\nscript: make\n")}, all,
			job.ReasonInvalidManifest, "is an aq checkpoint branch"},
		{"script not offered", Wire{ID: "j1", BodyMd: ok}, noScript, job.ReasonCapabilityMismatch, "engine script is not offered by this factory (AQ_ENGINES: claude,codex,devin)"},
		{"any with only script", Wire{ID: "j1", BodyMd: manifest("id: j1\nrepo: app\n")}, Policy{Engines: []string{"script"}}, job.ReasonCapabilityMismatch, "engine any"},
		{"no manifest", Wire{ID: "j1"}, all, job.ReasonInvalidManifest, "has no bodyMd"},
		{"manifest does not parse", Wire{ID: "j1", BodyMd: manifest("id: j1\nrepo: app\nnosuchkey: 1\n")}, all, job.ReasonInvalidManifest, "nosuchkey"},
	} {
		t.Run(c.name, func(t *testing.T) {
			j, ref := Admit(c.w, nil, c.p)
			switch {
			case c.reason == "" && ref != nil:
				t.Fatalf("refused: %s (%s)", ref.Msg, ref.Reason)
			case c.reason == "" && (j == nil || j.ID != c.w.ID):
				t.Fatalf("admitted %+v", j)
			case c.reason == "":
				return
			case ref == nil:
				t.Fatalf("admitted, want %s", c.reason)
			case ref.Reason != c.reason || !strings.Contains(ref.Msg, c.want):
				t.Fatalf("refused %s: %q; want %s naming %q", ref.Reason, ref.Msg, c.reason, c.want)
			case len(ref.Msg) > 400 || strings.ContainsAny(ref.Msg, "\x1b\n"):
				t.Fatalf("the refusal is not one short printable line: %q", ref.Msg)
			}
		})
	}
}

// TestCheckLocal: locally a repo URL is the user's own choice (repo: keeps
// its documented meanings); AQ_ENGINES still applies.
func TestCheckLocal(t *testing.T) {
	j, err := Parse("j.md", mf("repo: file:///srv/app.git\nengine: script\nscript: make\n", body), nil)
	if err != nil {
		t.Fatal(err)
	}
	if ref := Check(j, Policy{}); ref != nil {
		t.Fatalf("local: %v", ref)
	}
	if ref := Check(j, Policy{Fleet: true}); ref == nil || ref.Reason != job.ReasonInvalidJob {
		t.Fatalf("fleet: %v", ref)
	}
	if ref := Check(j, Policy{Engines: []string{"claude"}}); ref == nil || ref.Reason != job.ReasonCapabilityMismatch {
		t.Fatalf("AQ_ENGINES=claude: %v", ref)
	}
}

// TestTitleFromBodyIsPrintable (finding 11): a title taken from the body's
// heading loses its control characters (an ESC that would steer the
// terminal of whoever runs aq job show) and is cut to the title limit.
func TestTitleFromBodyIsPrintable(t *testing.T) {
	j, err := Parse("j.md", mf("repo: app\n", "# Fix \x1b[31mred\x1b[0m\tthings "+strings.Repeat("y", 400)+"\n\nDo it.\n"), nil)
	if err != nil {
		t.Fatal(err)
	}
	if strings.ContainsAny(j.Title, "\x1b\t") || !strings.HasPrefix(j.Title, "Fix [31mred[0m things") || len([]rune(j.Title)) != MaxTitle {
		t.Fatalf("title %q (%d runes)", j.Title, len([]rune(j.Title)))
	}
}
