package sandbox

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// The sandbox's init is aq re-executed (as the engines' supervisor is),
// started by Jail.Start in new user, mount, pid, net, ipc, uts and cgroup
// namespaces, with the capabilities it needs inside them (ambient, so they
// survive the exec as a non-root user). It reads its orders, builds the
// file view, pivots into it, brings up loopback and the proxy bridge,
// starts the engine without any privilege (restrictThread), then is PID 1
// of the sandbox: it forwards the signals of aq's kill ladder to the
// engine's process group, reaps every orphan, and when the engine exits it
// kills whatever is left in the sandbox (a daemonised straggler too),
// reports the engine's end and exits with it. When aq dies, however it
// dies, the kernel kills init (Pdeathsig) and init's pipe from aq reads
// EOF (either is enough): the pid namespace dies with it, everything in it.
//
// Its file descriptors: 3 the orders (JSON, to EOF), 4 the status it
// reports (one JSON line at the start, one at the end), 5 the pipe whose
// end only aq holds.

// initEnv marks a process as a sandbox's init.
const initEnv = "AQ_SANDBOX_INIT"

const (
	fdOrders = 3
	fdStatus = 4
	fdWatch  = 5
)

// orders are what init does.
type orders struct {
	// Path, Args, Env and Dir are the engine's (Args without the program).
	Path string   `json:"path"`
	Args []string `json:"args,omitempty"`
	Env  []string `json:"env,omitempty"`
	Dir  string   `json:"dir,omitempty"`
	// Root is the empty host directory the sandbox's / is built on.
	Root  string  `json:"root"`
	View  view    `json:"view"`
	Rules llRules `json:"rules"`
	// ProxySocket, when set, is bridged from 127.0.0.1:ProxyBridgePort.
	ProxySocket string `json:"proxySocket,omitempty"`
	// Gateways, with ProxySocket, are bridged from their own loopback
	// addresses and ports through the proxy (Net.Gateways).
	Gateways []string `json:"gateways,omitempty"`
	// Probe: build the sandbox, report, exit 0 without starting anything.
	Probe bool `json:"probe,omitempty"`
	// Trace: report how long each step took, as notes (the benchmark's
	// "where the time goes").
	Trace bool `json:"trace,omitempty"`
}

// status is one line init reports.
type status struct {
	Started bool     `json:"started,omitempty"`
	Notes   []string `json:"notes,omitempty"`
	// Step and Error: the sandbox did not start; Errno is the system
	// error number when there is one (exec of a missing program: ENOENT).
	Step  string `json:"step,omitempty"`
	Error string `json:"error,omitempty"`
	Errno int    `json:"errno,omitempty"`
	// Exit and Signal: how the engine ended.
	Exit   *int   `json:"exit,omitempty"`
	Signal string `json:"signal,omitempty"`
}

// MaybeInit runs this process as a sandbox's init when it was started as
// one, and returns its exit code and true; otherwise it returns false at
// once. cmd/aq calls it before anything else.
func MaybeInit() (int, bool) {
	if os.Getenv(initEnv) == "" {
		return 0, false
	}
	return runInit(), true
}

func runInit() int {
	for _, fd := range []int{fdOrders, fdStatus, fdWatch} {
		syscall.CloseOnExec(fd)
	}
	out := os.NewFile(fdStatus, "status")
	report := func(s status) {
		b, _ := json.Marshal(s)
		_, _ = out.Write(append(b, '\n'))
	}
	fail := func(err error) int {
		s := status{Step: "init", Error: err.Error()}
		var se *StartError
		if errors.As(err, &se) {
			s.Step, s.Error = se.Step, se.Err.Error()
		}
		var errno syscall.Errno
		if errors.As(err, &errno) {
			s.Errno = int(errno)
		}
		report(s)
		return 125
	}
	t0 := time.Now()
	var steps []string
	step := func(name string) {
		steps = append(steps, fmt.Sprintf("%s %.2fms", name, float64(time.Since(t0))/float64(time.Millisecond)))
	}
	raw, err := io.ReadAll(os.NewFile(fdOrders, "orders"))
	if err != nil {
		return fail(err)
	}
	var o orders
	if err := json.Unmarshal(raw, &o); err != nil {
		return fail(fmt.Errorf("read the sandbox's orders: %w", err))
	}
	// Whatever happens from here, a death of aq ends the sandbox.
	go watchAQ(os.NewFile(fdWatch, "watch"))
	// Keep the ladder's signals from killing init before the engine runs
	// (they are forwarded once it does).
	sigs := make(chan os.Signal, 8)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP, syscall.SIGQUIT, syscall.SIGUSR1, syscall.SIGUSR2)

	_ = unix.Sethostname([]byte("aq-sandbox"))
	var sockDir *os.File
	if o.ProxySocket != "" {
		// Opened before the pivot: the socket is reached through it after.
		if sockDir, err = os.OpenFile(filepath.Dir(o.ProxySocket), unix.O_PATH|unix.O_DIRECTORY, 0); err != nil {
			return fail(&StartError{Step: "open the proxy's socket", Err: err})
		}
	}
	step("orders")
	notes, err := makeRoot(o.Root, o.View)
	if err != nil {
		return fail(err)
	}
	step("mounts")
	if err := pivot(o.Root); err != nil {
		return fail(&StartError{Step: "pivot into the sandbox", Err: err})
	}
	step("pivot")
	if err := loopbackUp(); err != nil {
		return fail(&StartError{Step: "loopback", Err: err})
	}
	step("loopback")
	if sockDir != nil {
		ln, err := net.Listen("tcp4", "127.0.0.1:"+strconv.Itoa(ProxyBridgePort))
		if err != nil {
			return fail(&StartError{Step: "proxy bridge", Err: err})
		}
		go bridge(ln, sockDir, filepath.Base(o.ProxySocket), "")
		notes = append(notes, bridgeGateways(o.Gateways, sockDir, filepath.Base(o.ProxySocket))...)
	}
	if o.Probe {
		report(status{Started: true, Notes: notes})
		return 0
	}
	fd, flags, err := o.Rules.rulesetFD()
	if err != nil {
		return fail(&StartError{Step: "landlock ruleset", Err: err})
	}
	step("landlock ruleset")
	engine, err := startRestricted(o, fd, flags)
	if fd >= 0 {
		_ = unix.Close(fd)
	}
	if err != nil {
		return fail(err)
	}
	step("engine started")
	if o.Trace {
		notes = append(notes, "steps since init's start: "+strings.Join(steps, ", "))
	}
	report(status{Started: true, Notes: notes})
	go func() {
		for s := range sigs {
			_ = syscall.Kill(-engine.Pid, s.(syscall.Signal))
		}
	}()
	ws := reap(engine.Pid)
	end := status{}
	code := 0
	switch {
	case ws.Signaled():
		end.Signal = signalName(ws.Signal())
		code = 128 + int(ws.Signal())
	default:
		code = ws.ExitStatus()
		end.Exit = &code
	}
	report(end)
	return code
}

// startRestricted starts the engine from a thread of its own that drops
// every privilege and enters the Landlock domain first; the thread dies
// with its goroutine, so init keeps its own.
func startRestricted(o orders, fd int, flags uint32) (*os.Process, error) {
	type started struct {
		p   *os.Process
		err error
	}
	ch := make(chan started, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: this thread is the engine's, and dies here
		if err := restrictThread(fd, flags); err != nil {
			ch <- started{err: err}
			return
		}
		argv := append([]string{o.Path}, o.Args...)
		p, err := os.StartProcess(o.Path, argv, &os.ProcAttr{
			Dir: o.Dir, Env: o.Env,
			Files: []*os.File{os.Stdin, os.Stdout, os.Stderr},
			Sys:   &syscall.SysProcAttr{Setpgid: true},
		})
		if err != nil {
			var pe *os.PathError
			if errors.As(err, &pe) {
				err = pe.Err
			}
			err = &StartError{Step: "exec " + o.Path, Err: err}
		}
		ch <- started{p: p, err: err}
	}()
	s := <-ch
	return s.p, s.err
}

// reap waits for every process of the sandbox: the engine's end is its
// status; once the engine is gone, whatever is left is killed (the
// sandbox is the job's, and so is everything in it), and reaped too.
func reap(engine int) syscall.WaitStatus {
	var engineWS syscall.WaitStatus
	for {
		var ws syscall.WaitStatus
		pid, err := syscall.Wait4(-1, &ws, 0, nil)
		if err == syscall.EINTR {
			continue
		}
		if err != nil { // ECHILD: nothing is left
			return engineWS
		}
		if pid == engine {
			engineWS = ws
			_ = syscall.Kill(-1, syscall.SIGKILL) // everything but init
		}
	}
}

// watchAQ ends the sandbox when aq's end of the pipe closes: aq died.
func watchAQ(f *os.File) {
	buf := make([]byte, 1)
	for {
		if _, err := f.Read(buf); err != nil {
			break
		}
	}
	_ = syscall.Kill(-1, syscall.SIGKILL)
	os.Exit(137)
}

// loopbackUp brings lo up in the sandbox's network namespace.
func loopbackUp() error {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer func() { _ = unix.Close(fd) }()
	ifr, err := unix.NewIfreq("lo")
	if err != nil {
		return err
	}
	if err := unix.IoctlIfreq(fd, unix.SIOCGIFFLAGS, ifr); err != nil {
		return err
	}
	ifr.SetUint16(ifr.Uint16() | unix.IFF_UP | unix.IFF_RUNNING)
	return unix.IoctlIfreq(fd, unix.SIOCSIFFLAGS, ifr)
}

// bridgeGateways listens, inside the sandbox, at each gateway's loopback
// addresses (GatewayListens) and bridges them through the proxy; what it
// cannot listen at (the proxy's own 127.0.0.1:ProxyBridgePort, an ::1 on
// a host without IPv6) is a note, and the rest goes on.
func bridgeGateways(gateways []string, dir *os.File, name string) []string {
	var notes []string
	for _, g := range gateways {
		for _, addr := range GatewayListens(g) {
			if addr == "127.0.0.1:"+strconv.Itoa(ProxyBridgePort) {
				notes = append(notes, fmt.Sprintf("gateway %s: %s is the proxy's own address inside the sandbox; it is not bridged (use another port)", g, addr))
				continue
			}
			ln, err := net.Listen("tcp", addr)
			if err != nil {
				notes = append(notes, fmt.Sprintf("gateway %s: cannot listen at %s inside the sandbox: %v", g, addr, err))
				continue
			}
			go bridge(ln, dir, name, g)
		}
	}
	return notes
}

// bridge carries each connection ln accepts to the job's proxy: the unix
// socket name in the folder dir (on the host, opened before the pivot),
// reached through /proc/self/fd — as it comes for the proxy's own address
// (127.0.0.1:ProxyBridgePort inside the sandbox, target ""), or, for a
// gateway's (target its "host:port"), through a CONNECT to target that
// the proxy decides on as on any. bridge holds dir for as long as it
// accepts: were dir unreachable, a garbage collection of init would close
// it (its finalizer), and every connection after would be reset — a job's
// network gone after the runtime's first collection (the 2-minute forced
// one at the latest).
func bridge(ln net.Listener, dir *os.File, name, target string) {
	defer runtime.KeepAlive(dir)
	sock := "/proc/self/fd/" + strconv.Itoa(int(dir.Fd())) + "/" + name
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		go carry(c, sock, target)
	}
}

// refuseGateway answers the engine's request on c with the proxy's
// refusal resp, once the request's header is in (an answer before it
// reads as unsolicited), and lets the engine finish sending before the
// connection closes (closing on unread bytes resets it, and the answer
// with it). A connection that does not start with an HTTP request (TLS to
// a gateway) is closed.
func refuseGateway(c net.Conn, resp *http.Response) {
	defer resp.Body.Close()
	_ = c.SetDeadline(time.Now().Add(30 * time.Second))
	if _, err := http.ReadRequest(bufio.NewReader(c)); err != nil {
		return
	}
	resp.Close = true
	if err := resp.Write(c); err != nil {
		return
	}
	if cw, ok := c.(interface{ CloseWrite() error }); ok {
		_ = cw.CloseWrite()
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(c, 1<<20))
}

// carry carries one connection to the proxy, through a CONNECT to target
// when there is one. A proxy that refuses the CONNECT (or cannot reach the
// target) has its answer passed to the engine as it is: an HTTP client —
// a gateway is called over HTTP — reads the 403 with the proxy's marker
// (X-Aq-Egress, "aq egress proxy:") and says why.
func carry(c net.Conn, sock, target string) {
	defer c.Close()
	u, err := net.Dial("unix", sock)
	if err != nil {
		return
	}
	defer u.Close()
	var from io.Reader = u
	if target != "" {
		if _, err := fmt.Fprintf(u, "CONNECT %s HTTP/1.1\r\nHost: %s\r\n\r\n", target, target); err != nil {
			return
		}
		br := bufio.NewReader(u)
		resp, err := http.ReadResponse(br, &http.Request{Method: http.MethodConnect})
		if err != nil {
			return
		}
		if resp.StatusCode != http.StatusOK {
			refuseGateway(c, resp)
			return
		}
		if br.Buffered() > 0 {
			from = br
		}
	}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		_, _ = io.Copy(u, c)
		if cw, ok := u.(interface{ CloseWrite() error }); ok {
			_ = cw.CloseWrite()
		}
	}()
	_, _ = io.Copy(c, from) // TCP from unix: the kernel splices it
	if cw, ok := c.(interface{ CloseWrite() error }); ok {
		_ = cw.CloseWrite()
	}
	wg.Wait()
}
