package dispatch

import (
	"net"
	"strings"

	"github.com/aqfleet/aq/internal/aqerr"
)

// CheckConnectionString refuses a development connection string
// (UseDevelopmentEmulator=true) that points at a host other than loopback:
// the SDK then speaks plain AMQP and the key would cross the network in
// clear. Publishers (the coordinator stub) apply the same rule as the
// receiver. The error never quotes the string.
func CheckConnectionString(cs string) error {
	host, emulator, loopback := EmulatorEndpoint(cs)
	if !emulator || loopback {
		return nil
	}
	return aqerr.Usagef("point AQ_SB_CONNECTION_STRING at a loopback emulator, or use AQ_SB_NAMESPACE with managed identity",
		"AQ_SB_CONNECTION_STRING has UseDevelopmentEmulator=true for a host that is not loopback (%s): that would send the key over plain AMQP", host)
}

// EmulatorEndpoint reads a connection string the way CheckConnectionString
// judges it: emulator when it says UseDevelopmentEmulator=true (the SDK then
// speaks plain AMQP), host its Endpoint's host, and loopback whether that
// host is this machine.
func EmulatorEndpoint(cs string) (host string, emulator, loopback bool) {
	emulator = strings.EqualFold(csField(cs, "UseDevelopmentEmulator"), "true")
	host = strings.TrimSuffix(strings.TrimPrefix(csField(cs, "Endpoint"), "sb://"), "/")
	if h, _, err := net.SplitHostPort(host); err == nil {
		host = h
	}
	ip := net.ParseIP(host)
	loopback = (ip != nil && ip.IsLoopback()) || strings.EqualFold(host, "localhost")
	return host, emulator, loopback
}

// ConnectionStringSecrets are the parts of a connection string a redactor
// must mask: the string itself, its SharedAccessKey and any
// SharedAccessSignature.
func ConnectionStringSecrets(cs string) []string {
	out := []string{cs}
	for _, k := range []string{"SharedAccessKey", "SharedAccessSignature"} {
		if v := csField(cs, k); v != "" {
			out = append(out, v)
		}
	}
	return out
}

// csField reads one key of a connection string (keys are case-insensitive).
func csField(cs, key string) string {
	for _, part := range strings.Split(cs, ";") {
		k, v, ok := strings.Cut(part, "=")
		if ok && strings.EqualFold(strings.TrimSpace(k), key) {
			return strings.TrimSpace(v)
		}
	}
	return ""
}
