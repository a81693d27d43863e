package process

import (
	"bytes"
	"encoding/binary"
)

// parseProcArgs2 splits what macOS's sysctl kern.procargs2 returns for a
// process into its arguments and its environment. The buffer is: argc as a
// 32-bit little-endian integer (every Mac aq runs on is little-endian), the
// executable's path and its terminating NUL, NUL padding, argc NUL-terminated
// arguments, then the environment as NUL-terminated KEY=VALUE strings up to
// an empty string or the end (what follows that — the kernel's "apple"
// strings — is not environment). ok is false for a buffer too short or too
// broken to hold argc arguments. It is platform-free so that Linux tests it.
func parseProcArgs2(b []byte) (argv, env [][]byte, ok bool) {
	if len(b) < 4 {
		return nil, nil, false
	}
	argc := int(int32(binary.LittleEndian.Uint32(b)))
	if argc < 0 || argc > len(b) {
		return nil, nil, false
	}
	rest := b[4:]
	i := bytes.IndexByte(rest, 0) // end of the executable path
	if i < 0 {
		return nil, nil, false
	}
	rest = rest[i:]
	for len(rest) > 0 && rest[0] == 0 { // the padding
		rest = rest[1:]
	}
	for range argc {
		arg, tail, found := bytes.Cut(rest, []byte{0})
		if !found {
			return nil, nil, false
		}
		argv, rest = append(argv, arg), tail
	}
	for len(rest) > 0 {
		entry, tail, _ := bytes.Cut(rest, []byte{0})
		if len(entry) == 0 {
			break
		}
		env, rest = append(env, entry), tail
	}
	return argv, env, true
}

// environHolds reports whether env holds every entry of want exactly.
func environHolds(env, want [][]byte) bool {
	for _, w := range want {
		found := false
		for _, e := range env {
			if bytes.Equal(e, w) {
				found = true
				break
			}
		}
		if !found {
			return false
		}
	}
	return true
}
