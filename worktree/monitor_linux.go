package worktree

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// monitor watches a worktree with inotify and remembers which paths
// changed, so that a checkpoint can tell git (through the fsmonitor hook
// protocol, see Checkpointer) what to look at instead of letting it stat
// every file. It watches every directory of the worktree (nested
// repositories' .git directories excepted) and one cookie directory: a
// file created there and seen come back as an event proves every earlier
// change was read (inotify keeps one queue per instance, in order).
//
// What it cannot see it reports as "everything": a queue overflow, a
// directory it could not watch (the watch limit), the worktree itself moved
// or deleted. Writes through a shared memory mapping make no event until the
// file is closed; the exact checkpoint after the engine does not rely on
// the monitor.
type monitor struct {
	f         *os.File
	fd        int
	root      string
	cookieDir string
	cookieWD  int32

	mu      sync.Mutex
	wds     map[int32]string // watch -> directory, relative to root ("" for root)
	seq     uint64
	changed map[string]uint64 // path -> seq of its last change (directories end in "/")
	floor   uint64            // a token older than this gets "everything"
	cookies map[string]chan struct{}
	done    chan struct{}
	err     error // set when the monitor stopped working
}

// watchMask is what changes a file or directory: content, metadata,
// creation, deletion, renames. Reads are not watched.
const watchMask = unix.IN_MODIFY | unix.IN_ATTRIB | unix.IN_CLOSE_WRITE | unix.IN_CREATE | unix.IN_DELETE |
	unix.IN_DELETE_SELF | unix.IN_MOVE_SELF | unix.IN_MOVED_FROM | unix.IN_MOVED_TO |
	unix.IN_DONT_FOLLOW | unix.IN_EXCL_UNLINK | unix.IN_ONLYDIR

// maxChanged bounds the journal: past it, older tokens get "everything".
const maxChanged = 200_000

// startMonitor watches root; cookieDir (created) must be outside it.
func startMonitor(root, cookieDir string) (*monitor, error) {
	if err := os.MkdirAll(cookieDir, 0o700); err != nil {
		return nil, err
	}
	fd, err := unix.InotifyInit1(unix.IN_NONBLOCK | unix.IN_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("inotify: %w", err)
	}
	m := &monitor{
		fd: fd, f: os.NewFile(uintptr(fd), "inotify"), root: filepath.Clean(root), cookieDir: cookieDir,
		wds: map[int32]string{}, changed: map[string]uint64{}, cookies: map[string]chan struct{}{}, done: make(chan struct{}),
	}
	wd, err := unix.InotifyAddWatch(fd, cookieDir, unix.IN_CREATE|unix.IN_ONLYDIR)
	if err != nil {
		m.f.Close()
		return nil, fmt.Errorf("inotify: watch %s: %w", cookieDir, err)
	}
	m.cookieWD = int32(wd)
	if err := m.watchTree(""); err != nil {
		m.f.Close()
		return nil, err
	}
	go m.loop()
	return m, nil
}

// watchTree adds a watch on rel and every directory below it. Each
// directory is watched before it is read, so nothing created in it later is
// missed; what was there before is the first scan's to find.
func (m *monitor) watchTree(rel string) error {
	return filepath.WalkDir(filepath.Join(m.root, rel), func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			if p == filepath.Join(m.root, rel) {
				return err
			}
			return nil // vanished meanwhile: its event says so
		}
		if !d.IsDir() {
			return nil
		}
		if d.Name() == ".git" && p != m.root {
			return filepath.SkipDir // a nested repository's internals
		}
		r, _ := filepath.Rel(m.root, p)
		if r == "." {
			r = ""
		}
		wd, err := unix.InotifyAddWatch(m.fd, p, watchMask)
		if err != nil {
			if errors.Is(err, unix.ENOENT) || errors.Is(err, unix.ENOTDIR) {
				return nil
			}
			return fmt.Errorf("inotify: watch %s: %w", p, err)
		}
		m.mu.Lock()
		m.wds[int32(wd)] = filepath.ToSlash(r)
		m.mu.Unlock()
		return nil
	})
}

func (m *monitor) loop() {
	defer close(m.done)
	buf := make([]byte, 64<<10)
	for {
		n, err := m.f.Read(buf)
		if err != nil {
			m.fail(err)
			return
		}
		m.handle(buf[:n])
	}
}

// fail stops the monitor: from now on every answer is "everything".
func (m *monitor) fail(err error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.err == nil {
		m.err = err
	}
	for name, ch := range m.cookies {
		close(ch)
		delete(m.cookies, name)
	}
}

// handle reads a buffer of inotify events.
func (m *monitor) handle(b []byte) {
	for len(b) >= unix.SizeofInotifyEvent {
		ev := (*unix.InotifyEvent)(unsafe.Pointer(&b[0]))
		size := unix.SizeofInotifyEvent + int(ev.Len)
		if size > len(b) {
			return
		}
		name := string(bytes.TrimRight(b[unix.SizeofInotifyEvent:size], "\x00"))
		b = b[size:]
		m.event(ev.Wd, ev.Mask, name)
	}
}

func (m *monitor) event(wd int32, mask uint32, name string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if mask&unix.IN_Q_OVERFLOW != 0 {
		m.everything()
		return
	}
	if wd == m.cookieWD {
		if ch, ok := m.cookies[name]; ok {
			close(ch)
			delete(m.cookies, name)
		}
		return
	}
	dir, ok := m.wds[wd]
	if !ok {
		return
	}
	if mask&unix.IN_IGNORED != 0 {
		delete(m.wds, wd)
		return
	}
	if mask&(unix.IN_DELETE_SELF|unix.IN_MOVE_SELF) != 0 {
		if dir == "" {
			m.everything() // the worktree itself moved or went
		}
		return // a subdirectory's own event: its parent reports it by name
	}
	rel := name
	if dir != "" {
		rel = dir + "/" + name
	}
	isDir := mask&unix.IN_ISDIR != 0
	switch {
	case isDir && mask&(unix.IN_CREATE|unix.IN_MOVED_TO) != 0:
		m.note(rel + "/")
		// Watch the new tree; what appeared in it before its watch is
		// covered by noting it again once watched.
		m.mu.Unlock()
		err := m.watchTree(rel)
		m.mu.Lock()
		if err != nil && !errors.Is(err, fs.ErrNotExist) {
			m.everything()
			return
		}
		m.note(rel + "/")
	case isDir && mask&(unix.IN_DELETE|unix.IN_MOVED_FROM) != 0:
		m.note(rel + "/")
		// Forget the watches under it: a moved directory's would report
		// its new contents under the old name.
		for w, d := range m.wds {
			if d == rel || len(d) > len(rel) && d[:len(rel)+1] == rel+"/" {
				_, _ = unix.InotifyRmWatch(m.fd, uint32(w))
				delete(m.wds, w)
			}
		}
	default:
		m.note(rel)
	}
}

// note records a change of path; the caller holds mu.
func (m *monitor) note(path string) {
	m.seq++
	if len(m.changed) >= maxChanged {
		m.everything()
		return
	}
	m.changed[path] = m.seq
}

// everything forgets the journal: tokens from before now get "everything".
// The caller holds mu.
func (m *monitor) everything() {
	m.seq++
	m.floor = m.seq
	clear(m.changed)
}

// sync waits until every change made before it was called has been read,
// and returns the sequence number that stands for "now".
func (m *monitor) sync(ctx context.Context) (uint64, error) {
	m.mu.Lock()
	if m.err != nil {
		m.mu.Unlock()
		return 0, m.err
	}
	name := "c" + strconv.FormatUint(m.seq, 10) + "-" + strconv.FormatInt(time.Now().UnixNano(), 36)
	ch := make(chan struct{})
	m.cookies[name] = ch
	m.mu.Unlock()
	p := filepath.Join(m.cookieDir, name)
	if err := os.WriteFile(p, nil, 0o600); err != nil {
		m.mu.Lock()
		delete(m.cookies, name)
		m.mu.Unlock()
		return 0, err
	}
	defer os.Remove(p)
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	select {
	case <-ch:
	case <-ctx.Done():
		m.mu.Lock()
		delete(m.cookies, name)
		m.mu.Unlock()
		return 0, fmt.Errorf("inotify: no event for the cookie: %w", ctx.Err())
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.err != nil {
		return 0, m.err
	}
	return m.seq, nil
}

// since returns the paths changed after seq; ok is false when the monitor
// cannot tell (its journal does not reach back that far, or it failed).
func (m *monitor) since(seq uint64) (paths []string, ok bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.err != nil || seq < m.floor {
		return nil, false
	}
	for p, s := range m.changed {
		if s > seq {
			paths = append(paths, p)
		}
	}
	return paths, true
}

// close stops the monitor and waits for its goroutine.
func (m *monitor) close() {
	m.f.Close() // the pending Read returns, loop exits
	<-m.done
}
