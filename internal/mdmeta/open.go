package mdmeta

import (
	"io/fs"
	"os"
)

// OpenRegular opens path for reading only if it is a regular file (a
// symbolic link to one is): a named pipe, a device or a socket is refused
// without blocking on it — opening a FIFO for reading waits for a writer,
// which hung `aq validate` until killed. notRegular says what the path is
// instead ("a named pipe (FIFO)"); err is an open or stat error.
func OpenRegular(path string) (f *os.File, notRegular string, err error) {
	f, err = openNonBlocking(path)
	if err != nil {
		return nil, "", err
	}
	st, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, "", err
	}
	if kind := Kind(st.Mode()); kind != "" {
		f.Close()
		return nil, kind, nil
	}
	return f, "", nil
}

// Kind names what a file that is not a regular one is ("" for a regular
// file).
func Kind(m fs.FileMode) string {
	switch {
	case m.IsRegular():
		return ""
	case m.IsDir():
		return "a directory"
	case m&fs.ModeNamedPipe != 0:
		return "a named pipe (FIFO)"
	case m&fs.ModeSocket != 0:
		return "a socket"
	case m&fs.ModeDevice != 0:
		return "a device"
	}
	return "not a regular file"
}
