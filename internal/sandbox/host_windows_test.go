package sandbox

import (
	"errors"
	"strings"
	"testing"
)

// TestWindowsHasNoSandbox: auto runs unsandboxed with a warning at start;
// on refuses every job, saying why.
func TestWindowsHasNoSandbox(t *testing.T) {
	auto := Open(Options{Init: `C:\aq\aq.exe`, Mode: ModeAuto})
	if auto.Level() != LevelNone || auto.Refusal() != nil {
		t.Errorf("auto: level %s, refusal %v", auto.Level(), auto.Refusal())
	}
	if line, warn := auto.StartLine(); !warn || !strings.Contains(line, "unsandboxed") || !strings.Contains(line, "Windows") {
		t.Errorf("auto's start line %q (warn %v)", line, warn)
	}
	on := Open(Options{Init: `C:\aq\aq.exe`, Mode: ModeOn})
	if err := on.Refusal(); !errors.Is(err, ErrUnavailable) || !strings.Contains(err.Error(), "Windows") {
		t.Errorf("on: %v", err)
	}
}
