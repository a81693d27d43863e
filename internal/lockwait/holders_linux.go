package lockwait

import (
	"bufio"
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"
)

// holders reads /proc/locks for the processes holding a flock(2) or POSIX
// lock on path's inode ("1: FLOCK  ADVISORY  WRITE 4242 08:01:123456 0 EOF").
func holders(path string) []int {
	var st syscall.Stat_t
	if err := syscall.Stat(path, &st); err != nil {
		return nil
	}
	f, err := os.Open("/proc/locks")
	if err != nil {
		return nil
	}
	defer f.Close()
	dev := fmt.Sprintf("%02x:%02x:%d", unixMajor(st.Dev), unixMinor(st.Dev), st.Ino)
	var pids []int
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fs := strings.Fields(sc.Text())
		// A blocked waiter's line starts with "->": it does not hold.
		if len(fs) < 6 || fs[1] == "->" {
			continue
		}
		if !sameDev(fs[5], dev) {
			continue
		}
		if pid, err := strconv.Atoi(fs[4]); err == nil && pid > 0 {
			pids = append(pids, pid)
		}
	}
	return pids
}

// sameDev compares /proc/locks' "MAJ:MIN:INODE" (hex device numbers, of
// any width) with want.
func sameDev(field, want string) bool {
	a, b := strings.Split(field, ":"), strings.Split(want, ":")
	if len(a) != 3 || len(b) != 3 {
		return false
	}
	for i := 0; i < 2; i++ {
		x, err1 := strconv.ParseUint(a[i], 16, 32)
		y, err2 := strconv.ParseUint(b[i], 16, 32)
		if err1 != nil || err2 != nil || x != y {
			return false
		}
	}
	return a[2] == b[2]
}

func unixMajor(dev uint64) uint64 { return (dev>>8)&0xfff | (dev>>32)&^0xfff }
func unixMinor(dev uint64) uint64 { return dev&0xff | (dev>>12)&^0xff }

// command is pid's command name, or "".
func command(pid int) string {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid))
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
}
