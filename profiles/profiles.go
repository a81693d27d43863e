// Package profiles owns the persona catalog (docs/manifest.md, "Profiles"): markdown files whose
// front matter gives a job's defaults — engine, model, capabilities, budget —
// and whose body is the persona prompt, the engine's standing instructions.
// Every *.md file in this directory is a profile, embedded in the binary;
// $AQ_HOME/profiles/*.md replaces an embedded profile of the same name or adds
// a new one. A manifest names one with `profile:` and the manifest package
// merges it under the manifest.
package profiles

import (
	"embed"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"

	"github.com/aqfleet/aq/engines"
	"github.com/aqfleet/aq/internal/mdmeta"
	"github.com/aqfleet/aq/job"
)

// Profile is one persona with its job defaults. Zero values mean "not set":
// the manifest or aq's defaults decide.
type Profile struct {
	Name         string     `json:"name"`
	Engine       string     `json:"engine,omitempty"`
	Model        string     `json:"model,omitempty"`
	Capabilities []string   `json:"capabilities"` // canonical tokens
	Budget       job.Budget `json:"budget"`
	// VerifyRounds is the repair rounds the profile's jobs get after a
	// failed verify (verify_rounds:); nil: not set.
	VerifyRounds *int `json:"verifyRounds,omitempty"`
	// Persona is the body: the prompt prepended to every job's task.
	Persona string `json:"persona,omitempty"`
	// Source is "embedded" or the override file the profile was read from.
	Source string `json:"source"`
}

// SourceEmbedded is the Source of a profile built into aq.
const SourceEmbedded = "embedded"

// Keys are the front matter keys of a profile; any other key is an error.
var Keys = []string{"name", "engine", "model", "capabilities", "budget", "verify_rounds"}

// MinDiskBudget is the smallest budget.disk: a job's worktree and tools
// need room (0 is not "unlimited" here: leave the key out).
const MinDiskBudget = 64 << 20

// BudgetKeys are the keys of budget:.
var BudgetKeys = []string{"wall", "usd", "tokens", "turns", "disk"}

//go:embed *.md
var embedded embed.FS

// Catalog is a set of profiles by name.
type Catalog struct {
	byName map[string]Profile
}

// Get returns the profile called name.
func (c *Catalog) Get(name string) (Profile, bool) {
	if c == nil {
		return Profile{}, false
	}
	p, ok := c.byName[name]
	return p.clone(), ok
}

// clone copies p so that a caller cannot change the catalog through the
// capabilities slice.
func (p Profile) clone() Profile {
	p.Capabilities = append([]string{}, p.Capabilities...)
	if p.VerifyRounds != nil {
		v := *p.VerifyRounds
		p.VerifyRounds = &v
	}
	return p
}

// List returns every profile, sorted by name.
func (c *Catalog) List() []Profile {
	if c == nil {
		return nil
	}
	out := make([]Profile, 0, len(c.byName))
	for _, p := range c.byName {
		out = append(out, p.clone())
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// Names returns the profile names, sorted.
func (c *Catalog) Names() []string {
	var out []string
	for _, p := range c.List() {
		out = append(out, p.Name)
	}
	return out
}

var embeddedOnce = sync.OnceValues(func() (*Catalog, error) {
	c := &Catalog{byName: map[string]Profile{}}
	entries, err := fs.ReadDir(embedded, ".")
	if err != nil {
		return nil, err
	}
	var errs mdmeta.Errors
	for _, e := range entries {
		data, err := embedded.ReadFile(e.Name())
		if err != nil {
			return nil, err
		}
		p, err := Parse(path.Join("profiles", e.Name()), data)
		if err != nil {
			errs = append(errs, asErrors(err)...)
			continue
		}
		p.Source = SourceEmbedded
		c.byName[p.Name] = p
	}
	if err := errs.Err(); err != nil {
		return nil, err
	}
	return c, nil
})

// Embedded returns the profiles built into aq. It only fails if a built-in
// profile is broken, which the package's tests prevent.
func Embedded() (*Catalog, error) { return embeddedOnce() }

// Load returns the embedded profiles with those in overrideDir laid over
// them: a file there replaces the embedded profile of the same name, or adds
// a new one. A missing overrideDir (or "") is fine; an override that does not
// parse is an error (mdmeta.Errors, one FILE:LINE line per problem) — a broken
// override must not silently fall back to the built-in persona.
func Load(overrideDir string) (*Catalog, error) {
	base, err := Embedded()
	if err != nil {
		return nil, err
	}
	c := &Catalog{byName: make(map[string]Profile, len(base.byName))}
	for k, v := range base.byName {
		c.byName[k] = v
	}
	if overrideDir == "" {
		return c, nil
	}
	entries, err := os.ReadDir(overrideDir)
	if errors.Is(err, fs.ErrNotExist) {
		return c, nil
	}
	if err != nil {
		return nil, mdmeta.Errors{{File: overrideDir, Msg: "cannot read the profile directory: " + errText(err), Fix: "check that it is a readable directory"}}
	}
	var errs mdmeta.Errors
	for _, e := range entries {
		name := e.Name()
		if !strings.HasSuffix(name, ".md") || strings.HasPrefix(name, ".") {
			continue
		}
		file := filepath.Join(overrideDir, name)
		data, err := readFile(file)
		if err != nil {
			errs = append(errs, &mdmeta.Error{File: file, Msg: err.Error(), Fix: "check the file, or remove it from " + overrideDir})
			continue
		}
		p, err := Parse(file, data)
		if err != nil {
			errs = append(errs, asErrors(err)...)
			continue
		}
		p.Source = file
		c.byName[p.Name] = p
	}
	if err := errs.Err(); err != nil {
		return nil, err
	}
	return c, nil
}

// readFile reads at most mdmeta.MaxSize+1 bytes of a regular file.
func readFile(file string) ([]byte, error) {
	f, kind, err := mdmeta.OpenRegular(file)
	if err != nil {
		return nil, fmt.Errorf("cannot read: %s", errText(err))
	}
	if kind != "" {
		return nil, fmt.Errorf("is %s, not a profile file", kind)
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, mdmeta.MaxSize+1))
	if err != nil {
		return nil, fmt.Errorf("cannot read: %s", errText(err))
	}
	return data, nil
}

// errText is an OS error without the path, which the message already names.
func errText(err error) string {
	var pe *fs.PathError
	if errors.As(err, &pe) {
		return pe.Err.Error()
	}
	return err.Error()
}

func asErrors(err error) mdmeta.Errors {
	var es mdmeta.Errors
	if errors.As(err, &es) {
		return es
	}
	return mdmeta.Errors{{Msg: err.Error()}}
}

// Parse reads one profile file. file names it in problems and gives the
// default name (its base name without .md); a name: key must match it, so
// that `profile: NAME` always finds profiles/NAME.md. The error, if any, is
// mdmeta.Errors with every problem found.
func Parse(file string, data []byte) (Profile, error) {
	doc, errs := mdmeta.Split(file, data)
	if errs != nil {
		return Profile{}, errs.Err()
	}
	d := doc.Decoder()
	stem := strings.TrimSuffix(filepath.Base(file), ".md")
	p := Profile{Name: stem, Capabilities: []string{}}
	nameLine := doc.OpenLine
	for _, f := range d.Fields(doc.Root, "", Keys) {
		switch f.Key {
		case "name":
			if v, ok := d.String(f, "backend-dev"); ok {
				p.Name, nameLine = v, f.Line
				if v != stem {
					d.Addf(f.Line, "rename the file to "+v+".md or change name:", "name %q does not match the file name %q", v, stem+".md")
				}
			}
		case "engine":
			if v, ok := d.String(f, "claude"); ok {
				if !slices.Contains(engines.Known(), v) {
					d.Addf(f.Line, "use one of: "+strings.Join(engines.Known(), ", "), "engine %q is not known", v)
				}
				p.Engine = v
			}
		case "model":
			if v, ok := d.String(f, "claude-sonnet-4-5"); ok {
				if msg := CheckModel(v); msg != "" {
					d.Addf(f.Line, "use the engine's model name, e.g. claude-sonnet-4-5", "model %q %s", v, msg)
				}
				p.Model = v
			}
		case "capabilities":
			items, _ := d.List(f, "[has:git, \"node:>=20\"]")
			seen := map[string]bool{}
			for _, it := range items {
				r, err := job.ParseRequirement(it.Value)
				switch {
				case err != nil:
					d.Addf(it.Line, "", "%v", err) // the message says what is allowed
				case r.Kind == "engine":
					d.Addf(it.Line, "set engine: instead", "a profile cannot require %s as a capability", r)
				case !seen[r.String()]:
					seen[r.String()] = true
					p.Capabilities = append(p.Capabilities, r.String())
				}
			}
		case "budget":
			p.Budget, _ = DecodeBudget(d, f)
		case "verify_rounds":
			if v, ok := DecodeVerifyRounds(d, f); ok {
				p.VerifyRounds = &v
			}
		}
	}
	if msg := mdmeta.CheckName(p.Name); msg != "" {
		d.Addf(nameLine, "profile names follow the id rules: letters, digits, '.', '_', '-'", "profile name %q %s", p.Name, msg)
	}
	p.Persona = strings.TrimSpace(doc.Body)
	if p.Persona == "" {
		d.Addf(doc.CloseLine, "write the persona prompt below the closing ---", "the persona (the markdown body) is empty")
	}
	if err := d.Err(); err != nil {
		return Profile{}, err
	}
	return p, nil
}

// BudgetSet says which budget fields a front matter set explicitly.
type BudgetSet struct{ Wall, USD, Tokens, Turns, Disk bool }

// DecodeBudget reads a budget: mapping (wall, usd, tokens, turns). wall is a
// duration above zero (a job must never be able to run forever), usd a
// number ≥ 0, tokens and turns whole numbers ≥ 0; zero means unlimited.
func DecodeBudget(d *mdmeta.Decoder, f mdmeta.Field) (job.Budget, BudgetSet) {
	var b job.Budget
	var set BudgetSet
	for _, g := range d.Fields(f.Node, f.Path, BudgetKeys) {
		switch g.Key {
		case "wall":
			if v, ok := d.Duration(g, true, "45m"); ok {
				b.Wall, set.Wall = job.Duration(v), true
			}
		case "usd":
			if v, ok := d.Number(g, 0, "5"); ok {
				b.USD, set.USD = v, true
			}
		case "tokens":
			if v, ok := d.Int(g, 0, 1<<53, "2000000"); ok {
				b.Tokens, set.Tokens = v, true
			}
		case "turns":
			if v, ok := d.Int(g, 0, 1_000_000, "100"); ok {
				b.Turns, set.Turns = int(v), true
			}
		case "disk":
			if v, ok := d.String(g, "10GiB"); ok {
				n, err := job.ParseSize(v)
				switch {
				case err != nil:
					d.Addf(g.Line, "write a size, e.g. disk: 10GiB (bytes or KiB, MiB, GiB, TiB), or remove the key", "%s %q is not a size", g.Path, v)
				case n < MinDiskBudget:
					d.Addf(g.Line, "give at least 64MiB, e.g. disk: 10GiB, or remove the key (the factory's AQ_JOB_DISK_MAX applies)", "%s %q is too small for a job's worktree and tools", g.Path, v)
				default:
					b.Disk, set.Disk = n, true
				}
			}
		}
	}
	return b, set
}

// DecodeVerifyRounds reads verify_rounds: the repair rounds a job gets
// after a failed verify (docs/manifest.md), a whole number from 0 (off)
// to job.MaxVerifyRounds.
func DecodeVerifyRounds(d *mdmeta.Decoder, f mdmeta.Field) (int, bool) {
	v, ok := d.Int(f, 0, job.MaxVerifyRounds, "2")
	return int(v), ok
}

// CheckModel returns what is wrong with an engine model name, or "". Model
// names go onto the engine's command line, so they must not look like flags
// or hold spaces or control characters.
func CheckModel(s string) string {
	if len(s) > 128 {
		return "is longer than 128 characters"
	}
	if strings.HasPrefix(s, "-") {
		return `must not start with "-"`
	}
	for _, r := range s {
		ok := r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || strings.ContainsRune("._:/@+-[]", r)
		if !ok {
			return fmt.Sprintf("contains %q (allowed: letters, digits and . _ : / @ + - [ ])", r)
		}
	}
	return ""
}
