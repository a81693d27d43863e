//go:build !unix

package fleet

import "time"

// rusage: not measured here (BenchmarkLiveLogCPU skips).
func rusage() time.Duration { return -1 }
