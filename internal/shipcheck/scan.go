package shipcheck

import (
	"bytes"
	"encoding/binary"
	"encoding/hex"
	"io"
	"net/url"
	"strings"

	"github.com/aqfleet/aq/internal/secrets"
)

// MinSecretLen is the shortest secret the scan looks for: shorter values
// the redactor masks (a 4-character password) would flag innocent code.
const MinSecretLen = 16

// Secret is a value this factory holds and a change must never carry.
// Source says whose it is ("claude login", "GH token") — what a report
// names; Value is never printed.
type Secret struct {
	Value  string
	Source string
}

// form is one way a secret can be written into a file.
type form struct {
	b      []byte
	secret int    // index into the scanner's secrets
	how    string // plain, base64, URL-encoded, hex
}

// scanner finds every form of a set of secrets in a stream. Every form is
// at least prefixLen long: a position is looked at only when its first two
// bytes begin some form (a table lookup), and then its first prefixLen
// bytes pick the forms to compare — one pass over the stream, whatever
// the number of secrets.
type scanner struct {
	secrets  []Secret
	forms    []form
	maxLen   int
	first    [1 << 16]bool
	byPrefix map[uint64][]int
}

// prefixLen is how many bytes of a form index it; shorter forms are never
// made (secrets.Encodings' shortest is 8, a plain secret MinSecretLen).
const prefixLen = 8

func newScanner(list []Secret) *scanner {
	s := &scanner{}
	seen := map[string]bool{}
	for _, sec := range list {
		v := strings.TrimSpace(sec.Value)
		if len(v) < MinSecretLen || seen[v] {
			continue
		}
		seen[v] = true
		i := len(s.secrets)
		s.secrets = append(s.secrets, Secret{Value: v, Source: sec.Source})
		s.add(v, i, "plain")
		for _, e := range secrets.Encodings(v) {
			how := "base64"
			if e == url.QueryEscape(v) || e == url.PathEscape(v) {
				how = "URL-encoded"
			}
			s.add(e, i, how)
		}
		// Hex, as xxd -p, od or a hash tool's output would carry it (not
		// the redactor's: a log shows no hex of a secret it printed).
		h := hex.EncodeToString([]byte(v))
		s.add(h, i, "hex")
		s.add(strings.ToUpper(h), i, "hex")
	}
	return s
}

func (s *scanner) add(v string, secret int, how string) {
	if len(v) < prefixLen {
		return
	}
	for _, f := range s.forms {
		if string(f.b) == v {
			return
		}
	}
	if s.byPrefix == nil {
		s.byPrefix = map[uint64][]int{}
	}
	b := []byte(v)
	s.first[uint16(b[0])|uint16(b[1])<<8] = true
	k := binary.LittleEndian.Uint64(b)
	s.byPrefix[k] = append(s.byPrefix[k], len(s.forms))
	s.forms = append(s.forms, form{b: b, secret: secret, how: how})
	s.maxLen = max(s.maxLen, len(v))
}

// keepHits bounds the positions kept per form of a blob (counts go on).
const keepHits = 64

// found is what a scan of one blob saw: per form, how many times it
// occurs and where (the first keepHits: byte offset and 1-based line).
type found struct {
	count  []int
	at     [][]position
	binary bool
}

type position struct {
	offset int64
	line   int
}

func (f *found) any() bool {
	for _, c := range f.count {
		if c > 0 {
			return true
		}
	}
	return false
}

// chunk is how much of a blob is scanned at a time.
const chunk = 1 << 20

// scan reads r to its end and records every occurrence of every form.
// Memory stays at one chunk plus the longest form, whatever r's size.
func (s *scanner) scan(r io.Reader) (*found, error) {
	f := &found{count: make([]int, len(s.forms)), at: make([][]position, len(s.forms))}
	if len(s.forms) == 0 {
		_, err := io.Copy(io.Discard, r)
		return f, err
	}
	buf := make([]byte, 0, chunk+s.maxLen)
	var base int64 // the offset of buf[0] in the blob
	lines := 0     // newlines before buf[0]
	carry := 0     // buf[:carry] was searched already
	first := true
	for {
		n, err := io.ReadFull(r, buf[len(buf):cap(buf)][:min(chunk, cap(buf)-len(buf))])
		buf = buf[:len(buf)+n]
		if first && n > 0 {
			first = false
			f.binary = bytes.IndexByte(buf[:min(len(buf), 8000)], 0) >= 0 // git's own test
		}
		counted, nl := 0, lines // newlines in buf[:counted], plus lines
		for at := 0; at+prefixLen <= len(buf); at++ {
			if !s.first[uint16(buf[at])|uint16(buf[at+1])<<8] {
				continue
			}
			for _, i := range s.byPrefix[binary.LittleEndian.Uint64(buf[at:])] {
				fm := s.forms[i].b
				if at+len(fm) <= carry || !bytes.HasPrefix(buf[at:], fm) {
					continue // wholly in the part searched last time, or not it
				}
				f.count[i]++
				if len(f.at[i]) < keepHits {
					nl += bytes.Count(buf[counted:at], []byte{'\n'})
					counted = at
					f.at[i] = append(f.at[i], position{offset: base + int64(at), line: nl + 1})
				}
			}
		}
		if err == io.EOF || err == io.ErrUnexpectedEOF {
			return f, nil
		}
		if err != nil {
			return f, err
		}
		keep := min(len(buf), s.maxLen-1)
		drop := len(buf) - keep
		lines += bytes.Count(buf[:drop], []byte{'\n'})
		base += int64(drop)
		copy(buf, buf[drop:])
		buf = buf[:keep]
		carry = keep
	}
}

// inName reports the forms found in a path (a secret as a file's name).
func (s *scanner) inName(p string) []int {
	var out []int
	for i, fm := range s.forms {
		if strings.Contains(p, string(fm.b)) {
			out = append(out, i)
		}
	}
	return out
}

// mask is p with every form of every secret replaced by secrets.Mask: a
// hit names its file, and a file may be named after the secret.
func (s *scanner) mask(p string) string {
	for _, fm := range s.forms {
		p = strings.ReplaceAll(p, string(fm.b), secrets.Mask)
	}
	return p
}
