// Package preflight says, when a job is validated or submitted, what on this
// host would keep it from running or shipping: its engine is not installed,
// its repository is not found, or the tool its ship: needs is missing. These
// are warnings, never refusals — a manifest is valid wherever it is checked,
// a fleet job may run on another factory, and the user may install what is
// missing before the job runs. Without them a newcomer's first job waits in
// the inbox, or dead-letters, with no word at the moment they submitted it
// (docs/local.md, docs/troubleshooting.md).
package preflight

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strings"

	"github.com/aqfleet/aq/agent/repos"
	"github.com/aqfleet/aq/engines"
	"github.com/aqfleet/aq/internal/mdmeta"
	"github.com/aqfleet/aq/internal/sandbox"
	"github.com/aqfleet/aq/job"
	"github.com/aqfleet/aq/worktree"
)

// Host is where a job is checked.
type Host struct {
	// RepoBase is AQ_REPO_BASE: a repo: name is the git repository
	// directly below it.
	RepoBase string
	// RepoURLs is AQ_REPO_URLS: names it resolves are cloned on first use.
	RepoURLs string
	// LookPath finds a binary on PATH; nil: exec.LookPath.
	LookPath func(name string) (string, error)
	// Engines are the engines this host may run (config.RunEngines:
	// AQ_ENGINES, or its default for the mode); nil: every engine.
	Engines []string
	// Visible says whether a host path is seen inside the job's sandbox
	// and, when not, why (sandbox.Policy.Visible); nil: engines run
	// unsandboxed (AQ_SANDBOX=off), and every path is seen.
	Visible func(path string) (bool, string)
	// Home is the user's home, for ~ and $HOME in a command.
	Home string
}

// runs reports whether this host may run engine e.
func (h Host) runs(e string) bool { return h.Engines == nil || slices.Contains(h.Engines, e) }

func (h Host) lookPath(name string) bool {
	look := h.LookPath
	if look == nil {
		look = exec.LookPath
	}
	_, err := look(name)
	return err == nil
}

// Check returns one line per thing this host lacks to run and ship j, each
// saying what is missing, what would happen to the job, and how to fix it.
// None when the job can run here as far as can be told without running it.
func Check(j *job.Job, h Host) []string {
	var out []string
	if w := h.engine(j); w != "" {
		out = append(out, w)
	}
	if w := h.repo(j); w != "" {
		out = append(out, w)
	}
	if w := h.ship(j); w != "" {
		out = append(out, w)
	}
	return append(out, h.hidden(j)...)
}

// hidden says which paths the job's script: and verify: commands name that
// the sandbox hides from them: such a command fails with "command not
// found" (exit 127) or a missing file, though the file is there.
func (h Host) hidden(j *job.Job) []string {
	if h.Visible == nil {
		return nil
	}
	var out []string
	check := func(key, command string) {
		for _, p := range sandbox.CommandPaths(command, h.Home) {
			if ok, why := h.Visible(p); !ok {
				out = append(out, fmt.Sprintf("%s names %s, which the job's sandbox hides: %s, so the job would fail as if it were missing (%s)", key, p, why, sandbox.HiddenFix))
			}
		}
	}
	if j.Engine == "script" {
		check("script:", j.Script)
	}
	check("verify:", j.Verify)
	return out
}

func (h Host) engine(j *job.Job) string {
	if j.Engine != "" && j.Engine != engines.Any && !h.runs(j.Engine) {
		return fmt.Sprintf("engine %s is not among the engines this host runs (%s; AQ_ENGINES sets them, docs/fleet.md): aq run leaves the job in the inbox "+
			"(add %s to AQ_ENGINES, or choose one of those engines)", j.Engine, strings.Join(h.Engines, ", "), j.Engine)
	}
	switch {
	case slices.Contains(engines.Coding(), j.Engine): // found by their binary on PATH
		if h.lookPath(j.Engine) {
			return ""
		}
		return fmt.Sprintf("engine %s is not installed on this host (no %q on PATH): aq run leaves the job in the inbox until it is "+
			"(install %s, or choose another engine: engine: script runs a command of yours and needs no account, docs/local.md)", j.Engine, j.Engine, j.Engine)
	case j.Engine == "" || j.Engine == engines.Any: // the first coding engine installed
		var coding []string
		for _, e := range engines.Coding() {
			if !h.runs(e) {
				continue
			}
			if h.lookPath(e) {
				return ""
			}
			coding = append(coding, e)
		}
		if len(coding) == 0 {
			return fmt.Sprintf("engine %s needs a coding engine, and the engines this host runs (%s; AQ_ENGINES sets them) name none: aq run leaves the job in the inbox "+
				"(add claude, codex or devin to AQ_ENGINES)", orAny(j.Engine), strings.Join(h.Engines, ", "))
		}
		return fmt.Sprintf("engine %s needs one of %s, and none is installed on this host: aq run leaves the job in the inbox until one is "+
			"(install one, or use engine: script with a script: command, docs/local.md)", orAny(j.Engine), strings.Join(coding, ", "))
	}
	return ""
}

func orAny(e string) string {
	if e == "" {
		return "any"
	}
	return e
}

func (h Host) repo(j *job.Job) string {
	if j.RepoURL != "" || j.Repo == "" {
		return "" // a URL is cloned on demand: nothing here to look at
	}
	dir := filepath.Join(h.RepoBase, j.Repo)
	if worktree.IsRepo(dir) {
		return ""
	}
	r, _, err := repos.Parse(h.RepoURLs)
	if err == nil {
		if _, ok, rerr := r.Resolve(j.Repo); ok && rerr == nil {
			return "" // AQ_REPO_URLS has it: cloned on first use
		}
	}
	hint := "clone it there, list it in AQ_REPO_URLS, or fix repo:"
	if near := mdmeta.Suggest(j.Repo, localRepos(h.RepoBase)); near != "" && near != j.Repo {
		hint = fmt.Sprintf("did you mean repo: %s? or clone it there, or list it in AQ_REPO_URLS", near)
	}
	return fmt.Sprintf("repo %s is not a git repository under AQ_REPO_BASE (%s), and AQ_REPO_URLS has no URL for it: "+
		"aq run on this host would fail the job (repo_unavailable) (%s)", j.Repo, dir, hint)
}

// localRepos are the git repositories directly under base, by name.
func localRepos(base string) []string {
	ents, err := os.ReadDir(base)
	if err != nil {
		return nil
	}
	var names []string
	for _, e := range ents {
		if !strings.HasPrefix(e.Name(), ".") && worktree.IsRepo(filepath.Join(base, e.Name())) {
			names = append(names, e.Name())
		}
	}
	sort.Strings(names)
	return names
}

func (h Host) ship(j *job.Job) string {
	if j.Ship != "pr" && j.Ship != "merge" {
		return ""
	}
	if h.lookPath("gh") {
		return ""
	}
	return fmt.Sprintf("ship: %s needs the GitHub CLI gh, which is not installed on this host: aq run would fail the job before its engine runs (capability_mismatch) "+
		"(install gh from https://cli.github.com and run gh auth login, or use ship: branch)", j.Ship)
}
