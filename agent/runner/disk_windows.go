package runner

import "io/fs"

// freeSpace: not read on Windows (AQ_DISK_RESERVE does not hold there).
func freeSpace(string) (int64, bool) { return 0, false }

// allocatedOf is a file's size on Windows (no allocated blocks in its stat).
func allocatedOf(info fs.FileInfo) (int64, [2]uint64, bool) { return info.Size(), [2]uint64{}, false }
