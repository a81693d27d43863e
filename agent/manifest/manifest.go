// Package manifest owns job manifests (docs/manifest.md): it reads a markdown file
// with YAML front matter, validates every key strictly (unknown keys, wrong
// types and bad values are errors that name the line), merges the named
// profile under it, applies aq's defaults and returns the normalised
// *job.Job that the queue, the runner and the fleet client share.
//
// Every problem renders as one line, "FILE:LINE: what is wrong (how to
// fix)", and all problems of a file are reported together (Errors).
package manifest

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"path/filepath"
	"slices"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/aqfleet/aq/engines"
	"github.com/aqfleet/aq/internal/mdmeta"
	"github.com/aqfleet/aq/internal/shipcheck"
	"github.com/aqfleet/aq/job"
	"github.com/aqfleet/aq/profiles"
)

// Error is one problem in a manifest; it renders as one line,
// "FILE:LINE: what is wrong (how to fix)". It is shared with the profiles
// package, so errors.As finds it whichever file was bad.
type Error = mdmeta.Error

// Errors is every problem found in a manifest, in line order; Parse and
// ParseFile return it as their error.
type Errors = mdmeta.Errors

// MaxSize is the largest manifest accepted (1 MiB); a larger one is refused
// before it is parsed.
const MaxSize = mdmeta.MaxSize

// Keys are the front matter keys a manifest may use (docs/manifest.md, "Keys");
// any other key is an error.
var Keys = []string{"id", "title", "repo", "base", "product", "profile", "engine", "model", "capabilities",
	"priority", "budget", "deps", "depsMode", "idempotencyKey", "retry", "verify", "verify_rounds", "script", "ship", "sandbox",
	"may_change"}

// RetryKeys are the keys of retry:.
var RetryKeys = []string{"max", "backoff"}

// SandboxRequired is the one value of sandbox:. It adds the capability
// job.SandboxRequired (sandbox:full) to the job.
const SandboxRequired = "required"

// DepsModes are the depsMode: values.
var DepsModes = []string{"all", "any"}

// Limits on free-text values.
const (
	MaxTitle          = 256 // characters
	MaxIdempotencyKey = 256 // characters
	MaxRetries        = 100
)

// ParseFile reads and parses the manifest at path; see Parse. A file that
// cannot be read, or is over MaxSize, is refused without being parsed; the
// error is then an Errors with one line about the file.
func ParseFile(path string, cat *profiles.Catalog) (*job.Job, error) {
	data, err := ReadFile(path)
	if err != nil {
		return nil, err
	}
	return Parse(path, data, cat)
}

// ReadFile reads the manifest at path for Parse, refusing a directory and a
// file over MaxSize without reading it whole; the error is then an Errors
// with one line about the file — wrapped in an *UnreadableError when the
// file could not be read at all (a usage error: the path is wrong).
func ReadFile(path string) ([]byte, error) {
	data, msg, fix, unreadable := readFile(path)
	if msg != "" {
		errs := Errors{{File: path, Msg: msg, Fix: fix}}
		if unreadable {
			return nil, &UnreadableError{Errors: errs}
		}
		return nil, errs
	}
	return data, nil
}

// UnreadableError is a manifest file that could not be read at all: it does
// not exist, cannot be opened or read, or is not a regular file (a
// directory, a FIFO, a device). Commands treat it as a usage error (exit 2,
// docs/troubleshooting.md), where a file that was read and is invalid is
// the manifest's problem. errors.As finds the Errors inside.
type UnreadableError struct{ Errors Errors }

func (e *UnreadableError) Error() string { return e.Errors.Error() }
func (e *UnreadableError) Unwrap() error { return e.Errors }

func readFile(path string) (data []byte, msg, fix string, unreadable bool) {
	f, kind, err := mdmeta.OpenRegular(path)
	switch {
	case err != nil:
		return nil, "cannot read: " + errText(err), "check the path and its permissions", true
	case kind == "a directory":
		return nil, "is a directory, not a manifest", "name the .md files, e.g. " + filepath.Join(path, "*.md"), true
	case kind != "":
		// Never opened for reading: a FIFO would wait for a writer.
		return nil, "is " + kind + ", not a manifest file", "name a regular .md file (to check a generated manifest, write it to a file first)", true
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, "cannot read: " + errText(err), "check the path and its permissions", true
	}
	if st.Mode().IsRegular() && st.Size() > MaxSize {
		return nil, fmt.Sprintf("file is %d bytes, over the %d byte (1 MiB) limit", st.Size(), MaxSize), mdmeta.TooBigFix, false
	}
	data, err = io.ReadAll(io.LimitReader(f, MaxSize+1))
	if err != nil {
		return nil, "cannot read: " + errText(err), "check the file", true
	}
	return data, "", "", false
}

func errText(err error) string {
	var pe *fs.PathError
	if errors.As(err, &pe) {
		return pe.Err.Error()
	}
	return err.Error()
}

// Parse parses one manifest. name is the file it came from: it names the
// manifest in problems, gives the default id (its base name without .md) and
// becomes Job.Source. cat resolves `profile:`; nil means the embedded
// profiles only.
//
// The profile is merged under the manifest, field by field: engine and model
// come from the manifest when it sets them, else from the profile (but a
// manifest that switches to another engine does not inherit the profile's
// model, which belongs to the profile's engine); each budget field (wall,
// usd, tokens, turns) likewise. Capabilities are the union of both lists,
// manifest first, without duplicates — a profile's requirements (has:git,
// node:>=20) still hold when a manifest adds its own — except that a
// manifest's os:, arch: or engine: token replaces the profile's tokens of
// that kind, since a job runs on only one of each. The profile's body
// becomes Job.Persona. aq's defaults (job.DefaultBase, DefaultEngine,
// DefaultDepsMode, DefaultShip, priority normal, job.DefaultWall) fill what
// neither sets; the title defaults to the body's first H1, else the id.
//
// The error, when not nil, is Errors: every problem found, in line order.
func Parse(name string, data []byte, cat *profiles.Catalog) (*job.Job, error) {
	file := name
	if file == "" {
		file = "manifest"
	}
	doc, errs := mdmeta.Split(file, data)
	if errs != nil {
		return nil, errs.Err()
	}
	p := &parser{
		doc:  doc,
		d:    doc.Decoder(),
		at:   map[string]int{},
		name: name,
		j:    &job.Job{Source: name, Capabilities: []string{}},
	}
	p.decode()
	p.scanBody()
	p.defaultID()
	p.mergeProfile(cat)
	p.applyDefaults()
	p.check()
	if err := p.d.Err(); err != nil {
		return nil, err
	}
	return p.j, nil
}

// parser holds one manifest on its way to a job.
type parser struct {
	doc  *mdmeta.Doc
	d    *mdmeta.Decoder
	name string
	j    *job.Job
	// at is the line of every top-level key the manifest set; presence in
	// at is what "the manifest sets it" means (budget fields: budget).
	at      map[string]int
	caps    []capEntry
	budget  profiles.BudgetSet
	profile string
	h1      string // the body's first level-1 heading
}

type capEntry struct {
	req  job.Requirement
	line int // 0: from the profile
}

func (p *parser) set(key string) bool { _, ok := p.at[key]; return ok }

// decode reads every front matter key into p.j, validating values that can
// be checked on their own.
func (p *parser) decode() {
	d, j := p.d, p.j
	for _, f := range d.Fields(p.doc.Root, "", Keys) {
		// A key counts as set even when its value is bad: the value's own
		// problem is reported, not also "repo is required".
		p.at[f.Key] = f.Line
		switch f.Key {
		case "id":
			if v, ok := d.String(f, "fix-login-redirect"); ok && p.checkID(f.Line, "id", v) {
				j.ID = v
			}
		case "title":
			if v, ok := d.String(f, "Fix the login redirect loop"); ok {
				if msg := checkText(v, MaxTitle); msg != "" {
					d.Addf(f.Line, "keep the title to one line of at most 256 characters", "title %s", msg)
				}
				j.Title = v
			}
		case "repo":
			if v, ok := d.String(f, "my-service"); ok {
				name, url, msg, fix := parseRepo(v)
				if msg != "" {
					d.Addf(f.Line, fix, "%s", msg)
				}
				j.Repo, j.RepoURL = name, url
			}
		case "base":
			if v, ok := d.String(f, "main"); ok {
				if msg := CheckBranch(v); msg != "" {
					d.Addf(f.Line, "name an existing branch, e.g. base: main", "base %q is not a valid git branch name: it %s", v, msg)
				}
				j.Base = v
			}
		case "product":
			if v, ok := d.String(f, "chronomind"); ok {
				if msg := mdmeta.CheckName(v); msg != "" {
					d.Addf(f.Line, "a product id uses letters, digits, '.', '_' and '-'", "product %q %s", v, msg)
				}
				j.Product = v
			}
		case "profile":
			if v, ok := d.String(f, "backend-dev"); ok {
				p.profile = v
			}
		case "engine":
			if v, ok := d.String(f, "claude"); ok {
				if !slices.Contains(engines.Known(), v) {
					d.Addf(f.Line, oneOf(v, engines.Known()), "engine %q is not known", v)
				}
				j.Engine = v
			}
		case "model":
			if v, ok := d.String(f, "claude-sonnet-4-5"); ok {
				if msg := profiles.CheckModel(v); msg != "" {
					d.Addf(f.Line, "use the engine's model name, e.g. claude-sonnet-4-5", "model %q %s", v, msg)
				}
				j.Model = v
			}
		case "capabilities":
			items, _ := d.List(f, `[os:linux, has:git, "node:>=20"]`)
			for _, it := range items {
				r, err := job.ParseRequirement(it.Value)
				if err != nil {
					d.Addf(it.Line, "", "%v", err) // the message says what is allowed
					continue
				}
				p.caps = append(p.caps, capEntry{req: r, line: it.Line})
			}
		case "priority":
			if v, ok := d.String(f, "high"); ok {
				n, err := job.ParsePriority(v)
				if err != nil {
					d.Addf(f.Line, "use low, normal, high, critical or a whole number from 0 to 1000", "priority %q is not a priority", v)
				}
				j.Priority, j.PriorityName = n, job.PriorityName(n)
			}
		case "budget":
			j.Budget, p.budget = profiles.DecodeBudget(d, f)
		case "deps":
			items, _ := d.List(f, "[schema-migration]")
			seen := map[string]int{}
			for _, it := range items {
				if !p.checkID(it.Line, "dep", it.Value) {
					continue
				}
				if first, dup := seen[it.Value]; dup {
					d.Addf(it.Line, "list each dependency once", "dep %q is listed twice, first on line %d", it.Value, first)
					continue
				}
				seen[it.Value] = it.Line
				j.Deps = append(j.Deps, it.Value)
			}
		case "depsMode":
			if v, ok := d.String(f, "all"); ok {
				if !slices.Contains(DepsModes, v) {
					d.Addf(f.Line, "all: every dep must ship first; any: one is enough", "depsMode %q is not all or any", v)
				}
				j.DepsMode = v
			}
		case "idempotencyKey":
			if v, ok := d.String(f, "tracker-1234"); ok {
				if msg := checkText(v, MaxIdempotencyKey); msg != "" {
					d.Addf(f.Line, "use a printable key of at most 256 characters, e.g. the tracker's issue id", "idempotencyKey %s", msg)
				}
				j.IdempotencyKey = v
			}
		case "retry":
			for _, g := range d.Fields(f.Node, "retry", RetryKeys) {
				switch g.Key {
				case "max":
					if v, ok := d.Int(g, 0, MaxRetries, "2"); ok {
						j.Retry.Max = int(v)
					}
				case "backoff":
					if v, ok := d.Duration(g, false, "60s"); ok {
						j.Retry.Backoff = job.Duration(v)
					}
				}
			}
		case "verify":
			if v, ok := d.String(f, "make test"); ok {
				j.Verify = v
			}
		case "verify_rounds":
			if v, ok := profiles.DecodeVerifyRounds(d, f); ok {
				j.VerifyRounds = &v
			}
		case "script":
			if v, ok := d.String(f, "./tools/fix.sh"); ok {
				j.Script = v
			}
		case "sandbox":
			// Only factories whose engines run in a full sandbox take the
			// job: the capability the offer and the coordinator's targeting
			// already match (docs/manifest.md, docs/sandbox.md).
			if v, ok := d.String(f, "required"); ok {
				if v != SandboxRequired {
					d.Addf(f.Line, "write sandbox: required (only factories that run engines in a full sandbox take the job), or leave it out", "sandbox %q is not known", v)
					continue
				}
				r, _ := job.ParseRequirement(job.SandboxRequired)
				p.caps = append(p.caps, capEntry{req: r, line: f.Line})
			}
		case "may_change":
			// Protected paths (CI, ownership: AQ_PROTECTED_PATHS) the
			// change may touch; globs relative to the repository's root.
			// Only factories that understand the key take the job: older
			// ones refuse it as invalid_manifest (docs/contract.md).
			items, _ := d.List(f, "[.github/workflows/ci.yml]")
			for _, it := range items {
				if err := shipcheck.CheckGlob(it.Value); err != nil {
					d.Addf(it.Line, "name paths inside the repository, relative to its root, e.g. may_change: [.github/workflows/ci.yml]", "may_change: %s", err)
					continue
				}
				if !slices.Contains(j.MayChange, it.Value) {
					j.MayChange = append(j.MayChange, it.Value)
				}
			}
			if len(j.MayChange) > 0 {
				r, _ := job.ParseRequirement(job.MayChangeRequired)
				p.caps = append(p.caps, capEntry{req: r, line: f.Line})
			}
		case "ship":
			if v, ok := d.String(f, "pr"); ok {
				if !slices.Contains(job.ShipModes, v) {
					d.Addf(f.Line, oneOf(v, job.ShipModes), "ship %q is not known", v)
				}
				j.Ship = v
			}
		}
	}
}

// checkID validates a job id (the id key or a dep). Ids also name the
// branches aq/job/<id> and aq/wip/<id>, so they may not end in ".lock" or
// "." either, which git refuses in a branch name.
func (p *parser) checkID(line int, what, v string) bool {
	if msg := job.CheckID(v); msg != "" {
		p.d.Addf(line, "ids use letters, digits, '.', '_' and '-', e.g. fix-login-redirect", "%s %s %s", what, job.Show(v), msg)
		return false
	}
	return true
}

// defaultID takes the id from the file name when the manifest has none.
func (p *parser) defaultID() {
	if p.set("id") {
		return
	}
	base := filepath.Base(p.name)
	if ext := filepath.Ext(base); strings.EqualFold(ext, ".md") {
		base = base[:len(base)-len(ext)]
	}
	if msg := job.CheckID(base); msg != "" {
		p.d.Addf(p.doc.OpenLine, "add an id: key, or rename the file", "no id: is set and the file name gives the id %s, which %s", job.Show(base), msg)
		return
	}
	p.j.ID = base
}

// mergeProfile lays the manifest over its profile (see Parse).
func (p *parser) mergeProfile(cat *profiles.Catalog) {
	prof, ok := p.lookupProfile(cat)
	p.mergeCaps(prof.Capabilities)
	if !ok {
		return
	}
	j := p.j
	j.Profile = prof.Name
	j.Persona = prof.Persona
	if !p.set("engine") {
		j.Engine = prof.Engine
	}
	// A model belongs to its engine: a manifest that switches the profile's
	// engine does not inherit the profile's model.
	if !p.set("model") && (!p.set("engine") || j.Engine == prof.Engine) {
		j.Model = prof.Model
	}
	if !p.budget.Wall {
		j.Budget.Wall = prof.Budget.Wall
	}
	if !p.budget.USD {
		j.Budget.USD = prof.Budget.USD
	}
	if !p.budget.Tokens {
		j.Budget.Tokens = prof.Budget.Tokens
	}
	if !p.budget.Turns {
		j.Budget.Turns = prof.Budget.Turns
	}
	if !p.budget.Disk {
		j.Budget.Disk = prof.Budget.Disk
	}
	if !p.set("verify_rounds") && prof.VerifyRounds != nil {
		v := *prof.VerifyRounds
		j.VerifyRounds = &v
	}
}

// lookupProfile finds the manifest's profile; ok is false when it names none
// or one that does not exist (a problem).
func (p *parser) lookupProfile(cat *profiles.Catalog) (profiles.Profile, bool) {
	if p.profile == "" {
		return profiles.Profile{}, false
	}
	if cat == nil {
		var err error
		if cat, err = profiles.Embedded(); err != nil {
			p.d.Addf(p.at["profile"], "", "cannot load the built-in profiles: %v", err)
			return profiles.Profile{}, false
		}
	}
	prof, ok := cat.Get(p.profile)
	if !ok {
		fix := "known profiles: " + strings.Join(cat.Names(), ", ")
		if s := mdmeta.Suggest(p.profile, cat.Names()); s != "" {
			fix = fmt.Sprintf("did you mean %q? %s", s, fix)
		}
		p.d.Addf(p.at["profile"], fix, "profile %q does not exist", p.profile)
	}
	return prof, ok
}

// singleValued kinds: a job runs on one os, one arch, one engine.
var singleValued = map[string]bool{"os": true, "arch": true, "engine": true}

func (p *parser) mergeCaps(fromProfile []string) {
	overridden := map[string]bool{}
	for _, c := range p.caps {
		if singleValued[c.req.Kind] {
			overridden[c.req.Kind] = true
		}
	}
	all := append([]capEntry(nil), p.caps...)
	for _, tok := range fromProfile {
		r, err := job.ParseRequirement(tok)
		if err != nil || overridden[r.Kind] { // profiles are validated when loaded
			continue
		}
		all = append(all, capEntry{req: r})
	}
	seen := map[string]bool{}
	first := map[string]capEntry{} // single-valued kind -> its first token
	for _, c := range all {
		s := c.req.String()
		if seen[s] {
			continue
		}
		seen[s] = true
		if singleValued[c.req.Kind] {
			if prev, ok := first[c.req.Kind]; ok {
				line := c.line
				if line == 0 {
					line = p.at["profile"]
				}
				p.d.Addf(line, "keep one "+c.req.Kind+": token", "capabilities %s and %s can never both be satisfied", prev.req, c.req)
				continue
			}
			first[c.req.Kind] = c
		}
		p.j.Capabilities = append(p.j.Capabilities, s)
	}
}

func (p *parser) applyDefaults() {
	j := p.j
	// A disk budget (the manifest's or its profile's) is held only by a
	// factory that offers it: an older one would refuse the manifest.
	if j.Budget.Disk > 0 && !slices.Contains(j.Capabilities, job.DiskBudget) {
		j.Capabilities = append(j.Capabilities, job.DiskBudget)
	}
	if j.Base == "" {
		j.Base = job.DefaultBase
	}
	if j.Engine == "" {
		j.Engine = job.DefaultEngine
	}
	if j.DepsMode == "" {
		j.DepsMode = job.DefaultDepsMode
	}
	if j.Ship == "" {
		j.Ship = job.DefaultShip
	}
	if !p.set("priority") {
		j.Priority, j.PriorityName = job.PriorityNormal, job.PriorityName(job.PriorityNormal)
	}
	if j.Budget.Wall == 0 {
		j.Budget.Wall = job.Duration(job.DefaultWall)
	}
	if j.Retry.Backoff == 0 {
		// What job.Backoff applies to an unset backoff, shown as such (aq
		// validate --json, the sidecar, the coordinator's copy).
		j.Retry.Backoff = job.Duration(job.DefaultBackoff)
	}
	if j.Title == "" {
		// The body's heading is prose: it may hold what a title: may not
		// (an escape sequence, a tab), which must never reach a terminal.
		j.Title = clipRunes(strings.TrimSpace(job.Printable(p.h1, false)), MaxTitle)
	}
	if j.Title == "" {
		j.Title = j.ID
	}
}

// check applies the rules that involve more than one key.
func (p *parser) check() {
	j, d := p.j, p.d
	if !p.set("repo") {
		d.Addf(p.doc.OpenLine, "add repo: NAME (a git repository under AQ_REPO_BASE) or repo: a git URL", "repo is required")
	}
	switch {
	case !slices.Contains(engines.Known(), j.Engine): // already reported
	case j.Engine == "script" && !p.set("script"):
		line := p.at["engine"]
		if line == 0 {
			line = p.at["profile"]
		}
		d.Addf(line, "add script: the command to run (it gets the prompt on stdin)", "engine: script needs a script:")
	case p.set("script") && j.Engine != "script":
		d.Addf(p.at["script"], "set engine: script, or remove script:", "script: is only used with engine: script (the engine is %s)", j.Engine)
	}
	if j.Engine != "any" {
		for _, c := range p.caps {
			if c.req.Kind == "engine" && c.req.Value != j.Engine {
				d.Addf(c.line, "remove the capability or change engine:", "capability %s contradicts engine: %s", c.req, j.Engine)
			}
		}
	}
	if line, set := p.at["base"]; set && CheckBranch(j.Base) == "" {
		if msg := CheckBase(j.ID, j.Base); msg != "" {
			d.Addf(line, "name the branch the work starts from, e.g. base: main", "base %q %s", j.Base, msg)
		}
	}
	for _, dep := range j.Deps {
		if dep == j.ID && j.ID != "" {
			d.Addf(p.at["deps"], "remove it from deps", "the job %q depends on itself", dep)
		}
	}
}

// checkText returns what is wrong with a one-line text value, or "".
func checkText(s string, max int) string {
	if n := utf8.RuneCountInString(s); n > max {
		return fmt.Sprintf("is %d characters long, over the limit of %d", n, max)
	}
	for _, r := range s {
		if r == '\n' {
			return "spans more than one line"
		}
		if !unicode.IsGraphic(r) {
			return fmt.Sprintf("contains the non-printable character %U", r)
		}
	}
	return ""
}

// clipRunes cuts s to at most max runes.
func clipRunes(s string, max int) string {
	if utf8.RuneCountInString(s) <= max {
		return s
	}
	return string([]rune(s)[:max])
}

// oneOf is the fix for a value that must be one of allowed.
func oneOf(v string, allowed []string) string {
	fix := "use one of: " + strings.Join(allowed, ", ")
	if s := mdmeta.Suggest(v, allowed); s != "" {
		fix = fmt.Sprintf("did you mean %q? %s", s, fix)
	}
	return fix
}
