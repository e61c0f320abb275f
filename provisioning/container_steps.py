"""The steps that make, check and remove the order's container: its data volume, its pinned image, the container in
a network of its own with the lot's GPUs only and its shares of the host, the pre-flight check inside it, and its
SSH server, which the customer logs in to.
"""

import dataclasses
import math
import re

from inventory.rules import RUNTIME_PATTERN
from nodekit.bundle import host_file_bytes, script_bytes
from provisioning import containers, host_probe
from provisioning.drivers.base import Connection
from provisioning.preflight_report import DRY_RUN_REPORT, parse_preflight_report
from provisioning.step_context import (
    KIT_ROOT,
    VOLUME_ROOT,
    StepContext,
    StepFailed,
    StepOutput,
    account_ids,
    install_root_files,
    is_dry_run,
    runtime_of,
)

HOST_KEY_NAME = "host_ed25519_key"
CDI_SPECS = ("/etc/cdi/nvidia.yaml", "/etc/cdi/nvidia.json", "/var/run/cdi/nvidia.yaml", "/var/run/cdi/nvidia.json")
# A lot's share when the host's operator set none: the host's CPUs, memory and data disk split over its lots, less
# what the host keeps for itself; processes per lot; /dev/shm at most half the memory share.
HOST_RESERVE = 0.9
PIDS_PER_LOT = 4096


def download_container_name(username: str) -> str:
    """The container of the read-only download window after the end (provisioning.download_steps)."""
    return f"binome-{username}-files"


def remove_download(conn: Connection, ctx: StepContext, *, username: str = "") -> bool:
    """The download window's container of `username` (the order's by default) removed, checked; True when there was
    one. Closed by the wipe, and by the next order that takes the volume it mounts."""
    runtime, name = runtime_of(ctx), download_container_name(username or ctx.username)
    exists = runtime.command("container", "inspect", "--format", "{{.Id}}", name)
    if not conn.run(exists, check=False).ok or is_dry_run(conn):
        return False
    conn.run(runtime.remove(name), timeout=120)
    if conn.run(exists, check=False).ok:
        raise StepFailed(f"the download container {name} is still there")
    return True


def _container(ctx: StepContext, verb: str, *args: str) -> list[str]:
    return runtime_of(ctx).command(verb, *args)


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
    if is_dry_run(conn):
        return int(1000 * HOST_RESERVE * ctx.lots_in_container / max(1, ctx.lots_on_host))
    size, free = _disk_bytes(conn, VOLUME_ROOT, "size"), _disk_bytes(conn, VOLUME_ROOT, "avail")
    share = size * HOST_RESERVE * ctx.lots_in_container / max(1, ctx.lots_on_host)
    return max(1, int(min(share, free - size * (1 - HOST_RESERVE)) / 2**30))


def prepare_data(conn: Connection, ctx: StepContext) -> StepOutput:
    """The customer's data volume: an ext4 file system of the disk share in a root-owned file (space reserved),
    owned inside by the customer's uid, mounted by the runtime as their home whenever the container starts. Made
    once; kept until the wipe. Root never looks inside it."""
    uid, gid = account_ids(conn, ctx.username)
    runtime = runtime_of(ctx)
    if conn.run(runtime.command("volume", "inspect", ctx.volume_name), check=False).ok and not is_dry_run(conn):
        size = conn.run(["stat", "-c", "%s", ctx.volume_file], check=False).stdout.strip()
        gib = int(size) // 2**30 if size.isdigit() else 0
        return StepOutput(f"data volume {ctx.volume_name} kept ({gib} GiB)", {"disk_gib": gib})
    if ctx.carry_from_username:
        return _take_over_data(conn, ctx)
    gib = _disk_gib(conn, ctx)
    path = ctx.volume_file
    # The space is reserved (fallocate, and no discard by mkfs, which would punch the file sparse again): volumes can
    # never add up to more than the disk holds, so one customer filling theirs cannot fill the host's.
    make = (
        '[ -f "$1" ] || { rm -f "$1.part" && fallocate -l "$2" "$1.part" && chmod 600 "$1.part" '
        '&& mkfs.ext4 -q -F -m 0 -E "nodiscard,root_owner=$3" "$1.part" && mv "$1.part" "$1"; }'
    )
    made = conn.run(["sh", "-c", make, "prepare_data", path, f"{gib}G", f"{uid}:{gid}"], check=False, timeout=600)
    if not made.ok and not is_dry_run(conn):
        conn.run(["rm", "-f", "--", f"{path}.part"], check=False)
        free = _disk_bytes(conn, VOLUME_ROOT, "avail") // 2**30
        raise StepFailed(
            f"the data volume of {gib} GiB could not be made in {VOLUME_ROOT} ({free} GiB free there): "
            f"{made.stderr.strip()[-300:]}"
        )
    conn.run(runtime.volume_create(ctx.volume_name, path))
    return StepOutput(f"data volume {ctx.volume_name}: {gib} GiB, ext4 in {path}", {"disk_gib": gib})


# Rename the earlier order's volume file ($1) to this order's ($2), both root's own files in VOLUME_ROOT (no link
# followed); done when $2 is there already (a run resumed after the rename), refused when neither is.
_TAKE_OVER = (
    'if [ -f "$2" ] && [ ! -L "$2" ]; then echo kept; elif [ -f "$1" ] && [ ! -L "$1" ]; then mv -T -n -- "$1" "$2" '
    '&& [ -f "$2" ] && echo moved; else echo missing; exit 1; fi'
)


def _take_over_data(conn: Connection, ctx: StepContext) -> StepOutput:
    """The customer's earlier order on this host left its data volume to this order (they opted in at booking):
    its file is renamed to this order's, inside root's volume directory, and the runtime's volume made on it. Its
    files keep their owner, the earlier order's uid, until start_container gives them to this order's. The host
    reads nothing in it: no mount, no fsck, no debugfs."""
    runtime = runtime_of(ctx)
    source_user, source = ctx.carry_from_username, ctx.carried_volume_file
    source_container = f"binome-{source_user}"
    if conn.run(runtime.command("container", "inspect", source_container), check=False).ok and not is_dry_run(conn):
        raise StepFailed(
            f"the container {source_container} of the order whose data this order carries still exists: its window "
            "must be torn down before the volume moves"
        )
    remove_download(conn, ctx, username=source_user)  # its download window mounts the volume: it closes now
    # the earlier order's runtime volume points at the old path: nothing may mount it again
    if conn.run(runtime.command("volume", "inspect", f"{source_container}-data"), check=False).ok:
        conn.run(runtime.command("volume", "rm", f"{source_container}-data"), timeout=120)
    moved = conn.run(["sh", "-c", _TAKE_OVER, "take_over", source, ctx.volume_file], check=False)
    if not moved.ok and not is_dry_run(conn):
        raise StepFailed(
            f"the data volume of {source_user}, which this order carries, is not in {VOLUME_ROOT} any more "
            f"({moved.stdout.strip() or moved.stderr.strip()[-200:]}): make an empty one by moving the order, "
            "or tell the customer"
        )
    conn.run(runtime.volume_create(ctx.volume_name, ctx.volume_file))
    size = conn.run(["stat", "-c", "%s", ctx.volume_file], check=False).stdout.strip()
    gib = int(size) // 2**30 if size.isdigit() else 0
    return StepOutput(
        f"data volume {ctx.volume_name}: {gib} GiB, carried from {source_user} ({moved.stdout.strip() or 'moved'})",
        {"disk_gib": gib},
    )


def _reown_carried_data(conn: Connection, ctx: StepContext, spec: containers.ContainerSpec) -> None:
    """A carried volume's files belong to the earlier order's uid: given to this order's, in a one-shot container
    of the pinned image (a catalog image, not the customer's) as root with only the capabilities chown needs, no
    network, the volume mounted noexec so that nothing of the customer's runs, and `chown -h` (links are not
    followed, and a link could only point inside that container anyway). The host itself neither mounts nor
    reads the volume. Idempotent: a replaced container does it again at no harm."""
    runtime = runtime_of(ctx)
    argv = runtime.command(
        "run", "--rm", "--network", "none", "--user", "0:0", "--cap-drop", "all",
        "--cap-add", "CHOWN", "--cap-add", "DAC_READ_SEARCH", "--cap-add", "FOWNER",
        "--security-opt", "no-new-privileges", "--read-only", "--pids-limit", "64",
        "--volume", f"{ctx.volume_name}:/data:rw,noexec,nosuid,nodev", "--entrypoint", "chown",
        *(option for ulimit in containers.ULIMITS for option in ("--ulimit", ulimit)),
        spec.image, "-R", "-h", f"{spec.uid}:{spec.gid}", "/data",
    )  # fmt: skip
    result = conn.run(argv, check=False, timeout=3600)
    if not result.ok and not is_dry_run(conn):
        raise StepFailed(f"the carried data volume could not be given to {ctx.username}: {result.stderr[-300:]}")


def prepare_image(conn: Connection, ctx: StepContext) -> StepOutput:
    """The environment's image on the host, pinned by its ID: the container is made from that ID, so a tag that
    moves later (a mutable `latest`) changes nothing for this order. An image that cannot serve SSH (no sshd) is
    refused here, with the reason, before any customer waits on it."""
    runtime = runtime_of(ctx)
    if not host_probe.IMAGE_REFERENCE.fullmatch(ctx.image_ref):
        raise StepFailed(f"not an image reference: {ctx.image_ref[:80]!r}")
    inspect = runtime.command("image", "inspect", "--format", "{{.Id}}", ctx.image_ref)
    found = conn.run(inspect, check=False)
    pulled = "already present"
    if not found.ok:
        result = conn.run(runtime.command("pull", ctx.image_ref), check=False, timeout=3600)
        if result.exit_status != 0 and not is_dry_run(conn):
            raise StepFailed(f"{runtime.path} pull {ctx.image_ref} failed: {result.stderr.strip()[-500:]}")
        found, pulled = conn.run(inspect, check=False), "pulled"
    image_id = found.stdout.strip().removeprefix("sha256:") if not is_dry_run(conn) else "0" * 64
    if not re.fullmatch(r"[0-9a-f]{64}", image_id):
        raise StepFailed(f"{runtime.path} gave no image ID for {ctx.image_ref}: {found.stdout.strip()[:100]!r}")
    if not is_dry_run(conn):
        problem = host_probe.image_problem(conn, runtime.command, image_id)
        if problem:
            raise StepFailed(f"the image {ctx.image_ref} cannot be handed to a customer: {problem}")
    return StepOutput(f"{runtime.path}: {ctx.image_ref} {pulled}, pinned sha256:{image_id}", {"image_id": image_id})


def _host_size(conn: Connection) -> tuple[int, int]:
    """CPUs and memory (bytes) of the host."""
    if is_dry_run(conn):
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
    if not ctx.image_id and not is_dry_run(conn):
        raise StepFailed("the image is not pinned yet: prepare_image must run first")
    uid, gid = account_ids(conn, ctx.username)
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
        kit_dir=ctx.kit_dir,
        **_shares(conn, ctx),
    )
    # The groups that own the lot's device nodes (render, video: AMD's are 660), so the customer's uid may open
    # them inside; the container holds no other node, so the groups open nothing else.
    nodes = [device.split(":", 1)[0] for device in containers.lot_devices(spec) if device.startswith("/")]
    found = conn.run(["stat", "-L", "-c", "%g", *nodes], check=False) if nodes and not is_dry_run(conn) else None
    groups = sorted({int(gid) for gid in found.stdout.split() if gid.isdigit() and gid != "0"}) if found else []
    return dataclasses.replace(spec, group_ids=tuple(groups))


def _container_state(conn: Connection, ctx: StepContext) -> tuple[str, bool] | None:
    """(spec label, running) of the order's container, or None when there is none."""
    template = f'{{{{index .Config.Labels "{containers.SPEC_LABEL}"}}}} {{{{.State.Running}}}}'
    found = conn.run(_container(ctx, "container", "inspect", "--format", template, ctx.container_name), check=False)
    if found.exit_status != 0 or is_dry_run(conn):
        return None
    label, _, running = found.stdout.strip().rpartition(" ")
    return label, running == "true"


def _prepare_kit(conn: Connection, ctx: StepContext, spec: containers.ContainerSpec) -> None:
    """The root-owned kit the container mounts read-only: the pre-flight check and the split-trial kit, sshd's
    configuration and host key (readable by the customer's group: sshd runs as them), an empty keys file until the
    hand-over, and for docker a passwd file naming the customer."""
    ssh_dir = ctx.ssh_dir
    conn.run(["install", "-d", "-m", "755", "-o", "root", "-g", "root", KIT_ROOT, ctx.kit_dir, ssh_dir])
    files = {
        f"{ctx.kit_dir}/preflight.py": (script_bytes("preflight"), 0o555, "root"),
        f"{ctx.kit_dir}/split_trial.py": (script_bytes("split_trial"), 0o555, "root"),
        f"{ssh_dir}/sshd_config": (host_file_bytes("sshd_config"), 0o644, "root"),
    }
    if not containers.Runtime(ctx.container_runtime).is_podman:
        passwd = f"root:x:0:0:root:/root:/bin/sh\n{containers.passwd_entry(spec)}\n"
        files[f"{ctx.kit_dir}/passwd"] = (passwd.encode(), 0o644, "root")
    install_root_files(conn, files)
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
    runtime = runtime_of(ctx)
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
        if ctx.carry_from_username:
            _reown_carried_data(conn, ctx, spec)
        started = conn.run(containers.run_argv(spec, runtime), check=False, timeout=600)
        if started.exit_status != 0 and not is_dry_run(conn):
            raise StepFailed(f"the container did not start: {started.stderr.strip()[-500:]}")
    state = _container_state(conn, ctx)
    if not is_dry_run(conn) and not (state and state[1]):
        logs = conn.run(runtime.command("logs", "--tail", "20", spec.name), check=False).stdout.strip()
        raise StepFailed(f"the container stopped right after it started: {logs[-500:]}")
    host_key = "" if is_dry_run(conn) else conn.run(["cat", f"{ctx.ssh_dir}/{HOST_KEY_NAME}.pub"]).stdout.split()[:2]
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
    if state is None and not is_dry_run(conn):
        raise StepFailed(f"the container {ctx.container_name} does not exist: provision the order again")
    if state and not state[1]:
        conn.run(_container(ctx, "start", ctx.container_name), timeout=120)


def preflight(conn: Connection, ctx: StepContext) -> StepOutput:
    """The pre-flight check inside the container, as the customer's uid, with the image's own Python and PyTorch,
    on the lot's GPUs (numbered from 0 there), from the kit mounted read-only (-I: nothing of the customer's
    shadows it). Its report is the container's word: parsed and bounded like any hostile input."""
    uid, gid = account_ids(conn, ctx.username)
    _ensure_running(conn, ctx)
    local = ",".join(str(position) for position in range(len(ctx.gpu_indices)))
    check = ["--expect-arch", ctx.expect_arch, "--expect-vendor", ctx.expect_vendor]
    argv = _container(ctx, "exec", "--user", f"{uid}:{gid}", "--workdir", ctx.home, ctx.container_name)
    argv += ["python3", "-I", f"{containers.KIT_MOUNT}/preflight.py", "--gpus", local, *check]
    result = conn.run(argv, check=False, timeout=900)
    report = dict(DRY_RUN_REPORT) if is_dry_run(conn) else parse_preflight_report(result.stdout, result)
    report["image"] = {"ref": ctx.image_ref, "id": f"sha256:{ctx.image_id}" if ctx.image_id else ""}
    status = report["summary"]["status"]
    return StepOutput(
        f"pre-flight: {report['summary']}",
        {"preflight_report": report, "preflight_status": status},
    )


def start_ssh(conn: Connection, ctx: StepContext) -> str:
    """The container runs and its sshd answers on the published port with the order's host key."""
    if is_dry_run(conn):
        return "sshd answers (dry run)"
    conn.run(runtime_of(ctx).guard_argv())  # after a reboot the host's firewall guard is rebuilt before anyone logs in
    _ensure_running(conn, ctx)
    expected = conn.run(["cat", f"{ctx.ssh_dir}/{HOST_KEY_NAME}.pub"]).stdout.split()[:2]
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
        if not re.fullmatch(RUNTIME_PATTERN, path):
            continue
        runtime = containers.Runtime(path)
        exists = runtime.command("container", "inspect", "--format", "{{.Id}}", ctx.container_name)
        if conn.run(exists, check=False).exit_status == 0 and not is_dry_run(conn):
            # frozen first: if the removal fails (a GPU process stuck in the driver), nothing of the customer's,
            # not even an SSH server of their own on the published port, answers while teardown is retried
            conn.run(runtime.command("pause", ctx.container_name), check=False, timeout=60)
            conn.run(runtime.remove(ctx.container_name), timeout=120)
            if conn.run(exists, check=False).exit_status == 0:
                raise StepFailed(f"{path} could not remove the container {ctx.container_name}")
            removed.append(f"container ({path})")
        if conn.run(runtime.command("network", "inspect", ctx.network_name), check=False).ok and not is_dry_run(conn):
            conn.run(runtime.command("network", "rm", ctx.network_name), timeout=60)
            removed.append("network")
    return f"{ctx.container_name}: {', '.join(removed)} removed" if removed else "no container to remove"
