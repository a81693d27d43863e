package fleet

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
)

// routeConsts are the Route* string constants of this package (its route
// book as the code declares it) and any route written as a literal, parsed
// from the non-test files.
func routeConsts(t *testing.T) map[string]string {
	t.Helper()
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	route := regexp.MustCompile(`^(GET|POST|PUT|PATCH|DELETE) /fleet/`)
	literal := regexp.MustCompile(`^(GET|POST|PUT|PATCH|DELETE) /fleet/\S+$`)
	out := map[string]string{}
	fset := token.NewFileSet()
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		af, err := parser.ParseFile(fset, f, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		// Any route written out as a literal (a call named without its
		// constant) counts too.
		ast.Inspect(af, func(n ast.Node) bool {
			if lit, ok := n.(*ast.BasicLit); ok && lit.Kind == token.STRING {
				if v, err := strconv.Unquote(lit.Value); err == nil && literal.MatchString(v) {
					out["literal "+v] = v
				}
			}
			return true
		})
		for _, d := range af.Decls {
			gd, ok := d.(*ast.GenDecl)
			if !ok || gd.Tok != token.CONST {
				continue
			}
			for _, sp := range gd.Specs {
				vs := sp.(*ast.ValueSpec)
				for i, n := range vs.Names {
					if !strings.HasPrefix(n.Name, "Route") || i >= len(vs.Values) {
						continue
					}
					lit, ok := vs.Values[i].(*ast.BasicLit)
					if !ok || lit.Kind != token.STRING {
						continue
					}
					v, _ := strconv.Unquote(lit.Value)
					if route.MatchString(v) {
						out[n.Name] = v
					}
				}
			}
		}
	}
	return out
}

// contractRow is a table row of docs/contract.md whose first cell is a
// route: `METHOD /fleet/...`, optionally marked (proposed).
type contractRow struct {
	route, section, line string
	proposed             bool
}

var rowRoute = regexp.MustCompile("^\\|\\s*`((?:GET|POST|PUT|PATCH|DELETE) /fleet/[^`]*)`(\\s*\\(proposed\\))?\\s*\\|")

func contractRows(t *testing.T) []contractRow {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", "..", "docs", "contract.md"))
	if err != nil {
		t.Fatal(err)
	}
	var rows []contractRow
	section := ""
	for _, l := range strings.Split(string(b), "\n") {
		if s, ok := strings.CutPrefix(l, "## "); ok {
			section = s
			continue
		}
		if m := rowRoute.FindStringSubmatch(l); m != nil {
			rows = append(rows, contractRow{route: m[1], section: section, line: l, proposed: m[2] != ""})
		}
	}
	return rows
}

// fallbackSection is the contract's section with the table of what aq does
// without each route.
const fallbackSection = "Without a route: fallbacks"

// docs/contract.md describes the route book and nothing else: every route
// aq calls has a row in a section's table and one in the fallback table;
// every route a table names is one aq calls (a proposed route is marked,
// and must lose the mark once aq calls it); the fallback table says what
// Fallbacks says, and "aq cannot work without it" for the rest.
func TestContractDescribesTheRouteBook(t *testing.T) {
	t.Parallel()
	consts := routeConsts(t)
	var fromConsts []string
	for _, v := range consts {
		fromConsts = append(fromConsts, v)
	}
	book := slices.Clone(RouteBook)
	sort.Strings(fromConsts)
	sort.Strings(book)
	if !slices.Equal(slices.Compact(fromConsts), book) {
		t.Errorf("RouteBook %v\nis not the Route constants %v: add the route to RouteBook", book, slices.Compact(fromConsts))
	}
	for r := range Fallbacks {
		if !slices.Contains(RouteBook, r) {
			t.Errorf("Fallbacks has %q, which is not in RouteBook", r)
		}
	}
	rows := contractRows(t)
	if len(rows) == 0 {
		t.Fatal("docs/contract.md has no route rows")
	}
	described, fallback := map[string]bool{}, map[string]contractRow{}
	for _, r := range rows {
		inBook := slices.Contains(RouteBook, r.route)
		switch {
		case r.proposed && inBook:
			t.Errorf("docs/contract.md, %q: %s is marked (proposed), but aq calls it now: drop the mark and describe it", r.section, r.route)
		case r.proposed:
		case !inBook:
			t.Errorf("docs/contract.md, %q: %s is not a route aq calls (not in RouteBook); describe it in prose, or mark it (proposed)", r.section, r.route)
		case r.section == fallbackSection:
			fallback[r.route] = r
		default:
			described[r.route] = true
		}
	}
	for _, r := range RouteBook {
		if !described[r] {
			t.Errorf("docs/contract.md describes no %s in a section's table", r)
		}
		row, ok := fallback[r]
		switch fb, optional := Fallbacks[r]; {
		case !ok:
			t.Errorf("docs/contract.md, %q: no row for %s", fallbackSection, r)
		case optional && !strings.Contains(row.line, fb):
			t.Errorf("docs/contract.md, %q: the row for %s does not say what Fallbacks says: %q", fallbackSection, r, fb)
		case !optional && !strings.Contains(row.line, "aq cannot work without it"):
			t.Errorf("docs/contract.md, %q: the row for %s must say \"aq cannot work without it\" (no fallback)", fallbackSection, r)
		}
	}
}
