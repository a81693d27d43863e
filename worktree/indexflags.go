package worktree

// The index's assume-unchanged and skip-worktree bits, read from the index
// file itself (gitformat-index) instead of `git ls-files -v` (#35: one git
// fewer per warm start). The file is in the worktree's git directory, where
// an engine can write: it is read through safefs (never a link, never a
// FIFO, at most maxIndexRead bytes) and parsed strictly — any surprise
// (another version, a split or sparse index, a length that does not add
// up, a bad checksum) and the caller asks git, as before.

import (
	"bytes"
	"crypto/sha1"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"hash"
)

// maxIndexRead bounds the index read here (about 500,000 entries); a
// larger one is read by git.
const maxIndexRead = 64 << 20

// errIndexFormat: the index is not one this reader takes; git reads it.
var errIndexFormat = errors.New("index: not a format read here")

// indexFlags are the paths of the index entries with the assume-unchanged
// (valid) and skip-worktree (skip) bits, each NUL-terminated as `git
// update-index -z --stdin` reads them. hashLen is the repository's object
// name length in bytes (20: SHA-1, 32: SHA-256).
func indexFlags(data []byte, hashLen int) (valid, skip []byte, err error) {
	var sum hash.Hash
	switch hashLen {
	case 20:
		sum = sha1.New()
	case 32:
		sum = sha256.New()
	default:
		return nil, nil, errIndexFormat
	}
	if len(data) < 12+hashLen || string(data[:4]) != "DIRC" {
		return nil, nil, errIndexFormat
	}
	body, trailer := data[:len(data)-hashLen], data[len(data)-hashLen:]
	if !bytes.Equal(trailer, make([]byte, hashLen)) { // all zero: index.skipHash
		sum.Write(body)
		if !bytes.Equal(sum.Sum(nil), trailer) {
			return nil, nil, errIndexFormat
		}
	}
	version := binary.BigEndian.Uint32(body[4:8])
	if version < 2 || version > 4 {
		return nil, nil, errIndexFormat
	}
	n := binary.BigEndian.Uint32(body[8:12])
	off := 12
	var prev []byte
	for range n {
		start := off
		fixed := 40 + hashLen + 2
		if off+fixed > len(body) {
			return nil, nil, errIndexFormat
		}
		flags := binary.BigEndian.Uint16(body[off+40+hashLen:])
		off += fixed
		var ext uint16
		if flags&0x4000 != 0 {
			if version < 3 || off+2 > len(body) {
				return nil, nil, errIndexFormat
			}
			ext = binary.BigEndian.Uint16(body[off:])
			off += 2
			if ext&^0x6000 != 0 { // only skip-worktree and intent-to-add are defined
				return nil, nil, errIndexFormat
			}
		}
		var path []byte
		if version == 4 {
			// A varint (git's offset encoding) of how much of the previous
			// path to drop, then the rest of this one, NUL-terminated.
			drop, k, ok := indexVarint(body[off:])
			if !ok || drop > uint64(len(prev)) {
				return nil, nil, errIndexFormat
			}
			off += k
			end := bytes.IndexByte(body[off:], 0)
			if end < 0 {
				return nil, nil, errIndexFormat
			}
			path = append(append([]byte(nil), prev[:len(prev)-int(drop)]...), body[off:off+end]...)
			off += end + 1
		} else {
			end := bytes.IndexByte(body[off:], 0)
			if end < 0 {
				return nil, nil, errIndexFormat
			}
			path = body[off : off+end]
			// 1 to 8 NULs: the entry's length is a multiple of 8.
			size := off + end - start
			pad := 8 - size%8
			if off+end+pad > len(body) || !allZero(body[off+end:off+end+pad]) {
				return nil, nil, errIndexFormat
			}
			off += end + pad
		}
		if len(path) == 0 || (int(flags&0xfff) != min(len(path), 0xfff)) {
			return nil, nil, errIndexFormat
		}
		if flags&0x8000 != 0 {
			valid = append(append(valid, path...), 0)
		}
		if ext&0x4000 != 0 {
			skip = append(append(skip, path...), 0)
		}
		prev = path
	}
	// Extensions: a split index (link) or a sparse one (sdir) keeps
	// entries, or their bits, elsewhere: git reads those.
	for off < len(body) {
		if off+8 > len(body) {
			return nil, nil, errIndexFormat
		}
		sig, size := string(body[off:off+4]), binary.BigEndian.Uint32(body[off+4:off+8])
		if sig == "link" || sig == "sdir" || uint64(off)+8+uint64(size) > uint64(len(body)) {
			return nil, nil, errIndexFormat
		}
		off += 8 + int(size)
	}
	return valid, skip, nil
}

// indexVarint reads git's offset varint (varint.c): 7 bits a byte, high
// bit set when another follows, each continuation adding one.
func indexVarint(b []byte) (v uint64, n int, ok bool) {
	for n < len(b) && n < 10 {
		c := b[n]
		n++
		v = v<<7 | uint64(c&0x7f)
		if c&0x80 == 0 {
			return v, n, true
		}
		v++
	}
	return 0, 0, false
}

func allZero(b []byte) bool {
	for _, c := range b {
		if c != 0 {
			return false
		}
	}
	return true
}
