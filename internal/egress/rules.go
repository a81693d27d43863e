package egress

import (
	"errors"
	"fmt"
	"net/netip"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
)

// Rules say which destinations the proxy lets through (docs/sandbox.md,
// "Network"). The zero value allows nothing.
type Rules struct {
	open  bool
	hosts []hostRule
	addrs []addrRule
	sets  []string // the sets named, for String
}

// hostRule allows a name (or, wildcard, every name below it) on one port
// or, port 0, on any.
type hostRule struct {
	name     string // lower case, no trailing dot
	wildcard bool   // "*.name": names below name, not name itself
	port     int
	// gateway: an engine's gateway (the host of its base URL), allowed
	// whatever address it resolves to but a link-local one: the operator
	// chose it (WithGateways).
	gateway bool
}

// addrRule allows the addresses of a range on one port or, port 0, on any;
// naming an address is what lets the proxy reach a special one.
type addrRule struct {
	prefix netip.Prefix
	port   int
}

// Syntax is the one-line reminder of an entry's forms, for error messages.
const Syntax = "host, *.domain, host:port, an address or range (10.1.2.3, 10.0.0.0/8, [fd00::/8]:443), * for open egress, or a set such as @registries"

// ParseRules reads a comma-separated list (AQ_SANDBOX_NET): each entry is
// a host name (any port), "*.domain" (the names below domain), "host:port"
// (that port only), an IP address or range, optionally with ":port" (IPv6
// in brackets), "*" (any public host), or a named set ("@registries",
// "@npm", … — Sets). Blank entries are ignored. An error names the entry
// and what the entry may be.
func ParseRules(list string) (Rules, error) {
	var r Rules
	for _, raw := range strings.Split(list, ",") {
		e := strings.TrimSpace(raw)
		if e == "" {
			continue
		}
		if name, ok := strings.CutPrefix(e, "@"); ok {
			set, known := sets[strings.ToLower(name)]
			if !known {
				return Rules{}, fmt.Errorf("entry %q is not a known set (the sets: %s)", e, strings.Join(SetNames(), ", "))
			}
			for _, h := range set {
				if err := r.add(h); err != nil {
					return Rules{}, fmt.Errorf("set %s: %w", e, err) // a bug in the table; its test catches it
				}
			}
			if !slices.Contains(r.sets, "@"+strings.ToLower(name)) {
				r.sets = append(r.sets, "@"+strings.ToLower(name))
			}
			continue
		}
		if err := r.add(e); err != nil {
			return Rules{}, err
		}
	}
	return r, nil
}

var labelRE = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^[a-z0-9_]([a-z0-9_-]{0,61}[a-z0-9_])?$`) })

// add parses one entry that is not a set.
func (r *Rules) add(e string) error {
	bad := func(why string) error {
		return fmt.Errorf("entry %q %s (use %s)", e, why, Syntax)
	}
	if e == "*" {
		r.open = true
		return nil
	}
	hostPart, port, err := splitPort(e)
	if err != nil {
		return bad(err.Error())
	}
	if p, err := parsePrefix(hostPart); err == nil {
		r.addrs = append(r.addrs, addrRule{prefix: p, port: port})
		return nil
	} else if strings.Contains(hostPart, "/") || strings.HasPrefix(e, "[") {
		return bad("is not an address range")
	}
	name := strings.TrimSuffix(strings.ToLower(hostPart), ".")
	wildcard := false
	if rest, ok := strings.CutPrefix(name, "*."); ok {
		name, wildcard = rest, true
	}
	if name == "" || len(name) > 253 {
		return bad("is not a host name")
	}
	labels := strings.Split(name, ".")
	for _, l := range labels {
		if !labelRE().MatchString(l) {
			if strings.Contains(l, "*") {
				return bad("has a * that is not a leading *. (a wildcard is *.domain, for the names below domain)")
			}
			return bad("is not a host name")
		}
	}
	if wildcard && len(labels) < 2 {
		return bad("is too wide a wildcard (name a domain of at least two labels, e.g. *.example.com; * alone opens all egress)")
	}
	if _, err := netip.ParseAddr(name); err == nil {
		return bad("is not an address")
	}
	r.hosts = append(r.hosts, hostRule{name: name, wildcard: wildcard, port: port})
	return nil
}

// splitPort splits "host:port" and "[v6]:port"; port 0 means none given.
func splitPort(e string) (string, int, error) {
	host, port := e, ""
	switch {
	case strings.HasPrefix(e, "["):
		end := strings.Index(e, "]")
		if end < 0 {
			return "", 0, errors.New("has an unclosed [")
		}
		host = e[1:end]
		if rest := e[end+1:]; rest != "" {
			p, ok := strings.CutPrefix(rest, ":")
			if !ok {
				return "", 0, errors.New("has text after ]")
			}
			port = p
		}
	case strings.Count(e, ":") == 1:
		host, port, _ = strings.Cut(e, ":")
	case strings.Count(e, ":") > 1:
		// A bare IPv6 address or range: no port.
	}
	if port == "" {
		if strings.HasSuffix(e, ":") {
			return "", 0, errors.New("has an empty port")
		}
		return host, 0, nil
	}
	n, err := strconv.Atoi(port)
	if err != nil || n < 1 || n > 65535 {
		return "", 0, fmt.Errorf("has port %q (a port is 1 to 65535)", port)
	}
	return host, n, nil
}

// parsePrefix reads an address (a one-address range) or a range.
func parsePrefix(s string) (netip.Prefix, error) {
	if strings.Contains(s, "/") {
		p, err := netip.ParsePrefix(s)
		if err != nil {
			return netip.Prefix{}, err
		}
		return p.Masked(), nil
	}
	a, err := netip.ParseAddr(s)
	if err != nil {
		return netip.Prefix{}, err
	}
	if a.Zone() != "" {
		return netip.Prefix{}, errors.New("zoned address")
	}
	return netip.PrefixFrom(a.Unmap(), a.Unmap().BitLen()), nil
}

// Union is r with everything o allows as well.
func (r Rules) Union(o Rules) Rules {
	out := Rules{open: r.open || o.open}
	out.hosts = append(slices.Clip(r.hosts), o.hosts...)
	out.addrs = append(slices.Clip(r.addrs), o.addrs...)
	out.sets = slices.Clip(r.sets)
	for _, s := range o.sets {
		if !slices.Contains(out.sets, s) {
			out.sets = append(out.sets, s)
		}
	}
	return out
}

// Open reports whether any public host is allowed ("*").
func (r Rules) Open() bool { return r.open }

// Empty reports whether the rules allow nothing.
func (r Rules) Empty() bool { return !r.open && len(r.hosts) == 0 && len(r.addrs) == 0 }

// String is the rules as an AQ_SANDBOX_NET list (sets expanded), for logs.
func (r Rules) String() string {
	var parts []string
	if r.open {
		parts = append(parts, "*")
	}
	for _, h := range r.hosts {
		s := h.name
		if h.wildcard {
			s = "*." + s
		}
		if h.port != 0 {
			s += ":" + strconv.Itoa(h.port)
		}
		parts = append(parts, s)
	}
	for _, a := range r.addrs {
		s := a.prefix.String()
		if a.prefix.IsSingleIP() {
			s = a.prefix.Addr().String()
		}
		if a.port != 0 {
			if a.prefix.Addr().Is6() {
				s = "[" + s + "]"
			}
			s += ":" + strconv.Itoa(a.port)
		}
		parts = append(parts, s)
	}
	return strings.Join(parts, ",")
}

// nameAllowed reports whether a rule allows name on port; ports lists the
// ports a rule allows name on when port is not among them.
func (r Rules) nameAllowed(name string, port int) (ok bool, ports []int) {
	for _, h := range r.hosts {
		match := name == h.name
		if h.wildcard {
			match = strings.HasSuffix(name, "."+h.name)
		}
		if !match {
			continue
		}
		if h.port == 0 || h.port == port {
			return true, nil
		}
		ports = append(ports, h.port)
	}
	return false, ports
}

// addrNamed reports whether an address rule covers a on port.
func (r Rules) addrNamed(a netip.Addr, port int) bool {
	a = a.Unmap().WithZone("")
	for _, ar := range r.addrs {
		if ar.prefix.Contains(a) && (ar.port == 0 || ar.port == port) {
			return true
		}
	}
	return false
}

// normalHost is host as the rules compare it: lower case, no trailing dot,
// an address without brackets.
func normalHost(host string) string {
	host = strings.TrimSuffix(strings.ToLower(host), ".")
	return strings.TrimSuffix(strings.TrimPrefix(host, "["), "]")
}

// refuseName is the first decision, taken before any DNS query (so a name
// the rules refuse is never looked up): "" when host may be dialled on
// port, subject to the address check; else why not.
func (r Rules) refuseName(host string, port int) string {
	if a, err := netip.ParseAddr(host); err == nil {
		switch {
		case r.addrNamed(a, port):
			return ""
		case specialKind(a) != "":
			return fmt.Sprintf("%s is %s: name it or its range in AQ_SANDBOX_NET to allow it", a, specialKind(a))
		case r.open:
			return ""
		}
		return fmt.Sprintf("%s is not allowed: add it to AQ_SANDBOX_NET", a)
	}
	if r.open {
		return ""
	}
	ok, ports := r.nameAllowed(host, port)
	switch {
	case ok:
		return ""
	case len(ports) > 0:
		slices.Sort(ports)
		ps := make([]string, len(ports))
		for i, p := range ports {
			ps[i] = strconv.Itoa(p)
		}
		return fmt.Sprintf("%s is allowed on port %s only: add %s:%d to AQ_SANDBOX_NET", host, strings.Join(ps, ", "), host, port)
	}
	return fmt.Sprintf("%s is not allowed: add it to AQ_SANDBOX_NET", host)
}

// refuseAddrs is the second decision, on what host resolved to: "" when
// every address may be dialled, else why not. One special address among
// the answers refuses the name: an answer that mixes public and private
// addresses is what a rebinding attack looks like. Two names are judged
// otherwise: an engine's gateway (WithGateways) may resolve to any address
// but a link-local one, and "localhost", when a rule names it, to the
// loopback addresses (what it means: RFC 6761).
func (r Rules) refuseAddrs(host string, port int, addrs []netip.Addr) string {
	gateway, localhost := r.gatewayAllowed(host, port), false
	if host == "localhost" {
		localhost, _ = r.nameAllowed(host, port)
	}
	for _, a := range addrs {
		kind := specialKind(a)
		switch {
		case kind == "" || r.addrNamed(a, port):
			continue
		case gateway && !linkLocal(a):
			continue
		case localhost && loopback(a):
			continue
		case gateway:
			return fmt.Sprintf("%s (an engine's gateway) resolved to %s, %s: a gateway is allowed any address but a link-local one", host, a.Unmap(), kind)
		}
		return fmt.Sprintf("%s resolved to %s, %s: name the address or its range in AQ_SANDBOX_NET to allow it", host, a.Unmap(), kind)
	}
	return ""
}

// gatewayAllowed reports whether a gateway rule names host on port.
func (r Rules) gatewayAllowed(host string, port int) bool {
	for _, h := range r.hosts {
		if h.gateway && h.name == host && (h.port == 0 || h.port == port) {
			return true
		}
	}
	return false
}

// WithGateways is r with the engines' gateways allowed: each "host:port"
// (the host and port of an engine's base URL, ANTHROPIC_BASE_URL or
// OPENAI_BASE_URL, wherever it was set). A gateway named by an address is
// that address allowed (naming it is what lets the proxy reach a special
// one); a gateway named by a host name is that name allowed on that port
// whatever address it resolves to — loopback, private — but a link-local
// one (the cloud metadata service lives there): the operator chose it.
// Everything else keeps the special-address refusals. An error names the
// entry.
func (r Rules) WithGateways(hostports []string) (Rules, error) {
	out := r.Union(Rules{})
	for _, hp := range hostports {
		var g Rules
		if err := g.add(hp); err != nil {
			return Rules{}, fmt.Errorf("gateway %w", err)
		}
		if g.open || len(g.hosts) > 0 && g.hosts[0].wildcard {
			return Rules{}, fmt.Errorf("gateway %q is not a host:port", hp)
		}
		for i := range g.hosts {
			g.hosts[i].gateway = true
		}
		out.hosts = append(out.hosts, g.hosts...)
		out.addrs = append(out.addrs, g.addrs...)
	}
	return out, nil
}

// Loopbacks are the loopback destinations the rules name one by one with a
// port, as "host:port": a loopback address ("127.0.0.1:8080",
// "[::1]:8080") or "localhost:8080". A sandbox with a network namespace
// of its own bridges each: inside it, the same address and port lead
// through the job's proxy to the host's (NO_PROXY sends loopback direct,
// and the sandbox's own loopback is not the host's). Sorted, without
// duplicates.
func (r Rules) Loopbacks() []string {
	var out []string
	for _, h := range r.hosts {
		if h.name == "localhost" && !h.wildcard && h.port != 0 {
			out = append(out, "localhost:"+strconv.Itoa(h.port))
		}
	}
	for _, a := range r.addrs {
		if a.port != 0 && a.prefix.IsSingleIP() && loopback(a.prefix.Addr()) {
			out = append(out, netip.AddrPortFrom(a.prefix.Addr(), uint16(a.port)).String())
		}
	}
	slices.Sort(out)
	return slices.Compact(out)
}
