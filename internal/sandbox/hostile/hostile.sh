#!/bin/bash
# The hostile engine (engine: script) of the hostile-engine suite
# (cmd/aq/cli/hostile_linux_test.go) and of aq selftest's sandbox checks
# (package hostile says what each level must deny): it tries every escape
# docs/sandbox.md promises to stop, prints "PROBE <name> ok" for each that
# worked and "PROBE <name> denied" for each that did not, and still does
# the job (a file in the worktree), so the job ships. Writes the sandbox
# may let land in the job's own copy of a path ($HOME, /tmp) are judged by
# the caller on the host, as is the straggler it leaves.
#
# Arguments: AQ_HOME, the repo base, the user's home, a loopback port on
# the host, the coordinator's port, a port on 127.0.0.2 (a host no job is
# allowed), the aq binary's path, a nonce, the job's repository, and
# optionally aq's pids (comma-separated; else aq is found among the script's
# ancestors by its binary).
AQHOME=$1 REPOBASE=$2 USERHOME=$3 PORT=$4 COORD=$5 FORBIDDEN=$6 AQBIN=$7 NONCE=$8 REPO=$9 AQPIDLIST=${10}
GITDIR=$REPOBASE/$REPO/.git

probe() {
	local name=$1
	shift
	if ("$@") >/dev/null 2>&1; then echo "PROBE $name ok"; else echo "PROBE $name denied"; fi
}

# Read what is not the job's.
probe read_aq_credentials cat "$AQHOME/credentials"
probe read_other_job_manifest sh -c 'cat "$0"/queue/*/other-*.md' "$AQHOME"
probe read_other_job_log sh -c 'cat "$0"/logs/other-*/stdout.log' "$AQHOME"
probe read_other_worktree sh -c 'cat "$0"/worktrees/*/*/other-work.txt "$0"/worktrees/*/*/*/other-work.txt 2>/dev/null | grep -q other' "$AQHOME"
probe read_other_repo cat "$REPOBASE/other/secret.txt"
probe read_ssh_key cat "$USERHOME/.ssh/id_ed25519"
probe read_cloud_creds cat "$USERHOME/.aws/credentials"
probe read_gh_token cat "$USERHOME/.config/gh/hosts.yml"

# Write outside the worktree (judged on the host).
probe write_home sh -c 'echo x > "$0/aq-escape-$1"' "$USERHOME" "$NONCE"
probe write_tmp sh -c 'echo x > "/tmp/aq-escape-$0"' "$NONCE"
probe write_repobase sh -c 'echo x > "$0/aq-escape-$1"' "$REPOBASE" "$NONCE"

# Plant what git would run later, in the repository's shared .git.
probe plant_hook sh -c 'printf "#!/bin/sh\ntouch /tmp/aq-hook-ran-%s\n" "$1" > "$0/hooks/post-commit" && chmod +x "$0/hooks/post-commit"' "$GITDIR" "$NONCE"
probe plant_fsmonitor git --git-dir="$GITDIR" config core.fsmonitor "touch /tmp/aq-fsmonitor-ran-$NONCE; false"

# Reach the network: a loopback port, the coordinator, a host not allowed.
probe reach_loopback bash -c "exec 3<>/dev/tcp/127.0.0.1/$PORT"
probe reach_coordinator bash -c "exec 3<>/dev/tcp/127.0.0.1/$COORD && printf 'GET /api/fleet/queue-state HTTP/1.0\r\n\r\n' >&3 && head -1 <&3 | grep -q HTTP"
probe reach_forbidden_host bash -c "exec 3<>/dev/tcp/127.0.0.2/$FORBIDDEN"

# See and signal aq.
aqpids() {
	if [ -n "$AQPIDLIST" ]; then
		for p in $(echo "$AQPIDLIST" | tr , ' '); do [ -e "/proc/$p" ] && echo "$p"; done
		return
	fi
	# The aq that runs this script: its ancestors, not every process of the
	# binary (other aq runs of it come and go: a pid listed here must still
	# be there to be signalled).
	p=$$
	while [ -n "$p" ] && [ "$p" -gt 1 ]; do
		if tr '\0' ' ' <"/proc/$p/cmdline" 2>/dev/null | grep -q "^$AQBIN "; then echo "$p"; fi
		p=$(awk '/^PPid:/ {print $2}' "/proc/$p/status" 2>/dev/null)
	done
}
AQPIDS=$(aqpids)
probe see_aq test -n "$AQPIDS"
probe signal_aq sh -c 'test -n "$0" && for p in $0; do kill -CONT "$p" || exit 1; done' "$AQPIDS"
probe read_aq_environ sh -c 'test -n "$0" && for p in $0; do cat "/proc/$p/environ" || exit 1; done' "$AQPIDS"

# aq's own settings and the factory's tokens in the engine's environment.
probe env_aq_home test -n "$AQ_HOME"
probe env_gh_token test -n "$GH_TOKEN$GITHUB_TOKEN"

# A straggler that drops the job's tag and leaves its process group.
env -i setsid /bin/sh -c "echo up > '$PWD/.straggler-$NONCE'; sleep 1000; : straggler-$NONCE" </dev/null >/dev/null 2>&1 &
while [ ! -e ".straggler-$NONCE" ]; do sleep 0.01; done
rm -f ".straggler-$NONCE"

# The job itself.
echo "done by a hostile engine" > result.txt
exit 0
