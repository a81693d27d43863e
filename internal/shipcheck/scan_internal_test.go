package shipcheck

import (
	"bytes"
	"fmt"
	"strings"
	"testing"
)

// BenchmarkScan is the scan alone, in memory: 4 MiB against 30 secrets.
func BenchmarkScan(b *testing.B) {
	var list []Secret
	for i := range 30 {
		list = append(list, Secret{Value: fmt.Sprintf("secret-%02d-%s", i, strings.Repeat("Qx7/+", 6)), Source: "bench"})
	}
	sc := newScanner(list)
	data := bytes.Repeat([]byte(strings.Repeat("some ordinary text of a source file ", 3)+"\n"), 4<<20/109)
	b.SetBytes(int64(len(data)))
	for range b.N {
		if f, err := sc.scan(bytes.NewReader(data)); err != nil || f.any() {
			b.Fatal(err)
		}
	}
}
