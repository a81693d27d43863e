package engines

import (
	"bytes"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// TestResumeNotFoundRecognised: the recorded refusals to resume a session
// are told apart from any other failure (the adapter then runs the round
// fresh), and nothing else is taken for one.
func TestResumeNotFoundRecognised(t *testing.T) {
	if res := finishRecorded(t, newClaudeParser("", nil, nil, nil), "claude", "resume_not_found", 1, true); !res.resumeMissing {
		t.Errorf("claude's 'No conversation found' result not recognised: %+v", res)
	}
	if res := finishRecorded(t, newCodexParser("", nil, nil, nil), "codex", "resume_not_found", 1, true); !res.resumeMissing {
		t.Errorf("codex's 'no rollout found' not recognised: %+v", res)
	}
	for _, c := range []struct{ engine, name string }{{"claude", "during_execution"}, {"claude", "success"}, {"claude", "no_result_auth"}, {"codex", "no_events"}, {"codex", "turn_failed_exit0"}} {
		var p streamParser = newClaudeParser("", nil, nil, nil)
		if c.engine == "codex" {
			p = newCodexParser("", nil, nil, nil)
		}
		_, err := os.Stat(filepath.Join("testdata", c.engine, c.name+".stderr"))
		if res := finishRecorded(t, p, c.engine, c.name, 1, err == nil); res.resumeMissing {
			t.Errorf("%s/%s taken for a missing session", c.engine, c.name)
		}
	}
}

func TestClaudeResumeArgs(t *testing.T) {
	const sid = "5f3c1d2e-8b7a-4c6d-9e0f-1a2b3c4d5e6f"
	c := &Claude{}
	spec := Spec{Prompt: "the task and the failure", Persona: "You are careful.", Resume: &Resume{SessionID: sid, Prompt: "verify failed: fix it"}}
	args, got, err := c.Args(spec)
	if err != nil {
		t.Fatal(err)
	}
	if argAfter(args, "--resume") != sid || slices.Contains(args, "--session-id") || got != sid {
		t.Errorf("resume args %q (session %s): want --resume %s and no --session-id (claude refuses one it has)", args, got, sid)
	}
	if p := c.prompt(spec); p != "verify failed: fix it" {
		t.Errorf("a resumed session is told %q, want only the resume prompt", p)
	}
	// A claude without --resume, or a session id claude does not make:
	// a fresh session with the whole prompt.
	for name, s := range map[string]Spec{
		"no --resume":  {Prompt: spec.Prompt, Resume: spec.Resume, Flags: &FlagSet{Found: []string{"--session-id", "--append-system-prompt"}}},
		"not a UUID":   {Prompt: spec.Prompt, Resume: &Resume{SessionID: "--dangerously-skip-permissions", Prompt: "x"}},
		"no resume at": {Prompt: spec.Prompt},
	} {
		args, sid2, err := c.Args(s)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if slices.Contains(args, "--resume") || argAfter(args, "--session-id") != sid2 || sid2 == sid || c.prompt(s) != spec.Prompt {
			t.Errorf("%s: args %q prompt %q, want a fresh session with the whole prompt", name, args, c.prompt(s))
		}
	}
}

func TestCodexResumeArgs(t *testing.T) {
	got := (&Codex{}).ResumeArgs(Spec{Model: "gpt-5.3-codex"}, "0199a213-81c0-7800-8aa1-bbab2a035a53")
	want := []string{"exec", "resume", "--json", "-c", `sandbox_mode="workspace-write"`, "-m", "gpt-5.3-codex", "0199a213-81c0-7800-8aa1-bbab2a035a53", "-"}
	if !slices.Equal(got, want) {
		t.Errorf("ResumeArgs = %q, want %q", got, want)
	}
	// Inside aq's sandbox the round keeps the first run's policy.
	in := (&Codex{}).ResumeArgs(Spec{CodexSandbox: "danger-full-access"}, "0199a213-81c0-7800-8aa1-bbab2a035a53")
	if !slices.Contains(in, `sandbox_mode="danger-full-access"`) {
		t.Errorf("ResumeArgs in the sandbox = %q", in)
	}
	// Every flag it passes is one `codex exec resume --help` (recorded) has.
	have := HelpFlags(readTestdata(t, "codex/exec-resume-help.txt"))
	for _, a := range got {
		if strings.HasPrefix(a, "-") && a != "-" && !have[a] {
			t.Errorf("codex exec resume has no %s", a)
		}
	}
}

// TestRepairRoundResumesTheSession: a repair round continues the session
// of the run before it, against fakes that keep sessions and refuse what
// the real CLIs refuse; the resumed run is told only the failure, and its
// usage is its own (codex's running thread total less what the thread had
// spent before).
func TestRepairRoundResumesTheSession(t *testing.T) {
	for _, a := range suiteAdapters()[:2] { // claude, codex
		t.Run(a.name, func(t *testing.T) {
			t.Parallel()
			h := newFakeHost(t)
			sessions := t.TempDir()
			first := h.run(t, a.success, fakeSessions+"="+sessions)
			res1, err := a.engine.Run(t.Context(), first.spec)
			if err != nil || res1.Outcome != Succeeded || res1.SessionID == "" {
				t.Fatalf("first run: %+v, %v", res1, err)
			}
			round := h.run(t, a.success, fakeSessions+"="+sessions)
			round.spec.Dir, round.spec.JobID, round.spec.LogDir = first.spec.Dir, first.spec.JobID, first.spec.LogDir
			round.spec.Round, round.spec.Rounds = 1, 2
			round.spec.Prompt = "the whole task, then: verify failed"
			round.spec.Resume = &Resume{SessionID: res1.SessionID, Prompt: "verify `go test` exited 1: fix it", Usage: res1.Usage}
			res2, err := a.engine.Run(t.Context(), round.spec)
			if err != nil || res2.Outcome != Succeeded {
				t.Fatalf("repair round: %+v, %v", res2, err)
			}
			if !res2.Resumed || res2.ResumeNote != "" || res2.SessionID != res1.SessionID {
				t.Errorf("resumed %v note %q session %s, want session %s continued", res2.Resumed, res2.ResumeNote, res2.SessionID, res1.SessionID)
			}
			rec := round.recording(t)
			if rec.Stdin != round.spec.Resume.Prompt {
				t.Errorf("the resumed session was told %q, want only the failure %q", rec.Stdin, round.spec.Resume.Prompt)
			}
			switch a.name {
			case "claude":
				if argAfter(rec.Args, "--resume") != res1.SessionID || slices.Contains(rec.Args, "--session-id") {
					t.Errorf("claude args %q", rec.Args)
				}
			case "codex":
				if len(rec.Args) < 3 || rec.Args[0] != "exec" || rec.Args[1] != "resume" || rec.Args[len(rec.Args)-2] != res1.SessionID {
					t.Errorf("codex args %q", rec.Args)
				}
			}
			if res2.Usage.TokensIn != res1.Usage.TokensIn || res2.Usage.TokensOut != res1.Usage.TokensOut {
				t.Errorf("the round's usage %+v, want its own (the recording's, as the first run's %+v), not the thread's total", res2.Usage, res1.Usage)
			}
			b, _ := os.ReadFile(filepath.Join(round.spec.LogDir, "stdout.log"))
			if !bytes.Contains(b, []byte("attempt 1 repair 1/2: "+a.name)) {
				t.Errorf("stdout.log has no header for the repair round:\n%s", b)
			}
		})
	}
}

// TestRepairRoundWhenTheSessionIsGone: a session the engine no longer has
// (another host, a HOME that was not kept) makes the round run fresh, once,
// with the whole prompt, and say why.
func TestRepairRoundWhenTheSessionIsGone(t *testing.T) {
	for _, a := range suiteAdapters()[:2] {
		t.Run(a.name, func(t *testing.T) {
			t.Parallel()
			h := newFakeHost(t)
			r := h.run(t, a.success, fakeSessions+"="+t.TempDir(), fakeHelpCount+"="+filepath.Join(t.TempDir(), "help"))
			r.spec.Round, r.spec.Rounds = 1, 2
			r.spec.Prompt = "the whole task, then: verify failed"
			r.spec.Resume = &Resume{SessionID: "9d2b6f0e-3c1a-4e5d-8f7a-6b5c4d3e2f1a", Prompt: "fix it"}
			res, err := a.engine.Run(t.Context(), r.spec)
			if err != nil || res.Outcome != Succeeded {
				t.Fatalf("%+v, %v", res, err)
			}
			if res.Resumed || !strings.Contains(res.ResumeNote, "9d2b6f0e-3c1a-4e5d-8f7a-6b5c4d3e2f1a") {
				t.Errorf("resumed %v note %q, want a fresh run saying the session is gone", res.Resumed, res.ResumeNote)
			}
			if rec := r.recording(t); rec.Stdin != r.spec.Prompt || slices.Contains(rec.Args, "--resume") || slices.Contains(rec.Args, "resume") {
				t.Errorf("the fresh run got %q with %q, want the whole prompt", rec.Stdin, rec.Args)
			}
			b, _ := os.ReadFile(filepath.Join(r.spec.LogDir, "stdout.log"))
			if n := bytes.Count(b, []byte("attempt 1 repair 1/2: ")); n != 2 {
				t.Errorf("stdout.log has %d round headers, want 2 (the refused resume, the fresh run):\n%s", n, b)
			}
		})
	}
}

// TestEnginesWithoutSessionsRunFresh: devin and script cannot continue a
// session: a repair round is a fresh run with the whole prompt, in files of
// its own (devin's prompt and trajectory per round).
func TestEnginesWithoutSessionsRunFresh(t *testing.T) {
	h := newFakeHost(t)
	a := suiteAdapters()[2] // devin
	r := h.run(t, a.success)
	r.spec.Round, r.spec.Rounds, r.spec.Prompt = 2, 2, "the task and the failure"
	r.spec.Resume = &Resume{SessionID: "s", Prompt: "fix it"}
	res, err := a.engine.Run(t.Context(), r.spec)
	if err != nil || res.Outcome != Succeeded || res.Resumed {
		t.Fatalf("%+v, %v", res, err)
	}
	if got := r.recording(t).Prompt; got != r.spec.Prompt {
		t.Errorf("devin got %q, want the whole prompt", got)
	}
	if _, err := os.Stat(filepath.Join(r.spec.LogDir, "devin-prompt-1-repair2.md")); err != nil {
		t.Errorf("the round's prompt file: %v", err)
	}

	s := h.run(t, fixture{})
	s.spec.Script, s.spec.Prompt, s.spec.Resume = "cat > got.txt", "the task and the failure", &Resume{SessionID: "s", Prompt: "fix it"}
	if res, err := (&Script{}).Run(t.Context(), s.spec); err != nil || res.Resumed {
		t.Fatalf("%+v, %v", res, err)
	}
	if b, _ := os.ReadFile(filepath.Join(s.spec.Dir, "got.txt")); string(b) != s.spec.Prompt {
		t.Errorf("the script got %q, want the whole prompt", b)
	}
}

// TestTranscriptRepairRounds: a repair round's header names the round, and
// the attempt's usage adds up across its runs; a new attempt starts again.
func TestTranscriptRepairRounds(t *testing.T) {
	tr := NewTranscript("", "", nil)
	log := "=== aq job j attempt 1: sh at 2026-01-02T03:04:05Z ===\n::aq-usage tokens_in=100 tokens_out=10 cost_usd=0.01 turns=1\n" +
		"=== aq job j attempt 1 repair 1/2: sh at 2026-01-02T03:05:05Z ===\n::aq-usage tokens_in=50 tokens_out=5 cost_usd=0.005 turns=1\n"
	lines := render(t, tr, []byte(log))
	if !hasLine(lines, "── attempt 1 repair 1/2: sh at 2026-01-02T03:05:05Z ──") {
		t.Errorf("no round header in:\n%s", strings.Join(lines, "\n"))
	}
	if r, n := tr.Round(); r != 1 || n != 2 {
		t.Errorf("Round = %d/%d, want 1/2", r, n)
	}
	if u, ok := tr.Usage(); !ok || u.TokensIn != 150 || u.TokensOut != 15 || u.Turns != 2 || u.CostUSD < 0.0149 || u.CostUSD > 0.0151 {
		t.Errorf("usage across the rounds %+v", u)
	}
	if !IsHeader([]byte("=== aq job j attempt 1 repair 1/2: sh at 2026-01-02T03:05:05Z ===")) {
		t.Error("a round's header is not a header")
	}
	tr.Line([]byte("=== aq job j attempt 2: sh at 2026-01-02T04:00:00Z ==="))
	if u, _ := tr.Usage(); u != (Usage{}) {
		t.Errorf("a new attempt kept the last one's usage: %+v", u)
	}
	if r, _ := tr.Round(); r != 0 {
		t.Errorf("round %d after a new attempt", r)
	}
}
