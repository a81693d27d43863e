package job

// Repair rounds and retries that know what went wrong (docs/engines.md,
// "Repair rounds"): what a failed verify and an earlier attempt's end look
// like as data (in insights, on the wire as a claimed job's previous), and
// the prompt text that hands them to the engine.

import (
	"fmt"
	"regexp"
	"strings"
	"sync"
	"unicode"
	"unicode/utf8"
)

// DefaultVerifyRounds is how many repair rounds a job gets when neither its
// manifest, its profile nor AQ_VERIFY_ROUNDS says: its first engine run,
// then up to two more after a failed verify.
const DefaultVerifyRounds = 2

// MaxVerifyRounds bounds verify_rounds: every round is a whole engine run.
const MaxVerifyRounds = 10

// Bounds of the verify output an engine is shown (the prompt, insights, the
// wire): its last lines, at most this many and this many bytes. The whole
// output stays in the job's verify.log.
const (
	VerifyTailLines = 80
	VerifyTailBytes = 8 << 10
)

// Bounds of the other free text of a previous attempt (it may come from a
// coordinator: it is cut, not trusted).
const (
	maxDetail  = 1000 // runes
	maxCommand = 500  // runes
)

// VerifyResult is one run of a job's verify: command: the command, how it
// ended and, when it failed, the last lines of its output (bounded, secrets
// masked) — what a repair round's prompt and the next attempt's show.
type VerifyResult struct {
	Command  string `json:"command"`
	ExitCode int    `json:"exitCode"`
	Passed   bool   `json:"passed"`
	// Tail is the end of the output of a verify that failed (at most
	// VerifyTailLines lines and VerifyTailBytes bytes); "" when it passed.
	Tail string `json:"tail,omitempty"`
	// Cut says the output was longer than Tail.
	Cut bool `json:"cut,omitempty"`
}

// Run is one engine run of an attempt: the first (Round 0) or a repair round
// after a failed verify, what it spent and what verify said after it.
type Run struct {
	Round int `json:"round"` // 0: the attempt's first run; k: repair round k
	// Session is the engine session the run continued ("" when it started
	// fresh: the first run, or an engine that cannot resume).
	Session      string  `json:"session,omitempty"`
	TokensIn     int64   `json:"tokensIn"`
	TokensOut    int64   `json:"tokensOut"`
	CostUSD      float64 `json:"costUsd"`
	Turns        int     `json:"turns"`
	EngineMS     int64   `json:"engineMs"`
	VerifyPassed bool    `json:"verifyPassed"`
	// VerifyExit is verify's exit status after the run (-1: verify did not
	// run, e.g. the run itself failed).
	VerifyExit int `json:"verifyExit"`
}

// Previous is how a job's previous attempt ended, as the next attempt tells
// its engine (a claimed job's previous on the wire, docs/fleet.md; a local
// job's from its queue record).
type Previous struct {
	Attempt int    `json:"attempt,omitempty"`
	Reason  Reason `json:"reason"`
	Detail  string `json:"detail,omitempty"`
	// RepairRounds is how many repair rounds that attempt ran.
	RepairRounds int `json:"repairRounds,omitempty"`
	// Verify is that attempt's last verify when it failed.
	Verify *VerifyResult `json:"verify,omitempty"`
}

// PreviousOf is the previous attempt a failed (or parked) run's end makes:
// nil when reason is "" (the run did not fail).
func PreviousOf(attempt int, reason Reason, detail string, in *Insights) *Previous {
	if reason == "" {
		return nil
	}
	p := &Previous{Attempt: attempt, Reason: reason, Detail: detail}
	if in != nil {
		p.RepairRounds = in.RepairRounds
		if v := in.Verify; v != nil && !v.Passed {
			vc := *v
			p.Verify = &vc
		}
	}
	return p.Bounded()
}

var reasonWord = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^[a-z][a-z_]{0,39}$`) })

// Bounded is p with its text cut to the bounds above and cleaned of control
// characters, a reason that is not a word replaced by "unknown" and counts
// that cannot be true zeroed: a previous from a coordinator is data for a
// prompt, never trusted. nil stays nil.
func (p *Previous) Bounded() *Previous {
	if p == nil {
		return nil
	}
	b := *p
	if !reasonWord().MatchString(string(b.Reason)) {
		b.Reason = "unknown"
	}
	if b.Attempt < 0 {
		b.Attempt = 0
	}
	if b.RepairRounds < 0 || b.RepairRounds > MaxVerifyRounds {
		b.RepairRounds = 0
	}
	b.Detail = cutRunes(cleanLine(b.Detail), maxDetail)
	if v := b.Verify; v != nil {
		vc := *v
		vc.Command = cutRunes(cleanLine(vc.Command), maxCommand)
		tail, cut := Tail([]byte(vc.Tail), VerifyTailLines, VerifyTailBytes)
		vc.Tail, vc.Cut = tail, vc.Cut || cut
		b.Verify = &vc
	}
	return &b
}

// ansi matches terminal escape sequences (colours, cursor moves) test
// runners print.
var ansi = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`\x1b\[[0-9;?]*[ -/]*[@-~]|\x1b[@-_]`) })

// Tail is the end of out for a prompt: at most maxLines lines and maxBytes
// bytes, whole lines only (a line longer than maxBytes keeps its end),
// valid UTF-8, without terminal escapes or control characters but tabs, a
// carriage return keeping what was printed after it (progress bars). cut
// says something was left out.
func Tail(out []byte, maxLines, maxBytes int) (tail string, cut bool) {
	s := strings.ToValidUTF8(string(out), "\uFFFD")
	s = ansi().ReplaceAllString(s, "")
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) == 1 && lines[0] == "" {
		return "", false
	}
	var kept []string
	size := 0
	for i := len(lines) - 1; i >= 0; i-- {
		l := lines[i]
		if j := strings.LastIndexByte(strings.TrimRight(l, "\r"), '\r'); j >= 0 {
			l = l[j+1:]
		}
		l = cleanLine(l)
		if len(kept) == maxLines {
			return join(kept), true
		}
		if size+len(l)+1 > maxBytes {
			if len(kept) == 0 { // one huge line: its end
				l = "…" + cutFront(l, maxBytes-len("…"))
				kept = append(kept, l)
			}
			return join(kept), true
		}
		size += len(l) + 1
		kept = append(kept, l)
	}
	return join(kept), false
}

func join(rev []string) string {
	var b strings.Builder
	for i := len(rev) - 1; i >= 0; i-- {
		b.WriteString(rev[i])
		if i > 0 {
			b.WriteByte('\n')
		}
	}
	return b.String()
}

// cleanLine drops control characters but tabs.
func cleanLine(s string) string {
	if !strings.ContainsFunc(s, isControl) {
		return s
	}
	return strings.Map(func(r rune) rune {
		if isControl(r) {
			return -1
		}
		return r
	}, s)
}

func isControl(r rune) bool {
	return r != '\t' && (unicode.IsControl(r) || r == '\u2028' || r == '\u2029')
}

func cutRunes(s string, n int) string {
	if utf8.RuneCountInString(s) <= n {
		return s
	}
	r := []rune(s)
	return string(r[:n-1]) + "…"
}

// cutFront keeps the last n bytes of s, on a rune boundary.
func cutFront(s string, n int) string {
	if len(s) <= n {
		return s
	}
	s = s[len(s)-n:]
	for len(s) > 0 && !utf8.RuneStart(s[0]) {
		s = s[1:]
	}
	return s
}

// RepairPrompt is what a repair round tells the engine about the verify
// that failed after its last run: round of rounds, the command, its exit
// status and the tail of its output, and what to do. A run that continues
// its own session gets it alone; a fresh run gets it after the task
// (RepairTask).
func RepairPrompt(v VerifyResult, round, rounds int) string {
	var b strings.Builder
	fmt.Fprintf(&b, "aq ran the job's verify command after you stopped, and it failed. This is repair round %d of %d.\n\n", round, rounds)
	fmt.Fprintf(&b, "Verify command: %s\nExit status: %d\n\n", v.Command, v.ExitCode)
	writeOutput(&b, v)
	b.WriteString("\nFind the cause of this failure and fix it in the worktree, which holds the work so far. " +
		"Fix the cause, not the check: do not weaken, skip or delete the test or the verify command. " +
		"Run the verify command yourself to check the fix if you can. Then stop: aq runs verify again, and ships the work only if it passes.\n")
	return b.String()
}

// RepairTask is a repair round's prompt for an engine that starts fresh
// (it cannot continue the session of the run before): the task, then what
// happened and the failure.
func RepairTask(task string, v VerifyResult, round, rounds int) string {
	var b strings.Builder
	b.WriteString(strings.TrimRight(task, "\n"))
	b.WriteString("\n\n---\nThis job has run before in this worktree: an engine worked on the task above and its changes are in the files now. ")
	b.WriteString(RepairPrompt(v, round, rounds))
	return b.String()
}

func writeOutput(b *strings.Builder, v VerifyResult) {
	if strings.TrimSpace(v.Tail) == "" {
		b.WriteString("It printed nothing.\n")
		return
	}
	what := "Its output"
	if v.Cut {
		what = "The last lines of its output"
	}
	fmt.Fprintf(b, "%s (secrets masked; the whole output is in aq's verify.log):\n--- verify output ---\n%s\n--- end of verify output ---\n", what, v.Tail)
}

// RetryNote is what the first run of an attempt is told about the attempt
// before it, after the task: how it ended (p; nil when unknown), whether
// the worktree starts from a checkpoint of the earlier work (checkpoint:
// its commit, "" when it starts from the base), and the failed verify's
// output. "" when there is nothing to say: a first attempt, or a later one
// that knows nothing and starts from the base.
func RetryNote(attempt int, p *Previous, checkpoint string) string {
	if p == nil && (attempt <= 1 || checkpoint == "") {
		return ""
	}
	var b strings.Builder
	b.WriteString("\n---\n")
	if p == nil {
		fmt.Fprintf(&b, "This is attempt %d of this job: an earlier attempt ran elsewhere and how it ended is not known here. "+
			"It is resuming from a checkpoint of the earlier work (commit %s): the worktree holds that work. "+
			"Read what is there before you change anything, keep what is right and finish the task.\n", attempt, short(checkpoint))
		return b.String()
	}
	if p.Attempt > 0 {
		fmt.Fprintf(&b, "This job ran before. Its attempt %d ended: %s", p.Attempt, p.Reason)
	} else {
		fmt.Fprintf(&b, "This job ran before. Its previous attempt ended: %s", p.Reason)
	}
	if p.Detail != "" {
		fmt.Fprintf(&b, " (%s)", p.Detail)
	}
	if p.RepairRounds > 0 {
		fmt.Fprintf(&b, ", after %d repair round%s", p.RepairRounds, plural(p.RepairRounds))
	}
	b.WriteString(".\n")
	if why := reasonHint(p.Reason); why != "" {
		b.WriteString(why + "\n")
	}
	if checkpoint != "" {
		fmt.Fprintf(&b, "This attempt resumes from a checkpoint of the earlier work (commit %s): the worktree holds it. "+
			"Read what is there before you change anything, keep what is right and finish the task.\n", short(checkpoint))
	} else {
		b.WriteString("This attempt starts from the base branch again: nothing of the earlier work was kept.\n")
	}
	if v := p.Verify; v != nil && !v.Passed {
		fmt.Fprintf(&b, "\nThe earlier attempt's last verify, `%s`, exited %d.\n", v.Command, v.ExitCode)
		writeOutput(&b, *v)
		b.WriteString("Make verify pass this time: fix the cause, not the check.\n")
	}
	return b.String()
}

// reasonHint says in a line what a previous attempt's reason means for the
// engine now.
func reasonHint(r Reason) string {
	switch r {
	case ReasonVerifyFailed:
		return "Its work did not pass the job's verify command (below)."
	case ReasonTimeout:
		return "It ran out of time: work in smaller steps and stop when the task is done."
	case ReasonBudgetExceeded:
		return "It spent its budget: read only what you need and stop when the task is done."
	case ReasonLeaseLost, ReasonCrash, ReasonInterrupted:
		return "It was cut off by the machine running it, not by its work: pick up where it stopped."
	case ReasonRateLimited:
		return "Its engine account hit a limit that has reset since: pick up where it stopped."
	case ReasonEngineFailed:
		return "The engine stopped without finishing the task."
	}
	return ""
}

func short(sha string) string {
	if len(sha) > 12 {
		return sha[:12]
	}
	return sha
}

func plural(n int) string {
	if n == 1 {
		return ""
	}
	return "s"
}
