#!/bin/sh
# make engines-latest: the end-to-end tests of realcli against the
# newest published claude and codex CLIs (opt-in; it needs the npm
# registry). It installs them into a temp copy of realcli — the
# pinned package.json and lockfile are not touched — runs
# `go test ./realcli/` with REALCLI_DIR pointing there, and prints a
# compatibility table: each CLI's version, each test's result. Exit status:
# the tests'.
set -eu
root=$(cd "$(dirname "$0")/../.." && pwd)
tmp=$(mktemp -d "${TMPDIR:-/tmp}/aq-engines-latest.XXXXXX")
trap 'rm -rf "$tmp"' EXIT INT TERM
command -v npm >/dev/null 2>&1 || { echo "engines-latest: npm not found: install Node.js and npm" >&2; exit 2; }
printf '{"name":"aq-realcli-latest","version":"0.0.0","private":true}\n' >"$tmp/package.json"
echo "engines-latest: installing the newest @anthropic-ai/claude-code and @openai/codex into $tmp" >&2
if ! npm install --prefix "$tmp" --no-audit --no-fund --loglevel=error \
	@anthropic-ai/claude-code@latest @openai/codex@latest >&2; then
	echo "engines-latest: npm install failed: the npm registry must be reachable" >&2
	exit 1
fi
ver() { "$tmp/node_modules/.bin/$1" --version 2>/dev/null | head -n 1 || echo "?"; }
claude=$(ver claude)
codex=$(ver codex)
pinned() { sed -n "s/.*\"$1\": *\"\\([^\"]*\\)\".*/\\1/p" "$root/realcli/package.json"; }
status=0
(cd "$root" && REALCLI_DIR="$tmp" go test -count=1 -timeout 60m -v ./realcli/ ${RUN:+-run "$RUN"}) >"$tmp/test.log" 2>&1 || status=$?
echo
echo "| CLI | pinned | newest | end-to-end tests |"
echo "|---|---|---|---|"
for cli in claude codex; do
	case $cli in
	claude) pkg=@anthropic-ai/claude-code v=$claude prefix=TestClaude ;;
	codex) pkg=@openai/codex v=$codex prefix=TestCodex ;;
	esac
	pass=$(grep -c -- "^--- PASS: $prefix" "$tmp/test.log" || true)
	fail=$(grep -c -- "^--- FAIL: $prefix" "$tmp/test.log" || true)
	skip=$(grep -c -- "^--- SKIP: $prefix" "$tmp/test.log" || true)
	echo "| $pkg | $(pinned "$pkg") | $v | $pass passed, $fail failed, $skip skipped |"
done
echo
grep -- "^--- FAIL" "$tmp/test.log" || true
if [ "$status" -ne 0 ]; then
	echo "engines-latest: the tests failed (exit $status); the end of their output:" >&2
	tail -n 40 "$tmp/test.log" >&2
fi
exit "$status"
