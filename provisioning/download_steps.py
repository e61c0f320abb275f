"""The read-only download window after an order's end, until its files are deleted: a container of its own per order
that runs only sshd's internal-sftp in read-only mode over the customer's data volume, mounted read-only and
noexec, with the order's keys expiring at the wipe. Opened by the last step of the teardown of a window that ended,
closed by the wipe, and by the next order that takes the volume over.

Why a container of its own, not the window's: the window's container ran the customer's processes and is gone with
them; this one runs nothing but sshd from the order's pinned catalog image (read-only root file system, no
capability, the customer's uid, its own network, the kit's configuration read-only), so the customer can read their
files and nothing of theirs can run, write or reach anything. The host itself still reads nothing of the volume.
"""

import re
from datetime import UTC

from django.utils import timezone

from nodekit.bundle import host_file_bytes
from provisioning import containers
from provisioning.container_steps import download_container_name, release_volume, remove_checked
from provisioning.drivers.base import Connection, DriverError
from provisioning.host_steps import authorized_keys_lines
from provisioning.ports import PORTS_TAKEN
from provisioning.step_context import (
    StepContext,
    StepFailed,
    StepOutput,
    id_ranges,
    install_root_files,
    is_dry_run,
    runtime_of,
)

DOWNLOAD_START_ATTEMPTS = 4
DOWNLOAD_CONFIG, DOWNLOAD_KEYS = "download_config", "download_keys"
# Every key of the window, restricted to nothing but the SFTP session sshd forces (no pty, no forwarding).
DOWNLOAD_KEY_OPTIONS = "restrict"


def _published_ports(conn: Connection, ctx: StepContext) -> set[int]:
    """Every port a TCP socket of the host holds, listening or not (an outgoing connection's local port blocks a
    publication as much as a server does), and every port the runtime publishes (a stopped container keeps its
    own)."""
    runtime = runtime_of(ctx)
    sockets = conn.run(["ss", "-Htan"], check=False).stdout
    published = conn.run(runtime.command("ps", "--all", "--format", "{{.Ports}}"), check=False).stdout
    ports = {int(port) for port in re.findall(r":(\d{1,5})\s", sockets + " ")}
    ports |= {int(port) for port in re.findall(r":(\d{1,5})->", published)}
    return ports


def _download_state(conn: Connection, ctx: StepContext) -> tuple[int, bool] | None:
    """(published port, running) of the order's download container, or None when there is none."""
    runtime = runtime_of(ctx)
    template = "{{range $p, $b := .HostConfig.PortBindings}}{{range $b}}{{.HostPort}}{{end}}{{end}} {{.State.Running}}"
    found = conn.run(
        runtime.command("container", "inspect", "--format", template, download_container_name(ctx.username)),
        check=False,
    )
    if not found.ok or is_dry_run(conn):
        return None
    port, _, running = found.stdout.strip().rpartition(" ")
    return (int(port) if port.isdigit() else 0), running == "true"


def _download_argv(ctx: StepContext, *, uid_base: int, gid_base: int, port: int) -> list[str]:
    runtime = runtime_of(ctx)
    name = download_container_name(ctx.username)
    argv = runtime.command("run", "--name", name, "--hostname", name, "--detach", "--init", "--restart", "always")
    # the window's user namespace (the volume's files are its ids), and sshd as the customer's account in it
    customer = f"{containers.CUSTOMER_ID}:{containers.CUSTOMER_ID}"
    argv += ["--read-only", *runtime.id_map(uid_base, gid_base), "--user", customer]
    argv += ["--cap-drop", "all", "--security-opt", "no-new-privileges"]
    argv += ["--volume", f"{ctx.kit_dir}/passwd:/etc/passwd:ro", "--volume", f"{ctx.kit_dir}/group:/etc/group:ro"]
    for ulimit in containers.ULIMITS:
        argv += ["--ulimit", ulimit]
    argv += ["--pids-limit", "64", "--memory", "512m", "--memory-swap", "512m", "--cpus", "1"]
    published = f"{ctx.publish_address}:{port}" if ctx.publish_address else str(port)
    argv += ["--network", ctx.network_name, "--publish", f"{published}:{containers.SSH_PORT_INSIDE}/tcp"]
    argv += ["--volume", f"{ctx.volume_name}:{ctx.home}:ro,noexec,nosuid,nodev", "--workdir", ctx.home]
    argv += ["--volume", f"{ctx.kit_dir}:{containers.KIT_MOUNT}:ro"]
    log_driver = "k8s-file" if runtime.is_podman else "json-file"
    argv += ["--log-driver", log_driver, "--log-opt", f"max-size={containers.LOG_SIZE}"]
    config = f"{containers.KIT_MOUNT}/ssh/{DOWNLOAD_CONFIG}"
    return [*argv, ctx.image_id, "/usr/sbin/sshd", "-D", "-e", "-f", config]


def _start_download(conn: Connection, ctx: StepContext, *, uid_base: int, gid_base: int) -> int:
    """The download window's container started on the first free port of its range; a port taken between the look
    and the start (the host's own outgoing connections take ports at any time) is skipped for the next one."""
    runtime = runtime_of(ctx)
    used = _published_ports(conn, ctx)
    ports = ctx.download_ports
    for _attempt in range(DOWNLOAD_START_ATTEMPTS):
        port = next((p for p in ports if p not in used), 0)
        if not port:
            raise StepFailed(f"no free port for the download window in {ports.start}-{ports.stop - 1}")
        argv = _download_argv(ctx, uid_base=uid_base, gid_base=gid_base, port=port)
        release_volume(conn, runtime, ctx.volume_name)
        started = conn.run(argv, check=False, timeout=300)
        if started.ok:
            return port
        remove_checked(conn, runtime, download_container_name(ctx.username))
        if not any(words in started.stderr.lower() for words in PORTS_TAKEN):
            break
        used.add(port)
    raise StepFailed(f"the download window's container did not start: {started.stderr.strip()[-400:]}")


def open_download(conn: Connection, ctx: StepContext) -> StepOutput | str:
    """After a window that ended (the teardown's last step): the customer's data volume, read-only, over SFTP only,
    with the order's keys expiring when the files are deleted. Kept when it runs already. It never fails the
    teardown, which took access away already and must not be held by a convenience: what stopped it is recorded
    in the step's output for the operators, and the order page offers no download."""
    try:
        return _open_download(conn, ctx)
    except (StepFailed, DriverError) as exc:  # a command that failed, timed out, or a connection lost
        return f"no download window: {getattr(exc, 'message', None) or exc}"


def _open_download(conn: Connection, ctx: StepContext) -> StepOutput | str:
    if ctx.download_until is None:
        return "no download window: the order goes on elsewhere, or never ran"
    if ctx.download_until <= timezone.now():
        return "the files' deletion date has passed: no download window"
    runtime = runtime_of(ctx)
    if is_dry_run(conn):
        return StepOutput("download window opened (dry run)", {"download_until": ctx.download_until})
    if not conn.run(runtime.command("volume", "inspect", ctx.volume_name), check=False).ok:
        return "no data volume on this host: no download window"
    if not ctx.image_id:
        raise StepFailed("the order's image is not pinned: the download window has no image to run sshd from")
    uid_base, gid_base = id_ranges(conn, ctx)
    lines = [
        line.replace(line.split(",expiry-time=")[0], DOWNLOAD_KEY_OPTIONS, 1)
        for line in authorized_keys_lines(ctx.authorized_keys, ctx.download_until)
    ]
    install_root_files(
        conn,
        {
            f"{ctx.ssh_dir}/{DOWNLOAD_CONFIG}": (host_file_bytes("sshd_download_config"), 0o644, "root"),
            f"{ctx.ssh_dir}/{DOWNLOAD_KEYS}": ("".join(f"{line}\n" for line in lines).encode(), 0o644, "root"),
        },
    )
    state = _download_state(conn, ctx)
    if state and state[0]:
        if not state[1]:
            release_volume(conn, runtime, ctx.volume_name)
            conn.run(runtime.command("start", download_container_name(ctx.username)), timeout=120)
        port, kept = state[0], " (kept)"
    else:
        if state:  # made without a port (a failed start): made again
            remove_checked(conn, runtime, download_container_name(ctx.username))
        if not conn.run(runtime.command("network", "inspect", ctx.network_name), check=False).ok:
            conn.run(runtime.network_create(ctx.network_name))
        port, kept = _start_download(conn, ctx, uid_base=uid_base, gid_base=gid_base), ""
    until = ctx.download_until.astimezone(UTC).strftime("%Y-%m-%d %H:%M UTC")
    return StepOutput(
        f"download window{kept}: read-only SFTP on port {port} until {until}",
        {"download_port": port, "download_until": ctx.download_until},
    )
