package sandbox

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/aqfleet/aq/internal/egress"
	"github.com/aqfleet/aq/internal/process"
)

// BenchmarkSandboxStart is the mechanism comparison of docs/BENCHMARKS.md
// ("#23 The sandbox"): one op starts /bin/true and waits for it through the
// process layer, as aq starts an engine, in each of
//
//	bare      no sandbox (today's unsandboxed engine)
//	partial   Landlock alone (no namespaces), as where user namespaces are blocked
//	full      aq re-executed as the sandbox's init: namespaces, the job's file
//	          view (a home, eight caches as overlays, hidden trees), Landlock
//	          on top
//	full-nocache  the same without the caches: the overlays' cost (the init's
//	          mount step, from its trace, is reported for both)
//	bwrap     bubblewrap doing the same kind of job (new namespaces, the host
//	          read-only, the worktree read-write, a fresh /dev, /proc and /tmp),
//	          when it is installed (apt-get install bubblewrap)
//
// interleaved in one loop so that each variant meets the same load; it
// reports each one's p50 and p99 in ms and the full sandbox's added p50 and
// p99 over bare.
func BenchmarkSandboxStart(b *testing.B) {
	exe, err := os.Executable()
	if err != nil {
		b.Fatal(err)
	}
	root := b.TempDir()
	if d := os.Getenv("BENCH_ROOT"); d != "" { // e.g. /dev/shm: the layers on tmpfs
		root, _ = os.MkdirTemp(d, "aq-bench-")
		defer os.RemoveAll(root)
	}
	p := benchPolicy(b, root)
	h := &Host{opts: Options{Init: exe, Mode: ModeAuto}, report: Report{Level: LevelFull}}
	h.once.Do(func() {})
	full, err := h.Jail(p)
	if err != nil {
		b.Fatal(err)
	}
	defer full.Remove()
	full.trace = true
	bare := p
	bare.Caches = nil
	bare.JobDir += "-nocache"
	nocache, err := h.Jail(bare)
	if err != nil {
		b.Fatal(err)
	}
	defer nocache.Remove()
	nocache.trace = true
	partial := &Jail{h: h, p: p.Clean(), level: LevelPartial}
	bwrap, _ := exec.LookPath("bwrap")
	type variant struct {
		name string
		run  func() error
	}
	start := func(path string, args []string, jail process.Jail) func() error {
		return func() error {
			res, err := process.Run(context.Background(), process.Spec{Path: path, Args: args, Dir: p.Worktree,
				Env: []string{"PATH=/usr/bin:/bin", "HOME=" + p.Home}, Tag: "bench-" + strconv.Itoa(os.Getpid()), Grace: time.Second, Jail: jail})
			if err == nil && res.ExitCode != 0 {
				err = &exec.ExitError{}
			}
			return err
		}
	}
	vs := []variant{
		{"bare", start("/bin/true", nil, nil)},
		{"partial", start("/bin/true", nil, partial)},
		{"full", start("/bin/true", nil, full)},
		{"full-nocache", start("/bin/true", nil, nocache)},
	}
	if bwrap != "" {
		vs = append(vs, variant{"bwrap", start(bwrap, []string{"--unshare-all", "--die-with-parent", "--new-session",
			"--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc", "--tmpfs", "/tmp", "--tmpfs", root,
			"--bind", p.Worktree, p.Worktree, "--bind", p.JobHome(), p.Home, "--", "/bin/true"}, nil)})
	}
	times := make(map[string][]time.Duration, len(vs))
	mounts := map[*Jail][]time.Duration{} // the init's mount step, from its trace
	b.ResetTimer()
	for i := range b.N {
		for k := range vs {
			v := vs[(i+k)%len(vs)] // rotate the order: no variant always goes first
			t0 := time.Now()
			if err := v.run(); err != nil {
				b.Fatalf("%s: %v", v.name, err)
			}
			times[v.name] = append(times[v.name], time.Since(t0))
		}
		for _, j := range []*Jail{full, nocache} {
			for _, n := range j.Notes() {
				if d, ok := traceStep(n, "orders", "mounts"); ok {
					mounts[j] = append(mounts[j], d)
				}
			}
		}
	}
	b.StopTimer()
	ms := func(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
	for _, v := range vs {
		b.ReportMetric(ms(pct(times[v.name], 50)), v.name+"-p50-ms")
		b.ReportMetric(ms(pct(times[v.name], 99)), v.name+"-p99-ms")
	}
	b.ReportMetric(ms(pct(mounts[full], 50)), "full-mounts-p50-ms")
	b.ReportMetric(ms(pct(mounts[nocache], 50)), "nocache-mounts-p50-ms")
	b.ReportMetric(ms(pct(times["full"], 50)-pct(times["bare"], 50)), "full-added-p50-ms")
	b.ReportMetric(ms(pct(times["full"], 99)-pct(times["bare"], 99)), "full-added-p99-ms")
}

// benchPolicy is a job's policy over a small world under root: a worktree,
// a home with a toolchain and eight caches, aq's trees hidden.
func benchPolicy(b *testing.B, root string) Policy {
	for _, d := range []string{"aq/worktrees/app/j", "src/app/.git", "home/.local/bin", "home/.ssh"} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			b.Fatal(err)
		}
	}
	var caches []string
	for _, c := range HomeCaches[:8] { // as many as a developer's home has
		caches = append(caches, filepath.Join(root, "home", c))
	}
	for _, d := range caches { // each with something in it: an empty one would not be an overlay
		if err := os.MkdirAll(d, 0o755); err != nil {
			b.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(d, "entry"), []byte("cached"), 0o644); err != nil {
			b.Fatal(err)
		}
	}
	return Policy{
		Worktree: filepath.Join(root, "aq/worktrees/app/j"), GitDirs: []string{filepath.Join(root, "src/app/.git")},
		Home: filepath.Join(root, "home"), JobDir: filepath.Join(root, "aq/sandbox/j"),
		Hidden:   []string{filepath.Join(root, "aq"), filepath.Join(root, "src"), "/run"},
		ReadOnly: []string{filepath.Join(root, "home/.local/bin")},
		Caches:   caches,
	}
}

// pct is the p-th percentile of ds (nearest rank).
func pct(ds []time.Duration, p int) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	i := (len(s)*p + 99) / 100
	if i < 1 {
		i = 1
	}
	return s[i-1]
}

// traceStep is the time between two steps of an init's trace note
// ("steps since init's start: orders 0.36ms, mounts 2.05ms, …").
func traceStep(note, from, to string) (time.Duration, bool) {
	at := func(name string) (float64, bool) {
		i := strings.Index(note, name+" ")
		if i < 0 {
			return 0, false
		}
		rest := note[i+len(name)+1:]
		j := strings.Index(rest, "ms")
		if j < 0 {
			return 0, false
		}
		v, err := strconv.ParseFloat(rest[:j], 64)
		return v, err == nil
	}
	a, ok1 := at(from)
	b, ok2 := at(to)
	if !ok1 || !ok2 {
		return 0, false
	}
	return time.Duration((b - a) * float64(time.Millisecond)), true
}

// BenchmarkSandboxJobSteps takes a sandboxed job's sandbox apart (#35 item
// 2; docs/BENCHMARKS.md): one op does what the runner does for one job's
// sandbox — the job's directory made afresh, the egress proxy started, the
// jail made (its plan, passwd and group), the engine (`sh -c 'echo x > f'`)
// and verify (`sh -c 'test -f f'`) started in it and waited for, the
// proxy closed and the job's directory removed — timing each step, and,
// interleaved, the same engine and verify unsandboxed (each beside a
// supervisor, aq re-executed, as an unsandboxed job starts them). The
// policy is this host's: $HOME's caches (HOME, else the user's home) are
// the overlays they are for a job. BENCH_ROOT=/dev/shm puts the job's
// directory on tmpfs.
func BenchmarkSandboxJobSteps(b *testing.B) {
	exe, err := os.Executable()
	if err != nil {
		b.Fatal(err)
	}
	root := b.TempDir()
	if d := os.Getenv("BENCH_ROOT"); d != "" {
		root, _ = os.MkdirTemp(d, "aq-bench-")
		defer os.RemoveAll(root)
	}
	home := os.Getenv("HOME")
	if home == "" {
		home, _ = os.UserHomeDir()
	}
	aqHome := filepath.Join(root, "aq")
	wt := filepath.Join(aqHome, "worktrees", "app", "j")
	if err := os.MkdirAll(wt, 0o755); err != nil {
		b.Fatal(err)
	}
	p := NewPolicy(Paths{Worktree: wt, JobDir: filepath.Join(aqHome, "sandbox", "j"), Home: home,
		Hide: []string{aqHome}, Env: os.Environ()})
	h := &Host{opts: Options{Init: exe, Mode: ModeAuto}, report: Report{Level: LevelFull}}
	h.once.Do(func() {})
	env := []string{"PATH=/usr/bin:/bin", "HOME=" + home}
	run := func(script string, jail process.Jail) error {
		spec := process.Spec{Path: "/bin/sh", Args: []string{"-c", script}, Dir: wt, Env: env,
			Tag: "bench-" + strconv.Itoa(os.Getpid()), Grace: time.Second}
		if jail != nil {
			spec.Jail = jail
		} else {
			spec.Supervisor = exe
		}
		res, err := process.Run(context.Background(), spec)
		if err == nil && res.ExitCode != 0 {
			err = fmt.Errorf("%s: exit %d", script, res.ExitCode)
		}
		return err
	}
	steps := []string{"jobdir", "proxy", "jail", "engine", "verify", "proxy-close", "remove"}
	times := map[string][]time.Duration{}
	var mounts []time.Duration
	sandboxed := func() error {
		t := time.Now()
		lap := func(name string) {
			times[name] = append(times[name], time.Since(t))
			t = time.Now()
		}
		t0 := t
		if err := FreshJobDir(p.JobDir); err != nil {
			return err
		}
		lap("jobdir")
		pp := p
		pp.Net.ProxySocket = filepath.Join(p.JobDir, "proxy.sock")
		proxy, err := egress.Start(context.Background(), egress.Options{UnixSocket: pp.Net.ProxySocket})
		if err != nil {
			return err
		}
		lap("proxy")
		j, err := h.Jail(pp)
		if err != nil {
			return err
		}
		j.trace = true
		lap("jail")
		if err := run("echo x > f", j); err != nil {
			return err
		}
		lap("engine")
		if err := run("test -f f", j); err != nil {
			return err
		}
		lap("verify")
		for _, n := range j.Notes() {
			if d, ok := traceStep(n, "orders", "mounts"); ok {
				mounts = append(mounts, d)
			}
		}
		if err := proxy.Close(); err != nil {
			return err
		}
		lap("proxy-close")
		if err := j.Remove(); err != nil {
			return err
		}
		lap("remove")
		times["sandboxed"] = append(times["sandboxed"], time.Since(t0))
		return nil
	}
	bare := func() error {
		t0 := time.Now()
		if err := run("echo x > f", nil); err != nil {
			return err
		}
		if err := run("test -f f", nil); err != nil {
			return err
		}
		times["bare"] = append(times["bare"], time.Since(t0))
		return nil
	}
	b.ResetTimer()
	for i := range b.N {
		order := []func() error{sandboxed, bare}
		if i%2 == 1 {
			order[0], order[1] = order[1], order[0]
		}
		for _, f := range order {
			if err := f(); err != nil {
				b.Fatal(err)
			}
		}
	}
	b.StopTimer()
	ms := func(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
	for _, s := range append(steps, "sandboxed", "bare") {
		b.ReportMetric(ms(pct(times[s], 50)), s+"-p50-ms")
	}
	b.ReportMetric(ms(pct(mounts, 50)), "mounts-p50-ms")
	b.ReportMetric(ms(pct(times["sandboxed"], 50)-pct(times["bare"], 50)), "added-p50-ms")
}
