package brief

import (
	"strings"
	"testing"
	"unicode/utf8"
)

func TestClip(t *testing.T) {
	for _, tc := range []struct {
		in   string
		max  int
		want string
	}{
		{"short", 10, "short"},
		{"exactly10!", 10, "exactly10!"},
		{"a longer line", 8, "a longer…"},
		{"no limit", 0, "no limit"},
		{"héllo wörld", 2, "h…"}, // é is two bytes: never cut inside it
		{"日本語のテキスト", 4, "日…"},    // three-byte runes
		{"", 5, ""},
	} {
		got := Clip(tc.in, tc.max)
		if got != tc.want {
			t.Errorf("Clip(%q, %d) = %q, want %q", tc.in, tc.max, got, tc.want)
		}
		if !utf8.ValidString(got) {
			t.Errorf("Clip(%q, %d) = %q is not valid UTF-8", tc.in, tc.max, got)
		}
	}
}

func TestOneLine(t *testing.T) {
	for _, tc := range []struct {
		in   string
		max  int
		want string
	}{
		{"  one\ntwo\r\n\tthree  ", 0, "one two three"},
		{"plain", 0, "plain"},
		{"a b\nc d", 5, "a b c…"},
		{"\n\n", 0, ""},
	} {
		if got := OneLine(tc.in, tc.max); got != tc.want {
			t.Errorf("OneLine(%q, %d) = %q, want %q", tc.in, tc.max, got, tc.want)
		}
	}
}

func TestFirstLine(t *testing.T) {
	for _, tc := range []struct {
		in   string
		max  int
		want string
	}{
		{"\n\n  git version 2.39.5  \nmore\n", 0, "git version 2.39.5"},
		{"fatal: bad\r\nhint: x", 0, "fatal: bad"},
		{"   \n\t\n", 0, ""},
		{strings.Repeat("x", 20) + "\nnext", 10, strings.Repeat("x", 10) + "…"},
	} {
		if got := FirstLine(tc.in, tc.max); got != tc.want {
			t.Errorf("FirstLine(%q, %d) = %q, want %q", tc.in, tc.max, got, tc.want)
		}
	}
}

func TestHead(t *testing.T) {
	for in, want := range map[string]string{
		"one line":              "one line",
		"first\nsecond":         "first …",
		"first\r\nsecond":       "first …",
		"":                      "",
		"panic: x\n\ngoroutine": "panic: x …",
	} {
		if got := Head(in); got != want {
			t.Errorf("Head(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestSHA(t *testing.T) {
	if got := SHA("0123456789abcdef0123"); got != "0123456789ab" {
		t.Errorf("SHA = %q", got)
	}
	if got := SHA("abc"); got != "abc" {
		t.Errorf("SHA(short) = %q", got)
	}
}
