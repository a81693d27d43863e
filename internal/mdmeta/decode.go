package mdmeta

import (
	"fmt"
	"math"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"
)

// MaxProblems is how many problems are reported for one file; a file with
// thousands of bad entries gets a last line saying how many were left out.
const MaxProblems = 50

// Decoder reads typed values out of a Doc's front matter and collects every
// problem, each with its line in the file.
type Decoder struct {
	File string
	errs Errors
	more int // problems beyond MaxProblems
	// offset turns a YAML line into a file line.
	offset int
}

// Decoder returns a decoder for d's front matter.
func (d *Doc) Decoder() *Decoder { return &Decoder{File: d.File, offset: d.OpenLine} }

// Addf records a problem at line (a file line; 0 for the whole file).
func (d *Decoder) Addf(line int, fix, format string, args ...any) {
	if len(d.errs) >= MaxProblems {
		d.more++
		return
	}
	d.errs = append(d.errs, &Error{File: d.File, Line: line, Msg: fmt.Sprintf(format, args...), Fix: fix})
}

// Err returns the problems recorded so far as Errors in line order, or nil.
func (d *Decoder) Err() error {
	err := d.errs.Err()
	if err == nil || d.more == 0 {
		return err
	}
	return append(err.(Errors), &Error{File: d.File, Msg: fmt.Sprintf("%d more problems not shown", d.more), Fix: "fix the ones above first"})
}

// Line is the file line of a front matter node.
func (d *Decoder) Line(n *yaml.Node) int { return n.Line + d.offset }

// Field is one key of a mapping and its value.
type Field struct {
	Key  string     // as written
	Path string     // dotted from the top: "budget.wall"
	Line int        // the key's line in the file
	Node *yaml.Node // the value (aliases resolved)
}

// Fields returns the keys of mapping n in order. Keys not in known, duplicate
// keys and merge keys ("<<") are recorded as problems and left out; the
// closest known key is suggested for a misspelt one. path names the mapping
// in messages ("" for the top level).
func (d *Decoder) Fields(n *yaml.Node, path string, known []string) []Field {
	n = deref(n)
	if n.Kind != yaml.MappingNode {
		d.Addf(d.Line(n), "write it as a mapping, e.g. "+path+": { "+known[0]+": ... }", "%s must be a mapping of keys to values, not a %s", path, kindName(n))
		return nil
	}
	seen := map[string]int{}
	var out []Field
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := deref(n.Content[i]), deref(n.Content[i+1])
		line := d.Line(n.Content[i])
		full := k.Value
		if path != "" {
			full = path + "." + k.Value
		}
		if k.Kind != yaml.ScalarNode {
			d.Addf(line, "keys are plain words", "a %s cannot be a key", kindName(k))
			continue
		}
		if k.Value == "<<" && k.Tag == "!!merge" {
			d.Addf(line, "write the keys out", "YAML merge keys (<<) are not supported")
			continue
		}
		if first, dup := seen[k.Value]; dup {
			d.Addf(line, "keep one of them", "duplicate key %q, already set on line %d", full, first)
			continue
		}
		seen[k.Value] = line
		if !slices.Contains(known, k.Value) {
			fix := "known keys: " + strings.Join(known, ", ")
			if s := Suggest(k.Value, known); s != "" {
				fix = fmt.Sprintf("did you mean %q?", s)
			}
			d.Addf(line, fix, "unknown key %q", full)
			continue
		}
		out = append(out, Field{Key: k.Value, Path: full, Line: line, Node: v})
	}
	return out
}

// deref follows YAML aliases to the node they name.
func deref(n *yaml.Node) *yaml.Node {
	for i := 0; n.Kind == yaml.AliasNode && n.Alias != nil && i < 16; i++ {
		n = n.Alias
	}
	return n
}

func isNull(n *yaml.Node) bool { return n.Kind == yaml.ScalarNode && n.Tag == "!!null" }

// scalar checks that f holds one non-null value.
func (d *Decoder) scalar(f Field, example string) bool {
	n := f.Node
	switch {
	case isNull(n):
		d.Addf(f.Line, "give a value, e.g. "+f.Key+": "+example+", or remove the key", "%s has no value", f.Path)
		return false
	case n.Kind != yaml.ScalarNode:
		d.Addf(f.Line, "write a single value, e.g. "+f.Key+": "+example, "%s must be a single value, not a %s", f.Path, kindName(n))
		return false
	}
	return true
}

// String reads a single value as text (numbers are taken as written).
// Leading and trailing space is removed; an empty string is a problem.
func (d *Decoder) String(f Field, example string) (string, bool) {
	if !d.scalar(f, example) {
		return "", false
	}
	s := strings.TrimSpace(f.Node.Value)
	if s == "" {
		d.Addf(f.Line, "give a value, e.g. "+f.Key+": "+example+", or remove the key", "%s is empty", f.Path)
		return "", false
	}
	return s, true
}

// Int reads a whole number in [lo, hi].
func (d *Decoder) Int(f Field, lo, hi int64, example string) (int64, bool) {
	if !d.scalar(f, example) {
		return 0, false
	}
	n := f.Node
	var v int64
	switch n.Tag {
	case "!!int":
		if err := n.Decode(&v); err != nil {
			d.Addf(f.Line, fmt.Sprintf("use a whole number from %d to %d", lo, hi), "%s: %q is out of range", f.Path, n.Value)
			return 0, false
		}
	case "!!float":
		x, err := strconv.ParseFloat(strings.ReplaceAll(n.Value, "_", ""), 64)
		if err != nil || x != math.Trunc(x) || x < float64(math.MinInt64) || x > float64(math.MaxInt64) {
			d.Addf(f.Line, "write a whole number, e.g. "+f.Key+": "+example, "%s must be a whole number, not %q", f.Path, n.Value)
			return 0, false
		}
		v = int64(x)
	default:
		d.Addf(f.Line, "write a whole number, e.g. "+f.Key+": "+example, "%s must be a whole number, not %q", f.Path, n.Value)
		return 0, false
	}
	if v < lo || v > hi {
		d.Addf(f.Line, fmt.Sprintf("use a whole number from %d to %d", lo, hi), "%s %d is out of range", f.Path, v)
		return 0, false
	}
	return v, true
}

// Number reads a finite number ≥ lo.
func (d *Decoder) Number(f Field, lo float64, example string) (float64, bool) {
	if !d.scalar(f, example) {
		return 0, false
	}
	n := f.Node
	if n.Tag != "!!int" && n.Tag != "!!float" {
		d.Addf(f.Line, "write a number without quotes or units, e.g. "+f.Key+": "+example, "%s must be a number, not %q", f.Path, n.Value)
		return 0, false
	}
	var v float64
	if err := n.Decode(&v); err != nil || math.IsNaN(v) || math.IsInf(v, 0) {
		d.Addf(f.Line, "write a number, e.g. "+f.Key+": "+example, "%s must be a finite number, not %q", f.Path, n.Value)
		return 0, false
	}
	if v < lo {
		d.Addf(f.Line, fmt.Sprintf("use a number ≥ %g", lo), "%s %g is out of range", f.Path, v)
		return 0, false
	}
	return v, true
}

var bareNumber = regexp.MustCompile(`^[0-9]+(\.[0-9]+)?$`)
var dayDuration = regexp.MustCompile(`^([0-9]+)d$`)

// Duration reads a Go duration ("45m", "2h30m", "90s"). A bare number is a
// problem (minutes? seconds?), except 0. positive: 0 is refused too.
func (d *Decoder) Duration(f Field, positive bool, example string) (time.Duration, bool) {
	if !d.scalar(f, example) {
		return 0, false
	}
	s := strings.TrimSpace(f.Node.Value)
	fix := "write a duration with a unit, e.g. " + f.Key + ": " + example + "; units: s, m, h"
	if m := dayDuration.FindStringSubmatch(s); m != nil {
		if n, err := strconv.Atoi(m[1]); err == nil && n <= 10000 {
			fix = fmt.Sprintf("durations have no days unit: write %s: %dh", f.Key, n*24)
		}
	}
	if s != "0" && bareNumber.MatchString(s) {
		d.Addf(f.Line, fix, "%s %q has no unit", f.Path, s)
		return 0, false
	}
	v, err := time.ParseDuration(s)
	if err != nil {
		d.Addf(f.Line, fix, "%s %q is not a duration", f.Path, s)
		return 0, false
	}
	if v < 0 || (positive && v == 0) {
		if positive {
			fix = "use a duration above zero, e.g. " + example
		} else {
			fix = "use a duration of zero or more"
		}
		d.Addf(f.Line, fix, "%s %q is out of range", f.Path, s)
		return 0, false
	}
	return v, true
}

// Item is one entry of a list, with its line.
type Item struct {
	Value string
	Line  int
}

// List reads a list of single values. A single value is taken as a list of
// one (deps: schema-migration); its entries are still validated by the
// caller, so "a, b" written as one value is refused there, not split here.
// Empty entries are problems.
func (d *Decoder) List(f Field, example string) ([]Item, bool) {
	n := f.Node
	switch {
	case isNull(n):
		d.Addf(f.Line, "give a list, e.g. "+f.Key+": "+example+", or remove the key", "%s has no value", f.Path)
		return nil, false
	case n.Kind == yaml.ScalarNode:
		s := strings.TrimSpace(n.Value)
		if s == "" {
			d.Addf(f.Line, "give a list, e.g. "+f.Key+": "+example+", or remove the key", "%s is empty", f.Path)
			return nil, false
		}
		return []Item{{Value: s, Line: d.Line(n)}}, true
	case n.Kind != yaml.SequenceNode:
		d.Addf(f.Line, "write a list, e.g. "+f.Key+": "+example, "%s must be a list, not a %s", f.Path, kindName(n))
		return nil, false
	}
	out := make([]Item, 0, len(n.Content))
	ok := true
	for i, c := range n.Content {
		c = deref(c)
		line := d.Line(c)
		switch {
		case c.Kind != yaml.ScalarNode || isNull(c):
			d.Addf(line, "each entry is a single value, e.g. "+f.Key+": "+example, "%s[%d] must be a single value, not a %s", f.Path, i, kindName(c))
			ok = false
		case strings.TrimSpace(c.Value) == "":
			d.Addf(line, "remove the empty entry", "%s[%d] is empty", f.Path, i)
			ok = false
		default:
			out = append(out, Item{Value: strings.TrimSpace(c.Value), Line: line})
		}
	}
	return out, ok
}
