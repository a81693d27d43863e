// Package mdmeta reads markdown files with YAML front matter (job manifests,
// profiles) strictly: it splits the front matter from the body with
// adrg/frontmatter, decodes the front matter into a yaml.Node tree so every
// value keeps its line, and offers typed getters that record a problem — tied
// to the line in the file, with a hint how to fix it — instead of guessing.
// Unknown and duplicate keys are problems: a typo must never be silently
// ignored.
package mdmeta

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/adrg/frontmatter"
	"go.yaml.in/yaml/v3"

	"github.com/aqfleet/aq/internal/brief"
)

// MaxSize is the largest file accepted (1 MiB, docs/manifest.md). Larger files are
// refused before any parsing.
const MaxSize = 1 << 20

// TooBigFix is the hint for a file over MaxSize.
const TooBigFix = "keep the prompt short: put large inputs into the repository and refer to them"

// Error is one problem in a file. It renders as exactly one line:
// "FILE:LINE: what is wrong (how to fix)"; LINE is left out when the problem
// concerns the file as a whole.
type Error struct {
	File string
	Line int // 1-based; 0: the whole file
	Msg  string
	Fix  string
}

func (e *Error) Error() string {
	var b strings.Builder
	b.WriteString(e.File)
	if e.Line > 0 {
		b.WriteString(":")
		b.WriteString(strconv.Itoa(e.Line))
	}
	b.WriteString(": ")
	b.WriteString(e.Msg)
	if e.Fix != "" {
		b.WriteString(" (")
		b.WriteString(e.Fix)
		b.WriteString(")")
	}
	return brief.OneLine(b.String(), 0)
}

// Errors is every problem found in one or more files, in file and line order.
// Its Error text is one line per problem.
type Errors []*Error

func (es Errors) Error() string {
	lines := make([]string, len(es))
	for i, e := range es {
		lines[i] = e.Error()
	}
	return strings.Join(lines, "\n")
}

// Err returns es sorted by file and line as an error, or nil when es is
// empty (never a typed nil).
func (es Errors) Err() error {
	if len(es) == 0 {
		return nil
	}
	out := append(Errors(nil), es...)
	sort.SliceStable(out, func(i, j int) bool {
		if out[i].File != out[j].File {
			return out[i].File < out[j].File
		}
		return out[i].Line < out[j].Line
	})
	return out
}

// Doc is a markdown file split into its front matter and its body.
type Doc struct {
	File string
	// Root is the front matter's top-level mapping.
	Root *yaml.Node
	// OpenLine is the line of the opening "---" (1 unless blank lines
	// precede it); problems about missing keys point here.
	OpenLine int
	// Body is the markdown after the closing "---", with a UTF-8 BOM
	// removed and CRLF (or lone CR) line endings turned into LF.
	Body string
	// BodyLine is the line of the body's first line in the file.
	BodyLine int
	// CloseLine is the line of the closing "---".
	CloseLine int
}

var bom = []byte("\xef\xbb\xbf")

// Split checks the size and encoding of data (at most MaxSize bytes of UTF-8
// without NUL bytes; a BOM and CRLF endings are fine) and splits it into
// front matter and body. file names the document in problems. A file
// without front matter, with YAML that does not parse, or whose front matter
// is not a mapping is refused with one problem: nothing more can be said
// about it. An empty front matter is an empty mapping.
func Split(file string, data []byte) (doc *Doc, errs Errors) {
	fail := func(line int, fix, format string, args ...any) (*Doc, Errors) {
		return nil, Errors{{File: file, Line: line, Msg: fmt.Sprintf(format, args...), Fix: fix}}
	}
	if len(data) > MaxSize {
		return fail(0, TooBigFix, "file is %d bytes, over the %d byte (1 MiB) limit", len(data), MaxSize)
	}
	data = bytes.TrimPrefix(data, bom)
	if bytes.Contains(data, []byte("\r")) {
		data = bytes.ReplaceAll(data, []byte("\r\n"), []byte("\n"))
		data = bytes.ReplaceAll(data, []byte("\r"), []byte("\n"))
	}
	if !utf8.Valid(data) {
		return fail(lineOf(data, firstInvalidUTF8(data)), "save the file as UTF-8", "file is not valid UTF-8")
	}
	if i := bytes.IndexByte(data, 0); i >= 0 {
		return fail(lineOf(data, i), "is this a binary file? a manifest is markdown text", "file contains a NUL byte")
	}

	// The opening "---" is the first non-blank line (as adrg/frontmatter
	// detects it); YAML line n is file line openLine+n.
	openLine := 1
	rest := data
	for {
		line, after, found := bytes.Cut(rest, []byte("\n"))
		if len(bytes.TrimSpace(line)) > 0 || !found {
			break
		}
		openLine++
		rest = after
	}
	first, _, _ := bytes.Cut(rest, []byte("\n"))
	if string(bytes.TrimSpace(first)) != "---" {
		return fail(openLine, "start the file with a line '---', the YAML keys, then a closing '---' line", "no YAML front matter")
	}

	var yamlText []byte
	format := frontmatter.NewFormat("---", "---", func(b []byte, _ any) error {
		yamlText = append([]byte(nil), b...)
		return nil
	})
	body, err := frontmatter.MustParse(bytes.NewReader(data), nil, format)
	if errors.Is(err, frontmatter.ErrNotFound) {
		return fail(openLine, "end the front matter with a line '---' before the markdown body", "the front matter opened here is never closed")
	}
	if err != nil { // only read errors, which a bytes.Reader does not have
		return fail(0, "", "cannot split front matter: %v", err)
	}
	doc = &Doc{File: file, OpenLine: openLine}
	doc.CloseLine = openLine + bytes.Count(yamlText, []byte("\n")) + 1
	doc.BodyLine = doc.CloseLine + 1
	doc.Body = string(body)

	root, perr := decodeYAML(yamlText)
	if perr != nil {
		// The parser may notice a problem only at the end of the text
		// (an unclosed bracket): point at the last YAML line then.
		last := max(bytes.Count(yamlText, []byte("\n")), 1)
		line := openLine + min(max(perr.line, 1), last)
		return fail(line, "fix the YAML syntax", "front matter is not valid YAML: %s", perr.msg)
	}
	if root == nil { // "---\n---": no keys; what is required is the caller's call
		root = &yaml.Node{Kind: yaml.MappingNode, Tag: "!!map", Line: 1}
	}
	if root.Kind != yaml.MappingNode {
		return fail(openLine+root.Line, "write one 'key: value' per line", "front matter must be a mapping of keys to values, not a %s", kindName(root))
	}
	doc.Root = root
	return doc, nil
}

type yamlProblem struct {
	line int
	msg  string
}

// yamlLine reads the line yaml.v3 puts into syntax errors. yaml.v3 has no
// typed syntax error, so its text ("yaml: line N: problem") is the only
// source of the line.
var yamlLine = regexp.MustCompile(`^yaml: (?:line (\d+): )?(.*)$`)

// decodeYAML parses one YAML document into its root node (nil when empty).
// A second document (after "..." or similar) is refused: whatever it said
// would otherwise be silently ignored.
func decodeYAML(text []byte) (root *yaml.Node, problem *yamlProblem) {
	defer func() {
		// yaml.v3 recovers its own failures; anything else is a parser bug
		// that must not take aq down with an untrusted manifest.
		if r := recover(); r != nil {
			root, problem = nil, &yamlProblem{msg: fmt.Sprintf("the YAML parser failed: %v", r)}
		}
	}()
	dec := yaml.NewDecoder(bytes.NewReader(text))
	var doc yaml.Node
	if err := dec.Decode(&doc); err != nil {
		if errors.Is(err, io.EOF) {
			return nil, nil
		}
		return nil, yamlError(err)
	}
	var extra yaml.Node
	if err := dec.Decode(&extra); !errors.Is(err, io.EOF) {
		if err != nil {
			return nil, yamlError(err)
		}
		return nil, &yamlProblem{line: extra.Line, msg: "it holds more than one YAML document"}
	}
	if doc.Kind == yaml.DocumentNode {
		if len(doc.Content) == 0 {
			return nil, nil
		}
		return doc.Content[0], nil
	}
	return &doc, nil
}

// parserErrors are the yaml.v3 messages that come from its parser rather
// than its scanner: the parser reports 0-based lines, the scanner 1-based.
var parserErrors = []string{"did not find expected", "found duplicate %", "found incompatible YAML document", "found undefined tag handle"}

func yamlError(err error) *yamlProblem {
	msg, _, _ := strings.Cut(err.Error(), "\n")
	m := yamlLine.FindStringSubmatch(msg)
	if m == nil {
		return &yamlProblem{msg: msg}
	}
	p := &yamlProblem{msg: m[2]}
	if m[1] != "" {
		p.line, _ = strconv.Atoi(m[1])
		for _, prefix := range parserErrors {
			if strings.HasPrefix(p.msg, prefix) {
				p.line++
				break
			}
		}
	}
	return p
}

func firstInvalidUTF8(b []byte) int {
	for i := 0; i < len(b); {
		r, size := utf8.DecodeRune(b[i:])
		if r == utf8.RuneError && size <= 1 {
			return i
		}
		i += size
	}
	return len(b)
}

// lineOf is the 1-based line of byte offset i in b.
func lineOf(b []byte, i int) int {
	if i > len(b) {
		i = len(b)
	}
	return bytes.Count(b[:i], []byte("\n")) + 1
}

// LineOf is the 1-based line of byte offset i within s.
func LineOf(s string, i int) int {
	if i > len(s) {
		i = len(s)
	}
	return strings.Count(s[:i], "\n") + 1
}

func kindName(n *yaml.Node) string {
	switch n.Kind {
	case yaml.SequenceNode:
		return "list"
	case yaml.MappingNode:
		return "mapping"
	case yaml.ScalarNode:
		if n.Tag == "!!null" {
			return "null"
		}
		return "single value"
	case yaml.AliasNode:
		return "alias"
	}
	return "document"
}
