// Package hostfault tells a fault of this host — $AQ_HOME's file system
// full, read-only or failing — from a job's own failure, so that the job is
// not blamed for it: it fails host_unavailable (infrastructure, retried;
// in fleet mode released for another factory) rather than engine_failed or
// crash, and the factory says what is wrong with the host
// (docs/troubleshooting.md#host_unavailable).
package hostfault

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
)

// Is reports whether err is the file system refusing a write for the
// host's sake: no space (or quota) left, read-only, or an I/O error.
func Is(err error) bool {
	if err == nil {
		return false
	}
	for _, e := range faults {
		if errors.Is(err, e) {
			return true
		}
	}
	var he *Error
	return errors.As(err, &he)
}

// Error is $AQ_HOME (or another directory aq must write) refusing writes.
type Error struct {
	Dir string
	Err error
}

func (e *Error) Error() string {
	return fmt.Sprintf("this host cannot write %s: %v", e.Dir, cause(e.Err))
}

func (e *Error) Unwrap() error { return e.Err }

// Probe writes a small file in dir, syncs it and removes it: nil when the
// file system takes writes, else an *Error saying why (no space left, a
// read-only file system, an I/O error, or anything else that stops a write
// there: a job could not run here either).
func Probe(dir string) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return &Error{Dir: dir, Err: err}
	}
	f, err := os.CreateTemp(dir, ".aq-probe-*")
	if err != nil {
		return &Error{Dir: dir, Err: err}
	}
	name := f.Name()
	defer os.Remove(name)
	// A page's worth: a full file system refuses it, where an empty file
	// may still fit in an inode.
	if _, err := f.Write(make([]byte, 4096)); err != nil {
		f.Close()
		return &Error{Dir: dir, Err: err}
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return &Error{Dir: dir, Err: err}
	}
	if err := f.Close(); err != nil {
		return &Error{Dir: dir, Err: err}
	}
	return nil
}

// Cause is err in words, without the path it may carry.
func Cause(err error) string { return cause(err).Error() }

// cause is err without the path it may carry (the message names the
// directory already).
func cause(err error) error {
	var pe *os.PathError
	if errors.As(err, &pe) && filepath.IsAbs(pe.Path) {
		return pe.Err
	}
	return err
}
