package job

import (
	"strings"
	"testing"
)

func TestParseRequirement(t *testing.T) {
	t.Parallel()
	tests := []struct {
		in      string
		want    Requirement
		wantErr string
	}{
		{in: "os:linux", want: Requirement{Kind: "os", Value: "linux"}},
		{in: "  has:git ", want: Requirement{Kind: "has", Value: "git"}},
		{in: "node:>=20", want: Requirement{Kind: "node", Op: ">=", Value: "20"}},
		{in: "node:=20", want: Requirement{Kind: "node", Value: "20"}},
		{in: "node:< 22", want: Requirement{Kind: "node", Op: "<", Value: "22"}},
		{in: "repo:learning_ai_notes", want: Requirement{Kind: "repo", Value: "learning_ai_notes"}},
		{in: "gpu:a100", wantErr: "unknown kind"},
		{in: "linux", wantErr: "not kind:value"},
		{in: "has:", wantErr: "not kind:value"},
		{in: "has:>=2", wantErr: "only allowed for node"},
		{in: "node:>=twenty", wantErr: "major version number"},
		{in: "repo:../etc", wantErr: "invalid value"},
		{in: "sandbox:full", want: Requirement{Kind: "sandbox", Value: "full"}},
		{in: "sandbox:partial", want: Requirement{Kind: "sandbox", Value: "partial"}},
		{in: "sandbox:linux", wantErr: "the sandbox levels are full and partial"},
		{in: "sandbox:>=partial", wantErr: "only allowed for node"},
	}
	for _, tc := range tests {
		got, err := ParseRequirement(tc.in)
		if tc.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("ParseRequirement(%q) error = %v, want it to contain %q", tc.in, err, tc.wantErr)
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("ParseRequirement(%q) = %+v, %v; want %+v", tc.in, got, err, tc.want)
		}
	}
}

func TestRequirementSatisfied(t *testing.T) {
	t.Parallel()
	tests := []struct {
		req, offered string
		want         bool
	}{
		{"node:>=20", "20", true},
		{"node:>=20", "22", true},
		{"node:>=20", "18", false},
		{"node:>20", "20", false},
		{"node:<=20", "20", true},
		{"node:<20", "18", true},
		{"node:20", "20", true},
		{"node:20", "21", false},
		{"node:>=20", "x", false},
		{"has:git", "git", true},
		{"has:git", "gh", false},
	}
	for _, tc := range tests {
		r, err := ParseRequirement(tc.req)
		if err != nil {
			t.Fatal(err)
		}
		if got := r.Satisfied(tc.offered); got != tc.want {
			t.Errorf("%s.Satisfied(%q) = %v, want %v", tc.req, tc.offered, got, tc.want)
		}
	}
}
