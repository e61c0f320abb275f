"""The idempotent steps of provisioning and teardown, run on one host through a driver connection.

Each step checks before it acts, so running it again after a crash finishes the job instead of doing it twice.
Commands are argv lists (quoted by the driver), never strings built from customer input.

The tenant boundary (docs/architecture.md): the customer controls everything inside their container and on their
data volume, and the host never reads or runs any of it. Their account on the host only gives the container a uid:
no login shell, a locked password, and a root-owned home (the kit directory) in which nothing is theirs, so no PAM
environment file, shell rc, user unit or key of theirs exists for the host's login stack to read. They log in to an
SSH server inside the container, on a port the host publishes from the container's own network namespace; its keys
are written at the hand-over, after the pre-flight check, so no process of theirs runs before it.
"""

import dataclasses
import hashlib
import json
import math
import posixpath
import re
from dataclasses import dataclass
from datetime import UTC, datetime

from nodekit.bundle import host_file_bytes, script_bytes
from provisioning import containers, host_checks
from provisioning.drivers.base import CommandFailed, Connection

KIT_ROOT = "/var/lib/binome"  # root-owned, 755: one kit directory per account, which is also the account's home
VOLUME_ROOT = "/var/lib/binome-volumes"  # root-owned, 700: the file systems of the customers' data volumes
CUSTOMER_PREFIX = "bn-"  # provisioning.services.username_for
CUSTOMER_GROUP = containers.CUSTOMER_GROUP  # the host's sshd denies it (docs/operations.md)
NOLOGIN = "/usr/sbin/nologin"
# Every key gets `restrict` (no agent or X11 forwarding, no ~/.ssh/rc), then what researchers need is given back: a
# terminal, and port forwarding (-L, -D for VS Code Remote-SSH), which reaches only what the container reaches.
KEY_OPTIONS = "restrict,pty,port-forwarding"
HOST_KEY_NAME = "host_ed25519_key"
CDI_SPECS = ("/etc/cdi/nvidia.yaml", "/etc/cdi/nvidia.json", "/var/run/cdi/nvidia.yaml", "/var/run/cdi/nvidia.json")
# A lot's share when the host's operator set none: the host's CPUs, memory and data disk split over its lots, less
# what the host keeps for itself; processes per lot; /dev/shm at most half the memory share.
HOST_RESERVE = 0.9
PIDS_PER_LOT = 4096
MAX_PREFLIGHT_REPORT_BYTES = 256 * 1024


@dataclass(frozen=True)
class StepContext:
    username: str
    comment: str
    authorized_keys: str
    gpu_indices: list[int]
    expect_arch: str
    expect_vendor: str
    image_ref: str
    container_runtime: str
    keys_expire_at: datetime  # the window's end plus the grace period: sshd refuses the keys after it
    ssh_port_base: int = 42000  # the host port of the container's sshd is this plus the lot's first GPU index
    publish_address: str = ""  # where the host publishes it ("" = every address)
    lots_in_container: int = 1
    lots_on_host: int = 1
    cpus: str = ""  # the operator's share for this container ("" = derived from the host's size)
    memory: str = ""
    shm_size: str = ""
    disk_gib: int = 0
    image_id: str = ""  # pinned by prepare_image
    device_dir: str = "/dev"  # where the host's GPU device nodes are (tests: mknod stand-ins)

    @property
    def container_name(self) -> str:
        return f"binome-{self.username}"

    @property
    def network_name(self) -> str:
        return f"binome-{self.username}"

    @property
    def volume_name(self) -> str:
        return f"binome-{self.username}-data"

    @property
    def home(self) -> str:
        """The customer's home inside the container: their data volume."""
        return f"/home/{self.username}"

    @property
    def ssh_port(self) -> int:
        return self.ssh_port_base + min(self.gpu_indices or [0])


@dataclass(frozen=True)
class StepOutput:
    """What a step says for the run's record, and what it found that the order's access keeps (pinned image,
    published port, host key, shares)."""

    text: str
    access: dict = dataclasses.field(default_factory=dict)

    def __str__(self) -> str:
        return self.text


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


def _account(conn: Connection, username: str) -> tuple[int, int]:
    """uid and gid of the customer's account on the host."""
    if _dry(conn):
        return 10000, 10000
    fields = conn.run(["getent", "passwd", username]).stdout.strip().split(":")
    return int(fields[2]), int(fields[3])


def _user_exists(conn: Connection, username: str) -> bool:
    return conn.run(["id", "-u", username], check=False).exit_status == 0


def _kit_dir(ctx: StepContext) -> str:
    return f"{KIT_ROOT}/{ctx.username}"


def _ssh_dir(ctx: StepContext) -> str:
    return f"{_kit_dir(ctx)}/ssh"


def _volume_file(ctx: StepContext) -> str:
    return f"{VOLUME_ROOT}/{ctx.username}.ext4"


def connect(conn: Connection, ctx: StepContext) -> str:
    return conn.run(["uname", "-a"]).stdout.strip()


def _runtime(ctx: StepContext) -> containers.Runtime:
    """The host's container runtime as set by the operator, checked for form: it is run by root."""
    runtime = ctx.container_runtime
    if not runtime:
        raise StepFailed(
            "this host has no container runtime set: customers are only ever given a container (set podman or "
            "docker on the host and check it again)"
        )
    if not re.fullmatch(containers.RUNTIME_PATTERN, runtime):
        raise StepFailed(f"the host's container runtime must be podman or docker (a name or a path): {runtime[:80]!r}")
    return containers.Runtime(runtime)


def _container(ctx: StepContext, verb: str, *args: str) -> list[str]:
    return _runtime(ctx).command(verb, *args)


# Root's own files on the host: for each path $@, "mode:owner:group sha256" or "missing" (one round trip for all).
_FILE_STATES = (
    'for f; do if [ -f "$f" ] && [ ! -L "$f" ]; then printf "%s %s\\n" "$(stat -c %a:%U:%G -- "$f")" '
    '"$(sha256sum < "$f" | cut -d " " -f 1)"; else echo missing; fi; done'
)


def _install_root_files(conn: Connection, wanted: dict[str, tuple[bytes, int, str]]) -> list[str]:
    """Root's own files (outside any customer's reach) with this content, mode and group, owned by root: those that
    differ are rewritten, in one round trip to read them all. Returns the paths written."""
    states = conn.run(["sh", "-c", _FILE_STATES, "install", *wanted]).stdout.splitlines()
    written = []
    for (path, (content, mode, group)), state in zip(wanted.items(), states + [""] * len(wanted), strict=False):
        if state != f"{mode:o}:root:{group} {hashlib.sha256(content).hexdigest()}":
            conn.put_file(path, content, mode=mode, owner=f"root:{group}")
            written.append(path)
    return written


def prepare_host(conn: Connection, ctx: StepContext) -> str:
    """The runtime answers, the host's login stack keeps customers out (host_checks.login_stack), and root's
    directories are in place."""
    runtime = _runtime(ctx)
    answer = conn.run(runtime.command("version", "--format", "{{.Server.Version}}"), check=False, timeout=60)
    if answer.exit_status != 0 and not _dry(conn):
        raise StepFailed(f"{runtime.path} does not answer on this host: {answer.stderr.strip()[-300:]}")
    if not _dry(conn):
        stack = host_checks.login_stack(conn)
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
    # The same guard at boot, before the runtime restarts the containers (where systemd runs the host)
    written = _install_root_files(
        conn,
        {
            containers.GUARD_PATH: (host_file_bytes("binome-guard"), 0o755, "root"),
            containers.GUARD_UNIT_PATH: (runtime.guard_unit(), 0o644, "root"),
        },
    )
    enable = (
        'if [ -d /run/systemd/system ]; then systemctl daemon-reload && systemctl enable --quiet "$1" && echo on; fi'
    )
    at_boot = conn.run(["sh", "-c", enable, "prepare_host", "binome-guard.service"], check=False).stdout.strip()
    boot = "rebuilt at boot" if at_boot == "on" else "no systemd here: rebuilt by each keys run"
    changed = f" ({len(written)} file(s) written)" if written else ""
    return (
        f"{runtime.path}: answers; login stack keeps customers out; firewall guard on {runtime.bridges}, {boot}"
        f"{changed}; {KIT_ROOT} and {VOLUME_ROOT} in place"
    )


def create_user(conn: Connection, ctx: StepContext) -> str:
    """The account that gives the container its uid: no login shell, password locked, home the root-owned kit
    directory, in the group the host's sshd denies. Nothing in it is the customer's."""
    home = _kit_dir(ctx)
    conn.run(["install", "-d", "-m", "755", "-o", "root", "-g", "root", KIT_ROOT, home])
    account = ["--home-dir", home, "--shell", NOLOGIN]
    if _user_exists(conn, ctx.username):  # made earlier, or by the previous design (a home of the customer's own)
        conn.run(["usermod", *account, "--append", "--groups", CUSTOMER_GROUP, "--lock", ctx.username])
        return f"user {ctx.username} already exists (no login shell, locked, home {home} root-owned)"
    conn.run(
        ["useradd", "--no-create-home", *account, "--groups", CUSTOMER_GROUP, "--comment", ctx.comment, ctx.username]
    )
    conn.run(["usermod", "--lock", ctx.username])
    return f"user {ctx.username} created (no login shell, locked, home {home} root-owned)"


def _disk_bytes(conn: Connection, path: str, field: str) -> int:
    """df's `size` or `avail` of the file system holding `path`, in bytes."""
    answer = conn.run(["df", f"--output={field}", "-B1", "--", path], check=False).stdout.split()
    return int(answer[-1]) if answer and answer[-1].isdigit() else 0


def _disk_gib(conn: Connection, ctx: StepContext) -> int:
    """The operator's disk share for this container, or the volumes' file system split over the host's lots, never
    more than what is free there less a headroom for the host (images, logs, the volumes still kept until their
    wipe). The space is reserved when the volume is made: a share that does not fit fails there, with the figures."""
    if ctx.disk_gib:
        return ctx.disk_gib
    if _dry(conn):
        return int(1000 * HOST_RESERVE * ctx.lots_in_container / max(1, ctx.lots_on_host))
    size, free = _disk_bytes(conn, VOLUME_ROOT, "size"), _disk_bytes(conn, VOLUME_ROOT, "avail")
    share = size * HOST_RESERVE * ctx.lots_in_container / max(1, ctx.lots_on_host)
    return max(1, int(min(share, free - size * (1 - HOST_RESERVE)) / 2**30))


def prepare_data(conn: Connection, ctx: StepContext) -> StepOutput:
    """The customer's data volume: an ext4 file system of the disk share in a root-owned file (space reserved),
    owned inside by the customer's uid, mounted by the runtime as their home whenever the container starts. Made
    once; kept until the wipe. Root never looks inside it."""
    uid, gid = _account(conn, ctx.username)
    runtime = _runtime(ctx)
    if conn.run(runtime.command("volume", "inspect", ctx.volume_name), check=False).ok and not _dry(conn):
        size = conn.run(["stat", "-c", "%s", _volume_file(ctx)], check=False).stdout.strip()
        gib = int(size) // 2**30 if size.isdigit() else 0
        return StepOutput(f"data volume {ctx.volume_name} kept ({gib} GiB)", {"disk_gib": gib})
    gib = _disk_gib(conn, ctx)
    path = _volume_file(ctx)
    # The space is reserved (fallocate, and no discard by mkfs, which would punch the file sparse again): volumes can
    # never add up to more than the disk holds, so one customer filling theirs cannot fill the host's.
    make = (
        '[ -f "$1" ] || { rm -f "$1.part" && fallocate -l "$2" "$1.part" && chmod 600 "$1.part" '
        '&& mkfs.ext4 -q -F -m 0 -E "nodiscard,root_owner=$3" "$1.part" && mv "$1.part" "$1"; }'
    )
    made = conn.run(["sh", "-c", make, "prepare_data", path, f"{gib}G", f"{uid}:{gid}"], check=False, timeout=600)
    if not made.ok and not _dry(conn):
        conn.run(["rm", "-f", "--", f"{path}.part"], check=False)
        free = _disk_bytes(conn, VOLUME_ROOT, "avail") // 2**30
        raise StepFailed(
            f"the data volume of {gib} GiB could not be made in {VOLUME_ROOT} ({free} GiB free there): "
            f"{made.stderr.strip()[-300:]}"
        )
    conn.run(runtime.volume_create(ctx.volume_name, path))
    return StepOutput(f"data volume {ctx.volume_name}: {gib} GiB, ext4 in {path}", {"disk_gib": gib})


def prepare_image(conn: Connection, ctx: StepContext) -> StepOutput:
    """The environment's image on the host, pinned by its ID: the container is made from that ID, so a tag that
    moves later (a mutable `latest`) changes nothing for this order. An image that cannot serve SSH (no sshd) is
    refused here, with the reason, before any customer waits on it."""
    runtime = _runtime(ctx)
    if not host_checks.IMAGE_REFERENCE.fullmatch(ctx.image_ref):
        raise StepFailed(f"not an image reference: {ctx.image_ref[:80]!r}")
    inspect = runtime.command("image", "inspect", "--format", "{{.Id}}", ctx.image_ref)
    found = conn.run(inspect, check=False)
    pulled = "already present"
    if not found.ok:
        result = conn.run(runtime.command("pull", ctx.image_ref), check=False, timeout=3600)
        if result.exit_status != 0 and not _dry(conn):
            raise StepFailed(f"{runtime.path} pull {ctx.image_ref} failed: {result.stderr.strip()[-500:]}")
        found, pulled = conn.run(inspect, check=False), "pulled"
    image_id = found.stdout.strip().removeprefix("sha256:") if not _dry(conn) else "0" * 64
    if not re.fullmatch(r"[0-9a-f]{64}", image_id):
        raise StepFailed(f"{runtime.path} gave no image ID for {ctx.image_ref}: {found.stdout.strip()[:100]!r}")
    if not _dry(conn):
        problem = host_checks.image_problem(conn, runtime.command, image_id)
        if problem:
            raise StepFailed(f"the image {ctx.image_ref} cannot be handed to a customer: {problem}")
    return StepOutput(f"{runtime.path}: {ctx.image_ref} {pulled}, pinned sha256:{image_id}", {"image_id": image_id})


def _host_size(conn: Connection) -> tuple[int, int]:
    """CPUs and memory (bytes) of the host."""
    if _dry(conn):
        return 64, 512 * 2**30
    answer = conn.run(["sh", "-c", "nproc; grep '^MemTotal:' /proc/meminfo"]).stdout.split()
    cpus = int(answer[0]) if answer and answer[0].isdigit() else 1
    memory_kib = int(answer[2]) if len(answer) > 2 and answer[2].isdigit() else 0
    return cpus, memory_kib * 1024


def _shares(conn: Connection, ctx: StepContext) -> dict[str, str | int]:
    """The container's CPU, memory, /dev/shm and pids shares: the operator's when set, else the host's size split
    over its lots (less a reserve for the host), so that no container can take a co-tenant's share."""
    cpus, memory = ctx.cpus, ctx.memory
    if not cpus or not memory:
        host_cpus, host_memory = _host_size(conn)
        fraction = HOST_RESERVE * ctx.lots_in_container / max(1, ctx.lots_on_host)
        cpus = cpus or format(max(0.5, math.floor(host_cpus * fraction * 100) / 100), "g")
        memory = memory or f"{max(1, int(host_memory * fraction / 2**20))}m"
    memory_mib = _mib(memory)
    shm_mib = max(64, min(_mib(ctx.shm_size) if ctx.shm_size else memory_mib, memory_mib // 2))
    pids = PIDS_PER_LOT * ctx.lots_in_container
    return {"cpus": cpus, "memory": memory, "shm_size": f"{shm_mib}m", "pids_limit": pids}


def _mib(size: str) -> int:
    """MiB in a size as podman takes it ("2g", "1536m")."""
    match = re.fullmatch(r"(\d+)([gm]?)", size.strip().lower())
    if not match:
        raise StepFailed(f"not a size: {size[:20]!r}")
    return int(match[1]) * (1024 if match[2] == "g" else 1)


def _container_spec(conn: Connection, ctx: StepContext) -> containers.ContainerSpec:
    if not ctx.image_id and not _dry(conn):
        raise StepFailed("the image is not pinned yet: prepare_image must run first")
    uid, gid = _account(conn, ctx.username)
    nvidia = ctx.expect_vendor == "nvidia"
    any_exists = 'for f; do [ -e "$f" ] && exit 0; done; exit 1'
    cdi = nvidia and ctx.device_dir == "/dev" and conn.run(["sh", "-c", any_exists, "cdi", *CDI_SPECS], check=False).ok
    spec = containers.ContainerSpec(
        name=ctx.container_name,
        image=ctx.image_id or ctx.image_ref,
        username=ctx.username,
        uid=uid,
        gid=gid,
        home=ctx.home,
        volume=ctx.volume_name,
        vendor=ctx.expect_vendor,
        gpu_indices=tuple(ctx.gpu_indices),
        network=ctx.network_name,
        ssh_port=ctx.ssh_port,
        publish_address=ctx.publish_address,
        use_cdi=cdi,
        device_dir=ctx.device_dir,
        kit_dir=_kit_dir(ctx),
        **_shares(conn, ctx),
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


def _prepare_kit(conn: Connection, ctx: StepContext, spec: containers.ContainerSpec) -> None:
    """The root-owned kit the container mounts read-only: the pre-flight check and the split-trial kit, sshd's
    configuration and host key (readable by the customer's group: sshd runs as them), an empty keys file until the
    hand-over, and for docker a passwd file naming the customer."""
    ssh_dir = _ssh_dir(ctx)
    conn.run(["install", "-d", "-m", "755", "-o", "root", "-g", "root", KIT_ROOT, _kit_dir(ctx), ssh_dir])
    files = {
        f"{_kit_dir(ctx)}/preflight.py": (script_bytes("preflight"), 0o555, "root"),
        f"{_kit_dir(ctx)}/split_trial.py": (script_bytes("split_trial"), 0o555, "root"),
        f"{ssh_dir}/sshd_config": (host_file_bytes("sshd_config"), 0o644, "root"),
    }
    if not containers.Runtime(ctx.container_runtime).is_podman:
        passwd = f"root:x:0:0:root:/root:/bin/sh\n{containers.passwd_entry(spec)}\n"
        files[f"{_kit_dir(ctx)}/passwd"] = (passwd.encode(), 0o644, "root")
    _install_root_files(conn, files)
    # The host key: made once per order (kept across container replacements, so the customer's known_hosts holds).
    # Root-owned and readable by the customer's group only: sshd, running as them, refuses a key others can read.
    key, keys = f"{ssh_dir}/{HOST_KEY_NAME}", f"{ssh_dir}/authorized_keys"
    make_key = (
        '[ -s "$1" ] || { rm -f "$1" "$1.pub" && ssh-keygen -q -t ed25519 -N "" -C "$3" -f "$1"; } '
        '&& chown "root:$2" "$1" && chmod 640 "$1" && { [ -f "$4" ] || install -m 644 /dev/null "$4"; }'
    )
    conn.run(["sh", "-c", make_key, "kit", key, str(spec.gid), ctx.container_name, keys])


def start_container(conn: Connection, ctx: StepContext) -> StepOutput:
    """The order's container in a network of its own, from the pinned image, with the lot's GPUs only: made once,
    kept while it matches what the order needs (started again if it stopped), replaced when the lot, the image or
    a share changed. Its sshd waits for the keys of the hand-over."""
    runtime = _runtime(ctx)
    spec = _container_spec(conn, ctx)
    _prepare_kit(conn, ctx, spec)
    network = runtime.command("network", "inspect", ctx.network_name)
    if not conn.run(network, check=False).ok:
        conn.run(runtime.network_create(ctx.network_name))
    state = _container_state(conn, ctx)
    replaced = ""
    if state and state[0] == containers.spec_digest(spec):
        if not state[1]:
            conn.run(runtime.command("start", spec.name), timeout=120)
        replaced = " (kept)"
    else:
        if state:  # another lot, image or share: the old container goes (the data volume stays)
            conn.run(runtime.remove(spec.name), timeout=120)
            replaced = " (the previous one, made for another lot, image or share, was removed)"
        started = conn.run(containers.run_argv(spec, runtime), check=False, timeout=600)
        if started.exit_status != 0 and not _dry(conn):
            raise StepFailed(f"the container did not start: {started.stderr.strip()[-500:]}")
    state = _container_state(conn, ctx)
    if not _dry(conn) and not (state and state[1]):
        logs = conn.run(runtime.command("logs", "--tail", "20", spec.name), check=False).stdout.strip()
        raise StepFailed(f"the container stopped right after it started: {logs[-500:]}")
    host_key = "" if _dry(conn) else conn.run(["cat", f"{_ssh_dir(ctx)}/{HOST_KEY_NAME}.pub"]).stdout.split()[:2]
    gpus = (
        "CDI " + ",".join(containers.lot_devices(spec))
        if spec.use_cdi
        else "device nodes " + " ".join(device.split(":", 1)[0] for device in containers.lot_devices(spec))
    )
    shares = f"{spec.cpus} CPUs, {spec.memory} memory, {spec.shm_size} /dev/shm, {spec.pids_limit} processes"
    return StepOutput(
        f"container {spec.name}{replaced}: image sha256:{spec.image[:12]}, {gpus}, {shares}, "
        f"network {spec.network}, SSH on port {spec.ssh_port}",
        {
            "ssh_port": spec.ssh_port,
            "ssh_host_key": " ".join(host_key) if host_key else "",
            "shares": {"cpus": spec.cpus, "memory": spec.memory, "shm": spec.shm_size, "pids": spec.pids_limit},
        },
    )


def _ensure_running(conn: Connection, ctx: StepContext) -> None:
    state = _container_state(conn, ctx)
    if state is None and not _dry(conn):
        raise StepFailed(f"the container {ctx.container_name} does not exist: provision the order again")
    if state and not state[1]:
        conn.run(_container(ctx, "start", ctx.container_name), timeout=120)


def preflight(conn: Connection, ctx: StepContext) -> StepOutput:
    """The pre-flight check inside the container, as the customer's uid, with the image's own Python and PyTorch,
    on the lot's GPUs (numbered from 0 there), from the kit mounted read-only (-I: nothing of the customer's
    shadows it). Its report is the container's word: parsed and bounded like any hostile input."""
    uid, gid = _account(conn, ctx.username)
    _ensure_running(conn, ctx)
    local = ",".join(str(position) for position in range(len(ctx.gpu_indices)))
    check = ["--expect-arch", ctx.expect_arch, "--expect-vendor", ctx.expect_vendor]
    argv = _container(ctx, "exec", "--user", f"{uid}:{gid}", "--workdir", ctx.home, ctx.container_name)
    argv += ["python3", "-I", f"{containers.KIT_MOUNT}/preflight.py", "--gpus", local, *check]
    result = conn.run(argv, check=False, timeout=900)
    report = dict(DRY_RUN_REPORT) if _dry(conn) else parse_preflight_report(result.stdout, result)
    report["image"] = {"ref": ctx.image_ref, "id": f"sha256:{ctx.image_id}" if ctx.image_id else ""}
    status = report["summary"]["status"]
    return StepOutput(
        f"pre-flight: {report['summary']}",
        {"preflight_report": report, "preflight_status": status},
    )


_REPORT_STATUSES = {"PASS", "FAIL", "WARN", "SKIP", "DRY-RUN"}


def parse_preflight_report(stdout: str, result=None) -> dict:
    """The report printed inside the customer's container: a JSON object of bounded size and depth with a summary
    whose status is one of ours and a list of checks. Anything else fails the step with the reason (a report of
    `[]`, a deep nesting, a forged summary type) and never raises anything but StepFailed."""
    exit_note = f" (exit {result.exit_status}): {result.stderr.strip()[-300:]}" if result is not None else ""
    if len(stdout.encode(errors="replace")) > MAX_PREFLIGHT_REPORT_BYTES:
        raise StepFailed(f"the pre-flight report is larger than {MAX_PREFLIGHT_REPORT_BYTES} bytes")
    try:
        report = json.loads(stdout)
    except (ValueError, RecursionError) as exc:
        raise StepFailed(f"the pre-flight check printed no report{exit_note}") from exc
    if not isinstance(report, dict):
        raise StepFailed(f"the pre-flight report is not an object but {type(report).__name__}")
    if _depth(report) > 8:
        raise StepFailed("the pre-flight report is nested deeper than 8 levels")
    summary, checks = report.get("summary"), report.get("checks")
    if not isinstance(summary, dict) or summary.get("status") not in _REPORT_STATUSES:
        raise StepFailed("the pre-flight report has no summary with a known status")
    if not isinstance(checks, list) or not all(isinstance(check, dict) for check in checks):
        raise StepFailed("the pre-flight report's checks are not a list of objects")
    return report


def _depth(value, level: int = 1) -> int:
    if level > 8:
        return level
    if isinstance(value, dict):
        return max([_depth(item, level + 1) for item in value.values()], default=level)
    if isinstance(value, list):
        return max([_depth(item, level + 1) for item in value], default=level)
    return level


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
    conn.put_file(f"{_ssh_dir(ctx)}/authorized_keys", content, mode=0o644, owner="root:root")
    expiry = ctx.keys_expire_at.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    return StepOutput(
        f"{len(lines)} key(s) installed (root-owned, read-only in the container), expiring {expiry}",
        {"keys_expire_at": ctx.keys_expire_at},
    )


def start_ssh(conn: Connection, ctx: StepContext) -> str:
    """The container runs and its sshd answers on the published port with the order's host key."""
    if _dry(conn):
        return "sshd answers (dry run)"
    conn.run(_runtime(ctx).guard_argv())  # after a reboot the host's firewall guard is rebuilt before anyone logs in
    _ensure_running(conn, ctx)
    expected = conn.run(["cat", f"{_ssh_dir(ctx)}/{HOST_KEY_NAME}.pub"]).stdout.split()[:2]
    address = ctx.publish_address or "127.0.0.1"
    # as nobody: what answers on the port may be the customer's own server, and root parses nothing of theirs
    scan = ["runuser", "-u", "nobody", "--", "sh", "-c",
            'for i in $(seq 40); do ssh-keyscan -T 2 -t ed25519 -p "$1" "$2" 2>/dev/null | grep -F "$3" '
            '&& exit 0; sleep 0.25; done; exit 1', "start_ssh", str(ctx.ssh_port), address, expected[-1]]  # fmt: skip
    if not conn.run(scan, check=False, timeout=90).ok:
        raise StepFailed(f"the container's sshd does not answer on port {ctx.ssh_port} with the order's host key")
    return f"sshd answers on port {ctx.ssh_port} with the order's host key"


def remove_container(conn: Connection, ctx: StepContext) -> str:
    """The order's container and network removed, checked. Looked for with whichever runtime the host has, so a
    host whose runtime setting changed since provisioning still loses the container."""
    candidates = [ctx.container_runtime] if ctx.container_runtime else []
    found = conn.run(["sh", "-c", "command -v podman; command -v docker"], check=False)
    candidates += [path for path in found.stdout.split() if path.startswith("/")]
    removed = []
    for path in dict.fromkeys(candidates):
        if not re.fullmatch(containers.RUNTIME_PATTERN, path):
            continue
        runtime = containers.Runtime(path)
        exists = runtime.command("container", "inspect", "--format", "{{.Id}}", ctx.container_name)
        if conn.run(exists, check=False).exit_status == 0 and not _dry(conn):
            # frozen first: if the removal fails (a GPU process stuck in the driver), nothing of the customer's,
            # not even an SSH server of their own on the published port, answers while teardown is retried
            conn.run(runtime.command("pause", ctx.container_name), check=False, timeout=60)
            conn.run(runtime.remove(ctx.container_name), timeout=120)
            if conn.run(exists, check=False).exit_status == 0:
                raise StepFailed(f"{path} could not remove the container {ctx.container_name}")
            removed.append(f"container ({path})")
        if conn.run(runtime.command("network", "inspect", ctx.network_name), check=False).ok and not _dry(conn):
            conn.run(runtime.command("network", "rm", ctx.network_name), timeout=60)
            removed.append("network")
    return f"{ctx.container_name}: {', '.join(removed)} removed" if removed else "no container to remove"


def revoke_keys(conn: Connection, ctx: StepContext) -> str:
    """The container's keys file emptied (root's own directory: no customer path involved)."""
    keys = f"{_ssh_dir(ctx)}/authorized_keys"
    conn.run(["sh", "-c", 'if [ -f "$1" ]; then : > "$1"; fi', "revoke_keys", keys])
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
    conn.run(["usermod", "--lock", "--expiredate", "1", "--shell", NOLOGIN, ctx.username])
    return "user locked and expired"


def legacy_step(conn: Connection, ctx: StepContext) -> str:
    """A step of the design before containers were the only way in (its runs may still be queued): nothing to do."""
    return "a step of an earlier design: nothing to do"


def wipe_data(conn: Connection, ctx: StepContext) -> str:
    """The account, its data volume and its kit, after the grace period announced to the customer."""
    remove_container(conn, ctx)  # a container still holding the volume would keep it
    for path in dict.fromkeys([ctx.container_runtime] if ctx.container_runtime else []):
        runtime = containers.Runtime(path)
        if conn.run(runtime.command("volume", "inspect", ctx.volume_name), check=False).ok and not _dry(conn):
            conn.run(runtime.command("volume", "rm", "--force", ctx.volume_name), timeout=120)
    conn.run(["rm", "-f", "--", _volume_file(ctx), f"{_volume_file(ctx)}.part"])
    if _user_exists(conn, ctx.username):
        stop_processes(conn, ctx)  # userdel refuses while a process of the user runs
        try:
            conn.run(["userdel", ctx.username])
        except CommandFailed as exc:
            raise StepFailed(f"userdel failed: {exc.result.stderr.strip()[-300:]}") from exc
    conn.run(["rm", "-rf", "--one-file-system", "--", _kit_dir(ctx)])
    return "user, data volume and kit deleted"


PROVISION_STEPS = [
    "connect",
    "prepare_host",
    "create_user",
    "prepare_data",
    "prepare_image",
    "start_container",
    "preflight",
]
PREFLIGHT_STEPS = ["connect", "preflight"]
# Locked first, so that no new session starts while the others are killed; each step checks its own work.
TEARDOWN_STEPS = ["connect", "lock_user", "revoke_keys", "remove_container", "stop_processes"]
WIPE_STEPS = ["connect", "wipe_data"]
# The hand-over (and a window that moved: the keys' expiry moves with it): the keys written, sshd answering.
KEYS_STEPS = ["connect", "install_keys", "start_ssh"]
STEPS = {
    function.__name__: function
    for function in (
        connect,
        prepare_host,
        create_user,
        prepare_data,
        prepare_image,
        start_container,
        preflight,
        install_keys,
        start_ssh,
        remove_container,
        revoke_keys,
        stop_processes,
        lock_user,
        wipe_data,
    )
}
# Steps of runs made before this design: done as nothing, so that such a run still finishes.
STEPS.update(dict.fromkeys(["restrict_gpus", "revoke_devices", "keep_or_wipe"], legacy_step))
