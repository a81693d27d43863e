package egress

import (
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

func TestParseRules(t *testing.T) {
	for _, tc := range []struct {
		in, want string
		open     bool
	}{
		{"", "", false},
		{" , ,", "", false},
		{"github.com", "github.com", false},
		{"GitHub.COM.", "github.com", false},
		{"*.example.com", "*.example.com", false},
		{"api.example.com:8443", "api.example.com:8443", false},
		{"*", "*", true},
		{"*,github.com", "*,github.com", true},
		{"10.1.2.3", "10.1.2.3", false},
		{"10.1.2.3:5432", "10.1.2.3:5432", false},
		{"10.0.0.0/8", "10.0.0.0/8", false},
		{"10.9.9.9/8", "10.0.0.0/8", false}, // masked
		{"fd00::1", "fd00::1", false},
		{"[fd00::1]:443", "[fd00::1]:443", false},
		{"[fd00::/8]:443", "[fd00::/8]:443", false},
		{"::ffff:10.1.2.3", "10.1.2.3", false},
		{"my_host.internal", "my_host.internal", false},
		{"@go", "proxy.golang.org,sum.golang.org", false},
		{"@GO", "proxy.golang.org,sum.golang.org", false},
	} {
		r, err := ParseRules(tc.in)
		if err != nil {
			t.Errorf("ParseRules(%q): %v", tc.in, err)
			continue
		}
		if got := r.String(); got != tc.want || r.Open() != tc.open {
			t.Errorf("ParseRules(%q) = %q open=%v, want %q open=%v", tc.in, got, r.Open(), tc.want, tc.open)
		}
	}
}

func TestParseRulesErrors(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"exa mple.com", `entry "exa mple.com" is not a host name`},
		{"github.com,ex/ample", `entry "ex/ample" is not an address range`},
		{"10.0.0.0/33", `entry "10.0.0.0/33" is not an address range`},
		{"host:0", `entry "host:0" has port "0" (a port is 1 to 65535)`},
		{"host:http", `entry "host:http" has port "http"`},
		{"host:", `entry "host:" has an empty port`},
		{"[fd00::1", `entry "[fd00::1" has an unclosed [`},
		{"[fd00::1]x", `entry "[fd00::1]x" has text after ]`},
		{"*.com", `entry "*.com" is too wide a wildcard`},
		{"a.*.example.com", `entry "a.*.example.com" has a * that is not a leading *.`},
		{"ex*ample.com", `has a * that is not a leading *.`},
		{"-bad.example.com", `entry "-bad.example.com" is not a host name`},
		{"@nope", `entry "@nope" is not a known set (the sets: @crates, @github, @go,`},
		{strings.Repeat("a", 64) + ".com", `is not a host name`},
	} {
		_, err := ParseRules(tc.in)
		if err == nil {
			t.Errorf("ParseRules(%q): no error, want %q", tc.in, tc.want)
			continue
		}
		if !strings.Contains(err.Error(), tc.want) {
			t.Errorf("ParseRules(%q) = %q, want it to contain %q", tc.in, err, tc.want)
		}
		if !strings.Contains(err.Error(), "(use ") && !strings.Contains(err.Error(), "the sets:") {
			t.Errorf("ParseRules(%q) = %q: the error does not say what an entry may be", tc.in, err)
		}
	}
}

func TestSetsParse(t *testing.T) {
	for _, name := range SetNames() {
		r, err := ParseRules(name)
		if err != nil {
			t.Fatalf("set %s: %v", name, err)
		}
		if r.Empty() {
			t.Errorf("set %s allows nothing", name)
		}
	}
	reg := SetHosts("@registries")
	for _, s := range registrySets {
		for _, h := range sets[s] {
			if !slices.Contains(reg, h) {
				t.Errorf("@registries lacks %s (of @%s)", h, s)
			}
		}
	}
	if slices.Contains(reg, "github.com") {
		t.Error("@registries holds github.com: fetching any repository is its own set")
	}
	for engine := range engineHosts {
		if _, err := ParseRules(strings.Join(EngineHosts(engine), ",")); err != nil {
			t.Errorf("engine %s: %v", engine, err)
		}
	}
}

func TestEngineHostSet(t *testing.T) {
	s, err := ParseEngineHosts(" claude = llm-gw.example.com:443 ; codex=api.openai.com, chatgpt.com;devin=")
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		engine string
		env    []string
		want   []string
	}{
		{"claude", nil, []string{"llm-gw.example.com:443"}},
		{"codex", nil, []string{"api.openai.com", "chatgpt.com"}},
		{"devin", nil, nil},
		{"script", nil, nil},
		{"claude", []string{"ANTHROPIC_BASE_URL=https://gw2.example.com:8443/anthropic"}, []string{"llm-gw.example.com:443", "gw2.example.com:8443"}},
	} {
		if got := s.For(tc.engine, tc.env); !slices.Equal(got, tc.want) {
			t.Errorf("For(%s, %v) = %v, want %v", tc.engine, tc.env, got, tc.want)
		}
	}
	var none EngineHostSet
	if got := none.For("claude", []string{"ANTHROPIC_BASE_URL=http://[fd00::5]/v1"}); !slices.Equal(got, append(EngineHosts("claude"), "[fd00::5]")) {
		t.Errorf("built-in claude with an IPv6 base URL = %v", got)
	}
	for _, bad := range []string{"claude", "=x.com", "claude=ex/ample.com"} {
		if _, err := ParseEngineHosts(bad); err == nil {
			t.Errorf("ParseEngineHosts(%q): no error", bad)
		}
	}
}

// refusedAddr is the special address these tests have the proxy refuse: a
// documentation address (RFC 5737's TEST-NET-1, routed nowhere), and
// nothing is dialled whatever the proxy decides. No test names an address
// of the link-local range, where the cloud metadata service lives:
// TestSpecialKindAgreesWithTheStandardLibrary finds that range's
// addresses through the standard library. refusedNAT64 is refusedAddr
// inside NAT64's prefix.
const (
	refusedAddr  = "192.0.2.10"
	refusedNAT64 = "64:ff9b::c000:20a"
)

// TestSpecialKindAgreesWithTheStandardLibrary: every IPv4 address the
// standard library calls loopback, private, link-local, multicast or
// unspecified is special — alone, IPv4-mapped, inside NAT64 and inside
// 6to4 alike — and a link-local one is refused as where the cloud
// metadata service lives. One address in each /16, both ends of it.
func TestSpecialKindAgreesWithTheStandardLibrary(t *testing.T) {
	linkLocal := 0
	for hi := range 256 {
		for mid := range 256 {
			for _, lo := range [][2]byte{{0, 1}, {255, 254}} {
				v4 := netip.AddrFrom4([4]byte{byte(hi), byte(mid), lo[0], lo[1]})
				if !(v4.IsLoopback() || v4.IsPrivate() || v4.IsLinkLocalUnicast() || v4.IsMulticast() || v4.IsUnspecified()) {
					continue
				}
				b := v4.As4()
				forms := []netip.Addr{
					v4,
					netip.AddrFrom16(v4.As16()), // ::ffff:a.b.c.d
					netip.AddrFrom16([16]byte{0, 0x64, 0xff, 0x9b, 10: 0, 11: 0, 12: b[0], 13: b[1], 14: b[2], 15: b[3]}),
					netip.AddrFrom16([16]byte{0x20, 0x02, b[0], b[1], b[2], b[3], 15: 1}),
				}
				for _, a := range forms {
					kind := specialKind(a)
					if kind == "" {
						t.Fatalf("specialKind(%s) is not special (the standard library says %s is)", a, v4)
					}
					if v4.IsLinkLocalUnicast() && !strings.Contains(kind, "cloud metadata service") {
						t.Fatalf("specialKind(%s) = %q, want the metadata service's range named", a, kind)
					}
				}
				if v4.IsLinkLocalUnicast() {
					linkLocal++
				}
			}
		}
	}
	if linkLocal == 0 {
		t.Fatal("no link-local address was sampled")
	}
}

func TestSpecialKind(t *testing.T) {
	for _, tc := range []struct {
		addr    string
		special bool
	}{
		{"127.0.0.1", true},
		{"127.255.0.9", true},
		{"::1", true},
		{"10.1.2.3", true},
		{"172.16.0.1", true},
		{"172.32.0.1", false},
		{"192.168.1.1", true},
		{"100.64.0.1", true}, // carrier-grade NAT
		{"0.0.0.0", true},
		{"::", true},
		{"224.0.0.1", true},
		{"255.255.255.255", true},
		{"fe80::1", true},
		{"fe80::1%eth0", true},
		{"fd12:3456::7", true}, // unique local
		{"::ffff:127.0.0.1", true},
		{"::ffff:" + refusedAddr, true},
		{refusedNAT64, true},          // NAT64 of refusedAddr
		{"64:ff9b::808:808", false},   // NAT64 of 8.8.8.8
		{"2002:c000:20a::1", true},    // 6to4 of refusedAddr
		{"2002:808:808::1", false},    // 6to4 of 8.8.8.8
		{"2001:db8::1", true},         // documentation
		{"2001:0:4136:e378::1", true}, // Teredo
		{"8.8.8.8", false},
		{"140.82.112.3", false},
		{"2606:4700::6810:84e5", false},
	} {
		got := specialKind(netip.MustParseAddr(tc.addr)) != ""
		if got != tc.special {
			t.Errorf("specialKind(%s) special=%v, want %v", tc.addr, got, tc.special)
		}
	}
}

// TestDecisions is the proxy's two decisions as a table: on the name
// before any lookup, then on the addresses it resolved to.
func TestDecisions(t *testing.T) {
	for _, tc := range []struct {
		rules, host string
		port        int
		resolved    []string // nil: the name is refused before a lookup
		refused     string   // "" allowed, else a part of why
	}{
		{"github.com", "github.com", 443, []string{"140.82.112.3"}, ""},
		{"github.com", "github.com", 22, []string{"140.82.112.3"}, ""},
		{"github.com:443", "github.com", 22, nil, "github.com is allowed on port 443 only: add github.com:22"},
		{"github.com", "api.github.com", 443, nil, "api.github.com is not allowed: add it to AQ_SANDBOX_NET"},
		{"*.github.com", "api.github.com", 443, []string{"140.82.112.6"}, ""},
		{"*.github.com", "a.b.github.com", 443, []string{"140.82.112.6"}, ""},
		{"*.github.com", "github.com", 443, nil, "not allowed"},
		{"*.github.com", "evilgithub.com", 443, nil, "not allowed"},
		{"", "github.com", 443, nil, "not allowed"},
		{"*", "anything.example", 443, []string{"93.184.215.14"}, ""},
		// A name that resolves to a special address is refused, whatever
		// allowed the name.
		{"*", "rebind.example", 443, []string{refusedAddr}, "rebind.example resolved to " + refusedAddr + ", a documentation address"},
		{"db.internal", "db.internal", 5432, []string{"10.1.2.3"}, "resolved to 10.1.2.3, a private address: name the address or its range"},
		{"db.internal,10.0.0.0/8", "db.internal", 5432, []string{"10.1.2.3"}, ""},
		{"db.internal,10.0.0.0/8:5432", "db.internal", 22, []string{"10.1.2.3"}, "a private address"},
		// "localhost" named is the loopback addresses (RFC 6761), and no
		// other special one.
		{"localhost", "localhost", 8080, []string{"127.0.0.1", "::1"}, ""},
		{"localhost:8080", "localhost", 8080, []string{"127.0.0.1", "::1"}, ""},
		{"localhost:8080", "localhost", 8081, nil, "localhost is allowed on port 8080 only"},
		{"localhost", "localhost", 8080, []string{"10.0.0.1"}, "resolved to 10.0.0.1, a private address"},
		{"*", "localhost", 8080, []string{"127.0.0.1"}, "resolved to 127.0.0.1, a loopback address"},
		{"*", "mixed.example", 443, []string{"140.82.112.3", "10.0.0.1"}, "resolved to 10.0.0.1"},
		{"*", "mapped.example", 443, []string{"::ffff:127.0.0.1"}, "resolved to 127.0.0.1, a loopback address"},
		// Addresses named in the request.
		{"*", refusedAddr, 80, nil, refusedAddr + " is a documentation address: name it"},
		{"*", "10.0.0.5", 443, nil, "a private address"},
		{"*", "fd12:3456::7", 80, nil, "a private (unique local) address"},
		{"*", "8.8.8.8", 443, []string{"8.8.8.8"}, ""},
		{"github.com", "8.8.8.8", 443, nil, "8.8.8.8 is not allowed"},
		{"8.8.8.8", "8.8.8.8", 443, []string{"8.8.8.8"}, ""},
		{"127.0.0.1", "127.0.0.1", 9999, []string{"127.0.0.1"}, ""},
		{"127.0.0.0/8:9999", "127.0.0.2", 9999, []string{"127.0.0.2"}, ""},
		{"127.0.0.0/8:9999", "127.0.0.2", 9998, nil, "a loopback address"},
	} {
		r, err := ParseRules(tc.rules)
		if err != nil {
			t.Fatalf("rules %q: %v", tc.rules, err)
		}
		why := r.refuseName(tc.host, tc.port)
		if why == "" {
			if tc.resolved == nil {
				t.Errorf("%q on %s:%d: the name passed, want it refused before a lookup (%q)", tc.rules, tc.host, tc.port, tc.refused)
				continue
			}
			var addrs []netip.Addr
			for _, a := range tc.resolved {
				addrs = append(addrs, netip.MustParseAddr(a))
			}
			why = r.refuseAddrs(tc.host, tc.port, addrs)
		} else if tc.resolved != nil {
			t.Errorf("%q on %s:%d: refused before a lookup (%q), want a lookup", tc.rules, tc.host, tc.port, why)
			continue
		}
		switch {
		case tc.refused == "" && why != "":
			t.Errorf("%q on %s:%d: refused (%s), want allowed", tc.rules, tc.host, tc.port, why)
		case tc.refused != "" && !strings.Contains(why, tc.refused):
			t.Errorf("%q on %s:%d: %q, want refused with %q", tc.rules, tc.host, tc.port, why, tc.refused)
		}
	}
}

// TestGatewayDecisions: an engine's gateway named by a host name is
// allowed on its port whatever it resolves to (loopback, private) but a
// link-local address; named by an address, that address; nothing else
// gains from it.
func TestGatewayDecisions(t *testing.T) {
	r, err := ParseRules("github.com")
	if err != nil {
		t.Fatal(err)
	}
	r, err = r.WithGateways([]string{"llm-gw.internal:4000", "127.0.0.1:8080", "[::1]:8081", "localhost:9090"})
	if err != nil {
		t.Fatal(err)
	}
	// A link-local address, found through the standard library (no test
	// names one).
	var ll netip.Addr
	for a := netip.AddrFrom4([4]byte{169, 0, 0, 1}); ; a = a.Next() {
		if a.IsLinkLocalUnicast() {
			ll = a
			break
		}
	}
	for _, tc := range []struct {
		host     string
		port     int
		resolved []string
		refused  string
	}{
		{"llm-gw.internal", 4000, []string{"127.0.0.1"}, ""},
		{"llm-gw.internal", 4000, []string{"10.1.2.3", "fd00::7"}, ""},
		{"llm-gw.internal", 4000, []string{"140.82.112.3"}, ""},
		{"llm-gw.internal", 4000, []string{"10.1.2.3", ll.String()}, "an engine's gateway) resolved to " + ll.String() + ", a link-local address"},
		{"llm-gw.internal", 4000, []string{"::ffff:" + ll.String()}, "a link-local address"},
		{"llm-gw.internal", 22, nil, "llm-gw.internal is allowed on port 4000 only"},
		{"127.0.0.1", 8080, []string{"127.0.0.1"}, ""},
		{"127.0.0.1", 8081, nil, "a loopback address"},
		{"::1", 8081, []string{"::1"}, ""},
		{"localhost", 9090, []string{"127.0.0.1", "::1"}, ""},
		{"github.com", 443, []string{"127.0.0.1"}, "github.com resolved to 127.0.0.1, a loopback address"},
	} {
		why := r.refuseName(tc.host, tc.port)
		if why == "" && tc.resolved != nil {
			var addrs []netip.Addr
			for _, a := range tc.resolved {
				addrs = append(addrs, netip.MustParseAddr(a))
			}
			why = r.refuseAddrs(tc.host, tc.port, addrs)
		}
		switch {
		case tc.refused == "" && why != "":
			t.Errorf("%s:%d %v: refused (%s), want allowed", tc.host, tc.port, tc.resolved, why)
		case tc.refused != "" && !strings.Contains(why, tc.refused):
			t.Errorf("%s:%d %v: %q, want refused with %q", tc.host, tc.port, tc.resolved, why, tc.refused)
		}
	}
	if got, want := r.Loopbacks(), []string{"127.0.0.1:8080", "[::1]:8081", "localhost:9090"}; !slices.Equal(got, want) {
		t.Errorf("Loopbacks() = %v, want %v", got, want)
	}
	for _, bad := range []string{"*", "*.example.com:443", "ex ample:80"} {
		if _, err := r.WithGateways([]string{bad}); err == nil || !strings.Contains(err.Error(), "gateway") {
			t.Errorf("WithGateways(%q) = %v, want an error naming the gateway", bad, err)
		}
	}
}

// TestLoopbacks: the loopback destinations AQ_SANDBOX_NET names one by
// one with a port are what a sandbox bridges; ranges, other addresses and
// entries without a port are not.
func TestLoopbacks(t *testing.T) {
	r, err := ParseRules("localhost:3000,127.0.0.1:8080,127.0.0.2:8080,[::1]:5000,127.0.0.1,127.0.0.0/8:9999,10.1.2.3:80,localhost,github.com:443,127.0.0.1:8080")
	if err != nil {
		t.Fatal(err)
	}
	if got, want := r.Loopbacks(), []string{"127.0.0.1:8080", "127.0.0.2:8080", "[::1]:5000", "localhost:3000"}; !slices.Equal(got, want) {
		t.Errorf("Loopbacks() = %v, want %v", got, want)
	}
}

func TestEnv(t *testing.T) {
	env := Env("http://127.0.0.1:3128", []string{"PATH=/bin", "HTTPS_PROXY=http://corp:8080", "JAVA_TOOL_OPTIONS=-Xmx1g"})
	get := func(k string) (string, int) {
		v, n := "", 0
		for _, kv := range env {
			if key, val, _ := strings.Cut(kv, "="); key == k {
				v, n = val, n+1
			}
		}
		return v, n
	}
	for _, k := range []string{"HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy"} {
		if v, n := get(k); v != "http://127.0.0.1:3128" || n != 1 {
			t.Errorf("%s = %q (%d times)", k, v, n)
		}
	}
	if v, _ := get("NODE_USE_ENV_PROXY"); v != "1" {
		t.Errorf("NODE_USE_ENV_PROXY = %q", v)
	}
	if v, _ := get("PATH"); v != "/bin" {
		t.Errorf("PATH = %q", v)
	}
	if v, n := get("JAVA_TOOL_OPTIONS"); n != 1 || !strings.HasPrefix(v, "-Xmx1g ") || !strings.Contains(v, "-Dhttps.proxyHost=127.0.0.1 -Dhttps.proxyPort=3128") {
		t.Errorf("JAVA_TOOL_OPTIONS = %q (%d times)", v, n)
	}
}

// TestSetsDocumented: docs/sandbox.md's table of sets and of engine hosts
// say what the code allows.
func TestSetsDocumented(t *testing.T) {
	b, err := os.ReadFile(filepath.Join("..", "..", "docs", "sandbox.md"))
	if err != nil {
		t.Fatal(err)
	}
	doc := string(b)
	row := func(first string) []string {
		for _, line := range strings.Split(doc, "\n") {
			if strings.HasPrefix(line, "| `"+first+"` |") {
				cells := strings.Split(line, "|")
				var names []string
				for _, f := range strings.Split(cells[2], ",") {
					f = strings.TrimSpace(f)
					if n, ok := strings.CutPrefix(f, "`"); ok {
						n, _, _ = strings.Cut(n, "`")
						names = append(names, n)
					}
				}
				if len(names) > 0 || first == "script" {
					return names
				}
			}
		}
		t.Errorf("docs/sandbox.md has no row for %s", first)
		return nil
	}
	for _, name := range SetNames() {
		want := SetHosts(name)
		if name == "@registries" {
			want = nil
			for _, s := range registrySets {
				want = append(want, "@"+s)
			}
		}
		if got := row(name); !slices.Equal(got, want) {
			t.Errorf("docs/sandbox.md lists %s as %v, the code as %v", name, got, want)
		}
	}
	for engine, hosts := range engineHosts {
		got := row(engine)
		if len(hosts) == 0 {
			hosts = nil
		}
		if !slices.Equal(got, hosts) {
			t.Errorf("docs/sandbox.md lists %s's hosts as %v, the code as %v", engine, got, hosts)
		}
	}
}
