//go:build linux

package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"syscall"

	"github.com/aqfleet/aq/chaos"
)

func main() {
	if code, ok := chaos.RunHelper(); ok {
		os.Exit(code)
	}
	os.Exit(run())
}

func run() int {
	var (
		seed      = flag.Uint64("seed", 0, "the fault schedule's and the load's seed (0: a random one, printed)")
		size      = flag.String("size", "full", "full (make chaos) or reduced (the make test run)")
		jobs      = flag.Int("jobs", 0, "override the number of jobs")
		factories = flag.Int("factories", 0, "override the number of factories")
		mode      = flag.String("mode", "auto", "hosts: auto (namespaces when root with ip, else loopback), netns or 127.0.0.1")
		aq        = flag.String("aq", "", "the aq binary (default: build ./cmd/aq)")
		race      = flag.Bool("race", false, "build aq with -race")
		out       = flag.String("out", "", "write the Markdown report here (e.g. docs/RELIABILITY.md)")
		jsonOut   = flag.String("json", "", "write the result as JSON here")
		keep      = flag.Bool("keep", false, "keep the sandbox (it is kept anyway when an invariant breaks)")
		dir       = flag.String("dir", "", "the sandbox directory (default: a new one under /dev/shm or the temp dir)")
		sbMode    = flag.String("sandbox", "auto", "AQ_SANDBOX of the factories: auto (the full sandbox where this host can), on, off")
		straggle  = flag.Bool("stragglers", false, "let engines daemonise stragglers even where they are not fully sandboxed (the straggler invariant then shows what the sandbox is for)")
	)
	flag.Parse()
	if *seed == 0 {
		*seed = rand.Uint64N(1 << 48)
	}
	var cfg chaos.Config
	switch *size {
	case "full":
		cfg = chaos.Full(*seed)
	case "reduced":
		cfg = chaos.Reduced(*seed)
	default:
		fmt.Fprintf(os.Stderr, "chaos: --size %q: full or reduced\n", *size)
		return 2
	}
	if *jobs > 0 {
		cfg.Jobs = *jobs
	}
	if *factories > 0 {
		cfg.Factories = *factories
	}
	cfg.Mode, cfg.Keep, cfg.Dir, cfg.Progress = *mode, *keep, *dir, os.Stderr
	cfg.Sandbox, cfg.Stragglers = *sbMode, *straggle
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	cfg.AQ, cfg.AQRace = *aq, *race
	if cfg.AQ == "" {
		tmp, err := os.MkdirTemp("", "aq-chaos-bin-")
		if err != nil {
			fmt.Fprintln(os.Stderr, "chaos:", err)
			return 2
		}
		defer os.RemoveAll(tmp)
		cfg.AQ = filepath.Join(tmp, "aq")
		args := []string{"build", "-o", cfg.AQ}
		if *race {
			args = append(args, "-race")
		}
		cmd := exec.CommandContext(ctx, "go", append(args, "./cmd/aq")...)
		cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
		if !*race {
			cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		}
		fmt.Fprintf(os.Stderr, "chaos: building aq (%s)\n", map[bool]string{true: "-race", false: "without -race"}[*race])
		if err := cmd.Run(); err != nil {
			fmt.Fprintln(os.Stderr, "chaos: go build ./cmd/aq:", err)
			return 2
		}
	}
	fmt.Fprintf(os.Stderr, "chaos: seed %d (replay: go run ./chaos/cmd/chaos --seed %d --size %s)\n", *seed, *seed, *size)

	res, err := chaos.Run(ctx, cfg)
	if res != nil && res.Checks != nil {
		if *out != "" {
			if werr := writeFile(*out, func(f *os.File) error { return chaos.WriteMarkdown(f, res) }); werr != nil {
				fmt.Fprintln(os.Stderr, "chaos:", werr)
			} else {
				fmt.Fprintln(os.Stderr, "chaos: report written to", *out)
			}
		}
		if *jsonOut != "" {
			if werr := writeFile(*jsonOut, func(f *os.File) error {
				enc := json.NewEncoder(f)
				enc.SetIndent("", "  ")
				return enc.Encode(res)
			}); werr != nil {
				fmt.Fprintln(os.Stderr, "chaos:", werr)
			}
		}
	}
	switch {
	case err != nil && errors.Is(err, context.Canceled):
		fmt.Fprintln(os.Stderr, "chaos: interrupted; everything torn down")
		return 2
	case err != nil:
		fmt.Fprintln(os.Stderr, "chaos:", err)
		if res != nil && res.Dir != "" {
			fmt.Fprintln(os.Stderr, "chaos: the sandbox is kept at", res.Dir)
		}
		return 2
	case !res.Checks.OK():
		fmt.Fprintf(os.Stderr, "chaos: seed %d: %s\n", *seed, res.Checks.Summary())
		for _, f := range res.Checks.Failed() {
			fmt.Fprintln(os.Stderr, "  "+f)
		}
		fmt.Fprintln(os.Stderr, "chaos: the sandbox is kept at", res.Dir)
		return 1
	}
	fmt.Fprintf(os.Stderr, "chaos: seed %d: %s in %s\n", *seed, res.Checks.Summary(), res.Duration.Round(1e9))
	return 0
}

func writeFile(path string, fn func(*os.File) error) error {
	tmp := path + ".tmp"
	f, err := os.Create(tmp)
	if err != nil {
		return err
	}
	if err := fn(f); err != nil {
		f.Close()
		os.Remove(tmp)
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}
