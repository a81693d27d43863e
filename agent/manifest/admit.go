package manifest

import (
	"fmt"
	"slices"
	"strings"

	"github.com/aqfleet/aq/internal/mdmeta"
	"github.com/aqfleet/aq/internal/sandbox"
	"github.com/aqfleet/aq/job"
	"github.com/aqfleet/aq/profiles"
)

// Admission: the one check every job passes before aq acts on it, wherever
// it came from — a manifest file, a claim, an accept, a broker message
// (docs/fleet.md#what-a-factory-refuses). Parse checks what a manifest says;
// Admit adds what the factory decides (its engines, fleet mode's repo rule)
// and, for a job from the coordinator, that the coordinator's id and repo
// are valid and agree with the manifest's. It touches no file and no git:
// what fails is refused before anything does.

// Policy is what this factory runs.
type Policy struct {
	// Fleet: the job came from the coordinator. Its repo must be a name the
	// factory resolves (AQ_REPO_BASE, AQ_REPO_URLS), never a URL or a path.
	Fleet bool
	// Engines are the engines this factory may run (AQ_ENGINES, resolved);
	// nil: every engine aq knows.
	Engines []string
	// Sandbox, when set, is the sandbox level this factory's engines run
	// at (the runner's sandbox.Host.Level): a job whose capabilities
	// require a higher one (sandbox: required is sandbox:full) is refused
	// sandbox_unavailable, retryable elsewhere — routing keeps such a job
	// from this factory, so only a coordinator that ignored the capability
	// hands it here (docs/sandbox.md). nil: not checked (aq submit).
	Sandbox func() sandbox.Level
}

// Allows reports whether p lets a job ask for engine (any: when it allows
// at least one coding engine).
func (p Policy) Allows(engine string) bool {
	if p.Engines == nil {
		return true
	}
	if engine == "" || engine == "any" {
		for _, e := range p.Engines {
			if e != "script" {
				return true
			}
		}
		return false
	}
	return slices.Contains(p.Engines, engine)
}

// Refusal is a job refused at admission: the reason it fails with and one
// line that says why (untrusted values shown with job.Show).
type Refusal struct {
	Reason job.Reason
	Msg    string
	// Err is the manifest's own problems (Errors), for invalid_manifest.
	Err error
}

func (r *Refusal) Error() string { return r.Msg }

func (r *Refusal) Unwrap() error { return r.Err }

// Wire is a job as the coordinator handed it out.
type Wire struct {
	ID   string // the coordinator's job id
	Repo string // the coordinator's repo ("" when it sent none)
	// Asked is the id this factory asked for (an accept, a broker
	// message); "" for a claim.
	Asked  string
	BodyMd string // the verbatim manifest
}

// Admit checks a job the coordinator handed out and returns it parsed:
// the coordinator's id must be a valid job id (and the one asked for), its
// repo a valid name; the manifest must parse (else invalid_manifest: its
// author's problem, as locally), name the same id and repo, and pass Check
// under p (fleet mode is implied). Every other refusal is invalid_job: the
// job document, not only its manifest, is not one a factory may act on.
func Admit(w Wire, cat *profiles.Catalog, p Policy) (*job.Job, *Refusal) {
	p.Fleet = true
	if msg := job.CheckID(w.ID); msg != "" {
		return nil, invalid("the coordinator's job id %s %s", job.Show(w.ID), msg)
	}
	if w.Asked != "" && w.Asked != w.ID {
		return nil, invalid("the coordinator answered job %s to an accept of job %s", w.ID, job.Show(w.Asked))
	}
	if w.Repo != "" {
		if msg := CheckRepoName(w.Repo); msg != "" {
			return nil, invalid("the coordinator's repo %s %s", job.Show(w.Repo), msg)
		}
	}
	if strings.TrimSpace(w.BodyMd) == "" {
		return nil, &Refusal{Reason: job.ReasonInvalidManifest, Msg: "the coordinator's job document has no bodyMd (the manifest)"}
	}
	if cat == nil {
		var err error
		if cat, err = profiles.Embedded(); err != nil {
			return nil, &Refusal{Reason: job.ReasonInvalidManifest, Msg: err.Error(), Err: err}
		}
	}
	j, err := Parse(w.ID+".md", []byte(w.BodyMd), cat)
	if err != nil {
		return nil, &Refusal{Reason: job.ReasonInvalidManifest, Msg: err.Error(), Err: err}
	}
	if j.ID != w.ID {
		return nil, invalid("the manifest's id %s is not the coordinator's job id %s", j.ID, w.ID)
	}
	if w.Repo != "" && j.Repo != w.Repo && j.RepoURL == "" {
		return nil, invalid("the manifest's repo %s is not the coordinator's repo %s", j.Repo, w.Repo)
	}
	if r := Check(j, p); r != nil {
		return nil, r
	}
	return j, nil
}

// Check is the factory's part of admission for a parsed job (Parse has
// checked the manifest itself): in fleet mode the repo is a name, the
// engine is one this factory runs, and the sandbox level it requires is one
// its engines run at. A refused engine is capability_mismatch and a refused
// sandbox sandbox_unavailable (another factory may have them); the rest is
// invalid_job.
func Check(j *job.Job, p Policy) *Refusal {
	if msg := job.CheckID(j.ID); msg != "" {
		return invalid("the job id %s %s", job.Show(j.ID), msg)
	}
	if msg := CheckRepoName(j.Repo); msg != "" {
		return invalid("the repo %s %s", job.Show(j.Repo), msg)
	}
	if p.Fleet && j.RepoURL != "" {
		return invalid("repo: %s is a URL or a path; in fleet mode a job names a repository (repo: %s), which the factory resolves from AQ_REPO_BASE or AQ_REPO_URLS",
			job.Show(redact(j.RepoURL)), j.Repo)
	}
	if msg := CheckBase(j.ID, j.Base); msg != "" {
		return invalid("base %s %s (name the branch the work starts from, e.g. base: main)", job.Show(j.Base), msg)
	}
	if !p.Allows(j.Engine) {
		what := "engine " + j.Engine
		if j.Engine == "" || j.Engine == "any" {
			what = "engine any (a coding engine)"
		}
		return &Refusal{Reason: job.ReasonCapabilityMismatch,
			Msg: fmt.Sprintf("%s is not offered by this factory (AQ_ENGINES: %s)", what, strings.Join(p.Engines, ","))}
	}
	if need := RequiredSandbox(j.Capabilities); need != sandbox.LevelNone && p.Sandbox != nil {
		if have := p.Sandbox(); !have.Holds(need) {
			return &Refusal{Reason: job.ReasonSandboxUnavailable,
				Msg: fmt.Sprintf("the job requires sandbox:%s and engines run %s here (docs/sandbox.md)", need, levelWords(have))}
		}
	}
	return nil
}

// RequiredSandbox is the highest sandbox level caps require (sandbox:
// required adds sandbox:full); none when they require none.
func RequiredSandbox(caps []string) sandbox.Level {
	need := sandbox.LevelNone
	for _, c := range caps {
		r, err := job.ParseRequirement(c)
		if err != nil || r.Kind != "sandbox" {
			continue
		}
		if l := sandbox.Level(r.Value); !need.Holds(l) {
			need = l
		}
	}
	return need
}

func levelWords(l sandbox.Level) string {
	if l == sandbox.LevelNone || l == "" {
		return "unsandboxed"
	}
	return "in a " + string(l) + " sandbox"
}

// CheckRepoName returns what is wrong with name as a repository name, or "".
func CheckRepoName(name string) string { return mdmeta.CheckName(name) }

// CheckBase returns what is wrong with base as job id's base branch, beyond
// git's rules (CheckBranch): it may not be HEAD (which names no branch, and
// moves), nor one of aq's own branches for the job (aq/job/<id> is its
// result, aq/wip/<id> a checkpoint) — a job built on itself.
func CheckBase(id, base string) string {
	if msg := CheckBranch(base); msg != "" {
		return "is not a valid git branch name: it " + msg
	}
	switch {
	case base == "HEAD" || strings.HasPrefix(base, "HEAD/") || strings.HasPrefix(base, "refs/"):
		return "is not a branch name"
	case strings.HasPrefix(base, "aq/wip/"):
		return "is an aq checkpoint branch, not a base"
	case id != "" && base == job.JobBranch(id):
		return "is this job's own result branch"
	}
	return ""
}

func invalid(format string, args ...any) *Refusal {
	return &Refusal{Reason: job.ReasonInvalidJob, Msg: fmt.Sprintf(format, args...)}
}
