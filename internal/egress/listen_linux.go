package egress

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"

	"golang.org/x/sys/unix"
)

// bindLong binds a unix socket at a path too long for a socket address:
// through /proc/self/fd and a handle on its folder, which the kernel
// resolves to the folder itself (the sandbox's init connects to it the
// same way).
func bindLong(path string) (net.Listener, error) {
	dir, err := os.OpenFile(filepath.Dir(path), unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	defer dir.Close()
	short := "/proc/self/fd/" + strconv.Itoa(int(dir.Fd())) + "/" + filepath.Base(path)
	if len(short) >= maxSocketPath {
		return nil, fmt.Errorf("the socket's name %q is too long", filepath.Base(path))
	}
	return net.Listen("unix", short)
}

// DialUnix connects to the unix socket at path, through a handle on its
// folder when the path is too long for a socket address (as bindLong
// binds it): a job's proxy under a deep $AQ_HOME is reached as the
// engine reaches it.
func DialUnix(ctx context.Context, path string) (net.Conn, error) {
	var d net.Dialer
	if len(path) < maxSocketPath {
		return d.DialContext(ctx, "unix", path)
	}
	dir, err := os.OpenFile(filepath.Dir(path), unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	defer dir.Close()
	return d.DialContext(ctx, "unix", "/proc/self/fd/"+strconv.Itoa(int(dir.Fd()))+"/"+filepath.Base(path))
}
