package egress

import (
	"net"
	"time"

	"golang.org/x/sys/unix"
)

// sinceData is how long ago the upstream connection last sent or received
// data, from the kernel's own account (TCP_INFO's last_data_sent and
// last_data_recv, kept since the first Linux that had TCP_INFO): a tunnel
// that splices needs no byte to pass through aq's memory for aq to know
// it is alive. ok is false when the kernel would not say.
func sinceData(up *net.TCPConn) (time.Duration, bool) {
	rc, err := up.SyscallConn()
	if err != nil {
		return 0, false
	}
	var info *unix.TCPInfo
	var ierr error
	if err := rc.Control(func(fd uintptr) {
		info, ierr = unix.GetsockoptTCPInfo(int(fd), unix.IPPROTO_TCP, unix.TCP_INFO)
	}); err != nil || ierr != nil {
		return 0, false
	}
	return time.Duration(min(info.Last_data_sent, info.Last_data_recv)) * time.Millisecond, true
}
