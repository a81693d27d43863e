//go:build !unit

package localrun

import (
	"strings"
	"testing"

	"github.com/aqfleet/aq/cmd/aq/clitest"
	"github.com/aqfleet/aq/job"
)

// TestMalformedBaseURL (#33, bad input): a base URL no engine could call —
// no scheme, a path alone — stops aq run and aq daemon before anything
// runs: exit 2, one line naming the variable and what to set; the queued
// job is untouched.
func TestMalformedBaseURL(t *testing.T) {
	h := clitest.BinHome(t)
	h.Repo(t, "app", map[string]string{"README.md": "app\n"})
	h.Submit(t, "gw", clitest.ScriptJob("app", "echo hi > hi.txt"))
	for _, tc := range []struct {
		env  string
		args []string
		want string
	}{
		{"ANTHROPIC_BASE_URL=llm-gw.example.com", []string{"run", "--once"}, `ANTHROPIC_BASE_URL="llm-gw.example.com" has no scheme (http:// or https://)`},
		{"OPENAI_BASE_URL=/v1", []string{"run", "--once"}, `OPENAI_BASE_URL="/v1" has no scheme`},
		// A fleet factory's settings, at a closed loopback port: nothing is
		// dialled before the check.
		{"OPENAI_BASE_URL=/v1\x00AQ_FLEET=1\x00AQ_FLEET_API=http://127.0.0.1:1/api\x00AQ_FLEET_TOKEN=aqf_test", []string{"daemon"}, `OPENAI_BASE_URL="/v1" has no scheme`},
	} {
		env := h.Env
		h.Env = append(append([]string{}, env...), strings.Split(tc.env, "\x00")...)
		r := h.Run(t, tc.args...)
		h.Env = env
		if r.Code != 2 || strings.Count(strings.TrimSpace(r.Stderr), "\n") != 0 ||
			!strings.Contains(r.Stderr, tc.want) || !strings.Contains(r.Stderr, "set it to a URL such as") {
			t.Errorf("%q aq %s: %s", tc.env, strings.Join(tc.args, " "), r)
		}
	}
	if v := show(t, h, "gw"); v.State.Stage != job.Inbox || v.State.Attempts != 0 {
		t.Fatalf("the job ran under a malformed base URL: %+v", v.State)
	}
}
