//go:build unix && !unit

package fleet

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/aqfleet/aq/agent/daemon"
	"github.com/aqfleet/aq/demo/coord"
	"github.com/aqfleet/aq/internal/process"
)

// BenchmarkDaemonIdle measures a real `aq daemon` process (the binary built
// without -race under `make bench`) idling at production cadences
// (AQ_HEARTBEAT_SEC=30, AQ_POLL_SECONDS=15, gate on) against the stub, on the
// broker path (a healthy local AMQP peer) and on the gated poll path (no
// broker). After the daemon is running and has settled (5 s), it samples
// the process for a window (IDLE_BENCH_SECONDS, default 30 s):
//
//   - rss-MiB: resident memory (VmRSS of /proc/PID/status) at the end;
//     anon-MiB is its private part (RssAnon: heap, stacks), the rest is the
//     binary's pages mapped from the page cache (shared, reclaimable);
//   - hwm-MiB: the peak resident memory since start (VmHWM);
//   - cpu-s/h: CPU time used in the window (user+system, summed over the
//     process's threads from /proc/PID/task/*/schedstat, nanosecond
//     resolution) scaled linearly to one hour;
//   - requests/h: what the stub counted in the window, scaled to one hour.
//
// A window of W seconds holds about W/30 heartbeats and, gated, W/120 or so
// queue-state reads: the per-request cost is small next to the runtime's own
// idle work (timers, GC, the scavenger), so the linear extrapolation is
// sound; a longer window narrows it.
func BenchmarkDaemonIdle(b *testing.B) {
	window := 30 * time.Second
	if s := os.Getenv("IDLE_BENCH_SECONDS"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n <= 0 {
			b.Fatalf("IDLE_BENCH_SECONDS=%q", s)
		}
		window = time.Duration(n) * time.Second
	}
	for _, path := range []string{"broker", "poll-gated"} {
		b.Run(path, func(b *testing.B) {
			var rss, anon, hwm, cpu, reqs float64
			for i := 0; i < b.N; i++ {
				s := idleOnce(b, path == "broker", window)
				rss += s.rss
				anon += s.anon
				hwm += s.hwm
				cpu += s.cpuPerHour
				reqs += s.requestsPerHour
			}
			n := float64(b.N)
			b.ReportMetric(rss/n, "rss-MiB")
			b.ReportMetric(anon/n, "anon-MiB")
			b.ReportMetric(hwm/n, "hwm-MiB")
			b.ReportMetric(cpu/n, "cpu-s/h")
			b.ReportMetric(reqs/n, "requests/h")
		})
	}
}

type idleSample struct {
	rss, anon, hwm, cpuPerHour, requestsPerHour float64
}

func idleOnce(b *testing.B, broker bool, window time.Duration) idleSample {
	b.Helper()
	e := newDaemonEnv(b, broker, "AQ_HEARTBEAT_SEC=30", "AQ_POLL_SECONDS=15", "AQ_FLEET_GATE=1", "AQ_LOG_LEVEL=info")
	p := e.startDaemon()
	want := "poll"
	if broker {
		want = "broker"
	}
	e.waitFor(p, "the "+want+" path", func() bool {
		st := e.status()
		return st != nil && st.Stage == daemon.StageRunning && st.Source == want
	})
	time.Sleep(5 * time.Second) // settle: start-up allocations, the first gate read
	pid := p.cmd.Process.Pid
	e.stub.ResetStats()
	cpu0 := cpuNS(b, pid)
	time.Sleep(window)
	cpu1 := cpuNS(b, pid)
	mem := memKB(b, pid)
	st := e.stub.Stats()
	_ = process.Terminate(p.cmd.Process)
	<-p.done
	scale := float64(time.Hour) / float64(window)
	return idleSample{
		rss: float64(mem["VmRSS"]) / 1024, anon: float64(mem["RssAnon"]) / 1024, hwm: float64(mem["VmHWM"]) / 1024,
		cpuPerHour:      float64(cpu1-cpu0) / 1e9 * scale,
		requestsPerHour: float64(st.Total()-st.Count(coord.RouteGetStats)) * scale,
	}
}

// cpuNS sums the CPU time of pid's threads (/proc/PID/task/*/schedstat, the
// first field: time on a CPU, in nanoseconds).
func cpuNS(b *testing.B, pid int) int64 {
	b.Helper()
	tasks, err := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/schedstat", pid))
	if err != nil || len(tasks) == 0 {
		b.Skipf("no /proc/%d/task/*/schedstat here (%v): cannot measure CPU time", pid, err)
	}
	var sum int64
	for _, f := range tasks {
		raw, err := os.ReadFile(f)
		if err != nil {
			continue // a thread that just exited
		}
		fields := strings.Fields(string(raw))
		if len(fields) == 0 {
			continue
		}
		n, _ := strconv.ParseInt(fields[0], 10, 64)
		sum += n
	}
	return sum
}

// memKB reads the kB fields of /proc/PID/status (VmRSS, RssAnon, VmHWM).
func memKB(b *testing.B, pid int) map[string]int64 {
	b.Helper()
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		b.Skipf("no /proc/%d/status here: %v", pid, err)
	}
	out := map[string]int64{}
	for _, line := range bytes.Split(raw, []byte("\n")) {
		k, v, ok := strings.Cut(string(line), ":")
		if f := strings.Fields(v); ok && len(f) == 2 && f[1] == "kB" {
			n, _ := strconv.ParseInt(f[0], 10, 64)
			out[k] = n
		}
	}
	return out
}
