package fleetcheck

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/aqfleet/aq/agent/fleet"
)

// contractSections reads docs/contract.md into its sections, by title.
func contractSections(t *testing.T) (titles []string, body map[string]string) {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", "..", "docs", "contract.md"))
	if err != nil {
		t.Fatal(err)
	}
	body = map[string]string{}
	cur := ""
	for _, l := range strings.Split(string(b), "\n") {
		if s, ok := strings.CutPrefix(l, "## "); ok {
			cur = s
			titles = append(titles, s)
			continue
		}
		body[cur] += l + "\n"
	}
	return titles, body
}

// The check's rows follow docs/contract.md: its sections are the page's
// (the titles other pages cite), every route aq calls is a row, and every
// rule the check prints is named, in its words, in its section.
func TestRowsFollowTheContract(t *testing.T) {
	titles, body := contractSections(t)
	if !slices.Equal(titles, Sections) {
		t.Errorf("docs/contract.md's sections are\n%q\nthe check's\n%q", titles, Sections)
	}
	var routes []string
	for _, s := range catalogue {
		if !slices.Contains(Sections, s.Section) {
			t.Errorf("row %s: section %q is not one of the contract's", s.ID, s.Section)
		}
		if s.Route {
			routes = append(routes, s.ID)
			if !slices.Contains(fleet.RouteBook, s.ID) {
				t.Errorf("row %s is not a route aq calls", s.ID)
			}
			continue
		}
		// A rule: named in italics in its section ("Checked by aq fleet
		// check: *…*").
		if !strings.Contains(strings.Join(strings.Fields(body[s.Section]), " "), "*"+s.Check+"*") {
			t.Errorf("docs/contract.md, %q, does not name the check's rule *%s*", s.Section, s.Check)
		}
		if s.IfMissing == "" && s.IfWrong == "" && s.ID != RuleLogRoutes && s.ID != RuleBroker {
			t.Errorf("rule %s says nothing of what aq does when it fails", s.ID)
		}
	}
	for _, r := range fleet.RouteBook {
		if !slices.Contains(routes, r) {
			t.Errorf("the check has no row for %s", r)
		}
	}
}
