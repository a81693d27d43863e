//go:build !linux

package lockwait

// holders cannot be told on this platform without cgo: the wait says what
// it waits for, not who holds it.
func holders(string) []int { return nil }

func command(int) string { return "" }
