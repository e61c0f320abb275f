"""The steps on the host itself and the customer's account there: reaching the host and preparing root's side of
it (runtime, login stack, firewall guard), the account that gives the container its uid, the keys of the hand-over,
and taking all of it away again (lock, keys, processes, the wipe).
"""

import posixpath
import re
from datetime import UTC, datetime

from nodekit.bundle import host_file_bytes
from provisioning import containers, host_probe, ports
from provisioning.container_steps import remove_container, remove_download
from provisioning.containers import CUSTOMER_GROUP  # the host's sshd denies it (docs/operations.md)
from provisioning.drivers.base import CommandFailed, Connection
from provisioning.step_context import (
    IDS_LOCK,
    KIT_ROOT,
    VOLUME_ROOT,
    StepContext,
    StepFailed,
    StepOutput,
    install_root_files,
    is_dry_run,
    runtime_of,
    user_exists,
)

NOLOGIN = "/usr/sbin/nologin"
# Every key gets `restrict` (no agent or X11 forwarding, no ~/.ssh/rc), then what researchers need is given back: a
# terminal, and port forwarding (-L, -D for VS Code Remote-SSH), which reaches only what the container reaches.
KEY_OPTIONS = "restrict,pty,port-forwarding"


def connect(conn: Connection, ctx: StepContext) -> str:
    return conn.run(["uname", "-a"]).stdout.strip()


def prepare_host(conn: Connection, ctx: StepContext) -> str:
    """The runtime answers, the host's login stack keeps customers out (host_probe.login_stack), and root's
    directories are in place."""
    runtime = runtime_of(ctx)
    answer = conn.run(runtime.command("version", "--format", "{{.Server.Version}}"), check=False, timeout=60)
    if answer.exit_status != 0 and not is_dry_run(conn):
        raise StepFailed(f"{runtime.path} does not answer on this host: {answer.stderr.strip()[-300:]}")
    if not is_dry_run(conn):
        stack = host_probe.login_stack(conn)
        if not stack.ok:
            raise StepFailed("the host's login stack could reach a customer: " + "; ".join(stack.problems))
    # The guard's and its unit's directories too: Debian has no /usr/local/libexec until something makes it
    make = (
        'groupadd --force "$1" && install -d -m 755 -o root -g root "$2" && install -d -m 700 -o root -g root "$3"'
        ' && install -d -m 755 -o root -g root "$4" "$5"'
    )
    conn.run(
        [
            *("sh", "-c", make, "prepare_host", CUSTOMER_GROUP, KIT_ROOT, VOLUME_ROOT),
            *(posixpath.dirname(containers.GUARD_PATH), posixpath.dirname(containers.GUARD_UNIT_PATH)),
        ]
    )
    conn.run(runtime.guard_argv())
    # The same guard at boot, before the runtime restarts the containers, and every 30 s (where systemd runs the host)
    units = {path: (content, 0o644, "root") for path, content in runtime.guard_units().items()}
    written = install_root_files(
        conn, {containers.GUARD_PATH: (host_file_bytes("binome-guard"), 0o755, "root"), **units}
    )
    enable = (
        "if [ -d /run/systemd/system ]; then systemctl daemon-reload && systemctl enable --quiet binome-guard.service"
        " && systemctl enable --quiet --now binome-guard.timer && echo on; fi"
    )
    at_boot = conn.run(["sh", "-c", enable], check=False).stdout.strip()
    boot = "rebuilt at boot and every 30 s" if at_boot == "on" else "no systemd here: rebuilt by each keys run"
    changed = f" ({len(written)} file(s) written)" if written else ""
    return (
        f"{runtime.path}: answers; login stack keeps customers out; firewall guard on {runtime.bridges}, {boot}"
        f"{changed}; {KIT_ROOT} and {VOLUME_ROOT} in place; {reserve_customer_ports(conn, ctx)}"
    )


def reserve_customer_ports(conn: Connection, ctx: StepContext) -> str:
    """The ports the host publishes its customers' SSH servers on, taken out of the kernel's ephemeral ports where
    they fall in them (provisioning/ports.py). Not persisted: each provisioning run sets it again. A host that
    refuses it is said in the step's output, not a failure: the ports are only less certain."""
    if is_dry_run(conn):
        return "customer ports: nothing reserved (dry run)"
    state = ports.reserve(conn, ports.customer_ports(ctx.ssh_port_base, ctx.host_port_span))
    if not state.exposed:
        return "customer ports outside the ephemeral ports"
    if state.unreserved:
        return (
            f"WARNING: customer ports {ports.port_ranges(state.exposed)} are in the ephemeral ports and could not be "
            f"reserved ({ports.RESERVED_PORTS}): an outgoing connection may hold one when a container starts"
        )
    return f"customer ports {ports.port_ranges(state.exposed)} reserved from the ephemeral ports"


# Each account's own range of subordinate ids, its containers' user namespace: useradd gives one to every new account
# where login.defs sets SUB_UID_COUNT (Debian, Ubuntu, Fedora do); an account without one gets the range above the
# highest listed in either file. Under one lock with useradd: two runs never take the same range.
_SUBORDINATE_IDS = (
    "start=$(awk -F: 'BEGIN { top = 100000 } $2 + $3 > top { top = $2 + $3 } END { print top }' /etc/subuid "
    "/etc/subgid 2>/dev/null); end=$((start + $2 - 1)); "
    'grep -q "^$1:" /etc/subuid 2>/dev/null || usermod --add-subuids "$start-$end" "$1" || exit 1; '
    'grep -q "^$1:" /etc/subgid 2>/dev/null || usermod --add-subgids "$start-$end" "$1" || exit 1; '
    'grep -m 1 "^$1:" /etc/subuid | cut -d: -f2'
)


# The account ($1) made, or brought to this design when it exists (a home of the customer's own, a login shell), with
# its kit directory ($3, in $7) as a root-owned home, no login shell ($4), in the customers' group ($5); prints what it
# did, then the start of its range of subordinate ids. usermod names it --home (useradd --home-dir): the other
# spelling is a usage error, exit status 2.
_CREATE_USER = (
    'install -d -m 755 -o root -g root "$7" "$3" && if id -u "$1" >/dev/null 2>&1; then '
    'usermod --home "$3" --shell "$4" --append --groups "$5" --lock "$1" && echo "already exists"; else '
    'useradd --no-create-home --home-dir "$3" --shell "$4" --groups "$5" --comment "$6" "$1" '
    '&& usermod --lock "$1" && echo created; fi && '
)


def create_user(conn: Connection, ctx: StepContext) -> str:
    """The account that gives the container its user namespace: no login shell, password locked, home the root-owned
    kit directory, in the group the host's sshd denies, with a range of subordinate ids of its own. Nothing in it is
    the customer's. One round trip, under the lock of the ranges (useradd takes one too)."""
    home = ctx.kit_dir
    script = _CREATE_USER + _SUBORDINATE_IDS
    argv = ["sh", "-c", script, "create_user", ctx.username, str(containers.ID_RANGE), home, NOLOGIN, CUSTOMER_GROUP]
    answer = conn.run(["flock", IDS_LOCK, *argv, ctx.comment, KIT_ROOT]).stdout.splitlines()
    made, start = ([*answer, "?", "?"])[:2] if not is_dry_run(conn) else ("made", "?")
    return (
        f"user {ctx.username} {made} (no login shell, locked, home {home} root-owned; "
        f"user namespace from host id {start})"
    )


def authorized_keys_lines(authorized_keys: str, expires_at: datetime) -> list[str]:
    """One restricted line per key: options, then the key type and data (the comment is dropped: it is the
    customer's text, and nothing the options depend on)."""
    expiry = expires_at.astimezone(UTC).strftime("%Y%m%d%H%M%SZ")
    lines = []
    for line in authorized_keys.splitlines():
        fields = line.split()
        if len(fields) < 2:
            continue
        key_type, key_data = fields[0], fields[1]
        if not re.fullmatch(r"[a-z0-9@.-]+", key_type) or not re.fullmatch(r"[A-Za-z0-9+/=]+", key_data):
            raise StepFailed(f"refusing a key line that is not `type base64`: {line[:40]!r}")
        lines.append(f'{KEY_OPTIONS},expiry-time="{expiry}" {key_type} {key_data}')
    return lines


def install_keys(conn: Connection, ctx: StepContext) -> StepOutput:
    """The hand-over: the customer's keys in the container's root-owned keys file, which starts its sshd."""
    lines = authorized_keys_lines(ctx.authorized_keys, ctx.keys_expire_at)
    content = "".join(f"{line}\n" for line in lines).encode()
    conn.put_file(f"{ctx.ssh_dir}/authorized_keys", content, mode=0o644, owner="root:root")
    expiry = ctx.keys_expire_at.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    return StepOutput(
        f"{len(lines)} key(s) installed (root-owned, read-only in the container), expiring {expiry}",
        {"keys_expire_at": ctx.keys_expire_at},
    )


def revoke_keys(conn: Connection, ctx: StepContext) -> str:
    """The container's keys file emptied (root's own directory: no customer path involved)."""
    keys = f"{ctx.ssh_dir}/authorized_keys"
    conn.run(["sh", "-c", 'if [ -f "$1" ]; then : > "$1"; fi', "revoke_keys", keys])
    return "authorized keys removed"


# Kill every process of user $1 and of its range of subordinate ids (its containers' processes) until none is left (a
# process may fork while the previous ones die); exit 1 with the survivors listed when some remain after about 5 s
# (one in uninterruptible sleep: the operator retries).
_KILL_ALL = (
    "# shellcheck disable=SC2086,SC2046 # the pid lists split into words on purpose\n"
    'uid=$(id -u "$1"); range=$(grep -m 1 "^$1:" /etc/subuid 2>/dev/null | cut -d: -f2,3); start=${range%%:*}; '
    'count=${range##*:}; [ -n "$range" ] || { start=0; count=0; }; '
    'tenant() { ps -e -o uid=,pid= | awk -v u="$uid" -v s="$start" -v n="$count" '
    "'$1 == u || ($1 >= s && $1 < s + n) { print $2 }'; }; "
    'killed=0; for _ in $(seq 20); do pids=$(tenant); [ -n "$pids" ] || { echo "killed=$killed"; exit 0; }; '
    'kill -KILL $pids 2>/dev/null && killed=1; sleep 0.25; done; echo "survivors:" $(tenant); exit 1'
)


def stop_processes(conn: Connection, ctx: StepContext) -> str:
    if not user_exists(conn, ctx.username):
        return f"user {ctx.username} does not exist"
    result = conn.run(["sh", "-c", _KILL_ALL, "stop_processes", ctx.username], check=False, timeout=60)
    if result.exit_status != 0:
        raise StepFailed(f"processes of {ctx.username} survived SIGKILL: {result.stdout.strip()[-500:]}")
    if is_dry_run(conn):
        return "processes stopped"
    stopped = "killed=1" in result.stdout
    return "processes stopped; none remains" if stopped else "no process was running"


def lock_user(conn: Connection, ctx: StepContext) -> str:
    if not user_exists(conn, ctx.username):
        return f"user {ctx.username} does not exist"
    conn.run(["usermod", "--lock", "--expiredate", "1", "--shell", NOLOGIN, ctx.username])
    return "user locked and expired"


def legacy_step(conn: Connection, ctx: StepContext) -> str:
    """A step of the design before containers were the only way in (its runs may still be queued): nothing to do."""
    return "a step of an earlier design: nothing to do"


def wipe_data(conn: Connection, ctx: StepContext) -> str:
    """The account, its data volume and its kit, after the grace period announced to the customer."""
    remove_download(conn, ctx)  # the download window closes with the files (first: it is on the order's network)
    remove_container(conn, ctx)  # a container still holding the volume would keep it
    for path in dict.fromkeys([ctx.container_runtime] if ctx.container_runtime else []):
        runtime = containers.Runtime(path)
        if conn.run(runtime.command("volume", "inspect", ctx.volume_name), check=False).ok and not is_dry_run(conn):
            conn.run(runtime.command("volume", "rm", "--force", ctx.volume_name), timeout=120)
    conn.run(["rm", "-f", "--", ctx.volume_file, f"{ctx.volume_file}.part"])
    if user_exists(conn, ctx.username):
        stop_processes(conn, ctx)  # userdel refuses while a process of the user runs
        try:
            conn.run(["userdel", ctx.username])
        except CommandFailed as exc:
            raise StepFailed(f"userdel failed: {exc.result.stderr.strip()[-300:]}") from exc
    conn.run(["rm", "-rf", "--one-file-system", "--", ctx.kit_dir])
    return "user, data volume and kit deleted"
