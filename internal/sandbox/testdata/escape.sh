#!/bin/bash
# The escapes a hostile engine tries, and the work an honest one does, run
# inside a sandbox by the tests of internal/sandbox. Each probe prints
# "PROBE <name> ok" when it worked and "PROBE <name> denied" when it did
# not; the test decides which outcome each level must show. Inputs, in the
# environment: AQHOME, REPOBASE, HOSTHOME, GITDIR, WORKTREE, PORT (a
# listener on the host's loopback), PARENT (a host process: the test),
# NONCE (marks what this run leaves on the host).
probe() {
	local name=$1
	shift
	if ("$@") >/dev/null 2>&1; then echo "PROBE $name ok"; else echo "PROBE $name denied"; fi
}

# The honest engine's work.
probe read_worktree cat "$WORKTREE/README"
probe write_worktree sh -c 'echo work > "$WORKTREE/made-by-engine"'
probe write_home sh -c 'echo x > "$HOME/.engine-state"'
probe write_tmpdir sh -c 'echo x > "${TMPDIR:-/tmp}/scratch"'
probe run_toolchain "$HOSTHOME/.tool/bin/tool"
probe read_gitdir cat "$GITDIR/config"
probe read_cache cat "$HOSTHOME/.cache/pkgs/shared.txt"
probe write_cache sh -c 'echo mine > "$HOSTHOME/.cache/pkgs/mine-$NONCE"'

# The escapes.
probe read_credentials cat "$AQHOME/credentials"
probe read_other_job cat "$AQHOME/queue/inbox/other.md"
probe read_other_worktree cat "$AQHOME/worktrees/app/job-2/x.txt"
probe read_other_repo cat "$REPOBASE/other/secret.txt"
probe read_ssh_key cat "$HOSTHOME/.ssh/id_ed25519"
probe write_host_tmp sh -c 'echo x > "/tmp/aq-escape-$NONCE" && test -e "/tmp/aq-escape-$NONCE"'
probe write_host_home sh -c 'echo x > "$HOSTHOME/aq-escape-$NONCE"'
probe write_repobase sh -c 'echo x > "$REPOBASE/aq-escape-$NONCE"'
probe plant_git_hook sh -c 'mkdir -p "$GITDIR/hooks" && echo "#!/bin/sh" > "$GITDIR/hooks/post-checkout"'
probe plant_git_config sh -c 'printf "[core]\n\tfsmonitor = touch /tmp/pwned\n" >> "$GITDIR/config"'
probe write_usr touch /usr/aq-escape-$NONCE
probe loopback bash -c "exec 3<>/dev/tcp/127.0.0.1/$PORT"
probe see_parent test -e "/proc/$PARENT"
probe read_parent_environ cat "/proc/$PARENT/environ"
probe signal_parent kill -CONT "$PARENT"
# A straggler that drops the job's tag and leaves the engine's group: the
# test looks for it on the host once the run is over. The probe waits until
# it runs.
env -i setsid /bin/sh -c "echo up > '$WORKTREE/.straggler-$NONCE'; sleep 1000; : straggler-$NONCE" </dev/null >/dev/null 2>&1 &
while [ ! -e "$WORKTREE/.straggler-$NONCE" ]; do sleep 0.01; done
echo "PROBE straggler started"
exit 0
