package preflight

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/aqfleet/aq/internal/testenv"
	"github.com/aqfleet/aq/job"
)

func TestMain(m *testing.M) { os.Exit(testenv.Main(m)) }

// installed is a LookPath that finds only the named binaries.
func installed(names ...string) func(string) (string, error) {
	return func(n string) (string, error) {
		if slices.Contains(names, n) {
			return "/usr/bin/" + n, nil
		}
		return "", errors.New("not found")
	}
}

func TestCheck(t *testing.T) {
	base := t.TempDir()
	testenv.NewRepo(t, base, "webapp", nil)
	if err := os.MkdirAll(filepath.Join(base, "notes"), 0o755); err != nil { // a folder, not a repository
		t.Fatal(err)
	}
	urls := filepath.Join(t.TempDir(), "urls")
	testenv.WriteFile(t, urls, "api https://example.invalid/org/api.git\n")

	tests := []struct {
		name string
		j    job.Job
		have []string // binaries on PATH
		urls string
		want []string // one substring per warning, in order; nil: none
		run  []string // AQ_ENGINES; nil: every engine
	}{
		{"all there", job.Job{Repo: "webapp", Engine: "claude", Ship: "pr"}, []string{"claude", "gh"}, "", nil, nil},
		{"script needs no engine", job.Job{Repo: "webapp", Engine: "script", Ship: "branch"}, nil, "", nil, nil},
		{"engine not installed", job.Job{Repo: "webapp", Engine: "claude", Ship: "branch"}, []string{"codex"}, "",
			[]string{`engine claude is not installed on this host (no "claude" on PATH): aq run leaves the job in the inbox until it is (install claude, or choose another engine: engine: script`}, nil},
		{"any with none", job.Job{Repo: "webapp", Engine: "any", Ship: "none"}, []string{"gh"}, "",
			[]string{"engine any needs one of claude, codex, devin, and none is installed on this host"}, nil},
		{"any with one", job.Job{Repo: "webapp", Engine: "any"}, []string{"devin"}, "", nil, nil},
		{"a misspelt repo", job.Job{Repo: "webap", Engine: "script"}, nil, "",
			[]string{"repo webap is not a git repository under AQ_REPO_BASE (" + filepath.Join(base, "webap") + "), and AQ_REPO_URLS has no URL for it: aq run on this host would fail the job (repo_unavailable) (did you mean repo: webapp?"}, nil},
		{"a folder that is no repository", job.Job{Repo: "notes", Engine: "script"}, nil, "",
			[]string{"(repo_unavailable) (clone it there, list it in AQ_REPO_URLS, or fix repo:)"}, nil},
		{"cloned on demand", job.Job{Repo: "api", Engine: "script"}, nil, urls, nil, nil},
		{"a template clones any name", job.Job{Repo: "anything", Engine: "script"}, nil, "https://example.invalid/org/{repo}.git", nil, nil},
		{"a URL is not looked for", job.Job{Repo: "web", RepoURL: "https://example.invalid/org/web.git", Engine: "script"}, nil, "", nil, nil},
		{"pr without gh", job.Job{Repo: "webapp", Engine: "script", Ship: "pr"}, nil, "",
			[]string{"ship: pr needs the GitHub CLI gh, which is not installed on this host: aq run would fail the job before its engine runs (capability_mismatch)"}, nil},
		{"merge without gh", job.Job{Repo: "webapp", Engine: "script", Ship: "merge"}, nil, "", []string{"ship: merge needs the GitHub CLI gh"}, nil},
		{"everything missing", job.Job{Repo: "nope", Engine: "codex", Ship: "pr"}, nil, "",
			[]string{"engine codex is not installed", "repo nope is not a git repository", "ship: pr needs the GitHub CLI gh"}, nil},
		{"installed but not run here", job.Job{Repo: "webapp", Engine: "claude"}, []string{"claude"}, "",
			[]string{"engine claude is not among the engines this host runs (codex; AQ_ENGINES sets them, docs/fleet.md): aq run leaves the job in the inbox (add claude to AQ_ENGINES"}, []string{"codex"}},
		{"script not run here", job.Job{Repo: "webapp", Engine: "script"}, nil, "",
			[]string{"engine script is not among the engines this host runs (claude, codex; AQ_ENGINES sets them"}, []string{"claude", "codex"}},
		{"any among those run here", job.Job{Repo: "webapp", Engine: "any"}, []string{"claude", "devin"}, "", nil, []string{"devin"}},
		{"any with only others run here", job.Job{Repo: "webapp", Engine: "any"}, []string{"claude"}, "",
			[]string{"engine any needs one of codex, and none is installed on this host"}, []string{"codex", "script"}},
		{"any where only script is run", job.Job{Repo: "webapp", Engine: "any"}, []string{"claude"}, "",
			[]string{"engine any needs a coding engine, and the engines this host runs (script; AQ_ENGINES sets them) name none"}, []string{"script"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := Check(&tt.j, Host{RepoBase: base, RepoURLs: tt.urls, LookPath: installed(tt.have...), Engines: tt.run})
			if len(got) != len(tt.want) {
				t.Fatalf("got %d warnings, want %d:\n%s", len(got), len(tt.want), strings.Join(got, "\n"))
			}
			for i, w := range tt.want {
				if !strings.Contains(got[i], w) {
					t.Errorf("warning %d:\n%s\nwant it to contain\n%s", i, got[i], w)
				}
				if strings.ContainsAny(got[i], "\n\r") {
					t.Errorf("warning %d is not one line: %q", i, got[i])
				}
			}
		})
	}
}
