package egress

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"
)

// benchTarget is a TCP server on loopback: a client that sends 'd' gets
// size bytes and the end; one that sends 'u' has everything it sends
// read, then gets "ok"; one that sends 'e' gets its bytes echoed.
func benchTarget(b *testing.B, size int64) net.Listener {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	zeros := make([]byte, 256<<10)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				op := make([]byte, 1)
				if _, err := io.ReadFull(c, op); err != nil {
					return
				}
				switch op[0] {
				case 'd':
					for left := size; left > 0; {
						n, err := c.Write(zeros[:min(left, int64(len(zeros)))])
						if err != nil {
							return
						}
						left -= int64(n)
					}
				case 'u':
					io.Copy(io.Discard, c)
					c.Write([]byte("ok"))
				case 'e':
					io.Copy(c, c)
				}
			}()
		}
	}()
	return ln
}

// dialVia opens a connection to target: directly (proxy ""), or through
// the proxy at proxy ("tcp:addr" or "unix:path") with CONNECT.
func dialVia(proxy, target string) (net.Conn, io.Reader, error) {
	if proxy == "" {
		c, err := net.Dial("tcp", target)
		return c, c, err
	}
	network, addr, _ := cutColon(proxy)
	c, err := net.Dial(network, addr)
	if err != nil {
		return nil, nil, err
	}
	fmt.Fprintf(c, "CONNECT %s HTTP/1.1\r\nHost: %s\r\n\r\n", target, target)
	br := bufio.NewReaderSize(c, 64<<10)
	resp, err := http.ReadResponse(br, &http.Request{Method: http.MethodConnect})
	if err != nil || resp.StatusCode != 200 {
		c.Close()
		return nil, nil, fmt.Errorf("CONNECT: %v %v", resp, err)
	}
	return c, br, nil
}

func cutColon(s string) (string, string, bool) {
	for i := range s {
		if s[i] == ':' {
			return s[:i], s[i+1:], true
		}
	}
	return s, "", false
}

// BenchmarkEgressThroughput moves 64 MiB through one connection to a
// server on loopback, downloading and uploading, directly and through the
// proxy (over TCP, as a Landlock-only sandbox reaches it, and over its
// unix socket, as a namespaced sandbox's bridge does). Every op does all
// of them, interleaved, so a busy machine slows each alike; the ratios
// are of medians taken in the same run.
func BenchmarkEgressThroughput(b *testing.B) {
	const size = 64 << 20
	ln := benchTarget(b, size)
	defer ln.Close()
	dir, err := os.MkdirTemp("", "egress")
	if err != nil {
		b.Fatal(err)
	}
	defer os.RemoveAll(dir)
	p, err := Start(context.Background(), Options{Rules: mustRulesB(b, "127.0.0.1"), TCP: true, UnixSocket: filepath.Join(dir, "p.sock")})
	if err != nil {
		b.Fatal(err)
	}
	defer p.Close()
	ways := []struct{ name, proxy string }{{"direct", ""}, {"tcp", "tcp:" + p.Addr()}, {"unix", "unix:" + p.Socket()}}
	down := map[string][]float64{}
	up := map[string][]float64{}
	chunk := make([]byte, 256<<10)
	b.SetBytes(2 * size)
	b.ResetTimer()
	for range b.N {
		for _, w := range ways {
			c, r, err := dialVia(w.proxy, ln.Addr().String())
			if err != nil {
				b.Fatal(err)
			}
			start := time.Now()
			c.Write([]byte{'d'})
			n, err := io.CopyBuffer(io.Discard, r, chunk)
			if err != nil || n != size {
				b.Fatalf("%s download: %d bytes, %v", w.name, n, err)
			}
			down[w.name] = append(down[w.name], float64(size)/time.Since(start).Seconds()/1e6)
			c.Close()

			c, r, err = dialVia(w.proxy, ln.Addr().String())
			if err != nil {
				b.Fatal(err)
			}
			start = time.Now()
			c.Write([]byte{'u'})
			for left := size; left > 0; left -= len(chunk) {
				if _, err := c.Write(chunk[:min(left, len(chunk))]); err != nil {
					b.Fatal(err)
				}
			}
			c.(interface{ CloseWrite() error }).CloseWrite()
			if ok, err := io.ReadAll(r); err != nil || string(ok) != "ok" {
				b.Fatalf("%s upload: %q %v", w.name, ok, err)
			}
			up[w.name] = append(up[w.name], float64(size)/time.Since(start).Seconds()/1e6)
			c.Close()
		}
	}
	b.StopTimer()
	for _, w := range ways {
		b.ReportMetric(median(down[w.name]), w.name+"-down-MB/s")
		b.ReportMetric(median(up[w.name]), w.name+"-up-MB/s")
		if w.proxy != "" {
			b.ReportMetric(median(down[w.name])/median(down["direct"]), w.name+"-down-x-direct")
			b.ReportMetric(median(up[w.name])/median(up["direct"]), w.name+"-up-x-direct")
		}
	}
}

// BenchmarkEgressConnect is the latency a connection pays for the proxy:
// from dialling to the first byte echoed back, directly and through the
// proxy (CONNECT, the decision, the proxy's own dial, its 200).
func BenchmarkEgressConnect(b *testing.B) {
	ln := benchTarget(b, 0)
	defer ln.Close()
	dir, err := os.MkdirTemp("", "egress")
	if err != nil {
		b.Fatal(err)
	}
	defer os.RemoveAll(dir)
	p, err := Start(context.Background(), Options{Rules: mustRulesB(b, "127.0.0.1"), TCP: true, UnixSocket: filepath.Join(dir, "p.sock")})
	if err != nil {
		b.Fatal(err)
	}
	defer p.Close()
	ways := []struct{ name, proxy string }{{"direct", ""}, {"tcp", "tcp:" + p.Addr()}, {"unix", "unix:" + p.Socket()}}
	took := map[string][]float64{}
	one := make([]byte, 1)
	b.ResetTimer()
	for range b.N {
		for _, w := range ways {
			start := time.Now()
			c, r, err := dialVia(w.proxy, ln.Addr().String())
			if err != nil {
				b.Fatal(err)
			}
			c.Write([]byte{'e', 'x'})
			if _, err := io.ReadFull(r, one); err != nil {
				b.Fatal(err)
			}
			took[w.name] = append(took[w.name], float64(time.Since(start).Microseconds()))
			c.Close()
		}
	}
	b.StopTimer()
	for _, w := range ways {
		b.ReportMetric(median(took[w.name]), w.name+"-p50-µs")
		b.ReportMetric(percentile(took[w.name], 0.99), w.name+"-p99-µs")
		if w.proxy != "" {
			b.ReportMetric(median(took[w.name])-median(took["direct"]), w.name+"-added-p50-µs")
		}
	}
}

func mustRulesB(b *testing.B, s string) Rules {
	r, err := ParseRules(s)
	if err != nil {
		b.Fatal(err)
	}
	return r
}

func median(v []float64) float64 { return percentile(v, 0.5) }

func percentile(v []float64, q float64) float64 {
	if len(v) == 0 {
		return 0
	}
	s := slices.Clone(v)
	slices.Sort(s)
	return s[min(len(s)-1, int(q*float64(len(s))))]
}
