package mdmeta

import "os"

// openNonBlocking opens path for reading; Windows has no FIFO to block on
// in a path (a named pipe is \\.\pipe\…, refused as not a regular file).
func openNonBlocking(path string) (*os.File, error) { return os.Open(path) }
