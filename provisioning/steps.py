"""The idempotent steps of provisioning and teardown, run on one host through a driver connection.

Each step checks before it acts, so running it again after a crash finishes the job instead of doing it twice.
Commands are argv lists (quoted by the driver), never strings built from customer input.

Root never acts on a path the customer controls. Everything under the customer's home can be replaced by the
customer between two runs (`ln -s /etc ~/.binome`), so what is written there is written as the customer
(`runuser`): a planted symlink then leads only where the customer could go anyway. What must stay out of the
customer's hands (the pre-flight check and the split-trial kit) is written by root into a root-owned directory
outside the home (`KIT_ROOT/<user>`), which `~/.binome` links to.
"""

import json
import re
import shlex
from dataclasses import dataclass
from datetime import UTC, datetime

from nodekit.bundle import script_bytes
from provisioning.drivers.base import CommandFailed, Connection

ENV_FILE = ".binome-env"
KIT_ROOT = "/var/lib/binome"  # root-owned, 755: one read-only kit directory per account
# Every key gets `restrict` (no pty, no forwarding of any kind, no ~/.ssh/rc), then what is re-enabled on purpose:
# a terminal, and local port forwarding to the host's own loopback (Jupyter, TensorBoard), nowhere else.
# Remote forwarding (-R) is held to one address nobody may bind (port 1 is privileged and sshd binds as the
# customer): sshd 9.2 has no "none" for permitlisten in authorized_keys. Agent and X11 forwarding stay off.
KEY_OPTIONS = (
    'restrict,pty,port-forwarding,permitopen="localhost:*",permitopen="127.0.0.1:*",permitlisten="127.0.0.1:1"'
)
MARKER = "# binome: research window environment"


@dataclass(frozen=True)
class StepContext:
    username: str
    comment: str
    authorized_keys: str
    gpu_indices: list[int]
    visible_devices_variable: str  # CUDA_VISIBLE_DEVICES or ROCR_VISIBLE_DEVICES
    expect_arch: str
    expect_vendor: str
    image_ref: str
    container_runtime: str
    keys_expire_at: datetime  # the window's end plus the grace period: sshd refuses the keys after it


DRY_RUN_REPORT = {
    "schema": "binome.preflight/1",
    "dry_run": True,
    "checks": [{"name": "dry_run", "status": "SKIP", "reason": "dry-run driver: nothing was run on a real machine"}],
    "summary": {"status": "DRY-RUN", "passed": 0, "failed": 0, "skipped": 1, "warnings": 0},
}


class StepFailed(Exception):
    """A step could not complete; `message` is for operators."""


def _dry(conn: Connection) -> bool:
    return bool(getattr(conn, "is_dry_run", False))


def _home(conn: Connection, username: str) -> str:
    if _dry(conn):
        return f"/home/{username}"
    entry = conn.run(["getent", "passwd", username]).stdout.strip()
    return entry.split(":")[5]


def _user_exists(conn: Connection, username: str) -> bool:
    return conn.run(["id", "-u", username], check=False).exit_status == 0


def _as_customer(ctx: StepContext, argv: list[str]) -> list[str]:
    """argv run with the customer's own uid, gid and groups: for anything that touches their home."""
    return ["runuser", "-u", ctx.username, "--", *argv]


def _kit_dir(ctx: StepContext) -> str:
    return f"{KIT_ROOT}/{ctx.username}"


# Run as the customer: make $1 a real directory (mode 700). A symlink or a file planted in its place is removed,
# by the customer's own hand, so nothing is ever written through it.
_REAL_DIRECTORY = 'if [ -L "$1" ] || { [ -e "$1" ] && [ ! -d "$1" ]; }; then rm -f -- "$1"; fi; mkdir -p -m 700 -- "$1"'
# Run as the customer: add line $3 at the top of rc file $1 unless marker $2 is there. A symlink the customer cannot
# write through (to a system file, or dangling) is replaced by a file of their own.
_SOURCE_FROM_RC = (
    'f="$1"; if [ -L "$f" ] && [ ! -w "$f" ]; then rm -f -- "$f"; fi; touch -- "$f" && '
    '{ grep -qF -- "$2" "$f" || if [ -s "$f" ]; then sed -i --follow-symlinks "1i $3" "$f"; '
    'else printf "%s\\n" "$3" > "$f"; fi; }'
)
# Run as the customer: ~/.binome ($1) becomes a link to the kit ($2); a directory found there is moved aside.
_LINK_KIT = (
    'if [ -d "$1" ] && [ ! -L "$1" ]; then mv -T -- "$1" "$1.moved-$(date +%Y%m%d%H%M%S)"; fi; ln -sfnT -- "$2" "$1"'
)


def connect(conn: Connection, ctx: StepContext) -> str:
    return conn.run(["uname", "-a"]).stdout.strip()


def create_user(conn: Connection, ctx: StepContext) -> str:
    if _user_exists(conn, ctx.username):
        conn.run(["usermod", "--unlock", "--expiredate", "", ctx.username], check=False)
        _close_home(conn, ctx)
        return f"user {ctx.username} already exists (unlocked, home 700)"
    conn.run(["useradd", "--create-home", "--shell", "/bin/bash", "--comment", ctx.comment, ctx.username])
    # No password: key login only. Unlock the password-less account so sshd accepts key logins.
    conn.run(["usermod", "--password", "*", ctx.username])
    _close_home(conn, ctx)
    return f"user {ctx.username} created"


def _close_home(conn: Connection, ctx: StepContext) -> None:
    """Other accounts on the host cannot read the customer's files (useradd's default mode is 755)."""
    conn.run(_as_customer(ctx, ["chmod", "0700", _home(conn, ctx.username)]))


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


def install_keys(conn: Connection, ctx: StepContext) -> str:
    home = _home(conn, ctx.username)
    lines = authorized_keys_lines(ctx.authorized_keys, ctx.keys_expire_at)
    conn.run(_as_customer(ctx, ["sh", "-c", _REAL_DIRECTORY, "install_keys", f"{home}/.ssh"]))
    content = "".join(f"{line}\n" for line in lines).encode()
    conn.put_file(f"{home}/.ssh/authorized_keys", content, mode=0o600, as_user=ctx.username)
    expiry = ctx.keys_expire_at.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    return (
        f"{len(lines)} key(s) installed in {home}/.ssh/authorized_keys (700/600, owned by {ctx.username}), "
        f"restricted, expiring {expiry}"
    )


def restrict_gpus(conn: Connection, ctx: StepContext) -> str:
    home = _home(conn, ctx.username)
    devices = ",".join(str(index) for index in ctx.gpu_indices)
    variables = {ctx.visible_devices_variable: devices}
    if ctx.visible_devices_variable == "ROCR_VISIBLE_DEVICES":
        variables["HIP_VISIBLE_DEVICES"] = devices
    env_lines = "".join(f"export {name}={shlex.quote(value)}\n" for name, value in variables.items())
    # The variables are advisory (the customer can unset them), so the file is the customer's own.
    conn.put_file(f"{home}/{ENV_FILE}", f"{MARKER}\n{env_lines}".encode(), mode=0o644, as_user=ctx.username)
    # Sourced first thing by login shells (.profile) and by the non-interactive shells of `ssh host command`
    # (.bashrc, which Debian's bash reads for sshd before its interactive-only guard).
    source = f'[ -r "$HOME/{ENV_FILE}" ] && . "$HOME/{ENV_FILE}"  {MARKER}'
    for rc in (".bashrc", ".profile"):
        conn.run(_as_customer(ctx, ["sh", "-c", _SOURCE_FROM_RC, "restrict_gpus", f"{home}/{rc}", MARKER, source]))
    nodes = [f"/dev/nvidia{index}" for index in ctx.gpu_indices] if ctx.expect_vendor == "nvidia" else []
    present = [node for node in nodes if conn.run(["test", "-e", node], check=False).exit_status == 0]
    if present and conn.run(["sh", "-c", "command -v setfacl"], check=False).exit_status == 0:
        for node in present:
            conn.run(["setfacl", "-m", f"u:{ctx.username}:rw", node])
        permissions = f"device ACLs set on {', '.join(present)}"
    else:
        permissions = "device permissions not changed (no GPU device nodes or no setfacl on this host)"
    return f"{', '.join(f'{k}={v}' for k, v in variables.items())} in the login environment; {permissions}"


def prepare_image(conn: Connection, ctx: StepContext) -> str:
    runtime = ctx.container_runtime
    if not runtime:  # whichever the host has, if it answers (a docker client without its daemon does not count)
        found = conn.run(["sh", "-c", "command -v podman || command -v docker"], check=False)
        candidate = found.stdout.strip().splitlines()[0] if found.exit_status == 0 and found.stdout.strip() else ""
        if candidate and conn.run([candidate, "info"], check=False, timeout=30).exit_status == 0:
            runtime = candidate
    if not runtime:
        return f"no container runtime answers on this host: {ctx.image_ref} not pulled (the customer pulls it)"
    # An image already in the host's store is used as it is: hosts without a registry get theirs imported.
    if conn.run([runtime, "image", "inspect", "--format", "{{.Id}}", ctx.image_ref], check=False).exit_status == 0:
        return f"{runtime}: {ctx.image_ref} already present"
    result = conn.run([runtime, "pull", ctx.image_ref], check=False, timeout=3600)
    if result.exit_status != 0:
        raise StepFailed(f"{runtime} pull {ctx.image_ref} failed: {result.stderr.strip()[-500:]}")
    return f"{runtime} pull {ctx.image_ref}: done"


def preflight(conn: Connection, ctx: StepContext) -> str:
    home, kit = _home(conn, ctx.username), _kit_dir(ctx)
    conn.run(["install", "-d", "-m", "755", "-o", "root", "-g", "root", KIT_ROOT, kit])
    script = f"{kit}/preflight.py"
    conn.put_file(script, script_bytes("preflight"), mode=0o555)
    # The split-trial kit travels with the access (docs: the guide's "split trial" section).
    conn.put_file(f"{kit}/split_trial.py", script_bytes("split_trial"), mode=0o555)
    conn.run(_as_customer(ctx, ["sh", "-c", _LINK_KIT, "preflight", f"{home}/.binome", kit]))
    devices = ",".join(str(index) for index in ctx.gpu_indices)
    argv = [
        "runuser",
        "-u",
        ctx.username,
        "--",
        "env",
        f"{ctx.visible_devices_variable}={devices}",
        "python3",
        "-I",  # isolated: no PYTHON* variables, no user site, no script directory: the customer shadows nothing
        script,
        "--gpus",
        devices,
        "--expect-arch",
        ctx.expect_arch,
        "--expect-vendor",
        ctx.expect_vendor,
    ]
    result = conn.run(argv, check=False, timeout=900)
    if _dry(conn):
        return json.dumps(DRY_RUN_REPORT)
    try:
        report = json.loads(result.stdout)
    except json.JSONDecodeError as exc:
        raise StepFailed(
            f"the pre-flight check printed no report (exit {result.exit_status}): {result.stderr.strip()[-500:]}"
        ) from exc
    return json.dumps(report)


def revoke_devices(conn: Connection, ctx: StepContext) -> str:
    """Take back what the account was given beside its home: device ACLs and supplementary groups (video, render,
    sudo: whatever an operator added)."""
    if not _user_exists(conn, ctx.username):
        return f"user {ctx.username} does not exist"
    nodes = [f"/dev/nvidia{index}" for index in ctx.gpu_indices] if ctx.expect_vendor == "nvidia" else []
    present = [node for node in nodes if conn.run(["test", "-e", node], check=False).exit_status == 0]
    if present and conn.run(["sh", "-c", "command -v setfacl"], check=False).exit_status == 0:
        for node in present:
            conn.run(["setfacl", "-x", f"u:{ctx.username}", node])
    conn.run(["usermod", "--groups", "", ctx.username])
    groups = conn.run(["id", "-nG", ctx.username]).stdout.split()
    if groups != [conn.run(["id", "-gn", ctx.username]).stdout.strip()] and not _dry(conn):
        raise StepFailed(f"{ctx.username} is still in groups {' '.join(groups)}")
    acls = f"device ACLs removed from {', '.join(present)}; " if present else ""
    return f"{acls}supplementary groups removed"


def revoke_keys(conn: Connection, ctx: StepContext) -> str:
    if not _user_exists(conn, ctx.username):
        return f"user {ctx.username} does not exist"
    home = _home(conn, ctx.username)
    # As the customer: a ~/.ssh planted as a symlink is unlinked itself (sshd then finds no keys there).
    script = (
        'if [ -L "$1" ]; then rm -f -- "$1"; '
        'elif [ -d "$1" ]; then chmod u+wx -- "$1"; rm -f -- "$1/authorized_keys"; fi'
    )
    conn.run(_as_customer(ctx, ["sh", "-c", script, "revoke_keys", f"{home}/.ssh"]))
    return "authorized keys removed"


# Kill every process of user $1 until none is left (a process may fork while the previous ones die); exit 1 with
# the survivors listed when some remain after about 5 s (one in uninterruptible sleep: the operator retries).
_KILL_ALL = (
    'killed=0; for attempt in $(seq 20); do pgrep -u "$1" >/dev/null || { echo "killed=$killed"; exit 0; }; '
    'pkill -KILL -u "$1" && killed=1; sleep 0.25; done; pgrep -a -u "$1"; exit 1'
)


def stop_processes(conn: Connection, ctx: StepContext) -> str:
    if not _user_exists(conn, ctx.username):
        return f"user {ctx.username} does not exist"
    result = conn.run(["sh", "-c", _KILL_ALL, "stop_processes", ctx.username], check=False, timeout=60)
    if result.exit_status != 0:
        raise StepFailed(f"processes of {ctx.username} survived SIGKILL: {result.stdout.strip()[-500:]}")
    if _dry(conn):
        return "processes stopped"
    stopped = "killed=1" in result.stdout
    return "processes stopped; none remains" if stopped else "no process was running"


def lock_user(conn: Connection, ctx: StepContext) -> str:
    if not _user_exists(conn, ctx.username):
        return f"user {ctx.username} does not exist"
    conn.run(["usermod", "--lock", "--expiredate", "1", ctx.username])
    return "user locked and expired"


def keep_or_wipe(conn: Connection, ctx: StepContext) -> str:
    """Teardown runs written before the wipe moved to its own run end here: files are kept until then."""
    return "files kept until the wipe (operator setting: days after the end)"


def wipe_data(conn: Connection, ctx: StepContext) -> str:
    """The account and its files, after the grace period announced to the customer."""
    if not _user_exists(conn, ctx.username):
        conn.run(["rm", "-rf", "--one-file-system", _kit_dir(ctx)])
        return "already removed"
    stop_processes(conn, ctx)  # userdel refuses while a process of the user runs
    # What the account left in the host's shared temporary directories (find follows no link; -xdev stays put).
    shared_tmp = ["/tmp", "/var/tmp", "/dev/shm"]  # noqa: S108 (deleting the user's files there, not making any)
    conn.run(["find", *shared_tmp, "-xdev", "-user", ctx.username, "-delete"], check=False)
    try:
        conn.run(["userdel", "--remove", ctx.username])
    except CommandFailed as exc:
        raise StepFailed(f"userdel failed: {exc.result.stderr.strip()[-300:]}") from exc
    conn.run(["rm", "-rf", "--one-file-system", _kit_dir(ctx)])
    return "user and home directory deleted"


PROVISION_STEPS = ["connect", "create_user", "install_keys", "restrict_gpus", "prepare_image", "preflight"]
PREFLIGHT_STEPS = ["connect", "preflight"]
# Locked first, so that no new session starts while the others are killed; each step checks its own work.
TEARDOWN_STEPS = ["connect", "lock_user", "stop_processes", "revoke_keys", "revoke_devices"]
WIPE_STEPS = ["connect", "wipe_data"]
KEYS_STEPS = ["connect", "install_keys"]  # a window that moved (extension): the keys' expiry moves with it
STEPS = {
    function.__name__: function
    for function in (
        connect,
        create_user,
        install_keys,
        restrict_gpus,
        prepare_image,
        preflight,
        revoke_keys,
        stop_processes,
        lock_user,
        revoke_devices,
        keep_or_wipe,
        wipe_data,
    )
}
