"""The idempotent steps of provisioning and teardown, run on one host through a driver connection.

Each step checks before it acts, so running it again after a crash finishes the job instead of doing it twice.
Commands are argv lists (quoted by the driver), never strings built from customer input.

Root never acts on a path the customer controls. Everything under the customer's home can be replaced by the
customer between two runs (`ln -s /etc ~/.binome`), so what is written there is written as the customer
(`runuser`): a planted symlink then leads only where the customer could go anyway. What must stay out of the
customer's hands (the pre-flight check and the split-trial kit) is written by root into a root-owned directory
outside the home (`KIT_ROOT/<user>`), which `~/.binome` links to.
"""

import dataclasses
import hashlib
import json
import posixpath
import re
import shlex
from dataclasses import dataclass
from datetime import UTC, datetime

from nodekit.bundle import host_file_bytes, script_bytes
from provisioning import containers
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

# Hosts that run containers (a runtime is set on the host): every SSH session of a customer account lands in the
# order's container. The pieces provisioning installs on such a host (prepare_host), all root-owned:
CUSTOMER_PREFIX = "bn-"  # provisioning.services.username_for: the accounts sshd's Match block applies to
CUSTOMER_GROUP = "binome-customers"  # may run the enter script through sudo; teardown removes the membership
ENTER_SCRIPT = "/usr/local/libexec/binome-enter"
RUNTIME_FILE = "/etc/binome/runtime"
KEYS_DIR = "/etc/binome/authorized_keys"  # root-owned keys: the customer can neither add a key nor drop a limit
SUDOERS_FILE = "/etc/sudoers.d/binome"
SUDOERS = (
    f'Defaults!{ENTER_SCRIPT} env_keep += "SSH_ORIGINAL_COMMAND TERM"\n'
    f'%{CUSTOMER_GROUP} ALL=(root) NOPASSWD: {ENTER_SCRIPT} ""\n'
)
# What the host's sshd needs once (docs/operations.md): the keys from KEYS_DIR only, and every session (a shell, a
# command, sftp) through the enter script. The login shell of these accounts is /bin/sh, which reads no file of
# the customer's before running the forced command (bash would read ~/.bashrc first).
SSHD_MATCH_BLOCK = (
    f"Match User {CUSTOMER_PREFIX}*\n"
    f"    AuthorizedKeysFile {KEYS_DIR}/%u\n"
    f"    ForceCommand /usr/bin/sudo -n {ENTER_SCRIPT}\n"
    "    PermitUserRC no\n"
    "    AllowAgentForwarding no\n"
    "    X11Forwarding no\n"
    "    PermitTunnel no\n"
    "    AllowStreamLocalForwarding no\n"
)
CDI_SPECS = ("/etc/cdi/nvidia.yaml", "/etc/cdi/nvidia.json", "/var/run/cdi/nvidia.yaml", "/var/run/cdi/nvidia.json")


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
    cpus: str = ""  # the lot's share of the host for its container ("" = not limited)
    memory: str = ""
    shm_size: str = "8g"
    device_dir: str = "/dev"  # where the host's GPU device nodes are (tests: mknod stand-ins)

    @property
    def in_container(self) -> bool:
        """Whether the host runs the order in a container: an operator set its runtime (podman or docker)."""
        return bool(self.container_runtime)

    @property
    def container_name(self) -> str:
        return f"binome-{self.username}"


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


def _account(conn: Connection, username: str) -> tuple[int, int, str]:
    """uid, gid and home of the customer's account on the host."""
    if _dry(conn):
        return 10000, 10000, f"/home/{username}"
    fields = conn.run(["getent", "passwd", username]).stdout.strip().split(":")
    return int(fields[2]), int(fields[3]), fields[5]


def _home(conn: Connection, username: str) -> str:
    return _account(conn, username)[2]


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


def _runtime(ctx: StepContext) -> str:
    """The host's container runtime as set by the operator, checked for form: it is run by root."""
    runtime = ctx.container_runtime
    if not re.fullmatch(containers.RUNTIME_PATTERN, runtime):
        raise StepFailed(f"the host's container runtime must be podman or docker (a name or a path): {runtime[:80]!r}")
    return runtime


def _container(ctx: StepContext, verb: str, *args: str) -> list[str]:
    return containers.container_command(_runtime(ctx), verb, *args)


# Root's own files on the host: for each path $@, "mode:owner sha256" or "missing" (one round trip for all).
_FILE_STATES = (
    'for f; do if [ -f "$f" ] && [ ! -L "$f" ]; then printf "%s %s\\n" "$(stat -c %a:%U -- "$f")" '
    '"$(sha256sum < "$f" | cut -d " " -f 1)"; else echo missing; fi; done'
)


def _install_root_files(conn: Connection, wanted: dict[str, tuple[bytes, int]]) -> list[str]:
    """Root's own files (outside any customer's reach) with this content and mode, owned by root: those that
    differ are rewritten, in one round trip to read them all. Returns the paths written."""
    states = conn.run(["sh", "-c", _FILE_STATES, "install", *wanted]).stdout.splitlines()
    written = []
    for (path, (content, mode)), state in zip(wanted.items(), states + [""] * len(wanted), strict=False):
        if state != f"{mode:o}:root {hashlib.sha256(content).hexdigest()}":
            conn.put_file(path, content, mode=mode, owner="root:root")
            written.append(path)
    return written


def prepare_host(conn: Connection, ctx: StepContext) -> str:
    """On a host that runs containers: the runtime answers, and the enter script, its sudo rule, the group and the
    root-owned keys directory are in place (a file that differs from the portal's version is rewritten)."""
    if not ctx.in_container:
        return "no container runtime set for this host: the customer logs in to their account on the host"
    runtime = _runtime(ctx)
    answer = conn.run([runtime, "version", "--format", "{{.Server.Version}}"], check=False, timeout=60)
    if answer.exit_status != 0 and not _dry(conn):
        raise StepFailed(f"{runtime} does not answer on this host: {answer.stderr.strip()[-300:]}")
    directories = ["/etc/binome", KEYS_DIR, KIT_ROOT, posixpath.dirname(ENTER_SCRIPT)]
    make = 'groupadd --force "$1" && shift && install -d -m 755 -o root -g root "$@"'
    conn.run(["sh", "-c", make, "prepare_host", CUSTOMER_GROUP, *directories])
    written = _install_root_files(
        conn,
        {
            RUNTIME_FILE: (f"{runtime}\n".encode(), 0o644),
            ENTER_SCRIPT: (host_file_bytes("enter.sh"), 0o755),
            SUDOERS_FILE: (SUDOERS.encode(), 0o440),
        },
    )
    if SUDOERS_FILE in written:
        checked = conn.run(["visudo", "--check", "--quiet", "--file", SUDOERS_FILE], check=False)
        if checked.exit_status != 0 and not _dry(conn):
            conn.run(["rm", "-f", SUDOERS_FILE], check=False)
            raise StepFailed(f"sudo refuses the rule for {ENTER_SCRIPT}: {checked.stderr.strip()[-300:]}")
    changes = f"written: {', '.join(written)}" if written else "already in place"
    return f"{runtime}: customer sessions land in their container (enter script, sudo rule, keys dir {changes})"


def create_user(conn: Connection, ctx: StepContext) -> str:
    # In a container host the login shell only runs sshd's forced command: /bin/sh reads none of the customer's
    # files first (bash would source ~/.bashrc, on the host, before the command could take them into the container).
    shell, groups = ("/bin/sh", [CUSTOMER_GROUP]) if ctx.in_container else ("/bin/bash", [])
    if _user_exists(conn, ctx.username):
        conn.run(["usermod", "--unlock", "--expiredate", "", "--shell", shell, ctx.username], check=False)
        if groups:
            conn.run(["usermod", "--append", "--groups", ",".join(groups), ctx.username])
        _close_home(conn, ctx)
        return f"user {ctx.username} already exists (unlocked, home 700)"
    group_options = ["--groups", ",".join(groups)] if groups else []
    conn.run(["useradd", "--create-home", "--shell", shell, *group_options, "--comment", ctx.comment, ctx.username])
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
    lines = authorized_keys_lines(ctx.authorized_keys, ctx.keys_expire_at)
    content = "".join(f"{line}\n" for line in lines).encode()
    expiry = ctx.keys_expire_at.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    if ctx.in_container:  # root's file, readable by the account (sshd reads it as the user), not editable by it
        group = "root" if _dry(conn) else conn.run(["id", "-gn", ctx.username]).stdout.strip()
        conn.put_file(f"{KEYS_DIR}/{ctx.username}", content, mode=0o640, owner=f"root:{group}")
        return f"{len(lines)} key(s) installed in {KEYS_DIR}/{ctx.username} (root-owned, 640), expiring {expiry}"
    home = _home(conn, ctx.username)
    conn.run(_as_customer(ctx, ["sh", "-c", _REAL_DIRECTORY, "install_keys", f"{home}/.ssh"]))
    conn.put_file(f"{home}/.ssh/authorized_keys", content, mode=0o600, as_user=ctx.username)
    return (
        f"{len(lines)} key(s) installed in {home}/.ssh/authorized_keys (700/600, owned by {ctx.username}), "
        f"restricted, expiring {expiry}"
    )


def restrict_gpus(conn: Connection, ctx: StepContext) -> str:
    home = _home(conn, ctx.username)
    devices = ",".join(str(index) for index in ctx.gpu_indices)
    if ctx.in_container:
        # The container holds the lot's GPUs and no other, numbered from 0 inside: a host index in a
        # visible-devices variable would hide them. The file stays, without variables, for older rc lines.
        conn.put_file(f"{home}/{ENV_FILE}", f"{MARKER}\n".encode(), mode=0o644, as_user=ctx.username)
        return f"GPUs {devices} are the only ones in the container (numbered 0 to {len(ctx.gpu_indices) - 1} inside)"
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
    runtime = _runtime(ctx) if ctx.in_container else ""
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


def _container_spec(conn: Connection, ctx: StepContext) -> containers.ContainerSpec:
    uid, gid, home = _account(conn, ctx.username)
    nvidia = ctx.expect_vendor == "nvidia"
    any_exists = 'for f; do [ -e "$f" ] && exit 0; done; exit 1'
    cdi = nvidia and ctx.device_dir == "/dev" and conn.run(["sh", "-c", any_exists, "cdi", *CDI_SPECS], check=False).ok
    spec = containers.ContainerSpec(
        name=ctx.container_name,
        image=ctx.image_ref,
        username=ctx.username,
        uid=uid,
        gid=gid,
        home=home,
        vendor=ctx.expect_vendor,
        gpu_indices=tuple(ctx.gpu_indices),
        shm_size=ctx.shm_size or "8g",
        cpus=ctx.cpus,
        memory=ctx.memory,
        use_cdi=cdi,
        device_dir=ctx.device_dir,
        kit_dir=_kit_dir(ctx),
    )
    # The groups that own the lot's device nodes (render, video: AMD's are 660), so the customer's uid may open
    # them inside; the container holds no other node, so the groups open nothing else.
    nodes = [device.split(":", 1)[0] for device in containers.lot_devices(spec) if device.startswith("/")]
    found = conn.run(["stat", "-L", "-c", "%g", *nodes], check=False) if nodes and not _dry(conn) else None
    groups = sorted({int(gid) for gid in found.stdout.split() if gid.isdigit() and gid != "0"}) if found else []
    return dataclasses.replace(spec, group_ids=tuple(groups))


def _container_state(conn: Connection, ctx: StepContext) -> tuple[str, bool] | None:
    """(spec label, running) of the order's container, or None when there is none."""
    template = f'{{{{index .Config.Labels "{containers.SPEC_LABEL}"}}}} {{{{.State.Running}}}}'
    found = conn.run(_container(ctx, "container", "inspect", "--format", template, ctx.container_name), check=False)
    if found.exit_status != 0 or _dry(conn):
        return None
    label, _, running = found.stdout.strip().rpartition(" ")
    return label, running == "true"


def start_container(conn: Connection, ctx: StepContext) -> str:
    """The order's container, from its image, with the lot's GPUs only: made once, kept while it matches what the
    order needs (started again if it stopped), replaced when the lot, the image or the share changed."""
    if not ctx.in_container:
        return "no container on this host (no runtime set): the customer's account is the environment"
    conn.run(["install", "-d", "-m", "755", "-o", "root", "-g", "root", KIT_ROOT, _kit_dir(ctx)])
    spec = _container_spec(conn, ctx)
    state = _container_state(conn, ctx)
    if state and state[0] == containers.spec_digest(spec):
        if state[1]:
            return f"container {spec.name} already running"
        conn.run(_container(ctx, "start", spec.name), timeout=120)
        return f"container {spec.name} started again"
    replaced = ""
    if state:  # another lot, image or share: the old container goes (the home stays on the host)
        conn.run(_container(ctx, "rm", "--force", "--time", "5", spec.name), timeout=120)
        replaced = " (the previous one, made for another lot or image, was removed)"
    argv = containers.run_argv(spec, ["sleep", "infinity"], runtime=_runtime(ctx), detach=True)
    started = conn.run(argv, check=False, timeout=600)
    if started.exit_status != 0 and not _dry(conn):
        raise StepFailed(f"the container did not start: {started.stderr.strip()[-500:]}")
    state = _container_state(conn, ctx)
    if not _dry(conn) and not (state and state[1]):
        logs = conn.run(_container(ctx, "logs", "--tail", "20", spec.name), check=False).stdout.strip()
        raise StepFailed(f"the container stopped right after it started: {logs[-500:]}")
    gpus = (
        "CDI " + ",".join(containers.lot_devices(spec))
        if spec.use_cdi
        else "device nodes " + " ".join(device.split(":", 1)[0] for device in containers.lot_devices(spec))
    )
    return f"container {spec.name} running {spec.image} with {gpus}{replaced}"


def _ensure_running(conn: Connection, ctx: StepContext) -> None:
    state = _container_state(conn, ctx)
    if state is None and not _dry(conn):
        raise StepFailed(f"the container {ctx.container_name} does not exist: provision the order again")
    if state and not state[1]:
        conn.run(_container(ctx, "start", ctx.container_name), timeout=120)


def preflight(conn: Connection, ctx: StepContext) -> str:
    uid, gid, home = _account(conn, ctx.username)
    kit = _kit_dir(ctx)
    conn.run(["install", "-d", "-m", "755", "-o", "root", "-g", "root", KIT_ROOT, kit])
    # The split-trial kit travels with the access (docs: the guide's "split trial" section).
    kit_files = {"preflight.py": script_bytes("preflight"), "split_trial.py": script_bytes("split_trial")}
    _install_root_files(conn, {f"{kit}/{name}": (content, 0o555) for name, content in kit_files.items()})
    check = ["--expect-arch", ctx.expect_arch, "--expect-vendor", ctx.expect_vendor]
    if ctx.in_container:
        # Inside the container, with the image's own Python and PyTorch, on the lot's GPUs (numbered from 0
        # there), from the kit mounted read-only: the customer's files shadow nothing (-I).
        conn.run(_as_customer(ctx, ["sh", "-c", _LINK_KIT, "preflight", f"{home}/.binome", containers.KIT_MOUNT]))
        _ensure_running(conn, ctx)
        local = ",".join(str(position) for position in range(len(ctx.gpu_indices)))
        script = f"{containers.KIT_MOUNT}/preflight.py"
        argv = _container(ctx, "exec", "--user", f"{uid}:{gid}", "--workdir", home, ctx.container_name)
        argv += ["python3", "-I", script, "--gpus", local, *check]
    else:
        conn.run(_as_customer(ctx, ["sh", "-c", _LINK_KIT, "preflight", f"{home}/.binome", kit]))
        devices = ",".join(str(index) for index in ctx.gpu_indices)
        # isolated (-I): no PYTHON* variables, no user site, no script directory: the customer shadows nothing
        argv = _as_customer(ctx, ["env", f"{ctx.visible_devices_variable}={devices}", "python3", "-I"])
        argv += [f"{kit}/preflight.py", "--gpus", devices, *check]
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


def remove_container(conn: Connection, ctx: StepContext) -> str:
    """The order's container stopped and removed, checked. Looked for with whichever runtime the host has, so a
    host whose runtime setting changed since provisioning still loses the container."""
    runtimes = [ctx.container_runtime] if ctx.in_container else []
    found = conn.run(["sh", "-c", "command -v podman; command -v docker"], check=False)
    runtimes += [path for path in found.stdout.split() if path.startswith("/")]
    removed = []
    for runtime in dict.fromkeys(runtimes):
        if not re.fullmatch(containers.RUNTIME_PATTERN, runtime):
            continue
        name = ctx.container_name
        exists = containers.container_command(runtime, "container", "inspect", "--format", "{{.Id}}", name)
        if conn.run(exists, check=False).exit_status != 0 or _dry(conn):
            continue
        conn.run(containers.container_command(runtime, "rm", "--force", "--time", "5", ctx.container_name), timeout=120)
        if conn.run(exists, check=False).exit_status == 0:
            raise StepFailed(f"{runtime} could not remove the container {ctx.container_name}")
        removed.append(runtime)
    return f"container {ctx.container_name} removed" if removed else "no container to remove"


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
    conn.run(["rm", "-f", f"{KEYS_DIR}/{ctx.username}"])  # root's own directory: no customer path involved
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
    conn.run(["rm", "-f", f"{KEYS_DIR}/{ctx.username}"])
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


PROVISION_STEPS = [
    "connect",
    "prepare_host",
    "create_user",
    "install_keys",
    "restrict_gpus",
    "prepare_image",
    "start_container",
    "preflight",
]
PREFLIGHT_STEPS = ["connect", "preflight"]
# Locked first, so that no new session starts while the others are killed; each step checks its own work.
TEARDOWN_STEPS = ["connect", "lock_user", "remove_container", "stop_processes", "revoke_keys", "revoke_devices"]
WIPE_STEPS = ["connect", "wipe_data"]
KEYS_STEPS = ["connect", "install_keys"]  # a window that moved (extension): the keys' expiry moves with it
STEPS = {
    function.__name__: function
    for function in (
        connect,
        prepare_host,
        create_user,
        install_keys,
        restrict_gpus,
        prepare_image,
        start_container,
        preflight,
        remove_container,
        revoke_keys,
        stop_processes,
        lock_user,
        revoke_devices,
        keep_or_wipe,
        wipe_data,
    )
}
