//go:build !linux

package egress

import (
	"context"
	"fmt"
	"net"
)

// bindLong has no folder handle to bind through here: a socket's path must
// fit a socket address.
func bindLong(path string) (net.Listener, error) {
	return nil, fmt.Errorf("%s is too long for a unix socket (at most %d bytes here)", path, maxSocketPath-1)
}

// DialUnix connects to the unix socket at path (which fits a socket
// address here: bindLong refuses one that does not).
func DialUnix(ctx context.Context, path string) (net.Conn, error) {
	var d net.Dialer
	return d.DialContext(ctx, "unix", path)
}
