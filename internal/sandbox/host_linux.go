package sandbox

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/aqfleet/aq/internal/process"
	"github.com/aqfleet/aq/internal/safefs"
)

// hostPlatform is what the Linux probe keeps: how job cgroups are made
// (v2 where delegated, else v1; nil: the host holds no limits).
type hostPlatform struct {
	cgroup limiter
}

// jailPlatform is one jail's Linux plan.
type jailPlatform struct {
	view view
	// cacheTmpfs: the caches' layers live on a tmpfs of the job's own
	// (cachelayer_linux.go), not on disk.
	cacheTmpfs bool
}

// insideIDs are the user and group the sandbox runs as: the factory's
// own, seen as themselves — but root is seen as 1000, so that the engine
// never runs as root inside (claude refuses bypassPermissions as root).
func insideIDs() (uid, gid int) {
	uid, gid = os.Getuid(), os.Getgid()
	if uid == 0 {
		uid = 1000
	}
	if gid == 0 {
		gid = 1000
	}
	return uid, gid
}

// initCaps are the capabilities the sandbox's init needs inside its user
// namespace (ambient: they survive its exec as a non-root user): mounts
// and pivot_root, loopback, emptying the engine's bounding set, and the
// overlays of the caches (overlayfs makes its work directory with the
// mounter's credentials, and needs CAP_DAC_OVERRIDE for it in a user
// namespace). None reaches the engine.
var initCaps = []uintptr{unix.CAP_SYS_ADMIN, unix.CAP_NET_ADMIN, unix.CAP_SETPCAP, unix.CAP_DAC_OVERRIDE}

// cloneFlags are the namespaces of a full sandbox.
const cloneFlags = syscall.CLONE_NEWUSER | syscall.CLONE_NEWNS | syscall.CLONE_NEWPID | syscall.CLONE_NEWNET |
	syscall.CLONE_NEWIPC | syscall.CLONE_NEWUTS | syscall.CLONE_NEWCGROUP

func (jailPlatform) home(j *Jail) string {
	if j.level == LevelFull {
		return j.plat.view.Home
	}
	return j.p.JobHome()
}

func (jailPlatform) tmp(j *Jail) string {
	if j.level == LevelFull {
		return "/tmp"
	}
	return j.p.JobTmp()
}

// prepare plans the jail's file view and makes the job's directory.
func (j *Jail) prepare() error {
	if j.level == LevelFull {
		j.plat.view = planMounts(j.p, hostStat)
	}
	if err := makeJobDir(j.p); err != nil {
		return &StartError{Step: "make the job's directory", Err: err}
	}
	if j.level == LevelFull {
		if err := writeIdentity(j.p, j.plat.view.Home); err != nil {
			return &StartError{Step: "write the sandbox's /etc/passwd", Err: err}
		}
		if hasCacheLayers(j.plat.view, filepath.Join(j.p.JobDir, "cache")) {
			ok, err := mountCacheLayer(filepath.Join(j.p.JobDir, "cache"), cacheLayerSize(j.p))
			if err != nil {
				j.note(err.Error() + "; the caches' layers stay on disk")
			}
			j.plat.cacheTmpfs = ok
		}
	}
	return nil
}

// hasCacheLayers reports whether v mounts a cache's layer of the job's
// own, kept in dir (an overlay, or an empty cache's own directory).
func hasCacheLayers(v view, dir string) bool {
	for _, op := range v.Mounts {
		if op.Kind == mOverlay || op.Kind == mBind && within(op.Src, dir) {
			return true
		}
	}
	return false
}

func hostStat(path string) (exists, dir, empty bool) {
	st, err := os.Stat(path)
	if err != nil {
		return false, false, false
	}
	if !st.IsDir() {
		return true, false, false
	}
	f, err := os.Open(path)
	if err != nil {
		return true, true, false
	}
	defer f.Close()
	names, _ := f.Readdirnames(1)
	return true, true, len(names) == 0
}

// Start starts cmd inside the jail (process.Jail).
func (j *Jail) Start(cmd *exec.Cmd) (process.Jailed, error) {
	if cmd.Err != nil {
		return nil, cmd.Err
	}
	if j.level == LevelFull {
		run, err := j.startFull(cmd, false)
		if err != nil {
			forgetTrial(j.h.opts) // the next probe tries again
		}
		return run, err
	}
	return j.startPartial(cmd)
}

// startPartial starts cmd in a Landlock domain of its own (no namespaces):
// the thread that forks it is restricted first, and dies after.
func (j *Jail) startPartial(cmd *exec.Cmd) (process.Jailed, error) {
	cmd.Env = j.Env(cmd.Env)
	rules := partialRules(j.p, os.ReadDir)
	fd, flags, err := rules.rulesetFD()
	if err != nil {
		return nil, &StartError{Step: "landlock ruleset", Err: err}
	}
	defer func() {
		if fd >= 0 {
			_ = unix.Close(fd)
		}
	}()
	cg := j.h.plat.limits(j)
	if err := cg.failed(); err != nil {
		return nil, err
	}
	if fd := cg.fd(); fd >= 0 {
		if cmd.SysProcAttr == nil {
			cmd.SysProcAttr = &syscall.SysProcAttr{}
		}
		cmd.SysProcAttr.UseCgroupFD, cmd.SysProcAttr.CgroupFD = true, fd
	}
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread is restricted, and dies here
		// cgroup v1: the thread joins the run's cgroups, so the engine it
		// forks starts inside them (and so does everything it starts).
		if err := cg.enterThread(); err != nil {
			errc <- err
			return
		}
		if err := restrictThread(fd, flags); err != nil {
			errc <- err
			return
		}
		errc <- cmd.Start()
	}()
	if err := <-errc; err != nil {
		_, _ = cg.close()
		return nil, err
	}
	cg.started()
	return &partialRun{cg: cg}, nil
}

type partialRun struct{ cg runLimits }

func (r *partialRun) Exit(st *os.ProcessState) (int, string) { return exitOf(st) }
func (r *partialRun) Close() (bool, error)                   { return r.cg.close() }

// startFull starts the sandbox's init with cmd's program as its engine.
// probe: build the sandbox and exit, starting nothing.
func (j *Jail) startFull(cmd *exec.Cmd, probe bool) (process.Jailed, error) {
	o := orders{
		Path: cmd.Path, Args: cmd.Args[1:], Env: j.Env(cmd.Env), Dir: cmd.Dir,
		Root: filepath.Join(j.p.JobDir, "root"), View: j.plat.view, Rules: fullRules(j.plat.view),
		ProxySocket: j.p.Net.ProxySocket, Gateways: j.p.Net.Gateways, Probe: probe, Trace: j.trace,
	}
	raw, err := json.Marshal(o)
	if err != nil {
		return nil, err
	}
	ordersR, ordersW, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	statusR, statusW, err := os.Pipe()
	if err != nil {
		ordersR.Close()
		ordersW.Close()
		return nil, err
	}
	watchR, watchW, err := os.Pipe()
	if err != nil {
		ordersR.Close()
		ordersW.Close()
		statusR.Close()
		statusW.Close()
		return nil, err
	}
	uid, gid := insideIDs()
	tagged := []string{initEnv + "=1"}
	for _, kv := range cmd.Env { // the job's tag: a sweep by tag finds init too
		if strings.HasPrefix(kv, process.TagEnv+"=") || strings.HasPrefix(kv, process.ScopeEnv+"=") {
			tagged = append(tagged, kv)
		}
	}
	// A race-enabled aq (the tests' build) sleeps a second at exit unless
	// GORACE says otherwise: the init would hold every sandboxed start a
	// second longer. GORACE means nothing to any other build.
	if v, ok := os.LookupEnv("GORACE"); ok {
		tagged = append(tagged, "GORACE="+v)
	}
	cmd.Path, cmd.Args, cmd.Env, cmd.Dir = j.h.opts.Init, []string{"aq-sandbox-init"}, tagged, ""
	cmd.ExtraFiles = []*os.File{ordersR, statusW, watchR}
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	sp := cmd.SysProcAttr
	sp.Cloneflags = cloneFlags
	sp.UidMappings = []syscall.SysProcIDMap{{ContainerID: uid, HostID: os.Getuid(), Size: 1}}
	sp.GidMappings = []syscall.SysProcIDMap{{ContainerID: gid, HostID: os.Getgid(), Size: 1}}
	sp.GidMappingsEnableSetgroups = false
	sp.AmbientCaps = initCaps
	sp.Pdeathsig = syscall.SIGKILL
	cg := j.h.plat.limits(j)
	if err := cg.failed(); err != nil {
		closeFiles(ordersR, ordersW, statusR, statusW, watchR, watchW)
		return nil, err
	}
	if fd := cg.fd(); fd >= 0 {
		sp.UseCgroupFD, sp.CgroupFD = true, fd
	}

	// Pdeathsig fires when the thread that forked init ends: this one is
	// kept (locked to the caller's goroutine) until Close.
	runtime.LockOSThread()
	if err := cmd.Start(); err != nil {
		runtime.UnlockOSThread()
		closeFiles(ordersR, ordersW, statusR, statusW, watchR, watchW)
		_, _ = cg.close()
		return nil, &StartError{Step: "start the sandbox's init", Err: err}
	}
	cg.started()
	ordersR.Close()
	statusW.Close()
	watchR.Close()
	// cgroup v1: init joins the run's cgroups before it is given its
	// orders, so before it starts anything (it waits for them).
	if err := cg.place(cmd.Process.Pid); err != nil {
		ordersW.Close()
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		runtime.UnlockOSThread()
		closeFiles(statusR, watchW)
		_, _ = cg.close()
		return nil, err
	}
	_, werr := ordersW.Write(raw)
	ordersW.Close()
	run := &fullRun{status: bufio.NewReader(statusR), statusR: statusR, watchW: watchW, cg: cg}
	first, rerr := run.next()
	if werr != nil || rerr != nil || !first.Started {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		_, _ = run.Close()
		if first.Error != "" {
			cause := errors.New(first.Error)
			if first.Errno != 0 {
				cause = syscall.Errno(first.Errno)
			}
			return nil, &StartError{Step: first.Step, Err: cause}
		}
		return nil, &StartError{Step: "start the sandbox's init", Err: errors.Join(werr, rerr, errors.New("it ended before the engine started"))}
	}
	j.note(first.Notes...)
	return run, nil
}

// fullRun is the sandbox's init, started.
type fullRun struct {
	status  *bufio.Reader
	statusR *os.File
	watchW  *os.File
	cg      runLimits
	closed  bool
}

// next reads init's next status line.
func (r *fullRun) next() (status, error) {
	line, err := r.status.ReadBytes('\n')
	if len(line) == 0 {
		if err == nil {
			err = io.ErrUnexpectedEOF
		}
		return status{}, err
	}
	var s status
	if err := json.Unmarshal(line, &s); err != nil {
		return status{}, fmt.Errorf("the sandbox's init reported %q: %w", line, err)
	}
	return s, nil
}

// Exit is the engine's end as init reported it; init's own when it could
// not report (killed by the ladder's SIGKILL: everything in it was).
func (r *fullRun) Exit(st *os.ProcessState) (int, string) {
	if s, err := r.next(); err == nil {
		switch {
		case s.Signal != "":
			return -1, s.Signal
		case s.Exit != nil:
			return *s.Exit, ""
		}
	}
	return exitOf(st)
}

// Close lets go of init (gone by now) and of the job's cgroup.
func (r *fullRun) Close() (bool, error) {
	if r.closed {
		return false, nil
	}
	r.closed = true
	r.watchW.Close()
	r.statusR.Close()
	runtime.UnlockOSThread()
	return r.cg.close()
}

func closeFiles(fs ...*os.File) {
	for _, f := range fs {
		f.Close()
	}
}

// exitOf is how a process ended: its exit status, or -1 and its signal.
func exitOf(st *os.ProcessState) (int, string) {
	if ws, ok := st.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		return -1, signalName(ws.Signal())
	}
	return st.ExitCode(), ""
}

// writeIdentity writes the sandbox's /etc/passwd and /etc/group: the
// host's, with the sandbox's user and group (insideIDs) named after the
// factory's user and homed at home.
func writeIdentity(p Policy, home string) error {
	uid, gid := insideIDs()
	name := "aq"
	if u := os.Getenv("USER"); u != "" && u != "root" && os.Getuid() != 0 {
		name = u
	}
	passwd, _ := os.ReadFile("/etc/passwd")
	group, _ := os.ReadFile("/etc/group")
	pw := replaceEntry(passwd, 2, strconv.Itoa(uid), fmt.Sprintf("%s:x:%d:%d:aq sandbox:%s:/bin/sh", name, uid, gid, home))
	gr := replaceEntry(group, 2, strconv.Itoa(gid), fmt.Sprintf("%s:x:%d:", name, gid))
	dir := filepath.Join(p.JobDir, "etc")
	if err := safefs.WriteFile("job", dir, "passwd", pw, 0o644); err != nil {
		return err
	}
	return safefs.WriteFile("job", dir, "group", gr, 0o644)
}
