package engines

import (
	"encoding/json"
	"fmt"
	"math"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/aqfleet/aq/internal/brief"
)

// Rate limits, usage limits and exhausted credit: the engine's account, not
// the task, stopped the run, and running it again before the limit resets
// only fails again. Such a run's Outcome is Limited and its Result.Limit
// says which limit and, when the engine said, when it resets; the runner
// parks the job until then instead of failing it.

// Limit kinds.
const (
	LimitRate    = "rate limit"     // requests or tokens per minute, a 429
	LimitUsage   = "usage limit"    // a subscription's session/weekly window
	LimitCredits = "out of credits" // prepaid credit or a spend cap exhausted
)

// Limit is the limit a Limited run hit.
type Limit struct {
	// Kind is LimitRate, LimitUsage or LimitCredits.
	Kind string `json:"kind"`
	// ResetAt is when the engine says the limit resets; zero when it said
	// nothing usable (the caller's default wait applies; Note says why).
	ResetAt time.Time `json:"resetAt,omitzero"`
	// Source says where ResetAt came from: "rate_limit_event" (claude's
	// stream), "text" (the engine's error message).
	Source string `json:"source,omitempty"`
	// Note says what was wrong with a reset time the engine gave, if any.
	Note string `json:"note,omitempty"`
}

// limitKind maps an unavailableReason kind to a limit kind ("" for the
// kinds that are not limits: auth, overload).
func limitKind(kind string) string {
	switch kind {
	case LimitRate, LimitUsage, LimitCredits:
		return kind
	}
	return ""
}

// epochReset reads a reset time given as Unix seconds (claude's resetsAt):
// a JSON number, integral or not, or a string of digits. A value so large
// it can only be milliseconds is read as such. ok is false, with a note,
// for anything else (a negative, a non-number, a time before 2001 or
// after 2100).
func epochReset(raw json.RawMessage) (t time.Time, note string, ok bool) {
	s := strings.TrimSpace(string(raw))
	if s == "" || s == "null" {
		return time.Time{}, "", false
	}
	var f float64
	if err := json.Unmarshal(raw, &f); err != nil {
		var str string
		if json.Unmarshal(raw, &str) != nil {
			return time.Time{}, fmt.Sprintf("reset time %s is not a number", brief.OneLine(s, 60)), false
		}
		v, err := strconv.ParseFloat(strings.TrimSpace(str), 64)
		if err != nil {
			if ts, err := time.Parse(time.RFC3339, strings.TrimSpace(str)); err == nil {
				return ts.UTC(), "", true
			}
			return time.Time{}, fmt.Sprintf("reset time %q is not a number", brief.OneLine(str, 60)), false
		}
		f = v
	}
	if math.IsNaN(f) || math.IsInf(f, 0) {
		return time.Time{}, "reset time is not a finite number", false
	}
	if f > 1e11 { // later than year 5138 in seconds: milliseconds
		f /= 1000
	}
	t = time.Unix(int64(f), int64((f-math.Floor(f))*1e9)).UTC()
	if t.Year() < 2001 || t.Year() > 2100 {
		return time.Time{}, fmt.Sprintf("reset time %s is out of range (%s)", brief.OneLine(s, 40), t.Format(time.RFC3339)), false
	}
	return t, "", true
}

// Reset-time phrases in engine messages.
var (
	// claude before 2.1: "Claude AI usage limit reached|1767225600".
	legacyEpoch = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`(?i)limit reached\|(\d{9,13})`) })
	// claude: "You've hit your limit · resets 2:10pm (Europe/Moscow)",
	// "… resets Apr 23 at 4pm (America/Recife)", "… resets Apr 23, 4pm (UTC)".
	claudeResets = sync.OnceValue(func() *regexp.Regexp {
		return regexp.MustCompile(`(?i)\bresets (?:at )?([^()·]+?)\s*\(([A-Za-z][A-Za-z0-9_+/-]*)\)`)
	})
	// codex: "… Try again at 3:04 PM." or "… or try again at Nov 26th, 2026 3:04 PM."
	codexTryAgain = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`(?i)\btry again at ([^.]+(?:\.\d+)?)\.?`) })

	clockSpec = sync.OnceValue(func() *regexp.Regexp {
		return regexp.MustCompile(`(?i)^(?:(jan|feb|mar|apr|may|jun|jul|aug|sep|oct|nov|dec)[a-z]*\.? (\d{1,2})(?:st|nd|rd|th)?,?(?: (\d{4}),?)?(?: at)?\s*)?(?:(\d{1,2})(?::(\d{2}))?\s*([ap])\.?m\.?)?$`)
	})
)

var months = map[string]time.Month{"jan": 1, "feb": 2, "mar": 3, "apr": 4, "may": 5, "jun": 6, "jul": 7, "aug": 8, "sep": 9, "oct": 10, "nov": 11, "dec": 12}

// textReset finds a reset time in an engine's error text: claude's legacy
// "|<epoch>" suffix, claude's "resets <when> (<zone>)", codex's "try again
// at <when>" (in loc, the engine's local time zone). A wall-clock time
// without a date is its next occurrence after now. ok is false when the
// text names no reset; note is set when it names one aq cannot read.
func textReset(text string, now time.Time, loc *time.Location) (t time.Time, note string, ok bool) {
	if m := legacyEpoch().FindStringSubmatch(text); m != nil {
		return epochReset(json.RawMessage(m[1]))
	}
	if m := claudeResets().FindStringSubmatch(text); m != nil {
		zone, err := time.LoadLocation(m[2])
		if err != nil {
			return time.Time{}, fmt.Sprintf("reset time %q names an unknown time zone %q", strings.TrimSpace(m[1]), m[2]), false
		}
		return clockReset(strings.TrimSpace(m[1]), now, zone)
	}
	if m := codexTryAgain().FindStringSubmatch(text); m != nil {
		if loc == nil {
			loc = time.Local
		}
		return clockReset(strings.TrimSpace(m[1]), now, loc)
	}
	return time.Time{}, "", false
}

// clockReset reads "3pm", "2:10pm", "3:04 PM", "Apr 23 at 4pm", "Apr 23,
// 4pm", "Nov 26th, 2026 3:04 PM" or "Apr 23" in loc.
func clockReset(spec string, now time.Time, loc *time.Location) (time.Time, string, bool) {
	m := clockSpec().FindStringSubmatch(spec)
	if m == nil || (m[1] == "" && m[4] == "") {
		return time.Time{}, fmt.Sprintf("reset time %q is not in a form aq reads", brief.OneLine(spec, 60)), false
	}
	local := now.In(loc)
	hour, minute := 0, 0
	if m[4] != "" {
		hour, _ = strconv.Atoi(m[4])
		if m[5] != "" {
			minute, _ = strconv.Atoi(m[5])
		}
		if hour < 1 || hour > 12 || minute > 59 {
			return time.Time{}, fmt.Sprintf("reset time %q has no valid clock time", brief.OneLine(spec, 60)), false
		}
		if hour == 12 {
			hour = 0
		}
		if strings.EqualFold(m[6], "p") {
			hour += 12
		}
	}
	if m[1] == "" { // a time of day: its next occurrence
		t := time.Date(local.Year(), local.Month(), local.Day(), hour, minute, 0, 0, loc)
		if t.Before(local.Add(-time.Minute)) {
			t = t.AddDate(0, 0, 1)
		}
		return t.UTC(), "", true
	}
	day, _ := strconv.Atoi(m[2])
	year := local.Year()
	explicitYear := m[3] != ""
	if explicitYear {
		year, _ = strconv.Atoi(m[3])
	}
	mon := months[strings.ToLower(m[1][:3])]
	if day < 1 || day > 31 {
		return time.Time{}, fmt.Sprintf("reset time %q has no valid day", brief.OneLine(spec, 60)), false
	}
	t := time.Date(year, mon, day, hour, minute, 0, 0, loc)
	if t.Day() != day {
		return time.Time{}, fmt.Sprintf("reset time %q has no valid day", brief.OneLine(spec, 60)), false
	}
	if !explicitYear && t.Before(local.AddDate(0, 0, -1)) { // "Jan 2" said on Dec 30
		t = t.AddDate(1, 0, 0)
	}
	return t.UTC(), "", true
}

// locationOf is the time zone an engine prints local times in: TZ in its
// environment when set and known, else aq's own.
func locationOf(env []string) *time.Location {
	if tz := envValue(env, "TZ"); tz != "" {
		if loc, err := time.LoadLocation(strings.TrimPrefix(tz, ":")); err == nil {
			return loc
		}
	}
	return time.Local
}
