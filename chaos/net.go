//go:build linux

package chaos

import (
	"fmt"
	"net"
	"os/exec"
	"strconv"

	"github.com/aqfleet/aq/demo/coord"
)

// Host modes: where the factories run.
const (
	ModeNetns    = "netns"     // each factory in its own network namespace, linked to a bridge
	ModeLoopback = "127.0.0.1" // plain processes on loopback, partitions through TCP proxies
)

// network is where the harness puts the coordinator, the broker and the
// factories, and how it cuts a factory off and reconnects it.
type network interface {
	Mode() string
	// CoordListen is the address the coordinator listens on (port 0 for
	// any, the first time).
	CoordListen(port int) string
	// Attach is called once the coordinator and the broker listen: it
	// makes each factory's way to them (proxies, forwarders) and checks it.
	Attach(coordAddr, brokerAddr string) error
	// FactoryAPI is AQ_FLEET_API for factory i; FactoryBroker the
	// host:port its connection string names (always loopback).
	FactoryAPI(i int) string
	FactoryBroker(i int) string
	// Command runs name args on factory i's host.
	Command(i int, name string, args ...string) *exec.Cmd
	// Cut cuts factory i off the coordinator and the broker (git, a shared
	// file system, stays reachable); Heal reconnects it.
	Cut(i int) error
	Heal(i int) error
	// Describe says how, for the report.
	Describe() string
	Close() error
}

// loopNet: plain processes on 127.0.0.1; each factory reaches the
// coordinator and the broker through its own pair of TCP proxies
// (coord.Partition), which a partition blackholes: open connections are
// dropped and new ones accepted but never answered.
type loopNet struct {
	n      int
	coordP []*coord.Partition
	brokP  []*coord.Partition
}

func newLoopNet(n int) *loopNet { return &loopNet{n: n} }

func (l *loopNet) Mode() string { return ModeLoopback }

func (l *loopNet) CoordListen(port int) string {
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
}

func (l *loopNet) Attach(coordAddr, brokerAddr string) error {
	for range l.n {
		cp, err := coord.NewPartition(coordAddr)
		if err != nil {
			return err
		}
		l.coordP = append(l.coordP, cp)
		bp, err := coord.NewPartition(brokerAddr)
		if err != nil {
			return err
		}
		l.brokP = append(l.brokP, bp)
	}
	return nil
}

func (l *loopNet) FactoryAPI(i int) string    { return "http://" + l.coordP[i].Addr() + "/api" }
func (l *loopNet) FactoryBroker(i int) string { return l.brokP[i].Addr() }

func (l *loopNet) Command(_ int, name string, args ...string) *exec.Cmd {
	return exec.Command(name, args...)
}

func (l *loopNet) Cut(i int) error {
	l.coordP[i].Blackhole()
	l.brokP[i].Blackhole()
	return nil
}

func (l *loopNet) Heal(i int) error {
	l.coordP[i].Heal()
	l.brokP[i].Heal()
	return nil
}

func (l *loopNet) Describe() string {
	return fmt.Sprintf("%d factories as plain processes on 127.0.0.1; each reaches the coordinator stub and the broker peer through its own pair of TCP proxies (coord.Partition); a partition blackholes both proxies (open connections dropped, new ones accepted and never answered)", l.n)
}

func (l *loopNet) Close() error {
	for _, p := range append(l.coordP, l.brokP...) {
		p.Close()
	}
	return nil
}
