package engines

// The fake engines' sessions (FAKE_ENGINE_SESSIONS): claude and codex keep
// a conversation on disk and continue it when asked, as the real CLIs
// document — so a repair round's resume is tested against the behaviour,
// not against aq's own idea of it:
//
//   - claude: `--session-id <uuid>` starts session <uuid> (one it already
//     has is refused: "Error: Session ID <uuid> is already in use.");
//     `--resume <uuid>` continues it, in the directory it was started in
//     (claude looks sessions up per project directory); a session it does
//     not have is the recorded refusal (claude/resume_not_found.*: a result
//     with error_during_execution, "No conversation found with session ID"
//     in errors[] and on stderr, exit 1). Its stream carries the session's
//     id.
//   - codex: `exec … -` starts a thread with a new id; `exec resume … <id>
//     -` continues it (a thread it does not have: "Error: thread/resume:
//     thread/resume failed: no rollout found for thread id <id>", exit 1).
//     turn.completed's usage is the thread's running total, the earlier
//     runs' usage included.

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
)

// fakeSession is one session a fake run works in.
type fakeSession struct {
	path string
	St   struct {
		ID    string `json:"id"`
		Dir   string `json:"dir"`
		Runs  int    `json:"runs"`
		Usage struct {
			In, Cached, Out int64
		} `json:"usage"` // codex: the thread's totals
	}
	startIn, startCached, startOut int64
}

// openFakeSession starts or continues the session args ask for; a nil
// session comes with the exit status of a refusal (already printed).
func openFakeSession(name, dir string, args []string, cwd string) (*fakeSession, int) {
	var id string
	resume := false
	switch name {
	case "claude":
		if id = argAfter(args, "--resume"); id != "" {
			resume = true
		} else if id = argAfter(args, "--session-id"); id == "" {
			id = newUUID()
		}
	case "codex":
		if len(args) > 2 && args[0] == "exec" && args[1] == "resume" {
			resume, id = true, args[len(args)-2]
		} else {
			id = newUUID()
		}
	default:
		return &fakeSession{}, 0 // devin: no sessions
	}
	s := &fakeSession{path: filepath.Join(dir, name+"-"+id+".json")}
	b, err := os.ReadFile(s.path)
	have := err == nil && json.Unmarshal(b, &s.St) == nil
	switch {
	case resume && (!have || (name == "claude" && s.St.Dir != cwd)):
		if name == "claude" {
			nf, _ := os.ReadFile(filepath.Join(os.Getenv(fakeHelpDir), "claude", "resume_not_found.jsonl"))
			fmt.Print(strings.ReplaceAll(string(nf), "9d2b6f0e-3c1a-4e5d-8f7a-6b5c4d3e2f1a", id))
			fmt.Fprintf(os.Stderr, "No conversation found with session ID: %s\n", id)
			return nil, 1
		}
		fmt.Fprintf(os.Stderr, "Reading prompt from stdin...\nError: thread/resume: thread/resume failed: no rollout found for thread id %s (code -32600)\n", id)
		return nil, 1
	case !resume && have:
		fmt.Fprintf(os.Stderr, "Error: Session ID %s is already in use.\n", id)
		return nil, 1
	case !resume:
		s.St.ID, s.St.Dir = id, cwd
	}
	s.St.Runs++
	s.startIn, s.startCached, s.startOut = s.St.Usage.In, s.St.Usage.Cached, s.St.Usage.Out
	return s, 0
}

var (
	sessionField = regexp.MustCompile(`"(session_id|thread_id)":"[^"]*"`)
	codexUsage   = regexp.MustCompile(`"usage":\{"input_tokens":(\d+),"cached_input_tokens":(\d+),"output_tokens":(\d+)\}`)
)

// rewrite puts the session's id in a recorded line and, for codex, turns
// the recording's usage into the thread's running total.
func (s *fakeSession) rewrite(line string) string {
	if s.St.ID == "" {
		return line
	}
	line = sessionField.ReplaceAllString(line, `"$1":"`+s.St.ID+`"`)
	if m := codexUsage.FindStringSubmatch(line); m != nil && strings.Contains(line, `"turn.completed"`) {
		var in, cached, out int64
		fmt.Sscan(m[1], &in)
		fmt.Sscan(m[2], &cached)
		fmt.Sscan(m[3], &out)
		s.St.Usage.In, s.St.Usage.Cached, s.St.Usage.Out = s.startIn+in, s.startCached+cached, s.startOut+out
		line = codexUsage.ReplaceAllString(line, fmt.Sprintf(`"usage":{"input_tokens":%d,"cached_input_tokens":%d,"output_tokens":%d}`,
			s.St.Usage.In, s.St.Usage.Cached, s.St.Usage.Out))
	}
	return line
}

func (s *fakeSession) save() error {
	if s.path == "" {
		return nil
	}
	b, err := json.Marshal(s.St)
	if err != nil {
		return err
	}
	return os.WriteFile(s.path, b, 0o600)
}
