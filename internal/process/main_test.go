//go:build unix

package process_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/aqfleet/aq/internal/process"
)

// childModeEnv selects what the re-executed test binary does instead of
// running the tests: it is the fake engine of these tests.
const childModeEnv = "AQ_PROCESS_TEST_CHILD"

// TestMain runs a child mode when the test binary is re-executed as a child
// process (buildkite's internal/process/main_test.go does the same).
func TestMain(m *testing.M) {
	if code, ok := process.MaybeSupervise(); ok { // the test binary stands in for aq
		os.Exit(code)
	}
	if mode := os.Getenv(childModeEnv); mode != "" {
		switch mode {
		case "disposition", "run-ignoring-int": // they look at an inherited disposition
		default:
			defaultSignals()
		}
		os.Exit(child(mode, os.Args[1:]))
	}
	os.Exit(m.Run())
}

// stopSignals are the signals the children of these tests are stopped by or
// send themselves.
var stopSignals = []os.Signal{syscall.SIGHUP, syscall.SIGINT, syscall.SIGTERM, syscall.SIGQUIT}

// defaultSignals gives a child the default disposition of stopSignals, as
// an engine started from an interactive shell has them. A process started
// with one of them ignored — under nohup (SIGHUP), or in the background of a
// shell without job control (SIGINT, SIGQUIT) — keeps it ignored, and a Go
// program does too; the child sets its own: it catches the ignored ones,
// then executes itself again, and exec resets a caught signal to its default
// (an ignored one would stay ignored). The pid stays the same.
func defaultSignals() {
	var ignored []os.Signal
	for _, s := range stopSignals {
		if signal.Ignored(s) {
			ignored = append(ignored, s)
		}
	}
	if len(ignored) == 0 {
		return
	}
	signal.Notify(make(chan os.Signal, 1), ignored...)
	self, err := os.Executable()
	if err == nil {
		err = syscall.Exec(self, os.Args, os.Environ())
	}
	fmt.Fprintln(os.Stderr, "child: cannot reset the ignored signals", ignored, "by executing itself again:", err)
	os.Exit(97)
}

// child runs one mode and returns its exit code. Modes that must be signalled
// to end print "ready" once their signal dispositions are in place.
func child(mode string, args []string) int {
	arg := func(i int, def string) string {
		if i < len(args) {
			return args[i]
		}
		return def
	}
	switch mode {
	case "echo": // stdin to stdout, a line on stderr, exit args[0]
		if _, err := io.Copy(os.Stdout, os.Stdin); err != nil {
			fmt.Fprintln(os.Stderr, "echo:", err)
			return 99
		}
		fmt.Fprintln(os.Stderr, "to-stderr")
		code, _ := strconv.Atoi(arg(0, "0"))
		return code

	case "env": // the environment, one entry a line
		for _, kv := range os.Environ() {
			fmt.Println(kv)
		}
		return 0

	case "lines": // args[0] lines, each printed only after the previous one was answered on stdin
		n, _ := strconv.Atoi(arg(0, "3"))
		in := bufio.NewReader(os.Stdin)
		for i := range n {
			fmt.Printf("line %d\n", i)
			if _, err := in.ReadString('\n'); err != nil {
				return 96
			}
		}
		return 0

	case "ready-sleep": // args[0] is how it takes signals; then sleeps until signalled
		switch arg(0, "default") {
		case "exit130": // like an engine that stops cleanly on Ctrl-C
			c := make(chan os.Signal, 1)
			signal.Notify(c, syscall.SIGINT)
			go func() { <-c; os.Exit(130) }()
		case "ignore-int":
			signal.Ignore(syscall.SIGINT)
		case "ignore-int-term":
			signal.Ignore(syscall.SIGINT, syscall.SIGTERM)
		}
		fmt.Println("ready")
		time.Sleep(time.Hour)
		return 0

	case "sleep":
		time.Sleep(time.Hour)
		return 0

	case "group-grandchild": // a grandchild in our group that ignores SIGINT
		gc := startReady(false, "ignore-int")
		fmt.Printf("gc %d\n", gc)
		time.Sleep(time.Hour) // SIGINT ends us, not the grandchild
		return 0

	case "escape": // a grandchild that calls setsid; exit 0 when stdin closes
		gc := startReady(true, arg(0, "default"))
		fmt.Printf("pids %d %d\n", os.Getpid(), gc)
		_, _ = io.Copy(io.Discard, os.Stdin)
		return 0

	case "no-stdin": // exit without reading stdin
		code, _ := strconv.Atoi(arg(0, "0"))
		return code

	case "hold-stdout": // a grandchild in our group keeps our stdout open after we exit
		gc := startSleeper(os.Environ(), false)
		fmt.Printf("gc %d\n", gc)
		return 0

	case "hold-stdout-untraceable": // same, but it left the group and dropped the tag; its pid goes to file args[0]
		var env []string
		for _, kv := range os.Environ() {
			if !strings.HasPrefix(kv, process.TagEnv+"=") {
				env = append(env, kv)
			}
		}
		gc := startSleeper(env, true)
		if err := os.WriteFile(arg(0, ""), []byte(strconv.Itoa(gc)), 0o644); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 97
		}
		return 0

	case "aq": // an aq running one engine (mode escape) under process.Run; args: tag, supervised 0|1
		var sup string
		if arg(1, "1") == "1" {
			sup, _ = os.Executable()
		}
		self, _ := os.Executable()
		stdin, _ := io.Pipe() // never closed: the engine runs until stopped
		_, err := process.Run(context.Background(), process.Spec{
			Path: self, Env: append(os.Environ(), childModeEnv+"=escape"), Stdin: stdin, Stdout: os.Stdout,
			Tag: arg(0, ""), Scope: "supervise-test", Grace: 200 * time.Millisecond, Supervisor: sup,
		})
		fmt.Fprintln(os.Stderr, "run returned:", err)
		return 95

	case "cleanup-on-int": // an engine that cleans up on SIGINT: writes file args[0], then exits
		c := make(chan os.Signal, 1)
		signal.Notify(c, syscall.SIGINT)
		fmt.Println("ready")
		<-c
		_ = os.WriteFile(arg(0, ""), []byte("cleaned up\n"), 0o644)
		return 130

	case "disposition": // how it found SIGINT: "ignored" or "default"
		if signal.Ignored(syscall.SIGINT) {
			fmt.Println("ignored")
		} else {
			fmt.Println("default")
		}
		return 0

	case "run-ignoring-int": // started with SIGINT ignored, runs an engine through process.Run
		self, _ := os.Executable()
		if !signal.Ignored(syscall.SIGINT) {
			fmt.Println("SIGINT is not ignored here: the test's set-up failed")
			return 94
		}
		res, err := process.Run(context.Background(), process.Spec{
			Path: self, Env: append(os.Environ(), childModeEnv+"=disposition"), Tag: "disposition-" + strconv.Itoa(os.Getpid()),
			Stdout: os.Stdout, Stderr: os.Stderr, Grace: 10 * time.Second,
		})
		if err != nil || res.ExitCode != 0 {
			fmt.Fprintln(os.Stderr, "run:", err, res.ExitCode)
			return 93
		}
		return 0

	case "self-signal": // dies of SIGHUP without anyone stopping it
		_ = syscall.Kill(os.Getpid(), syscall.SIGHUP)
		time.Sleep(time.Minute) // a guard: SIGHUP ends it long before
		fmt.Fprintln(os.Stderr, "self-signal: still alive a minute after SIGHUP (is it ignored?)")
		return 95
	}
	fmt.Fprintln(os.Stderr, "unknown child mode", mode)
	return 98
}

// startReady starts the test binary in mode ready-sleep and waits until it
// has set up its signals. It returns the grandchild's pid.
func startReady(setsid bool, disposition string) int {
	self, _ := os.Executable()
	cmd := exec.Command(self, disposition)
	cmd.Env = append(os.Environ(), childModeEnv+"=ready-sleep")
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: setsid}
	if err := startWaitReady(cmd); err != nil {
		panic("grandchild: " + err.Error())
	}
	return cmd.Process.Pid
}

// startWaitReady starts cmd, a child in a mode that prints "ready" once its
// signal dispositions are in place, and waits for that line.
func startWaitReady(cmd *exec.Cmd) error {
	out, err := cmd.StdoutPipe()
	if err != nil {
		return err
	}
	if err := cmd.Start(); err != nil {
		return err
	}
	if line, _ := bufio.NewReader(out).ReadString('\n'); line != "ready\n" {
		return fmt.Errorf("not ready: %q", line)
	}
	return nil
}

// startSleeper starts the test binary in mode sleep with our stdout and
// stderr, and returns its pid.
func startSleeper(env []string, setsid bool) int {
	self, _ := os.Executable()
	cmd := exec.Command(self)
	cmd.Env = append(env, childModeEnv+"=sleep")
	cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: setsid}
	if err := cmd.Start(); err != nil {
		panic(err)
	}
	return cmd.Process.Pid
}
