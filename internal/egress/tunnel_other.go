//go:build !linux

package egress

import (
	"net"
	"time"
)

// sinceData needs Linux's TCP_INFO; elsewhere a tunnel copies through a
// buffer of aq's and times its idleness itself.
func sinceData(*net.TCPConn) (time.Duration, bool) { return 0, false }
