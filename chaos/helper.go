//go:build linux

package chaos

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"

	"github.com/aqfleet/aq/demo/coord"
)

// The harness runs its helpers — the coordinator stub, a TCP forwarder, a
// reachability probe — as child processes of its own binary (the chaos
// command, or the test binary), selected by this environment variable as
// "KIND:CONFIG-FILE". A helper is a real process so that it can be killed
// with SIGKILL (the stub) or run inside a factory's network namespace (the
// forwarder, the probe).
const HelperEnv = "AQ_CHAOS_HELPER"

// RunHelper runs the helper the environment names, if any. A main (or
// TestMain) calls it first and exits with code when ok.
func RunHelper() (code int, ok bool) {
	v := os.Getenv(HelperEnv)
	if v == "" {
		return 0, false
	}
	kind, cfgPath, _ := strings.Cut(v, ":")
	var err error
	switch kind {
	case "coord":
		err = runCoordHelper(cfgPath)
	case "forward":
		err = runForwardHelper(cfgPath)
	case "probe":
		err = runProbeHelper(cfgPath)
	default:
		err = fmt.Errorf("unknown helper %q", kind)
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "chaos helper %s: %v\n", kind, err)
		return 1, true
	}
	return 0, true
}

// coordConfig configures the coordinator helper.
type coordConfig struct {
	Listen      string   `json:"listen"`
	StateFile   string   `json:"stateFile"`
	CallLog     string   `json:"callLog"`
	RequestLog  string   `json:"requestLog"`
	EnrollToken string   `json:"enrollToken"`
	LeaseTTLMs  int64    `json:"leaseTtlMs"`
	StaleMs     int64    `json:"staleMs"`
	ReapMs      int64    `json:"reapMs"`
	MaxBackoff  int64    `json:"maxBackoffMs"`
	Seed        uint64   `json:"seed"`
	FailRate    float64  `json:"failRate"`
	LatencyMs   int64    `json:"latencyMs"`
	FaultRoutes []string `json:"faultRoutes"`
	// Broker is the local peer's (loopback) connection string: the stub
	// publishes a targeted message per queued job.
	Broker   string `json:"broker"`
	RescanMs int64  `json:"rescanMs"`
}

func ms(n int64) time.Duration { return time.Duration(n) * time.Millisecond }

func readHelperConfig(path string, v any) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	return json.Unmarshal(b, v)
}

// runCoordHelper serves the coordinator stub until SIGTERM: state in a file
// (a SIGKILLed stub restarts with every change it acknowledged), every lease
// call appended to the call log before it is answered.
func runCoordHelper(cfgPath string) error {
	var c coordConfig
	if err := readHelperConfig(cfgPath, &c); err != nil {
		return err
	}
	calls, err := os.OpenFile(c.CallLog, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	defer calls.Close()
	var mu sync.Mutex
	o := coord.Options{
		EnrollToken: c.EnrollToken, LeaseTTL: ms(c.LeaseTTLMs), StaleAfter: ms(c.StaleMs), ReapEvery: ms(c.ReapMs),
		MaxBackoff: ms(c.MaxBackoff), StateFile: c.StateFile, Seed: c.Seed,
		FailRate: c.FailRate, Latency: ms(c.LatencyMs), FaultRoutes: c.FaultRoutes,
		OnCall: func(call coord.Call) {
			b, _ := json.Marshal(call)
			mu.Lock()
			defer mu.Unlock()
			// One write(2) per line: a SIGKILL cannot tear it, and the
			// page cache keeps it.
			_, _ = calls.Write(append(b, '\n'))
		},
	}
	if c.Broker != "" {
		pub, err := coord.NewPublisher(coord.PublisherOptions{
			ConnectionString: c.Broker, Rescan: ms(c.RescanMs),
			ClientOptions: &azservicebus.ClientOptions{RetryOptions: azservicebus.RetryOptions{MaxRetries: 1, RetryDelay: 100 * time.Millisecond, MaxRetryDelay: time.Second}},
		})
		if err != nil {
			return err
		}
		o.Publisher = pub
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	reqs, err := os.OpenFile(c.RequestLog, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	defer reqs.Close()
	lctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	ln, err := coord.ListenAgain(lctx, c.Listen) // the port its killed predecessor held may take a moment to free
	if err != nil {
		return err
	}
	s, err := coord.ServeOn(ctx, ln, o, func(h http.Handler) http.Handler { return requestLog(h, reqs) })
	if err != nil {
		return err
	}
	ready(s.Addr)
	select {
	case <-ctx.Done():
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = s.Shutdown(sctx)
		return nil
	case <-s.Done():
		s.Server.Close()
		return s.Err()
	}
}

// Request is one request a factory made of the stub, whatever the answer
// (an injected 503 included): the request log.
type Request struct {
	At      time.Time `json:"at"`
	Method  string    `json:"method"`
	Path    string    `json:"path"`
	Job     string    `json:"job,omitempty"`
	Factory string    `json:"factory,omitempty"`
	Epoch   int64     `json:"epoch,omitempty"`
	Status  int       `json:"status"`
}

// Renewal reports whether r is a lease renewal (of r.Job).
func (r Request) Renewal() bool { return strings.HasSuffix(r.Path, "/lease/renew") }

// requestLog logs every request on the factories' routes (not the
// harness's operator calls) with its answer.
func requestLog(h http.Handler, out *os.File) http.Handler {
	var mu sync.Mutex
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		path := strings.TrimPrefix(r.URL.Path, "/api")
		var body struct {
			JobID      string `json:"jobId"`
			FactoryID  string `json:"factoryId"`
			LeaseEpoch int64  `json:"leaseEpoch"`
		}
		if r.Body != nil && (r.Method == http.MethodPost || r.Method == http.MethodPatch) {
			b, _ := io.ReadAll(io.LimitReader(r.Body, 4<<20))
			r.Body.Close()
			_ = json.Unmarshal(b, &body)
			r.Body = io.NopCloser(bytes.NewReader(b))
		}
		rec := &coord.StatusRecorder{ResponseWriter: w}
		h.ServeHTTP(rec, r)
		if !strings.HasPrefix(path, "/fleet/") || path == "/fleet/_stats" || path == "/fleet/_faults" || (r.Method == http.MethodGet && path != "/fleet/queue-state") || path == "/fleet/jobs" {
			return
		}
		q := Request{At: time.Now().UTC(), Method: r.Method, Path: path, Job: body.JobID, Factory: body.FactoryID, Epoch: body.LeaseEpoch, Status: rec.Status()}
		if rest, ok := strings.CutPrefix(path, "/fleet/jobs/"); ok {
			q.Job, _, _ = strings.Cut(rest, "/")
		}
		b, _ := json.Marshal(q)
		mu.Lock()
		_, _ = out.Write(append(b, '\n'))
		mu.Unlock()
	})
}

// ready tells the harness where the helper listens: its first stdout line.
func ready(addr string) {
	b, _ := json.Marshal(map[string]any{"event": "ready", "addr": addr, "pid": os.Getpid()})
	fmt.Println(string(b))
}

// forwardConfig configures the forwarder helper.
type forwardConfig struct {
	Listen string `json:"listen"`
	Target string `json:"target"`
}

// runForwardHelper forwards TCP from Listen to Target until SIGTERM. Inside
// a factory's namespace it gives the factory a loopback address for the
// broker (aq dials a development connection string only on loopback) whose
// traffic still crosses the namespace's link.
func runForwardHelper(cfgPath string) error {
	var c forwardConfig
	if err := readHelperConfig(cfgPath, &c); err != nil {
		return err
	}
	f, err := coord.ListenPartition(c.Listen, c.Target)
	if err != nil {
		return err
	}
	ready(f.Addr())
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	<-ctx.Done()
	f.Close()
	return nil
}

// probeConfig configures the probe helper.
type probeConfig struct {
	URL string `json:"url"`
}

// runProbeHelper GETs URL once: a namespace's link works.
func runProbeHelper(cfgPath string) error {
	var c probeConfig
	if err := readHelperConfig(cfgPath, &c); err != nil {
		return err
	}
	cl := &http.Client{Timeout: 10 * time.Second}
	resp, err := cl.Get(c.URL)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, resp.Body)
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: %s", c.URL, resp.Status)
	}
	return nil
}
