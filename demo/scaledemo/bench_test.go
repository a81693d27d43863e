package scaledemo

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/aqfleet/aq/demo"
	"github.com/aqfleet/aq/internal/testenv"
)

// The cold-start benchmark's repository: 10k files over 200 commits.
const (
	benchFiles   = 10000
	benchCommits = 200
)

// BenchmarkReplicaColdStart is a replica's cold start, as a scaler sees it:
// a job is submitted (the stub publishes its message to the pool's
// subscription) and at once `aq run --once` is started with a fresh
// AQ_HOME and no clones; one op ends when the replica has run the job and
// exited. It reports p50 and p99 over the ops of message published → engine
// started, and of each phase, read from the replica's own log (JSON) and the
// stub's audit trail:
//
//	process   exec → "aq daemon starting" (process start, configuration, capability detection)
//	enroll    → "aq daemon running" (enrollment, first heartbeat)
//	receive   → the stub handles POST /fleet/accept (broker link, receive)
//	accept    → "job accepted from the broker" (the accept's round trip)
//	building  → "cloning the repository on demand" (the building report)
//	clone     → "cloned" (blobless partial clone; with a mirror: borrowing its objects)
//	worktree  → "engine starting" (the linked worktree: checks out every file, fetching blobs)
//
// Sub-benchmarks: without and with a read-only mirror (AQ_REPO_MIRROR).
func BenchmarkReplicaColdStart(b *testing.B) {
	for _, mirror := range []bool{false, true} {
		name := "blobless"
		if mirror {
			name = "blobless+mirror"
		}
		b.Run(name, func(b *testing.B) { benchColdStart(b, mirror) })
	}
}

func benchColdStart(b *testing.B, mirror bool) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	r := &run{out: io.Discard, aq: testenv.BuildAQ(b), start: time.Now(), ws: b.TempDir()}
	r.env = demo.ChildEnv(nil, r.ws)
	peerDir := demo.FindPeerDir("")
	if why := demo.PeerMissing(r.env, peerDir); why != "" {
		b.Skip(why)
	}
	r.seedHistory = func(ctx context.Context, seed string) error {
		return fastImport(ctx, r, seed, benchFiles, benchCommits)
	}
	defer r.teardown(cancel)
	if err := r.setup(ctx, peerDir); err != nil {
		b.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(r.sig, "gate"), nil, 0o644); err != nil {
		b.Fatal(err)
	}
	r.env = append(r.env, "AQ_LOG_FORMAT=json")
	if mirror {
		mirrors := filepath.Join(r.ws, "mirrors")
		if _, err := r.git(ctx, "clone", "-q", "--mirror", filepath.Join(r.ws, "origins", repo+".git"), filepath.Join(mirrors, repo+".git")); err != nil {
			b.Fatal(err)
		}
		r.env = append(r.env, "AQ_REPO_MIRROR="+mirrors)
	}

	phases := []string{"process", "enroll", "receive", "accept", "building", "clone", "worktree"}
	samples := map[string][]time.Duration{}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		id := fmt.Sprintf("cold-%d", i)
		if err := r.submit(ctx, []string{id}, ""); err != nil {
			b.Fatal(err)
		}
		p := newReplica(r.ws, i+1)
		t0 := time.Now()
		if err := p.start(r.aq, r.env, "10s"); err != nil {
			b.Fatal(err)
		}
		<-p.done
		if p.code != 0 {
			b.Fatalf("%s exited %d: %s", p.id, p.code, testenv.ReadFile(b, p.logPath))
		}
		b.StopTimer()
		marks, lag, err := readMarks(p.logPath)
		if err != nil {
			b.Fatal(err)
		}
		var accepted time.Time
		for _, e := range r.stub.Events(id) {
			if e.Kind == "accepted" {
				accepted = e.At
			}
		}
		points := []time.Time{t0, marks["aq daemon starting"], marks["aq daemon running"], accepted,
			marks["job accepted from the broker"], marks["cloning the repository on demand (blobless)"], marks["cloned"], marks["engine starting"]}
		for k, ph := range phases {
			if points[k].IsZero() || points[k+1].IsZero() {
				b.Fatalf("%s: no time for phase %s in %s", p.id, ph, p.logPath)
			}
			samples[ph] = append(samples[ph], points[k+1].Sub(points[k]))
		}
		eng := marks["engine starting"]
		samples["exec-to-engine"] = append(samples["exec-to-engine"], eng.Sub(t0))
		samples["published-to-engine"] = append(samples["published-to-engine"], eng.Sub(marks["job accepted from the broker"].Add(-lag)))
		_ = os.RemoveAll(p.dir) // the host is gone: its disk with it
		b.StartTimer()
	}
	b.StopTimer()
	for _, ph := range append([]string{"published-to-engine", "exec-to-engine"}, phases...) {
		p50, p99 := percentiles(samples[ph])
		b.ReportMetric(ms(p50), ph+"-p50-ms")
		if ph == "published-to-engine" || ph == "exec-to-engine" {
			b.ReportMetric(ms(p99), ph+"-p99-ms")
		}
	}
}

// BenchmarkScaledToZeroIdle is what a pool scaled to zero costs while no
// message comes: one op is a second of idling with the scaler polling the
// subscription's depth (every 250 ms here; KEDA's default is 30 s).
// Reported per hour: aq processes alive, coordinator requests, scaler reads.
func BenchmarkScaledToZeroIdle(b *testing.B) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	r := &run{out: io.Discard, aq: testenv.BuildAQ(b), start: time.Now(), ws: b.TempDir()}
	r.env = demo.ChildEnv(nil, r.ws)
	peerDir := demo.FindPeerDir("")
	if why := demo.PeerMissing(r.env, peerDir); why != "" {
		b.Skip(why)
	}
	defer r.teardown(cancel)
	if err := r.setup(ctx, peerDir); err != nil {
		b.Fatal(err)
	}
	sctx, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); r.scaler.Run(sctx) }()
	reads0, _, started0, _ := r.scaler.Stats()
	req0 := r.stub.Stats().Total()
	t0 := time.Now()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		time.Sleep(time.Second)
	}
	b.StopTimer()
	stop()
	<-done
	hours := time.Since(t0).Hours()
	reads1, _, started1, _ := r.scaler.Stats()
	b.ReportMetric(float64(r.live()), "aq-processes")
	b.ReportMetric(float64(started1-started0)/hours, "replicas-started/h")
	b.ReportMetric(float64(r.stub.Stats().Total()-req0)/hours, "coordinator-requests/h")
	b.ReportMetric(float64(reads1-reads0)/hours, "scaler-reads/h")
}

// readMarks reads a replica's JSON log: the first time of each message, and
// the lag (enqueued → accepted) of the accepted message.
func readMarks(path string) (map[string]time.Time, time.Duration, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, 0, err
	}
	defer f.Close()
	marks := map[string]time.Time{}
	var lag time.Duration
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		var l struct {
			Time time.Time     `json:"time"`
			Msg  string        `json:"msg"`
			Lag  time.Duration `json:"lag"`
		}
		if json.Unmarshal(sc.Bytes(), &l) != nil || l.Msg == "" {
			continue
		}
		if _, seen := marks[l.Msg]; !seen {
			marks[l.Msg] = l.Time
		}
		if l.Msg == "job accepted from the broker" {
			lag = l.Lag
		}
	}
	return marks, lag, sc.Err()
}

func percentiles(ds []time.Duration) (p50, p99 time.Duration) {
	if len(ds) == 0 {
		return 0, 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	at := func(q float64) time.Duration { return s[min(len(s)-1, int(q*float64(len(s))))] }
	return at(0.5), at(0.99)
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// fastImport adds commits × (files/commits) small files to seed's main
// with git fast-import (seconds for 10k files, not minutes).
func fastImport(ctx context.Context, r *run, seed string, files, commits int) error {
	cmd := exec.CommandContext(ctx, "git", "-C", seed, "fast-import", "--quiet")
	cmd.Env = r.env
	in, err := cmd.StdinPipe()
	if err != nil {
		return err
	}
	var errb strings.Builder
	cmd.Stderr = &errb
	if err := cmd.Start(); err != nil {
		return err
	}
	w := bufio.NewWriter(in)
	per := files / commits
	for c := 0; c < commits; c++ {
		msg := fmt.Sprintf("commit %d", c)
		fmt.Fprintf(w, "commit refs/heads/main\ncommitter aq bench <bench@aq.invalid> %d +0000\ndata %d\n%s\n", 1700000000+c, len(msg), msg)
		if c == 0 {
			fmt.Fprintf(w, "from refs/heads/main^0\n")
		}
		for f := 0; f < per; f++ {
			n := c*per + f
			body := fmt.Sprintf("package p%d\n\n// file %d of the benchmark repository\nconst V%d = %d\n", n%100, n, n, n)
			fmt.Fprintf(w, "M 100644 inline src/d%02d/f%05d.go\ndata %d\n%s\n", n%100, n, len(body), body)
		}
	}
	if err := w.Flush(); err != nil {
		return err
	}
	in.Close()
	if err := cmd.Wait(); err != nil {
		return fmt.Errorf("git fast-import: %v: %s", err, errb.String())
	}
	return nil
}
