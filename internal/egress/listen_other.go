//go:build !linux

package egress

import (
	"fmt"
	"net"
)

// bindLong has no folder handle to bind through here: a socket's path must
// fit a socket address.
func bindLong(path string) (net.Listener, error) {
	return nil, fmt.Errorf("%s is too long for a unix socket (at most %d bytes here)", path, maxSocketPath-1)
}
