//go:build linux

package chaos

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/gofrs/flock"

	"github.com/aqfleet/aq/demo/coord"
)

// netnsDir keeps one record per harness run that made namespaces, so that a
// run killed before it could clean up (SIGKILL, a power cut) is swept by
// the next one.
const netnsDir = "/run/aqchaos"

// netnsRecord is what a run made.
type netnsRecord struct {
	PID        int       `json:"pid"`
	Token      string    `json:"token"`
	Bridge     string    `json:"bridge"`
	Namespaces []string  `json:"namespaces"`
	Subnet     string    `json:"subnet"`
	Created    time.Time `json:"created"`
}

// netnsNet: each factory in its own network namespace, linked by a veth
// pair to a bridge in the root namespace that holds the harness's address
// (x.y.z.1/24 of a private /24 no route or address of the host overlaps).
// The coordinator stub listens on x.y.z.1; the broker peer listens on
// loopback behind a forwarder on x.y.z.1, and each namespace has its own
// forwarder on its loopback (aq dials a development connection string on
// loopback only) whose traffic crosses the namespace's link. A partition
// sets the bridge end of the factory's veth down: the factory keeps its
// address, its packets go nowhere (open connections hang, new ones fail),
// while git over file paths (the shared file system) still works.
type netnsNet struct {
	exe, dir string
	rec      netnsRecord
	recPath  string
	hostIP   string
	hostVeth []string
	nsIP     []string

	cport string // the coordinator's port, once it listens

	rootFwd *coord.Partition
	nsFwd   []*child
}

// netnsUsable says why namespaces cannot be used here ("" when they can).
func netnsUsable() string {
	if os.Geteuid() != 0 {
		return "not running as root"
	}
	if _, err := exec.LookPath("ip"); err != nil {
		return "no ip (iproute2) on PATH"
	}
	name := "aqchaos-probe-" + strconv.Itoa(os.Getpid())
	if out, err := exec.Command("ip", "netns", "add", name).CombinedOutput(); err != nil {
		return "ip netns add failed: " + strings.TrimSpace(string(out))
	}
	_ = exec.Command("ip", "netns", "del", name).Run()
	return ""
}

func ipCmd(args ...string) error {
	out, err := exec.Command("ip", args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("ip %s: %v: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}

// newNetns makes the bridge and n namespaces. exe is this binary (for the
// helpers), dir the run's directory.
func newNetns(exe, dir, token string, n int) (_ *netnsNet, err error) {
	if err := os.MkdirAll(netnsDir, 0o755); err != nil {
		return nil, err
	}
	lock := flock.New(filepath.Join(netnsDir, ".lock"))
	if err := lock.Lock(); err != nil {
		return nil, err
	}
	defer lock.Unlock()
	sweepStale()

	subnet, err := pickSubnet(token)
	if err != nil {
		return nil, err
	}
	nn := &netnsNet{exe: exe, dir: dir, hostIP: subnet + ".1"}
	nn.rec = netnsRecord{PID: os.Getpid(), Token: token, Bridge: "aqcb" + token, Subnet: subnet + ".0/24", Created: time.Now().UTC()}
	for i := range n {
		nn.rec.Namespaces = append(nn.rec.Namespaces, fmt.Sprintf("aqchaos-%s-f%d", token, i+1))
		nn.hostVeth = append(nn.hostVeth, fmt.Sprintf("aqch%s%d", token, i+1))
		nn.nsIP = append(nn.nsIP, fmt.Sprintf("%s.%d", subnet, 11+i))
	}
	nn.recPath = filepath.Join(netnsDir, token+".json")
	b, _ := json.Marshal(nn.rec)
	if err := os.WriteFile(nn.recPath, b, 0o644); err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			nn.teardown()
		}
	}()
	br := nn.rec.Bridge
	for _, a := range [][]string{
		{"link", "add", br, "type", "bridge"},
		{"addr", "add", nn.hostIP + "/24", "dev", br},
		{"link", "set", br, "up"},
	} {
		if err := ipCmd(a...); err != nil {
			return nil, err
		}
	}
	for i, ns := range nn.rec.Namespaces {
		hv, nv := nn.hostVeth[i], fmt.Sprintf("aqcn%s%d", token, i+1)
		for _, a := range [][]string{
			{"netns", "add", ns},
			{"link", "add", hv, "type", "veth", "peer", "name", nv, "netns", ns},
			{"link", "set", hv, "master", br},
			{"link", "set", hv, "up"},
			{"-n", ns, "link", "set", "lo", "up"},
			{"-n", ns, "addr", "add", nn.nsIP[i] + "/24", "dev", nv},
			{"-n", ns, "link", "set", nv, "up"},
		} {
			if err := ipCmd(a...); err != nil {
				return nil, err
			}
		}
	}
	return nn, nil
}

// pickSubnet picks x.y.z (a /24 in 10.0.0.0/8) that no address or route of
// the host overlaps, starting from a place derived from the token.
func pickSubnet(token string) (string, error) {
	var used []*net.IPNet
	for _, args := range [][]string{{"-4", "-o", "addr", "show"}, {"-4", "route", "show", "table", "all"}} {
		out, err := exec.Command("ip", args...).Output()
		if err != nil {
			return "", fmt.Errorf("ip %s: %w", strings.Join(args, " "), err)
		}
		for _, f := range strings.Fields(string(out)) {
			if strings.Count(f, ".") != 3 {
				continue
			}
			if !strings.Contains(f, "/") {
				f += "/32"
			}
			if _, n, err := net.ParseCIDR(f); err == nil {
				used = append(used, n)
			}
		}
	}
	h := sha256.Sum256([]byte(token))
	start := int(binary.BigEndian.Uint16(h[:2]))
	for k := range 4096 {
		v := (start + k) % 4096
		cand := fmt.Sprintf("10.%d.%d", 200+v/256%50, v%256)
		_, cn, _ := net.ParseCIDR(cand + ".0/24")
		clash := false
		for _, u := range used {
			if u.Contains(cn.IP) || cn.Contains(u.IP) {
				clash = true
				break
			}
		}
		if !clash {
			return cand, nil
		}
	}
	return "", errors.New("no free private /24 in 10.200.0.0-10.249.255.0")
}

// sweepStale removes what runs whose process is gone left behind.
func sweepStale() {
	paths, _ := filepath.Glob(filepath.Join(netnsDir, "*.json"))
	for _, p := range paths {
		b, err := os.ReadFile(p)
		if err != nil {
			continue
		}
		var r netnsRecord
		if json.Unmarshal(b, &r) != nil || r.PID == 0 {
			continue
		}
		if r.PID == os.Getpid() || syscall.Kill(r.PID, 0) == nil {
			continue // alive: not ours to touch
		}
		teardownRecord(r)
		os.Remove(p)
	}
}

// teardownRecord kills every process in the record's namespaces and
// removes them and the bridge.
func teardownRecord(r netnsRecord) {
	for _, ns := range r.Namespaces {
		if out, err := exec.Command("ip", "netns", "pids", ns).Output(); err == nil {
			for _, f := range strings.Fields(string(out)) {
				if pid, err := strconv.Atoi(f); err == nil && pid > 1 {
					_ = syscall.Kill(pid, syscall.SIGKILL)
				}
			}
		}
		_ = exec.Command("ip", "netns", "del", ns).Run()
	}
	if r.Bridge != "" {
		_ = exec.Command("ip", "link", "del", r.Bridge).Run()
	}
}

func (nn *netnsNet) teardown() {
	teardownRecord(nn.rec)
	os.Remove(nn.recPath)
}

func (nn *netnsNet) Mode() string { return ModeNetns }

func (nn *netnsNet) CoordListen(port int) string {
	return net.JoinHostPort(nn.hostIP, strconv.Itoa(port))
}

func (nn *netnsNet) Attach(coordAddr, brokerAddr string) error {
	_, nn.cport, _ = net.SplitHostPort(coordAddr)
	f, err := coord.ListenPartition(net.JoinHostPort(nn.hostIP, "0"), brokerAddr)
	if err != nil {
		return err
	}
	nn.rootFwd = f
	for i, ns := range nn.rec.Namespaces {
		wrap := func(name string, args ...string) *exec.Cmd { return nn.Command(i, name, args...) }
		cmd, err := helperCommand(nn.exe, nn.dir, "forward", fmt.Sprintf("forward-f%d", i+1), forwardConfig{Listen: "127.0.0.1:0", Target: f.Addr()}, wrap)
		if err != nil {
			return err
		}
		c, err := startChildReady("forwarder in "+ns, cmd, filepath.Join(nn.dir, fmt.Sprintf("forward-f%d.log", i+1)), true)
		if err != nil {
			return err
		}
		nn.nsFwd = append(nn.nsFwd, c)
		// The namespace reaches the coordinator over its link.
		pc, err := helperCommand(nn.exe, nn.dir, "probe", fmt.Sprintf("probe-f%d", i+1), probeConfig{URL: "http://" + coordAddr + "/fleet/_stats"}, wrap)
		if err != nil {
			return err
		}
		var out bytes.Buffer
		pc.Stdout, pc.Stderr = &out, &out
		if err := pc.Run(); err != nil {
			return fmt.Errorf("namespace %s cannot reach the coordinator at %s: %v: %s", ns, coordAddr, err, strings.TrimSpace(out.String()))
		}
	}
	return nil
}

func (nn *netnsNet) FactoryAPI(int) string {
	return "http://" + net.JoinHostPort(nn.hostIP, nn.cport) + "/api"
}

func (nn *netnsNet) FactoryBroker(i int) string { return nn.nsFwd[i].readyAddr }

func (nn *netnsNet) Command(i int, name string, args ...string) *exec.Cmd {
	return exec.Command("ip", append([]string{"netns", "exec", nn.rec.Namespaces[i], name}, args...)...)
}

func (nn *netnsNet) Cut(i int) error  { return ipCmd("link", "set", nn.hostVeth[i], "down") }
func (nn *netnsNet) Heal(i int) error { return ipCmd("link", "set", nn.hostVeth[i], "up") }

func (nn *netnsNet) Describe() string {
	return fmt.Sprintf("%d network namespaces (%s), each linked by a veth pair to the bridge %s in the root namespace; "+
		"the harness holds %s/24 (subnet %s), factories %s..%s; the coordinator stub listens on %s, the broker peer on loopback behind a forwarder on %s, "+
		"reached from each namespace through a forwarder on the namespace's own loopback; a partition sets the bridge end of the factory's veth down "+
		"(the factory keeps its address; open connections hang, new ones fail), and up again to reconnect",
		len(nn.rec.Namespaces), strings.Join(nn.rec.Namespaces, ", "), nn.rec.Bridge, nn.hostIP, nn.rec.Subnet,
		nn.nsIP[0], nn.nsIP[len(nn.nsIP)-1], nn.hostIP, nn.hostIP)
}

func (nn *netnsNet) Close() error {
	for _, c := range nn.nsFwd {
		c.signal(syscall.SIGTERM)
		if !c.waitFor(5 * time.Second) {
			c.killGroup()
			c.wait()
		}
	}
	if nn.rootFwd != nil {
		nn.rootFwd.Close()
	}
	nn.teardown()
	return nil
}
