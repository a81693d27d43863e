package hostile

import (
	"os/exec"
	"reflect"
	"strings"
	"testing"

	"github.com/aqfleet/aq/internal/sandbox"
)

// TestEveryEscapeIsProbed: each escape judged here is one the script tries
// (a renamed probe would otherwise read as "not run" everywhere, or be
// judged by nobody).
func TestEveryEscapeIsProbed(t *testing.T) {
	for _, p := range Escapes {
		if !strings.Contains(Script, "probe "+p.Name+" ") {
			t.Errorf("the script has no probe %s", p.Name)
		}
	}
	for _, l := range strings.Split(Script, "\n") {
		f := strings.Fields(l)
		if len(f) < 2 || f[0] != "probe" || strings.HasPrefix(f[1], "env_") {
			continue
		}
		found := false
		for _, p := range Escapes {
			found = found || p.Name == f[1]
		}
		if !found {
			t.Errorf("probe %s is judged by nobody", f[1])
		}
	}
}

func TestDenied(t *testing.T) {
	names := func(ps []Probe) []string {
		var out []string
		for _, p := range ps {
			out = append(out, p.Name)
		}
		return out
	}
	if got := names(Denied(sandbox.LevelFull, sandbox.GuaranteeProcesses)); !reflect.DeepEqual(got, []string{"see_aq", "signal_aq", "read_aq_environ"}) {
		t.Errorf("full, processes: %q", got)
	}
	if got := names(Denied(sandbox.LevelPartial, sandbox.GuaranteeProcesses)); !reflect.DeepEqual(got, []string{"signal_aq", "read_aq_environ"}) {
		t.Errorf("partial, processes (they stay visible): %q", got)
	}
	if got := Denied(sandbox.LevelNone, sandbox.GuaranteeFiles); len(got) != 0 {
		t.Errorf("none denies %v", got)
	}
	if n := len(Denied(sandbox.LevelFull, sandbox.GuaranteeFiles)); n != 13 {
		t.Errorf("full, files: %d probes", n)
	}
}

// TestEscaped: a probe that worked, or never ran, is an escape; one
// judged on the host is the caller's.
func TestEscaped(t *testing.T) {
	got := Parse("noise\nPROBE read_ssh_key ok\nPROBE read_aq_credentials denied\nPROBE write_home ok\nPROBE x y z\n")
	ps := []Probe{{Name: "read_ssh_key"}, {Name: "read_aq_credentials"}, {Name: "read_gh_token"}, {Name: "write_home", OnHost: true}}
	if e := Escaped(ps, got); !reflect.DeepEqual(e, []string{"read_ssh_key (ok)", "read_gh_token (not run)"}) {
		t.Errorf("Escaped: %q", e)
	}
}

// TestCommand: the job's script line runs the script with every argument
// as one word, whatever the paths hold.
func TestCommand(t *testing.T) {
	a := Args{AQHome: "/tmp/a q", RepoBase: "/r", UserHome: "/h'x", Port: 1, CoordPort: 2, ForbiddenPort: 3, AQBin: "/bin/aq", AQPIDs: []int{7, 8}, Nonce: "n1", Repo: "app"}
	cmd := a.Command("hostile.sh")
	out, err := exec.Command("bash", "-c", `f() { shift; printf '[%s]' "$@"; }; eval "f ${0#bash }"`, cmd).Output()
	if err != nil {
		t.Fatal(err)
	}
	if want := "[/tmp/a q][/r][/h'x][1][2][3][/bin/aq][n1][app][7,8]"; string(out) != want {
		t.Errorf("%s\n parsed %s\n want   %s", cmd, out, want)
	}
}
