"""The steps that make, check and remove the order's container: its data volume, its pinned image, the container in
a network of its own with the lot's GPUs only and its shares of the host, the pre-flight check inside it, and its
SSH server, which the customer logs in to.
"""

import dataclasses
import re

from inventory.rules import RUNTIME_PATTERN
from nodekit.bundle import host_file_bytes, script_bytes
from provisioning import cards, containers, host_probe, ports, shares
from provisioning.drivers.base import Connection
from provisioning.preflight_report import DRY_RUN_REPORT, parse_preflight_report
from provisioning.step_context import (
    IDS_LOCK,
    KIT_ROOT,
    VOLUME_ROOT,
    StepContext,
    StepFailed,
    StepOutput,
    id_ranges,
    install_root_files,
    is_dry_run,
    runtime_of,
)

HOST_KEY_NAME = "host_ed25519_key"
CDI_SPECS = ("/etc/cdi/nvidia.yaml", "/etc/cdi/nvidia.json", "/var/run/cdi/nvidia.yaml", "/var/run/cdi/nvidia.json")


def download_container_name(username: str) -> str:
    """The container of the read-only download window after the end (provisioning.download_steps)."""
    return f"binome-{username}-files"


# podman 4.3 starts the conmon of a container with a user namespace in a mount namespace of its own: the cleanup that
# conmon runs when the container stops unmounts the data volume and /dev/shm there, never on the host, where both stay
# mounted (the next start then fails, "already mounted"; the volume cannot be removed, "busy"), and a removal racing
# that cleanup leaves /dev/shm mounted. Root unmounts them on the host once no running container uses them: mount
# points of the runtime's own storage (root's directories, the mount's own root), never a path of the customer's.
_UNMOUNT = 'if grep -qs " $1 " /proc/self/mounts; then umount -- "$1"; fi'
_RUNTIME_PATH = re.compile(r"/[A-Za-z0-9._/-]{1,300}")
# $1 the runtime, $2 the volume: its mount point unmounted on the host unless a running container uses it (one round
# trip: the runtime's answers, then the mount table)
_RELEASE_VOLUME = (
    'rt=$1; [ -n "$("$rt" --runtime runc ps --filter "volume=$2" --filter status=running --format "{{.ID}}")" ] '
    '&& exit 0; point=$("$rt" --runtime runc volume inspect --format "{{.Mountpoint}}" "$2" 2>/dev/null) || exit 0; '
    "case $point in /*/_data) ;; *) exit 0 ;; esac; case $point in *[!A-Za-z0-9._/-]*) exit 0 ;; esac; "
    'if grep -qs " $point " /proc/self/mounts; then umount -- "$point"; fi'
)


def release_volume(conn: Connection, runtime: containers.Runtime, volume: str) -> None:
    """The volume unmounted on the host where the runtime left it mounted with no running container using it."""
    if runtime.is_podman and not is_dry_run(conn):
        conn.run(["sh", "-c", _RELEASE_VOLUME, "release_volume", runtime.path, volume], check=False, timeout=60)


def remove_checked(conn: Connection, runtime: containers.Runtime, name: str) -> None:
    """A container removed (stopped first, 5 s, then killed), and its /dev/shm unmounted on the host and the removal
    done again where the runtime left it mounted; StepFailed when it is still there."""
    exists = runtime.command("container", "inspect", "--format", "{{.StaticDir}}", name)
    found = conn.run(exists, check=False)
    if not found.ok or is_dry_run(conn):
        return
    if conn.run(runtime.remove(name), check=False, timeout=120).ok:
        return
    static = found.stdout.strip()
    if runtime.is_podman and _RUNTIME_PATH.fullmatch(static) and static.endswith("/userdata"):
        conn.run(["sh", "-c", _UNMOUNT, "release_shm", f"{static}/shm"], check=False, timeout=60)
    removed = conn.run(runtime.remove(name), check=False, timeout=120)
    if not removed.ok and conn.run(exists, check=False).ok:
        raise StepFailed(f"{runtime.path} could not remove the container {name}: {removed.stderr.strip()[-300:]}")


def remove_download(conn: Connection, ctx: StepContext, *, username: str = "") -> bool:
    """The download window's container of `username` (the order's by default) removed, checked; True when there was
    one. Closed by the wipe, and by the next order that takes the volume it mounts."""
    runtime, name = runtime_of(ctx), download_container_name(username or ctx.username)
    exists = runtime.command("container", "inspect", "--format", "{{.Id}}", name)
    if not conn.run(exists, check=False).ok or is_dry_run(conn):
        return False
    remove_checked(conn, runtime, name)
    release_volume(conn, runtime, f"binome-{username or ctx.username}-data")
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
        return int(1000 * shares.HOST_RESERVE * ctx.lots_in_container / max(1, ctx.lots_on_host))
    size, free = _disk_bytes(conn, VOLUME_ROOT, "size"), _disk_bytes(conn, VOLUME_ROOT, "avail")
    share = size * shares.HOST_RESERVE * ctx.lots_in_container / max(1, ctx.lots_on_host)
    return max(1, int(min(share, free - size * (1 - shares.HOST_RESERVE)) / 2**30))


def prepare_data(conn: Connection, ctx: StepContext) -> StepOutput:
    """The customer's data volume: an ext4 file system of the disk share in a root-owned file (space reserved),
    owned by the customer's account inside the tenant's user namespace, mounted by the runtime as their home whenever
    the container starts. Made once; kept until the wipe. Root never looks inside it."""
    runtime = runtime_of(ctx)
    if conn.run(runtime.command("volume", "inspect", ctx.volume_name), check=False).ok and not is_dry_run(conn):
        size = conn.run(["stat", "-c", "%s", ctx.volume_file], check=False).stdout.strip()
        gib = int(size) // 2**30 if size.isdigit() else 0
        return StepOutput(f"data volume {ctx.volume_name} kept ({gib} GiB)", {"disk_gib": gib})
    if ctx.carry_from_username:
        return _take_over_data(conn, ctx)
    gib = _disk_gib(conn, ctx)
    path = ctx.volume_file
    uid_base, gid_base = id_ranges(conn, ctx)
    uid, gid = uid_base + containers.CUSTOMER_ID, gid_base + containers.CUSTOMER_ID
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


# Give account $2 the subordinate ranges of account $1, whose volume it carries ($3: the ids of a range), and take them
# from $1: the volume's files, owned by ids of that range, stay the customer's without re-owning any. $2's own range
# goes back to the pool. Idempotent: a run resumed after the move finds $2 with the range and $1 without.
_TAKE_RANGES = (
    "# shellcheck disable=SC2013 # /etc/subuid's ranges (numbers, no spaces) read as words\n"
    'for kind in uid gid; do f=/etc/sub$kind; old=$(grep -m 1 "^$1:" "$f" | cut -d: -f2,3); '
    'new=$(grep -m 1 "^$2:" "$f" | cut -d: -f2,3); '
    'if [ -n "$old" ]; then start=${old%:*}; end=$((start + ${old#*:} - 1)); '
    'if [ "${new%:*}" != "$start" ]; then for own in $(grep "^$2:" "$f" | cut -d: -f2,3); do '
    'usermod --del-sub${kind}s "${own%:*}-$((${own%:*} + ${own#*:} - 1))" "$2" || exit 1; done; '
    'usermod --add-sub${kind}s "$start-$end" "$2" || exit 1; fi; '
    'usermod --del-sub${kind}s "$start-$end" "$1" || exit 1; '
    'elif [ -z "$new" ]; then echo "no range of $1 in $f"; exit 1; fi; done; echo moved'
)


def _take_over_data(conn: Connection, ctx: StepContext) -> StepOutput:
    """The customer's earlier order on this host left its data volume to this order (they opted in at booking):
    its file is renamed to this order's, inside root's volume directory, the runtime's volume made on it, and the
    earlier account's range of subordinate ids given to this order's account. The files keep their owners: ids of
    that range, which this order's user namespace maps as the earlier one did, so nothing is re-owned. The host reads
    nothing in it: no mount, no fsck, no debugfs, no chown."""
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
        release_volume(conn, runtime, f"{source_container}-data")
        conn.run(runtime.command("volume", "rm", f"{source_container}-data"), timeout=120)
    moved = conn.run(["sh", "-c", _TAKE_OVER, "take_over", source, ctx.volume_file], check=False)
    if not moved.ok and not is_dry_run(conn):
        raise StepFailed(
            f"the data volume of {source_user}, which this order carries, is not in {VOLUME_ROOT} any more "
            f"({moved.stdout.strip() or moved.stderr.strip()[-200:]}): make an empty one by moving the order, "
            "or tell the customer"
        )
    if runtime.is_podman:  # docker's one daemon-wide range is every order's already
        ranges = ["flock", IDS_LOCK, "sh", "-c", _TAKE_RANGES, "take_ranges", source_user, ctx.username]
        taken = conn.run(ranges, check=False)
        if not taken.ok and not is_dry_run(conn):
            raise StepFailed(
                f"the ids of {source_user}'s volume could not be given to {ctx.username}: "
                f"{(taken.stdout + taken.stderr).strip()[-300:]}"
            )
    conn.run(runtime.volume_create(ctx.volume_name, ctx.volume_file))
    size = conn.run(["stat", "-c", "%s", ctx.volume_file], check=False).stdout.strip()
    gib = int(size) // 2**30 if size.isdigit() else 0
    return StepOutput(
        f"data volume {ctx.volume_name}: {gib} GiB, carried from {source_user} with its ids "
        f"({moved.stdout.strip() or 'moved'})",
        {"disk_gib": gib},
    )


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
        facts = host_probe.image_facts(conn, runtime.command, image_id)
        if facts.problem:
            raise StepFailed(f"the image {ctx.image_ref} cannot be handed to a customer: {facts.problem}")
        _install_accounts(conn, ctx, facts)
    return StepOutput(f"{runtime.path}: {ctx.image_ref} {pulled}, pinned sha256:{image_id}", {"image_id": image_id})


def _install_accounts(conn: Connection, ctx: StepContext, facts: host_probe.ImageFacts) -> None:
    """The container's /etc/passwd and /etc/group, in the kit: the image's accounts (sshd's privilege separation
    user among them) and the customer's, with the same ids in every container (containers.CUSTOMER_ID)."""
    ours = f"{ctx.username}:"
    passwd = [line for line in facts.passwd if not line.startswith(ours)]
    passwd.append(containers.passwd_entry(ctx.username, ctx.home))
    group = [line for line in facts.group if not line.startswith(ours)] + [containers.group_entry(ctx.username)]
    for name, lines in (("passwd", passwd), ("group", group)):  # in the kit directory create_user made
        conn.put_file(
            f"{ctx.kit_dir}/{name}", "".join(f"{line}\n" for line in lines).encode(), mode=0o644, owner="root:root"
        )


def _shares(conn: Connection, ctx: StepContext) -> shares.Shares:
    """The container's shares: the operator's where set, else the host's size split over its lots, less a reserve for
    the host, so that no container can take a co-tenant's share (provisioning/shares.py)."""
    try:
        return shares.container_shares(
            shares.host_size(conn, VOLUME_ROOT),
            lots_in_container=ctx.lots_in_container,
            lots_on_host=ctx.lots_on_host,
            cpus=ctx.cpus,
            memory=ctx.memory,
            shm_size=ctx.shm_size,
            connections=ctx.connections,
            ptys=ctx.ptys,
            disk_mbps=ctx.disk_mbps,
        )
    except ValueError as exc:
        raise StepFailed(str(exc)) from exc


def _container_spec(conn: Connection, ctx: StepContext, share: shares.Shares) -> containers.ContainerSpec:
    if not ctx.image_id and not is_dry_run(conn):
        raise StepFailed("the image is not pinned yet: prepare_image must run first")
    uid_base, gid_base = id_ranges(conn, ctx)
    nvidia = ctx.expect_vendor == "nvidia"
    any_exists = 'for f; do [ -e "$f" ] && exit 0; done; exit 1'
    cdi = nvidia and ctx.device_dir == "/dev" and conn.run(["sh", "-c", any_exists, "cdi", *CDI_SPECS], check=False).ok
    spec = containers.ContainerSpec(
        name=ctx.container_name,
        image=ctx.image_id or ctx.image_ref,
        username=ctx.username,
        uid_base=uid_base,
        gid_base=gid_base,
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
        cpus=share.cpus,
        memory=share.memory,
        shm_size=share.shm_size,
        pids_limit=share.pids_limit,
        ptys=share.ptys,
        io_weight=share.io_weight,
        io_device=share.io_device,
        io_bps=share.io_bps,
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
    configuration and host key, an empty keys file until the hand-over (prepare_image wrote the accounts)."""
    ssh_dir = ctx.ssh_dir
    conn.run(["install", "-d", "-m", "755", "-o", "root", "-g", "root", KIT_ROOT, ctx.kit_dir, ssh_dir])
    files = {
        f"{ctx.kit_dir}/preflight.py": (script_bytes("preflight"), 0o555, "root"),
        f"{ctx.kit_dir}/split_trial.py": (script_bytes("split_trial"), 0o555, "root"),
        f"{ssh_dir}/sshd_config": (host_file_bytes("sshd_config"), 0o644, "root"),
    }
    install_root_files(conn, files)
    # The host key: made once per order (kept across container replacements, so the customer's known_hosts holds).
    # Owned by the customer's ids of the tenant's namespace, 600: sshd reads it as container root in the window, as the
    # customer in the download window, and refuses a key others can read. Host root's files are nobody's inside.
    key, keys = f"{ssh_dir}/{HOST_KEY_NAME}", f"{ssh_dir}/authorized_keys"
    make_key = (
        '[ -s "$1" ] || { rm -f "$1" "$1.pub" && ssh-keygen -q -t ed25519 -N "" -C "$3" -f "$1"; } '
        '&& chown "$2" "$1" && chmod 600 "$1" && { [ -f "$4" ] || install -m 644 /dev/null "$4"; }'
    )
    owner = ":".join(str(host_id) for host_id in spec.host_customer_ids)
    conn.run(["sh", "-c", make_key, "kit", key, owner, ctx.container_name, keys])


def start_container(conn: Connection, ctx: StepContext) -> StepOutput:
    """The order's container in a network of its own, from the pinned image, with the lot's GPUs only: made once,
    kept while it matches what the order needs (started again if it stopped), replaced when the lot, the image or
    a share changed. Its sshd waits for the keys of the hand-over."""
    runtime = runtime_of(ctx)
    share = _shares(conn, ctx)
    spec = _container_spec(conn, ctx, share)
    _prepare_kit(conn, ctx, spec)
    network = runtime.command("network", "inspect", ctx.network_name)
    if not conn.run(network, check=False).ok:
        conn.run(runtime.network_create(ctx.network_name))
    _cap_connections(conn, ctx, share.connections)
    state = _container_state(conn, ctx)
    replaced = ""
    if state and state[0] == containers.spec_digest(spec):
        if not state[1]:
            _check_cards_free(conn, ctx)
            release_volume(conn, runtime, spec.volume)
            replaced = _clear_port(conn, ctx, spec.ssh_port)
            started = conn.run(runtime.command("start", spec.name), check=False, timeout=120)
            if not started.ok and not is_dry_run(conn):
                raise StepFailed(_did_not_start(conn, spec.ssh_port, started.stderr))
        replaced = " (kept)" + replaced
    else:
        # before the old container goes: a move whose new cards are not free leaves the customer where they work
        _check_cards_free(conn, ctx)
        if state:  # another lot, image or share: the old container goes (the data volume stays)
            remove_checked(conn, runtime, spec.name)
            replaced = " (the previous one, made for another lot, image or share, was removed)"
        release_volume(conn, runtime, spec.volume)
        replaced += _clear_port(conn, ctx, spec.ssh_port)
        started = conn.run(containers.run_argv(spec, runtime), check=False, timeout=600)
        if started.exit_status != 0 and not is_dry_run(conn):
            raise StepFailed(_did_not_start(conn, spec.ssh_port, started.stderr))
        _check_started_alone(conn, ctx)
    state = _container_state(conn, ctx)
    if not is_dry_run(conn) and not (state and state[1]):
        logs = conn.run(runtime.command("logs", "--tail", "20", spec.name), check=False).stdout.strip()
        raise StepFailed(f"the container stopped right after it started: {logs[-500:]}")
    loop = _throttle_volume(conn, ctx)
    host_key = "" if is_dry_run(conn) else conn.run(["cat", f"{ctx.ssh_dir}/{HOST_KEY_NAME}.pub"]).stdout.split()[:2]
    gpus = (
        "CDI " + ",".join(containers.lot_devices(spec))
        if spec.use_cdi
        else "device nodes " + " ".join(device.split(":", 1)[0] for device in containers.lot_devices(spec))
    )
    said = (
        f"{spec.cpus} CPUs, {spec.memory} memory, {spec.shm_size} /dev/shm, {spec.pids_limit} processes, "
        f"{share.connections or 'untracked'} tracked connections, {share.ptys or 'the pool of'} terminals, "
        f"disk I/O {share.disk_io or 'not shared (no weight honoured here, no bandwidth set)'}"
        + (f" (its home's {loop} too)" if loop else "")
    )
    return StepOutput(
        f"container {spec.name}{replaced}: image sha256:{spec.image[:12]}, {gpus}, {said}, "
        f"network {spec.network}, SSH on port {spec.ssh_port}",
        {
            "ssh_port": spec.ssh_port,
            "ssh_host_key": " ".join(host_key) if host_key else "",
            "shares": share.as_access(),
        },
    )


def _clear_port(conn: Connection, ctx: StepContext, port: int) -> str:
    """Before the window's port is published: netavark's forwards of it left by containers podman no longer has
    are dropped (the first rule wins: a stale one would send the customer's SSH elsewhere). What was done, said."""
    runtime = runtime_of(ctx)
    if is_dry_run(conn) or not runtime.is_podman:
        return ""
    dropped = ports.drop_stale_forwards(conn, runtime, port)
    return f" (a stale forward of port {port}, of a removed container, dropped)" if dropped else ""


def _did_not_start(conn: Connection, port: int, stderr: str) -> str:
    """Why the container did not start, with what holds its port when the runtime says it is taken."""
    said = stderr.strip()[-500:]
    if not any(words in stderr.lower() for words in ports.PORTS_TAKEN):
        return f"the container did not start: {said}"
    held = ports.holders(conn, port)
    by = "; ".join(held) if held else "nothing any more (it was released since: retry the run)"
    return f"the container did not start: port {port} is held on the host by {by}. The runtime said: {said}"


# $1 the runtime, $2 the order's network, $3 the cap: written in root's file for the network's bridge (podman's
# interface, docker's br-<id>), one round trip
_CAP_CONNECTIONS = (
    'if [ "${1##*/}" = podman ]; then b=$("$1" --runtime runc network inspect --format "{{.NetworkInterface}}" "$2"); '
    'else b=br-$("$1" network inspect --format "{{.Id}}" "$2" | cut -c1-12); fi || exit 1; '
    'case $b in "" | *[!A-Za-z0-9_.-]*) exit 1 ;; esac; '
    f"install -d -m 755 -o root -g root /etc/binome {shares.CONNTRACK_CAPS_DIR} "
    f'&& printf "%s\\n" "$3" > "{shares.CONNTRACK_CAPS_DIR}/$b.part" '
    f'&& mv -f "{shares.CONNTRACK_CAPS_DIR}/$b.part" "{shares.CONNTRACK_CAPS_DIR}/$b" && echo "$b"'
)


def _cap_connections(conn: Connection, ctx: StepContext, cap: int) -> None:
    """The container's cap of tracked connections, in root's file for its bridge: the firewall guard applies it (run
    by the hand-over's start_ssh, before anyone logs in, and every 30 s)."""
    if not cap or is_dry_run(conn):
        return
    written = conn.run(["sh", "-c", _CAP_CONNECTIONS, "cap", runtime_of(ctx).path, ctx.network_name, str(int(cap))])
    if not shares.BRIDGE_NAME.fullmatch(written.stdout.strip()):
        raise StepFailed(f"the order's network has no bridge to cap: {written.stdout.strip()[:60]!r}")


def _uncap_connections(conn: Connection, ctx: StepContext, runtime: containers.Runtime) -> bool:
    """The share's file of the order's bridge removed before the network is (another network may take the name).
    True when there was one: the guard, run again once the network is gone, then removes the bridge's rules (the
    next network on that bridge starts from a count of its own)."""
    field = "{{.NetworkInterface}}" if runtime.is_podman else "{{.Id}}"
    found = conn.run(runtime.command("network", "inspect", "--format", field, ctx.network_name), check=False)
    name = found.stdout.strip() if runtime.is_podman else f"br-{found.stdout.strip()[:12]}"
    if found.ok and shares.BRIDGE_NAME.fullmatch(name):
        return conn.run(["rm", "-f", "--", shares.conntrack_cap_file(name)], check=False).ok
    return False


# $1 the runtime, $2 the container, $3 the data volume's file, $4 bytes/s: the loop device the runtime mounted the
# volume from at the container's start (its number changes from one start to the next) throttled in the container's
# own cgroup, read and write (cgroup v2's io.max, v1's blkio.throttle): the customer's home is an ext4 file system in
# that loop device, whose I/O no rule on the backing disk binds. One round trip; prints the loop device and its number.
_THROTTLE_VOLUME = (
    'if [ "${1##*/}" = podman ]; then set -- "$1 --runtime runc" "$2" "$3" "$4"; fi; '
    'pid=$($1 container inspect --format "{{.State.Pid}}" "$2") || exit 1; '
    'case $pid in "" | 0 | *[!0-9]*) echo "the container is not running"; exit 1 ;; esac; '
    'loop=$(losetup -n -O NAME -j "$3" | head -n 1); '
    'case $loop in /dev/loop[0-9]*) ;; *) echo "no loop device holds $3"; exit 1 ;; esac; '
    'dev=$(cat "/sys/block/${loop#/dev/}/dev") || exit 1; '
    "if [ -f /sys/fs/cgroup/cgroup.controllers ]; then "
    'cg=$(sed -n "s/^0:://p" "/proc/$pid/cgroup"); '
    'echo "$dev rbps=$4 wbps=$4" > "/sys/fs/cgroup$cg/io.max" || exit 1; '
    'else cg=$(sed -n "s/^[0-9]*:blkio://p" "/proc/$pid/cgroup"); d="/sys/fs/cgroup/blkio$cg"; '
    'echo "$dev $4" > "$d/blkio.throttle.read_bps_device" && echo "$dev $4" > "$d/blkio.throttle.write_bps_device" '
    '|| exit 1; fi; echo "$loop $dev"'
)


def _throttle_volume(conn: Connection, ctx: StepContext) -> str:
    """The operator's disk bandwidth on the container's home, after each start: the rule on the disk holding the
    volumes (--device-*-bps) binds nothing the customer does to their home, whose reads and writes go to the loop
    device the runtime mounted it from. Returns the loop device throttled ("" when no bandwidth is set)."""
    if not ctx.disk_mbps or is_dry_run(conn):
        return ""
    rate = str(int(ctx.disk_mbps) * 2**20)
    argv = ["sh", "-c", _THROTTLE_VOLUME, "throttle", runtime_of(ctx).path, ctx.container_name, ctx.volume_file, rate]
    answer = conn.run(argv, check=False)
    said = answer.stdout.strip().split()
    if answer.exit_status != 0 or len(said) != 2 or not re.fullmatch(r"/dev/loop\d{1,6}", said[0]):
        said = answer.stdout.strip()[:200]
        raise StepFailed(f"the disk bandwidth could not be set on the home's loop device: {said}")
    return said[0]


def _ensure_running(conn: Connection, ctx: StepContext) -> bool:
    """Whether the container runs, started when it was stopped and the run may start it (ctx.starts_stopped_container):
    a run that may not (a change of keys in the window) leaves it stopped to the watch, which counts each restart
    under its backoff and ceiling (provisioning/restarts.py)."""
    state = _container_state(conn, ctx)
    if state is None and not is_dry_run(conn):
        raise StepFailed(f"the container {ctx.container_name} does not exist: provision the order again")
    if state and not state[1]:
        if ctx.container_held:
            raise StepFailed(
                f"the container {ctx.container_name} kept stopping and is left stopped: an operator starts it again"
            )
        if not ctx.starts_stopped_container:
            return False
        _check_cards_free(conn, ctx)
        release_volume(conn, runtime_of(ctx), ctx.volume_name)
        conn.run(_container(ctx, "start", ctx.container_name), timeout=120)
        _throttle_volume(conn, ctx)
    return True


def _check_cards_free(conn: Connection, ctx: StepContext) -> None:
    """No container starts on a card another container of the host holds, whatever the bookings say: what the
    runtime says holds them is read on the host (provisioning/cards.py), every container counted, stopped ones
    too (they start again at the next boot)."""
    if is_dry_run(conn):
        return
    holders = cards.card_holders(conn, runtime_of(ctx), ctx.expect_vendor)
    found = cards.conflicts(holders, cards=ctx.gpu_indices, own=ctx.container_name)
    if found:
        raise StepFailed(
            f"the lot's cards are not free on this host: {cards.describe_conflicts(found)}; the container of "
            f"{ctx.username} was not started (the teardown or move of the order that holds them must finish first, "
            "or an operator removes that container)"
        )


def _check_started_alone(conn: Connection, ctx: StepContext) -> None:
    """Read again once started: of two containers started at once on the same cards (each checked before the other
    existed), the one the runtime made first keeps them and the later one is removed, so one of them always wins
    and never both."""
    if is_dry_run(conn):
        return
    holders = cards.card_holders(conn, runtime_of(ctx), ctx.expect_vendor)
    mine = next((holder for holder in holders if holder.name == ctx.container_name), None)
    found = [
        (holder, held)
        for holder, held in cards.conflicts(holders, cards=ctx.gpu_indices, own=ctx.container_name)
        if mine is None or (holder.created_ns, holder.name) < (mine.created_ns, mine.name)
    ]
    if found:
        conn.run(runtime_of(ctx).remove(ctx.container_name), check=False, timeout=120)
        raise StepFailed(
            f"another container took the lot's cards while this one started: {cards.describe_conflicts(found)}; "
            f"the container of {ctx.username} was removed again"
        )


# The host pid of the init of container $3 (runtime $1), then "keys" when its keys file $2 is not empty (its sshd
# takes logins, or will within a second), then the container's processes as the host's kernel lists them (pid,
# parent, command): one round trip.
_CONTAINER_PROCESSES = (
    'if [ "${1##*/}" = podman ]; then set -- "$1 --runtime runc" "$2" "$3"; fi; '
    'init=$($1 container inspect --format "{{.State.Pid}}" "$3") || exit 1; echo "$init"; '
    '[ -s "$2" ] && echo keys; ps -e -o pid=,ppid=,comm= | awk -v root="$init" '
    "'{ parent[$1] = $2; name[$1] = $3 } END { for (pid in parent) { p = pid; "
    'while (p != "" && p != root && p > 1) p = parent[p]; if (p == root) print pid, parent[pid], name[pid] } }\''
)
INIT_NAMES = ("catatonit", "podman-init", "docker-init", "tini")


def _nothing_of_the_customer_runs(conn: Connection, ctx: StepContext) -> bool:
    """Whether nothing of the customer's runs in the container, nor can start: its keys file is empty (no login
    until the hand-over) and the only processes are the runtime's init, the supervisor shell and its sleep, as the
    host's kernel lists them (a process of the customer's, even one named like those, has another parent)."""
    keys = f"{ctx.ssh_dir}/authorized_keys"
    argv = ["sh", "-c", _CONTAINER_PROCESSES, "processes", runtime_of(ctx).path, keys, ctx.container_name]
    init, _, listed = conn.run(argv).stdout.partition("\n")
    init = init.strip()
    if not init.isdigit() or int(init) <= 1 or listed.startswith("keys"):
        return False
    processes = [(*line.split(None, 2), "", "", "")[:3] for line in listed.splitlines()[:5000]]
    supervisors = [pid for pid, parent, name in processes if parent == init and name == "sh"]
    for pid, parent, name in processes:
        allowed = (
            (pid == init and name in INIT_NAMES)
            or (parent == init and name == "sh" and len(supervisors) == 1)
            or (parent in supervisors and name == "sleep")
        )
        if not allowed:
            return False
    return bool(processes)


def preflight(conn: Connection, ctx: StepContext) -> StepOutput:
    """The pre-flight check inside the container, as the customer's account, with the image's own Python and
    PyTorch, on the lot's GPUs (numbered from 0 there), from the kit mounted read-only (-I: nothing of the customer's
    shadows it). Its report is the container's word: parsed and bounded like any hostile input, and its exit status
    counts (a report of PASS from a check that exited in failure is a FAIL). Before the hand-over it runs with nothing
    of the customer's in the container, which the host checks first; run beside the customer's processes (a re-run
    in a ready window), the report says so wherever it shows: it is then the customer's word, whose root could
    change what it printed."""
    _ensure_running(conn, ctx)
    witnessed = is_dry_run(conn) or _nothing_of_the_customer_runs(conn, ctx)
    local = ",".join(str(position) for position in range(len(ctx.gpu_indices)))
    check = ["--expect-arch", ctx.expect_arch, "--expect-vendor", ctx.expect_vendor]
    customer = f"{containers.CUSTOMER_ID}:{containers.CUSTOMER_ID}"
    argv = _container(ctx, "exec", "--user", customer, "--workdir", ctx.home, ctx.container_name)
    argv += ["python3", "-I", f"{containers.KIT_MOUNT}/preflight.py", "--gpus", local, *check]
    result = conn.run(argv, check=False, timeout=900)
    report = dict(DRY_RUN_REPORT) if is_dry_run(conn) else parse_preflight_report(result.stdout, result)
    if not is_dry_run(conn) and result.exit_status != 0 and report["summary"]["status"] != "FAIL":
        said = report["summary"]["status"]
        report["checks"] = [
            *report["checks"],
            {"name": "exit_status", "status": "FAIL", "reason": f"exit status {result.exit_status}, report {said}"},
        ]
        report["summary"] = {**report["summary"], "status": "FAIL"}
    report["image"] = {"ref": ctx.image_ref, "id": f"sha256:{ctx.image_id}" if ctx.image_id else ""}
    report["beside_customer"] = not witnessed  # ours, whatever the container printed under that name
    status = report["summary"]["status"]
    where = "with nothing of the customer's running" if witnessed else "beside the customer's processes: their word"
    return StepOutput(
        f"pre-flight ({where}): {report['summary']}",
        {"preflight_report": report, "preflight_status": status},
    )


# How long the container's sshd may take to answer once its keys are written: its supervisor looks every second,
# and a loaded host (a busy CI machine, a host starting many containers after a reboot) starts it slowly; waited for
# by the clock, not by a count of tries, so that a slow scan does not shorten it.
SSHD_ANSWER_WITHIN_S = 45


def start_ssh(conn: Connection, ctx: StepContext) -> str:
    """The container runs and its sshd answers on the published port with the order's host key."""
    if is_dry_run(conn):
        return "sshd answers (dry run)"
    conn.run(runtime_of(ctx).guard_argv())  # after a reboot the host's firewall guard is rebuilt before anyone logs in
    if not _ensure_running(conn, ctx):
        return (
            f"the container {ctx.container_name} is stopped: left to the watch, which starts it again with its "
            "backoff (the keys written take effect then)"
        )
    expected = conn.run(["cat", f"{ctx.ssh_dir}/{HOST_KEY_NAME}.pub"]).stdout.split()[:2]
    address = ctx.publish_address or "127.0.0.1"
    # as nobody: what answers on the port may be the customer's own server, and root parses nothing of theirs
    scan = ["runuser", "-u", "nobody", "--", "sh", "-c",
            'end=$(($(date +%s) + $4)); while :; do ssh-keyscan -T 2 -t ed25519 -p "$1" "$2" 2>/dev/null '
            '| grep -F "$3" && exit 0; [ "$(date +%s)" -lt "$end" ] || exit 1; sleep 0.25; done',
            "start_ssh", str(ctx.ssh_port), address, expected[-1], str(SSHD_ANSWER_WITHIN_S)]  # fmt: skip
    if not conn.run(scan, check=False, timeout=SSHD_ANSWER_WITHIN_S + 60).ok:
        raise StepFailed(
            f"the container's sshd does not answer on port {ctx.ssh_port} with the order's host key "
            f"within {SSHD_ANSWER_WITHIN_S} s"
        )
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
            remove_checked(conn, runtime, ctx.container_name)
            if conn.run(exists, check=False).exit_status == 0:
                raise StepFailed(f"{path} could not remove the container {ctx.container_name}")
            release_volume(conn, runtime, ctx.volume_name)
            removed.append(f"container ({path})")
        if conn.run(runtime.command("network", "inspect", ctx.network_name), check=False).ok and not is_dry_run(conn):
            uncapped = _uncap_connections(conn, ctx, runtime)
            conn.run(runtime.command("network", "rm", ctx.network_name), timeout=60)
            if uncapped:
                conn.run(runtime.guard_argv(), check=False)
            removed.append("network")
    return f"{ctx.container_name}: {', '.join(removed)} removed" if removed else "no container to remove"


# Every process in the pid namespace of the container's init ($1): "pid ppid starttime sshd", sshd 1 when the process
# runs the image's /usr/sbin/sshd. Read by root from /proc: nothing of the customer's (a command name, a path) is
# printed, only numbers, and /proc/<pid>/stat's fields are read after the command name's last ")".
_NAMESPACE_PROCESSES = (
    'ns=$(readlink "/proc/$1/ns/pid") || exit 0; for d in /proc/[0-9]*; do '
    '[ "$(readlink "$d/ns/pid" 2>/dev/null)" = "$ns" ] || continue; stat=$(cat "$d/stat" 2>/dev/null) || continue; '
    'fields=$(printf "%s" "${stat##*) }" | cut -d " " -f 2,20); '
    '[ "$(readlink "$d/exe" 2>/dev/null)" = /usr/sbin/sshd ] && sshd=1 || sshd=0; '
    'printf "%s %s %s\\n" "${d#/proc/}" "$fields" "$sshd"; done'
)
# Kill each "pid:starttime" of $2... that is still that process in the namespace of $1 (a pid the kernel gave to
# another process meanwhile is left alone); print how many were killed.
_KILL_IN_CONTAINER = (
    'ns=$(readlink "/proc/$1/ns/pid") || { echo 0; exit 0; }; shift; killed=0; for entry; do pid=${entry%%:*}; '
    '[ "$(readlink "/proc/$pid/ns/pid" 2>/dev/null)" = "$ns" ] || continue; stat=$(cat "/proc/$pid/stat" 2>/dev/null) '
    '|| continue; [ "$(printf "%s" "${stat##*) }" | cut -d " " -f 20)" = "${entry#*:}" ] || continue; '
    'kill -KILL "$pid" 2>/dev/null && killed=$((killed + 1)); done; echo "$killed"'
)
SESSION_KILL_ROUNDS = 3


def _sessions(conn: Connection, init_pid: int) -> list[str]:
    """The "pid:starttime" of every process of the container's SSH sessions: each process below an SSH server that
    is not itself below one (the container's own, or one the customer started: theirs are sessions too)."""
    answer = conn.run(["sh", "-c", _NAMESPACE_PROCESSES, "sessions", str(init_pid)], check=False, timeout=60)
    processes: dict[int, tuple[int, str, bool]] = {}
    for line in answer.stdout.splitlines()[:100_000]:
        fields = line.split()
        if len(fields) == 4 and all(field.isdigit() for field in fields):
            processes[int(fields[0])] = (int(fields[1]), fields[2], fields[3] == "1")

    def under_a_server(pid: int) -> bool:
        parent, seen = processes[pid][0], 0
        while parent in processes and seen < 1000:
            if processes[parent][2] and not (processes[parent][0] in processes and processes[processes[parent][0]][2]):
                return True  # the parent is an SSH server not started by another (a listener)
            parent, seen = processes[parent][0], seen + 1
        return False

    return [f"{pid}:{start}" for pid, (_parent, start, _sshd) in processes.items() if under_a_server(pid)]


def end_sessions(conn: Connection, ctx: StepContext) -> str:
    """Every SSH session open in the order's container and in its download window (shells, commands, forwards, SFTP)
    killed, after a key was removed: the keys file was rewritten by the step before, so the key opens nothing new,
    and what it opened ends now. All sessions, not only the removed key's: sshd runs as the customer, so which key
    opened a session is written only where a session can write too (its log); ending them all is the reading no
    session can forge. The customer logs in again with the keys they keep; processes started outside a session
    (tmux, nohup) go on, as the customer's. The SSH servers themselves keep running."""
    if is_dry_run(conn):
        return "open sessions ended (dry run)"
    runtime, ended = runtime_of(ctx), []
    for name in (ctx.container_name, download_container_name(ctx.username)):
        found = conn.run(runtime.command("container", "inspect", "--format", "{{.State.Pid}}", name), check=False)
        init_pid = int(found.stdout.strip()) if found.ok and found.stdout.strip().isdigit() else 0
        if not init_pid:
            continue  # not there, or not running: no session
        killed = 0
        for _round in range(SESSION_KILL_ROUNDS):  # a session may fork while the others die
            sessions = _sessions(conn, init_pid)
            if not sessions:
                break
            answer = conn.run(["sh", "-c", _KILL_IN_CONTAINER, "end_sessions", str(init_pid), *sessions], check=False)
            killed += int(answer.stdout.strip()) if answer.stdout.strip().isdigit() else 0
        else:
            if _sessions(conn, init_pid):
                raise StepFailed(f"sessions in {name} survived SIGKILL: retry once the host is responsive")
        ended.append(f"{name}: {killed} session process(es) killed" if killed else f"{name}: no open session")
    return "; ".join(ended) or "no container running: no open session"
