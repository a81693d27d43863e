package egress

import "net/netip"

// special are the address ranges the proxy never dials unless the address
// or a range holding it is named in the rules: what is not the public
// internet (the host itself, the local networks, the cloud metadata
// service) or not an address a connection may go to at all.
var special = []struct {
	prefix netip.Prefix
	what   string
}{
	{netip.MustParsePrefix("0.0.0.0/8"), "a 'this network' address"},
	{netip.MustParsePrefix("10.0.0.0/8"), "a private address"},
	{netip.MustParsePrefix("100.64.0.0/10"), "a carrier-grade NAT address"},
	{netip.MustParsePrefix("127.0.0.0/8"), "a loopback address"},
	{netip.MustParsePrefix("169.254.0.0/16"), "a link-local address (the cloud metadata service lives there)"},
	{netip.MustParsePrefix("172.16.0.0/12"), "a private address"},
	{netip.MustParsePrefix("192.0.0.0/24"), "an IETF protocol address"},
	{netip.MustParsePrefix("192.0.2.0/24"), "a documentation address"},
	{netip.MustParsePrefix("192.88.99.0/24"), "a 6to4 relay address"},
	{netip.MustParsePrefix("192.168.0.0/16"), "a private address"},
	{netip.MustParsePrefix("198.18.0.0/15"), "a benchmarking address"},
	{netip.MustParsePrefix("198.51.100.0/24"), "a documentation address"},
	{netip.MustParsePrefix("203.0.113.0/24"), "a documentation address"},
	{netip.MustParsePrefix("224.0.0.0/4"), "a multicast address"},
	{netip.MustParsePrefix("240.0.0.0/4"), "a reserved or broadcast address"},
	{netip.MustParsePrefix("::/128"), "the unspecified address"},
	{netip.MustParsePrefix("::1/128"), "a loopback address"},
	{netip.MustParsePrefix("64:ff9b:1::/48"), "a local NAT64 address"},
	{netip.MustParsePrefix("100::/64"), "a discard address"},
	{netip.MustParsePrefix("2001::/23"), "an IETF protocol address (Teredo, ORCHID, benchmarking)"},
	{netip.MustParsePrefix("2001:db8::/32"), "a documentation address"},
	{netip.MustParsePrefix("fc00::/7"), "a private (unique local) address"},
	{netip.MustParsePrefix("fe80::/10"), "a link-local address"},
	{netip.MustParsePrefix("fec0::/10"), "a site-local address"},
	{netip.MustParsePrefix("ff00::/8"), "a multicast address"},
}

// nat64 and sixToFour embed an IPv4 address: it decides.
var (
	nat64     = netip.MustParsePrefix("64:ff9b::/96")
	sixToFour = netip.MustParsePrefix("2002::/16")
)

// specialKind says what kind of special address a is ("" for a public
// one). An IPv4 address inside IPv6 (mapped, NAT64, 6to4) is judged by its
// IPv4 address.
func specialKind(a netip.Addr) string {
	a = a.WithZone("")
	if a.Is4In6() {
		a = a.Unmap()
	}
	if a.Is6() {
		b := a.As16()
		switch {
		case nat64.Contains(a):
			return specialKind(netip.AddrFrom4([4]byte{b[12], b[13], b[14], b[15]}))
		case sixToFour.Contains(a):
			return specialKind(netip.AddrFrom4([4]byte{b[2], b[3], b[4], b[5]}))
		}
	}
	for _, s := range special {
		if s.prefix.Contains(a) {
			return s.what
		}
	}
	return ""
}

// unwrap is a's IPv4 address when a embeds one (mapped, NAT64, 6to4),
// else a, without a zone.
func unwrap(a netip.Addr) netip.Addr {
	a = a.WithZone("")
	if a.Is4In6() {
		return a.Unmap()
	}
	if a.Is6() {
		b := a.As16()
		if nat64.Contains(a) {
			return netip.AddrFrom4([4]byte{b[12], b[13], b[14], b[15]})
		}
		if sixToFour.Contains(a) {
			return netip.AddrFrom4([4]byte{b[2], b[3], b[4], b[5]})
		}
	}
	return a
}

// linkLocal reports whether a is a link-local address (the cloud metadata
// service's range among them), judged as specialKind judges.
func linkLocal(a netip.Addr) bool { return unwrap(a).IsLinkLocalUnicast() }

// loopback reports whether a is a loopback address.
func loopback(a netip.Addr) bool { return unwrap(a).IsLoopback() }
