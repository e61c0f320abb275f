#!/bin/sh
# binome-enter: every SSH session of a customer account lands in the order's container.
#
# Installed by provisioning (root-owned, 755) on hosts that run containers. sshd's ForceCommand runs it for the
# customer's accounts, through sudo (the container belongs to root: the customer may not start, change or exec
# into it themselves). It trusts nothing the customer sends: the account is SUDO_UID, set by sudo; the command the
# client asked for (SSH_ORIGINAL_COMMAND, kept by the sudoers rule) is only ever handed to a shell inside the
# container, as the customer's own uid, with the container's limits. See docs/architecture.md "Provisioning".
set -u
PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
export PATH

say() { printf 'binome: %s\n' "$*" >&2; }

case "${SUDO_UID:-}" in
'' | *[!0-9]*) say "run through sudo by the SSH login, not by hand"; exit 1 ;;
esac
entry=$(getent passwd "$SUDO_UID") || { say "no account for uid $SUDO_UID"; exit 1; }
user=${entry%%:*}
gid=$(printf '%s' "$entry" | cut -d: -f4)
home=$(printf '%s' "$entry" | cut -d: -f6)
runtime=$(cat /etc/binome/runtime 2>/dev/null) || { say "this host is not set up for containers"; exit 1; }
case "$runtime" in
*[!A-Za-z0-9/._-]*) say "unknown container runtime on this host"; exit 1 ;;
podman | docker | */podman | */docker) ;;
*) say "unknown container runtime on this host"; exit 1 ;;
esac
options=
case "$runtime" in *podman) options="--runtime runc" ;; esac
name="binome-$user"

# shellcheck disable=SC2086  # $options is one fixed pair of words or nothing
if [ "$($runtime $options container inspect --format '{{.State.Running}}' "$name" 2>/dev/null)" != true ]; then
    # A host that rebooted, or a container that stopped: start it again as it was made (same devices, same limits).
    $runtime $options start "$name" >/dev/null 2>&1 || {
        say "your environment is not running on this machine; the operators are told from your order page"
        exit 1
    }
fi

set -- --interactive --user "$SUDO_UID:$gid" --workdir "$home" --env "HOME=$home" --env "USER=$user" \
    --env "LOGNAME=$user"
if [ -t 0 ] && [ -t 1 ]; then set -- "$@" --tty; fi
case "${TERM:-}" in '' | *[!A-Za-z0-9._+-]*) ;; *) set -- "$@" --env "TERM=$TERM" ;; esac
command=${SSH_ORIGINAL_COMMAND-}

# shellcheck disable=SC2086
case "$command" in
'')
    exec $runtime $options exec "$@" "$name" /bin/sh -c 'if command -v bash >/dev/null 2>&1; then exec bash -l; fi; exec sh -l'
    ;;
internal-sftp | */sftp-server | sftp-server)
    # The image's own sftp-server when it has one (then scp, which speaks SFTP, sees exactly the container's
    # files); otherwise the host's, as the customer, started in the home that the container mounts at the same path.
    for server in /usr/lib/openssh/sftp-server /usr/libexec/openssh/sftp-server /usr/lib/sftp-server \
        /usr/libexec/sftp-server; do
        if $runtime $options exec --user "$SUDO_UID:$gid" "$name" test -x "$server" 2>/dev/null; then
            exec $runtime $options exec "$@" "$name" "$server"
        fi
    done
    exec runuser -u "$user" -- /usr/lib/openssh/sftp-server -d "$home"
    ;;
*)
    exec $runtime $options exec "$@" "$name" /bin/sh -c "$command"
    ;;
esac
