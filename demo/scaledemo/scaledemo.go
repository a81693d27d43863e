// Package scaledemo is act 3 of `aq demo`: scale to zero. The coordinator
// stub publishes each queued job to a pool's Service Bus subscription; a
// scaler that implements KEDA's ScaledJob "accurate" strategy reads the
// subscription's active message count the way KEDA's azure-servicebus scaler
// does (the management API's runtime properties, which the local peer
// answers) and starts `aq run --once` replicas — each its own factory id, a
// fresh AQ_HOME and no clones (the repo is cloned on demand). It narrates,
// from real signals (the scaler's reads, the replicas' processes and status
// files, the stub's request counters and audit trail, origin's refs): zero
// aq processes and zero coordinator requests while idle; a burst of jobs
// served by replicas capped at the scaler's maximum; one replica killed -9
// mid-job and its AQ_HOME deleted (the host is gone), and its job finished by
// another replica from the checkpoint pushed before the kill; every replica
// that exited deregistered; idle again at the end. Summary.Passed is true
// only if every expected event happened.
//
// The act needs the local peer (Node and demo/sbpeer's packages); without
// it the act is skipped, and says why.
package scaledemo

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/azcore"
	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus/admin"

	"github.com/aqfleet/aq/agent/dispatch"
	"github.com/aqfleet/aq/demo"
	"github.com/aqfleet/aq/demo/coord"
	"github.com/aqfleet/aq/demo/sbpeer/sbpeerproc"
	"github.com/aqfleet/aq/internal/process"
)

// The act's settings. The lease TTL is short so that the reaper hands the
// killed replica's job back within seconds.
const (
	pool        = "builders"
	topic       = dispatch.DefaultTopic
	repo        = "svc"
	maxReplicas = 3
	quickJobs   = 5
	leaseTTL    = 6 * time.Second
	pollEvery   = 250 * time.Millisecond
	idleWindow  = 2 * time.Second
	replicaWait = "2s" // aq run --once --wait
	guard       = 3 * time.Minute
)

// Options configure a run.
type Options struct {
	Dir  string // workspace; empty: a temp dir, removed unless Keep
	Keep bool
	Out  io.Writer
	// AQ is the aq binary the replicas run (default: this executable).
	AQ string
	// Env is the environment the children start from (default: this
	// process's); aq's own variables are dropped.
	Env []string
	// PeerDir is demo/sbpeer (default: found from the working directory or
	// the aq binary).
	PeerDir string
}

// Summary is what the act saw. Field names are stable (`aq demo --json`).
type Summary struct {
	Workspace string `json:"workspace"`
	// Skipped says why the act did not run (no Node or peer packages).
	Skipped    string       `json:"skipped,omitempty"`
	Replicas   []ReplicaRow `json:"replicas"`
	Peak       int          `json:"peakReplicas"`
	Reads      int          `json:"scalerReads"`
	Checks     []demo.Check `json:"checks"`
	DurationMS int64        `json:"durationMs"`
}

// ReplicaRow is one replica the scaler started.
type ReplicaRow struct {
	ID     string `json:"id"`
	Exit   int    `json:"exit"`
	Job    string `json:"job,omitempty"`
	Killed bool   `json:"killed,omitempty"`
}

// Passed reports whether the act ran and every check passed (a skipped act
// has no checks and passes).
func (s *Summary) Passed() bool { return s.Skipped != "" || demo.AllPassed(s.Checks) }

type run struct {
	o     Options
	out   io.Writer
	aq    string
	ws    string
	sig   string
	env   []string // the replicas' environment, but for their own dirs and id
	start time.Time
	// seedHistory, when set, fills the origin's seed before its first push
	// (the benchmarks' big repository).
	seedHistory func(ctx context.Context, seed string) error

	stub    *coord.Served
	api     string
	peer    *sbpeerproc.Peer
	admin   *admin.Client
	scaler  *Scaler
	logFile *os.File

	mu       sync.Mutex
	replicas []*replica
	peak     int

	checks []demo.Check
}

// Run runs the act. It returns an error only when the act could not run
// at all; what it saw is in the Summary.
func Run(ctx context.Context, o Options) (*Summary, error) {
	r := &run{o: o, out: o.Out, start: time.Now()}
	if r.out == nil {
		r.out = io.Discard
	}
	aq, err := demo.Binary(o.AQ)
	if err != nil {
		return nil, err
	}
	r.aq = aq
	ws, cleanup, err := demo.Workspace(o.Dir, "aq-scale-demo-", o.Keep)
	if err != nil {
		return nil, err
	}
	defer cleanup()
	r.ws = ws
	sum := &Summary{Workspace: ws}
	r.env = demo.ChildEnv(o.Env, ws)
	peerDir := o.PeerDir
	if peerDir == "" {
		peerDir = demo.FindPeerDir(r.aq)
	}
	if why := demo.PeerMissing(r.env, peerDir); why != "" {
		sum.Skipped = why
		r.say("skipped: scaling on broker depth needs the local Service Bus peer — %s", why)
		return sum, nil
	}

	sctx, stop := context.WithCancel(ctx)
	defer r.teardown(stop)
	err = r.setup(sctx, peerDir)
	if err == nil {
		err = r.story(sctx)
	}
	if err != nil {
		r.checks = append(r.checks, demo.Check{What: "the act ran to its end", Note: err.Error()})
		if ctx.Err() != nil {
			r.say("interrupted: stopping everything the act started")
		} else {
			r.say("!! %v", err)
		}
		_ = os.WriteFile(filepath.Join(r.sig, "gate"), nil, 0o644) // let held engines finish
	}
	stop()
	r.stopReplicas()
	r.summarize(sum)
	if ctx.Err() != nil {
		return sum, fmt.Errorf("the act was interrupted; everything it started was stopped: %w", context.Cause(ctx))
	}
	sum.DurationMS = time.Since(r.start).Milliseconds()
	return sum, nil
}

func (r *run) say(format string, a ...any) { fmt.Fprintf(r.out, format+"\n", a...) }

// setup makes the origin, the repo-URL map, the stub with the pool, the
// peer with the pool's subscription and its management endpoint, and the
// scaler (not started).
func (r *run) setup(ctx context.Context, peerDir string) error {
	r.say("aq scale-to-zero — replicas started on broker depth, one job each, nothing running while idle")
	r.say("workspace %s", r.ws)
	r.say("")
	r.sig = filepath.Join(r.ws, "signals")
	for _, d := range []string{r.sig, filepath.Join(r.ws, "replicas"), filepath.Join(r.ws, "xdg"), filepath.Join(r.ws, "operator")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return err
		}
	}
	if err := os.WriteFile(filepath.Join(r.ws, "gitconfig"), nil, 0o644); err != nil {
		return err
	}
	origin, err := r.makeOrigin(ctx)
	if err != nil {
		return err
	}
	urls := filepath.Join(r.ws, "repo-urls")
	if err := os.WriteFile(urls, []byte(repo+" file://"+origin+"\n"), 0o644); err != nil {
		return err
	}

	node, err := demo.LookPath("node", r.env)
	if err != nil {
		return err
	}
	r.peer, err = sbpeerproc.Launch(sbpeerproc.Options{Dir: r.ws, Node: node, PeerDir: peerDir, Env: r.env,
		Subs: []string{topic + "/" + pool}, LockDuration: 30 * time.Second, Admin: true})
	if err != nil {
		return fmt.Errorf("the Service Bus peer did not start: %w", err)
	}
	r.admin, err = admin.NewClientFromConnectionString(r.peer.AdminConnectionString(),
		&admin.ClientOptions{ClientOptions: azcore.ClientOptions{Transport: r.peer.AdminHTTPClient()}})
	if err != nil {
		return err
	}

	lf, err := os.Create(filepath.Join(r.ws, "coordinator.log"))
	if err != nil {
		return err
	}
	r.logFile = lf
	log := slog.New(slog.NewTextHandler(lf, nil))
	pub, err := coord.NewPublisher(coord.PublisherOptions{ConnectionString: r.peer.ConnectionString(), Topic: topic, Rescan: 200 * time.Millisecond, Log: log})
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	r.stub, err = coord.ServeOn(ctx, ln, coord.Options{LeaseTTL: leaseTTL, StaleAfter: 4 * time.Second, ReapEvery: 250 * time.Millisecond, MaxBackoff: time.Second,
		Publisher: pub, Log: log,
		Pools: []coord.Pool{{Name: pool, Capabilities: []string{"engine:script"}, Repos: []string{repo}, Seats: maxReplicas}}}, nil)
	if err != nil {
		return err
	}
	r.api = r.stub.API

	// The act's jobs are script jobs: its replicas opt in to script
	// (AQ_ENGINES), which a fleet factory does not offer by default, and
	// pass the scripts the two variables they read (AQ_ENGINE_ENV).
	r.env = append(r.env, "AQ_FLEET=1", "AQ_FLEET_API="+r.api, "AQ_FLEET_TOKEN="+r.stub.EnrollToken(), "AQ_ENGINES=all",
		"AQ_ENGINE_ENV=AQ_FACTORY_ID,AQ_DEMO_SIGNALS",
		"AQ_FACTORY_POOL="+pool, "AQ_SB_CONNECTION_STRING="+r.peer.ConnectionString(), "AQ_SB_TOPIC="+topic,
		"AQ_REPO_URLS="+urls, "AQ_HEARTBEAT_SEC=1", "AQ_FLEET_LEASE_RENEW_SEC=1", "AQ_KILL_GRACE=500ms",
		"AQ_CHECKPOINT_INTERVAL=1s", "AQ_DEMO_SIGNALS="+r.sig,
		// The jobs' engines signal the demo through AQ_DEMO_SIGNALS, a
		// folder outside their worktrees that a sandbox keeps from the host.
		"AQ_SANDBOX=off")
	r.scaler = &Scaler{Read: r.read, Replicas: r.count, Start: r.startReplica, TargetAverage: 1, MaxReplicas: maxReplicas, Poll: pollEvery}

	r.say("1. The pool, scaled to zero")
	r.say("   coordinator stub  %s (in this process): targets pool %q even with no replica alive; lease TTL %s", r.api, pool, leaseTTL)
	r.say("   Service Bus peer  127.0.0.1:%d (AMQP), subscription %s/%s (rule targetFactoryId = '%s');", r.peer.Port(), topic, pool, pool)
	r.say("                     and, over HTTPS, the management API's read of the subscription's runtime properties")
	r.say("   scaler            KEDA ScaledJob, strategy accurate, messageCount 1, maxReplicaCount %d, polling every %s", maxReplicas, pollEvery)
	r.say("   replicas          aq run --once --wait %s; each: its own id, a fresh AQ_HOME, no clones (AQ_REPO_URLS: %s → %s)", replicaWait, repo, origin)
	return nil
}

// makeOrigin makes the bare origin of repo with a commit and a little
// history, and lets it serve partial clones.
func (r *run) makeOrigin(ctx context.Context) (string, error) {
	seed := filepath.Join(r.ws, "seed")
	bare := filepath.Join(r.ws, "origins", repo+".git")
	if err := os.MkdirAll(seed, 0o755); err != nil {
		return "", err
	}
	if err := os.WriteFile(filepath.Join(seed, "README.md"), []byte("# svc\n\nA service the pool works on.\n"), 0o644); err != nil {
		return "", err
	}
	steps := [][]string{
		{"init", "-q", "--bare", "-b", "main", bare},
		{"-C", bare, "config", "uploadpack.allowFilter", "true"},
		{"-C", seed, "init", "-q", "-b", "main"},
		{"-C", seed, "add", "-A"},
		{"-C", seed, "commit", "-q", "-m", "initial commit"},
	}
	for _, step := range steps {
		if _, err := r.git(ctx, step...); err != nil {
			return "", err
		}
	}
	if r.seedHistory != nil {
		if err := r.seedHistory(ctx, seed); err != nil {
			return "", err
		}
	}
	if _, err := r.git(ctx, "-C", seed, "push", "-q", bare, "main"); err != nil {
		return "", err
	}
	return bare, os.RemoveAll(seed)
}

func (r *run) git(ctx context.Context, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, "git", args...)
	cmd.Env = append(append([]string{}, r.env...),
		"GIT_AUTHOR_NAME=aq demo", "GIT_AUTHOR_EMAIL=demo@aq.invalid", "GIT_COMMITTER_NAME=aq demo", "GIT_COMMITTER_EMAIL=demo@aq.invalid")
	cmd.Dir = r.ws
	var errb strings.Builder
	cmd.Stderr = &errb
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("git %s: %v: %s", strings.Join(args, " "), err, strings.TrimSpace(errb.String()))
	}
	return strings.TrimSpace(string(out)), nil
}

// read is the scaler's trigger: the pool subscription's active messages.
func (r *run) read(ctx context.Context) (int64, error) {
	rp, err := r.admin.GetSubscriptionRuntimeProperties(ctx, topic, pool, nil)
	if err != nil {
		return 0, err
	}
	if rp == nil {
		return 0, fmt.Errorf("subscription %s/%s not found", topic, pool)
	}
	return int64(rp.ActiveMessageCount), nil
}

// count is the scaler's view of its replicas: not finished, and among them
// not yet holding a job (pending).
func (r *run) count() (running, pending int64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, p := range r.replicas {
		if p.running() {
			running++
			if !p.holding() {
				pending++
			}
		}
	}
	return running, pending
}

func (r *run) startReplica(context.Context) {
	r.mu.Lock()
	defer r.mu.Unlock()
	p := newReplica(r.ws, len(r.replicas)+1)
	if err := p.start(r.aq, r.env, replicaWait); err != nil {
		r.say("   !! %v", err)
		return
	}
	r.replicas = append(r.replicas, p)
	live := 0
	for _, q := range r.replicas {
		if q.running() {
			live++
		}
	}
	r.peak = max(r.peak, live)
}

func (r *run) live() int {
	n, _ := r.count()
	return int(n)
}

// teardown stops the scaler (stop), every replica, the stub, the peer.
func (r *run) teardown(stop context.CancelFunc) {
	stop()
	r.stopReplicas()
	if r.stub != nil {
		r.stub.Kill()
	}
	if r.peer != nil {
		r.peer.Stop()
	}
	if r.logFile != nil {
		_ = r.logFile.Close()
	}
}

// stopReplicas ends every replica still running (SIGTERM drains; then
// SIGKILL), so no child outlives the act.
func (r *run) stopReplicas() {
	r.mu.Lock()
	ps := append([]*replica{}, r.replicas...)
	r.mu.Unlock()
	for _, p := range ps {
		if !p.running() {
			continue
		}
		_ = process.Terminate(p.cmd.Process)
		select {
		case <-p.done:
		case <-time.After(20 * time.Second):
			_ = process.KillGroup(p.cmd.Process.Pid)
			<-p.done
		}
	}
}

func (r *run) waitFor(ctx context.Context, what string, cond func() bool) error {
	deadline := time.Now().Add(guard)
	t := time.NewTicker(50 * time.Millisecond)
	defer t.Stop()
	for !cond() {
		if time.Now().After(deadline) {
			return fmt.Errorf("gave up waiting for %s after %s (a deadlock guard)", what, guard)
		}
		select {
		case <-ctx.Done():
			return context.Cause(ctx)
		case <-t.C:
		}
	}
	return nil
}

func (r *run) check(ok bool, what, note string) {
	r.checks = append(r.checks, demo.Check{What: what, OK: ok, Note: note})
}
