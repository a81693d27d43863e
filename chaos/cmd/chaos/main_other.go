//go:build !linux

package main

import (
	"fmt"
	"os"
	"runtime"
)

func main() {
	fmt.Fprintf(os.Stderr, "chaos: the chaos harness needs Linux (network namespaces, /proc); this is %s\n", runtime.GOOS)
	os.Exit(2)
}
