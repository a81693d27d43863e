package job

import (
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"unicode/utf8"
)

var update = flag.Bool("update", false, "rewrite testdata/*.golden from the current prompt text")

func TestTail(t *testing.T) {
	lines := func(n int) string {
		var b strings.Builder
		for i := 1; i <= n; i++ {
			b.WriteString("line " + strings.Repeat("x", i%7) + "\n")
		}
		return b.String()
	}
	tests := []struct {
		name      string
		in        string
		maxLines  int
		maxBytes  int
		want      string
		wantCut   bool
		wantLines int // when want is not given
	}{
		{name: "empty", in: "", maxLines: 5, maxBytes: 100, want: ""},
		{name: "short", in: "FAIL: add\nwant 4, got 5\n", maxLines: 5, maxBytes: 100, want: "FAIL: add\nwant 4, got 5"},
		{name: "last lines", in: "a\nb\nc\nd\n", maxLines: 2, maxBytes: 100, want: "c\nd", wantCut: true},
		{name: "bytes bound whole lines", in: "aaaa\nbbbb\ncccc\n", maxLines: 10, maxBytes: 10, want: "bbbb\ncccc", wantCut: true},
		{name: "one huge line keeps its end", in: strings.Repeat("y", 50) + "END", maxLines: 10, maxBytes: 20, want: "…" + strings.Repeat("y", 14) + "END", wantCut: true},
		{name: "colours and controls dropped", in: "\x1b[31mFAIL\x1b[0m\x07 x\ttab\n", maxLines: 5, maxBytes: 100, want: "FAIL x\ttab"},
		{name: "carriage return keeps the last redraw", in: "progress 10%\rprogress 100%\r\ndone\r\n", maxLines: 5, maxBytes: 100, want: "progress 100%\ndone"},
		{name: "invalid utf-8 replaced", in: "bad \xff byte\n", maxLines: 5, maxBytes: 100, want: "bad \uFFFD byte"},
		{name: "many lines", in: lines(500), maxLines: VerifyTailLines, maxBytes: VerifyTailBytes, wantCut: true, wantLines: VerifyTailLines},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, cut := Tail([]byte(tc.in), tc.maxLines, tc.maxBytes)
			if tc.wantLines > 0 {
				if n := strings.Count(got, "\n") + 1; n != tc.wantLines || cut != tc.wantCut {
					t.Fatalf("Tail kept %d lines (cut %v), want %d (cut %v)", n, cut, tc.wantLines, tc.wantCut)
				}
			} else if got != tc.want || cut != tc.wantCut {
				t.Fatalf("Tail = %q (cut %v), want %q (cut %v)", got, cut, tc.want, tc.wantCut)
			}
			if len(got) > tc.maxBytes || !utf8.ValidString(got) {
				t.Errorf("Tail is %d bytes (bound %d), valid UTF-8 %v", len(got), tc.maxBytes, utf8.ValidString(got))
			}
		})
	}
}

// TestTailOfMegabytes: a verify that prints megabytes leaves a tail within
// the bounds, its last line included.
func TestTailOfMegabytes(t *testing.T) {
	var b strings.Builder
	for b.Len() < 4<<20 {
		b.WriteString("=== RUN   TestSomething/with/a/long/name ok\n")
	}
	b.WriteString("--- FAIL: TestAdd (0.00s)\n    add_test.go:9: add(2, 2) = 5, want 4\nFAIL\n")
	tail, cut := Tail([]byte(b.String()), VerifyTailLines, VerifyTailBytes)
	if !cut || len(tail) > VerifyTailBytes || strings.Count(tail, "\n")+1 > VerifyTailLines {
		t.Fatalf("tail of %d bytes, %d lines, cut %v", len(tail), strings.Count(tail, "\n")+1, cut)
	}
	if !strings.HasSuffix(tail, "add(2, 2) = 5, want 4\nFAIL") {
		t.Errorf("the failure is not at the tail's end: …%q", tail[len(tail)-80:])
	}
}

func TestPreviousBounded(t *testing.T) {
	long := strings.Repeat("d", 5000)
	p := (&Previous{
		Attempt: -3, Reason: "Robert'); DROP TABLE", Detail: "line one\nline two\x1b[2J" + long, RepairRounds: 99,
		Verify: &VerifyResult{Command: "make\ttest\n&& rm -rf /", ExitCode: 2, Tail: strings.Repeat("out\n", 1000)},
	}).Bounded()
	if p.Reason != "unknown" || p.Attempt != 0 || p.RepairRounds != 0 {
		t.Errorf("reason %q attempt %d rounds %d: a reason that is not a word, a negative attempt and impossible rounds are not kept", p.Reason, p.Attempt, p.RepairRounds)
	}
	if utf8.RuneCountInString(p.Detail) > maxDetail || strings.ContainsAny(p.Detail, "\n\x1b") {
		t.Errorf("detail not bounded or cleaned: %d runes %q…", utf8.RuneCountInString(p.Detail), p.Detail[:40])
	}
	if strings.Contains(p.Verify.Command, "\n") || !p.Verify.Cut || len(p.Verify.Tail) > VerifyTailBytes || strings.Count(p.Verify.Tail, "\n")+1 > VerifyTailLines {
		t.Errorf("verify not bounded: command %q, cut %v, tail %d bytes", p.Verify.Command, p.Verify.Cut, len(p.Verify.Tail))
	}
	if (*Previous)(nil).Bounded() != nil {
		t.Error("nil previous bounded to something")
	}
	ok := (&Previous{Attempt: 2, Reason: ReasonVerifyFailed, Detail: "verify \"make test\" exited 2"}).Bounded()
	if ok.Reason != ReasonVerifyFailed || ok.Attempt != 2 || ok.Detail != "verify \"make test\" exited 2" {
		t.Errorf("a good previous was changed: %+v", ok)
	}
}

func TestPreviousOf(t *testing.T) {
	if PreviousOf(1, "", "", nil) != nil {
		t.Error("a run that did not fail made a previous")
	}
	in := &Insights{RepairRounds: 2, Verify: &VerifyResult{Command: "make test", ExitCode: 1, Tail: "FAIL"}}
	p := PreviousOf(3, ReasonVerifyFailed, "verify exited 1", in)
	if p.Attempt != 3 || p.RepairRounds != 2 || p.Verify == nil || p.Verify.Tail != "FAIL" {
		t.Errorf("PreviousOf = %+v", p)
	}
	in.Verify.Tail = "changed"
	if p.Verify.Tail != "FAIL" {
		t.Error("the previous shares its verify with the insights")
	}
	if p := PreviousOf(1, ReasonCrash, "", &Insights{Verify: &VerifyResult{Command: "x", Passed: true}}); p.Verify != nil {
		t.Error("a passed verify was carried as a failure")
	}
}

// TestPromptsGolden: the text a repair round and a retry hand the engine
// (testdata/*.golden; -update rewrites them).
func TestPromptsGolden(t *testing.T) {
	v := VerifyResult{Command: "go test ./...", ExitCode: 1, Cut: true,
		Tail: "--- FAIL: TestAdd (0.00s)\n    add_test.go:9: add(2, 2) = 5, want 4\nFAIL\nFAIL\texample.com/calc\t0.002s"}
	task := "Make add add.\n\n---\nDefinition of done (the job's acceptance criteria):\n- go test passes\n"
	cases := map[string]string{
		"repair_resumed":  RepairPrompt(v, 1, 2),
		"repair_fresh":    RepairTask(task, v, 2, 2),
		"repair_silent":   RepairPrompt(VerifyResult{Command: "test -f out.txt", ExitCode: 1}, 1, 1),
		"retry_verify":    task + RetryNote(2, &Previous{Attempt: 1, Reason: ReasonVerifyFailed, Detail: "verify \"go test ./...\" exited 1", RepairRounds: 2, Verify: &v}, "0123456789abcdef0123"),
		"retry_killed":    task + RetryNote(2, &Previous{Attempt: 1, Reason: ReasonCrash, Detail: "recovered: the process running it (host-a, pid 4242) is gone; checkpoint 0123456789ab"}, "0123456789abcdef0123"),
		"retry_from_base": task + RetryNote(3, &Previous{Attempt: 2, Reason: ReasonTimeout, Detail: "wall budget 45m0s spent"}, ""),
		"retry_unknown":   task + RetryNote(2, nil, "0123456789abcdef0123"),
	}
	for name, got := range cases {
		t.Run(name, func(t *testing.T) {
			path := filepath.Join("testdata", name+".golden")
			if *update {
				if err := os.MkdirAll("testdata", 0o755); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			want, err := os.ReadFile(path)
			if err != nil {
				t.Fatalf("%v (run with -update to write it)", err)
			}
			if got != string(want) {
				t.Errorf("%s changed:\n--- got\n%s\n--- want\n%s", name, got, want)
			}
		})
	}
	if RetryNote(1, nil, "") != "" || RetryNote(2, nil, "") != "" {
		t.Error("a retry note with nothing to say")
	}
}
