package hostfault

import "golang.org/x/sys/windows"

// faults are the errors of a volume that cannot take writes.
var faults = []error{windows.ERROR_DISK_FULL, windows.ERROR_HANDLE_DISK_FULL, windows.ERROR_WRITE_PROTECT, windows.ERROR_CRC, windows.ERROR_IO_DEVICE}
