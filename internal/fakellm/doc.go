// Package fakellm is an in-process fake of the model APIs that the real
// engine CLIs call — the Anthropic Messages API as Claude Code calls it
// (anthropic*.go) — on 127.0.0.1, for aq's end-to-end tests
// (realcli) and `aq selftest --engines`. It is not a test package:
// the aq binary embeds it, so nothing here imports testing.
//
// A Server answers each model request from a Script: per turn, the text,
// the tool calls and the usage (cache fields included) to answer with, or a
// fault a real API gives (401, 403, 429 with retry-after, 529 overloaded,
// 500, a stream cut mid-way, a slow first byte, an HTML page). It records
// every request it receives, whatever the path, so a test asserts what the
// CLI sent: the system prompt, the task, the model, and that none of aq's
// own secrets is in any of it.
//
// The wire formats follow the APIs' documentation; where a CLI's call is
// undocumented the fake follows what the pinned CLI sends, and the
// recording is kept in testdata/ (testdata/claude-2.1.332-request.json:
// claude 2.1.332 makes one call per turn, POST /v1/messages?beta=true,
// streaming, with the anthropic-beta header and x-api-key; it made no
// count_tokens call and nothing else in a headless run with
// CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC=1).
//
// Other APIs (the OpenAI Responses API for codex) add their handlers in
// files of their own, with identifiers prefixed by the API's name, and share
// the Server, the Script and the recorder.
package fakellm
