package fleet

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aqfleet/aq/demo/coord"
	"github.com/aqfleet/aq/demo/coord/coordtest"
	"github.com/aqfleet/aq/internal/process"
	"github.com/aqfleet/aq/internal/secrets"
	"github.com/aqfleet/aq/internal/testenv"
)

// The live log's cost and latency (docs/BENCHMARKS.md, "Live logs").

// wireCount counts what reaches the coordinator on the live log route:
// requests, and their bytes (request line, headers, body).
type wireCount struct {
	requests, bytes atomic.Int64
}

func (w *wireCount) wrap(h http.Handler) http.Handler {
	return http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPost && strings.HasSuffix(r.URL.Path, "/log") {
			n := int64(len(r.Method) + 1 + len(r.URL.RequestURI()) + 1 + len(r.Proto) + 2 + 2)
			n += int64(len("Host: ") + len(r.Host) + 2)
			for k, vs := range r.Header {
				for _, v := range vs {
					n += int64(len(k) + 2 + len(v) + 2)
				}
			}
			w.requests.Add(1)
			w.bytes.Add(n + max(r.ContentLength, 0))
		}
		h.ServeHTTP(rw, r)
	})
}

// engineOutput makes what an engine writes: stream-json lines cycled from
// the claude recordings in engines/testdata (each with a fresh id, as real
// events have), or a build's text lines, or text gzip cannot shrink.
type engineOutput struct {
	kind  string // claude | build | random
	lines [][]byte
	i     int
	rnd   *rand.Rand
}

func newEngineOutput(tb testing.TB, kind string) *engineOutput {
	o := &engineOutput{kind: kind, rnd: rand.New(rand.NewPCG(1, 2))}
	if kind == "claude" {
		files, _ := filepath.Glob(filepath.Join(testenv.ClaudeTestdata(tb), "*.jsonl"))
		for _, f := range files {
			b, err := os.ReadFile(f)
			if err != nil {
				tb.Fatal(err)
			}
			for _, l := range bytes.Split(b, []byte("\n")) {
				if len(bytes.TrimSpace(l)) > 0 && l[0] == '{' {
					o.lines = append(o.lines, l)
				}
			}
		}
		if len(o.lines) == 0 {
			tb.Fatal("no claude recordings")
		}
	}
	return o
}

// next is n bytes (or a little more: whole lines) of output.
func (o *engineOutput) next(n int) []byte {
	var b bytes.Buffer
	for b.Len() < n {
		o.i++
		switch o.kind {
		case "claude":
			l := o.lines[o.i%len(o.lines)]
			if i := bytes.LastIndexByte(l, '}'); i > 0 {
				fmt.Fprintf(&b, `%s,"aq_bench_id":"%016x"}`+"\n", l[:i], o.rnd.Uint64())
			} else {
				b.Write(l)
				b.WriteByte('\n')
			}
		case "build":
			pkgs := []string{"agent/fleet", "agent/runner", "engines", "worktree", "internal/process", "cmd/aq/cli"}
			p := pkgs[o.rnd.IntN(len(pkgs))]
			switch o.rnd.IntN(4) {
			case 0:
				fmt.Fprintf(&b, "=== RUN   TestStep%d/%s\n", o.i, strings.ReplaceAll(p, "/", "_"))
			case 1:
				fmt.Fprintf(&b, "--- PASS: TestCase%d (%.2fs)\n", o.i, o.rnd.Float64()*3)
			case 2:
				fmt.Fprintf(&b, "    %s/x_test.go:%d: step %d of %d: got %d, want %d\n", p, 10+o.rnd.IntN(900), o.i%17, 17, o.rnd.IntN(1000), o.rnd.IntN(1000))
			default:
				fmt.Fprintf(&b, "ok  \tgithub.com/aqfleet/aq/%s\t%.3fs\n", p, o.rnd.Float64()*40)
			}
		default:
			buf := make([]byte, 60)
			for i := range buf {
				buf[i] = byte(33 + o.rnd.IntN(94))
			}
			b.Write(buf)
			b.WriteByte('\n')
		}
	}
	return b.Bytes()
}

// benchRig is one claimed job on a stub behind a wire counter.
type benchRig struct {
	*liveRig
	wire *wireCount
}

func newBenchRig(b *testing.B, name string) *benchRig {
	b.Helper()
	wire := &wireCount{}
	st := &stub{coordtest.StartBehind(b, coord.Options{}, wire.wrap)}
	return &benchRig{liveRig: newLiveRig(b, st, testenv.ID(name)), wire: wire}
}

// BenchmarkLiveLogJobMinute: one job-minute of a running job's live log
// per workload — requests, and bytes on the wire against the engine's raw
// output. The minute is 60 flushes driven one a second by the benchmark
// (the flush loop's own pace: at most one a second), the engine's output
// for each second written before its flush. Over real HTTP to the stub.
func BenchmarkLiveLogJobMinute(b *testing.B) {
	for _, w := range []struct {
		name string
		kind string
		// per second of the minute: bytes the engine writes
		rate func(sec int) int
	}{
		{"silent", "claude", func(int) int { return 0 }},
		{"claude-sparse", "claude", func(sec int) int { // an event every 3 s
			if sec%3 == 0 {
				return 1
			}
			return 0
		}},
		{"claude-busy", "claude", func(int) int { return 4 << 10 }},
		{"build-20KiB/s", "build", func(int) int { return 20 << 10 }},
		{"build-200KiB/s", "build", func(int) int { return 200 << 10 }},
		{"random-20KiB/s", "random", func(int) int { return 20 << 10 }},
		{"burst-4MiB-once", "build", func(sec int) int {
			if sec == 30 {
				return 4 << 20
			}
			return 100
		}},
	} {
		b.Run(w.name, func(b *testing.B) {
			var reqs, ends, wire, raw, gaps, maxPerFlush, minutes int64
			for range b.N {
				r := newBenchRig(b, "bench-"+strings.ReplaceAll(w.name, "/", "-"))
				out := newEngineOutput(b, w.kind)
				s := r.stream(&LiveLogs{})
				ctx := context.Background()
				for sec := range 60 {
					if n := w.rate(sec); n > 0 {
						p := out.next(n)
						r.write(string(p))
						raw += int64(len(p))
					}
					before := r.wire.requests.Load()
					s.tick(ctx, false)
					maxPerFlush = max(maxPerFlush, r.wire.requests.Load()-before)
				}
				during := r.wire.requests.Load()
				st := s.Close(ctx, true)
				if st.Stopped != "" {
					b.Fatalf("stopped: %s", st.Stopped)
				}
				reqs += during
				ends += r.wire.requests.Load() - during
				wire += r.wire.bytes.Load()
				gaps += st.GapBytes
				minutes++
			}
			b.ReportMetric(float64(reqs)/float64(minutes), "requests/job-min")
			b.ReportMetric(float64(ends)/float64(minutes), "requests-at-end")
			b.ReportMetric(float64(maxPerFlush), "max-requests/flush")
			if raw > 0 {
				b.ReportMetric(float64(wire)/float64(raw), "wire/raw")
				b.ReportMetric(float64(raw)/float64(minutes)/1024, "raw-KiB/job-min")
				b.ReportMetric(float64(gaps)/float64(raw), "gap/raw")
			}
		})
	}
}

// binStub is `aq demo coordinator` as a process of its own, so that the
// benchmark's process is aq's side alone.
func binStub(b *testing.B) (api, token string) {
	b.Helper()
	bin := testenv.BuildAQ(b)
	cmd := exec.Command(bin, "demo", "coordinator", "--listen", "127.0.0.1:0")
	cmd.Env = append(os.Environ(), "AQ_HOME="+b.TempDir())
	process.SetGroup(cmd)
	out, err := cmd.StdoutPipe()
	if err != nil {
		b.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = process.KillGroup(cmd.Process.Pid); _ = cmd.Wait() })
	sc := bufio.NewScanner(out)
	for sc.Scan() {
		if _, after, ok := strings.Cut(sc.Text(), "listening on "); ok {
			api = after
		}
		if t, ok := strings.CutPrefix(sc.Text(), "enrollment token: "); ok {
			token = t
			break
		}
	}
	if api == "" || token == "" {
		b.Fatal("the stub did not start")
	}
	go func() {
		for sc.Scan() {
		}
	}()
	return api, token
}

// BenchmarkLiveLogCPU: aq's CPU per MB of engine output streamed (read
// from the log, masked, gzipped, base64, JSON, HTTP), the coordinator a
// process of its own; the engine's writes are not counted.
func BenchmarkLiveLogCPU(b *testing.B) {
	if rusage() < 0 {
		b.Skip("no process CPU time on this platform")
	}
	for _, kind := range []string{"claude", "build", "random"} {
		b.Run(kind, func(b *testing.B) {
			api, tok := binStub(b)
			var cpu time.Duration
			var raw int64
			for i := range b.N {
				r := newLiveRigOn(b, api, tok, testenv.ID(fmt.Sprintf("bench-cpu-%s-%d", kind, i)))
				red := secrets.NewRedactor(nil)
				for i := range 10 {
					red.Add(fmt.Sprintf("secret-value-%02d-%s", i, strings.Repeat("x", 24)))
				}
				st := r.stream(&LiveLogs{Redactor: red})
				out := newEngineOutput(b, kind)
				ctx := context.Background()
				var streamed int64
				for streamed < 8<<20 {
					p := out.next(512 << 10)
					r.write(string(p))
					t0 := rusage()
					for st.due() {
						st.tick(ctx, false)
					}
					cpu += rusage() - t0
					streamed += int64(len(p))
				}
				if stats := st.Close(ctx, true); stats.Bytes+stats.GapBytes != streamed || stats.Gaps != 0 {
					b.Fatalf("streamed %d of %d bytes: %+v", stats.Bytes, streamed, stats)
				}
				raw += streamed
			}
			mb := float64(raw) / (1 << 20)
			b.ReportMetric(float64(cpu.Microseconds())/1000/mb, "cpu-ms/MB")
			b.ReportMetric(mb, "MB")
		})
	}
}

// BenchmarkLiveLogFollowLatency: from the moment an engine's line is in the
// job's log to the moment a follower elsewhere has it (the follower's long
// poll, GET /fleet/jobs/:id/log, as aq job logs -f and the board do), with
// the flush loop at its production pace (a flush a second at most).
// sparse: a line every 0.3–2.5 s (an agent thinking between events);
// chatty: 50 lines a second, each sample one of them. Samples per case:
// LIVELOG_BENCH_SAMPLES (default 10).
func BenchmarkLiveLogFollowLatency(b *testing.B) {
	samples := 10
	if v, err := strconv.Atoi(os.Getenv("LIVELOG_BENCH_SAMPLES")); err == nil && v > 0 {
		samples = v
	}
	for _, mode := range []string{"sparse", "chatty"} {
		b.Run(mode, func(b *testing.B) {
			var lat []time.Duration
			var reqs, seconds float64
			for range b.N {
				r := newBenchRig(b, "bench-latency-"+mode)
				ctx, cancel := context.WithCancel(context.Background())
				s := (&LiveLogs{Client: r.c, LogsDir: r.logs}).Start(ctx, r.claim, nil, nil)
				var mu sync.Mutex
				sent := map[int]time.Time{}
				got := make(chan time.Duration, samples*2)
				var wg sync.WaitGroup
				wg.Add(1)
				follower := r.s.operator(b)
				go func() { // the follower
					defer wg.Done()
					var off int64
					var partial []byte
					for ctx.Err() == nil {
						p, err := follower.ReadLog(ctx, r.claim.Job.ID, LogQuery{Epoch: r.claim.LeaseEpoch, Offset: off, Wait: time.Second})
						if err != nil {
							continue
						}
						now := time.Now()
						for _, rec := range p.Records {
							partial = append(partial, rec.Text...)
						}
						for {
							i := bytes.IndexByte(partial, '\n')
							if i < 0 {
								break
							}
							var n int
							if _, err := fmt.Sscanf(string(partial[:i]), "probe %d", &n); err == nil {
								mu.Lock()
								t0, ok := sent[n]
								mu.Unlock()
								if ok {
									got <- now.Sub(t0)
								}
							}
							partial = partial[i+1:]
						}
						off = p.Next
					}
				}()
				start := time.Now()
				rnd := rand.New(rand.NewPCG(3, 4))
				next := 0
				for i := range samples {
					switch mode {
					case "sparse":
						time.Sleep(300*time.Millisecond + time.Duration(rnd.Int64N(int64(2200*time.Millisecond))))
						mu.Lock()
						sent[i] = time.Now()
						mu.Unlock()
						r.write(fmt.Sprintf("probe %d\n", i))
					default:
						for range 25 { // half a second of 50 lines/s, one of them the sample
							time.Sleep(20 * time.Millisecond)
							next++
							if next%25 == 0 {
								mu.Lock()
								sent[i] = time.Now()
								mu.Unlock()
								r.write(fmt.Sprintf("probe %d\n", i))
								continue
							}
							r.write(fmt.Sprintf("chatter %d %s\n", next, strings.Repeat("-", 80)))
						}
					}
					select {
					case d := <-got:
						lat = append(lat, d)
					case <-time.After(30 * time.Second):
						b.Fatalf("sample %d never reached the follower", i)
					}
				}
				seconds += time.Since(start).Seconds()
				reqs += float64(r.wire.requests.Load())
				cancel()
				s.Close(context.Background(), false)
				wg.Wait()
			}
			slices.Sort(lat)
			q := func(p float64) float64 { return float64(lat[int(p*float64(len(lat)-1))].Microseconds()) / 1000 }
			b.ReportMetric(q(0.5), "p50-ms")
			b.ReportMetric(q(0.99), "p99-ms")
			b.ReportMetric(q(1), "max-ms")
			b.ReportMetric(reqs/seconds*60, "requests/job-min")
			b.ReportMetric(float64(len(lat)), "samples")
		})
	}
}
